"""What every set of draft heads shares: :class:`DraftHeads` (save/load with checks, the
draft vocabulary, the drafter factory, the training forward's interface) and Medusa's
residual block. Head configs are in :mod:`clover.heads.config`, drafters (the per-run
state, batching rows) in :mod:`clover.heads.drafter`."""
from __future__ import annotations

import json
import logging
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from clover.heads.config import CONFIG_FILE, HEADS_CLASSES, WEIGHTS_FILE, HeadConfig, check_fits, fingerprint_matches
from clover.heads.drafter import Drafter
from clover.tree import TreeConfig

log = logging.getLogger(__name__)


class ResBlock(nn.Module):
    """Medusa's residual block ``x + SiLU(W x + b)``; W starts at zero (identity map)."""

    def __init__(self, d: int):
        super().__init__()
        self.linear = nn.Linear(d, d)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., D) -> (..., D)
        return x + nn.functional.silu(self.linear(x))


def weight_problems(expected: dict, state: dict, vocab_size: int) -> list[str]:
    """What keeps ``state`` (tensor name -> tensor, as read from a heads file) from
    loading into heads whose ``state_dict()`` is ``expected``: missing, unexpected or
    wrongly shaped tensors, NaN or infinite weights, and draft vocabulary ids that repeat
    or fall outside ``[0, vocab_size)``. An empty list when it fits."""
    problems = [f"tensor {n!r} is missing (expected shape {tuple(expected[n].shape)})"
                for n in sorted(set(expected) - set(state))]
    problems += [f"tensor {n!r} is not part of these heads" for n in sorted(set(state) - set(expected))]
    for n in sorted(set(expected) & set(state)):
        want, got = expected[n], state[n]
        if tuple(got.shape) != tuple(want.shape):
            problems.append(f"tensor {n!r} has shape {tuple(got.shape)}, expected {tuple(want.shape)}")
        elif got.is_floating_point() != want.is_floating_point():
            problems.append(f"tensor {n!r} is {str(got.dtype).replace('torch.', '')}, expected "
                            f"{'floating point' if want.is_floating_point() else 'integer'} values")
        elif got.is_floating_point() and not bool(torch.isfinite(got).all()):
            problems.append(f"tensor {n!r} holds NaN or infinite values")
        elif n.split(".")[-1] == "draft_vocab" and got.numel():
            if int(got.min()) < 0 or (vocab_size and int(got.max()) >= vocab_size):
                problems.append(f"tensor {n!r} holds token ids outside the vocabulary "
                                f"[0, {vocab_size}) (from {int(got.min())} to {int(got.max())})")
            elif len(torch.unique(got)) != got.numel():
                problems.append(f"tensor {n!r} repeats token ids")
    return problems


