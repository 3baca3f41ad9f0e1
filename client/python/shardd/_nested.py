# Nested state dicts (a model's and an optimizer's, the step, the scheduler) as one flat set of tensor names plus their plain values, and back.
"""A whole training checkpoint is a nested dict: torchtitan's
{"model", "optimizer", "train_state"}, get_optimizer_state_dict's
{"state": {fqn: {"exp_avg": ...}}, "param_groups": [...]}. Its tensors are
saved under dotted names (a top-level "model" dict's under their own names,
so that from_pretrained of the folder still finds the model's weights; every
other top-level dict's in files of its own, named after its key:
optimizer-00001-of-00002.safetensors beside model-00001-of-00003.safetensors,
under the one index), and
every other value (numbers, strings, lists, the param_groups) goes into one
JSON file beside the shards, STATE_FILE, written in the same atomic save.
Every rank must hold the same plain values (the daemon refuses a file two
ranks send differently, naming both).
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping, Optional, Tuple

__all__ = ["STATE_FILE", "flatten", "series_of", "series_prefix", "state_file", "read_state", "dotted", "restore"]

STATE_FILE = "shardd_state.json"
_FORMAT = "shardd-state-1"


def _is_tensor_like(value) -> bool:
    import torch

    from ._tensors import Slice

    if isinstance(value, (torch.Tensor, Slice)):
        return True
    if isinstance(value, list) and value and all(isinstance(v, Slice) for v in value):
        return True
    # (local tensor, global shape, offset)
    return isinstance(value, tuple) and len(value) == 3 and isinstance(value[0], torch.Tensor)


def series_of(path: Tuple) -> Optional[str]:
    """The file prefix of a tensor at `path` in a nested state dict: its top-level key's
    (series_prefix) under any top-level dict other than "model"; None (the save's own) else."""
    return series_prefix(path[0]) if len(path) > 1 and path[0] != "model" else None


def series_prefix(key) -> str:
    """The file prefix of the tensors under top-level key `key` (not "model"): the key itself,
    which must then be a plain file name."""
    text = str(key)
    if (not text or len(text.encode("utf-8", "surrogatepass")) > 128 or text.startswith(".") or "/" in text
            or any(ord(c) < 0x20 or ord(c) == 0x7F for c in text)):
        raise ValueError("state dict key %r names the files its tensors go in, so it must be a plain file name "
                         "of at most 128 bytes (no '/', no leading '.', no control character)" % (key,))
    return text


def flatten(state_dict: Mapping, prefixes: Optional[Dict[str, str]] = None
            ) -> Tuple[Dict[str, Any], List[Tuple[Tuple, Any]]]:
    """({tensor name: value}, [(path, plain value), ...]) in the state dict's order. Nested dicts
    give dotted names; a top-level "model" dict of a nested state dict keeps its own names.
    prefixes, when given, gets {tensor name: file prefix} for the tensors of every other
    top-level dict of a nested state dict (series_prefix of its key)."""
    nested = any(isinstance(v, Mapping) for v in state_dict.values())
    tensors: Dict[str, Any] = {}
    plain: List[Tuple[Tuple, Any]] = []

    def walk(path: Tuple, value, name_parts: Tuple) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(path + (k,), v, name_parts + (str(k),))
            return
        if _is_tensor_like(value):
            name = ".".join(name_parts)
            if name in tensors:
                raise ValueError("two tensors of the state dict are both named %r once flattened" % name)
            tensors[name] = value
            series = series_of(path) if prefixes is not None and nested else None
            if series is not None:
                prefixes[name] = series
        else:
            plain.append((path, value))

    for key, value in state_dict.items():
        own_names = nested and key == "model" and isinstance(value, Mapping)
        walk((key,), value, () if own_names else (str(key),))
    return tensors, plain


def _encode(value, path):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v, path) for v in value]}
    if isinstance(value, list):
        return [_encode(v, path) for v in value]
    if isinstance(value, Mapping):
        return {"__dict__": [[k, _encode(v, path)] for k, v in value.items()]}
    raise TypeError("state_dict%s is a %s: besides tensors a state dict may hold numbers, strings, "
                    "None, lists, tuples and dicts of them" % ("".join("[%r]" % p for p in path),
                                                               type(value).__name__))


def _decode(value):
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict):
        if "__tuple__" in value:
            return tuple(_decode(v) for v in value["__tuple__"])
        return {k: _decode(v) for k, v in value["__dict__"]}
    return value


def state_file(plain: List[Tuple[Tuple, Any]]) -> bytes:
    """STATE_FILE's bytes: the same on every rank that holds the same values."""
    values = [[list(path), _encode(value, path)] for path, value in plain]
    return json.dumps({"format": _FORMAT, "values": values}, allow_nan=True).encode()


def read_state(data: bytes, where: str) -> Dict[Tuple, Any]:
    """{path: value} of a STATE_FILE's bytes."""
    try:
        doc = json.loads(data)
        if doc.get("format") != _FORMAT:
            raise ValueError("format %r" % doc.get("format"))
        return {tuple(path): _decode(value) for path, value in doc["values"]}
    except (ValueError, TypeError, AttributeError, KeyError) as e:
        from ._errors import refusal

        raise refusal("bad_format", "%s is not a shardd state file (%s)" % (where, e)) from None


def dotted(path: Tuple) -> str:
    return ".".join(map(str, path))


def restore(state_dict, stored: Dict[Tuple, Any], paths) -> None:
    """Sets each of `paths` in the nested `state_dict` to its stored value, in place."""
    for path in paths:
        parent = state_dict
        for part in path[:-1]:
            parent = parent[part]
        parent[path[-1]] = stored[path]
