# Real gloo worlds for the torch tests: N rank processes with torchrun's environment, their answers as JSON.
"""run_world(script, world, args) starts `world` processes of
`script --worker JSON` with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set as torchrun sets them on one node, waits for
all, and returns each rank's last stdout line parsed as JSON (rank order).
A rank that fails raises AssertionError with its stderr, and the others are
stopped rather than left waiting for it.

The ranks meet through a file (gloo's FileStore, $SHARDD_TEST_STORE), not
a TCP port: a port picked free here can be taken by another test's
connection before rank 0 binds it, and then every other rank waits for a
store that never comes.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist

WAIT = 120
# How long the other ranks may go on once one has failed.
GRACE = 15


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_world(script, world, args, env=None):
    port = free_port()
    scratch = tempfile.mkdtemp(prefix="shardd-world-")
    procs = []
    for rank in range(world):
        full = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                    LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                    SHARDD_TEST_STORE=os.path.join(scratch, "store"),
                    **{k: str(v) for k, v in (env or {}).items()})
        out = open(os.path.join(scratch, "%d.out" % rank), "w+b")
        err = open(os.path.join(scratch, "%d.err" % rank), "w+b")
        p = subprocess.Popen([sys.executable, script, "--worker", json.dumps(args)], env=full, stdout=out,
                             stderr=err)
        p.files, p.scratch = (out, err), scratch
        procs.append(p)
    return procs


def finish_world(procs, timeout=4 * WAIT, fail_fast=False):
    """[(returncode, parsed last line or None, stderr)] of every rank. fail_fast: once a rank
    exits non-zero, the others get GRACE seconds, then are killed."""
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        failed = fail_fast and any(p.returncode not in (None, 0) for p in procs)
        if now > deadline or failed:
            if failed:
                deadline = min(deadline, now + GRACE)
            if now > deadline:
                for q in procs:
                    if q.poll() is None:
                        q.kill()
                if not failed:
                    raise AssertionError("a rank hung past %s s" % timeout)
                break
        time.sleep(0.05)
    out = []
    for p in procs:
        p.wait()
        so, se = (f.seek(0) or f.read() for f in p.files)
        for f in p.files:
            f.close()
        lines = so.decode().strip().splitlines()
        out.append((p.returncode, json.loads(lines[-1]) if lines and p.returncode == 0 else None,
                    se.decode()))
    shutil.rmtree(procs[0].scratch, ignore_errors=True)
    return out


def run_world(script, world, args, env=None, timeout=4 * WAIT):
    results = finish_world(start_world(script, world, args, env), timeout, fail_fast=True)
    # The first rank that failed by itself, not one stopped because of it.
    failed = [(rank, rc, err) for rank, (rc, _, err) in enumerate(results) if rc != 0]
    if failed:
        rank, rc, err = next((f for f in failed if f[1] != -9), failed[0])
        raise AssertionError("rank %d exited %d:\n%s" % (rank, rc, err[-6000:]))
    return [r[1] for r in results]


def init():
    """In a worker: the gloo group of torchrun's environment (met through $SHARDD_TEST_STORE when
    set), one thread per rank (two cores)."""
    torch.set_num_threads(1)
    store = os.environ.get("SHARDD_TEST_STORE")
    if store:
        dist.init_process_group("gloo", init_method="file://" + store, rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]))
    else:
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def seeded(shape, dtype, seed):
    """The same tensor on every rank: random bits of any dtype, from a seed."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-100, 100, shape, generator=g).to(dtype)


def raw(t):
    """The row-major bytes of a tensor, as safetensors stores them."""
    t = t.detach().cpu().contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def answer(result, barrier=True):
    """A worker's last words: its JSON line, a barrier (so that no rank, rank 0's store least of
    all, goes while the others still talk; barrier=False where a peer was killed), then an exit
    that runs no destructors: gloo's worker threads can abort the interpreter's teardown
    ("terminate called without an active exception"), which would turn a passed rank into a
    failed one at random."""
    print(json.dumps(result), flush=True)
    if dist.is_initialized() and barrier:
        dist.barrier()
    sys.stderr.flush()
    os._exit(0)
