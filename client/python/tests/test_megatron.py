#!/usr/bin/env python3
# shardd.megatron on real Megatron-core models: gloo ranks save HF checkpoints from their shards and load them into other layouts, judged by transformers.
"""Tiny Megatron-core GPT models (Llama-style GQA with 2 query groups per TP
rank, tied and untied; Qwen2 with q/k/v biases; Mixtral MoE; Qwen2-MoE with
a gated shared expert), built on 4 gloo CPU ranks with a padded vocab (256
rows for HF's 250), are saved with
shardd.megatron.save_hf_weights through a real daemon under TP=2, TPxPP=2x2,
PPxVPP=2x2, TPxEP=2x2, EP=4 and EP=2 with grouped-GEMM experts (GroupedMLP,
its CUDA kernel replaced by matmuls in the test). For each checkpoint:
  - transformers' from_pretrained gives logits equal to the Megatron
    forward's on the same tokens within 1e-5 (f32);
  - every tensor's bytes equal those of the slow reference (gather every
    full tensor, map, write with safetensors);
  - load_hf_weights into another layout, into a differently initialised
    model, gives the same logits again.
Refusals: a config that disagrees, a family not in the table and a key
outside it are named before the daemon hears of a save.

One world of ranks runs every case (Megatron's parallel state is set up
again for each layout) so that the imports are paid once. Environment as
for test_binding.py. Exits 77 (skipped) without megatron-core, torch,
transformers or safetensors. `--worker JSON` is one rank.
"""
import json
import os
import shutil
import sys
import tempfile
import unittest

try:
    import megatron.core  # noqa: F401
    from transformers import AutoModelForCausalLM
    import test_hf  # exits 77 itself without torch, transformers, safetensors or huggingface_hub
except ImportError as e:
    print("megatron-core is missing (%s): skipping; scripts/deps.sh shardd_venv makes the venv that "
          "has it" % e)
    sys.exit(77)

import torch

import suite
import shardd
import shardd.megatron as sm
from shardd._megatron_map import Unmappable, segments
from shardd_daemon import Daemon
from torch_world import WAIT, answer, init, run_world
import megatron_world as mw

TP2, TPPP, VPP = dict(tp=2), dict(tp=2, pp=2), dict(pp=2, vpp=2)
TPEP, EP4, EP2_GROUPED = dict(tp=2, ep=2), dict(ep=4), dict(ep=2, grouped=True)
# (case, family, layout saved from, layout loaded into)
CASES = [
    ("llama-tied", "llama-tied", TP2, TPPP),
    ("llama", "llama", TPPP, VPP),
    ("qwen2", "qwen2", VPP, TP2),
    ("mixtral-tpep", "mixtral", TPEP, EP4),
    ("mixtral-ep4", "mixtral", EP4, TPPP),
    ("mixtral-grouped", "mixtral", EP2_GROUPED, TPEP),
    ("qwen2-moe", "qwen2_moe", TPEP, dict(pp=2, ep=2)),
]
# SHARDD_MEGATRON_CASES=a,b runs only those (while working on one).
if os.environ.get("SHARDD_MEGATRON_CASES"):
    CASES = [c for c in CASES if c[0] in os.environ["SHARDD_MEGATRON_CASES"].split(",")]


def worker(args):
    from megatron.core import parallel_state as ps

    rank, _ = init()
    mw.shims()
    scratch = args["scratch"]
    out = {}

    def keep(case, which, logits):
        if logits is not None and ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank() == 0:
            torch.save(logits, os.path.join(scratch, "%s.%s.pt" % (case, which)))

    for case, family, saved, loaded in CASES:
        cfg = mw.hf_config(family)
        chunks = mw.build(family, mw.layout(**saved), seed=1)
        keep(case, "megatron", mw.forward(chunks))
        result = sm.save_hf_weights(chunks, case, hf_config=cfg, timeout=WAIT, max_shard_size="40KB")
        os.makedirs(os.path.join(scratch, case), exist_ok=True)
        mw.reference(chunks, cfg, os.path.join(scratch, case, "model.safetensors"))
        other = mw.build(family, mw.layout(**loaded), seed=2)
        sm.load_hf_weights(other, os.path.join(args["root"], case))
        keep(case, "loaded", mw.forward(other))
        out[case] = {"files": result["files"] if isinstance(result, dict) and "files" in result else None}
    out["refused"] = refusals(args)
    answer(out)


def refusals(args):
    """Each a ShardError naming the field before the daemon hears of the save."""
    said = {}
    lay = mw.layout(tp=2)
    chunks = mw.build("llama", lay, seed=3)
    wrong = mw.hf_config("llama")
    wrong.num_key_value_heads = 8
    qwen = mw.hf_config("qwen2")
    for what, cfg in (("groups", wrong), ("bias", qwen), ("family", type(wrong).from_dict(dict(wrong.to_dict(), model_type="gpt2")))):
        try:
            sm.save_hf_weights(chunks, "refused-" + what, hf_config=cfg, timeout=WAIT)
            said[what] = None
        except shardd.ShardError as e:
            said[what] = [e.name, e.message]
    # The first case's folder: a model of another family, and one whose lm_head it lacks; then
    # grouped-GEMM experts, whose sharded tensors are copies (transposed) of weight1/weight2.
    tied = os.path.join(args["root"], CASES[0][0])
    for what, model, cfg in (("load-family", lambda: chunks, qwen),
                             ("load-missing", lambda: chunks, mw.hf_config("llama")),
                             ("load-grouped", lambda: mw.build("mixtral", mw.layout(ep=2, grouped=True), 3),
                              mw.hf_config("mixtral"))):
        try:
            sm.load_hf_weights(model(), tied, hf_config=cfg)
            said[what] = None
        except shardd.ShardError as e:
            said[what] = [e.name, e.message]
    return said


