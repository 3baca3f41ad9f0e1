#!/usr/bin/env python3
# The MoE load alone: shardd.torch.load_state_dict of a per-expert checkpoint into 4 EP ranks, beside safetensors and fio reads.
"""One command (the venv's python):

    .venv/bin/python tests/bench/bench_moe_load.py [--layout dsv3_ep4] [--rounds 3] [--phases] [--profile 20]

A daemon and 4 gloo ranks holding bench_moe.py's model in the layout asked
(qwen3moe_ep4, qwen3moe_fsdp4, dsv3_ep4). The model is saved once with
shardd.torch.save_pretrained (one tensor per expert and projection); then
each round, with the page cache dropped before each way where the kernel
allows it:

  fio-read      fio O_DIRECT reads of as many bytes, 4 jobs (the disk)
  safetensors   safetensors' load_file of every shard on rank 0, the others waiting
  shardd-load   shardd.torch.load_state_dict into a fresh model of the same layout, every rank
                reading its own experts' boxes; checked equal to the saved model

Printed: each way's loaded seconds (the slowest rank) and the CPU seconds of
rank 0 and of all ranks (CPU is the figure to compare on a shared machine),
min and median over the rounds, with ratios. --phases: rank 0's CPU seconds in
each step of load_state_dict, in its cheapest round. --profile N: rank 0's last load
under cProfile (timed in CPU seconds), its N costliest functions by own and
by cumulative time. No figure is asserted.
"""
import argparse
import collections
import cProfile
import functools
import io
import json
import os
import pstats
import shutil
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
sys.path.insert(0, os.path.join(ROOT, "client", "python", "tests"))

WAYS = ("fio-read", "safetensors", "shardd-load")


def phase_timers():
    """{phase: CPU seconds} of load_state_dict's steps, filled by wrapping them in place (none
    calls another), and "load_state_dict" for the whole."""
    import shardd._load as L
    import shardd._load_runs as R
    import shardd._torch_load as T

    cpu = collections.defaultdict(float)

    def wrap(owner, name, label):
        f = getattr(owner, name)

        @functools.wraps(f)
        def timed(*a, **k):
            t = time.process_time()
            try:
                return f(*a, **k)
            finally:
                cpu[label] += time.process_time() - t

        setattr(owner, name, timed)

    wrap(L.Checkpoint, "__init__", "Checkpoint open (libshardd's strict check)")
    wrap(L.Checkpoint, "tensors", "Checkpoint.tensors (the table)")
    for owner, name in [(T, "converted"), (T, "_groups"), (T, "piece_tables"), (T, "_misfits"), (T, "_fills"),
                        (R, "_open_proven"), (R, "_header"), (R, "_plan"), (R, "_read_direct"), (R, "_read_staged")]:
        wrap(owner, name, name)
    wrap(T, "load_state_dict", "load_state_dict")
    import shardd.torch as st
    st.load_state_dict = T.load_state_dict
    return cpu


def load_way(way, ctx):
    """(wall seconds, this process's CPU seconds, equal) of one way on this rank."""
    import torch
    import torch.distributed as dist

    import bench_torch
    import shardd.torch as st

    rank, path = ctx["rank"], ctx["path"]
    t0, c0 = time.perf_counter(), time.process_time()
    equal = True
    if way == "fio-read":
        if rank == 0:
            bench_torch.fio(ctx["args"], "read", ctx["total"], ctx["fio_dir"])
    elif way == "safetensors":
        if rank == 0:
            from safetensors.torch import load_file

            full = {}
            for f in sorted(os.listdir(path)):
                if f.endswith(".safetensors"):
                    full.update(load_file(os.path.join(path, f)))
            del full
    else:
        target = ctx["fresh"]
        profile = ctx["profile"]
        if profile is not None:
            profile.enable()
        st.load_state_dict(path, target.state_dict(), model=target)
        if profile is not None:
            profile.disable()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    if way == "shardd-load":
        want = bench_torch.local_tensors(ctx["model"])
        got = bench_torch.local_tensors(ctx["fresh"])
        equal = all(torch.equal(got[k], want[k]) for k in want)
        with torch.no_grad():
            for t in got.values():
                t.zero_()
    dist.barrier()
    return seconds, cpu, equal


def worker(args):
    import torch.distributed as dist

    import bench_torch
    import shardd.torch as st
    from bench_proc import drop_caches
    from torch_world import init

    rank, _ = init()
    phases = phase_timers() if args["phases"] and rank == 0 else None
    m = bench_torch.build_model(args, args["layout"])
    fresh = bench_torch.build_model(args, args["layout"])
    total = sum(p.numel() * p.element_size() for p in m.parameters())
    st.save_pretrained(m, "moe-load", max_shard_size=args["shard"])
    ctx = {"model": m, "fresh": fresh, "args": args, "rank": rank, "total": total,
           "path": os.path.join(args["root"], "moe-load"), "fio_dir": os.path.join(args["root"], "fio-read"),
           "profile": None}
    if rank == 0:
        bench_torch.fio(args, "write", total, ctx["fio_dir"])
    rounds = []
    for r in range(args["rounds"]):
        if args["profile"] and rank == 0 and r == args["rounds"] - 1:
            ctx["profile"] = cProfile.Profile(time.process_time)  # CPU, not a shared machine's wall
        figures = {}
        if phases is not None:
            phases.clear()
        for way in WAYS:
            dropped = drop_caches() if rank == 0 else False
            dist.barrier()
            seconds, cpu, equal = load_way(way, ctx)
            figures[way] = {"seconds": seconds, "cpu": cpu, "equal": equal, "dropped": dropped}
        figures["phases"] = dict(phases or {})
        rounds.append(figures)
    out = {"total": total, "rounds": rounds, "profile": ""}
    if ctx["profile"] is not None:
        text = io.StringIO()
        for order in ("tottime", "cumulative"):
            pstats.Stats(ctx["profile"], stream=text).sort_stats(order).print_stats(args["profile"])
        out["profile"] = text.getvalue()
    return out


