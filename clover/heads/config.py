"""Head configs: :class:`HeadConfig` (sizes and provenance of a set of draft heads, saved
as ``config.json``) and the checks that heads fit a target model."""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from clover.methods import HEAD_KINDS

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
# Augmenting Block layers per kind when a config leaves ``augment_layers`` at 0
DEFAULT_AUGMENT_LAYERS = {"clover": 1, "clover2": 2}
# kind -> the DraftHeads subclass that declares it (filled as the classes are defined)
HEADS_CLASSES: dict[str, type] = {}


@dataclass
class HeadConfig:
    """Sizes and provenance of a set of draft heads (saved as ``config.json``).

    Attributes:
        kind: "medusa", "clover" or "clover2" (:data:`HEAD_KINDS`), or the kind another
            :class:`~clover.heads.base.DraftHeads` subclass declares (e.g. a test double).
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
        fuse_layers: Clover only: 0-based indices of target decoder layers whose outputs
            join the last layer's as the Augmenting Block's input (EAGLE-3's multi-layer
            features, arXiv 2503.01840 §3.2): x = h_last + W [h_l1; ...], with W a D x
            (n D) projection that starts at zero, so training starts from the plain
            input. Empty (the default) = the last layer only.
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
    fuse_layers: list = field(default_factory=list)
    target_fingerprint: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.kind not in HEAD_KINDS and self.kind not in HEADS_CLASSES:
            raise ValueError(f"unknown head kind {self.kind!r}; use one of {', '.join(HEAD_KINDS)}")
        if self.augment_layers < 0:
            raise ValueError(f"augment_layers must be >= 0, got {self.augment_layers}")
        if self.augment_layers == 0:
            self.augment_layers = DEFAULT_AUGMENT_LAYERS.get(self.kind, 0)
        if self.num_heads < 1:
            raise ValueError(f"num_heads must be >= 1, got {self.num_heads}")
        if not self.shared_recurrence and self.kind != "clover2":
            raise ValueError(f"shared_recurrence=False is a Clover-2 ablation; {self.kind} heads have no recurrence")
        self.fuse_layers = [int(layer) for layer in self.fuse_layers]
        if self.fuse_layers and self.kind != "clover":
            raise ValueError(f"fuse_layers (multi-layer features) are for Clover heads, not {self.kind}")
        if any(layer < 0 for layer in self.fuse_layers) or len(set(self.fuse_layers)) != len(self.fuse_layers):
            raise ValueError(f"fuse_layers must be distinct decoder layer indices >= 0, got {self.fuse_layers}")
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
        """A config from a dict (a heads folder's ``config.json``); fields it does not
        know are ignored (heads saved by later versions).

        Raises:
            ValueError: one line naming the field: ``d`` is not a dict, ``kind`` is
                missing or unknown, a field has the wrong type, or a value is out of range.
        """
        if not isinstance(d, dict):
            raise ValueError(f"expected a JSON object of head settings, got {type(d).__name__}")
        if "kind" not in d:
            raise ValueError(f"field 'kind' is missing (one of {', '.join(HEAD_KINDS)})")
        known = {f.name: f for f in fields(cls)}
        for name, value in d.items():
            if name in known and not _has_type(value, known[name].type):
                raise ValueError(f"field {name!r} must be {_TYPE_WORDS[known[name].type]}, got {value!r}")
        return cls(**{k: v for k, v in d.items() if k in known})


# the JSON types of HeadConfig's fields (as their annotations read under
# ``from __future__ import annotations``) and how an error names them
_TYPE_WORDS = {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false",
               "dict": "a JSON object", "list": "a JSON list"}


def _has_type(value, annotation: str) -> bool:
    """Whether a JSON value fits a field annotated ``annotation`` (bool is not an int)."""
    if annotation == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    kinds = {"str": str, "bool": bool, "dict": dict, "list": list}
    return isinstance(value, kinds.get(annotation, object))


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
    layers = getattr(target.config, "num_hidden_layers", None)
    if layers and any(layer >= layers - 1 for layer in config.fuse_layers):
        problems.append(f"fuse_layers {config.fuse_layers} must name layers before the target's last "
                        f"(0..{layers - 2})")
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
