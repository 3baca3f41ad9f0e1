#!/usr/bin/env python3
# save_pretrained of wrapped models: torch.compile, DataParallel and DDP unwrapped (equal logits after from_pretrained); a PEFT model's adapter as PEFT writes it (equal logits after PeftModel.from_pretrained); any other module refused with nothing published.
"""One process, one real daemon, a tiny Llama. Each wrapper transformers and
accelerate unwrap is saved with shardd.torch.save_pretrained, and the folder
must load with from_pretrained to logits torch.equal to the model's, with the
model's class in config.json. A PEFT LoRA model (where peft is installed)
writes what its own save_pretrained writes: the same two files, the same
tensors bit for bit and the same adapter config, and PeftModel.from_pretrained
of the folder gives logits torch.equal to the model's. Every other module (an
nn.Sequential around the model, a bare nn.Linear, a PEFT model inside one)
raises TypeError naming its class, and nothing is published.

Environment as for test_binding.py. Exits 77 (skipped) without torch or transformers.
"""
import json
import os
import sys
import unittest

try:
    import torch
    import torch.distributed as dist
    import transformers
    from transformers import AutoModelForCausalLM, LlamaConfig
except ImportError as e:
    print("torch or transformers is missing (%s): skipping" % e)
    sys.exit(77)

import suite
import shardd.torch as st
from test_binding import Daemon

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()
D = None


def tiny(seed=0):
    cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


IDS = torch.arange(16).reshape(2, 8)


class Wrapped(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not dist.is_initialized():
            # One rank: an in-process store, no port to race for.
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)

    def saved_equal(self, wrapped, model, name, **kwargs):
        st.save_pretrained(wrapped, "wrapped/" + name, **kwargs)
        path = os.path.join(D.root, "wrapped", name)
        with open(os.path.join(path, "config.json")) as f:
            self.assertEqual(json.load(f)["architectures"], ["LlamaForCausalLM"], name)
        back, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
        self.assertEqual({k: v for k, v in info.items() if v}, {}, name)
        with torch.no_grad():
            self.assertTrue(torch.equal(back.eval()(IDS).logits, model(IDS).logits), name)

    def test_unwrapped(self):
        model = tiny()
        compiled = torch.compile(model)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        cases = {"compile": compiled, "data-parallel": torch.nn.DataParallel(model), "ddp": ddp,
                 "compile-of-ddp": torch.compile(ddp)}
        for name, wrapped in cases.items():
            with self.subTest(name):
                self.saved_equal(wrapped, model, name)
        # A state dict taken from the wrapper: its prefixes are taken off too.
        self.saved_equal(compiled, model, "compile-state-dict", state_dict=compiled.state_dict())
        print("saved and loaded equal: %s, compile-state-dict" % ", ".join(cases))

    def refused(self, module, name, words):
        with self.assertRaises(TypeError) as cm:
            st.save_pretrained(module, "refused/" + name)
        for w in words:
            self.assertIn(w, str(cm.exception))
        self.assertFalse(os.path.exists(os.path.join(D.root, "refused", name)), name)
        print("refused %s: %s" % (name, cm.exception))

    def test_refused(self):
        model = tiny()
        self.refused(torch.nn.Sequential(model), "sequential", ["torch.nn.modules.container.Sequential"])
        self.refused(torch.nn.Linear(4, 4), "linear", ["Linear"])
        try:
            import peft
        except ImportError:
            print("peft is not installed: its refusal is the generic one above")
            return
        lora = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
        self.refused(torch.nn.Sequential(lora), "peft-in-sequential", ["Sequential"])

    def test_peft_adapter(self):
        try:
            import peft
            from safetensors.torch import load_file
        except ImportError:
            self.skipTest("peft is not installed")
        # init_lora_weights=False: an adapter that changes the logits, so loading it is seen.
        lora = peft.get_peft_model(tiny(), peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                           init_lora_weights=False)).eval()
        st.save_pretrained(lora, "wrapped/peft")
        path = os.path.join(D.root, "wrapped", "peft")
        self.assertEqual(sorted(os.listdir(path)), ["adapter_config.json", "adapter_model.safetensors"])
        # What PEFT's own save_pretrained writes: the same tensors, bit for bit, and the same config.
        ref = os.path.join(D.root, "peft-ref")
        lora.save_pretrained(ref)
        got, want = load_file(os.path.join(path, "adapter_model.safetensors")), load_file(
            os.path.join(ref, "adapter_model.safetensors"))
        self.assertEqual(sorted(got), sorted(want))
        for k in want:
            self.assertTrue(torch.equal(got[k], want[k]), k)
        with open(os.path.join(path, "adapter_config.json")) as a, open(os.path.join(ref, "adapter_config.json")) as b:
            self.assertEqual(json.load(a), json.load(b))
        back = peft.PeftModel.from_pretrained(tiny(), path).eval()
        with torch.no_grad():
            self.assertTrue(torch.equal(back(IDS).logits, lora(IDS).logits))
            self.assertFalse(torch.equal(tiny()(IDS).logits, lora(IDS).logits), "the adapter changes nothing")
        print("peft: %d adapter tensors as PEFT writes them; PeftModel.from_pretrained logits equal" % len(got))


def main():
    global D

    def daemons():
        global D
        D = Daemon()
        os.environ["SHARDD_SOCKET"] = D.socket
        return [D]
    return suite.run(__name__, daemons=daemons)


if __name__ == "__main__":
    sys.exit(main())
