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

from ._dcp import StorageReader, StorageWriter
from ._hf import save_pretrained
from ._tensors import Slice
from ._torch_load import IncompatibleKeys, load_state_dict
from ._torch_state import dtensor_slices, save_state_dict, state_dict_tensors, tie_groups

__all__ = ["split", "state_dict_tensors", "save_state_dict", "save_pretrained", "load_state_dict",
           "dtensor_slices", "tie_groups", "IncompatibleKeys", "StorageWriter", "StorageReader"]


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
