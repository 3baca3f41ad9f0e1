# State dicts as trainers hold them (tensors, DTensors, Slices, triples, tied names) turned into one shardd.save.
"""What save_state_dict hands to shardd.save: each DTensor taken apart into
this rank's boxes, replicas handed over once, Partial refused, tied names
refused or dropped, all before the daemon hears of the save."""
import torch

from ._errors import refusal
from ._nested import STATE_FILE, flatten, state_file
from ._dtensor import PartialPlacementError, box_views, dtensor_boxes, is_dtensor, tensor_identity
from ._save import save
from ._tensors import Slice

__all__ = ["dtensor_parts", "dtensor_slices", "tie_groups", "state_dict_tensors", "save_state_dict"]

_TIED = (None, "drop")


def dtensor_parts(name, dt):
    """(local tensor, boxes, primary) of a DTensor (dtensor_boxes); ShardError invalid_argument
    naming the tensor for a Partial placement."""
    try:
        return dtensor_boxes(name, dt)
    except PartialPlacementError as e:
        raise refusal("invalid_argument", str(e)) from None


def dtensor_slices(name, dt):
    """The Slices this rank hands over for a DTensor: one per box of its local tensor, or one
    empty Slice when a replica at another coordinate holds the same bytes.

    Raises ShardError invalid_argument naming the tensor for a Partial placement."""
    local, boxes, primary = dtensor_parts(name, dt)
    shape = tuple(dt.shape)
    if not primary and shape:
        count = (0,) + shape[1:]
        return [Slice(local.new_empty(count), shape, (0,) * len(shape))]
    return [Slice(view, shape, start) for view, start, _ in box_views(local, boxes)]


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
    tensors, DTensors, Slices, lists of Slices (several boxes of one tensor), or (local tensor,
    global shape, offset) triples; the order is kept.

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
        elif isinstance(value, list) and value and all(isinstance(v, Slice) for v in value):
            pass  # several boxes of one tensor, as save() takes them
        elif not isinstance(value, (torch.Tensor, Slice)):
            raise TypeError("state_dict[%r] is a %s, not a tensor, DTensor, Slice or (tensor, shape, "
                            "offset)" % (name, type(value).__name__))
        out[name] = value
    return out


def save_state_dict(state_dict, dir, tied=None, files=None, **kwargs):
    """shardd.save(state_dict_tensors(state_dict, tied), dir, **kwargs): one call per rank per checkpoint.

    Every rank calls it with its own state dict (model.state_dict(), or
    get_model_state_dict, of an FSDP2/TP/HSDP model): each works out its
    boxes from its DTensors' specs. Everything is checked before the daemon
    hears of the save, so a refusal (a Partial DTensor, tied names) leaves
    nothing behind. Takes every option of shardd.save (wait=False, timeout,
    max_shard_size, metadata, files, ...).

    A whole training checkpoint may be nested (torchtitan's {"model",
    "optimizer", "train_state"}, get_optimizer_state_dict's form): its
    tensors are saved under dotted names (a top-level "model" dict's under its
    own names, as from_pretrained expects them; every other top-level dict's
    in files named after its key, optimizer-00001-of-00002.safetensors and
    so on, under the one index) and its other values (steps, learning rates,
    param_groups) into shardd_state.json in the same save."""
    prefixes = {}
    tensors, plain = flatten(state_dict, prefixes)
    if plain:
        files = dict(files or {})
        files[STATE_FILE] = state_file(plain)
    if prefixes:
        kwargs["prefixes"] = {**(kwargs.get("prefixes") or {}), **prefixes}
    return save(state_dict_tensors(tensors, tied), dir, files=files, **kwargs)
