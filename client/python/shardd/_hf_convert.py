# transformers' reverse weight conversion as boxes: which part of which held tensor each saved tensor is.
"""save_pretrained of transformers 5 writes some parameters converted back to
the checkpoint's own layout: MoE experts fused as `experts.gate_up_proj`
[E, 2I, H] are written one tensor per expert and projection. Rather than a
table per model, the installed transformers' own reverse conversion is run
on meta tensors of the global shapes. Every op it applies that is a view
(chunk, split, unbind, select, squeeze, transpose, `.contiguous()`, which
changes no value) leaves its result's storage offset and strides, from
which the result is read back as a box of the held tensor, its dims
possibly permuted. A result that is no view of one held tensor (cat,
arithmetic, a dtype change) is refused with NotImplementedError naming the
model class, the operation and the tensor, before anything is saved.

A Piece then turns any rank's local boxes of the held tensor into the
boxes of the saved tensor it holds (to save), or into the views of its
local tensor a saved tensor's box fills (to load).
"""
from __future__ import annotations

import functools
import sys
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from ._tensors import row_major_strides

__all__ = ["Piece", "PieceTable", "whole", "reverted_pieces", "piece_parts", "piece_tables", "table_parts",
           "refuse_local_experts"]


class Piece(NamedTuple):
    """A saved tensor as a box of the held tensor `key`: start and count in the held tensor's
    coordinates; dims[i] is the held dim that the saved dim i runs along, None for a saved
    dim of size 1 that the held tensor has not."""
    key: str
    start: Tuple[int, ...]
    count: Tuple[int, ...]
    dims: Tuple[Optional[int], ...]
    # The storage the saved tensor is a view of in save_pretrained (the held tensor's, or a copy
    # the conversion made of part of it): huggingface_hub's split keeps each storage's tensors
    # in one shard and counts their bytes together.
    storage: str = ""

    def is_whole(self, shape) -> bool:
        return (tuple(self.count) == tuple(shape) and not any(self.start)
                and tuple(self.dims) == tuple(range(len(shape))))

    @property
    def shape(self) -> Tuple[int, ...]:
        """The saved tensor's shape."""
        return tuple(1 if d is None else self.count[d] for d in self.dims)


def whole(key: str, shape: Sequence[int]) -> Piece:
    n = len(shape)
    return Piece(key, (0,) * n, tuple(int(s) for s in shape), tuple(range(n)), key)


def _conversion_op() -> str:
    """The transformers ConversionOps running further up the stack, for the refusal's message."""
    frame = sys._getframe(2)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if owner is not None and type(owner).__module__.startswith("transformers") and \
                hasattr(owner, "reverse_op"):
            return type(owner).__name__
        frame = frame.f_back
    return "a conversion"


