"""What every drafting method shares: the head config, save/load, the drafter interface.

A *method* is a set of draft heads (an ``nn.Module``) that, for one generation run,
hands out a :class:`Drafter`: a small stateful object with two calls,

* ``observe(hidden_pre, hidden_post, tokens)`` - the target's verified hidden states
  and the token ids of the positions just committed to the KV cache (the prompt after
  prefill, then the accepted path after every step);
* ``draft(root_token, max_depth)`` - the candidate tree for the next step.

The engine owns everything else (verification, acceptance, KV cache), so every method is
compared on identical machinery. Plain decoding is :class:`PlainDrafter`: the empty tree.

A batched run (``clover.engine``) keeps one drafter per row. A drafter class may also offer
``draft_many(drafters, roots, max_depths)`` and ``observe_many(drafters, hidden_pre,
hidden_post, tokens)`` (static methods over several rows' drafters of that class sharing
one set of heads, the arguments one per row: e.g. one heads call over all rows);
:func:`draft_rows` and :func:`observe_rows` use them where they can.
"""
from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Callable, Protocol, Sequence

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from clover.methods import HEAD_KINDS
from clover.tree import Tree, TreeConfig, grow_trees, root_only

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
# Augmenting Block layers per kind when a config leaves ``augment_layers`` at 0
DEFAULT_AUGMENT_LAYERS = {"clover": 1, "clover2": 2}


@dataclass
class HeadConfig:
    """Sizes and provenance of a set of draft heads (saved as ``config.json``).

    Attributes:
        kind: "medusa", "clover" or "clover2" (:data:`HEAD_KINDS`), or the kind another
            :class:`DraftHeads` subclass declares (e.g. a test double).
        num_heads: K, tokens drafted beyond the root (depth of the tree).
        hidden_size: D of the target.
        vocab_size: V of the target.
        target: name of the target model the heads were made for.
        target_model_type: the target's ``config.model_type`` (e.g. "llama").
        num_attention_heads: Clover's Attention Decoder heads (H); ignored by Medusa.
        own_lm_head: Medusa only: give each head its own vocabulary projection instead
            of sharing the frozen lm_head.
        norm_eps: epsilon of Clover's RMSNorm (Clover-2: of its norms and of the Attention
            Decoders' cosine gates).
        augment_layers: Clover and Clover-2: decoder layers in the Augmenting Block; 0 (the
            default) resolves to the kind's own (:data:`DEFAULT_AUGMENT_LAYERS`: Clover 1,
            Clover-2 2); Medusa has none.
        augment_config: Clover and Clover-2: fields of the target's transformers config
            that the Augmenting Block sets otherwise, e.g. the released Clover-2
            checkpoints' RoPE base 10000 and their own ``rms_norm_eps``
            (``{"rope_parameters": {...}, "rms_norm_eps": 1e-6}``); empty = the target's.
        draft_vocab_size: V', heads draft only among these many tokens (the most
            frequent in the training data; their ids are saved with the weights), which
            cuts the vocabulary projection, the largest drafting cost, by V / V'
            (FR-Spec, arXiv 2502.14856). 0 = the full vocabulary. Drafts are only
            proposals, so this never changes the output.
        shared_recurrence: Clover-2 only: heads 2..K share one recurrent projector
            (AttnDec2 and FC, the design); False gives each its own (an ablation:
            CLOVER2.md §2.1's weight sharing against K - 1 separate sets).
        target_fingerprint: :func:`clover.models.target_fingerprint` of the target
            ({"architecture", "vocabulary"} hashes); empty in heads saved before it existed.
    """

    kind: str
    num_heads: int = 3
    hidden_size: int = 0
    vocab_size: int = 0
    target: str = ""
    target_model_type: str = ""
    num_attention_heads: int = 1
    own_lm_head: bool = False
    norm_eps: float = 1e-6
    draft_vocab_size: int = 0
    augment_layers: int = 0
    augment_config: dict = field(default_factory=dict)
    shared_recurrence: bool = True
    target_fingerprint: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.kind not in HEAD_KINDS and self.kind not in DraftHeads._classes:
            raise ValueError(f"unknown head kind {self.kind!r}; use one of {', '.join(HEAD_KINDS)}")
        if self.augment_layers < 0:
            raise ValueError(f"augment_layers must be >= 0, got {self.augment_layers}")
        if self.augment_layers == 0:
            self.augment_layers = DEFAULT_AUGMENT_LAYERS.get(self.kind, 0)
        if self.num_heads < 1:
            raise ValueError(f"num_heads must be >= 1, got {self.num_heads}")
        if not self.shared_recurrence and self.kind != "clover2":
            raise ValueError(f"shared_recurrence=False is a Clover-2 ablation; {self.kind} heads have no recurrence")
        if self.draft_vocab_size < 0 or (self.vocab_size and self.draft_vocab_size > self.vocab_size):
            raise ValueError(f"draft_vocab_size must be in [0, vocab_size], got {self.draft_vocab_size}")
        if self.num_attention_heads < 1 or (self.hidden_size and self.hidden_size % self.num_attention_heads):
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must divide hidden_size ({self.hidden_size})"
            )

    @classmethod
    def for_target(cls, kind: str, target, num_heads: int = 3, **kw) -> "HeadConfig":
        """A config sized for ``target`` (a ``clover.models.TargetModel``)."""
        return cls(kind=kind, num_heads=num_heads, hidden_size=target.hidden_size,
                   vocab_size=target.vocab_size, target=target.name,
                   target_model_type=target.config.model_type,
                   num_attention_heads=target.config.num_attention_heads,
                   target_fingerprint=dict(target.fingerprint), **kw)

    @classmethod
    def from_dict(cls, d: dict) -> "HeadConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


