# Real gloo worlds for the torch tests: N rank processes with torchrun's environment, their answers as JSON.
"""run_world(script, world, args) starts `world` processes of
`script --worker JSON` with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set as torchrun sets them on one node, waits for
all, and returns each rank's last stdout line parsed as JSON (rank order).
A rank that fails raises AssertionError with its stderr.
"""
import json
import os
import socket
import subprocess
import sys

import torch
import torch.distributed as dist

WAIT = 120


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_world(script, world, args, env=None):
    port = free_port()
    procs = []
    for rank in range(world):
        full = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                    LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                    **{k: str(v) for k, v in (env or {}).items()})
        procs.append(subprocess.Popen([sys.executable, script, "--worker", json.dumps(args)], env=full,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    return procs


def finish_world(procs, timeout=4 * WAIT, expect_rc=None):
    """[(returncode, parsed last line or None, stderr)] of every rank."""
    out = []
    for p in procs:
        try:
            so, se = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError("a rank hung past %s s" % timeout)
        lines = so.decode().strip().splitlines()
        out.append((p.returncode, json.loads(lines[-1]) if lines else None, se.decode()))
    return out


def run_world(script, world, args, env=None, timeout=4 * WAIT):
    results = finish_world(start_world(script, world, args, env), timeout)
    for rank, (rc, _, err) in enumerate(results):
        if rc != 0:
            raise AssertionError("rank %d exited %d:\n%s" % (rank, rc, err[-6000:]))
    return [r[1] for r in results]


def init():
    """In a worker: the gloo group of torchrun's environment, one thread per rank (two cores)."""
    torch.set_num_threads(1)
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
