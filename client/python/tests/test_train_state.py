#!/usr/bin/env python3
# Whole training checkpoints through save_state_dict/load_state_dict: model, optimizer (in files of its own prefix) and train state nested, saved under FSDP2 x 4, resumed under FSDP2 x 4 and TP x 2 with the same loss curve, bit for bit.
"""Real gloo ranks train a tiny Llama with AdamW for 3 steps under FSDP2 x 4,
save {"model": get_model_state_dict, "optimizer": get_optimizer_state_dict,
"train_state": {"step", "losses"}} in one save, and train 3 more steps. A
fresh FSDP2 x 4 world loads it into other weights and a fresh optimizer and
trains the same 3 steps: the losses equal the uninterrupted run's bit for bit.
A TP x 2 world loads it too: every model and optimizer tensor equals the
saved one bit for bit, the step and lr come back, and its next 3 losses are
the uninterrupted run's, bit for bit. The model's
tensors keep their HF names and model-*.safetensors files, so from_pretrained
of the folder gives the trained weights and equal logits; the optimizer's are
in optimizer-*.safetensors files of their own, in the one index, and pass
verify --deep.
A plain value that is not JSON-able is refused by name before anything is sent.
Over the protocol, in-process ranks check shardd.save's prefixes (file series,
a disagreement, a bad prefix) and file_parts (one file of every rank's part in
rank order; a part against a whole file is a conflict).

Environment as for test_binding.py. Exits 77 (skipped) without torch >= 2.6
or transformers. `--worker JSON` is one rank.
"""
import hashlib
import json
import os
import subprocess
import sys
import threading
import unittest

try:
    import torch
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                         set_model_state_dict, set_optimizer_state_dict)
    import test_hf
except (ImportError, SystemExit) as e:
    print("torch >= 2.6 or transformers is missing (%s): skipping" % e)
    sys.exit(77)

import suite
import shardd
import shardd.torch as st
from test_binding import Daemon
from torch_world import WAIT, answer, init, run_world

MODEL = "llama-f32"


