#!/usr/bin/env python3
# FSDP2 training on CPU that checkpoints through shardd in save_pretrained's layout, without a gather, and resumes from it.
"""A tiny Llama trained with FSDP2 (fully_shard) on gloo; every --every
steps each rank hands its own shards to the node's shardd daemon with
shardd.torch.save_pretrained(..., wait=False) and goes straight back to
training. At the end a fresh FSDP2 model is filled from the last
checkpoint with shardd.torch.load_state_dict, and rank 0 checks that
transformers' from_pretrained of the same folder holds the trained weights.

    shardd --root /tmp/ckpt --socket /tmp/shardd.sock &
    SHARDD_SOCKET=/tmp/shardd.sock torchrun --nproc-per-node 4 fsdp2_save.py --dir run1

Needs torch >= 2.6 and transformers; nothing is downloaded.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM, LlamaConfig
from transformers.utils import logging

logging.disable_progress_bar()

import shardd.torch as st


def model(config, seed, mesh):
    torch.manual_seed(seed)
    m = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    for layer in m.model.layers:
        fully_shard(layer, mesh=mesh)
    return fully_shard(m, mesh=mesh)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="fsdp2-example", help="checkpoint folder under the daemon's root")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--every", type=int, default=3, help="save every N steps")
    ap.add_argument("--max-shard-size", default="200KB")
    args = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=True)
    m = model(config, 0, mesh)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    data = torch.Generator().manual_seed(rank)
    pending, last = None, None
    for step in range(1, args.steps + 1):
        ids = torch.randint(0, config.vocab_size, (2, 16), generator=data)
        loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step % args.every == 0:
            if pending is not None:
                pending.wait()  # one save in flight at a time
            t0 = time.perf_counter()
            pending = st.save_pretrained(m, "%s/step-%d" % (args.dir, step), max_shard_size=args.max_shard_size,
                                         overwrite=True, wait=False)
            last = step
            if rank == 0:
                print("step %d: loss %.4f, save handed over in %.3f s" % (step, loss.item(),
                                                                        time.perf_counter() - t0))
    result = pending.wait()
    if rank == 0:
        print("step %d: committed %s (%d files, %d bytes)" % (last, result["dir"], result["files"],
                                                              result["bytes"]))

    # Resume: a fresh model with other weights, filled from the checkpoint, each rank its own shards.
    fresh = model(config, 1, mesh)
    sd = fresh.state_dict()
    st.load_state_dict(result["dir"], sd)
    trained = {k: v.full_tensor() for k, v in m.state_dict().items()}
    resumed = {k: v.full_tensor() for k, v in sd.items()}
    same = all(torch.equal(trained[k], resumed[k]) for k in trained)
    if rank == 0:
        hf = AutoModelForCausalLM.from_pretrained(result["dir"]).state_dict()
        same = same and all(torch.equal(trained[k], hf[k]) for k in trained)
        print("resumed from %s: %s" % (result["dir"], "bit-equal to the trained model" if same else "DIFFERENT"))
    dist.barrier()  # nobody tears the group down while rank 0 still reads
    dist.destroy_process_group()
    # Past this point gloo's threads can abort the interpreter's own teardown; nothing is left to do.
    sys.stdout.flush()
    os._exit(0 if same else 1)


if __name__ == "__main__":
    main()