def fingerprint_matches(config: HeadConfig, target) -> bool:
    """Whether heads were made for exactly this target (architecture and vocabulary; any
    dtype or file format). Heads saved without a fingerprint match none."""
    return bool(config.target_fingerprint) and config.target_fingerprint == target.fingerprint


def check_fits(config: HeadConfig, target) -> None:
    """Raise a clear ValueError when heads were made for another model: different sizes,
    model type, architecture config or tokenizer vocabulary (the last two by
    :func:`clover.models.target_fingerprint`, so a model of the same sizes with other
    layers, RoPE base or token ids is refused too). Heads saved without a fingerprint are
    checked by sizes and model type only."""
    problems = []
    if config.hidden_size != target.hidden_size:
        problems.append(f"hidden size {config.hidden_size} != target's {target.hidden_size}")
    if config.vocab_size != target.vocab_size:
        problems.append(f"vocabulary {config.vocab_size} != target's {target.vocab_size}")
    model_type = getattr(target.config, "model_type", "")
    if config.target_model_type and model_type and config.target_model_type != model_type:
        problems.append(f"model type {config.target_model_type!r} != target's {model_type!r}")
    if not problems and config.target_fingerprint:
        for part, what in (("architecture", "architecture config (layers, heads, RoPE, norms)"),
                           ("vocabulary", "tokenizer vocabulary (token ids)")):
            want = config.target_fingerprint.get(part)
            if want and want != target.fingerprint[part]:
                problems.append(f"the {what} differs (fingerprint {want} != target's "
                                f"{target.fingerprint[part]})")
    if problems:
        raise ValueError(
            f"these {config.kind} heads were made for {config.target or 'another model'!r} "
            f"and do not fit {target.name!r}: " + "; ".join(problems)
        )


class ResBlock(nn.Module):
    """Medusa's residual block ``x + SiLU(W x + b)``; W starts at zero (identity map)."""

    def __init__(self, d: int):
        super().__init__()
        self.linear = nn.Linear(d, d)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., D) -> (..., D)
        return x + nn.functional.silu(self.linear(x))


