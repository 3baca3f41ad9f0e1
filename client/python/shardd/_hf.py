# save_pretrained through shardd: the names, files, index and configs transformers writes, from every rank's shards.
"""shardd.torch.save_pretrained: what `model.save_pretrained(dir)` writes for
an unsharded copy of the model, written by the node daemons from each
rank's own shards, with no gather.

The decisions are transformers' own, taken on a stand-in state dict (one
one-element tensor per distinct parameter, shared by the names that are one
tensor), so that which tied name is dropped, which keys are ignored and how
names are converted back follow the installed transformers exactly; the
shard files follow from the daemon's planner, which splits in state-dict
order as huggingface_hub does.
"""
from __future__ import annotations

import os
import tempfile
import weakref
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from ._hf_convert import Piece, PieceTable, piece_tables, refuse_local_experts, reverted_pieces, table_parts
from ._peft import peft_model, save_adapter
from ._errors import parse_size
from ._save import Prepared, paused_gc, prepare_save, save
from ._torch_state import dtensor_parts
from ._unwrap import unwrap_model

__all__ = ["save_pretrained", "saved_names", "saved_pieces"]

# {model: (signature, saved_pieces' answer)}: the last answer for each live model.
_PIECES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
# {model: (saved_pieces' answer, its piece_tables)}
_TABLES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
# {model: _Repeat}: what the model's last save worked out, for its next save of the same tensors.
_REPEATS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _owner(model, name: str):
    """The parameter or buffer object `name` resolves to: tied names resolve to one object."""
    for getter in ("get_parameter", "get_buffer"):
        try:
            return getattr(model, getter)(name)
        except (AttributeError, KeyError):
            continue
    return None


def _stand_ins(model, state_dict) -> Dict[str, Any]:
    """{name: tiny CPU tensor}, one tensor per distinct parameter: names that are one tensor share it."""
    import torch

    from ._dtensor import is_dtensor

    by_key: Dict[Any, Any] = {}
    out = {}
    for name, value in state_dict.items():
        if not isinstance(value, torch.Tensor):
            out[name] = value
            continue
        owner = _owner(model, name)
        if owner is not None:
            key = ("object", id(owner))
        elif not is_dtensor(value) and value.untyped_storage().data_ptr():
            key = ("storage", str(value.device), value.untyped_storage().data_ptr(),
                   value.storage_offset(), tuple(value.shape))
        else:
            key = ("name", name)
        if key not in by_key:
            by_key[key] = torch.empty(1, dtype=value.dtype)
        out[name] = by_key[key]
    return out


def saved_pieces(model, state_dict) -> List[Tuple[str, Piece]]:
    """[(name in the checkpoint, Piece of a state_dict value), ...] in the order save_pretrained
    writes them: most are a whole value; a fused MoE parameter gives one Piece per expert and
    projection, as the installed transformers converts it back (_hf_convert)."""
    from transformers import modeling_utils

    refuse_local_experts(model, state_dict)
    stand_in = _stand_ins(model, state_dict)
    for key in getattr(model, "_keys_to_ignore_on_save", None) or ():
        stand_in.pop(key, None)
    # A trainer saves the same model again and again: the answer depends only on the names, which
    # are one tensor, the shapes and dtypes, and the conversions the model records.
    groups: Dict[int, int] = {}
    signature = (id(getattr(model, "_weight_conversions", None)),) + tuple(
        (key, groups.setdefault(id(t), len(groups)), tuple(getattr(state_dict[key], "shape", ())),
         str(getattr(state_dict[key], "dtype", ""))) for key, t in stand_in.items())
    cached = _PIECES.get(model)
    if cached is not None and cached[0] == signature:
        return cached[1]
    kept = modeling_utils.remove_tied_weights_from_state_dict(dict(stand_in), model)
    shapes = {key: (tuple(state_dict[key].shape), state_dict[key].dtype) for key in kept
              if hasattr(state_dict[key], "shape") and hasattr(state_dict[key], "dtype")}
    pieces = reverted_pieces(model, kept, shapes)
    _PIECES[model] = (signature, pieces)
    return pieces