class DraftHeads(nn.Module):
    """Base class of Medusa, Clover and Clover-2 heads: config, save/load, drafter factory.

    A subclass declares the ``kind`` it implements (a :data:`HEAD_KINDS` name, or a new
    one) as a class attribute, and with it registers itself: :class:`HeadConfig` accepts
    that kind, and :meth:`build` and :meth:`from_pretrained` find the class of a config's
    kind that way (importing ``clover.heads`` registers every shipped kind).
    """

    kind = ""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__ and cls.kind:
            HEADS_CLASSES[cls.kind] = cls

    @classmethod
    def from_config(cls, config: HeadConfig, target) -> "DraftHeads":
        """Uninitialised heads of this class for ``target``; built from the target's
        transformers config (the Augmenting Block's layers) unless a subclass needs only
        ``config``."""
        return cls(config, target.config)

    @staticmethod
    def build(config: HeadConfig, target) -> "DraftHeads":
        """Uninitialised heads of ``config.kind`` for ``target``, with the target's CPU
        kernels where it uses them (``TargetModel.adopt``).

        Raises:
            ValueError: when no heads class declares that kind.
        """
        cls = HEADS_CLASSES.get(config.kind)
        if cls is None:
            raise ValueError(f"no heads class implements kind {config.kind!r}")
        return target.adopt(cls.from_config(config, target))

    def __init__(self, config: HeadConfig):
        super().__init__()
        self.config = config
        if config.draft_vocab_size:
            self.register_buffer("draft_vocab", torch.arange(config.draft_vocab_size))
        else:
            self.draft_vocab = None
        self._vocab_weight = None  # (V', D) rows of the frozen lm_head, built lazily
        self._vocab_bias = None  # (V',) matching lm_head bias entries, or None
        # the vocabulary projection's linear: F.linear, or the target's CPU kernel
        # (``TargetModel.adopt``, which :meth:`build` calls)
        self.vocab_linear = nn.functional.linear

    def set_draft_vocab(self, token_ids) -> None:
        """Choose the V' draft tokens (sorted ids; e.g. the most frequent in the data).

        Raises:
            ValueError: when the heads have no draft vocabulary or the size differs.
        """
        ids = torch.as_tensor(sorted(set(int(t) for t in token_ids)), dtype=torch.long)
        if self.draft_vocab is None or len(ids) != self.config.draft_vocab_size:
            raise ValueError(f"expected {self.config.draft_vocab_size} distinct draft token ids, got {len(ids)}")
        self.draft_vocab.copy_(ids.to(self.draft_vocab.device))
        self._vocab_weight = None

    @contextmanager
    def whole_vocabulary(self):
        """Within this block the heads project onto the target's whole vocabulary (V
        columns, column j = token j) instead of their draft vocabulary; the weights are
        unchanged. For scoring what the heads would draft from a larger vocabulary
        (``clover.training.train.batch_loss(prompt_vocab=True)``); the heads must not
        draft elsewhere meanwhile (not thread-safe)."""
        vocab, self.draft_vocab = self.draft_vocab, None
        try:
            yield self
        finally:
            self.draft_vocab = vocab

    def vocab_weight(self, target) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The rows of the frozen lm_head the heads project onto: (weight (V', D), bias
        (V',) or None), cut once from the target's and kept (the whole lm_head's without
        a draft vocabulary)."""
        w = target.lm_head.weight
        bias = getattr(target.lm_head, "bias", None)
        if self.draft_vocab is None:
            return w, bias
        if self._vocab_weight is None or self._vocab_weight.device != w.device or \
                self._vocab_weight.dtype != w.dtype:
            ids = self.draft_vocab.to(w.device)
            self._vocab_weight = w.detach()[ids]  # (V', D)
            self._vocab_bias = None if bias is None else bias.detach()[ids]  # (V',)
        return self._vocab_weight, self._vocab_bias

    def vocab_logits(self, h: torch.Tensor, target) -> torch.Tensor:
        """The frozen lm_head over the draft vocabulary: (..., D) -> (..., V').

        Column j is token ``draft_vocab[j]`` (token j without a draft vocabulary).
        """
        if self.draft_vocab is None:
            return target.head_logits(h)
        return self.vocab_linear(h, *self.vocab_weight(target))

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        self._vocab_weight = None
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    #: which target state each head's pre-lm_head output regresses onto in training:
    #: "post" (after the final norm, what lm_head reads) or "pre" (before it)
    regression_space = "post"

    def frozen_parameters(self) -> list[str]:
        """Names of the parameters training leaves as they are (none here; each heads
        class declares its own)."""
        return []

    def training_outputs(self, target, ids: torch.Tensor, hidden_pre: torch.Tensor,
                         rows: torch.Tensor, cols: torch.Tensor,
                         features: Callable[[torch.Tensor], torch.Tensor] | None = None
                         ) -> list[tuple[torch.Tensor, torch.Tensor]]:  # pragma: no cover - abstract
        """The teacher-forced training forward at positions s of a batch (``clover train``).

        Args:
            target: the frozen TargetModel.
            ids: (B, T) long, right-padded conversations.
            hidden_pre: (B, T, D) the target's hidden states before the final norm.
            rows, cols: (M,) long, the batch row and position of each s.
            features: applied to the target features the heads read (training-time
                noise or dropout), or None.
        Returns:
            per head k (0-based) a pair (draft logits (M, V'), pre-lm_head hidden (M, D));
            head k predicts x_{s+k+2}, its teacher is the target at position s+k+1, and the
            hidden output regresses onto the target's state there (``regression_space``).
        """
        raise NotImplementedError

    def drafter(self, target, tree: TreeConfig) -> Drafter:  # pragma: no cover - abstract
        raise NotImplementedError

    def init_from_target(self, target) -> "DraftHeads":
        """Initialise weights that copy the target (none by default); returns self."""
        return self

    def save_pretrained(self, path: str | Path) -> None:
        """Write ``config.json`` and ``model.safetensors`` (the heads' own weights only)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / CONFIG_FILE).write_text(json.dumps(asdict(self.config), indent=2) + "\n")
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(state, str(path / WEIGHTS_FILE), metadata={"kind": self.config.kind})

    @staticmethod
    def read_config(path: str | Path) -> HeadConfig:
        """The HeadConfig saved in a heads folder.

        Raises:
            FileNotFoundError: when the folder holds no heads.
            ValueError: one line naming the file and what is wrong with it: not readable
                JSON, or a field missing, of the wrong type, unknown or out of range
                (:meth:`HeadConfig.from_dict`).
        """
        cfg = Path(path) / CONFIG_FILE
        if not cfg.is_file() or not (Path(path) / WEIGHTS_FILE).is_file():
            raise FileNotFoundError(f"no heads in {path}: expected {CONFIG_FILE} and {WEIGHTS_FILE}")
        try:
            data = json.loads(cfg.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise ValueError(f"{cfg} is not UTF-8 text: a heads folder's {CONFIG_FILE} is the JSON "
                             f"that save_pretrained writes") from None
        except ValueError as e:
            raise ValueError(f"{cfg} is not valid JSON ({e}): a heads folder's {CONFIG_FILE} is the "
                             f"JSON that save_pretrained writes") from None
        try:
            return HeadConfig.from_dict(data)
        except ValueError as e:
            raise ValueError(f"{cfg}: {e}") from None

    @classmethod
    def from_pretrained(cls, path: str | Path, target) -> "DraftHeads":
        """Load heads saved with :meth:`save_pretrained` for ``target`` (any kind).

        Raises:
            FileNotFoundError: when ``path`` holds no heads.
            ValueError: when the heads do not fit the target (hidden size or vocabulary),
                or are not of this class's kind.
        """
        config = cls.read_config(path)
        if cls.kind and config.kind != cls.kind:
            raise ValueError(f"{path} holds {config.kind} heads, not {cls.kind}")
        check_fits(config, target)
        if config.target and config.target != target.name and not fingerprint_matches(config, target):
            log.warning("heads in %s were trained for %s, not %s", path, config.target, target.name)
        heads = DraftHeads.build(config, target).to(device=target.device, dtype=target.dtype)
        heads.load_weights(path)
        return heads.eval().requires_grad_(False)

    def load_weights(self, path: str | Path) -> None:
        """Load ``model.safetensors`` from a heads folder, after checking it against these
        heads: every tensor present, none extra, each of the expected shape, floating
        weights finite, draft vocabulary ids distinct and inside the target's vocabulary.
        Floating weights in another dtype (fp16, bf16) are cast.

        Raises:
            FileNotFoundError: the file is missing.
            ValueError: an unreadable file, or tensors that do not fit; the message names
                the file, the tensors and what was expected.
        """
        file = Path(path) / WEIGHTS_FILE
        if not file.is_file():
            raise FileNotFoundError(f"{file} is missing: a heads folder holds {CONFIG_FILE} and "
                                    f"{WEIGHTS_FILE} (written by save_pretrained)")
        try:
            state = load_file(str(file), device=str(next(self.parameters()).device))
        except Exception as e:  # safetensors raises its own error types for a bad header
            raise ValueError(f"{file} is not a readable safetensors file: {e}") from None
        problems = weight_problems(self.state_dict(), state, self.config.vocab_size)
        if problems:
            more = f"; and {len(problems) - 6} more" if len(problems) > 6 else ""
            raise ValueError(f"{file} does not fit the {self.config.kind} heads its {CONFIG_FILE} "
                             f"describes: " + "; ".join(problems[:6]) + more)
        self.load_state_dict(state, strict=True)