def hf_logits(path):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        return model(mw.TOKENS).logits


def tensors(folder):
    """{tensor: bytes} over every .safetensors file in folder."""
    return {k: v for part in test_hf.shards(folder).values() for k, v in part.items()}


class Megatron(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.scratch = tempfile.mkdtemp(prefix="shardd-megatron-")
        cls.d = Daemon()
        try:
            cls.out = run_world(__file__, 4, {"root": cls.d.root, "scratch": cls.scratch},
                                {"SHARDD_SOCKET": cls.d.socket}, timeout=12 * WAIT)[0]
        except BaseException:
            cls.tearDownClass()  # unittest skips it when setUpClass fails: no daemon left behind
            raise

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.scratch, ignore_errors=True)
        cls.d.stop()

    def logits(self, case, which):
        return torch.load(os.path.join(self.scratch, "%s.%s.pt" % (case, which)))

    def test_cases(self):
        for case, family, saved, loaded in CASES:
            with self.subTest(case=case):
                folder = os.path.join(self.d.root, case)
                megatron = self.logits(case, "megatron")
                self.assertEqual(tuple(megatron.shape), (2, 8, mw.VOCAB))
                hf = hf_logits(folder)
                diff = (hf - megatron).abs().max().item()
                self.assertLessEqual(diff, 1e-5, case)
                back = (self.logits(case, "loaded") - megatron).abs().max().item()
                self.assertLessEqual(back, 1e-5, case)
                got, ref = tensors(folder), tensors(os.path.join(self.scratch, case))
                self.assertEqual(sorted(got), sorted(ref), case)
                for k in ref:
                    self.assertEqual(got[k], ref[k], (case, k))
                self.assertEqual(len(got["model.embed_tokens.weight"]), mw.VOCAB * mw.HIDDEN * 4)
                self.assertEqual("lm_head.weight" in got, not family.endswith("tied"))
                files = [f for f in os.listdir(folder) if f.endswith(".safetensors")]
                self.assertGreater(len(files), 1, case)  # several files, so the index is used too
                with open(os.path.join(folder, "config.json")) as f:
                    self.assertEqual(json.load(f)["model_type"], family.split("-")[0])
                print("%s: saved %s, loaded %s: from_pretrained logits within %.2g, reloaded within %.2g, "
                      "%d tensors in %d files equal to the gathered reference"
                      % (case, saved, loaded, diff, back, len(got), len(files)))

    def test_refusals(self):
        said = self.out["refused"]
        self.assertEqual(said["groups"][0], "invalid_argument")
        self.assertIn("num_query_groups", said["groups"][1])
        self.assertIn("num_key_value_heads", said["groups"][1])
        self.assertIn("add_qkv_bias", said["bias"][1])
        self.assertIn("'gpt2'", said["family"][1])
        self.assertEqual(said["load-family"][0], "invalid_argument")
        self.assertIn("add_qkv_bias", said["load-family"][1])
        self.assertEqual(said["load-missing"][0], "mismatch")
        self.assertIn("'lm_head.weight' is missing", said["load-missing"][1])
        self.assertIn("experts.weight1", said["load-grouped"][1])
        for what in ("groups", "bias", "family"):
            self.assertFalse(os.path.exists(os.path.join(self.d.root, "refused-" + what)))
        with shardd.Client(self.d.socket) as c:
            self.assertEqual(c.status()["saves"], [])

    def test_unmapped_key_named(self):
        cfg = mw.hf_config("llama")
        with self.assertRaisesRegex(Unmappable, "'decoder.layers.mlp.linear_fc1.bias'.*layer 3"):
            segments("decoder.layers.mlp.linear_fc1.bias", (3,), (192,), cfg)
        with self.assertRaisesRegex(Unmappable, "linear_qkv.weight has 96 rows"):
            segments("decoder.layers.self_attention.linear_qkv.weight", (0,), (96, 64), cfg)
        # q, k, v of each query group, in order
        qkv = segments("decoder.layers.self_attention.linear_qkv.weight", (1,), (128, 64), cfg)
        self.assertEqual(qkv[:3], [("model.layers.1.self_attn.q_proj.weight", 0, 16, 0),
                                   ("model.layers.1.self_attn.k_proj.weight", 16, 8, 0),
                                   ("model.layers.1.self_attn.v_proj.weight", 24, 8, 0)])
        self.assertEqual(qkv[3][1:], (32, 16, 16))


if __name__ == "__main__":
    sys.exit(suite.run(__name__, worker))