def saved_names(model, state_dict) -> List[Tuple[str, str]]:
    """[(name in the checkpoint, key in state_dict), ...] in the order save_pretrained writes them."""
    return [(name, piece.key) for name, piece in saved_pieces(model, state_dict)]


def _tables(model, pieces) -> List[PieceTable]:
    """piece_tables(pieces), kept beside saved_pieces' answer for the same model."""
    cached = _TABLES.get(model)
    if cached is None or cached[0] is not pieces:
        cached = _TABLES[model] = (pieces, piece_tables(pieces))
    return cached[1]


def _saved_values(state_dict, tables) -> Tuple[Dict[str, Any], Dict[str, int]]:
    """({saved name: what this rank hands over}, {saved name: its place in save_pretrained's order}).

    A value is the tensor itself where a piece is a whole plain tensor, else the Slices of the
    piece that this rank's local boxes hold. A piece this rank holds nothing of is left out:
    the rank whose boxes hold it hands it over, and the places keep every rank's order the
    same. (Each rank declaring every expert, most of them empty, cost each rank of a
    DeepSeek-V3-shaped model 45,395 slices to describe instead of 11,987.) Only a piece with
    no elements, which no box holds, is declared by every rank, as an empty Slice. The pieces
    of one held tensor come out in the order of their bytes in it, so that the arena holds
    them as the local tensor does and one copy moves them all (_tensors.copy_all)."""
    from ._dtensor import box_views, is_dtensor
    from ._tensors import Slice

    out: Dict[str, Any] = {}
    order: Dict[str, int] = {}
    for table in tables:
        value = state_dict[table.key]
        dtensor = is_dtensor(value)
        if dtensor:
            local, boxes, primary = dtensor_parts(table.key, value)
        else:
            local, boxes, primary = value, [((0,) * value.dim(), tuple(value.shape), (0,) * value.dim())], True
        if len(table.pieces) == 1 and table.pieces[0].is_whole(value.shape):
            name = table.names[0]
            if not dtensor:
                out[name] = value
            elif primary or not value.numel():
                views = box_views(local, boxes) if primary else []
                out[name] = ([Slice(view, value.shape, start) for view, start, _ in views] if views else
                             Slice(local.new_empty((0,) * value.dim()), value.shape, (0,) * value.dim()))
            else:
                continue
            order[name] = table.positions[0]
            continue
        parts = table_parts(table, local, boxes) if primary else [[] for _ in table.pieces]
        held = [(found[0][0].storage_offset(), i) for i, found in enumerate(parts) if found]
        held.sort()
        for _offset, i in held:
            name, shape = table.names[i], table.shapes[i]
            out[name] = [Slice.of(view, shape, start) for view, start, _ in parts[i]]
            order[name] = table.positions[i]
        for i in table.empty:
            shape = table.shapes[i]
            out[table.names[i]] = Slice(local.new_empty((0,) * len(shape)), shape, (0,) * len(shape))
            order[table.names[i]] = table.positions[i]
    return out, order


class _Repeat(NamedTuple):
    """A save_pretrained's work kept for the next save of the same model while its tensors stay
    where they were (a trainer saving every N steps): everything but the copy depends only on the
    names, shapes, layouts and addresses that `signature` records. It holds no tensor: each copy
    is a recipe, (held tensor's place in the state dict, size, stride, storage offset, arena
    offset), made into a view of that save's own tensor again."""
    signature: tuple
    prepared: Prepared  # with no units
    recipes: List[Tuple[int, Tuple[int, ...], Tuple[int, ...], int, int]]
    total: int  # num_parameters
    conversions: Any  # the model's _weight_conversions, kept so that its id stays its own


