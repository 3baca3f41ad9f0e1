#!/usr/bin/env python3
# Checksum benchmark: what recording each shard file's CRC-32C costs a save (wall and daemon CPU, s/GiB), placed and staged, and what checking it costs a reader.
"""One command (numpy is enough; docs/benchmarks.md):

    python3 tests/bench/bench_checksum.py [--gib 1] [--rounds 3]

Two daemons on build/bench-checksum, one with checksums = on (the default),
one with checksums = off, take turns saving the same bytes from one process:

  placed   16 tensors of GIB/16 each: their bytes go to the disk straight
           from the arena (zero-copy), so the daemon reads them only to
           hash them, twice: before each piece's write and after it, so a
           rank changing its memory in between fails the save
  staged   GIB/32 KiB tensors of 32 KiB: below the zero-copy minimum, so
           every byte passes through the copy workers, which hash it there

For each: time to durable (the save waits for the commit, fsynced) and the
daemon's CPU (utime + stime from /proc) per GiB, min and median over the
rounds, with the page cache dropped first where the kernel allows. The
checksum's cost is on minus off. Then the readers: `shardctl verify --deep`
and `shardd.load(verify=True)` against plain `shardd.load`, cold and warm.
Every checkpoint saved with checksums is checked once against the CRC-32C of
its data sections computed here (crc32c package when present, else the
verify). No figure is asserted.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
sys.path.insert(0, os.path.join(ROOT, "client", "python", "tests"))
from bench_proc import drop_caches, proc_figures  # noqa: E402

GIB = 1 << 30


def tensors_of(case, nbytes):
    rng = np.random.default_rng(7)
    if case == "placed":
        n, each = 16, nbytes // 16
    else:
        each = 32 << 10
        n = nbytes // each
    block = rng.integers(0, 1 << 62, size=each // 8, dtype=np.int64).view(np.uint8)
    out = {}
    for i in range(n):
        a = block.copy()
        a[:8] = np.frombuffer(i.to_bytes(8, "little"), np.uint8)  # every tensor differs
        out["t.%06d" % i] = a
    return out


def data_crcs(folder):
    """Recorded and recomputed CRC-32C of every shard file (None when the crc32c package is absent)."""
    try:
        import crc32c
    except ImportError:
        return None
    names = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    index = [f for f in os.listdir(folder) if f.endswith(".index.json")]
    recorded = json.load(open(os.path.join(folder, index[0])))["metadata"].get("shardd_data_crc32c", {}) if index else {}
    out = {}
    for name in names:
        with open(os.path.join(folder, name), "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
            crc = 0
            while True:
                b = f.read(64 << 20)
                if not b:
                    break
                crc = crc32c.crc32c(b, crc)
        rec = recorded.get(name) or header.get("__metadata__", {}).get("shardd_data_crc32c")
        out[name] = (rec, "%08x" % crc)
    return out


def timed(fn, rounds, cold=True):
    times = []
    for _ in range(rounds):
        if cold:
            drop_caches()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "bench-checksum"))
    ap.add_argument("--cases", default="placed,staged", help="which saves: placed, staged or both")
    ap.add_argument("--no-read", action="store_true", help="skip the readers")
    a = ap.parse_args()
    os.environ.setdefault("SHARDD_BIN", os.path.join(ROOT, "build", "daemon", "shardd"))
    os.environ.setdefault("LIBSHARDD", os.path.join(ROOT, "build", "client", "libshardd.so"))
    shardctl = os.environ.get("SHARDCTL", os.path.join(ROOT, "build", "client", "shardctl"))
    import shardd
    from shardd_daemon import Daemon

    nbytes = int(a.gib * GIB) // (1 << 20) * (1 << 20)
    gib = nbytes / GIB
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    root = os.path.join(a.work, "root")
    print("bench_checksum: %.2f GiB, %d rounds, load average %s, page cache %s" % (
        gib, a.rounds, open("/proc/loadavg").read().split()[:3],
        "dropped before each" if drop_caches() else "not droppable (not root): warm"))
    daemons = {"on": Daemon(root=root, tmp=a.work, name="on"),
               "off": Daemon(root=root, tmp=a.work, name="off", args=["--checksums=off"])}
    rows, bad = [], 0
    try:
        for case in a.cases.split(","):
            ts = tensors_of(case, nbytes)
            figures = {}
            for rnd in range(a.rounds):
                for mode in (("on", "off") if rnd % 2 == 0 else ("off", "on")):  # neither always goes first
                    d = daemons[mode]
                    dest = "%s-%s" % (case, mode)
                    drop_caches()
                    c0, t0 = proc_figures(d.proc.pid)[0], time.perf_counter()
                    r = shardd.save(ts, dest, socket=d.socket, overwrite=True, max_shard_size="256MB")
                    wall, cpu = time.perf_counter() - t0, proc_figures(d.proc.pid)[0] - c0
                    figures.setdefault(mode, []).append((wall, cpu / gib, r))
                    if rnd == 0 and mode == "on":
                        crcs = data_crcs(os.path.join(root, dest))
                        if crcs is not None:
                            wrong = {k: v for k, v in crcs.items() if v[0] != v[1]}
                            bad += len(wrong)
                            print("%s: %d files, recorded checksums %s" % (
                                case, len(crcs), "all equal the data's CRC-32C" if not wrong else "WRONG: %s" % wrong))
            for mode in ("on", "off"):
                walls = [f[0] for f in figures[mode]]
                cpus = [f[1] for f in figures[mode]]
                rows.append((case, mode, min(walls), statistics.median(walls), min(cpus), statistics.median(cpus)))
            on, off = rows[-2], rows[-1]
            rows.append((case, "cost", (on[2] - off[2]) / gib, (on[3] - off[3]) / gib, on[4] - off[4], on[5] - off[5]))
        print("\nsave            wall s (min / median)   daemon CPU s/GiB (min / median)")
        for case, mode, w0, w1, c0, c1 in rows:
            if mode == "cost":
                print("%-6s cost     %+6.3f / %+6.3f s/GiB  %+6.3f / %+6.3f" % (case, w0, w1, c0, c1))
            else:
                print("%-6s %-4s     %6.3f / %6.3f        %6.3f / %6.3f" % (case, mode, w0, w1, c0, c1))

        if a.no_read or "placed" not in a.cases.split(","):
            return 1 if bad else 0
        folder = os.path.join(root, "placed-on")
        names = sorted(tensors_of("placed", 1 << 24))  # the names only
        has_deep = b"--deep" in subprocess.run([shardctl, "--help"], capture_output=True).stdout + \
            subprocess.run([shardctl, "--help"], capture_output=True).stderr
        print("\nread %.2f GiB        s (min / median)     GiB/s" % gib)
        ways = [("load", lambda: shardd.load(folder, names=names)),
                ("load verify=True", lambda: shardd.load(folder, names=names, verify=True))]
        if has_deep:
            ways.append(("shardctl verify --deep", lambda: subprocess.run([shardctl, "verify", "--deep", folder],
                                                                          check=True, capture_output=True)))
        for label, fn in ways:
            try:
                for cold in (True, False):
                    lo, med = timed(fn, a.rounds, cold)
                    print("%-24s %-5s %6.3f / %6.3f   %6.2f" % (label, "cold" if cold else "warm", lo, med, gib / lo))
            except TypeError as e:  # a binding without verify=
                print("%-24s not available here (%s)" % (label, e))
    finally:
        for d in daemons.values():
            d.stop()
        shutil.rmtree(a.work, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
