# DTensors as boxes of their global tensor: each rank's part worked out from the spec alone, no collective.
"""Where a DTensor's local tensor lies in the global one.

A rank's local tensor is, along each dimension, a selection of global
indices: Shard(d) keeps one torch.chunk-sized piece of what is left,
_StridedShard(d, split_factor) keeps one piece of each of split_factor
pieces (FSDP2 over TP on the same dim), Replicate keeps everything. The
selection along each dim is a list of runs of consecutive global indices,
so the local tensor is the product of those runs: one box, or several for
a genuinely strided shard. Nothing here talks to other ranks, so every rank
can plan its own puts and reads.
"""
from __future__ import annotations

import sys
from typing import List, Sequence, Tuple

__all__ = ["is_dtensor", "dtensor_class", "Box", "placement_boxes", "dtensor_boxes", "box_views", "tensor_identity",
           "PartialPlacementError"]

# (global start, count, local start): one box of a local tensor, one entry per dim each.
Box = Tuple[Tuple[int, ...], Tuple[int, ...], Tuple[int, ...]]
# (global start, length, local start) of consecutive global indices along one dim.
Run = Tuple[int, int, int]


class PartialPlacementError(ValueError):
    """A DTensor holds pending reductions (Partial): its local values are not the tensor's."""


def dtensor_class():
    """torch's DTensor class; None without torch or without a public DTensor."""
    if sys.modules.get("torch") is None:
        return None
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch < 2.4 keeps it private; shardd needs >= 2.4 for DTensors
        return None
    return DTensor


def is_dtensor(x) -> bool:
    cls = dtensor_class()
    return cls is not None and isinstance(x, cls)