def _held(state_dict, options) -> Optional[Tuple[list, tuple]]:
    """([each value's local tensor], signature) of a state dict of tensors and DTensors; None
    when some value is neither, or has no storage. The signature holds what a save's work
    depends on: names, global shapes and placements, and each local tensor's address, layout and
    dtype."""
    import torch

    from ._dtensor import dtensor_class

    dtensor = dtensor_class()
    locals_, signature = [], [options]
    for key, value in state_dict.items():
        if dtensor is not None and isinstance(value, dtensor):
            spec = value._spec
            local = getattr(value, "_local_tensor", None)  # to_local() is an autograd call: slower
            if local is None:
                local = value.to_local()
            extra = (spec.mesh, spec.placements, spec.shape)
        elif isinstance(value, torch.Tensor):
            local, extra = value, None
        else:
            return None
        try:
            address = local.data_ptr()
        except RuntimeError:  # a tensor subclass with no storage: its save is worked out each time
            return None
        locals_.append(local)
        signature.append((key, address, local.shape, local.stride(), local.storage_offset(), local.dtype,
                          local.device, local.is_conj(), local.is_neg(), extra))
    return locals_, tuple(signature)


def _recipes(units, locals_):
    """_Repeat.recipes of a Prepared's copy units; None when a unit's source is no view of a
    held tensor (a copy prepare made: a resolved conjugate)."""
    import torch

    storages = {}
    for i, local in enumerate(locals_):
        storages.setdefault((local.device, local.untyped_storage().data_ptr(), local.dtype), i)
    out = []
    for src, offset in units:
        if not isinstance(src, torch.Tensor):
            return None
        i = storages.get((src.device, src.untyped_storage().data_ptr(), src.dtype))
        if i is None:
            return None
        out.append((i, tuple(src.shape), tuple(src.stride()), src.storage_offset(), offset))
    return out


def _prepared(model, state_dict, limit, prefix, prefixes) -> Tuple[Prepared, int]:
    """(Prepared, num_parameters) of a save_pretrained with max_shard_size `limit` (bytes).
    A save of the same tensors as the model's last one (same _held signature) reuses its work:
    each rank's part of a DeepSeek-V3-shaped model is 11,987 slices to describe and place, which
    took longer than copying their bytes."""
    import torch

    # Which names are one tensor goes by the Parameter objects that own them (_stand_ins): one
    # replaced by another object over the same memory unties them, and the work is redone.
    owners = tuple(id(p) for _name, p in model.named_parameters(remove_duplicate=False))
    options = (limit, prefix, None if prefixes is None else tuple(prefixes.items()),
               id(getattr(model, "_weight_conversions", None)),
               tuple(getattr(model, "_keys_to_ignore_on_save", None) or ()), owners)
    held = _held(state_dict, options)
    repeat = _REPEATS.get(model)
    if held is not None and repeat is not None and repeat.signature == held[1]:
        locals_ = held[0]
        units = [(torch.as_strided(locals_[i], size, stride, offset), at)
                 for i, size, stride, offset, at in repeat.recipes]
        return repeat.prepared._replace(units=units), repeat.total
    _REPEATS.pop(model, None)
    tensors, order = _saved_values(state_dict, _tables(model, saved_pieces(model, state_dict)))
    prepared = prepare_save(tensors, ordered=order, prefixes=prefixes, prefix=prefix, max_shard_size=limit)
    total = num_parameters(model, state_dict)
    recipes = None if held is None else _recipes(prepared.units, held[0])
    if recipes is not None:
        _REPEATS[model] = _Repeat(held[1], prepared._replace(units=[]), recipes, total,
                                  getattr(model, "_weight_conversions", None))
    return prepared, total


