# DCP's non-tensor items (its bytes items: steps, schedulers, RNG states) in one file beside the shards, each rank's part of it joined by the daemon in the same save.
"""DCP turns every value of a state dict that is not a tensor into a bytes
item (torch.save of the value) and gives each to one rank. Each rank that
holds some sends them as its part of BYTES_FILE (one JSON line, fqn to
base64); the daemon joins every rank's part in rank order into that one
file of the same save, so they commit atomically with the tensors. The
reader serves them back to DCP's planner by name, and still reads the
one-file-per-rank form (OLD_NAME) of checkpoints written before."""
from __future__ import annotations

import base64
import json
import os
import re
from typing import Dict

__all__ = ["BYTES_FILE", "bytes_part", "read_bytes_files"]

BYTES_FILE = "shardd_dcp_bytes.jsonl"
_OLD_NAME = re.compile(r"shardd_dcp_bytes\.rank-\d{5,}\.json\Z")
_FORMAT = "shardd-dcp-bytes-1"


def bytes_part(items: Dict[str, bytes]) -> bytes:
    """This rank's line of BYTES_FILE."""
    return json.dumps({"format": _FORMAT,
                       "items": {fqn: base64.b64encode(b).decode() for fqn, b in items.items()}}).encode() + b"\n"


def read_bytes_files(folder: str) -> Dict[str, bytes]:
    """{fqn: bytes} of every rank's part in `folder` (none: {})."""
    from ._errors import refusal

    out: Dict[str, bytes] = {}
    names = (sorted(n for n in os.listdir(folder) if n == BYTES_FILE or _OLD_NAME.match(n))
             if os.path.isdir(folder) else [])
    for name in names:
        path = os.path.join(folder, name)
        try:
            with open(path, "rb") as f:
                lines = f.read().splitlines()
            for line in lines:
                doc = json.loads(line)
                if doc.get("format") != _FORMAT:
                    raise ValueError("format %r" % doc.get("format"))
                for fqn, text in doc["items"].items():
                    if fqn in out:
                        raise ValueError("%r is also in another rank's part" % fqn)
                    out[fqn] = base64.b64decode(text, validate=True)
        except (ValueError, TypeError, AttributeError, KeyError) as e:
            raise refusal("bad_format", "%s is not a shardd DCP bytes file (%s)" % (path, e)) from None
    return out
