#!/usr/bin/env python3
# GPU check: CUDA DTensors saved through shardd's pinned arena, its device-to-host GB/s beside torch's own pinned copy.
"""Run where a GPU is (one short run, for the device tool):

    SHARDD_BIN=... LIBSHARDD=... PYTHONPATH=client/python:client/python/tests \\
        python3 tests/bench/bench_cuda.py [--gib 2] [--repeat 5]

Copies the same CUDA bytes (bf16, --gib GiB) to the host five ways and
prints GB/s (best and median of --repeat): torch into pinned memory
(torch.empty(pin_memory=True)), torch into pageable memory, shardd's
copy_into a libshardd arena registered with cudaHostRegister
(Arena.pin, what save does for CUDA tensors), the same into an unregistered
arena, and then a whole shardd.torch.save_state_dict of a CUDA DTensor
(Shard(0) on a one-rank mesh) with wait=False: its blocked time, its time to
durable, and the bytes read back and compared. Needs a running daemon only
for the last two ways; without one (or without io_uring) they are skipped
with the reason.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

import shardd
import shardd.torch as st
from shardd._tensors import copy_into


def rate(nbytes, seconds):
    return nbytes / seconds / 1e9


def timed(fn, repeat):
    out = []
    for _ in range(repeat):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return out


def report(name, nbytes, times):
    rates = [rate(nbytes, t) for t in times]
    print("%-34s %7.1f GB/s best %7.1f median  (%.4f s best)" % (name, max(rates), statistics.median(rates),
                                                                  min(times)), flush=True)
    return max(rates)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_cuda: no CUDA device: nothing to measure")
        return 0
    print("bench_cuda: %s, torch %s, CUDA %s" % (torch.cuda.get_device_name(0), torch.__version__,
                                                  torch.version.cuda), flush=True)
    n = int(a.gib * 2**30) // 2
    nbytes = n * 2
    src = torch.randn(n, device="cuda", dtype=torch.float32).to(torch.bfloat16)
    pinned = torch.empty(n, dtype=torch.bfloat16, pin_memory=True)
    pageable = torch.empty(n, dtype=torch.bfloat16)
    pageable.fill_(0)
    ref = report("torch -> pinned", nbytes, timed(lambda: pinned.copy_(src), a.repeat))
    report("torch -> pageable", nbytes, timed(lambda: pageable.copy_(src), a.repeat))

    tmp = tempfile.mkdtemp(prefix="shardd-cuda-")
    sock = os.path.join(tmp, "shardd.sock")
    daemon = None
    try:
        import subprocess

        daemon = subprocess.Popen([os.environ["SHARDD_BIN"], "--root", os.path.join(tmp, "root"), "--socket", sock],
                                  stdout=open(os.path.join(tmp, "log"), "w"), stderr=subprocess.STDOUT)
        for _ in range(200):
            if os.path.exists(sock) or daemon.poll() is not None:
                break
            time.sleep(0.05)
        if not os.path.exists(sock):
            print("bench_cuda: the daemon did not start: %s" % open(os.path.join(tmp, "log")).read()[-2000:])
            return 0
        client = shardd.Client(sock)
        arena = client.arena(nbytes)
        arena.array[::4096] = 0  # fault every page in first, as a reused arena is
        plain = report("shardd arena, not registered", nbytes,
                       timed(lambda: copy_into(arena.buffer, 0, src), a.repeat))
        arena.pin()
        print("arena registered with cudaHostRegister: %s" % arena.pinned, flush=True)
        got = report("shardd arena, cudaHostRegister", nbytes,
                     timed(lambda: copy_into(arena.buffer, 0, src), a.repeat))
        print("registered arena: %.2f x torch's pinned copy, %.2f x the unregistered arena" % (got / ref, got / plain))

        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1")
        dist.init_process_group("gloo")
        dt = distribute_tensor(src.view(-1, 4096), init_device_mesh("cuda", (1,)), [Shard(0)])
        for i in range(3):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            pending = st.save_state_dict({"w": dt}, "cuda/step-%d" % i, client=client, arena=arena, wait=False)
            blocked = time.perf_counter() - t0
            result = pending.wait()
            durable = time.perf_counter() - t0
            print("save_state_dict(CUDA DTensor, wait=False) #%d: blocked %.3f s (%.1f GB/s), durable %.3f s, %d bytes"
                  % (i, blocked, rate(nbytes, blocked), durable, result["bytes"]), flush=True)
        back = shardd.load(result["dir"], framework="torch")["w"]
        print("read back equal: %s" % torch.equal(back.view(torch.int16), src.view(-1, 4096).cpu().view(torch.int16)))
    finally:
        if daemon is not None and daemon.poll() is None:
            daemon.terminate()
            daemon.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