def config_files(model) -> Dict[str, bytes]:
    """config.json and, for a model that generates, generation_config.json, as save_pretrained writes them."""
    model.config.dtype = str(model.dtype).split(".")[1]
    # FSDP2 wraps in place, renaming the class: save_pretrained strips the prefix the same way.
    model.config.architectures = [type(model).__name__.removeprefix("FSDP")]
    return config_json_files(model.config, model.generation_config if model.can_generate() else None)


def config_json_files(config, generation_config=None) -> Dict[str, bytes]:
    """{file name: bytes} that config.save_pretrained (and generation_config's) write."""
    with tempfile.TemporaryDirectory(prefix="shardd-config-") as d:
        config.save_pretrained(d)
        if generation_config is not None:
            generation_config.save_pretrained(d)
        out = {}
        for name in sorted(os.listdir(d)):
            with open(os.path.join(d, name), "rb") as f:
                out[name] = f.read()
        return out


def save_pretrained(model, dir, max_shard_size="50GB", state_dict=None, files=None, **kwargs):
    """What model.save_pretrained(dir, max_shard_size=...) writes for an unsharded copy of the model,
    saved from every rank's own shards in one atomic save. Every rank calls it.

    model: a transformers PreTrainedModel, whole or wrapped by FSDP2
    (fully_shard) and/or TP (parallelize_module) in place, or by torch.compile,
    DDP or DataParallel (unwrapped); a PEFT model (get_peft_model), whose
    adapter is written as PEFT's save_pretrained writes it (adapter_model.safetensors
    and adapter_config.json); anything else raises TypeError. Written: the same
    tensor names (tied and shared parameters dropped as save_pretrained drops
    them, _keys_to_ignore_on_save left out), the same shard files holding the
    same tensors, save_pretrained's index (plus shardd's checksums), config.json and,
    where the model generates, generation_config.json. max_shard_size
    defaults to save_pretrained's "50GB". state_dict: what the model's
    state_dict() would give, if the caller already has it. files: more
    {name: bytes} beside them. Every other option goes to shardd.save
    (wait=False, timeout, overwrite, keep_last, socket, ...).
    """
    if peft_model(model) is not None:
        return save_adapter(model, dir, state_dict=state_dict, files=files, **kwargs)
    model, state_dict = unwrap_model(model, state_dict)
    if getattr(model, "_hf_peft_config_loaded", False) or getattr(model, "hf_quantizer", None):
        raise NotImplementedError("adapter (PEFT) and quantized models are saved by transformers' "
                                  "own save_pretrained only")
    import torch

    if state_dict is None:
        # The parameters themselves, not a detached copy of each: a DTensor's detach costs tens of
        # microseconds, a DeepSeek-V3-shaped model's rank holds 909. Nothing here changes them, and
        # the views taken of them are made without autograd (no_grad).
        state_dict = model.state_dict(keep_vars=True)
    max_shard_size = parse_size(max_shard_size)
    prefixes = kwargs.pop("prefixes", None)
    with paused_gc(), torch.no_grad():
        prepared, total = _prepared(model, state_dict, max_shard_size, kwargs.get("prefix"), prefixes)
    all_files = config_files(model)
    all_files.update(files or {})
    return save(prepared, dir, max_shard_size=max_shard_size, files=all_files, total_parameters=total or None,
                **kwargs)


def num_parameters(model, state_dict) -> int:
    """model.num_parameters() of the unsharded model, which save_pretrained writes as the index's
    total_parameters: its parameters' global elements, each tied parameter once, no buffers.
    Only the parameters this save writes count (transformers counts all of them): a parameter
    left out (_keys_to_ignore_on_save, a state_dict without it) would make the index claim more
    than its files hold, which the daemon refuses at seal."""
    import math

    ignored = set(getattr(model, "_keys_to_ignore_on_save", None) or ())
    total = 0
    for name, p in model.named_parameters():
        if name in ignored or name not in state_dict:
            continue
        value = state_dict[name]
        total += math.prod(value.shape) if hasattr(value, "shape") else p.numel()
    return total
