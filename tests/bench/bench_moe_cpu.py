#!/usr/bin/env python3
# Where an MoE save_pretrained's time goes: each rank's CPU per step of the library, the daemon's CPU, wall and blocked time.
"""One command (the venv's python):

    .venv/bin/python tests/bench/bench_moe_cpu.py [--layout dsv3_ep4] [--rounds 2] [--no-wait]

A daemon and 4 gloo ranks holding bench_moe.py's model in the layout asked
(qwen3moe_ep4, qwen3moe_fsdp4, dsv3_ep4). Each round every rank calls
shardd.torch.save_pretrained (wait=True, or wait=False then wait()). Printed
per round: each rank's blocked and durable seconds and its CPU seconds for
the save, the daemon's CPU; the same round's references (every rank cloning
its local tensors, fio writing the bytes) and the ratios to them; then rank
0's CPU seconds (of the thread that ran it) in each step of the library (the
collector's passes by generation, the piece computation, description,
placement, copy, puts, waits). CPU is the figure to compare on
a shared machine: the wall times there are mostly waiting for a core. The
first round is a process's first save (transformers' reverse conversion,
the pooled arena made and attached); later rounds reuse both.
"""
import argparse
import collections
import functools
import gc
import json
import os
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
sys.path.insert(0, os.path.join(ROOT, "client", "python", "tests"))


def step_timers():
    """{step: CPU seconds} filled by wrapping the library's steps in place, and the collector's passes."""
    import shardd._client as C
    import shardd._hf as H
    import shardd._save as S

    cpu = collections.defaultdict(float)
    started = [0.0]

    def collector(phase, info):
        if phase == "start":
            started[0] = time.thread_time()
        else:
            cpu["gc gen%d" % info["generation"]] += time.thread_time() - started[0]

    gc.callbacks.append(collector)

    def wrap(owner, name, label):
        f = getattr(owner, name)

        @functools.wraps(f)
        def timed(*a, **k):
            t = time.thread_time()  # the step's own thread: the hand-over's run beside the caller's
            try:
                return f(*a, **k)
            finally:
                cpu[label] += time.thread_time() - t

        setattr(owner, name, timed)

    for owner, name in [(H, "saved_pieces"), (H, "_saved_values"), (H, "_held"), (H, "config_files"),
                        (H, "num_parameters"), (S, "prepare"), (S, "_Descs"), (S, "_place"), (S, "check_shared_memory"),
                        (S, "copy_all")]:
        wrap(owner, name, name)
    for name in ("arena", "begin", "_put_descs", "seal", "wait"):
        wrap(C.Client, name, "Client." + name)
    return cpu


def worker(args):
    import torch.distributed as dist

    import bench_torch
    import shardd.torch as st
    from bench_proc import proc_figures
    from torch_world import init

    rank, _ = init()
    cpu = step_timers()
    m = bench_torch.build_model(args, args["layout"])
    total = sum(p.numel() * p.element_size() for p in m.parameters())  # the global bytes
    rounds = []
    for r in range(args["rounds"]):
        # The references of the same round: every rank cloning its local tensors (the floor of
        # wait=False's blocked time) and fio writing the bytes (of the time to durable).
        dist.barrier()
        memcpy, _ = bench_torch.save_way("memcpy", {"model": m, "args": args, "rank": rank, "dest": "memcpy"})
        dist.barrier()
        fio = 0.0
        if rank == 0:
            fio = bench_torch.fio(args, "write", total, os.path.join(args["root"], "fio"))
            shutil.rmtree(os.path.join(args["root"], "fio"))
        cpu.clear()
        dist.barrier()
        daemon0 = proc_figures(args["daemon"])[0] if rank == 0 else 0.0
        profile = None
        if args["profile"] and rank == 0 and r == args["rounds"] - 1:
            import cProfile

            profile = cProfile.Profile()
            profile.enable()
        c0, t0 = time.process_time(), time.perf_counter()
        pending = st.save_pretrained(m, "round-%d" % r, max_shard_size=args["shard"], wait=args["wait"])
        blocked = time.perf_counter() - t0
        if profile is not None:
            profile.disable()
            profile.dump_stats(args["profile"])
        if not args["wait"]:
            pending.wait()
        durable, used = time.perf_counter() - t0, time.process_time() - c0
        dist.barrier()
        daemon = proc_figures(args["daemon"])[0] - daemon0 if rank == 0 else 0.0
        rounds.append({"blocked": blocked, "durable": durable, "cpu": used, "daemon_cpu": daemon,
                       "steps": dict(cpu), "memcpy": memcpy, "fio": fio})
    return rounds


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker")
    ap.add_argument("--layout", default="dsv3_ep4")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-wait", action="store_true", help="save with wait=False, then wait()")
    ap.add_argument("--shard", default="300MB")
    ap.add_argument("--profile", help="rank 0's last round until save_pretrained returns, as cProfile stats "
                                      "in this file (read with python -m pstats)")
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "bench-moe-cpu"))
    a = ap.parse_args()
    if a.worker:
        from torch_world import answer

        return answer(worker(json.loads(a.worker)))

    from bench_torch import driver_environment
    from test_binding import Daemon
    from torch_world import run_world

    driver_environment("bench_moe_cpu")
    shutil.rmtree(a.work, ignore_errors=True)
    d = Daemon(root=os.path.join(a.work, "root"))
    try:
        args = {"root": d.root, "rounds": a.rounds, "layers": 8, "hidden": 2048, "inter": 5504, "vocab": 32000,
                "moe_hidden": None, "moe_inter": None, "shard": a.shard, "layout": a.layout,
                "daemon": d.proc.pid, "wait": not a.no_wait,
                "profile": a.profile and os.path.abspath(a.profile)}
        out = run_world(os.path.abspath(__file__), 4, args,
                        {"SHARDD_SOCKET": d.socket, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}, timeout=3600)
    finally:
        d.stop()
    print("%s, wait=%s" % (a.layout, not a.no_wait))
    for r in range(a.rounds):
        ranks = [o[r] for o in out]
        print("round %d: blocked s %s; durable s %.2f; rank CPU s %s; daemon CPU s %.2f" % (
            r, "/".join("%.2f" % x["blocked"] for x in ranks), max(x["durable"] for x in ranks),
            "/".join("%.2f" % x["cpu"] for x in ranks), ranks[0]["daemon_cpu"]))
        memcpy, fio = max(x["memcpy"] for x in ranks), ranks[0]["fio"]
        print("  memcpy s %s, fio s %.2f: blocked %.2f x memcpy, durable %.2f x fio" % (
            "/".join("%.2f" % x["memcpy"] for x in ranks), fio, max(x["blocked"] for x in ranks) / memcpy,
            max(x["durable"] for x in ranks) / fio))
        print("  rank 0 CPU s by step: " + ", ".join("%s %.3f" % kv for kv in sorted(ranks[0]["steps"].items())))
    print("load average after: %s" % open("/proc/loadavg").read().split()[:3])
    shutil.rmtree(a.work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
