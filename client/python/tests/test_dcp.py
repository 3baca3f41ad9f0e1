#!/usr/bin/env python3
# torch.distributed.checkpoint through shardd: dcp.save, dcp.async_save and dcp.load with FSDP2 and TP, bit-equal.
"""Real gloo ranks save a tiny Llama's state dict (DTensors) with dcp.save
and dcp.async_save through shardd.torch.StorageWriter, under FSDP2 x 4 and
TP x 2 (the TP world loads the FSDP2 checkpoint and the other way round,
through StorageReader), and a save_pretrained folder is loaded by dcp.load
too. Every checkpoint is read back with safetensors and compared bit for
bit with the unsharded model. Each layout also saves DCP's standard
training checkpoint ({model, optim, step, lr_scheduler, rng}: the optimizer's
tensors in optim-* files of their own, DCP's bytes items in one file beside
the shards, each rank's part of it joined by the daemon, in the same save) with dcp.save and
dcp.async_save, and loads it into a fresh model and optimizer: every tensor
bit-equal, the step, the scheduler's lr and the RNG state back.

Environment as for test_binding.py. Exits 77 (skipped) without torch >= 2.6,
transformers or safetensors. `--worker JSON` is one rank.
"""
import json
import os
import shutil
import sys
import tempfile
import unittest

try:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from safetensors import safe_open
    import test_hf
except (ImportError, SystemExit) as e:
    print("torch >= 2.6, transformers or safetensors is missing (%s): skipping" % e)
    sys.exit(77)

import suite
import shardd.torch as st
from test_binding import Daemon
from torch_world import WAIT, answer, init, raw, run_world

MODEL = "llama-f32"
BF16 = "qwen2-bf16"


def worker(args):
    rank, world = init()
    layout, out = args["layout"], {}
    for name in (MODEL, BF16):
        m = test_hf.parallelize(test_hf.build(name, 1234), layout, world)
        sd = get_model_state_dict(m)
        dcp.save(sd, storage_writer=st.StorageWriter("%s/%s" % (layout, name), timeout=WAIT))
        dcp.async_save(sd, storage_writer=st.StorageWriter("%s/%s-async" % (layout, name),
                                                           timeout=WAIT)).result()
        # The other layout's checkpoint (or save_pretrained's), into other weights.
        fresh = test_hf.parallelize(test_hf.build(name, 99), layout, world)
        sd2 = get_model_state_dict(fresh)
        dcp.load(sd2, storage_reader=st.StorageReader(os.path.join(args["from"], name)))
        ref = test_hf._ref_tensors(args["ref"], name)
        out[name] = {k: raw(test_hf.full(v)) == raw(ref[k]) for k, v in sd2.items()}
    out["whole"] = whole_training_state(layout, world)
    return out


def whole_training_state(layout, world):
    """DCP's standard training checkpoint, {model, optim, step, lr_scheduler, rng}, saved with
    dcp.save and dcp.async_save and loaded back into a fresh model and optimizer."""
    from test_train_state import digest, train_step
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                         set_model_state_dict, set_optimizer_state_dict)

    def state(seed):
        m = test_hf.parallelize(test_hf.build(MODEL, seed), layout, world)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        return m, opt, sched

    m, opt, sched = state(1234)
    train_step(m, opt, 1)
    sched.step()
    torch.manual_seed(77)
    sd = {"model": get_model_state_dict(m), "optim": get_optimizer_state_dict(m, opt), "step": 1,
          "lr_scheduler": sched.state_dict(), "rng": torch.get_rng_state()}
    dcp.save(sd, storage_writer=st.StorageWriter("%s/whole" % layout, timeout=WAIT, max_shard_size="100KB",
                                                 files={"config.json": m.config.to_json_string()}))
    dcp.async_save(sd, storage_writer=st.StorageWriter("%s/whole-async" % layout, timeout=WAIT)).result()
    out = {"saved": digest({"model": sd["model"], "optim": sd["optim"]}), "model": digest({"model": sd["model"]})}
    for suffix in ("", "-async"):
        m2, opt2, sched2 = state(99)
        sd2 = {"model": get_model_state_dict(m2), "optim": get_optimizer_state_dict(m2, opt2), "step": 0,
               "lr_scheduler": sched2.state_dict(), "rng": torch.zeros_like(torch.get_rng_state())}
        dcp.load(sd2, storage_reader=st.StorageReader(os.path.join(os.environ["SHARDD_ROOT"], layout,
                                                                   "whole" + suffix)))
        set_model_state_dict(m2, sd2["model"])
        set_optimizer_state_dict(m2, opt2, sd2["optim"])
        sched2.load_state_dict(sd2["lr_scheduler"])
        out["loaded" + suffix] = {"digest": digest({"model": sd2["model"], "optim": sd2["optim"]}),
                                  "step": sd2["step"], "lr": sched2.get_last_lr()[0],
                                  "rng": torch.equal(sd2["rng"], sd["rng"])}
    return out


