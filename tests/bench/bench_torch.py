#!/usr/bin/env python3
# Torch benchmark: a >= 1 GiB Llama under FSDP2 x 4 and TP 2 x DP 2, shardd beside what users run today, save and load.
"""One command (the venv's python; docs/benchmarks.md):

    .venv/bin/python tests/bench/bench_torch.py [--rounds 3] [--layouts fsdp4,tp_dp] [--layers 8]

A daemon on build/bench-torch/root and 4 gloo rank processes. The model is
built on the meta device; each rank materializes only its own shards, with
values seeded by tensor and box so that DP replicas agree. Every round saves
the same state in every way, then loads it back:

  save  fio            fio io_uring O_DIRECT writes of the same bytes, 4 jobs, fsync: the disk
        gathered       get_model_state_dict(full_state_dict, cpu_offload) on rank 0, then
                       huggingface_hub.save_torch_state_dict and sync; the others wait at a barrier
        dcp-hf         DCP HuggingFaceStorageWriter, every rank its shard, then consolidation into
                       the HF layout (torchtitan's last_save_in_hf), then sync
        dcp-fs         DCP FileSystemWriter (DCP's own format, not HF: a speed reference), then sync
        shardd         shardd.torch.save_pretrained, waiting for the commit (fsynced); the default
                       path (no arena=: the library's own pooled arenas, reused from round 2)
        shardd-async   the same with wait=False: blocked is the hand-over
        dcp-shardd     dcp.save through shardd.torch.StorageWriter
        dcp-shardd-async  dcp.async_save through it
        memcpy         each rank copies its own bytes once (the floor of blocked time)
  load  fio-read       fio O_DIRECT reads of shardd's files
        from_pretrained  transformers on rank 0; safetensors: load_file of every shard on rank 0
        dcp-hf-read    DCP HuggingFaceStorageReader into the sharded model, every rank
        shardd-load    shardd.torch.load_state_dict into the sharded model, every rank

The page cache is dropped before each way where the kernel allows it. For
each way: time to durable (or to loaded), each rank's blocked time, the
largest rank's extra peak RSS and the daemon's, the daemon's CPU per GiB and
the bytes the way wrote to storage (/proc/PID/io of every rank and the
daemon); min and median over the rounds, with ratios against fio and
shardd. Round 0's outputs are compared tensor by tensor and file by file
with shardd's, and every load with the model, so no fast path is a wrong
path. No figure is asserted.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
sys.path.insert(0, os.path.join(ROOT, "client", "python", "tests"))
import bench_moe  # noqa: E402
from bench_proc import drop_caches, proc_figures  # noqa: E402

# shardd first: DCP's HF writer takes its file map.
SAVES = ["fio", "shardd", "shardd-async", "gathered", "dcp-hf", "dcp-fs", "dcp-shardd", "dcp-shardd-async",
         "memcpy"]
LOADS = ["fio-read", "from_pretrained", "safetensors", "dcp-hf-read", "shardd-load"]
HF_LAYOUT = ("gathered", "dcp-hf", "shardd", "shardd-async", "dcp-shardd", "dcp-shardd-async")


# ---- one rank ----------------------------------------------------------------------------------

def reset_peak(pid):
    """Starts a new VmHWM window (clear_refs 5); False where the kernel refuses."""
    try:
        with open("/proc/%d/clear_refs" % pid, "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def build_model(args, layout):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from transformers import AutoModelForCausalLM, LlamaConfig

    if bench_moe.is_moe(layout):
        return fill(bench_moe.build_model(args, layout))
    cfg = LlamaConfig(vocab_size=args["vocab"], hidden_size=args["hidden"], intermediate_size=args["inter"],
                      num_hidden_layers=args["layers"], num_attention_heads=16, num_key_value_heads=16,
                      tie_word_embeddings=False)
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    world = int(os.environ["WORLD_SIZE"])
    if layout == "tp_dp":
        mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
        plan = {}
        for i in range(args["layers"]):
            for part in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj",
                         "mlp.up_proj"):
                plan["model.layers.%d.%s" % (i, part)] = ColwiseParallel()
            for part in ("self_attn.o_proj", "mlp.down_proj"):
                plan["model.layers.%d.%s" % (i, part)] = RowwiseParallel()
        parallelize_module(m, mesh["tp"], plan)
    else:
        mesh = init_device_mesh("cpu", (world,))
        for layer in m.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(m, mesh=mesh)
    m.to_empty(device="cpu")
    return fill(m)


def fill(m):
    """Each rank's own shards, and the buffers (DeepSeek-V3's e_score_correction_bias), seeded by
    tensor and box so that replicas agree."""
    import torch

    from shardd._dtensor import dtensor_boxes, is_dtensor

    with torch.no_grad():
        for name, p in list(m.named_parameters()) + list(m.named_buffers()):
            if is_dtensor(p):
                local, boxes, _ = dtensor_boxes(name, p)
                start = boxes[0][0]
            else:
                local, start = p, (0,) * p.dim()
            g = torch.Generator().manual_seed(zlib.crc32(("%s@%s" % (name, start)).encode()))
            local.uniform_(-1, 1, generator=g)
    return m


def local_tensors(m):
    from shardd._dtensor import is_dtensor

    return {k: (v.to_local() if is_dtensor(v) else v) for k, v in m.state_dict().items()}


def fio(args, rw, total, directory):
    """fio's wall time for `total` bytes in 4 jobs, O_DIRECT through io_uring, fsync on close."""
    os.makedirs(directory, exist_ok=True)
    cmd = ["fio", "--name=ref", "--directory=" + directory, "--ioengine=io_uring", "--direct=1", "--bs=4M",
           "--rw=" + rw, "--size=%d" % (total // 4 // 2**20 * 2**20), "--numjobs=4", "--fsync_on_close=1",
           "--group_reporting", "--output-format=json", "--iodepth=16"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - t0


def fio_save(args, rank, total, path, t0):
    """The fio way: rank 0 writes `total` bytes, the others wait; (blocked, durable) since t0."""
    import torch.distributed as dist

    if rank == 0:
        fio(args, "write", total, path)
    durable = time.perf_counter() - t0
    dist.barrier()
    return time.perf_counter() - t0, durable


def save_way(way, ctx):
    """Runs one way on this rank; returns (blocked, durable) seconds from a common start."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter, HuggingFaceStorageWriter
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from huggingface_hub import save_torch_state_dict

    import shardd.torch as st

    m, args, rank, dest = ctx["model"], ctx["args"], ctx["rank"], ctx["dest"]
    path = os.path.join(args["root"], dest)
    t0 = time.perf_counter()
    if way == "fio":
        return fio_save(args, rank, ctx["total"], path, t0)
    if way == "gathered":
        full = get_model_state_dict(m, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if rank == 0:
            os.makedirs(path)
            if ctx["moe"]:
                bench_moe.save_like_transformers(bench_moe.saved_tensors(m, full), path, args["shard"])
            else:
                save_torch_state_dict(full, path, max_shard_size=args["shard"])
            os.sync()
        durable = time.perf_counter() - t0
        del full
        dist.barrier()
        return time.perf_counter() - t0, durable
    if way in ("dcp-hf", "dcp-fs"):
        sd = get_model_state_dict(m)
        if way == "dcp-hf":
            writer = HuggingFaceStorageWriter(path, save_distributed=True, enable_consolidation=True,
                                              fqn_to_index_mapping=ctx["file_index"],
                                              thread_count_consolidation=2)
        else:
            writer = FileSystemWriter(path)
        dcp.save(sd, storage_writer=writer)
        os.sync()
        return time.perf_counter() - t0, time.perf_counter() - t0
    if way in ("shardd", "shardd-async"):
        pending = st.save_pretrained(m, dest, max_shard_size=args["shard"], wait=way == "shardd")
        blocked = time.perf_counter() - t0
        if way == "shardd-async":
            pending.wait()
        return blocked, time.perf_counter() - t0
    if way in ("dcp-shardd", "dcp-shardd-async"):
        writer = st.StorageWriter(dest, max_shard_size=args["shard"])
        sd = get_model_state_dict(m)
        if way == "dcp-shardd":
            dcp.save(sd, storage_writer=writer)
            return time.perf_counter() - t0, time.perf_counter() - t0
        future = dcp.async_save(sd, storage_writer=writer)
        blocked = time.perf_counter() - t0
        future.result()
        return blocked, time.perf_counter() - t0
    if way == "memcpy":
        copies = [t.clone() for t in local_tensors(m).values()]
        blocked = time.perf_counter() - t0
        del copies
        return blocked, blocked
    raise ValueError(way)


def load_way(way, ctx):
    """Loads shardd's round folder one way; returns (seconds, equal to the model)."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    import shardd.torch as st

    rank, path, m = ctx["rank"], ctx["shardd_dir"], ctx["model"]
    t0 = time.perf_counter()
    equal = True
    if way == "fio-read":
        if rank == 0:
            fio(ctx["args"], "read", ctx["total"], ctx["fio_dir"])
    elif way in ("from_pretrained", "safetensors"):
        if rank == 0:
            if way == "from_pretrained":
                from transformers import AutoModelForCausalLM

                full = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).state_dict()
            else:
                from safetensors.torch import load_file

                full = {}
                for f in sorted(os.listdir(path)):
                    if f.endswith(".safetensors"):
                        full.update(load_file(os.path.join(path, f)))
            seconds = time.perf_counter() - t0
            ref = ctx["gathered_ref"] if way == "from_pretrained" else ctx["saved_ref"]
            equal = all(torch.equal(full[k], v) for k, v in ref.items())
            dist.barrier()
            return seconds, equal
    else:
        target = ctx["fresh"]
        sd = get_model_state_dict(target)
        if way == "dcp-hf-read":
            # DCP has no conversion: an MoE model reads DCP-HF's own folder (fused names).
            fused = path.replace("shardd-", "dcp-hf-") if ctx["moe"] else path
            dcp.load(sd, storage_reader=HuggingFaceStorageReader(fused))
        else:
            st.load_state_dict(path, target.state_dict(), model=target)
        seconds = time.perf_counter() - t0
        want = local_tensors(m)
        got = local_tensors(target)
        equal = all(torch.equal(got[k], want[k]) for k in want)
        with torch.no_grad():
            for t in got.values():
                t.zero_()
        dist.barrier()
        return seconds, equal
    seconds = time.perf_counter() - t0
    dist.barrier()
    return seconds, equal


def hf_files(path):
    """({tensor: file}, {file: {tensor: crc of its bytes}}) of an HF-layout folder."""
    import torch
    from safetensors import safe_open

    index = os.path.join(path, "model.safetensors.index.json")
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    crcs = {}
    for f in files:
        with safe_open(os.path.join(path, f), "pt") as h:
            crcs[f] = {k: zlib.crc32(h.get_tensor(k).view(torch.uint8).numpy()) for k in h.keys()}
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
    else:
        weight_map = {k: f for f, t in crcs.items() for k in t}
    return weight_map, crcs


def compare_outputs(root, r, moe=False):
    """Every HF-layout way of round r holds shardd's file map and tensors; '' or what differs.
    For an MoE model the per-expert ways are held to shardd's tensors (huggingface_hub files
    transformers' per-expert views of one storage together, so the gathered file map differs)
    and DCP's fused ones to dcp-shardd's."""
    if not moe:
        return _compare(root, r, "shardd", HF_LAYOUT, HF_LAYOUT)
    return "; ".join(filter(None, (_compare(root, r, "shardd", ("gathered", "shardd-async"), ("shardd-async",)),
                                   _compare(root, r, "dcp-shardd", ("dcp-hf", "dcp-shardd-async"),
                                            ("dcp-shardd-async",)))))


def _compare(root, r, base, ways, same_map):
    want_map, want = hf_files(os.path.join(root, "%s-%d" % (base, r)))
    want_tensors = {k: c for t in want.values() for k, c in t.items()}
    problems = []
    for way in ways:
        got_map, got = hf_files(os.path.join(root, "%s-%d" % (way, r)))
        tensors = {k: c for t in got.values() for k, c in t.items()}
        if tensors != want_tensors:
            problems.append("%s: tensors differ" % way)
        elif way in same_map and got_map != want_map:
            problems.append("%s: file map differs" % way)
    return "; ".join(problems)


def worker(args):
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from torch_world import init

    rank, _ = init()
    layout = args["layout"]
    m = build_model(args, layout)
    fresh = build_model(args, layout)
    own = sum(t.numel() * t.element_size() for t in local_tensors(m).values())
    total = sum(p.numel() * p.element_size() for p in m.parameters())  # the global bytes
    ctx = {"model": m, "fresh": fresh, "args": args, "rank": rank, "total": total,
           "fio_dir": os.path.join(args["root"], "fio-read")}
    gathered = get_model_state_dict(m, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    ctx["gathered_ref"] = gathered if rank == 0 else None
    ctx["saved_ref"] = bench_moe.saved_tensors(m, dict(gathered)) if rank == 0 else None
    ctx["moe"] = bench_moe.is_moe(layout)
    del gathered
    out = {"own": own, "total": total, "rounds": [], "checks": []}
    if rank == 0:
        fio(args, "write", total, ctx["fio_dir"])  # the files fio-read reads
    for r in range(args["rounds"]):
        ctx["file_index"] = None
        figures = {}
        for way in SAVES:
            ctx["dest"] = "%s-%d" % (way, r)
            dropped = drop_caches() if rank == 0 else False
            dist.barrier()
            peak_ok = reset_peak(os.getpid()) and (rank != 0 or reset_peak(args["daemon"]))
            before = proc_figures(os.getpid())
            daemon0 = proc_figures(args["daemon"]) if rank == 0 else None
            dist.barrier()
            blocked, durable = save_way(way, ctx)
            dist.barrier()
            after = proc_figures(os.getpid())
            f = {"blocked": blocked, "durable": durable, "rss_extra": after[1] - before[1] if peak_ok else None,
                 "wrote": after[2] - before[2], "dropped": dropped}
            if rank == 0:
                d1 = proc_figures(args["daemon"])
                f.update(daemon_cpu=d1[0] - daemon0[0], daemon_rss=d1[1], daemon_wrote=d1[2] - daemon0[2],
                         daemon_anon=d1[3])
            figures[way] = f
            if way == "shardd" and not ctx["moe"]:
                # DCP's HF writer is told shardd's file map, as torchtitan passes the index it loaded.
                holder = [None]
                if rank == 0:
                    with open(os.path.join(args["root"], ctx["dest"], "model.safetensors.index.json")) as fh:
                        weight_map = json.load(fh)["weight_map"]
                    names = sorted(set(weight_map.values()))
                    holder = [{k: names.index(v) + 1 for k, v in weight_map.items()}]
                dist.broadcast_object_list(holder, src=0)
                ctx["file_index"] = holder[0]
        ctx["shardd_dir"] = os.path.join(args["root"], "shardd-%d" % r)
        for way in LOADS:
            dropped = drop_caches() if rank == 0 else False
            dist.barrier()
            seconds, equal = load_way(way, ctx)
            figures[way] = {"blocked": seconds, "durable": seconds, "equal": equal, "dropped": dropped}
        if r == 0 and rank == 0:
            out["checks"].append(compare_outputs(args["root"], r, ctx["moe"]))
        dist.barrier()
        if rank == 0:
            for way in SAVES:
                if r > 0 or way not in HF_LAYOUT + ("dcp-fs",):
                    shutil.rmtree(os.path.join(args["root"], "%s-%d" % (way, r)), ignore_errors=True)
        dist.barrier()
        out["rounds"].append(figures)
    return out


# ---- the driver ------------------------------------------------------------------------------

def driver_environment(name):
    """fio present, the build tree's daemon and library, no progress bars; prints the load."""
    if not shutil.which("fio"):
        raise SystemExit("%s: fio is missing (Debian: fio; scripts/deps.sh installs it)" % name)
    os.environ.setdefault("SHARDD_BIN", os.path.join(ROOT, "build", "daemon", "shardd"))
    os.environ.setdefault("LIBSHARDD", os.path.join(ROOT, "build", "client", "libshardd.so"))
    os.environ.setdefault("TQDM_DISABLE", "1")
    print("%s: load average before: %s" % (name, open("/proc/loadavg").read().split()[:3]))


def table(layout, out, rounds):
    """Prints one layout's table; returns {way: (durable min, blocked max-rank min)}."""
    total = out[0]["total"]
    gib = total / 2**30

    def per_round(way, key, agg=max):
        return [agg(rank["rounds"][r][way][key] for rank in out) for r in range(rounds)]

    durable = {w: per_round(w, "durable") for w in SAVES + LOADS}
    blocked = {w: per_round(w, "blocked") for w in SAVES + LOADS}
    fio_w, fio_r, ref = min(durable["fio"]), min(durable["fio-read"]), min(durable["shardd"])
    print("\n%s: %.3f GiB, %d ranks, each holding %s MiB; %d rounds (min / median)"
          % (layout, gib, len(out), "/".join("%.0f" % (o["own"] / 2**20) for o in out), rounds))
    print("%-17s %15s %6s %6s %15s %9s %9s %8s %8s %7s" % ("save", "durable s", "x fio", "x sdd",
                                                           "blocked s (max)", "rank+MiB", "dmn MiB", "dmn anon",
                                                           "dmn s/G", "GiB wr"))
    for way in SAVES:
        d, b = durable[way], blocked[way]
        extra = [rank["rounds"][r][way]["rss_extra"] for rank in out for r in range(rounds)]
        extra = max(e for e in extra if e is not None) / 2**20 if any(e is not None for e in extra) else float("nan")
        d0 = [out[0]["rounds"][r][way] for r in range(rounds)]
        wrote = statistics.median(sum(rank["rounds"][r][way]["wrote"] for rank in out) + d0[r]["daemon_wrote"]
                                  for r in range(rounds)) / 2**30
        print("%-17s %6.2f / %6.2f %6.2f %6.2f %6.2f / %6.2f %9.0f %9.0f %8.0f %8.3f %7.2f" % (
            way, min(d), statistics.median(d), min(d) / fio_w, min(d) / ref, min(b), statistics.median(b), extra,
            max(x["daemon_rss"] for x in d0) / 2**20, max(x["daemon_anon"] for x in d0) / 2**20,
            min(x["daemon_cpu"] for x in d0) / gib, wrote))
    print("%-17s %15s %6s %6s %s" % ("load", "loaded s", "x fio", "x sdd", "equal to the model"))
    ld = min(durable["shardd-load"])
    for way in LOADS:
        d = durable[way]
        eq = all(rank["rounds"][r][way]["equal"] for rank in out for r in range(rounds))
        print("%-17s %6.2f / %6.2f %6.2f %6.2f %s" % (way, min(d), statistics.median(d), min(d) / fio_r, min(d) / ld,
                                                     "yes" if eq else "NO"))
    memcpy = min(blocked["memcpy"])
    print("targets: shardd durable = %.2f x dcp-hf, %.2f x gathered, fio/shardd = %.2f; async blocked = %.2f x "
          "memcpy; shardd-load = %.2f x fio-read, %.2f x from_pretrained"
          % (ref / min(durable["dcp-hf"]), ref / min(durable["gathered"]), fio_w / ref,
             min(blocked["shardd-async"]) / memcpy, fio_r / ld, ld / min(durable["from_pretrained"])))
    caches = all(rank["rounds"][r][w]["dropped"] for rank in out[:1] for r in range(rounds) for w in SAVES + LOADS)
    print("page cache dropped before every way: %s" % ("yes" if caches else "no (not permitted): loads are warm"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--layouts", default="fsdp4,tp_dp")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=5504)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--moe-hidden", type=int, help="hidden size of the MoE layouts (bench_moe.py)")
    ap.add_argument("--moe-inter", type=int, help="each expert's intermediate size (bench_moe.py)")
    ap.add_argument("--shard", default="300MB", help="max_shard_size of every HF way")
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "bench-torch"))
    a = ap.parse_args()
    if a.worker:
        from torch_world import answer

        return answer(worker(json.loads(a.worker)))

    from test_binding import Daemon
    from torch_world import run_world

    driver_environment("bench_torch")
    for layout in a.layouts.split(","):
        shutil.rmtree(a.work, ignore_errors=True)
        os.makedirs(a.work)
        d = Daemon(root=os.path.join(a.work, "root"))
        try:
            args = {"root": d.root, "rounds": a.rounds, "layers": a.layers, "hidden": a.hidden,
                    "inter": a.inter, "vocab": a.vocab, "moe_hidden": a.moe_hidden, "moe_inter": a.moe_inter, "shard": a.shard, "layout": layout,
                    "daemon": d.proc.pid}
            t0 = time.perf_counter()
            out = run_world(os.path.abspath(__file__), 4, args,
                            {"SHARDD_SOCKET": d.socket, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"},
                            timeout=3600)
            wall = time.perf_counter() - t0
        finally:
            d.stop()
        checks = out[0]["checks"][0]
        table(layout, out, a.rounds)
        same = ("the per-expert ways hold shardd's tensors, DCP's fused ways dcp-shardd's, bit for bit"
                if bench_moe.is_moe(layout) else "every HF way holds shardd's file map and tensors bit for bit")
        print("outputs: %s; %.0f s in all" % (same if not checks else "DIFFER: " + checks, wall))
        if checks:
            return 1
    shutil.rmtree(a.work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