def train_step(m, opt, step):
    """One step on a batch every rank and layout sees alike; the loss as exact hex."""
    g = torch.Generator().manual_seed(step)
    ids = torch.randint(0, 200, (2, 8), generator=g)
    loss = m(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item().hex()


def digest(sd):
    """One hash over every tensor of a nested state dict, whole (DTensors gathered), by name."""
    h = hashlib.sha256()

    def walk(prefix, v):
        if isinstance(v, dict):
            for k in sorted(v, key=str):
                walk(prefix + "." + str(k), v[k])
        elif isinstance(v, torch.Tensor):
            t = test_hf.full(v).detach().contiguous()
            h.update(prefix.encode() + str(t.dtype).encode() + t.reshape(-1).view(torch.uint8).numpy().tobytes())
    walk("", sd)
    return h.hexdigest()


def logits(model_sd):
    """The logits on a fixed batch of an unsharded model holding these weights (gathered on every
    rank): what from_pretrained of the checkpoint must give."""
    ref = test_hf.build(MODEL, 0)
    ref.load_state_dict({k: test_hf.full(v).detach() for k, v in model_sd.items()})
    ref.eval()
    with torch.no_grad():
        return ref(input_ids=torch.arange(16).reshape(2, 8)).logits.reshape(-1).tolist()


def whole(m, opt, step):
    return {"model": get_model_state_dict(m), "optimizer": get_optimizer_state_dict(m, opt),
            "train_state": {"step": step, "lr": opt.param_groups[0]["lr"]}}


def worker(args):
    rank, world = init()
    layout, out = args["layout"], {}
    seed = 1234 if args["mode"] == "save" else 99
    m = test_hf.parallelize(test_hf.build(MODEL, seed), layout, world)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    if args["mode"] == "save":
        out["losses"] = [train_step(m, opt, s) for s in (1, 2, 3)]
        sd = whole(m, opt, 3)
        st.save_state_dict(sd, args["dir"], timeout=WAIT, max_shard_size="100KB", files={"config.json": m.config.to_json_string()})
        out["digest"], out["model_digest"] = digest(sd), digest({"model": sd["model"]})
        out["logits"] = logits(sd["model"])
        out["later"] = [train_step(m, opt, s) for s in (4, 5, 6)]
        try:
            st.save_state_dict({"model": get_model_state_dict(m), "extra": {"when": object()}}, "refused",
                               timeout=WAIT)
            out["refused"] = None
        except TypeError as e:
            out["refused"] = str(e)
        return out
    sd = whole(m, opt, 0)
    sd["train_state"]["lr"] = 0.5
    st.load_state_dict(args["path"], sd)
    set_model_state_dict(m, sd["model"])
    set_optimizer_state_dict(m, opt, sd["optimizer"])
    out["step"], out["lr"] = sd["train_state"]["step"], sd["train_state"]["lr"]
    out["digest"] = digest(whole(m, opt, out["step"]))
    out["later"] = [train_step(m, opt, s) for s in (4, 5, 6)]
    return out


D = None


class TrainState(unittest.TestCase):
    def test_save_kill_resume(self):
        env = {"SHARDD_SOCKET": D.socket}
        saved = run_world(__file__, 4, {"layout": "fsdp4", "mode": "save", "dir": "run/step-3"}, env)
        path = os.path.join(D.root, "run", "step-3")
        self.assertEqual(len({r["digest"] for r in saved}), 1)
        self.assertIn("'extra']['when'] is a object", saved[0]["refused"])
        self.assertFalse(os.path.exists(os.path.join(D.root, "refused")))
        # The model's weights under their own names: from_pretrained reads them (the optimizer's
        # tensors beside them are keys it does not know, and leaves alone).
        from transformers import AutoModelForCausalLM
        files = os.listdir(path)
        self.assertIn("shardd_state.json", files)
        index = json.load(open(os.path.join(path, "model.safetensors.index.json")))
        wm = index["weight_map"]
        # The model's tensors in model-*.safetensors, the optimizer's in optimizer-*.safetensors, each
        # series numbered alone; the index and the deep check cover both.
        self.assertRegex(wm["model.layers.0.self_attn.q_proj.weight"], r"\Amodel-\d{5}-of-\d{5}\.safetensors\Z")
        self.assertRegex(wm["optimizer.state.model.layers.0.self_attn.q_proj.weight.exp_avg"],
                         r"\Aoptimizer-\d{5}-of-\d{5}\.safetensors\Z")
        for name, file in wm.items():
            self.assertTrue(file.startswith("optimizer-" if name.startswith("optimizer.") else "model-"), (name, file))
        series = {f.split("-")[0]: f.split("-of-")[1] for f in set(wm.values())}
        counts = {k: sum(1 for f in set(wm.values()) if f.startswith(k + "-")) for k in series}
        self.assertEqual({k: int(series[k].split(".")[0]) for k in series}, counts)
        self.assertEqual(sorted(n for n in files if n.endswith(".safetensors")), sorted(set(wm.values())))
        p = subprocess.run([os.environ["SHARDCTL"], "verify", "--deep", path], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("%d files" % len(set(wm.values())), p.stdout + p.stderr)
        back, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
        self.assertEqual(info["missing_keys"], [] if isinstance(info["missing_keys"], list) else set())
        self.assertEqual(digest({"model": back.state_dict()}), saved[0]["model_digest"])
        ids = torch.arange(16).reshape(2, 8)
        self.assertEqual(back(input_ids=ids).logits.detach().reshape(-1).tolist(), saved[0]["logits"])
        print("files: %s; verify --deep: %s" % (", ".join("%s x %d" % kv for kv in sorted(counts.items())),
                                                p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""))
        # The killed job's model at step 3, resumed from the checkpoint by a fresh world of the same
        # layout: the same three next losses, bit for bit.
        again = run_world(__file__, 4, {"layout": "fsdp4", "mode": "resume", "path": path}, env)
        self.assertEqual([r["later"] for r in again], [r["later"] for r in saved])
        self.assertEqual(again[0]["digest"], saved[0]["digest"])
        self.assertEqual((again[0]["step"], again[0]["lr"]), (3, 1e-2))
        # Another layout: every model and optimizer tensor as saved, and the plain values.
        tp = run_world(__file__, 2, {"layout": "tp2", "mode": "resume", "path": path}, env)
        self.assertEqual(tp[0]["digest"], saved[0]["digest"])
        self.assertEqual((tp[0]["step"], tp[0]["lr"]), (3, 1e-2))
        # And it trains on as the uninterrupted run did: the same losses, bit for bit.
        self.assertEqual([r["later"] for r in tp], [r["later"] for r in saved[:2]])
        print("losses 4-6: uninterrupted %s, resumed FSDP2 x 4 %s, resumed TP x 2 %s"
              % tuple([float.fromhex(x) for x in r[0]["later"]] for r in (saved, again, tp)))

    def test_file_prefixes_over_the_protocol(self):
        """shardd.save's prefixes: two ranks' tensors of one series in files of their own under the
        one index, read back by the strict reader and verify --deep; a rank that disagrees fails
        the save for both with mismatch naming the tensor; a prefix that is no file name is refused."""
        w = torch.arange(24, dtype=torch.float32).reshape(4, 6)
        errors, barrier = [None, None], threading.Barrier(2)

        def rank(r, dir, prefixes):
            try:
                barrier.wait(WAIT)
                shardd.save({"w": shardd.Slice(w[2 * r:2 * r + 2], (4, 6), (2 * r, 0)), "w.m": w[0] * 2,
                             "w.v": w[0] * 3}, dir, rank=r, world_size=2, ordered=False, timeout=WAIT,
                            prefixes=prefixes[r], socket=D.socket, save_id="series-" + dir.replace("/", "-"))
            except shardd.ShardError as e:
                errors[r] = e

        def both(dir, prefixes):
            threads = [threading.Thread(target=rank, args=(r, dir, prefixes)) for r in (0, 1)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(2 * WAIT)

        opt = {"w.m": "optim", "w.v": "optim"}
        both("series/ok", [opt, opt])
        self.assertEqual(errors, [None, None])
        folder = os.path.join(D.root, "series", "ok")
        wm = json.load(open(os.path.join(folder, "model.safetensors.index.json")))["weight_map"]
        self.assertEqual(wm, {"w": "model.safetensors", "w.m": "optim.safetensors", "w.v": "optim.safetensors"})
        with shardd.Checkpoint(folder) as ck:
            self.assertEqual(ck.read("w", framework="torch").tolist(), w.tolist())
            self.assertEqual(ck.read("w.m", framework="torch").tolist(), (w[0] * 2).tolist())
        p = subprocess.run([os.environ["SHARDCTL"], "verify", "--deep", folder], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("2 files, 3 tensors", p.stdout)

        both("series/mismatch", [opt, {"w.m": "optim"}])
        for e in errors:
            self.assertEqual(e.name, "mismatch")
            self.assertIn("tensor 'w.v': rank", e.message)
            self.assertIn("files of prefix", e.message)
        self.assertFalse(os.path.exists(os.path.join(D.root, "series", "mismatch")))

        with self.assertRaises(shardd.ShardError) as cm:
            shardd.save({"x": w}, "series/bad", prefixes={"x": "a/b"}, socket=D.socket, timeout=WAIT)
        self.assertEqual(cm.exception.name, "invalid_argument")
        self.assertIn("prefix 'a/b'", cm.exception.message)
        self.assertFalse(os.path.exists(os.path.join(D.root, "series", "bad")))

    def test_file_parts_over_the_protocol(self):
        """shardd.save's file_parts: three ranks' parts of one file, sent in any order, written as
        one file in rank order (rank 1 sends none); a rank sending the name as a whole file instead
        fails the save for every rank with conflict."""
        errors, barrier = [None] * 3, threading.Barrier(3)

        def rank(r, dir, whole):
            try:
                parts = {} if r == 1 else {"log.jsonl": b'{"rank": %d}\n' % r}
                files = {"log.jsonl": b"all"} if whole and r == 2 else None
                if files:
                    parts = {}
                barrier.wait(WAIT)
                shardd.save({"x": torch.full((3,), float(r))} if r == 0 else {}, dir, rank=r, world_size=3,
                            file_parts=parts, files=files, timeout=WAIT, socket=D.socket,
                            save_id="parts-" + dir.replace("/", "-"))
            except shardd.ShardError as e:
                errors[r] = e

        def all_ranks(dir, whole):
            threads = [threading.Thread(target=rank, args=(r, dir, whole)) for r in (2, 0, 1)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(2 * WAIT)

        all_ranks("parts/ok", False)
        self.assertEqual(errors, [None] * 3)
        with open(os.path.join(D.root, "parts", "ok", "log.jsonl"), "rb") as f:
            self.assertEqual(f.read(), b'{"rank": 0}\n{"rank": 2}\n')
        all_ranks("parts/clash", True)
        for e in errors:
            self.assertEqual(e.name, "conflict")
            self.assertIn("file 'log.jsonl': rank", e.message)
        self.assertFalse(os.path.exists(os.path.join(D.root, "parts", "clash")))


def main():
    def daemons():
        global D
        D = Daemon()
        return [D]
    return suite.run(__name__, lambda args: answer(worker(args)), daemons=daemons)


if __name__ == "__main__":
    sys.exit(main())
