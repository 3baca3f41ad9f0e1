#!/usr/bin/env python3
# Megatron benchmark: a Megatron-core GPT (dense TPxPP, MoE EP) saved as an HF checkpoint by shardd.megatron beside Megatron-Bridge's gather-then-write.
"""One command (the venv's python; docs/megatron.md):

    .venv/bin/python tests/bench/bench_megatron.py [--scale 1] [--rounds 1] [--layouts dense,moe]

A daemon on build/bench-megatron/root and 4 gloo rank processes with a
bf16 Megatron-core GPT: `dense` (Llama-style, TP2 x PP2) and `moe`
(Mixtral-style, EP4). --scale 1 is about 300 MiB per model, --scale 4
about 1.2 GiB. The ways, each timed from a barrier:

  fio             fio io_uring O_DIRECT writes of the same bytes, 4 jobs, fsync
  shardd          shardd.megatron.save_hf_weights, waiting for the commit (fsynced)
  gathered-1      what Megatron-Bridge's save_hf_weights does: every rank gathers every full
                  tensor (here all_gather_object over gloo; NCCL in a real job), maps it to HF
                  names, then rank 0 writes every file with safetensors and fsyncs them
  gathered-node   the same gathers, then one writer per emulated node of 2 ranks (ranks 0 and 2,
                  distributed_save with save_every_n_ranks=2) each writing every other file

For each: time to durable, each rank's blocked time (until its call
returns), and the largest extra peak RSS of a rank; the gathered ways also
show how long the gather took (the slowest rank) and the rest, the write
(the slowest writer, from the end of its own gather). The gathered outputs are
compared tensor by tensor with shardd's. No figure is asserted.
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
sys.path.insert(0, os.path.join(ROOT, "client", "python", "tests"))
sys.path.insert(0, HERE)
from bench_proc import proc_figures  # noqa: E402
from bench_torch import driver_environment, fio_save, reset_peak  # noqa: E402

WAYS = ["fio", "shardd", "gathered-1", "gathered-node"]
LAYOUTS = {"dense": ("llama", dict(tp=2, pp=2)), "moe": ("mixtral", dict(ep=4))}


def dims(scale):
    """Sizes of about 300 MiB (bf16) per unit of scale, for either family."""
    import torch

    hidden = 1024
    return dict(vocab=32000, padded=32000, hidden=hidden, heads=16, groups=4, head_dim=64,
                ffn=2816, layers=8 * scale, experts=8, topk=2, expert_ffn=1408, dtype=torch.bfloat16)


def write_files(tensors, path, shard, writers, rank):
    """huggingface_hub's file split, the files dealt to the writer ranks, each file fsynced."""
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors.torch import save_file

    split = split_torch_state_dict_into_shards(tensors, max_shard_size=shard)
    if rank not in writers:
        return
    os.makedirs(path, exist_ok=True)
    mine = writers.index(rank)
    for i, (name, keys) in enumerate(sorted(split.filename_to_tensors.items())):
        if i % len(writers) == mine:
            target = os.path.join(path, name)
            save_file({k: tensors[k] for k in keys}, target, metadata={"format": "pt"})
            fd = os.open(target, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
    if mine == 0 and split.is_sharded:
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": split.tensor_to_filename}, f)
            f.flush()
            os.fsync(f.fileno())


def save_way(way, ctx):
    """(blocked, durable, gather) seconds of one way on this rank, from a common start."""
    import torch.distributed as dist

    import megatron_world as mw
    import shardd.megatron as sm

    args, rank = ctx["args"], ctx["rank"]
    dest = ctx["dest"]
    path = os.path.join(args["root"], dest)
    t0 = time.perf_counter()
    if way == "fio":
        return fio_save(args, rank, ctx["total"], path, t0) + (0.0,)
    if way == "shardd":
        sm.save_hf_weights(ctx["chunks"], dest, hf_config=ctx["cfg"], max_shard_size=args["shard"])
        return time.perf_counter() - t0, time.perf_counter() - t0, 0.0
    full = mw.hf_names(mw.full_tensors(ctx["chunks"], everyone=True), ctx["cfg"])
    gather = time.perf_counter() - t0
    write_files(full, path, args["shard"], [0] if way == "gathered-1" else [0, 2], rank)
    durable = time.perf_counter() - t0
    del full
    dist.barrier()  # Megatron-Bridge's ranks wait for the writers
    return time.perf_counter() - t0, durable, gather


def compare(root, r):
    """'' when every gathered way holds shardd's tensors bit for bit, else what differs."""
    from test_hf import shards

    def flat(folder):
        return {k: v for part in shards(folder).values() for k, v in part.items()}

    ref = flat(os.path.join(root, "shardd-%d" % r))
    bad = []
    for way in ("gathered-1", "gathered-node"):
        got = flat(os.path.join(root, "%s-%d" % (way, r)))
        if got != ref:
            bad.append("%s: %d of %d tensors differ" % (way, sum(got.get(k) != v for k, v in ref.items()), len(ref)))
    return "; ".join(bad)


def worker(args):
    import torch.distributed as dist

    import megatron_world as mw
    from torch_world import init

    rank, _ = init()
    mw.shims()
    family, lay = LAYOUTS[args["layout"]]
    d = dims(args["scale"])
    chunks = mw.build(family, mw.layout(**lay), seed=1, d=d, init=False)
    cfg = mw.hf_config(family, d)
    from shardd.megatron import hf_boxes

    expected, boxes = hf_boxes(chunks, cfg)
    own = sum(v.numel() * v.element_size() for _, v, _, _ in boxes)
    total = sum(2 * int(__import__("math").prod(s)) for s in expected.values())
    ctx = {"chunks": chunks, "cfg": cfg, "args": args, "rank": rank, "total": total}
    out = {"own": own, "total": total, "rounds": [], "check": ""}
    for r in range(args["rounds"]):
        figures = {}
        for way in WAYS:
            ctx["dest"] = "%s-%d" % (way, r)
            dist.barrier()
            peak_ok = reset_peak(os.getpid())
            before = proc_figures(os.getpid())
            dist.barrier()
            blocked, durable, gather = save_way(way, ctx)
            dist.barrier()
            after = proc_figures(os.getpid())
            figures[way] = {"blocked": blocked, "durable": durable, "gather": gather,
                            "rss_extra": after[1] - before[1] if peak_ok else None}
        if r == 0 and rank == 0:
            out["check"] = compare(args["root"], r)
        dist.barrier()
        if rank == 0:
            for way in WAYS:
                shutil.rmtree(os.path.join(args["root"], "%s-%d" % (way, r)), ignore_errors=True)
        dist.barrier()
        out["rounds"].append(figures)
    return out


def table(layout, out, rounds):
    total = out[0]["total"]
    print("\n%s (%s %s): %.3f GiB, 4 ranks handing over %s MiB; %d round(s), min" % (
        layout, LAYOUTS[layout][0], LAYOUTS[layout][1], total / 2**30,
        "/".join("%.0f" % (o["own"] / 2**20) for o in out), rounds))
    print("%-14s %10s %7s %10s %15s %10s %10s %10s" % ("save", "durable s", "x fio", "x shardd", "blocked s max",
                                                       "gather s", "write s", "rank+MiB"))

    def best(way, key, agg=max):
        return min(agg(rank["rounds"][r][way][key] for rank in out) for r in range(rounds))

    ref, fio_s = best("shardd", "durable"), best("fio", "durable")
    for way in WAYS:
        extra = [rank["rounds"][r][way]["rss_extra"] for rank in out for r in range(rounds)]
        extra = max(e for e in extra if e is not None) / 2**20 if any(e is not None for e in extra) else float("nan")
        d = best(way, "durable")
        write = min(max(rank["rounds"][r][way]["durable"] - rank["rounds"][r][way]["gather"] for rank in out)
                    for r in range(rounds))
        print("%-14s %10.2f %7.2f %10.2f %15.2f %10.2f %10.2f %10.0f" % (
            way, d, d / fio_s, d / ref, best(way, "blocked"), best(way, "gather"), write, extra))
    print("targets: shardd = %.2f x gathered-1 (<= 0.25), %.2f x gathered-node (<= 0.5), %.2f x fio (<= 1.1)"
          % (ref / best("gathered-1", "durable"), ref / best("gathered-node", "durable"), ref / fio_s))


def run_layout(a, layout):
    """One layout in a fresh work folder with its own daemon; its table; 1 if the outputs differ."""
    from shardd_daemon import Daemon
    from torch_world import run_world

    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    daemon = Daemon(root=os.path.join(a.work, "root"))
    args = {"root": daemon.root, "rounds": a.rounds, "scale": a.scale, "shard": a.shard, "layout": layout}
    try:
        out = run_world(os.path.abspath(__file__), 4, args, {"SHARDD_SOCKET": daemon.socket,
                                                             "OMP_NUM_THREADS": "1"}, timeout=3600)
    finally:
        daemon.stop()
    table(layout, out, a.rounds)
    check = out[0]["check"]
    print("outputs: %s" % ("the gathered ways hold shardd's tensors bit for bit" if not check else "DIFFER: " + check))
    return int(bool(check))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layouts", default="dense,moe", help="dense (TP2 x PP2), moe (EP4), or both")
    ap.add_argument("--scale", type=int, default=1, help="about 300 MiB (dense) per unit")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--shard", default="100MB", help="max_shard_size of every way")
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "bench-megatron"))
    ap.add_argument("--worker", help="(internal) run one rank")
    a = ap.parse_args()
    if a.worker:
        from torch_world import answer

        return answer(worker(json.loads(a.worker)))
    driver_environment("bench_megatron")
    status = max(run_layout(a, layout) for layout in a.layouts.split(","))
    shutil.rmtree(a.work, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
