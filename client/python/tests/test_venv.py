#!/usr/bin/env python3
# `pip install ./client/python` into a fresh venv, offline; the installed package saves to a real daemon and loads back.
"""Exits 77 (skipped) when python3-venv is missing. Environment as test_binding.py.

The package is installed from a copy of client/python (the build writes
into its source folder), with $LIBSHARDD set at install only: the venv's
python then finds libshardd through the path pip recorded.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_binding import WAIT, Daemon, read_checkpoint  # noqa: E402  (exits 77 without numpy)

import numpy as np  # noqa: E402

PACKAGE = os.path.dirname(HERE)

# Runs inside the venv: no PYTHONPATH, no LIBSHARDD.
CHILD = r"""
import json, os, pathlib, sys
import numpy as np
import shardd
root = pathlib.Path(sys.argv[1])
w = np.arange(12, dtype=np.float32).reshape(3, 4)
res = shardd.save({"w": w, "b": np.array([1, 2], np.int64)}, pathlib.Path("venv/step-1"),
                  max_shard_size="5GB", timeout=30)
back = shardd.load(root / "venv" / "step-1", boxes={"w": ((1, 0), (2, 4))})
print(json.dumps({"module": shardd.__file__, "library": shardd.library_path(), "files": res["files"],
                  "w": back["w"].tolist(), "b": back["b"].tolist()}))
"""


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def run(cmd, env, cwd):
    p = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        fail("%s exited %d:\n%s%s" % (" ".join(cmd), p.returncode, p.stdout, p.stderr))
    return p.stdout


def main():
    python = sys.executable
    if subprocess.run([python, "-c", "import ensurepip, venv"], capture_output=True).returncode != 0:
        print("python3-venv is not installed (Debian: apt-get install python3-venv): skipping")
        return 77
    tmp = tempfile.mkdtemp(prefix="shardd-venv-")
    daemon = None
    try:
        src = os.path.join(tmp, "src")
        shutil.copytree(PACKAGE, src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
        venv = os.path.join(tmp, "venv")
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LIBSHARDD")}
        # numpy (and torch) come from Debian's packages, not from an index.
        run([python, "-m", "venv", "--system-site-packages", venv], env, tmp)
        vpy = os.path.join(venv, "bin", "python")
        run([vpy, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--no-cache-dir",
             "--disable-pip-version-check", src], dict(env, LIBSHARDD=os.environ["LIBSHARDD"]), tmp)

        daemon = Daemon()
        out = run([vpy, "-c", CHILD, daemon.root], dict(env, SHARDD_SOCKET=daemon.socket), tmp)
        got = json.loads(out.strip().splitlines()[-1])
        if not got["module"].startswith(venv + os.sep):
            fail("imported %s, not the venv's copy" % got["module"])
        if os.path.realpath(got["library"]) != os.path.realpath(os.environ["LIBSHARDD"]):
            fail("loaded %s, not the libshardd recorded at install" % got["library"])
        if got["w"] != [[4, 5, 6, 7], [8, 9, 10, 11]] or got["b"] != [1, 2] or got["files"] != 1:
            fail("unexpected result %r" % got)
        # The bytes on disk, through the tests' own reader.
        arrays = read_checkpoint(os.path.join(daemon.root, "venv", "step-1"))[0]
        if arrays["w"].tobytes() != np.arange(12, dtype=np.float32).tobytes():
            fail("w on disk differs")
        print("venv install, save and load: ok (%s)" % got["module"])
        print("1 passed, 0 failed")
        return 0
    finally:
        if daemon is not None:
            rc = daemon.stop()
            if rc != 0:
                print("FAIL: shardd exited %d:\n%s" % (rc, daemon.final_log))
                sys.exit(1)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
