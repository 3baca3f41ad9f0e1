#!/usr/bin/env python3
# Tensor-count benchmark: many small tensors from one process, shardd against safetensors' save_file, and the cost per tensor.
"""One command (the venv's python: it needs numpy and safetensors; README, "Benchmarks"):

    .venv/bin/python tests/bench/bench_tensors.py [--tensors 50000] [--counts 1000,10000,100000] [--rounds 2]

A daemon on build/bench-tensors/root, and this one process as its only rank.

  many     TENSORS F32 tensors of 2-64 KiB (sizes log-uniform, seeded): shardd.save waiting for the
           commit (fsynced), against safetensors.numpy.save_file of the same dict plus an fsync of
           the file and its folder; min and median over the rounds, and their ratio. shardd.save
           is called as a trainer calls it (socket= only), so from its second save on it reuses
           this process's pooled arena; its first save, which makes that arena, is shown apart
  count    for each of COUNTS, that many tensors of 64 bytes, so that the bytes cost nothing: the
           library's CPU per tensor (this process, from save() until it returns: Python, libshardd,
           the copies), the daemon's CPU per tensor (/proc, over the same span: requests,
           checks, planning, headers, writing) and the wall time per tensor

The MoE checkpoints shardd is for hold tens of thousands of tensors (DeepSeek-V3: 44,544 expert
matrices), so these costs are the ones that grow with the model. Round 0 of `many` is read back
with safetensors and compared tensor by tensor. No figure is asserted.
"""
import argparse
import os
import shutil
import statistics
import sys
import time

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
sys.path.insert(0, os.path.join(ROOT, "client", "python", "tests"))
from bench_proc import proc_figures  # noqa: E402


def cpu_seconds(pid):
    """({thread: CPU seconds, to the nanosecond}, CPU seconds of the whole process to /proc's 10 ms tick)."""
    live, tasks = {}, "/proc/%d/task" % pid
    try:
        for tid in os.listdir(tasks):
            with open(os.path.join(tasks, tid, "schedstat")) as f:
                live[tid] = int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        live = None
    return live, proc_figures(pid)[0]


def cpu_delta(before, after):
    """CPU seconds between two cpu_seconds: from the threads' own clocks while none of them exited
    (fine enough for a save of 1,000 small tensors), else from the process's coarse ticks."""
    if before[0] is not None and after[0] is not None and set(before[0]) <= set(after[0]):
        return sum(t - before[0].get(tid, 0.0) for tid, t in after[0].items())
    return after[1] - before[1]


def many_tensors(n, lo_kib, hi_kib):
    rng = np.random.default_rng(29)
    kib = np.exp(rng.uniform(np.log(lo_kib), np.log(hi_kib), size=n))
    numels = (kib * 1024 / 4).astype(np.int64)
    pool = rng.standard_normal(int(numels.max()) + n, dtype=np.float32)
    # Every tensor its own array (as a state dict's are), each starting elsewhere in the pool.
    return {"model.layers.%d.mlp.experts.%d.w.weight" % (i // 256, i % 256): pool[i:i + int(k)].copy()
            for i, k in enumerate(numels)}


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def safetensors_save(tensors, folder):
    from safetensors.numpy import save_file

    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "model.safetensors")
    save_file(tensors, path)
    fsync_path(path)
    fsync_path(folder)


def check_equal(tensors, folder):
    """Number of tensors read back from folder's shards that differ from `tensors` (missing ones count)."""
    from safetensors.numpy import load_file

    got = {}
    for f in sorted(os.listdir(folder)):
        if f.endswith(".safetensors"):
            got.update(load_file(os.path.join(folder, f)))
    return sum(1 for k, v in tensors.items() if k not in got or not np.array_equal(got[k], v)) + \
        len(set(got) - set(tensors))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tensors", type=int, default=50000)
    ap.add_argument("--min-kib", type=float, default=2)
    ap.add_argument("--max-kib", type=float, default=64)
    ap.add_argument("--counts", default="1000,10000,100000")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "bench-tensors"))
    a = ap.parse_args()
    os.environ.setdefault("SHARDD_BIN", os.path.join(ROOT, "build", "daemon", "shardd"))
    os.environ.setdefault("LIBSHARDD", os.path.join(ROOT, "build", "client", "libshardd.so"))
    import shardd
    from shardd_daemon import Daemon

    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    root = os.path.join(a.work, "root")
    d = Daemon(root=root, tmp=a.work, name="tensors")
    bad = 0
    try:
        tensors = many_tensors(a.tensors, a.min_kib, a.max_kib)
        total = sum(v.nbytes for v in tensors.values())
        print("bench_tensors: %d tensors of %g-%g KiB (%.1f MiB), %d rounds, load average %s" % (
            len(tensors), a.min_kib, a.max_kib, total / 2**20, a.rounds, open("/proc/loadavg").read().split()[:3]))
        t0 = time.perf_counter()
        shardd.save(tensors, "many-first", socket=d.socket)
        first = time.perf_counter() - t0
        shutil.rmtree(os.path.join(root, "many-first"))
        times = {"shardd": [], "safetensors": []}
        for rnd in range(a.rounds):
            for way in (("shardd", "safetensors") if rnd % 2 == 0 else ("safetensors", "shardd")):
                dest = "many-%s-%d" % (way, rnd)
                t0 = time.perf_counter()
                if way == "shardd":
                    shardd.save(tensors, dest, socket=d.socket)
                else:
                    safetensors_save(tensors, os.path.join(root, dest))
                times[way].append(time.perf_counter() - t0)
                if rnd == 0:
                    wrong = check_equal(tensors, os.path.join(root, dest))
                    bad += wrong
                    if wrong:
                        print("%s: %d tensors read back WRONG" % (way, wrong))
                shutil.rmtree(os.path.join(root, dest))
        s, f = times["shardd"], times["safetensors"]
        print("\nmany: time to durable, s    min     median")
        print("  shardd.save, first       %6.3f          (makes its arena)" % first)
        print("  shardd.save              %6.3f  %6.3f" % (min(s), statistics.median(s)))
        print("  safetensors + fsync      %6.3f  %6.3f" % (min(f), statistics.median(f)))
        print("  shardd / safetensors     %6.2fx %6.2fx" % (min(s) / min(f), statistics.median(s) / statistics.median(f)))
        del tensors

        print("\ncount: per tensor, us      library CPU  daemon CPU   wall")
        for n in (int(x) for x in a.counts.split(",") if x):
            small = {"model.layers.%d.mlp.experts.%d.w.weight" % (i // 256, i % 256): np.full(16, i, np.float32)
                     for i in range(n)}
            dest = "count-%d" % n
            c0, d0, t0 = time.process_time(), cpu_seconds(d.proc.pid), time.perf_counter()
            shardd.save(small, dest, socket=d.socket)
            wall, lib, dcpu = time.perf_counter() - t0, time.process_time() - c0, cpu_delta(d0, cpu_seconds(d.proc.pid))
            print("  %7d tensors          %8.1f    %8.1f   %8.1f" % (n, lib / n * 1e6, dcpu / n * 1e6, wall / n * 1e6))
            shutil.rmtree(os.path.join(root, dest))
        getattr(shardd, "release_arenas", lambda: None)()  # (absent before the arena pool)
    finally:
        d.stop()
        shutil.rmtree(a.work, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