class Drafter(Protocol):
    """Per-run drafting state; see the module docstring."""

    def observe(self, hidden_pre: torch.Tensor, hidden_post: torch.Tensor,
                tokens: Sequence[int]) -> None:
        """Take the target's verified hidden states, each (T, D), and the T token ids at
        those new positions (the prompt but its last token, then each step's root and
        accepted drafts)."""

    def draft(self, root_token: int, max_depth: int) -> Tree:
        """The candidate tree rooted at ``root_token``, at most ``max_depth`` deep."""


def _groups(drafters: Sequence[Drafter], method: str) -> list[list[int]]:
    """Row indices of drafters that can be served together by their class's ``method``
    (same class, same heads); every other row alone."""
    groups: dict[tuple, list[int]] = {}
    for i, d in enumerate(drafters):
        key = ((type(d), id(getattr(d, "heads", None))) if hasattr(type(d), method) else ("own", i))
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def observe_rows(drafters: Sequence[Drafter], hidden_pre: Sequence[torch.Tensor],
                 hidden_post: Sequence[torch.Tensor], tokens: Sequence[Sequence[int]]) -> None:
    """Each row's ``observe`` for one step of a batch (the arguments one per row: (T_b, D)
    states and T_b token ids); rows whose drafters' class offers ``observe_many`` and share
    the same heads observe together.

    Raises:
        ValueError: when the lists differ in length.
    """
    if not len(drafters) == len(hidden_pre) == len(hidden_post) == len(tokens):
        raise ValueError("observe_rows needs one drafter, state pair and token list per row")
    for rows in _groups(drafters, "observe_many"):
        if len(rows) == 1:
            i = rows[0]
            drafters[i].observe(hidden_pre[i], hidden_post[i], tokens[i])
        else:
            type(drafters[rows[0]]).observe_many([drafters[i] for i in rows], [hidden_pre[i] for i in rows],
                                                 [hidden_post[i] for i in rows], [tokens[i] for i in rows])


def draft_rows(drafters: Sequence[Drafter], roots: Sequence[int], max_depths: Sequence[int]) -> list[Tree]:
    """Each row's candidate tree for one step of a batch, row b's from ``drafters[b]``.

    Rows whose drafters are of one class offering ``draft_many`` and share the same heads
    are drafted together in one ``draft_many`` call; every other row (and a lone row of a
    class) by its own ``draft``.

    Raises:
        ValueError: when the three lists differ in length.
    """
    if not len(drafters) == len(roots) == len(max_depths):
        raise ValueError(f"{len(drafters)} drafters, {len(roots)} roots and {len(max_depths)} depths")
    trees: list[Tree | None] = [None] * len(drafters)
    for rows in _groups(drafters, "draft_many"):
        if len(rows) == 1:
            trees[rows[0]] = drafters[rows[0]].draft(roots[rows[0]], max_depths[rows[0]])
            continue
        many = type(drafters[rows[0]]).draft_many
        for i, tree in zip(rows, many([drafters[i] for i in rows], [roots[i] for i in rows],
                                      [max_depths[i] for i in rows])):
            trees[i] = tree
    return trees


class PlainDrafter:
    """Plain autoregressive decoding: always the empty tree (root only)."""

    def observe(self, hidden_pre: torch.Tensor, hidden_post: torch.Tensor,
                tokens: Sequence[int]) -> None:
        pass

    def draft(self, root_token: int, max_depth: int) -> Tree:
        return root_only(root_token)


def grow_recurrent_tree(heads: "DraftHeads", target, tree: TreeConfig, root_token: int,
                        root_state: torch.Tensor, max_depth: int) -> Tree:
    """The candidate tree of heads that carry a state down each branch (Clover, Clover-2).

    A node's state is ``heads.step(parent's state, the node's token, depth)``; the
    root's parent state is ``root_state``. Each depth calls the step once, batched over
    the expanded nodes: ``heads.step(prev (n, D), tokens (n,) long, depth, target)``
    returns their states (n, D) and draft logits (n, V') for their children. The tree
    grows by :func:`clover.tree.grow_tree` (static or dynamic), at most
    ``heads.config.num_heads`` deep.

    Args:
        root_state: (D,) the state the root's step starts from.
    """
    return grow_recurrent_trees(heads, target, tree, [root_token], [root_state], [max_depth])[0]


