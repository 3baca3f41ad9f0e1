#!/usr/bin/env python3
# MoE models as transformers 5 holds them (fused experts) saved per expert by save_pretrained under FSDP2, EP, EP x DP and TP, loaded back across layouts.
"""Tiny Qwen3-MoE, Mixtral, DeepSeek-V3 (MLA, a shared expert,
first_k_dense_replace, e_score_correction_bias) and Qwen2-MoE models, built
in code (tied and untied, bf16 and f32), are saved by real gloo ranks with
shardd.torch.save_pretrained under the layouts MoE trainers use: FSDP2
over four ranks (uneven, fewer experts than ranks), torchtitan's expert
parallel (experts Shard(0) on ep, FSDP2 on efsdp giving _StridedShard or
Shard(1)), EP x DP (replicated experts written once) and TP on attention
and the experts' intermediate dim. Every folder is compared with what
model.save_pretrained writes for an unsharded copy: the same files holding
the same per-expert tensors bit for bit, an equal index and configs, and
from_pretrained logits that are torch.equal. Each layout loads the
previous layout's folder with load_state_dict(model=) and dcp.load
(StorageReader(model=)) into other weights, bit-exact, and saves its state
dict with dcp.save and dcp.async_save (fused names), read back by dcp.load.
transformers' own expert parallel (DistributedConfig: enable_expert_parallel,
ep_size with FSDP2 and TP) on 2 and 4 ranks is saved the same way and loaded
back into its layout. Every family is also saved from one rank at
max_shard_size values that split the experts of one fused parameter: the
files transformers writes. A conversion that is not a view of one tensor,
and experts an expert-parallel module holds as plain local tensors (no
record of which they are), are refused before the daemon hears of the save.

Environment as for test_binding.py. Exits 77 (skipped) without torch >= 2.6,
transformers >= 5, safetensors. `--worker JSON` is one rank.
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
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    import transformers
    from transformers import (AutoConfig, AutoModelForCausalLM, DeepseekV3Config, MixtralConfig, Qwen2MoeConfig,
                              Qwen3MoeConfig)
    from transformers import modeling_utils
    from transformers.core_model_loading import Interleave, WeightConverter, revert_weight_conversion
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors import safe_open
    from test_hf import check_same_files, logits, shards
except (ImportError, SystemExit) as e:
    print("torch >= 2.6, transformers >= 5 or safetensors is missing (%s): skipping; "
          "scripts/deps.sh shardd_venv makes the venv that has them" % e)
    sys.exit(77)

import suite
import shardd
import shardd.torch as st
from shardd_daemon import Daemon
from torch_world import WAIT, answer, init, raw, run_world

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

MAX_SHARD = "12KB"
COMMON = dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64)
# name: (config, tie_word_embeddings, dtype); each holds fewer experts than the four ranks, or as many.
MODELS = {
    "qwen3moe-tied-bf16": (lambda: Qwen3MoeConfig(intermediate_size=40, moe_intermediate_size=24, num_experts=4,
                                                  num_experts_per_tok=2, num_key_value_heads=2, head_dim=8,
                                                  **COMMON), True, torch.bfloat16),
    "mixtral-f32": (lambda: MixtralConfig(intermediate_size=24, num_local_experts=3, num_experts_per_tok=2,
                                          num_key_value_heads=2, **COMMON), False, torch.float32),
    "deepseekv3-bf16": (lambda: DeepseekV3Config(
        intermediate_size=40, moe_intermediate_size=24, n_routed_experts=4, n_shared_experts=1,
        num_experts_per_tok=2, first_k_dense_replace=1, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=8, num_key_value_heads=4, n_group=1, topk_group=1, **COMMON),
        False, torch.bfloat16),
    "qwen2moe-tied-f32": (lambda: Qwen2MoeConfig(intermediate_size=40, moe_intermediate_size=24, num_experts=2,
                                                 num_experts_per_tok=2, shared_expert_intermediate_size=28,
                                                 num_key_value_heads=2, **COMMON), True, torch.float32),
}
# Models only transformers' own expert parallel saves: it splits the experts evenly over its ep ranks,
# which the 3 experts of the Mixtral above are not.
EP_MODELS = {
    "mixtral4-bf16": (lambda: MixtralConfig(intermediate_size=24, num_local_experts=4, num_experts_per_tok=2,
                                            num_key_value_heads=2, **COMMON), False, torch.bfloat16),
}
# (name, world size); each loads the checkpoint the one before it saved.
LAYOUTS = [("fsdp4", 4), ("ep4", 4), ("ep2_efsdp2", 4), ("ep2_dp2", 4), ("tp2", 2)]
# Layouts that also save with save_pretrained's default max_shard_size: one file, as transformers writes it.
WHOLE = ("fsdp4", "tp2")
COLWISE = ("q_proj", "k_proj", "v_proj", "q_b_proj", "kv_b_proj")


def build(name, seed):
    config, tied, dtype = MODELS[name] if name in MODELS else EP_MODELS[name]
    cfg = config()
    cfg.tie_word_embeddings = tied
    torch.manual_seed(seed)
    m = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    with torch.no_grad():  # the bias starts at zero: give it bits of its own, as a trained model has
        for key, b in m.named_buffers():
            if key.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=torch.Generator().manual_seed(seed)))
    return m


def experts(m):
    return [layer.mlp.experts for layer in m.model.layers if hasattr(layer.mlp, "experts")]


def place(module, mesh, placements):
    """Each parameter of module a DTensor on mesh, as an EP or TP plan leaves it."""
    for key, p in list(module.named_parameters(recurse=False)):
        module._parameters[key] = torch.nn.Parameter(
            distribute_tensor(p.data, mesh, placements(key) if callable(placements) else placements))


def fsdp_rest(m, mesh, skip=()):
    """FSDP2 over mesh for every layer and the root, leaving the expert modules in skip alone."""
    ignored = {p for e in skip for p in e.parameters()}
    for layer in m.model.layers:
        fully_shard(layer, mesh=mesh, ignored_params=ignored or None)
    fully_shard(m, mesh=mesh, ignored_params=ignored or None)


def parallelize(m, layout, world):
    ex = experts(m)
    if layout == "fsdp4":
        fsdp_rest(m, init_device_mesh("cpu", (world,)))
    elif layout == "ep4":  # torchtitan: experts Shard(0) on ep, the rest FSDP2 over every rank
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("ep",))
        for e in ex:
            place(e, mesh, [Shard(0)])
        fsdp_rest(m, mesh, ex)
    elif layout == "ep2_efsdp2":  # experts FSDP2 on efsdp too: dim 0, or dim 1 once efsdp x ep > E
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("efsdp", "ep"))
        for e in ex:
            place(e, mesh["ep"], [Shard(0)])
            dim = 0 if e.gate_up_proj.shape[0] >= world else 1
            fully_shard(e, mesh=mesh["efsdp"], shard_placement_fn=lambda p, dim=dim: Shard(dim))
        fsdp_rest(m, init_device_mesh("cpu", (world,)), ex)
    elif layout == "ep2_dp2":  # experts replicated over dp: each is written once
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "ep"))
        for e in ex:
            place(e, mesh, [Replicate(), Shard(0)])
        fsdp_rest(m, init_device_mesh("cpu", (world,)), ex)
    elif layout == "tp2":  # attention and the experts' intermediate dim
        mesh = init_device_mesh("cpu", (world,))
        plan = {}
        for i, layer in enumerate(m.model.layers):
            for key, _ in layer.self_attn.named_children():
                if key in COLWISE or key == "o_proj":
                    plan["model.layers.%d.self_attn.%s" % (i, key)] = (RowwiseParallel() if key == "o_proj"
                                                                      else ColwiseParallel())
        parallelize_module(m, mesh, plan)
        for e in ex:
            place(e, mesh, lambda key: [Shard(1) if key == "gate_up_proj" else Shard(2)])
    return m


def full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def placements(m):
    return sorted({"%s%s" % (type(p).__name__, getattr(p, "dim", "")) for e in experts(m)
                   for t in (e.gate_up_proj, e.down_proj) for p in getattr(t, "placements", ())})


def untied(name):
    return not MODELS[name][1]


def worker(args):
    """Every layout of args["layouts"] in turn, each loading the folders the one before saved; or
    transformers' own expert parallel (args["transformers_ep"]); or one model saved again and again
    (args["again"])."""
    if "transformers_ep" in args:
        return transformers_ep(args)
    if "again" in args:
        return again(args["again"])
    rank, world = init()
    ref_sd = {name: {k: raw(v) for k, v in build(name, 1234).state_dict().items()} for name in MODELS}
    out, previous = {}, args["from"]
    for layout in args["layouts"]:
        out[layout] = {name: one_model(layout, world, name, previous, ref_sd[name], args["root"]) for name in MODELS}
        previous = os.path.join(args["root"], layout)
    return out


def one_model(layout, world, name, previous, ref_sd, root):
    def differ(sd):
        return sorted(k for k, v in sd.items() if raw(full(v)) != ref_sd[k])

    m = parallelize(build(name, 1234), layout, world)
    st.save_pretrained(m, "%s/%s" % (layout, name), max_shard_size=MAX_SHARD, timeout=WAIT)
    if layout in WHOLE:
        st.save_pretrained(m, "%s/%s-whole" % (layout, name), timeout=WAIT)
    got = {}
    # Another layout's per-expert folder into a model that starts from other weights, both ways.
    src = os.path.join(previous, name)
    fresh = parallelize(build(name, 99), layout, world)
    sd = fresh.state_dict()
    got["load_state_dict"] = (list(st.load_state_dict(src, sd, model=fresh)), differ(sd))
    fresh = parallelize(build(name, 98), layout, world)
    sd = fresh.state_dict()
    dcp.load(sd, storage_reader=st.StorageReader(src, model=fresh))
    got["dcp.load"] = differ(sd)
    if untied(name) and layout.startswith("ep"):
        # The fused names of an EP state dict through DCP, synchronously and not, read back by DCP.
        sd = m.state_dict()
        dcp.save(sd, storage_writer=st.StorageWriter("%s/%s-dcp" % (layout, name), timeout=WAIT))
        dcp.async_save(sd, storage_writer=st.StorageWriter("%s/%s-async" % (layout, name), timeout=WAIT)).result()
        for kind in ("dcp", "async"):
            sd = parallelize(build(name, 97), layout, world).state_dict()
            dcp.load(sd, storage_reader=st.StorageReader(os.path.join(root, layout, "%s-%s" % (name, kind))))
            got[kind] = differ(sd)
    return {"got": got, "placements": placements(m)}


class MoE(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon()
        cls.ref = tempfile.mkdtemp(prefix="shardd-moe-ref-")
        cls.ref_logits = {}
        for name in MODELS:
            build(name, 1234).save_pretrained(os.path.join(cls.ref, name), max_shard_size=MAX_SHARD)
            build(name, 1234).save_pretrained(os.path.join(cls.ref, name + "-whole"))
            cls.ref_logits[name] = logits(os.path.join(cls.ref, name))

    @classmethod
    def tearDownClass(cls):
        cls.d.stop()
        shutil.rmtree(cls.ref, ignore_errors=True)

    def check_folder(self, name, got, whole=False):
        """got holds what save_pretrained writes: the same files (with its default max_shard_size
        one, split one per storage as transformers splits them), holding the same tensors, the
        same index (but shardd's checksums) and configs."""
        ref = os.path.join(self.ref, name + ("-whole" if whole else ""))
        check_same_files(self, ref, got, name)
        if not whole:
            self.assertGreater(len(shards(got)), 2, "%s: max_shard_size gives one file" % name)
        self.assertTrue(any(".experts.1." in t for f in shards(ref).values() for t in f), name)
        self.assertTrue(torch.equal(logits(got), self.ref_logits[name]), name + ": logits differ")

    def test_layouts(self):
        previous = self.ref
        for world in sorted({w for _, w in LAYOUTS}, reverse=True):
            layouts = [layout for layout, w in LAYOUTS if w == world]
            out = run_world(__file__, world, {"layouts": layouts, "from": previous, "root": self.d.root},
                            {"SHARDD_SOCKET": self.d.socket})
            for layout in layouts:
                with self.subTest(layout=layout):
                    for name in MODELS:
                        self.check_folder(name, os.path.join(self.d.root, layout, name))
                        if layout in WHOLE:
                            self.check_folder(name, os.path.join(self.d.root, layout, name + "-whole"), True)
                        expect = {"load_state_dict": [[[], []], []], "dcp.load": []}
                        if untied(name) and layout.startswith("ep"):
                            expect.update({"dcp": [], "async": []})
                        for rank, r in enumerate(out):
                            self.assertEqual(r[layout][name]["got"], expect, "%s %s rank %d, loaded from %s"
                                             % (layout, name, rank, previous))
                    print("%s: %d ranks, experts %s; %d models saved as save_pretrained does, loaded from %s"
                          % (layout, world, sorted({p for r in out[0][layout].values() for p in r["placements"]}),
                             len(MODELS), os.path.basename(previous)))
                previous = os.path.join(self.d.root, layout)


class SplitSizes(unittest.TestCase):
    """One rank, every family, max_shard_size values that split the experts of one fused
    parameter (transformers' per-expert views of one storage) at other places: the files, index
    and tensors transformers writes."""

    SIZES = ("4KB", "8KB", "20KB", "50KB")

    def test_sizes(self):
        d = Daemon()
        ref = tempfile.mkdtemp(prefix="shardd-moe-split-")
        try:
            for name in MODELS:
                m = build(name, 7)
                for size in self.SIZES:
                    with self.subTest(model=name, max_shard_size=size):
                        m.save_pretrained(os.path.join(ref, name + size), max_shard_size=size)
                        st.save_pretrained(m, name + size, max_shard_size=size, socket=d.socket, rank=0,
                                           world_size=1, timeout=WAIT)
                        check_same_files(self, os.path.join(ref, name + size), os.path.join(d.root, name + size),
                                         "%s at %s" % (name, size))
                # The sizes matter: counted tensor by tensor, the same walk splits elsewhere.
                alone = revert_weight_conversion(m, modeling_utils.remove_tied_weights_from_state_dict(
                    m.state_dict(), m))
                alone = {k: v.clone() for k, v in alone.items()}
                elsewhere = []
                for size in self.SIZES:
                    with open(os.path.join(ref, name + size, "model.safetensors.index.json")) as f:
                        theirs = json.load(f)["weight_map"]
                    if theirs != split_torch_state_dict_into_shards(alone, max_shard_size=size).tensor_to_filename:
                        elsewhere.append(size)
                self.assertTrue(elsewhere, name)
                print("%s: %s files at %s, as transformers splits them (tensor by tensor: elsewhere at %s)" % (
                    name, [len(shards(os.path.join(ref, name + size))) for size in self.SIZES], self.SIZES,
                    elsewhere))
        finally:
            shutil.rmtree(ref, ignore_errors=True)
            self.assertEqual(d.stop(), 0)


class InterleavedMoe(transformers.Qwen3MoeForCausalLM):
    """A Qwen3-MoE whose checkpoint keeps the router's rows interleaved: saving computes them."""


# transformers' own expert parallel: {name: (world size, DistributedConfig(**kwargs), models)}.
# enable_expert_parallel is the flag the issue names (deprecated in 5.x for ep_size=tp_size,
# tp_plan={}): experts Shard(0) over the ranks, the rest whole on each. Then EP beside FSDP2 (the
# experts _StridedShard on ep x efsdp, token dispatch), and beside TP and FSDP2 on four ranks.
# Mixtral's three experts do not split over two ranks (transformers itself refuses it): a Mixtral of
# four experts stands in for it here.
TRANSFORMERS_EP = {
    "enable_ep2": (2, dict(enable_expert_parallel=True, tp_size=2),
                   ("qwen3moe-tied-bf16", "deepseekv3-bf16", "qwen2moe-tied-f32", "mixtral4-bf16")),
    "ep2_fsdp2": (2, dict(ep_size=2, fsdp_size=2), ("qwen3moe-tied-bf16", "deepseekv3-bf16", "mixtral4-bf16")),
    "ep2_tp2_fsdp2": (4, dict(ep_size=2, tp_size=2, fsdp_size=2), ("deepseekv3-bf16",)),
}


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def transformers_ep(args):
    """Each config: every model from_pretrained under transformers' DistributedConfig, saved split
    and whole, then every local tensor zeroed and filled back from the split folder."""
    from transformers.distributed import DistributedConfig

    init()
    out = {}
    for config in args["transformers_ep"]:
        _world, kwargs, names = TRANSFORMERS_EP[config]
        out[config] = {}
        for name in names:
            m = AutoModelForCausalLM.from_pretrained(os.path.join(args["ref"], name + "-whole"),
                                                     distributed_config=DistributedConfig(**kwargs))
            folder = "%s/%s" % (config, name)
            st.save_pretrained(m, folder, max_shard_size=MAX_SHARD, timeout=WAIT)
            st.save_pretrained(m, folder + "-whole", timeout=WAIT)
            sd = m.state_dict()
            before = {k: raw(local(v)) for k, v in sd.items()}
            with torch.no_grad():
                for v in sd.values():
                    local(v).zero_()
            cleared = sum(raw(local(v)) != before[k] for k, v in sd.items())
            loaded = list(st.load_state_dict(os.path.join(args["root"], folder), sd, model=m))
            out[config][name] = {"placements": placements(m), "loaded": loaded, "cleared": cleared,
                                 "differ": sorted(k for k, v in sd.items() if raw(local(v)) != before[k])}
    return out


class TransformersEP(unittest.TestCase):
    """transformers' own expert parallel (DistributedConfig): its experts are DTensors Shard(0) on
    its ep mesh (and _StridedShard beside FSDP2), so each rank's experts are exactly the ones its
    mesh coordinate says. Saved split and whole: the files, index and tensors transformers'
    save_pretrained writes for the unsharded model, equal logits from from_pretrained; loaded back
    into the same layout with load_state_dict, bit-exact."""

    def test_distributed_config(self):
        try:
            import accelerate  # noqa: F401  from_pretrained(distributed_config=) requires it
        except ImportError:
            self.skipTest("accelerate is missing: scripts/deps.sh shardd_venv installs it")
        models = sorted({n for _, _, names in TRANSFORMERS_EP.values() for n in names})
        d = Daemon()
        ref = tempfile.mkdtemp(prefix="shardd-moe-tep-")
        try:
            for name in models:
                build(name, 1234).save_pretrained(os.path.join(ref, name), max_shard_size=MAX_SHARD)
                build(name, 1234).save_pretrained(os.path.join(ref, name + "-whole"))
            for world in sorted({w for w, _, _ in TRANSFORMERS_EP.values()}):
                configs = [c for c, (w, _, _) in TRANSFORMERS_EP.items() if w == world]
                out = run_world(__file__, world, {"transformers_ep": configs, "ref": ref, "root": d.root},
                                {"SHARDD_SOCKET": d.socket})
                for config in configs:
                    for name in TRANSFORMERS_EP[config][2]:
                        with self.subTest(config=config, model=name):
                            for suffix in ("", "-whole"):
                                got = os.path.join(d.root, config, name + suffix)
                                check_same_files(self, os.path.join(ref, name + suffix), got, config + ": " + name)
                                self.assertTrue(torch.equal(logits(got), logits(os.path.join(ref, name))), name)
                            for rank, r in enumerate(out):
                                self.assertEqual((r[config][name]["loaded"], r[config][name]["differ"]),
                                                 ([[], []], []), "%s %s rank %d" % (config, name, rank))
                                self.assertGreater(r[config][name]["cleared"], 10, "nothing was zeroed to load")
                    print("transformers %s: %d ranks, experts %s; %s saved as save_pretrained does, loaded back"
                          % (config, world, sorted({p for r in out[0][config].values() for p in r["placements"]}),
                             ", ".join(TRANSFORMERS_EP[config][2])))
        finally:
            shutil.rmtree(ref, ignore_errors=True)
            self.assertEqual(d.stop(), 0)


def again(name):
    """One EP model saved as a trainer saves it, again and again: the same tensors twice, then
    every value changed in place (wait=False), then one fused parameter replaced by new memory.
    {folder: whether that save reused the model's last save's work}."""
    from shardd import _hf

    _rank, world = init()
    m = parallelize(build(name, 1234), "ep4", world)
    reused = {}
    last = None
    for folder in ("first", "second", "ones", "twos"):
        if folder == "ones":
            with torch.no_grad():
                for v in m.state_dict().values():
                    local(v).fill_(1)
        elif folder == "twos":
            e = experts(m)[0]
            old = e.down_proj
            e.down_proj = torch.nn.Parameter(distribute_tensor(torch.full(old.shape, 2, dtype=old.dtype),
                                                               old.device_mesh, old.placements))
        pending = st.save_pretrained(m, "again/" + folder, max_shard_size=MAX_SHARD, timeout=WAIT,
                                     wait=folder != "ones")
        if folder == "ones":
            pending.wait(WAIT)
        repeat = _hf._REPEATS.get(m)
        reused[folder] = repeat is not None and repeat is last
        last = repeat
    return reused


class Again(unittest.TestCase):
    """save_pretrained of one EP model again and again, as a trainer saves: a save of the same
    tensors reuses the last one's work (its descriptions, places and copy plan), yet writes what
    the tensors hold at that save; a parameter on new memory is worked out anew. Then a tied
    model of plain tensors saved again by one rank."""

    NAME = "deepseekv3-bf16"
    TIED = "qwen3moe-tied-bf16"

    def test_again(self):
        d = Daemon()
        ref = tempfile.mkdtemp(prefix="shardd-moe-again-")
        try:
            build(self.NAME, 1234).save_pretrained(ref, max_shard_size=MAX_SHARD)
            out = run_world(__file__, 2, {"again": self.NAME}, {"SHARDD_SOCKET": d.socket})
            for rank, reused in enumerate(out):
                self.assertEqual(reused, {"first": False, "second": True, "ones": True, "twos": False},
                                 "rank %d" % rank)
            root = os.path.join(d.root, "again")
            for folder in ("first", "second"):
                check_same_files(self, ref, os.path.join(root, folder), folder)
            for folder in ("ones", "twos"):
                got = os.path.join(root, folder)
                self.assertEqual({f: sorted(t) for f, t in shards(got).items()},
                                 {f: sorted(t) for f, t in shards(ref).items()}, folder)
                for f in os.listdir(got):
                    if not f.endswith(".safetensors"):
                        continue
                    with safe_open(os.path.join(got, f), "pt") as h:
                        for key in h.keys():
                            two = folder == "twos" and ".mlp.experts." in key and key.endswith(".down_proj.weight")
                            self.assertTrue(bool((h.get_tensor(key) == (2 if two else 1)).all()),
                                            "%s: %s" % (folder, key))
            print("%s saved 4 times by 2 ranks: the same tensors reused the last save's work; values "
                  "changed in place were written, a parameter on new memory worked out anew" % self.NAME)
            # One rank, plain tensors, tied weights (the tied name dropped again): saved twice, then
            # with values changed in place, each against transformers' save_pretrained of the same.
            from shardd import _hf

            m = build(self.TIED, 1234)
            repeats = []
            for folder in ("first", "second", "doubled"):
                if folder == "doubled":
                    with torch.no_grad():
                        m.model.embed_tokens.weight.mul_(2)
                m.save_pretrained(os.path.join(ref, folder), max_shard_size=MAX_SHARD)
                st.save_pretrained(m, "one/" + folder, max_shard_size=MAX_SHARD, socket=d.socket, rank=0,
                                   world_size=1, timeout=WAIT)
                check_same_files(self, os.path.join(ref, folder), os.path.join(d.root, "one", folder), folder)
                repeats.append(_hf._REPEATS.get(m))
            self.assertIsNotNone(repeats[0])
            self.assertTrue(repeats[0] is repeats[1] is repeats[2], "the later saves did not reuse the first's work")
            # The tie undone by a Parameter object of its own over the same memory: two names sharing
            # memory, refused as a first save refuses them, not saved by the tied work left behind.
            m.lm_head.weight = torch.nn.Parameter(m.model.embed_tokens.weight.data, requires_grad=False)
            with self.assertRaisesRegex(ValueError, "share memory"):
                st.save_pretrained(m, "one/untied", max_shard_size=MAX_SHARD, socket=d.socket, rank=0,
                                   world_size=1, timeout=WAIT)
            print("%s saved 3 times by one rank, the last after a change in place: the files save_pretrained "
                  "writes each time" % self.TIED)
        finally:
            shutil.rmtree(ref, ignore_errors=True)
            self.assertEqual(d.stop(), 0)


class Refused(unittest.TestCase):
    """Conversions that are no view of one tensor the ranks hold: refused by name, the daemon told nothing."""

    def refused(self, model, words):
        d = Daemon()
        try:
            with shardd.Client(d.socket) as c:
                before = c.status()["totals"]
                with self.assertRaises(NotImplementedError) as e:
                    st.save_pretrained(model, "refused", socket=d.socket, rank=0, world_size=1, timeout=WAIT)
                for w in words:
                    self.assertIn(w, str(e.exception))
                self.assertEqual(c.status()["totals"], before)
                self.assertEqual(c.status()["saves"], [])
            self.assertFalse(os.path.exists(os.path.join(d.root, "refused")))
            print("refused: %s" % e.exception)
        finally:
            self.assertEqual(d.stop(), 0)

    def test_many_to_one(self):
        # HRM loads a fused gate_up_proj as two projections: saving concatenates them again.
        cfg = AutoConfig.for_model("hrm_text", vocab_size=64, hidden_size=32, intermediate_size=48,
                                   num_hidden_layers=2, num_layers_per_stack=1, num_attention_heads=4, head_dim=8,
                                   max_position_embeddings=64)
        self.refused(AutoModelForCausalLM.from_config(cfg),
                     ["HrmTextForCausalLM", "Concatenate (torch.cat)", "mlp.gate_up_proj.weight'"])

    def test_computed_permutation(self):
        transformers.conversion_mapping.register_checkpoint_conversion_mapping(
            "InterleavedMoe", [WeightConverter("mlp.gate.weight", "mlp.gate.weight", operations=[Interleave(dim=0)])],
            overwrite=True)
        torch.manual_seed(0)
        self.refused(InterleavedMoe(MODELS["qwen3moe-tied-bf16"][0]()),
                     ["InterleavedMoe", "Interleave (torch.reshape)", "model.layers.0.mlp.gate.weight'"])


    def test_local_experts_without_their_place(self):
        # Expert parallel as older transformers held it: each rank's experts as a plain tensor.
        m = build("qwen3moe-tied-bf16", 0)
        e = m.model.layers[1].mlp.experts
        e.gate_up_proj = torch.nn.Parameter(e.gate_up_proj.data[2:].clone())
        e.num_experts, e._is_expert_parallel = 2, True
        self.refused(m, ["Qwen3MoeForCausalLM", "'model.layers.1.mlp.experts.gate_up_proj' is a plain local tensor",
                         "2 experts here, 4 in the config"])
        # The same share with no mark but its count: fewer experts than the config's is refused too.
        m = build("deepseekv3-bf16", 0)
        e = m.model.layers[1].mlp.experts
        e.down_proj = torch.nn.Parameter(e.down_proj.data[:2].clone())
        e.gate_up_proj = torch.nn.Parameter(e.gate_up_proj.data[:2].clone())
        e.num_experts = 2
        self.refused(m, ["DeepseekV3ForCausalLM", "'model.layers.1.mlp.experts.gate_up_proj' is a plain local tensor",
                         "2 experts here, 4 in the config"])


def main():
    return suite.run(__name__, lambda args: answer(worker(args)))


if __name__ == "__main__":
    sys.exit(main())
