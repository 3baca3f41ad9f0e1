# shardd.torch: a model's state_dict, whole or split across ranks as tensor parallelism does, in one save() call.
"""Saving torch state dicts through shardd.

    import shardd.torch as st
    sd = {"embed.weight": emb,                                   # whole tensor
          "mlp.up.weight": (local_up, (4096, 1024), (r0, 0)),     # (local, global shape, offset)
          "mlp.down.weight": st.split(full_down, dim=1, rank=rank, world_size=tp)}
    st.save_state_dict(sd, "run1/step-100")                      # rank, nodes, socket from torchrun

Tensors may be on any device (a CUDA tensor costs one device-to-host copy
into shared memory) and need not be contiguous.
"""
import torch

from ._save import save
from ._tensors import Slice

__all__ = ["split", "state_dict_tensors", "save_state_dict"]


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


def state_dict_tensors(state_dict):
    """{name: tensor or Slice} for save() from a state dict whose values are whole tensors,
    Slices, or (local tensor, global shape, offset) triples; the order is kept."""
    out = {}
    for name, value in state_dict.items():
        if isinstance(value, tuple):
            if len(value) != 3:
                raise ValueError("state_dict[%r]: a tuple must be (local tensor, global shape, offset)"
                                 % (name,))
            value = Slice(*value)
        elif not isinstance(value, (torch.Tensor, Slice)):
            raise TypeError("state_dict[%r] is a %s, not a tensor, Slice or (tensor, shape, offset)"
                            % (name, type(value).__name__))
        out[name] = value
    return out


def save_state_dict(state_dict, dir, **kwargs):
    """shardd.save(state_dict_tensors(state_dict), dir, **kwargs): one call per rank per checkpoint."""
    return save(state_dict_tensors(state_dict), dir, **kwargs)
