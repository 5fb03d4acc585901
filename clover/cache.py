"""KV-cache bookkeeping for tree verification.

After verification the target's cache holds the committed prefix followed by every tree
node. Only the accepted path may stay: :func:`compact_cache` moves the accepted nodes'
keys and values right after the prefix and drops the rest, so the cache again equals
what plain decoding would have built (Medusa arXiv 2401.10774 §2.1.2, "tree
attention"; the same bookkeeping as its ``update_inference_inputs``).

Works on transformers' ``DynamicCache`` (layers holding ``keys`` / ``values`` tensors of
shape (B, H, T, hs)); other cache types raise a clear error.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


def _layers(cache) -> list:
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise TypeError(f"unsupported KV cache type {type(cache).__name__}; use DynamicCache")
    for layer in layers:
        if not hasattr(layer, "keys") or getattr(layer, "is_sliding", False):
            raise TypeError(
                f"unsupported KV cache layer {type(layer).__name__}: tree verification needs "
                "full (non-sliding) dynamic layers"
            )
    return layers


def new_cache(model_config) -> DynamicCache:
    """An empty dynamic KV cache for a model, every layer a full (non-sliding) one.

    Sliding-window layers are given full layers too: attention is the same while the
    sequence fits in the window, and :class:`~clover.models.TargetModel` caps its
    context at the window (``validate_request`` refuses longer requests)."""
    cache = DynamicCache(config=model_config)
    cache.layers = [DynamicLayer() if getattr(layer, "is_sliding", False) else layer
                    for layer in cache.layers]
    return cache


def cache_length(cache) -> int:
    """Number of cached positions T."""
    return cache.get_seq_length()


def crop_cache(cache, length: int) -> None:
    """Keep the first ``length`` positions of every layer (in place)."""
    for layer in _layers(cache):
        if layer.keys is not None and layer.keys.shape[-2] > length:
            layer.keys = layer.keys[..., :length, :]
            layer.values = layer.values[..., :length, :]


def compact_cache(cache, prefix_len: int, accepted: list[int]) -> None:
    """Keep the prefix and the accepted tree nodes, in path order (in place).

    Args:
        cache: a DynamicCache holding ``prefix_len + N`` positions after verifying a
            tree of N nodes.
        prefix_len: cached positions before the tree.
        accepted: accepted node ids, root first (node ids index the tree's flattened
            order, so node i sits at position ``prefix_len + i``).

    When the path is ``[0, 1, ..., m]`` (a chain, the common case) this is a crop;
    otherwise the accepted rows are gathered into place first.
    """
    keep = prefix_len + len(accepted)
    if accepted != list(range(len(accepted))):
        src = torch.tensor(accepted, device=_layers(cache)[0].keys.device) + prefix_len
        for layer in _layers(cache):
            # (B, H, m, hs) gathered, written after the prefix
            layer.keys[..., prefix_len:keep, :] = layer.keys.index_select(-2, src)
            layer.values[..., prefix_len:keep, :] = layer.values.index_select(-2, src)
    crop_cache(cache, keep)


def compact_rows(cache, lengths: list[int], prefix_len: int, paths: list[list[int]]) -> list[int]:
    """:func:`compact_cache` for a batch whose rows hold different numbers of positions
    (in place; see ``clover.engine`` for the batch layout).

    Args:
        cache: a DynamicCache of B rows and ``prefix_len + N`` positions after verifying
            B trees padded to N nodes: row b's node i sits at column ``prefix_len + i``.
        lengths: L_b, the committed positions of row b: its columns ``[0, L_b)`` (the
            columns ``[L_b, prefix_len)`` are padding, masked).
        prefix_len: P, the cache length before the trees (>= every L_b).
        paths: accepted node ids per row, root first.
    Returns:
        The new lengths ``L_b + len(paths[b])``: row b's accepted nodes are moved, in path
        order, to columns ``[L_b, L_b + len(paths[b]))`` and every layer is cropped to the
        longest row. With one row and ``L_0 == P`` this is :func:`compact_cache`.
    Raises:
        ValueError: when the lists differ in length or a row claims more than P positions.
    """
    if len(lengths) != len(paths):
        raise ValueError(f"{len(lengths)} row lengths but {len(paths)} accepted paths")
    if any(n > prefix_len for n in lengths):
        raise ValueError(f"row lengths {lengths} exceed the cache's {prefix_len} positions")
    moves = [(b, prefix_len + node, start + k)
             for b, (start, path) in enumerate(zip(lengths, paths))
             for k, node in enumerate(path) if prefix_len + node != start + k]
    if moves:
        device = _layers(cache)[0].keys.device
        rows, src, dst = (torch.tensor(x, device=device) for x in zip(*moves))
        for layer in _layers(cache):
            # (moves, H, hs) gathered first, then written into each row's own gap
            layer.keys[rows, :, dst] = layer.keys[rows, :, src]
            layer.values[rows, :, dst] = layer.values[rows, :, src]
    new = [start + len(path) for start, path in zip(lengths, paths)]
    crop_cache(cache, max(new))
    return new


def select_rows(cache, rows: list[int], length: int) -> None:
    """Keep batch ``rows`` of every layer (in that order) and their first ``length``
    positions (in place): finished rows leave a batched run. Each layer's (B, H, T, hs)
    keys and values become (len(rows), H, min(T, length), hs).

    Raises:
        TypeError: for sliding-window or other non-dynamic layers.
    """
    layers = _layers(cache)
    if cache.get_seq_length() == 0:
        return
    idx = torch.tensor(rows, dtype=torch.long, device=layers[0].keys.device)
    for layer in layers:
        layer.keys = layer.keys.index_select(0, idx)[..., :length, :]
        layer.values = layer.values.index_select(0, idx)[..., :length, :]


def stack_rows(caches, lengths: list[int], model_config) -> DynamicCache:
    """One cache of B rows from B single-row caches (in the batch layout of
    ``clover.engine``): row b's ``lengths[b]`` positions at columns ``[0, L_b)``, zeros
    after them up to the longest row (masked by the caller).

    Args:
        caches: B DynamicCaches of one row each, cache b holding ``lengths[b]`` positions.
        model_config: the transformers config of the model the caches belong to.
    Raises:
        TypeError: for sliding-window or other non-dynamic layers.
    """
    stacked = new_cache(model_config)
    width = max(lengths)
    if width == 0:
        return stacked
    for i, layer in enumerate(_layers(stacked)):
        rows = [_layers(c)[i] for c in caches]
        ref = next(r for r, n in zip(rows, lengths) if n)
        shape = (len(rows), ref.keys.shape[1], width, ref.keys.shape[-1])  # (B, H, P, hs)
        keys, values = ref.keys.new_zeros(shape), ref.values.new_zeros(shape)
        for b, (row, n) in enumerate(zip(rows, lengths)):
            if n:
                keys[b, :, :n] = row.keys[0, :, :n]
                values[b, :, :n] = row.values[0, :, :n]
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values
    return stacked


def unstack_rows(stacked, caches, lengths: list[int], prefix_len: int, counts: list[int]) -> None:
    """Give each single-row cache its own positions back from a cache made by
    :func:`stack_rows` (``prefix_len`` columns) to which new positions were appended: row
    b keeps its first ``lengths[b]`` columns and its ``counts[b]`` new ones (columns
    ``prefix_len .. prefix_len + counts[b] - 1``), in place.

    Raises:
        TypeError: for sliding-window or other non-dynamic layers.
    """
    for i, layer in enumerate(_layers(stacked)):
        for b, cache in enumerate(caches):
            n, m = lengths[b], counts[b]
            keys = torch.cat([layer.keys[b:b + 1, :, :n], layer.keys[b:b + 1, :, prefix_len:prefix_len + m]], dim=-2)
            values = torch.cat([layer.values[b:b + 1, :, :n],
                                layer.values[b:b + 1, :, prefix_len:prefix_len + m]], dim=-2)
            row = _layers(cache)[i]
            if not row.is_initialized:
                row.lazy_initialization(keys, values)
            row.keys, row.values = keys, values


class BufferedLayer(DynamicLayer):
    """A KV-cache layer that appends into preallocated storage instead of concatenating.

    transformers' ``DynamicLayer`` rebuilds its keys and values with ``torch.cat`` at every
    step, which copies the whole cache: on a CPU, batched decoding spent most of its time
    there (64 rows x 512 positions: 59% of a step in ``aten::cat``). This layer keeps a
    buffer of room for more positions (doubled when full) and exposes ``keys`` /
    ``values`` as views of its first ``length`` positions, so a step copies only the new
    ones. Rows can be dropped and leading positions cropped (:meth:`select`), as batched
    generation does when rows finish. Used through :func:`buffered_cache`.
    """

    is_sliding = False
    is_croppable = True

    def __init__(self):
        super().__init__()
        self._k = self._v = None
        self.length = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append (B, H, n, d) keys and values; return (B, H, length, d) views of all."""
        n = key_states.shape[-2]
        need = self.length + n
        if self._k is None or need > self._k.shape[-2]:
            cap = max(need, 2 * (0 if self._k is None else self._k.shape[-2]), 64)
            k = key_states.new_empty((*key_states.shape[:-2], cap, key_states.shape[-1]))
            v = value_states.new_empty((*value_states.shape[:-2], cap, value_states.shape[-1]))
            if self.length:
                k[..., : self.length, :] = self._k[..., : self.length, :]
                v[..., : self.length, :] = self._v[..., : self.length, :]
            self._k, self._v = k, v
            self.device = k.device
            self.is_initialized = True
        self._k[..., self.length: need, :] = key_states
        self._v[..., self.length: need, :] = value_states
        self.length = need
        self.keys, self.values = self._k[..., :need, :], self._v[..., :need, :]
        return self.keys, self.values

    def select(self, rows: torch.Tensor, first: int = 0) -> None:
        """Keep batch ``rows`` (in that order) and drop the first ``first`` positions."""
        if self._k is None:
            return
        self._k = self._k[rows, :, first:].contiguous()
        self._v = self._v[rows, :, first:].contiguous()
        self.length -= first
        self.keys, self.values = self._k[..., : self.length, :], self._v[..., : self.length, :]

    def add_rows(self, other: "BufferedLayer") -> int:
        """Append ``other``'s rows below this layer's, right-aligned: the shorter side is
        left padded with zeros (callers mask those positions). Returns the left padding
        given to this layer's own rows (0 when ``other`` is not longer)."""
        if other._k is None:
            return 0
        if self._k is None or self._k.shape[0] == 0:
            self._k, self._v, self.length = other._k, other._v, other.length
            self.keys, self.values = self._k[..., : self.length, :], self._v[..., : self.length, :]
            self.device, self.is_initialized = other._k.device, True
            return 0
        length = max(self.length, other.length)
        cap = max(self._k.shape[-2] - self.length, other._k.shape[-2] - other.length, 64) + length
        grow_self = length - self.length

        def merged(mine: torch.Tensor, theirs: torch.Tensor) -> torch.Tensor:
            out = mine.new_zeros((mine.shape[0] + theirs.shape[0], *mine.shape[1:-2], cap, mine.shape[-1]))
            out[: mine.shape[0], :, grow_self:length] = mine[..., : self.length, :]
            out[mine.shape[0]:, :, length - other.length:length] = theirs[..., : other.length, :]
            return out

        self._k, self._v = merged(self._k, other._k), merged(self._v, other._v)
        self.length = length
        self.keys, self.values = self._k[..., :length, :], self._v[..., :length, :]
        return grow_self

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.select(indices)

    def get_seq_length(self) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_max_length(self) -> int:
        return -1


def buffered_cache(model_config) -> DynamicCache:
    """A ``DynamicCache`` whose layers are :class:`BufferedLayer` (full attention; for a
    sliding-window model, exact while the sequence fits in the window, as in
    :func:`new_cache`)."""
    cache = DynamicCache(config=model_config)
    cache.layers = [BufferedLayer() for _ in cache.layers]
    return cache
