#!/usr/bin/env python3
# What save(wait=False) blocks a trainer for, by default, against a memcpy of the same bytes: the first save and the ones after.
"""One command (the venv's python; docs/benchmarks.md):

    .venv/bin/python tests/bench/bench_async.py [--ranks 4] [--mib 166] [--saves 4] [--pause 1]

A daemon on build/bench-async/root and --ranks processes, each holding --mib
MiB of bf16 rows of the same global tensors (a rank's part of an FSDP-style
state dict). Each rank first times a memcpy of its bytes into buffers it
already holds (`memcpy`) and into fresh ones (`clone`, page faults
included). Then every rank makes --saves saves with
shardd.torch.save_state_dict(..., wait=False) exactly as a user writes it
(no client=, no arena=: the default path), waits for each to commit and
pauses --pause seconds (training) before the next; its blocked time is the
call itself. `fresh` is the same with a new connection and arena per save
(client= given, no arena=), which is what the default path did before the
library kept its arenas. Prints, per save, the slowest rank's blocked
seconds and the ratio to the slowest rank's memcpy. No figure is asserted.
"""
import argparse
import multiprocessing as mp
import os
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
sys.path.insert(0, os.path.join(ROOT, "client", "python", "tests"))

ROWS = 1024  # per rank per tensor; the columns make up the size


def rank_main(rank, a, socket, barrier, out):
    import torch

    import shardd
    import shardd.torch as st

    torch.set_num_threads(1)
    os.environ["SHARDD_SOCKET"] = socket
    cols = 4096
    per_tensor = ROWS * cols * 2
    n = max(1, a.mib * 2**20 // per_tensor)
    g = torch.Generator().manual_seed(rank)
    local = {"layers.%d.w" % i: torch.rand(ROWS, cols, generator=g).to(torch.bfloat16) for i in range(n)}
    shape = (ROWS * a.ranks, cols)
    sd = {k: (v, shape, (rank * ROWS, 0)) for k, v in local.items()}

    dst = [torch.empty_like(v) for v in local.values()]
    for d, s in zip(dst, local.values()):  # touch the destination once, as a kept buffer is
        d.copy_(s)
    barrier.wait()
    t0 = time.perf_counter()
    for d, s in zip(dst, local.values()):
        d.copy_(s)
    memcpy = time.perf_counter() - t0
    del dst
    barrier.wait()
    t0 = time.perf_counter()
    clones = [v.clone() for v in local.values()]
    clone = time.perf_counter() - t0
    del clones

    figures = {"memcpy": memcpy, "clone": clone, "bytes": n * per_tensor}
    for way in ("default", "fresh"):
        blocked = []
        for i in range(a.saves):
            barrier.wait()
            t0 = time.perf_counter()
            extra = {"client": shardd.Client(socket)} if way == "fresh" else {}
            p = st.save_state_dict(sd, "bench/%s-%d" % (way, i), rank=rank, world_size=a.ranks, wait=False,
                                   overwrite=True, **extra)
            blocked.append(time.perf_counter() - t0)
            p.wait()
            if "client" in extra:
                extra["client"].close()
            time.sleep(a.pause)
        figures[way] = blocked
    out.put((rank, figures))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--mib", type=int, default=166, help="bytes per rank, in MiB")
    ap.add_argument("--saves", type=int, default=4)
    ap.add_argument("--pause", type=float, default=1.0, help="seconds of 'training' between saves")
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "bench-async"))
    a = ap.parse_args()
    os.environ.setdefault("SHARDD_BIN", os.path.join(ROOT, "build", "daemon", "shardd"))
    os.environ.setdefault("LIBSHARDD", os.path.join(ROOT, "build", "client", "libshardd.so"))
    from shardd_daemon import Daemon

    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    d = Daemon(root=os.path.join(a.work, "root"))
    try:
        ctx = mp.get_context("spawn")
        barrier, out = ctx.Barrier(a.ranks), ctx.Queue()
        procs = [ctx.Process(target=rank_main, args=(r, a, d.socket, barrier, out)) for r in range(a.ranks)]
        for p in procs:
            p.start()
        figures = dict(out.get(timeout=600) for _ in procs)
        for p in procs:
            p.join()
    finally:
        d.stop()
    ranks = [figures[r] for r in range(a.ranks)]
    memcpy = max(f["memcpy"] for f in ranks)
    clone = max(f["clone"] for f in ranks)
    print("%d ranks x %.0f MiB: memcpy %.3f s, clone %.3f s (slowest rank)"
          % (a.ranks, ranks[0]["bytes"] / 2**20, memcpy, clone))
    for way in ("default", "fresh"):
        for i in range(a.saves):
            b = max(f[way][i] for f in ranks)
            print("  %-8s save %d: blocked %.3f s = %.2f x memcpy, %.2f x clone" % (way, i + 1, b, b / memcpy,
                                                                                 b / clone))


if __name__ == "__main__":
    main()