def _views_only_mode():
    """A TorchFunctionMode under which `.contiguous()`, `.clone()` and `.detach()` hand back their
    input's view (the values are the same, and a copy would lose the view's offset and strides),
    which notes what made every other new tensor, for the refusal, and which storage each tensor
    would be in under the real conversion, for the split (storage_of)."""
    import torch
    from torch.overrides import TorchFunctionMode

    same = {torch.Tensor.contiguous, torch.Tensor.clone, torch.Tensor.detach, torch.clone, torch.detach}
    copies = {torch.Tensor.clone, torch.clone}

    class ViewsOnly(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.made = {}  # id(result) -> (result, what made it); the result kept so its id stays its own
            self.storage = {}  # id(tensor) -> (tensor, its storage's tag); kept alive likewise

        def storage_of(self, t, default):
            return self.storage.get(id(t), (None, default))[1]

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if func in same and args and isinstance(args[0], torch.Tensor):
                x = args[0]
                fmt = kwargs.get("memory_format", args[1] if len(args) > 1 else torch.contiguous_format)
                if func in copies or (func is torch.Tensor.contiguous and not x.is_contiguous(memory_format=fmt)):
                    # The real op copies into a storage of its own, which huggingface_hub's split
                    # counts apart: the same view, under a tag of its own.
                    view = x.as_strided(x.size(), x.stride(), x.storage_offset())
                    self.storage[id(view)] = (view, "%s/copy %d" % (self.storage_of(x, "?"), len(self.storage)))
                    return view
                return x
            out = func(*args, **kwargs)
            results = out if isinstance(out, (tuple, list)) else (out,)
            for t in results:
                if not isinstance(t, torch.Tensor):
                    continue
                if t._base is None and not any(t is a for a in args):
                    name = getattr(func, "__name__", repr(func))
                    self.made[id(t)] = (t, "%s (torch.%s)" % (_conversion_op(), name))
                elif first is not None and id(first) in self.storage:
                    self.storage[id(t)] = (t, self.storage[id(first)][1])
            return out

    return ViewsOnly()


@functools.lru_cache(maxsize=4096)
def _box_layout(shape: Tuple[int, ...], size: Tuple[int, ...], stride: Tuple[int, ...]):
    """(row-major strides of shape, count, dims) of a view of that size and stride in a contiguous
    tensor of that shape, or None when no box reads so. The same for every expert of one fused
    parameter: only the offset differs, so a model's 44,544 expert views are worked out a few times."""
    strides = row_major_strides(shape)
    count = [1] * len(shape)
    dims: List[Optional[int]] = []
    for n, st in zip(size, stride):
        if n == 1:
            dims.append(None)
            continue
        held = [d for d in range(len(shape)) if shape[d] > 1 and strides[d] == st]
        if len(held) != 1 or held[0] in dims:
            return None
        dims.append(held[0])
        count[held[0]] = n
    return strides, tuple(count), tuple(dims)


def _box(name: str, base, view, model_name: str) -> Tuple[Tuple[int, ...], Tuple[int, ...], Tuple[Optional[int], ...]]:
    """(start, count, dims) of `view` in `base`, a contiguous meta tensor it views."""
    shape = tuple(base.shape)
    offset = view.storage_offset()
    layout = _box_layout(shape, tuple(view.shape), view.stride())
    if layout is not None:
        strides, count, dims = layout
        start = tuple((offset // st) % n if n else 0 for st, n in zip(strides, shape))
        if all(d is None or start[d] + count[d] <= shape[d] for d in dims):
            return start, count, dims
    raise NotImplementedError(
        "%s: transformers' reverse conversion writes %r as a view of the held tensor that is no "
        "box of it (shape %s, strides %s, offset %d in %s): shardd.torch.save_pretrained writes "
        "boxes of what the ranks hold only; save with save_state_dict, or with "
        "model.save_pretrained(save_original_format=False)"
        % (model_name, name, list(view.shape), list(view.stride()), offset, list(shape)))


def reverted_pieces(model, kept: Dict[str, object], shapes: Dict[str, Tuple[Tuple[int, ...], object]]):
    """[(saved name, Piece), ...] in the order save_pretrained writes them.

    kept: {state-dict key: stand-in} as save_pretrained would revert them
    (tied names already dropped); shapes: {key: (global shape, dtype)}.
    Each distinct stand-in becomes one meta tensor of its global shape, so
    transformers' reverse conversion runs on the real shapes and its config
    checks hold; what it hands back is read as a box of one of them.
    """
    import torch

    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers 4: no conversions on save
        return [(key, whole(key, shapes[key][0])) for key in kept if key in shapes]
    mode = _views_only_mode()
    meta, key_of, by_stand_in = {}, {}, {}
    for key, stand_in in kept.items():
        if key not in shapes:  # not a tensor: transformers passes it through
            meta[key] = stand_in
            continue
        if id(stand_in) not in by_stand_in:
            shape, dtype = shapes[key]
            t = torch.empty(shape, dtype=dtype, device="meta")
            by_stand_in[id(stand_in)] = t
            key_of[id(t)] = key
            mode.storage[id(t)] = (t, key)
        meta[key] = by_stand_in[id(stand_in)]
    with torch.no_grad(), mode:
        reverted = revert_weight_conversion(model, meta)
    model_name = type(model).__name__.removeprefix("FSDP")
    out = []
    for name, t in reverted.items():
        base = t if id(t) in key_of else t._base if isinstance(t, torch.Tensor) else None
        if base is None or id(base) not in key_of:
            made = mode.made.get(id(t))
            raise NotImplementedError(
                "%s: transformers' reverse conversion computes %r with %s, not as a view of one tensor the "
                "ranks hold: shardd.torch.save_pretrained writes only what the ranks hold; save with "
                "save_state_dict, or with model.save_pretrained(save_original_format=False)"
                % (model_name, name, made[1] if made else "an operation shardd cannot follow"))
        key = key_of[id(base)]
        if t is base:
            out.append((name, whole(key, base.shape)))
        else:
            out.append((name, Piece(key, *_box(name, base, t, model_name), mode.storage_of(t, key))))
    return out


def _config_experts(model) -> Optional[int]:
    """How many routed experts the model's config says each MoE layer has, if it says."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    for attr in ("n_routed_experts", "num_local_experts", "num_experts"):
        n = getattr(config, attr, None)
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            return n
    return None


def refuse_local_experts(model, state_dict) -> None:
    """NotImplementedError for experts held as plain local tensors: by a module that says it is
    expert parallel, or one whose fused tensor holds its num_experts, fewer than the config's.
    Which experts they are is recorded nowhere shardd can read exactly, and numbering them from
    0 would write other experts' names. DTensors (transformers 5's own EP, torchtitan's) carry
    their place and are taken apart as any other."""
    from ._dtensor import is_dtensor

    experts = _config_experts(model)
    for key, value in state_dict.items():
        owner = key.rpartition(".")[0]
        if is_dtensor(value) or not owner or not hasattr(value, "shape"):
            continue
        try:
            module = model.get_submodule(owner)
        except AttributeError:
            continue
        here = getattr(module, "num_experts", None)
        share = (isinstance(here, int) and experts is not None and len(value.shape) >= 2
                 and value.shape[0] == here < experts)
        if getattr(module, "_is_expert_parallel", False) or share:
            raise NotImplementedError(
                "%s: %r is a plain local tensor of an expert-parallel module (%d experts here%s): which "
                "global experts it holds is not recorded; make it a DTensor with Shard(0) on the "
                "expert-parallel mesh (DTensor.from_local) so each rank's experts are known"
                % (type(model).__name__, key, here if isinstance(here, int) else value.shape[0],
                   ", %d in the config" % experts if experts else ""))


def _to_saved(piece: Piece, held_view):
    """held_view (a box of the held tensor, all its dims) as a view in the saved tensor's dims."""
    x = held_view
    dims = piece.dims
    for d in range(x.dim() - 1, -1, -1):
        if d not in dims:
            x = x.select(d, 0)
    mapped = [d for d in dims if d is not None]
    if any(a > b for a, b in zip(mapped, mapped[1:])):  # a transpose: rare, so looked for first
        order = sorted(mapped)
        x = x.permute([order.index(d) for d in mapped])
    if len(mapped) != len(dims):
        for i, d in enumerate(dims):
            if d is None:
                x = x.unsqueeze(i)
    return x


def piece_parts(piece: Piece, local, boxes):
    """[(view of local in the saved tensor's dims, start in the saved tensor, count), ...]: where
    this rank's boxes of the held tensor meet the piece. boxes: (global start, count, local
    start) of the held tensor, as _dtensor.dtensor_boxes gives them."""
    out = []
    for gstart, gcount, lstart in boxes:
        index, lo, hi = [], [], []
        for a, n, b, m, o in zip(piece.start, piece.count, gstart, gcount, lstart):
            low, high = max(a, b), min(a + n, b + m)
            if high <= low:
                break
            lo.append(low)
            hi.append(high)
            index.append(slice(o + low - b, o + high - b))
        else:
            view = _to_saved(piece, local[tuple(index)])
            start = tuple(0 if d is None else lo[d] - piece.start[d] for d in piece.dims)
            count = tuple(1 if d is None else hi[d] - lo[d] for d in piece.dims)
            out.append((view, start, count))
    return out


class PieceTable(NamedTuple):
    """The pieces of one held tensor, as arrays, so that a rank's parts of all of them (a fused
    parameter's hundreds of experts) are found in a few numpy steps (table_parts)."""
    key: str
    # each piece's index for the daemon: the place in save_pretrained's order of the first piece
    # of the storage it views, as huggingface_hub's split counts a storage (PROTOCOL.md, put)
    positions: List[int]
    names: List[str]
    pieces: List[Piece]
    shapes: List[Tuple[int, ...]]  # each piece's saved shape
    starts: object  # numpy int64 (pieces, dims): each piece's start in the held tensor
    ends: object    # start + count
    empty: List[int]  # the pieces with no elements, which no box holds
    dims: Optional[Tuple[Optional[int], ...]]  # the dims every piece shares, None if they differ


def piece_tables(pieces) -> List[PieceTable]:
    """[(name, Piece), ...] grouped by held tensor, each group in the order of its first piece."""
    import numpy as np

    groups: Dict[str, List[int]] = {}
    first: Dict[str, int] = {}  # storage: its first piece's place
    for position, (_name, piece) in enumerate(pieces):
        groups.setdefault(piece.key, []).append(position)
        first.setdefault(piece.storage or piece.key, position)
    out = []
    for key, positions in groups.items():
        mine = [pieces[p][1] for p in positions]
        ndim = len(mine[0].start)
        starts = np.array([p.start for p in mine], dtype=np.int64).reshape(len(mine), ndim)
        counts = np.array([p.count for p in mine], dtype=np.int64).reshape(len(mine), ndim)
        empty = np.nonzero((counts == 0).any(axis=1))[0].tolist()
        places = [first[piece.storage or piece.key] for piece in mine]
        dims = {p.dims for p in mine}
        out.append(PieceTable(key, places, [pieces[p][0] for p in positions], mine, [p.shape for p in mine],
                              starts, starts + counts, empty, dims.pop() if len(dims) == 1 else None))
    return out


def _columns(a, dims, fill):
    """Rows of a (pieces, held dims) array in the saved dims: column d for each saved dim that
    runs along held dim d, `fill` for one of size 1 the held tensor has not."""
    import numpy as np

    if all(d is not None for d in dims):
        return a[:, list(dims)].tolist()
    return np.stack([a[:, d] if d is not None else np.full(len(a), fill, dtype=a.dtype) for d in dims],
                    axis=1).reshape(len(a), len(dims)).tolist()


def table_parts(table: PieceTable, local, boxes) -> List[list]:
    """piece_parts of every piece of a table, at once: one list per piece of (view of local in
    the saved tensor's dims, start in the saved tensor, count). Each view is made by one
    as_strided from the local tensor's own strides, not by indexing, selecting and permuting."""
    import numpy as np
    import torch

    out: List[list] = [[] for _ in table.pieces]
    if not table.pieces:
        return out
    strides = local.stride()
    stride_of = np.array(strides, dtype=np.int64)
    base = local.storage_offset()
    for gstart, gcount, lstart in boxes:
        b = np.array(gstart, dtype=np.int64)
        lo = np.maximum(table.starts, b)
        hi = np.minimum(table.ends, b + np.array(gcount, dtype=np.int64))
        hit = np.nonzero((hi > lo).all(axis=1))[0]
        if not len(hit):
            continue
        lo, hi = lo[hit], hi[hit]
        offsets = (base + ((lo - b + np.array(lstart, dtype=np.int64)) * stride_of).sum(axis=1)).tolist()
        if table.dims is not None:  # one fused parameter's experts: every column at once
            dims = table.dims
            step = tuple(1 if d is None else strides[d] for d in dims)
            sizes = _columns(hi - lo, dims, 1)
            starts = _columns(lo - table.starts[hit], dims, 0)
            for i, offset, size, start in zip(hit.tolist(), offsets, sizes, starts):
                out[i].append((torch.as_strided(local, size, step, offset), tuple(start), tuple(size)))
            continue
        for i, offset, low, high in zip(hit.tolist(), offsets, lo.tolist(), hi.tolist()):
            piece = table.pieces[i]
            size = tuple(1 if d is None else high[d] - low[d] for d in piece.dims)
            step = tuple(1 if d is None else strides[d] for d in piece.dims)
            start = tuple(0 if d is None else low[d] - piece.start[d] for d in piece.dims)
            out[i].append((torch.as_strided(local, size, step, offset), start, size))
    return out
