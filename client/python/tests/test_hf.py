#!/usr/bin/env python3
# save_pretrained and load_state_dict under FSDP2, TP, FSDP2 x TP, HSDP and an odd world, judged by transformers, safetensors and huggingface_hub.
"""Tiny Llama and Qwen2 models, built in code from their configs (with and
without tie_word_embeddings, bf16 and f32), are saved by real gloo ranks
with shardd.torch.save_pretrained under five layouts, each through a real
daemon. Every checkpoint is compared with what model.save_pretrained writes
for an unsharded copy of the same model: the same files holding the same
tensors bit for bit (safetensors.safe_open), an equal index and configs,
huggingface_hub's split_torch_state_dict_into_shards file map, and
from_pretrained logits that are torch.equal. Each layout then loads the
previous layout's checkpoint (the first loads save_pretrained's) into a
differently initialised model with load_state_dict, bit-exact.

Environment as for test_binding.py. Exits 77 (skipped) without torch >= 2.6,
transformers, safetensors or huggingface_hub. `--worker JSON` is one rank.
"""
import json
import os
import shutil
import sys
import tempfile
import unittest

try:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    import transformers
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config
    from safetensors import safe_open
    from huggingface_hub import split_torch_state_dict_into_shards
except ImportError as e:
    print("torch >= 2.6, transformers, safetensors or huggingface_hub is missing (%s): skipping; "
          "scripts/deps.sh shardd_venv makes the venv that has them" % e)
    sys.exit(77)

import suite
import shardd.torch as st
from test_binding import Daemon
from st_reader import data_crc32c
from torch_world import answer, WAIT, init, raw, run_world

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

# Small enough that every model gives several files, and a tensor (embeddings, lm_head, MLPs in
# f32) larger than the limit gets a file of its own.
MAX_SHARD = "20KB"
MODELS = {
    "llama-tied-bf16": (LlamaConfig, True, torch.bfloat16),
    "llama-f32": (LlamaConfig, False, torch.float32),
    "qwen2-tied-f32": (Qwen2Config, True, torch.float32),
    "qwen2-bf16": (Qwen2Config, False, torch.bfloat16),
}
# (name, world size, the placements its state dict holds); each loads the checkpoint the one
# before it saved.
LAYOUTS = [("fsdp4", 4, ["Shard"]), ("tp2", 2, ["Shard"]), ("fsdp_tp", 4, ["Shard", "_StridedShard"]),
           ("hsdp", 4, ["Replicate", "Shard"]), ("fsdp3", 3, ["Shard"])]
COLWISE = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROWWISE = ("o_proj", "down_proj")


def build(model, seed):
    cls, tied, dtype = MODELS[model]
    cfg = cls(vocab_size=200, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied,
              max_position_embeddings=64)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg, dtype=dtype)


def tp_plan():
    plan = {}
    for i in range(2):
        for part in COLWISE + ROWWISE:
            where = "self_attn" if part in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            plan["model.layers.%d.%s.%s" % (i, where, part)] = (
                ColwiseParallel() if part in COLWISE else RowwiseParallel())
    return plan


def parallelize(m, layout, world):
    if layout == "tp2":
        parallelize_module(m, init_device_mesh("cpu", (world,)), tp_plan())
    elif layout == "fsdp_tp":
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        parallelize_module(m, mesh["tp"], tp_plan())
        for layer in m.model.layers:
            fully_shard(layer, mesh=mesh["dp"])
        fully_shard(m, mesh=mesh["dp"])
    else:
        mesh = (init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
                if layout == "hsdp" else init_device_mesh("cpu", (world,)))
        for layer in m.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(m, mesh=mesh)
    return m


def full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def worker(args):
    rank, world = init()
    layout, out = args["layout"], {}
    for name in MODELS:
        m = parallelize(build(name, 1234), layout, world)
        kinds = sorted({type(p).__name__ for v in m.state_dict().values()
                        for p in getattr(v, "placements", ())})
        r = st.save_pretrained(m, "%s/%s" % (layout, name), max_shard_size=MAX_SHARD, timeout=WAIT)
        # Another parallelization's checkpoint into a model that starts from other weights.
        fresh = parallelize(build(name, 99), layout, world)
        sd = fresh.state_dict()
        src = os.path.join(args["from"], name)
        missing, unexpected = st.load_state_dict(src, sd)
        ref = _ref_tensors(args["ref"], name)
        equal = {k: raw(full(v)) == raw(ref[k if k in ref else _tied_source(name, k)])
                 for k, v in sd.items()}
        out[name] = {"files": r["files"], "equal": equal, "missing": missing, "unexpected": unexpected,
                     "placements": kinds}
    return out


