# shardd.torch: PyTorch state dicts as trainers hold them (tensors, DTensors of FSDP2/TP/HSDP, tied weights) saved and loaded.
"""Saving and loading torch state dicts through shardd.

    import shardd.torch as st
    st.save_pretrained(model, "run1/step-100")           # every rank; the layout save_pretrained writes
    st.save_state_dict(model.state_dict(), "run1/sd")    # DTensors, tensors, Slices, (local, shape, offset)
    st.load_state_dict("/ckpt/run1/step-100", model.state_dict())   # fills in place, any layout
    dcp.save(state_dict, storage_writer=st.StorageWriter("run1/dcp"))  # torch.distributed.checkpoint

DTensors are taken apart by each rank from their spec alone (Shard on any
dim, uneven or empty; _StridedShard; Replicate written once, by the rank at
coordinate 0 of each replicated mesh dim); Partial is refused. Tensors may
be on any device (a CUDA tensor costs one device-to-host copy into shared
memory) and need not be contiguous.
"""
import torch

from ._dtensor import PartialPlacementError, dtensor_boxes, is_dtensor, tensor_identity
from ._hf import save_pretrained
from ._client import refusal
from ._dcp import StorageReader, StorageWriter
from ._save import save
from ._tensors import Slice
from ._torch_load import IncompatibleKeys, load_state_dict

__all__ = ["split", "state_dict_tensors", "save_state_dict", "save_pretrained", "load_state_dict",
           "dtensor_slices", "tie_groups", "IncompatibleKeys", "StorageWriter", "StorageReader"]

_TIED = (None, "drop")


def split(tensor, dim, rank, world_size):
    """This rank's part of `tensor` cut as torch.tensor_split(tensor, world_size, dim) cuts it.

    Pieces may be uneven and, with more ranks than rows, empty. Returns a
    Slice: the local piece (a view, not a copy), the global shape and where
    the piece starts.
    """
    if not 0 <= rank < world_size:
        raise ValueError("rank %d is outside world_size %d" % (rank, world_size))
    dim = dim % tensor.dim()
    pieces = torch.tensor_split(tensor, world_size, dim)
    start = [0] * tensor.dim()
    start[dim] = sum(p.shape[dim] for p in pieces[:rank])
    return Slice(pieces[rank], tuple(tensor.shape), tuple(start))


def dtensor_slices(name, dt):
    """The Slices this rank hands over for a DTensor: one per box of its local tensor, or one
    empty Slice when a replica at another coordinate holds the same bytes.

    Raises ShardError invalid_argument naming the tensor for a Partial placement."""
    try:
        local, boxes, primary = dtensor_boxes(name, dt)
    except PartialPlacementError as e:
        raise refusal("invalid_argument", str(e)) from None
    shape = tuple(dt.shape)
    if not primary and shape:
        count = (0,) + shape[1:]
        return [Slice(local.new_empty(count), shape, (0,) * len(shape))]
    out = []
    for start, count, at in boxes:
        view = local[tuple(slice(a, a + c) for a, c in zip(at, count))] if boxes[1:] else local
        out.append(Slice(view, shape, start))
    return out


def tie_groups(state_dict):
    """[[name, ...], ...]: the names of a state dict that are one tensor (tied weights), each
    group in state-dict order, groups in the order of their first name."""
    groups = {}
    for name, value in state_dict.items():
        key = tensor_identity(value.array if isinstance(value, Slice) else value)
        if key is not None:
            groups.setdefault(key, []).append(name)
    return [g for g in groups.values() if len(g) > 1]


def state_dict_tensors(state_dict, tied=None):
    """{name: tensor, Slice or [Slice, ...]} for save() from a state dict whose values are whole
    tensors, DTensors, Slices, or (local tensor, global shape, offset) triples; the order is kept.

    tied: names that are one tensor (tied weights) are refused with a
    ValueError saying which to drop, unless tied="drop", which keeps the
    first name of each group in state-dict order and leaves out the rest.
    """
    if tied not in _TIED:
        raise ValueError("tied must be None or 'drop', not %r" % (tied,))
    dropped = set()
    for group in tie_groups(state_dict):
        if tied is None:
            raise ValueError(
                "tensors %s are one tensor (tied weights): pass tied='drop' to save only %r (the first "
                "in the state dict), drop the others from the dict yourself, or save a transformers "
                "model with shardd.torch.save_pretrained, which drops what save_pretrained drops"
                % (", ".join(map(repr, group)), group[0]))
        dropped.update(group[1:])
    out = {}
    for name, value in state_dict.items():
        if name in dropped:
            continue
        if isinstance(value, tuple):
            if len(value) != 3:
                raise ValueError("state_dict[%r]: a tuple must be (local tensor, global shape, offset)"
                                 % (name,))
            value = Slice(*value)
        elif is_dtensor(value):
            value = dtensor_slices(name, value)
        elif not isinstance(value, (torch.Tensor, Slice)):
            raise TypeError("state_dict[%r] is a %s, not a tensor, DTensor, Slice or (tensor, shape, "
                            "offset)" % (name, type(value).__name__))
        out[name] = value
    return out


def save_state_dict(state_dict, dir, tied=None, **kwargs):
    """shardd.save(state_dict_tensors(state_dict, tied), dir, **kwargs): one call per rank per checkpoint.

    Every rank calls it with its own state dict (model.state_dict(), or
    get_model_state_dict, of an FSDP2/TP/HSDP model): each works out its
    boxes from its DTensors' specs. Everything is checked before the daemon
    hears of the save, so a refusal (a Partial DTensor, tied names) leaves
    nothing behind. Takes every option of shardd.save (wait=False, timeout,
    max_shard_size, metadata, files, ...)."""
    return save(state_dict_tensors(state_dict, tied), dir, **kwargs)
