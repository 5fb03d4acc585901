"""The frozen target's hidden states for head training, computed once per conversation.

Training reads the target's last hidden states at every position of each conversation,
many times over (epochs, and a Medusa and a Clover run on the same data). The target's
forward is most of a training step's cost on a CPU, so :class:`HiddenCache` keeps the
states, in fp16, in host memory and optionally in one safetensors file shared between
runs. Why one fp16 file and not shards or on-the-fly recomputation: the full v2 data
(about 8k conversations of about 400 tokens, D = 576) is 3.7 GB in fp16, which fits
this project's 24 GiB machine in memory and on disk; recomputing would cost the
target's forward at every step again.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import torch

from clover.training.config import HIDDEN_PRECISIONS
from clover.training.data import collate


def _autocast(target, precision: str):
    """The context a training forward of the target runs in for ``precision``."""
    if precision not in HIDDEN_PRECISIONS:
        raise ValueError(f"hidden-state precision must be one of {', '.join(HIDDEN_PRECISIONS)}, "
                         f"got {precision!r}")
    return torch.autocast(target.device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def target_hidden(target, ids: torch.Tensor, layers: Sequence[int] = (),
                  precision: str = "fp32") -> tuple[torch.Tensor, torch.Tensor]:
    """Frozen target over a batch: (B, T, D) hidden states before and after the final norm;
    with ``layers`` the first is the packed (B, T, D x (1 + n)) features of
    ``HeadConfig.fuse_layers``: the last layer's state, then each of those layers' outputs.

    ``precision``: "fp32" runs the target as loaded (as decoding does); "bf16" runs it
    under bf16 autocast and returns the states in the target's dtype. On a CPU with
    AVX-512 BF16 / AMX a batch runs about 2.5x faster, and the states differ by about
    1.2% (relative L2; cosine 0.9999): the shipped v11 heads scored on the 48 held-out
    training conversations with such features lost under 0.1 point of head-1 top-1
    (Clover 60.70% -> 60.74%, Medusa 43.03% -> 42.96%; chain tau equal to 3 decimals;
    2026-12-06), so training may read them.

    Raises:
        ValueError: an unknown ``precision``.
    """
    with torch.no_grad(), _autocast(target, precision):
        pre, post = target.hidden_states(ids, layers)
    return pre.to(target.dtype), post.to(target.dtype)


class HiddenCache:
    """The frozen target's hidden states per conversation, computed once and kept in
    host memory, so later epochs and the second method skip the target forward.

    Stores (T_i, D) pre-norm states per conversation key, in fp16 (``store_dtype``;
    half the memory of fp32, so about 8k conversations of 400 tokens of a 576-wide
    model take 3.7 GB; a state too large for fp16 stays fp32); the normed states are
    recomputed with the target's final norm (cheap). With ``path`` the store is also a
    safetensors file (about T x D x 2 bytes per conversation): loaded when it exists and
    was written for the same target, extended by :meth:`fill` and written back by
    :meth:`save`, so a Medusa and a Clover run on the same data pay for the target's
    forward passes once. ``precision`` "bf16" computes the states under bf16 autocast
    (:func:`target_hidden`: about 2.5x faster on a CPU with AMX); a file records it, and
    states of one precision are never mixed into a file of the other.

    With ``layers`` (decoder layer indices, 0-based: the multi-layer features of
    ``HeadConfig.fuse_layers``) it also keeps those layers' outputs, each in its own file
    beside ``path`` (:meth:`layer_path`), so the last layer's file stays shared with runs
    that read no other layer; computing a missing layer runs the target only up to the
    deepest layer asked. Calls then return the packed features (see :meth:`__call__`).

    Raises:
        ValueError: an unknown ``precision``, or ``path`` holding states of another
            target or precision: its name, dtype, a fingerprint of its weights or the
            precision differ (two builds of one model, e.g. a quantised
            GGUF and the hub weights, share a name but not their hidden states).
    """

    def __init__(self, target, enabled: bool = True, path: str | Path | None = None,
                 write: bool = True, store_dtype: torch.dtype = torch.float16, layers: Sequence[int] = (),
                 precision: str = "fp32"):
        _autocast(target, precision)  # raises on an unknown precision
        self.target, self.enabled, self.write = target, enabled, write
        self.precision = precision
        self.store_dtype = store_dtype
        self.path = Path(path) if path else None
        self.layers = tuple(int(layer) for layer in layers)
        self.store: dict = self._open(self.path)
        self.layer_stores: dict[int, dict] = {layer: self._open(self.layer_path(layer), layer)
                                              for layer in self.layers}
        self.dirty = False
        self.layers_dirty = False

    def layer_path(self, layer: int) -> Path | None:
        """The file of one decoder layer's states beside ``path``: ``<stem>.layer<l>.safetensors``."""
        return None if self.path is None else self.path.with_name(f"{self.path.stem}.layer{layer}{self.path.suffix}")

    def _open(self, path: Path | None, layer: int | None = None) -> dict:
        """The states stored in ``path`` ({} when there is none), checked against
        :meth:`metadata`."""
        if path is None or not path.is_file():
            return {}
        from safetensors import safe_open

        want = self.metadata(layer)
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
            if any(meta.get(k) != want.get(k) for k in {*want, "layer", "precision"}):
                raise ValueError(f"{path} holds hidden states of another target, layer or precision "
                                 f"({meta.get('target')!r}, {meta.get('dtype')}, weights "
                                 f"{meta.get('fingerprint')}, layer {meta.get('layer', 'last')}, computed in "
                                 f"{meta.get('precision', 'fp32')}), not of "
                                 f"{self.target.name!r} ({want['dtype']}, weights {want['fingerprint']}, "
                                 f"layer {want.get('layer', 'last')}, computed in {self.precision}); "
                                 f"delete it or pass another file")
            return {k: f.get_tensor(k) for k in f.keys()}

    def metadata(self, layer: int | None = None) -> dict[str, str]:
        """What identifies the target's states: name, hidden size, dtype and a hash of its
        lm_head and last-layer weights (and, for a decoder layer's own file, its index;
        for states computed under autocast, that precision)."""
        import hashlib

        from clover.models import decoder_layers

        h = hashlib.sha1()
        last = decoder_layers(self.target.base)[-1]
        for w in (self.target.lm_head.weight[:256], *list(last.parameters())[:2]):
            h.update(w.detach().float().cpu().contiguous().numpy().tobytes())
        meta = {"target": self.target.name, "hidden_size": str(self.target.hidden_size),
                "dtype": str(self.target.dtype).replace("torch.", ""), "fingerprint": h.hexdigest()[:16]}
        if layer is not None:
            meta["layer"] = str(layer)
        if self.precision != "fp32":  # files written before the option are fp32 ones
            meta["precision"] = self.precision
        return meta

    def _keep(self, store: dict, key, state: torch.Tensor) -> None:
        if state.abs().max() < 6e4:  # within fp16's range
            state = state.to(self.store_dtype)
        store[key] = state.cpu().contiguous()

    def missing(self, key) -> bool:
        """Whether any state of conversation ``key`` is not stored yet."""
        return key not in self.store or any(key not in s for s in self.layer_stores.values())

    def __call__(self, keys: list, ids: torch.Tensor, lengths: list[int]):
        """(B, T, D') pre and (B, T, D) post states for a right-padded batch ``ids``: the
        last layer's states before the final norm, then (with ``layers``) each of those
        layers' outputs, concatenated (D' = D x (1 + len(layers)); the packed features
        of ``HeadConfig.fuse_layers``), and the last layer's after the final norm."""
        if not self.enabled:
            return target_hidden(self.target, ids, self.layers, self.precision)
        D = self.target.hidden_size
        todo = [i for i, k in enumerate(keys) if k not in self.store]
        if todo:  # the last layer's states, with the layers' from the same call
            width = max(lengths[i] for i in todo)
            pre, _ = target_hidden(self.target, ids[todo, :width], self.layers, self.precision)
            for j, i in enumerate(todo):
                self._keep(self.store, keys[i], pre[j, : lengths[i], :D])
                for n, layer in enumerate(self.layers, 1):
                    self._keep(self.layer_stores[layer], keys[i], pre[j, : lengths[i], n * D: (n + 1) * D])
            self.dirty = True
            self.layers_dirty = self.layers_dirty or bool(self.layers)
        todo = [i for i, k in enumerate(keys) if any(k not in s for s in self.layer_stores.values())]
        if todo:  # only the layers up to the deepest asked run
            width = max(lengths[i] for i in todo)
            with torch.no_grad(), _autocast(self.target, self.precision):
                states = self.target.layer_states(ids[todo, :width], self.layers)
            for layer, state in zip(self.layers, states):
                for j, i in enumerate(todo):
                    self._keep(self.layer_stores[layer], keys[i], state[j, : lengths[i]])
            self.layers_dirty = True
        B, T = ids.shape
        pre = torch.zeros(B, T, D * (1 + len(self.layers)), dtype=self.target.dtype, device=ids.device)
        for i, k in enumerate(keys):
            pre[i, : lengths[i], :D] = self.store[k].to(ids.device, self.target.dtype)
            for n, layer in enumerate(self.layers, 1):
                pre[i, : lengths[i], n * D: (n + 1) * D] = self.layer_stores[layer][k].to(ids.device, self.target.dtype)
        with torch.no_grad():
            post = self.target.final_norm(pre[..., :D])
        return pre, post

    def fill(self, records: list[dict], pad: int, batch_size: int = 8, progress: bool = True) -> None:
        """Compute the states of every record not yet stored (shortest first, so batches
        carry little padding) with a progress bar, saving every ten minutes and at the
        end (:meth:`save`), so an interrupted fill resumes."""
        from tqdm.auto import tqdm

        import time

        todo = sorted((r for r in records if self.missing(r["key"])), key=lambda r: len(r["input_ids"]))
        last_save = time.monotonic()
        for i in tqdm(range(0, len(todo), batch_size), desc="target hidden states",
                      disable=not progress or not todo):
            batch = todo[i: i + batch_size]
            ids, _ = collate(batch, pad)
            self([r["key"] for r in batch], ids.to(self.target.device), [len(r["input_ids"]) for r in batch])
            if time.monotonic() - last_save > 600:  # an interrupted fill keeps its work
                self.save()
                last_save = time.monotonic()
        self.save()

    def save(self) -> None:
        """Write the stores with new entries to their files (atomically; only from the main
        process when several run)."""
        if self.path is None or not self.write:
            return
        if self.dirty:
            self._write(self.path, self.store, self.metadata())
            self.dirty = False
        if self.layers_dirty:
            for layer in self.layers:
                self._write(self.layer_path(layer), self.layer_stores[layer], self.metadata(layer))
            self.layers_dirty = False

    @staticmethod
    def _write(path: Path, store: dict, metadata: dict) -> None:
        from safetensors.torch import save_file

        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        save_file(store, str(tmp), metadata=metadata)
        os.replace(tmp, path)
