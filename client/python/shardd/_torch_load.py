# load_state_dict: fills a state dict of tensors and DTensors in place, each rank reading only the boxes it holds.
"""shardd.torch.load_state_dict: any shardd or save_pretrained checkpoint
into any layout. Every name is checked (present, shape, dtype) before a
byte is filled, so a refusal leaves the state dict as it was; then each
rank reads its DTensors' boxes, all at once (_load_runs.read_boxes): each
file of the checkpoint the strict reader checked is opened once and its
boxes read in runs, a fused parameter's experts scattered by few copies.
"""
from __future__ import annotations

import os
from collections import namedtuple
from typing import Any, Dict, List, Tuple

from ._errors import refusal
from ._dtensor import box_views, dtensor_boxes, is_dtensor, tensor_identity
from ._hf_convert import piece_tables, table_parts
from ._load import Checkpoint
from ._load_runs import read_boxes
from ._nested import STATE_FILE, dotted, flatten, read_state, restore
from ._save import paused_gc
from ._tensors import dtype_name

__all__ = ["load_state_dict", "IncompatibleKeys", "converted"]

# What nn.Module.load_state_dict returns.
IncompatibleKeys = namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


def _groups(state_dict) -> List[List[str]]:
    """Names in state-dict order, those that are one tensor (tied) grouped, so each is filled once."""
    groups: Dict[Any, List[str]] = {}
    for name, value in state_dict.items():
        key = tensor_identity(value)
        groups.setdefault(("name", name) if key is None else key, []).append(name)
    return list(groups.values())


def _local_boxes(name, value):
    """(local tensor, its boxes of the global one) of a tensor or DTensor."""
    import torch

    if is_dtensor(value):
        local, boxes, _ = dtensor_boxes(name, value)
        return local, boxes
    if isinstance(value, torch.Tensor):
        return value, [((0,) * value.dim(), tuple(value.shape), (0,) * value.dim())]
    raise TypeError("state_dict[%r] is a %s, not a tensor or DTensor" % (name, type(value).__name__))


def converted(model, state_dict, groups=None) -> Dict[str, List[Tuple[str, Any]]]:
    """{key: [(name in the checkpoint, Piece), ...]}: where save_pretrained puts each value of a
    transformers model (renamed, or one fused MoE parameter as many per-expert tensors); the
    names of a tied group all map to what the one save_pretrained keeps is saved as.
    groups: _groups(state_dict), where the caller has it already."""
    if model is None:
        return {}
    from ._hf import saved_pieces

    out: Dict[str, List[Tuple[str, Any]]] = {}
    for name, piece in saved_pieces(model, state_dict):
        out.setdefault(piece.key, []).append((name, piece))
    for group in _groups(state_dict) if groups is None else groups:
        held = next((out[n] for n in group if n in out), None)
        if held is not None:
            out.update((n, held) for n in group)
    return out


def _check(ck: Checkpoint, source: str, shape, dtype) -> str:
    """Why `source` of the checkpoint cannot fill a value of this shape and dtype; '' when it can."""
    info = ck.info(source)
    if tuple(shape) != info.shape:
        return "%r has shape %s in the checkpoint but %s here" % (source, list(info.shape), list(shape))
    try:
        dt = dtype_name(dtype)
    except TypeError as e:
        return "%r: %s" % (source, e)
    if dt != info.dtype:
        return "%r is %s in the checkpoint but %s here" % (source, info.dtype, dt)
    return ""


def _misfits(ck: Checkpoint, table, wants, dtype) -> List[str]:
    """Why the checkpoint's tensors cannot be what wants, [(name, shape), ...], and dtype say; []
    when they all can. Each costs a dict lookup and two compares when it fits (a fused parameter
    has hundreds of pieces); _check words what does not."""
    try:
        name = dtype_name(dtype)
    except TypeError:
        name = None
    for source, shape in wants:
        info = table[source]
        if info.dtype != name or info.shape != shape:
            break
    else:
        return []
    return [w for w in (_check(ck, source, shape, dtype) for source, shape in wants) if w]


def _fills(plan) -> List[Tuple[str, Any, Any, Any]]:
    """[(name in the checkpoint, view, start, count), ...]: every box this rank reads. A fused
    parameter's pieces (hundreds of experts) are met with the rank's boxes in a few numpy steps."""
    fills = []
    for name, value, source, tables in plan:
        local, boxes = _local_boxes(name, value)
        if not tables:
            fills.extend((source, view, start, count) for view, start, count in box_views(local, boxes))
            continue
        for table in tables:
            for source, parts in zip(table.names, table_parts(table, local, boxes)):
                fills.extend((source, view, start, count) for view, start, count in parts)
    return fills