def _ref_tensors(ref, name):
    out = {}
    folder = os.path.join(ref, name)
    for f in os.listdir(folder):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(folder, f), "pt") as h:
                out.update({k: h.get_tensor(k) for k in h.keys()})
    return out


def _tied_source(name, key):
    assert MODELS[name][1] and key == "lm_head.weight", key
    return "model.embed_tokens.weight"


def shards(folder):
    """{file: {tensor: bytes}} of every .safetensors file in folder."""
    out = {}
    for f in sorted(os.listdir(folder)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(folder, f), "pt") as h:
                out[f] = {k: raw(h.get_tensor(k)) for k in h.keys()}
    return out


def check_same_files(test, ref, got, label):
    """The folder got against transformers' ref: file names, each file's tensors bit for bit, and
    the JSON files (the index, config.json, generation_config.json) equal, but for the index's
    added checksums (each file's data CRC-32C, which from_pretrained ignores)."""
    test.assertEqual(sorted(os.listdir(got)), sorted(os.listdir(ref)), label)
    ref_shards, got_shards = shards(ref), shards(got)
    test.assertEqual({f: sorted(t) for f, t in got_shards.items()}, {f: sorted(t) for f, t in ref_shards.items()},
                     label)
    test.assertEqual(got_shards, ref_shards, label + ": tensors differ")
    for f in sorted(os.listdir(ref)):
        if not f.endswith(".json"):
            continue
        with open(os.path.join(got, f)) as a, open(os.path.join(ref, f)) as b:
            mine, theirs = json.load(a), json.load(b)
        if f.endswith(".index.json"):
            sums = mine["metadata"].pop("shardd_data_crc32c")
            test.assertEqual(sums, {s: "%08x" % data_crc32c(os.path.join(got, s)) for s in got_shards}, label)
        test.assertEqual(mine, theirs, "%s: %s" % (label, f))


def logits(folder):
    m = AutoModelForCausalLM.from_pretrained(folder)
    ids = torch.arange(24).reshape(2, 12) % 200
    with torch.no_grad():
        return m(input_ids=ids).logits


class SavePretrained(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon()
        cls.ref = tempfile.mkdtemp(prefix="shardd-hf-ref-")
        cls.ref_logits = {}
        for name in MODELS:
            m = build(name, 1234)
            m.save_pretrained(os.path.join(cls.ref, name), max_shard_size=MAX_SHARD)
            cls.ref_logits[name] = logits(os.path.join(cls.ref, name))

    @classmethod
    def tearDownClass(cls):
        cls.d.stop()
        shutil.rmtree(cls.ref, ignore_errors=True)

    def check_folder(self, name, got):
        ref = os.path.join(self.ref, name)
        check_same_files(self, ref, got, name)
        ref_shards = shards(ref)
        self.assertGreater(len(ref_shards), 2, "%s: max_shard_size gives one file" % name)
        self.assertTrue(any(len(t) == 1 and len(next(iter(t.values()))) > 20000
                            for t in ref_shards.values()), name + ": no tensor over the limit")
        # huggingface_hub's own split of the unsharded model's saved tensors, in state-dict order.
        with open(os.path.join(got, "model.safetensors.index.json")) as f:
            weight_map = json.load(f)["weight_map"]
        sd = build(name, 1234).state_dict()
        split = split_torch_state_dict_into_shards({k: v for k, v in sd.items() if k in weight_map},
                                                   max_shard_size=MAX_SHARD)
        self.assertEqual(split.tensor_to_filename, weight_map, name)
        self.assertTrue(torch.equal(logits(got), self.ref_logits[name]), name + ": logits differ")

    def test_layouts(self):
        previous = self.ref
        for layout, world, placements in LAYOUTS:
            with self.subTest(layout=layout):
                out = run_world(__file__, world, {"layout": layout, "ref": self.ref, "from": previous},
                                {"SHARDD_SOCKET": self.d.socket})
                for name in MODELS:
                    self.check_folder(name, os.path.join(self.d.root, layout, name))
                    for rank, r in enumerate(out):
                        got = r[name]
                        self.assertTrue(all(got["equal"].values()),
                                        "%s %s rank %d loaded from %s: %s" % (layout, name, rank, previous,
                                                                               got["equal"]))
                        self.assertEqual((got["missing"], got["unexpected"]), ([], []))
                        self.assertEqual(got["placements"], placements, (layout, name))
                print("%s: %d ranks, %d models saved as save_pretrained does and loaded from %s"
                      % (layout, world, len(MODELS), os.path.basename(previous)))
            previous = os.path.join(self.d.root, layout)


def main():
    return suite.run(__name__, lambda args: answer(worker(args)))


if __name__ == "__main__":
    sys.exit(main())
