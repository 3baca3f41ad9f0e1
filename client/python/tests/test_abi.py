#!/usr/bin/env python3
# The binding's copies of C facts (struct layouts, dtypes, the save-id rule) checked against C itself.
"""The Python binding re-declares what include/shardd/shardd.h and proto
define: the ctypes structs of _lib.py, the dtype table of _tensors.py and
_load.py, and the save-id rule default_save_id follows. A small C program
built in the suite (tests/unit/abi_facts.c, $ABI_FACTS) prints the C side;
this test fails the moment the two differ. Needs only numpy.
"""
import ctypes
import json
import os
import subprocess
import sys
import unittest

import suite
from shardd import _lib, _load, _save, _tensors

# Hard cases for the id rule; no quote, backslash or control character, which the C side prints raw.
IDS = ["step-1", "run:a@b+c=d", "a.b_c", ".hidden", "", "x" * 128, "x" * 129, "has space", "slash/inside",
       "semi;colon", "é", "ok-0.1", "-", "=", "a:b:c"]


def facts():
    exe = os.environ.get("ABI_FACTS")
    if not exe:
        raise SystemExit("ABI_FACTS is not set")
    return json.loads(subprocess.run([exe] + IDS, check=True, capture_output=True, text=True).stdout)


class Layouts(unittest.TestCase):
    C = None

    @classmethod
    def setUpClass(cls):
        cls.C = facts()

    def test_structs(self):
        for cls, cname in ((_lib.SaveOpts, "shardd_save_opts"), (_lib.TensorDesc, "shardd_tensor_desc"),
                           (_lib.Result, "shardd_result"), (_lib.TensorInfo, "shardd_tensor_info")):
            c = self.C["structs"][cname]
            self.assertEqual(ctypes.sizeof(cls), c["sizeof"], cname)
            self.assertEqual([f[0] for f in cls._fields_], list(c["fields"]), cname + ": field names or order")
            for name, (offset, size) in c["fields"].items():
                field = getattr(cls, name)
                self.assertEqual((field.offset, field.size), (offset, size), "%s.%s" % (cname, name))

    def test_dtypes(self):
        sizes = self.C["dtypes"]
        self.assertEqual(set(_tensors.DTYPES), set(sizes))
        for (kind, size), name in _tensors._NUMPY.items():
            self.assertEqual(sizes[name], size, name)
        import numpy as np

        for name, typestr in _load._NUMPY.items():
            self.assertEqual(np.dtype(typestr).itemsize, sizes[name], name)
        for torch_name, name in _tensors._TORCH.items():
            self.assertIn(name, sizes, torch_name)

    def test_save_id_rule(self):
        for sid, ok in self.C["save_ids"].items():
            py = bool(_save._SAVE_ID_OK.match(sid)) and not sid.startswith(".") and len(sid) <= 128
            self.assertEqual(py, ok, repr(sid))
            if ok and ":" not in sid:
                # A dir that is itself an id the daemon takes keeps it as its default id (':' stands
                # for '/' in ids made from dirs, so a dir holding one is hashed instead).
                self.assertEqual(_save.default_save_id(sid), sid)


class TorchrunEnvironment(unittest.TestCase):
    """Python's torchrun_env reads the one-node topology itself; libshardd's
    shardd_save_opts_from_env (nodes_from_env) reads the same variables in C."""

    CASES = [
        {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "0", "MASTER_ADDR": "10.0.0.1"},
        {"RANK": "5", "WORLD_SIZE": "6", "GROUP_WORLD_SIZE": "3", "GROUP_RANK": "2", "MASTER_ADDR": "h0"},
        {"RANK": "1", "WORLD_SIZE": "4", "NNODES": "2", "NODE_RANK": "0", "GROUP_WORLD_SIZE": "4",
         "GROUP_RANK": "3", "SHARDD_LEADER": "h0:9000"},
        {"RANK": "0", "WORLD_SIZE": "1"},
    ]
    KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NNODES", "NODE_RANK", "GROUP_RANK",
            "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SHARDD_LEADER", "SHARDD_PEER_PORT")

    def test_same_topology(self):
        probe = ("import json, shardd; c = shardd.nodes_from_env(); p = shardd.torchrun_env(); "
                 "print(json.dumps([c, p]))")
        for case in self.CASES:
            env = {k: v for k, v in os.environ.items() if k not in self.KEYS}
            env.update(case)
            out = subprocess.run([sys.executable, "-c", probe], env=env, check=True, capture_output=True,
                                 text=True).stdout
            c, p = json.loads(out)
            for key in ("rank", "world_size", "nnodes", "node_rank"):
                self.assertEqual(p[key] if p[key] is not None else (1 if key == "nnodes" else 0), c[key],
                                 "%s under %s" % (key, case))


def main():
    return suite.run(__name__)


if __name__ == "__main__":
    sys.exit(main())