def report(layout, out, rounds):
    gib = out[0]["total"] / 2**30
    print("\n%s: %.3f GiB, %d ranks, %d rounds (min / median; CPU: rank 0 and all ranks)"
          % (layout, gib, len(out), rounds))
    print("%-12s %15s %7s %7s %15s %15s %s" % ("load", "loaded s", "x fio", "x st", "rank 0 CPU s", "all CPU s",
                                              "equal"))
    loaded = {w: [max(rank["rounds"][r][w]["seconds"] for rank in out) for r in range(rounds)] for w in WAYS}
    cpu0 = {w: [out[0]["rounds"][r][w]["cpu"] for r in range(rounds)] for w in WAYS}
    cpus = {w: [sum(rank["rounds"][r][w]["cpu"] for rank in out) for r in range(rounds)] for w in WAYS}
    fio_r, st_r = min(loaded["fio-read"]), min(loaded["safetensors"])
    for w in WAYS:
        eq = all(rank["rounds"][r][w]["equal"] for rank in out for r in range(rounds))
        print("%-12s %6.2f / %6.2f %7.2f %7.2f %6.2f / %6.2f %6.2f / %6.2f %s" % (
            w, min(loaded[w]), statistics.median(loaded[w]), min(loaded[w]) / fio_r, min(loaded[w]) / st_r,
            min(cpu0[w]), statistics.median(cpu0[w]), min(cpus[w]), statistics.median(cpus[w]),
            "yes" if eq else "NO"))
    caches = all(out[0]["rounds"][r][w]["dropped"] for r in range(rounds) for w in WAYS)
    print("page cache dropped before every way: %s" % ("yes" if caches else "no (not permitted): loads are warm"))
    timed = [r["phases"] for r in out[0]["rounds"] if r["phases"]]
    if timed:
        phases = dict(min(timed, key=lambda p: p["load_state_dict"]))
        whole = phases.pop("load_state_dict")
        print("\nrank 0's load_state_dict in its cheapest round, CPU s: %.3f" % whole)
        for name, seconds in sorted(phases.items(), key=lambda kv: -kv[1]):
            print("  %-45s %6.3f" % (name, seconds))
        print("  %-45s %6.3f" % ("the rest", whole - sum(phases.values())))
    if out[0]["profile"]:
        print("\nrank 0's last shardd-load under cProfile:\n" + out[0]["profile"])
    return all(rank["rounds"][r]["shardd-load"]["equal"] for rank in out for r in range(rounds))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker")
    ap.add_argument("--layout", default="dsv3_ep4", help="qwen3moe_ep4, qwen3moe_fsdp4 or dsv3_ep4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", type=int, default=0, help="print rank 0's N costliest functions of its last load")
    ap.add_argument("--phases", action="store_true", help="print rank 0's CPU seconds in each step of the load")
    ap.add_argument("--layers", type=int, default=8, help="layers of the qwen3moe layouts")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--moe-hidden", type=int, help="hidden size (bench_moe.py)")
    ap.add_argument("--moe-inter", type=int, help="each expert's intermediate size (bench_moe.py)")
    ap.add_argument("--shard", default="300MB", help="max_shard_size of the save")
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "bench-moe-load"))
    ap.add_argument("--keep", action="store_true", help="leave the saved checkpoint under --work/root/moe-load")
    a = ap.parse_args()
    if a.worker:
        from torch_world import answer

        return answer(worker(json.loads(a.worker)))

    import bench_torch
    from shardd_daemon import Daemon
    from torch_world import run_world

    bench_torch.driver_environment("bench_moe_load")
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    d = Daemon(root=os.path.join(a.work, "root"))
    try:
        args = {"root": d.root, "rounds": a.rounds, "profile": a.profile, "phases": a.phases, "layers": a.layers, "vocab": a.vocab,
                "moe_hidden": a.moe_hidden, "moe_inter": a.moe_inter, "shard": a.shard, "layout": a.layout}
        out = run_world(os.path.abspath(__file__), 4, args,
                        {"SHARDD_SOCKET": d.socket, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}, timeout=3600)
    finally:
        d.stop()
    ok = report(a.layout, out, a.rounds)
    print("load average after: %s" % open("/proc/loadavg").read().split()[:3])
    if not a.keep:
        shutil.rmtree(a.work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
