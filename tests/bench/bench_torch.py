#!/usr/bin/env python3
# Torch benchmark: a ~1 GiB Llama under FSDP2 x 4 saved as save_pretrained's layout, shardd beside the gathered save users run today.
"""One command (the venv's python; README, "Benchmarks"):

    .venv/bin/python tests/bench/bench_torch.py [--rounds 3] [--layers 8] [--hidden 2048]

A daemon on build/bench-torch/root and 4 gloo rank processes. The model is
built on the meta device and each rank materializes only its own FSDP2
shards. Each round saves the same state in each way:

  gathered      get_model_state_dict(full_state_dict, cpu_offload) to rank 0,
                huggingface_hub.save_torch_state_dict there, then sync; every
                rank waits at a barrier, as trainers do
  shardd        shardd.torch.save_pretrained, waiting for the commit (fsynced)
  shardd-async  the same with wait=False: blocked is the hand-over, durable the commit
  memcpy        each rank copies its own bytes once (the floor of blocked time)

and prints, per way, the time to durable and each rank's blocked time (min
and median of the rounds) with ratios against shardd. The first round's
outputs are compared tensor by tensor (safetensors.safe_open), and the file
maps must be equal, so no fast path is a wrong path. No figure is asserted.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
sys.path.insert(0, os.path.join(ROOT, "client", "python", "tests"))

METHODS = ["gathered", "shardd", "shardd-async", "memcpy"]


def build_model(args):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(vocab_size=args["vocab"], hidden_size=args["hidden"], intermediate_size=args["inter"],
                      num_hidden_layers=args["layers"], num_attention_heads=16, num_key_value_heads=16,
                      tie_word_embeddings=False)
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    mesh = init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))
    for layer in m.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    m.to_empty(device="cpu")
    g = torch.Generator().manual_seed(int(os.environ["RANK"]))
    with torch.no_grad():
        for p in m.parameters():
            p.to_local().uniform_(-1, 1, generator=g)
    return m


def worker(args):
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from huggingface_hub import save_torch_state_dict

    import shardd.torch as st
    from torch_world import init

    rank, world = init()
    m = build_model(args)
    local_bytes = sum(p.to_local().numel() * p.element_size() for p in m.parameters())
    out = {"bytes": local_bytes, "rounds": []}
    for r in range(args["rounds"]):
        times = {}
        for method in METHODS:
            dest = "%s-%d" % (method, r)
            dist.barrier()
            t0 = time.perf_counter()
            if method == "gathered":
                full = get_model_state_dict(m, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
                if rank == 0:
                    os.makedirs(os.path.join(args["root"], dest))
                    save_torch_state_dict(full, os.path.join(args["root"], dest), max_shard_size=args["shard"])
                    os.sync()
                durable = time.perf_counter() - t0
                dist.barrier()
                blocked = time.perf_counter() - t0
                del full
            elif method == "memcpy":
                copies = [p.to_local().clone() for p in m.parameters()]
                blocked = durable = time.perf_counter() - t0
                del copies
            else:
                pending = st.save_pretrained(m, dest, max_shard_size=args["shard"],
                                             wait=method == "shardd")
                blocked = time.perf_counter() - t0
                if method == "shardd-async":
                    pending.wait()
                durable = time.perf_counter() - t0
            times[method] = {"blocked": blocked, "durable": durable}
            dist.barrier()
        out["rounds"].append(times)
    return out


def check_equal(root):
    """The gathered and the shardd checkpoint of round 0: same file map, same tensors bit for bit."""
    import torch
    from safetensors import safe_open

    maps = []
    for method in ("gathered", "shardd"):
        with open(os.path.join(root, "%s-0" % method, "model.safetensors.index.json")) as f:
            maps.append(json.load(f)["weight_map"])
    if maps[0] != maps[1]:
        raise SystemExit("bench: the file maps differ")
    for name, file in maps[0].items():
        with safe_open(os.path.join(root, "gathered-0", file), "pt") as a, \
                safe_open(os.path.join(root, "shardd-0", file), "pt") as b:
            if not torch.equal(a.get_tensor(name).view(torch.int16), b.get_tensor(name).view(torch.int16)):
                raise SystemExit("bench: %s differs" % name)
    return len(maps[0]), len(set(maps[0].values()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=5504)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--shard", default="300MB", help="max_shard_size of every way")
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "bench-torch"))
    a = ap.parse_args()
    if a.worker:
        from torch_world import answer

        return answer(worker(json.loads(a.worker)))

    from test_binding import Daemon
    from torch_world import run_world

    os.environ.setdefault("SHARDD_BIN", os.path.join(ROOT, "build", "daemon", "shardd"))
    os.environ.setdefault("LIBSHARDD", os.path.join(ROOT, "build", "client", "libshardd.so"))
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    d = Daemon(root=os.path.join(a.work, "root"))
    try:
        args = {"root": d.root, "rounds": a.rounds, "layers": a.layers, "hidden": a.hidden,
                "inter": a.inter, "vocab": a.vocab, "shard": a.shard}
        t0 = time.perf_counter()
        out = run_world(os.path.abspath(__file__), a.ranks, args, {"SHARDD_SOCKET": d.socket,
                                                                   "OMP_NUM_THREADS": "1"},
                        timeout=3600)
        wall = time.perf_counter() - t0
        tensors, files = check_equal(d.root)
    finally:
        d.stop()
    total = sum(r["bytes"] for r in out)
    print("bench_torch: %.3f GiB bf16 Llama (%d layers, hidden %d), FSDP2 x %d gloo ranks, %d rounds, "
          "%d tensors in %d files, outputs equal; %.0f s in all"
          % (total / 2**30, a.layers, a.hidden, a.ranks, a.rounds, tensors, files, wall))
    rows = {}
    for method in METHODS:
        durable = [max(rank["rounds"][r][method]["durable"] for rank in out) for r in range(a.rounds)]
        blocked = [[rank["rounds"][r][method]["blocked"] for r in range(a.rounds)] for rank in out]
        rows[method] = (durable, blocked)
    ref = min(rows["shardd"][0])
    print("%-13s %16s %8s %s" % ("way", "durable s min/med", "x shardd", "blocked s per rank, min/med"))
    for method, (durable, blocked) in rows.items():
        print("%-13s %7.3f /%7.3f %8.2f %s" % (
            method, min(durable), statistics.median(durable), min(durable) / ref,
            "  ".join("r%d %.3f/%.3f" % (i, min(b), statistics.median(b)) for i, b in enumerate(blocked))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
