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

import torch

from clover.training.data import collate


def target_hidden(target, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Frozen target over a batch: (B, T, D) hidden states before and after the final norm."""
    with torch.no_grad():
        return target.hidden_states(ids)


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
    forward passes once.

    Raises:
        ValueError: when ``path`` holds states of another target: its name, dtype or a
            fingerprint of its weights differ (two builds of one model, e.g. a quantised
            GGUF and the hub weights, share a name but not their hidden states).
    """

    def __init__(self, target, enabled: bool = True, path: str | Path | None = None,
                 write: bool = True, store_dtype: torch.dtype = torch.float16):
        self.target, self.enabled, self.write = target, enabled, write
        self.store_dtype = store_dtype
        self.path = Path(path) if path else None
        self.store: dict = {}
        self.dirty = False
        if self.path is not None and self.path.is_file():
            from safetensors import safe_open

            with safe_open(str(self.path), "pt") as f:
                meta = f.metadata() or {}
                want = self.metadata()
                if any(meta.get(k) != v for k, v in want.items()):
                    raise ValueError(f"{self.path} holds hidden states of another target "
                                     f"({meta.get('target')!r}, {meta.get('dtype')}, weights "
                                     f"{meta.get('fingerprint')}), not of {target.name!r} "
                                     f"({want['dtype']}, weights {want['fingerprint']}); delete it "
                                     f"or pass another file")
                self.store = {k: f.get_tensor(k) for k in f.keys()}

    def metadata(self) -> dict[str, str]:
        """What identifies the target's states: name, hidden size, dtype and a hash of its
        lm_head and last-layer weights."""
        import hashlib

        from clover.models import decoder_layers

        h = hashlib.sha1()
        last = decoder_layers(self.target.base)[-1]
        for w in (self.target.lm_head.weight[:256], *list(last.parameters())[:2]):
            h.update(w.detach().float().cpu().contiguous().numpy().tobytes())
        return {"target": self.target.name, "hidden_size": str(self.target.hidden_size),
                "dtype": str(self.target.dtype).replace("torch.", ""), "fingerprint": h.hexdigest()[:16]}

    def __call__(self, keys: list, ids: torch.Tensor, lengths: list[int]):
        """(B, T, D) pre and post states for a right-padded batch ``ids``."""
        if not self.enabled:
            return target_hidden(self.target, ids)
        todo = [i for i, k in enumerate(keys) if k not in self.store]
        if todo:
            width = max(lengths[i] for i in todo)
            pre, _ = target_hidden(self.target, ids[todo, :width])
            for j, i in enumerate(todo):
                state = pre[j, : lengths[i]]
                if state.abs().max() < 6e4:  # within fp16's range
                    state = state.to(self.store_dtype)
                self.store[keys[i]] = state.cpu().contiguous()
            self.dirty = True
        B, T = ids.shape
        pre = torch.zeros(B, T, self.target.hidden_size, dtype=self.target.dtype, device=ids.device)
        for i, k in enumerate(keys):
            pre[i, : lengths[i]] = self.store[k].to(ids.device, self.target.dtype)
        with torch.no_grad():
            post = self.target.final_norm(pre)
        return pre, post

    def fill(self, records: list[dict], pad: int, batch_size: int = 8, progress: bool = True) -> None:
        """Compute the states of every record not yet stored (shortest first, so batches
        carry little padding) with a progress bar, saving every ten minutes and at the
        end (:meth:`save`), so an interrupted fill resumes."""
        from tqdm.auto import tqdm

        import time

        todo = sorted((r for r in records if r["key"] not in self.store), key=lambda r: len(r["input_ids"]))
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
        """Write the store to ``path`` (atomically) when it has new entries (only from the
        main process when several run)."""
        if self.path is None or not self.dirty or not self.write:
            return
        from safetensors.torch import save_file

        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        save_file(self.store, str(tmp), metadata=self.metadata())
        os.replace(tmp, self.path)
        self.dirty = False