def _chunk(length: int, num_chunks: int, rank: int) -> Tuple[int, int]:
    """[lo, hi) of piece `rank` when torch.chunk cuts `length` into num_chunks (missing pieces empty)."""
    size = -(-length // num_chunks) if length else 0
    lo = min(rank * size, length)
    return lo, min(lo + size, length)


def _take(runs: List[Run], lo: int, hi: int) -> List[Run]:
    """The runs covering local positions [lo, hi) of the concatenation of runs, renumbered from 0."""
    out: List[Run] = []
    pos = 0
    for g, n, _ in runs:
        a, b = max(lo, pos), min(hi, pos + n)
        if a < b:
            out.append((g + a - pos, b - a, a - lo))
        pos += n
    return out


def _renumber(runs: List[Run]) -> List[Run]:
    out: List[Run] = []
    pos = 0
    for g, n, _ in runs:
        if out and out[-1][0] + out[-1][1] == g:
            out[-1] = (out[-1][0], out[-1][1] + n, out[-1][2])
        else:
            out.append((g, n, pos))
        pos += n
    return out


def _kind(placement) -> str:
    """'shard', 'strided', 'replicate' or 'partial', by duck type (the classes moved between releases)."""
    name = type(placement).__name__
    if "Strided" in name:
        return "strided"
    if callable(getattr(placement, "is_partial", None)) and placement.is_partial():
        return "partial"
    if callable(getattr(placement, "is_replicate", None)) and placement.is_replicate():
        return "replicate"
    if callable(getattr(placement, "is_shard", None)) and placement.is_shard():
        return "shard"
    return name.lower()


def _strided(runs: List[Run], length: int, num_chunks: int, rank: int, split_factor: int) -> List[Run]:
    """_StridedShard: cut into split_factor torch.chunk pieces, each into num_chunks, keep piece `rank` of each."""
    out: List[Run] = []
    for j in range(split_factor):
        a, b = _chunk(length, split_factor, j)
        c, d = _chunk(b - a, num_chunks, rank)
        out += _take(runs, a + c, a + d)
    return _renumber(out)


def placement_boxes(global_shape: Sequence[int], mesh_shape: Sequence[int],
                    coordinate: Sequence[int], placements, name: str = "tensor") -> Tuple[List[Box], bool]:
    """(boxes, primary) of the local tensor at `coordinate` of a mesh.

    boxes: the local tensor's pieces as (global start, count, local start),
    one box unless a strided shard leaves gaps; an empty local tensor is one
    box with a zero count. primary: False when a Replicate mesh dim puts this
    rank at a coordinate other than 0, so another rank holds the same bytes
    and this one need not hand them over. PartialPlacementError for Partial.
    """
    shape = [int(s) for s in global_shape]
    runs: List[List[Run]] = [[(0, n, 0)] if n else [] for n in shape]
    primary = True
    for mesh_dim, p in enumerate(placements):
        kind = _kind(p)
        k, c = int(mesh_shape[mesh_dim]), int(coordinate[mesh_dim])
        if kind == "partial":
            raise PartialPlacementError(
                "tensor %r is a DTensor with a Partial placement on mesh dim %d: its local values are "
                "unreduced partial sums; call .redistribute(placements=[Replicate() or Shard(d)]) or "
                ".full_tensor() first" % (name, mesh_dim))
        if kind == "replicate":
            primary = primary and c == 0
            continue
        if kind not in ("shard", "strided"):
            raise TypeError("tensor %r: DTensor placement %r is not Shard, _StridedShard, Replicate "
                            "or Partial" % (name, p))
        d = int(p.dim) % len(shape)
        length = sum(n for _, n, _ in runs[d])
        if kind == "strided":
            runs[d] = _strided(runs[d], length, k, c, int(p.split_factor))
        else:
            lo, hi = _chunk(length, k, c)
            runs[d] = _take(runs[d], lo, hi)
    return _product(shape, runs), primary


def _product(shape: List[int], runs: List[List[Run]]) -> List[Box]:
    if any(not r for r in runs):
        count = tuple(sum(n for _, n, _ in r) for r in runs)
        return [((0,) * len(shape), count, (0,) * len(shape))]
    boxes: List[Box] = [((), (), ())]
    for dim_runs in runs:
        boxes = [(s + (g,), n + (c,), l + (o,)) for s, n, l in boxes for g, c, o in dim_runs]
    return boxes


def dtensor_boxes(name: str, dt) -> Tuple[object, List[Box], bool]:
    """(local tensor, boxes, primary) of a DTensor on this rank (see placement_boxes).

    The boxes are checked against the local tensor's shape, so a layout this
    code does not understand fails loudly rather than writing misplaced bytes.
    """
    mesh = dt.device_mesh
    coordinate = mesh.get_coordinate()
    local = dt.to_local()
    if coordinate is None:  # this rank is outside the mesh: it holds nothing
        return local, [((0,) * dt.dim(), (0,) * dt.dim(), (0,) * dt.dim())], False
    boxes, primary = placement_boxes(tuple(dt.shape), tuple(mesh.shape), coordinate, dt.placements, name)
    expect = tuple(sum(c[d] for s, c, l in boxes if all(x == 0 for i, x in enumerate(l) if i != d))
                   for d in range(dt.dim())) if boxes else ()
    if tuple(local.shape) != expect:
        raise ValueError("tensor %r: the local shard's shape %s is not the %s its placements %s give on "
                         "mesh %s at %s" % (name, list(local.shape), list(expect), list(dt.placements),
                                            list(mesh.shape), list(coordinate)))
    return local, boxes, primary


def box_views(local, boxes: List[Box]):
    """[(view of local, global start, count), ...]: each box's part of the local tensor, the
    local tensor itself when one box covers it."""
    if len(boxes) == 1:
        return [(local, boxes[0][0], boxes[0][1])]
    return [(local[tuple(slice(a, a + c) for a, c in zip(at, count))], start, count)
            for start, count, at in boxes]


def tensor_identity(t):
    """A key equal for two values that are the same tensor (tied weights); None when unknowable."""
    if is_dtensor(t):
        local = t.to_local()
        inner = tensor_identity(local)
        return None if inner is None else ("dtensor", inner, tuple(t.shape), tuple(map(str, t.placements)))
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(t, torch.Tensor) or t.device.type == "meta":
        return None
    storage = t.untyped_storage()
    if storage.nbytes() == 0 or storage.data_ptr() == 0:
        return None
    return (str(t.device), storage.data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()),
            t.dtype)