def load_state_dict(dir, state_dict, strict=True, verify=False, model=None):
    """Fills `state_dict` (tensors and DTensors, as model.state_dict() gives them) in place from the
    checkpoint folder `dir` (shardd's, or one save_pretrained wrote), whatever mesh and
    placements it was saved from. Every rank calls it with its own state dict and reads only
    the boxes it holds.

    Names that are one tensor (tied weights) are filled once, from whichever
    of them the checkpoint holds. A missing, unexpected, wrongly shaped or
    wrongly typed tensor is named in one ShardError ("mismatch") before
    anything is filled; with strict=False missing and unexpected names are
    returned instead, as nn.Module.load_state_dict returns them (shape and
    dtype are still checked). Returns IncompatibleKeys(missing_keys,
    unexpected_keys).

    model: the transformers model whose state dict this is, for a checkpoint
    that save_pretrained wrote in the checkpoint's own layout: renamed
    tensors, and fused MoE experts (`experts.gate_up_proj` [E, 2I, H]) held
    as one tensor per expert and projection, are found by the installed
    transformers' own conversion, and each rank reads only the per-expert
    boxes its shards hold.

    verify=True also checks every file's recorded data CRC-32C
    (Checkpoint.verify) once the names fit and before anything is filled:
    a ShardError "bad_checksum" names the damaged file (or says the
    checkpoint records no checksums). It costs a read of every byte of every
    file on each rank that asks, not only the rank's own boxes.

    A nested state dict (a whole training checkpoint, as save_state_dict
    takes it) is filled the same way: its tensors in place, its plain values
    (steps, param_groups) set in their dicts from shardd_state.json.
    """
    # Tens of thousands of tensors make hundreds of thousands of objects (headers, boxes, views):
    # the collector's full passes over a process holding a model would cost more than the load.
    with paused_gc():
        return _load_state_dict(dir, state_dict, strict, verify, model)


def _load_state_dict(dir, state_dict, strict, verify, model):
    import torch

    dir = os.fspath(dir)
    nested = state_dict
    state_dict, plain = flatten(nested)
    stored = {}
    if plain:
        # The plain values (steps, param_groups) of a whole training checkpoint, checked with the
        # tensors and set once they are filled; a checkpoint without the file lacks every one.
        where = os.path.join(dir, STATE_FILE)
        try:
            with open(where, "rb") as f:
                stored = read_state(f.read(), where)
        except FileNotFoundError:
            pass
    groups = _groups(state_dict)
    held_as = converted(model, state_dict, groups)
    with Checkpoint(dir) as ck:
        table = ck.tensors()  # every name asked about at once: dict lookups from here on
        plan, missing, wrong, wanted = [], [], [], set(state_dict)
        for group in groups:
            value = state_dict[group[0]]
            held = next((held_as[n] for n in group if n in held_as), None)
            if held is not None and any(name not in table for name, _ in held):
                held = None
            if held is None:
                source = next((n for n in group if n in table), None)
                if source is None:
                    missing.extend(group)
                    continue
                tables, wants = None, [(source, tuple(value.shape))]
            else:  # the pieces as tables, which give their shapes and meet the rank's boxes at once
                source, tables = None, piece_tables(held)
                wants = [pair for t in tables for pair in zip(t.names, t.shapes)]
            why = _misfits(ck, table, wants, value.dtype)
            if why:
                wrong.extend(why)
                continue
            wanted.update(name for name, _ in wants)
            plan.append((group[0], value, source, tables))
        unexpected = [n for n in table if n not in wanted]
        wanted_plain = [path for path, _ in plain]
        missing += [dotted(p) for p in wanted_plain if p not in stored]
        unexpected += [dotted(p) for p in stored if p not in set(wanted_plain)]
        problems = list(wrong)
        if strict and missing:
            problems.append("missing from the checkpoint: " + ", ".join(map(repr, missing)))
        if strict and unexpected:
            problems.append("in the checkpoint but not in the state dict: " + ", ".join(map(repr, unexpected)))
        if problems:
            raise refusal("mismatch", "%s does not fit the state dict (nothing was filled): %s"
                          % (dir, "; ".join(problems)))
        if verify:
            ck.verify()
        with torch.no_grad():
            read_boxes(ck, _fills(plan))
        restore(nested, stored, [p for p in wanted_plain if p in stored])
    return IncompatibleKeys(missing, unexpected)
