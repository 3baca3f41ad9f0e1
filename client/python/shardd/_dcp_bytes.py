# DCP's non-tensor items (its bytes items: steps, schedulers, RNG states) as files beside the shards, one per rank that holds some, in the same save.
"""DCP turns every value of a state dict that is not a tensor into a bytes
item (torch.save of the value) and gives each to one rank. shardd writes
each rank's items into BYTES_FILE % rank, a JSON map of fqn to base64, as a
`file` of the same save, so they commit atomically with the tensors; the
reader serves them back to DCP's planner by name."""
from __future__ import annotations

import base64
import json
import os
import re
from typing import Dict

__all__ = ["BYTES_FILE", "bytes_file", "read_bytes_files"]

BYTES_FILE = "shardd_dcp_bytes.rank-%05d.json"
_NAME = re.compile(r"shardd_dcp_bytes\.rank-\d{5,}\.json\Z")
_FORMAT = "shardd-dcp-bytes-1"


def bytes_file(items: Dict[str, bytes]) -> bytes:
    return json.dumps({"format": _FORMAT,
                       "items": {fqn: base64.b64encode(b).decode() for fqn, b in items.items()}}).encode()


def read_bytes_files(folder: str) -> Dict[str, bytes]:
    """{fqn: bytes} of every rank's file in `folder` (none: {})."""
    from ._errors import refusal

    out: Dict[str, bytes] = {}
    names = sorted(n for n in os.listdir(folder) if _NAME.match(n)) if os.path.isdir(folder) else []
    for name in names:
        path = os.path.join(folder, name)
        try:
            with open(path, "rb") as f:
                doc = json.loads(f.read())
            if doc.get("format") != _FORMAT:
                raise ValueError("format %r" % doc.get("format"))
            for fqn, text in doc["items"].items():
                if fqn in out:
                    raise ValueError("%r is also in another rank's file" % fqn)
                out[fqn] = base64.b64decode(text, validate=True)
        except (ValueError, TypeError, AttributeError, KeyError) as e:
            raise refusal("bad_format", "%s is not a shardd DCP bytes file (%s)" % (path, e)) from None
    return out
