#!/usr/bin/env python3
# Trains a tiny torch model on several rank processes, saves it split as tensor parallelism splits it, reloads it.
"""A tiny torch trainer that checkpoints through shardd every --every steps.

    shardd --root /tmp/ckpt --socket /tmp/shardd.sock &
    python3 torch_tp_train.py --socket /tmp/shardd.sock --ranks 3 --steps 6 --every 2

Alone, it starts --ranks rank processes with the environment torchrun gives
(RANK, WORLD_SIZE, LOCAL_RANK, ...); under torchrun (RANK already set) it is
one rank, and a job spanning nodes saves across the nodes' daemons unchanged.
Every rank trains the same model from the same seed (a stand-in for the
communication of real tensor parallelism) and saves only the part tensor
parallelism gives it: rows of the column-parallel layer, columns of the
row-parallel one (torch.tensor_split, so pieces may be uneven or empty), the
rest as replicas. Then the launcher reads the last checkpoint back with the
short safetensors reader below, loads it into a fresh model and checks it
equals a model trained the same way in this process.
"""
import argparse
import json
import os
import struct
import subprocess
import sys

import torch

import shardd.torch as st

# name -> dim it is split along across ranks; None: every rank holds it whole.
TP_SPLIT = {"embed.weight": None, "up.weight": 0, "up.bias": 0, "down.weight": 1,
            "down.bias": None, "norm.weight": None, "norm.bias": None}


class TinyModel(torch.nn.Module):
    def __init__(self, vocab=11, hidden=8, inner=12):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.up = torch.nn.Linear(hidden, inner)     # column parallel: output rows split
        self.down = torch.nn.Linear(inner, hidden)   # row parallel: input columns split
        self.norm = torch.nn.LayerNorm(hidden)

    def forward(self, tokens):
        h = self.embed(tokens)
        h = h + self.down(torch.relu(self.up(h)))
        return self.norm(h) @ self.embed.weight.t()


def train(steps, every=None, on_checkpoint=None):
    """Trains from a fixed seed; calls on_checkpoint(model, step) every `every` steps."""
    torch.manual_seed(0)
    model = TinyModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(1)
    for step in range(1, steps + 1):
        tokens = torch.randint(0, 11, (4, 6), generator=data)
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 11), tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if every and step % every == 0:
            on_checkpoint(model, step)
    return model


def rank_main(args):
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    last = {}

    def checkpoint(model, step):
        sd = model.state_dict()
        mine = {name: t if TP_SPLIT[name] is None else st.split(t, TP_SPLIT[name], rank, world_size)
                for name, t in sd.items()}
        # Rank, world size, nodes and the daemon's socket come from the environment.
        last.update(st.save_state_dict(mine, "%s/step-%06d" % (args.dir, step),
                                       metadata={"step": str(step)}, socket=args.socket))
        print("rank %d: step %d %s" % (rank, step, last["state"]), file=sys.stderr)

    train(args.steps, args.every, checkpoint)
    print(json.dumps(last))


# A short safetensors reader (Debian 12 packages no safetensors): 8-byte little-endian header
# length, a JSON header of {name: {dtype, shape, data_offsets}}, then the data.
ST_TORCH = {"BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16,
            "I32": torch.int32, "I64": torch.int64, "F16": torch.float16, "BF16": torch.bfloat16,
            "F32": torch.float32, "F64": torch.float64, "C64": torch.complex64}


def read_safetensors_folder(folder):
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for name in files:
        with open(os.path.join(folder, name), "rb") as f:
            blob = f.read()
        (n,) = struct.unpack("<Q", blob[:8])
        header = json.loads(blob[8:8 + n])
        header.pop("__metadata__", None)
        for key, t in header.items():
            b, e = t["data_offsets"]
            dtype = ST_TORCH[t["dtype"]]
            data = bytearray(blob[8 + n + b:8 + n + e])
            flat = torch.frombuffer(data, dtype=dtype) if data else torch.empty(0, dtype=dtype)
            out[key] = flat.reshape(t["shape"])
    return out


def launch(args):
    env = dict(os.environ, WORLD_SIZE=str(args.ranks), LOCAL_WORLD_SIZE=str(args.ranks),
               MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, __file__] + sys.argv[1:], stdout=subprocess.PIPE,
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)))
             for r in range(args.ranks)]
    results = []
    for r, p in enumerate(procs):
        out, _ = p.communicate()
        if p.returncode != 0:
            sys.exit("rank %d failed (exit %d)" % (r, p.returncode))
        results.append(json.loads(out.decode().strip().splitlines()[-1]))
    folder = results[0]["dir"]
    print("%d ranks committed %s: %d files, %d tensors, %d bytes" % (
        args.ranks, folder, results[0]["files"], results[0]["tensors"], results[0]["bytes"]))

    fresh = TinyModel()
    fresh.load_state_dict(read_safetensors_folder(folder))
    reference = train(args.steps)
    for name, t in reference.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], t), "%s differs after the reload" % name
    tokens = torch.arange(10).reshape(2, 5) % 11
    assert torch.equal(fresh(tokens), reference(tokens))
    print("reloaded %s into a fresh model: equal" % os.path.basename(folder))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--socket", help="shardd's socket (default: $SHARDD_SOCKET)")
    ap.add_argument("--dir", default="tiny", help="checkpoint folder under the daemon's root")
    ap.add_argument("--ranks", type=int, default=3, help="rank processes to start (alone only)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--every", type=int, default=2)
    args = ap.parse_args()
    if args.steps < args.every or args.every < 1:
        ap.error("--steps must be at least --every, and --every at least 1")
    torch.set_num_threads(1)  # the same arithmetic in every process, so replicas agree bit for bit
    if os.environ.get("RANK"):
        rank_main(args)
    else:
        launch(args)


if __name__ == "__main__":
    main()