class DCP(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon()
        cls.ref = tempfile.mkdtemp(prefix="shardd-dcp-ref-")
        for name in (MODEL, BF16):
            test_hf.build(name, 1234).save_pretrained(os.path.join(cls.ref, name))

    @classmethod
    def tearDownClass(cls):
        cls.d.stop()
        shutil.rmtree(cls.ref, ignore_errors=True)

    def test_save_async_save_load(self):
        previous = self.ref
        for layout, world in (("fsdp4", 4), ("tp2", 2)):
            out = run_world(__file__, world, {"layout": layout, "ref": self.ref, "from": previous},
                            {"SHARDD_SOCKET": self.d.socket, "SHARDD_ROOT": self.d.root})
            for name in (MODEL, BF16):
                ref = test_hf.shards(os.path.join(self.ref, name))
                want = {k: b for t in ref.values() for k, b in t.items()}
                for suffix in ("", "-async"):
                    got = test_hf.shards(os.path.join(self.d.root, layout, name + suffix))
                    self.assertEqual({k: b for t in got.values() for k, b in t.items()}, want,
                                     (layout, name + suffix))
                for rank, r in enumerate(out):
                    self.assertTrue(all(r[name].values()), (layout, name, rank, r[name]))
            for r in out:
                for suffix in ("", "-async"):
                    self.assertEqual(r["whole"]["loaded" + suffix], {"digest": r["whole"]["saved"], "step": 1,
                                                                     "lr": 5e-3, "rng": True}, (layout, suffix))
            folder = os.path.join(self.d.root, layout, "whole")
            # DCP's bytes items in one file, every rank's part of it (a JSON line each) joined by the daemon.
            self.assertEqual([n for n in os.listdir(folder) if n.startswith("shardd_dcp_bytes")],
                             ["shardd_dcp_bytes.jsonl"])
            parts = [json.loads(line) for line in open(os.path.join(folder, "shardd_dcp_bytes.jsonl"))]
            fqns = [fqn for part in parts for fqn in part["items"]]
            self.assertEqual(len(fqns), len(set(fqns)))
            # (the RNG state is a tensor: it is in the shards)
            self.assertTrue({"step", "lr_scheduler.last_epoch", "optim.param_groups.0.lr"} <= set(fqns), fqns)
            print("%s: %d bytes items in one file, parts from %d ranks" % (layout, len(fqns), len(parts)))
            # The model's tensors under their HF names in model-* files, the optimizer's under DCP's
            # in optim-* files of their own: from_pretrained of the same folder finds the model's weights.
            names = json.load(open(os.path.join(folder, "model.safetensors.index.json")))["weight_map"]
            self.assertRegex(names["model.layers.0.self_attn.q_proj.weight"], r"\Amodel-\d{5}-of-\d{5}\.safetensors\Z")
            self.assertRegex(names["optim.state.model.layers.0.self_attn.q_proj.weight.exp_avg"],
                             r"\Aoptim-\d{5}-of-\d{5}\.safetensors\Z")
            for name, file in names.items():
                self.assertTrue(file.startswith("optim-" if name.startswith("optim.") else "model-"), (name, file))
            from test_train_state import digest
            from transformers import AutoModelForCausalLM
            back = AutoModelForCausalLM.from_pretrained(folder)
            self.assertEqual(digest({"model": back.state_dict()}), out[0]["whole"]["model"], layout)
            print("%s: dcp.save and dcp.async_save bit-equal, dcp.load from %s bit-equal"
                  % (layout, os.path.basename(previous)))
            previous = os.path.join(self.d.root, layout)


def main():
    return suite.run(__name__, lambda args: answer(worker(args)))


if __name__ == "__main__":
    sys.exit(main())
