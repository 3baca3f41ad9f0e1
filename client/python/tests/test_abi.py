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


def main():
    return suite.run(__name__)


if __name__ == "__main__":
    sys.exit(main())
