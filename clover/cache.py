"""KV-cache bookkeeping for tree verification.

After verification the target's cache holds the committed prefix followed by every tree
node. Only the accepted path may stay: :func:`compact_cache` moves the accepted nodes'
keys and values right after the prefix and drops the rest, so the cache again equals
what plain decoding would have built (Medusa arXiv 2401.10774 §2.1.2, "tree
attention"; the same bookkeeping as its ``update_inference_inputs``).

Batches (``clover.engine``): :func:`compact_rows` moves each row's path into its own
gap of a right-padded cache, :func:`select_rows` drops finished rows and
:func:`append_rows` places the rows of a newly prefilled cache below the running ones.

Works on transformers' ``DynamicCache`` (layers holding ``keys`` / ``values`` tensors of
shape (B, H, T, hs)), with transformers' ``DynamicLayer`` or this module's
:class:`BufferedLayer` (preallocated, no copy of the whole cache per step); other cache
types raise a clear error.
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


def append_rows(cache, other, rows: int, other_rows: int) -> None:
    """Put the rows of ``other`` below those of ``cache`` (in place): rows join a batched
    run (``clover.engine``'s right-padded layout). Every row keeps its positions from
    column 0; the cache with fewer columns gets zero columns up to the other's width
    (padding past a row's own length, masked by the caller). Each layer's keys and values
    become (rows + other_rows, H, max(P, P'), hs).

    Args:
        cache: ``rows`` rows of P positions; other: ``other_rows`` rows of P' positions
            (either may hold no positions yet, hence the row counts).
    Raises:
        TypeError: for sliding-window or other non-dynamic layers.
    """
    width = max(cache_length(cache), cache_length(other))
    if width == 0:
        return
    for mine, theirs in zip(_layers(cache), _layers(other)):
        like = mine if cache_length(cache) else theirs
        keys = torch.cat([_padded(mine.keys, rows, width, like.keys), _padded(theirs.keys, other_rows, width, like.keys)])
        values = torch.cat([_padded(mine.values, rows, width, like.values),
                            _padded(theirs.values, other_rows, width, like.values)])
        if not mine.is_initialized:
            mine.lazy_initialization(keys, values)
        mine.keys, mine.values = keys, values


def _padded(states: torch.Tensor | None, rows: int, width: int, like: torch.Tensor) -> torch.Tensor:
    """(rows, H, width, hs) like ``like``: the positions of ``states`` (None or fewer
    columns), then zeros."""
    out = like.new_zeros((rows, like.shape[1], width, like.shape[-1]))
    if states is not None and states.dim() == 4:
        out[:, :, : states.shape[-2]] = states
    return out


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
        like = next(r for r, n in zip(rows, lengths) if n)
        # (B, H, width, hs): each row's first n positions, then zeros (as append_rows pads)
        keys = torch.cat([_padded(r.keys[..., :n, :] if n else None, 1, width, like.keys)
                          for r, n in zip(rows, lengths)])
        values = torch.cat([_padded(r.values[..., :n, :] if n else None, 1, width, like.values)
                            for r, n in zip(rows, lengths)])
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
    buffer with room for more positions (doubled when full) and ``keys`` / ``values``
    are views of its first ``length`` positions, (B, H, length, hs), so a step copies
    only the new ones. The bookkeeping of this module works on it as on a
    ``DynamicLayer``: writing into ``layer.keys[...]`` (:func:`compact_rows`) writes into
    the buffer; assigning a leading slice of ``keys`` (:func:`crop_cache`) shortens the
    layer and keeps its room; assigning any other tensor (:func:`select_rows`,
    :func:`append_rows`) makes that tensor the storage, grown at the next append. Used
    through :func:`buffered_cache`.
    """

    def __init__(self):
        self._k = self._v = None
        self.length = 0
        super().__init__()

    keys = property(lambda self: self._view(self._k), lambda self, value: self._set("_k", value))
    values = property(lambda self: self._view(self._v), lambda self, value: self._set("_v", value))

    def _view(self, storage: torch.Tensor | None) -> torch.Tensor | None:
        """(B, H, length, hs): the cached positions of a buffer."""
        return None if storage is None else storage[..., : self.length, :]

    def _set(self, name: str, value: torch.Tensor | None) -> None:
        setattr(self, name, self._adopt(getattr(self, name), value))

    def _adopt(self, storage: torch.Tensor | None, value: torch.Tensor | None) -> torch.Tensor | None:
        """The storage after ``keys`` or ``values`` is assigned ``value``: the same buffer
        when ``value`` is a leading slice of it, else ``value`` itself (None, or the empty
        tensor of ``lazy_initialization``, for no positions)."""
        if value is None or value.dim() != 4:
            self.length = 0
            return None
        self.length = value.shape[-2]
        same = (storage is not None and value.data_ptr() == storage.data_ptr()
                and value.stride() == storage.stride() and value.shape[:-2] == storage.shape[:-2])
        return storage if same else value

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append (B, H, n, hs) keys and values; return (B, H, length, hs) views of all."""
        need = self.length + key_states.shape[-2]
        if self._k is None or need > self._k.shape[-2]:
            room = max(need, 2 * self.length, 64)
            self._k, self._v = _grown(self._k, key_states, self.length, room), _grown(
                self._v, value_states, self.length, room)
            self.device, self.is_initialized = key_states.device, True
        self._k[..., self.length: need, :] = key_states
        self._v[..., self.length: need, :] = value_states
        self.length = need
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length


def _grown(storage: torch.Tensor | None, like: torch.Tensor, length: int, room: int) -> torch.Tensor:
    """A (B, H, room, hs) buffer shaped and typed like ``like`` holding ``storage``'s first
    ``length`` positions."""
    out = like.new_empty((*like.shape[:-2], room, like.shape[-1]))
    if length:
        out[..., :length, :] = storage[..., :length, :]
    return out


def buffered_cache(model_config) -> DynamicCache:
    """A ``DynamicCache`` whose layers are :class:`BufferedLayer` (full attention; for a
    sliding-window model, exact while the sequence fits in the window, as in
    :func:`new_cache`)."""
    cache = DynamicCache(config=model_config)
    cache.layers = [BufferedLayer() for _ in cache.layers]
    return cache
