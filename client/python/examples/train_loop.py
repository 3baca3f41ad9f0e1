#!/usr/bin/env python3
# A toy numpy training loop that checkpoints every N steps through shardd, double-buffering two arenas.
"""Trains a linear model y = x @ W.T + b by gradient descent and saves it every --every steps.

Each rank owns a block of W's rows and of b (rows of a linear layer train
independently, so the toy is exact without communication), and all ranks
share the optimizer step: the checkpoint holds the global tensors, with
"step" as a replica every rank puts. Under torchrun, RANK and WORLD_SIZE
split the rows; alone, the process holds everything.

Saving copies the state into one of two shared-memory arenas and returns
once this rank has sealed: training goes on while the daemon writes. The
next save uses the other arena, and an arena is reused only after the daemon
released the save that last read from it, so no step waits for disk unless
it outruns two saves.

    shardd --root /tmp/ckpt --socket /tmp/shardd.sock &
    python3 train_loop.py --socket /tmp/shardd.sock --steps 20 --every 5 --dir toy
"""
import argparse
import json
import sys
import time

import numpy as np

import shardd


def row_block(n, rank, world_size):
    """[lo, hi) of the rows rank owns when n rows are split as evenly as possible."""
    base, extra = divmod(n, world_size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--socket", help="shardd's socket (default: $SHARDD_SOCKET)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--every", type=int, default=5, help="save every N steps")
    ap.add_argument("--dir", default="train-loop", help="checkpoints go to DIR/step-NNNNNN under the root")
    ap.add_argument("--inputs", type=int, default=64)
    ap.add_argument("--outputs", type=int, default=48)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for a save")
    args = ap.parse_args(argv)
    if args.every < 1 or args.steps < 0:
        ap.error("--every must be >= 1 and --steps >= 0")

    topo = shardd.torchrun_env()
    rank = topo["rank"] or 0
    world_size = topo["world_size"] or 1
    lo, hi = row_block(args.outputs, rank, world_size)

    # The same seed everywhere, so every rank agrees on the data and the truth.
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((256, args.inputs)).astype(np.float32)
    w_true = rng.standard_normal((args.outputs, args.inputs)).astype(np.float32)
    y = x @ w_true.T + 0.5
    w = np.zeros((hi - lo, args.inputs), np.float32)
    b = np.zeros(hi - lo, np.float32)
    y_mine = y[:, lo:hi]
    config = json.dumps({"model_type": "toy-linear", "inputs": args.inputs, "outputs": args.outputs},
                        sort_keys=True) + "\n"

    def state(step):
        # State-dict order: every rank lists the same names in the same order.
        return {
            "linear.weight": shardd.Slice(w, shape=(args.outputs, args.inputs), start=(lo, 0)),
            "linear.bias": shardd.Slice(b, shape=(args.outputs,), start=(lo,)),
            "step": np.array(step, np.int64),
        }

    with shardd.Client(args.socket) as client:
        # Sized for one rank's state; save() would grow them if the model did.
        nbytes = w.nbytes + b.nbytes + 2 * 64 + 8
        arenas = [client.arena(nbytes), client.arena(nbytes)]
        pending = [None, None]
        blocked = 0.0
        saves = 0
        for step in range(1, args.steps + 1):
            err = x @ w.T + b - y_mine
            loss = float(np.mean(err * err)) if err.size else 0.0
            w -= args.lr * (2.0 / len(x)) * (err.T @ x)
            b -= args.lr * 2.0 * err.mean(axis=0)
            if step % args.every:
                continue

            k = saves % 2
            saves += 1
            before = pending[k]
            t0 = time.perf_counter()
            if before is not None:
                # The save two checkpoints ago read this arena: overwrite it only once released.
                client.wait_released(before.save_id, args.timeout)
            pending[k] = shardd.save(state(step), "%s/step-%06d" % (args.dir, step), client=client,
                                     arena=arenas[k], rank=rank, world_size=world_size,
                                     metadata={"step": str(step)}, files={"config.json": config},
                                     wait=False, timeout=args.timeout)
            blocked += time.perf_counter() - t0
            print("rank %d step %d loss %.6f: saving %s" % (rank, step, loss, pending[k].save_id),
                  flush=True)
            if before is not None:
                # Long released by now, and almost surely committed too.
                report(before.wait(args.timeout), rank)

        for p in sorted((p for p in pending if p is not None), key=lambda p: p.save_id):
            report(p.wait(args.timeout), rank)
        for a in arenas:
            a.close()
    print("rank %d: %d steps, %d saves, %.3f s blocked in save" % (rank, args.steps, saves, blocked),
          flush=True)
    return 0


def report(result, rank):
    print("rank %d committed %s: %d files, %d bytes" % (rank, result["dir"], result["files"],
                                                       result["bytes"]), flush=True)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except shardd.ShardError as e:
        sys.exit("train_loop: %s" % e)