def grow_ready_rows(drafters: Sequence, ready: Sequence[int], roots: Sequence[int],
                    root_states: Sequence[torch.Tensor], max_depths: Sequence[int]) -> list[Tree]:
    """A batch's trees for recurrent drafters (Clover, Clover-2) sharing one set of
    heads: the rows ``ready`` (indices into ``drafters``, each with its (D,) root state in
    ``root_states``, same order) grow together by :func:`grow_recurrent_trees` with the
    first ready drafter's heads, target and tree; every other row drafts just its root."""
    trees = [root_only(r) for r in roots]
    if ready:
        first = drafters[ready[0]]
        grown = grow_recurrent_trees(first.heads, first.target, first.tree, [roots[i] for i in ready],
                                     list(root_states), [max_depths[i] for i in ready])
        for i, tree in zip(ready, grown):
            trees[i] = tree
    return trees


def grow_recurrent_trees(heads: "DraftHeads", target, tree: TreeConfig, roots: Sequence[int],
                         root_states: Sequence[torch.Tensor], max_depths: Sequence[int]) -> list[Tree]:
    """:func:`grow_recurrent_tree` for the rows of a batch at once: the trees grow in lock
    step (:func:`clover.tree.grow_trees`), and each depth calls ``heads.step`` once over
    every row's expanded nodes, (sum of n, D). Each tree is the one its row grows alone.

    Args:
        root_states: (D,) per row.
    Raises:
        ValueError: when the lists differ in length.
    """
    if not len(roots) == len(root_states) == len(max_depths):
        raise ValueError(f"{len(roots)} roots, {len(root_states)} states and {len(max_depths)} depths")
    states: list[dict[int, torch.Tensor]] = [{} for _ in roots]  # per row: node id -> state

    def expand_many(depth, requests):
        prev = torch.cat([torch.stack([root_states[row] if p < 0 else states[row][p] for p in parent_ids])
                          for row, _, parent_ids, _ in requests])  # (n, D) over all rows
        tokens = torch.tensor([t for *_, toks in requests for t in toks], device=prev.device)
        h, logits = heads.step(prev, tokens, depth, target)
        probs = torch.softmax(logits.float(), dim=-1)  # (n, V')
        out, start = [], 0
        for row, node_ids, _, _ in requests:
            for i, nid in enumerate(node_ids):
                states[row][nid] = h[start + i]
            out.append(probs[start:start + len(node_ids)])
            start += len(node_ids)
        return out

    return grow_trees(roots, tree, expand_many, [min(d, heads.config.num_heads) for d in max_depths],
                      heads.draft_vocab)


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
    _classes: dict = {}  # kind -> the class that declares it (filled by __init_subclass__)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__ and cls.kind:
            DraftHeads._classes[cls.kind] = cls

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
        cls = DraftHeads._classes.get(config.kind)
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

    def vocab_logits(self, h: torch.Tensor, target) -> torch.Tensor:
        """The frozen lm_head over the draft vocabulary: (..., D) -> (..., V').

        Column j is token ``draft_vocab[j]`` (token j without a draft vocabulary).
        """
        if self.draft_vocab is None:
            return target.head_logits(h)
        w = target.lm_head.weight
        if self._vocab_weight is None or self._vocab_weight.device != w.device or \
                self._vocab_weight.dtype != w.dtype:
            ids = self.draft_vocab.to(w.device)
            bias = getattr(target.lm_head, "bias", None)
            self._vocab_weight = w.detach()[ids]  # (V', D)
            self._vocab_bias = None if bias is None else bias.detach()[ids]  # (V',)
        return self.vocab_linear(h, self._vocab_weight, self._vocab_bias)

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
        """
        cfg = Path(path) / CONFIG_FILE
        if not cfg.is_file() or not (Path(path) / WEIGHTS_FILE).is_file():
            raise FileNotFoundError(f"no heads in {path}: expected {CONFIG_FILE} and {WEIGHTS_FILE}")
        return HeadConfig.from_dict(json.loads(cfg.read_text()))

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
