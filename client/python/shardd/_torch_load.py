# load_state_dict: fills a state dict of tensors and DTensors in place, each rank reading only the boxes it holds.
"""shardd.torch.load_state_dict: any shardd or save_pretrained checkpoint
into any layout. Every name is checked (present, shape, dtype) before a
byte is filled, so a refusal leaves the state dict as it was; then each
rank reads its DTensors' boxes through the strict reader's box load.
"""
from __future__ import annotations

import os
from collections import namedtuple
from typing import Any, Dict, List, Tuple

from ._client import refusal
from ._dtensor import box_views, dtensor_boxes, is_dtensor, tensor_identity
from ._load import Checkpoint
from ._tensors import dtype_name

__all__ = ["load_state_dict", "IncompatibleKeys"]

# What nn.Module.load_state_dict returns.
IncompatibleKeys = namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


def _groups(state_dict) -> List[List[str]]:
    """Names in state-dict order, those that are one tensor (tied) grouped, so each is filled once."""
    groups: Dict[Any, List[str]] = {}
    for name, value in state_dict.items():
        key = tensor_identity(value)
        groups.setdefault(("name", name) if key is None else key, []).append(name)
    return list(groups.values())


def _targets(name, value) -> List[Tuple[Any, Tuple[int, ...], Tuple[int, ...]]]:
    """[(local view, global start, count), ...]: where this rank's part of `value` goes."""
    import torch

    if is_dtensor(value):
        local, boxes, _ = dtensor_boxes(name, value)
        return box_views(local, boxes)
    if isinstance(value, torch.Tensor):
        return [(value, (0,) * value.dim(), tuple(value.shape))]
    raise TypeError("state_dict[%r] is a %s, not a tensor or DTensor" % (name, type(value).__name__))


def _fill(ck: Checkpoint, source: str, view, start, count) -> None:
    import torch

    if view.numel() == 0:
        return
    whole = tuple(count) == ck.info(source).shape
    box = (None, None) if whole else (start, count)
    if view.device.type == "cpu" and view.is_contiguous():
        ck.read_into(source, view, *box)
        return
    # A strided view or a CUDA tensor: one read into host memory, then torch's own copy.
    tmp = torch.empty(tuple(count), dtype=view.dtype, pin_memory=view.device.type == "cuda")
    ck.read_into(source, tmp, *box)
    view.copy_(tmp, non_blocking=False)


def load_state_dict(dir, state_dict, strict=True, verify=False):
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

    verify=True also checks every file's recorded data CRC-32C
    (Checkpoint.verify) once the names fit and before anything is filled:
    a ShardError "bad_checksum" names the damaged file (or says the
    checkpoint records no checksums). It costs a read of every byte of every
    file on each rank that asks, not only the rank's own boxes.
    """
    import torch

    dir = os.fspath(dir)
    with Checkpoint(dir) as ck:
        plan, missing, wrong = [], [], []
        for group in _groups(state_dict):
            source = next((n for n in group if n in ck), None)
            if source is None:
                missing.extend(group)
                continue
            value, info = state_dict[group[0]], ck.info(source)
            shape = tuple(value.shape)
            if shape != info.shape:
                wrong.append("%r has shape %s in the checkpoint but %s here" % (source, list(info.shape),
                                                                                 list(shape)))
                continue
            try:
                dt = dtype_name(value.dtype)
            except TypeError as e:
                wrong.append("%r: %s" % (source, e))
                continue
            if dt != info.dtype:
                wrong.append("%r is %s in the checkpoint but %s here" % (source, info.dtype, dt))
                continue
            plan.append((source, group[0], value))
        wanted = set(state_dict)
        unexpected = [n for n in ck.names() if n not in wanted]
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
        targets = [(source, _targets(name, value)) for source, name, value in plan]
        with torch.no_grad():
            for source, parts in targets:
                for view, start, count in parts:
                    _fill(ck, source, view, start, count)
    return IncompatibleKeys(missing, unexpected)
