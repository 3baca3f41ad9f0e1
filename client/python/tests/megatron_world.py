# Tiny Megatron-core GPT models on gloo CPU ranks for the tests: layouts, the CPU shims a forward pass needs, a hand-driven pipeline, and the gathered reference.
"""What test_megatron.py's ranks do with megatron-core on CPU.

The shims below make a forward pass run on CPU; they are the tests' own
and never the library's: the model-parallel RNG tracker forks nothing (no
dropout here), torch.cuda.current_device is the CPU, moe_utils' TE GEMM is
off, the attention mask is given, and pipeline stages pass activations by
hand-written send/recv instead of Megatron's schedules, Tensor.cuda
leaves a tensor where it is, and GroupedMLP's grouped GEMM is a loop of
matmuls.

reference() is the slow way Megatron-Bridge takes: every parameter's full
tensor gathered (all_gather_object of every rank's primary shards), mapped
to HF names with whole-tensor torch ops written here independently of
shardd.megatron's box arithmetic, and written by rank 0 with safetensors.
"""
import contextlib
import os
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F

warnings.filterwarnings("ignore")

VOCAB, PADDED = 250, 256     # Megatron pads the vocab; HF keeps 250
HIDDEN = 64
# The tests' sizes; the benchmark passes larger ones.
DIMS = dict(vocab=VOCAB, padded=PADDED, hidden=HIDDEN, heads=8, groups=4, head_dim=8, ffn=96, layers=4,
            experts=4, topk=2, expert_ffn=48, shared_ffn=64)
TOKENS = torch.tensor([[3, 17, 101, 249, 0, 42, 7, 188], [200, 5, 5, 63, 120, 9, 248, 1]])


def shims():
    """The CPU stand-ins a forward pass needs (tests only)."""
    import megatron.core.tensor_parallel.random as rng
    import megatron.core.transformer.moe.moe_utils as moe_utils

    class CPUTracker:
        def fork(self, name=None):
            return contextlib.nullcontext()

        def is_initialized(self):
            return True

        def add(self, name, seed):
            pass

        def reset(self):
            pass

        def get_states(self):
            return {}

    rng._CUDA_RNG_STATE_TRACKER = CPUTracker()
    rng._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    torch.cuda.current_device = lambda: torch.device("cpu")
    # GroupedMLP's grouped GEMM (a CUDA package) as one matmul per expert.
    import types

    import megatron.core.transformer.moe.grouped_gemm_util as gg

    def gmm(a, b, batch_sizes, trans_b=False):
        rows = torch.split(a, [int(n) for n in batch_sizes])
        return torch.cat([x @ (w.t() if trans_b else w) for x, w in zip(rows, b)])

    gg.ops = types.SimpleNamespace(gmm=gmm)
    gg.grouped_gemm = types.SimpleNamespace(ops=gg.ops)
    # The tied output layer of the last stage is moved to the GPU before its all-reduce.
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    moe_utils.te_general_gemm = None


def hf_config(family, d=DIMS):
    from transformers import LlamaConfig, MixtralConfig, Qwen2Config, Qwen2MoeConfig

    common = dict(vocab_size=d["vocab"], hidden_size=d["hidden"], num_hidden_layers=d["layers"],
                  num_attention_heads=d["heads"], num_key_value_heads=d["groups"], head_dim=d["head_dim"],
                  rms_norm_eps=1e-5, max_position_embeddings=64, rope_theta=10000.0,
                  tie_word_embeddings=family.endswith("tied"))
    if family.startswith("llama"):
        return LlamaConfig(intermediate_size=d["ffn"], **common)
    if family.startswith("qwen2_moe"):
        return Qwen2MoeConfig(intermediate_size=d["ffn"], moe_intermediate_size=d["expert_ffn"],
                              shared_expert_intermediate_size=d["shared_ffn"], num_experts=d["experts"],
                              num_experts_per_tok=d["topk"], norm_topk_prob=False, **common)
    if family.startswith("qwen2"):
        return Qwen2Config(intermediate_size=d["ffn"], **common)
    if family.startswith("mixtral"):
        return MixtralConfig(intermediate_size=d["expert_ffn"], num_local_experts=d["experts"],
                             num_experts_per_tok=d["topk"], router_jitter_noise=0.0, **common)
    raise ValueError(family)


def layout(tp=1, pp=1, ep=1, vpp=None, grouped=False):
    from megatron.core import parallel_state as ps

    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                 virtual_pipeline_model_parallel_size=vpp, expert_model_parallel_size=ep)
    return dict(tp=tp, pp=pp, ep=ep, vpp=vpp, grouped=grouped)


def build(family, lay, seed, d=DIMS, init=True):
    """The model chunks (one, or vpp of them) of `family` in the current layout, initialised from
    seed (init=False: left as allocated, for the benchmark's bytes)."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    moe = family.startswith(("mixtral", "qwen2_moe"))
    shared = family.startswith("qwen2_moe")
    cfg = TransformerConfig(
        num_layers=d["layers"], hidden_size=d["hidden"], num_attention_heads=d["heads"],
        num_query_groups=d["groups"], kv_channels=d["head_dim"], ffn_hidden_size=d["ffn"], normalization="RMSNorm", layernorm_epsilon=1e-5,
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
        add_qkv_bias=family.startswith("qwen2"), hidden_dropout=0.0, attention_dropout=0.0,
        use_cpu_initialization=True, bias_activation_fusion=False, masked_softmax_fusion=False,
        persist_layer_norm=False, bias_dropout_fusion=False, apply_rope_fusion=False,
        pipeline_dtype=torch.float32, tensor_model_parallel_size=lay["tp"],
        pipeline_model_parallel_size=lay["pp"], virtual_pipeline_model_parallel_size=lay["vpp"],
        expert_model_parallel_size=lay["ep"], sequence_parallel=False,
        num_moe_experts=d["experts"] if moe else None, moe_router_topk=d["topk"] if moe else 2,
        moe_ffn_hidden_size=d["expert_ffn"] if moe else None, moe_token_dispatcher_type="allgather",
        moe_grouped_gemm=lay["grouped"], moe_router_pre_softmax=shared,
        moe_shared_expert_intermediate_size=d["shared_ffn"] if shared else None, moe_shared_expert_gate=shared,
        moe_router_load_balancing_type="none", init_method_std=0.05, perform_initialization=init,
        params_dtype=d.get("dtype", torch.float32))
    spec = get_gpt_layer_local_spec(num_experts=d["experts"] if moe else None, moe_grouped_gemm=lay["grouped"],
                                    normalization="RMSNorm")
    torch.manual_seed(seed)
    chunks = []
    for v in range(lay["vpp"] or 1):
        vp = v if lay["vpp"] else None
        chunks.append(GPTModel(
            config=cfg, transformer_layer_spec=spec, vocab_size=d["padded"], max_sequence_length=64,
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp),
            share_embeddings_and_output_weights=family.endswith("tied"), position_embedding_type="rope",
            rotary_base=10000, parallel_output=False, vp_stage=vp))
    # GroupedMLP's forward asserts a bf16 run; its loop of matmuls here computes in f32 all the same.
    cfg.bf16 = lay["grouped"]
    with torch.no_grad():  # norms start at 1: make them count
        for c in chunks:
            c.eval()  # MoE with TP and no sequence parallelism runs only outside training
            c.to(dtype=d.get("dtype", torch.float32))  # every parameter, as Float16Module casts them
            for name, p in c.named_parameters():
                if not init:
                    p.uniform_(-1, 1)
                elif name.endswith("layernorm.weight"):
                    p.add_(torch.randn(p.shape) * 0.1)
    return chunks


def forward(chunks):
    """Logits [b, s, VOCAB] on the ranks of the last stage, None elsewhere: the chunks run in
    pipeline order, activations passed by send/recv between neighbouring stages."""
    from megatron.core import parallel_state as ps

    b, s = TOKENS.shape
    pos = torch.arange(s).unsqueeze(0).expand(b, s)
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), 1).view(1, 1, s, s)
    pp, me = ps.get_pipeline_model_parallel_world_size(), ps.get_pipeline_model_parallel_rank()
    out = None
    with torch.no_grad():
        for v, chunk in enumerate(chunks):
            for stage in range(pp):
                if stage != me:
                    continue
                first, last = stage == 0 and v == 0, stage == pp - 1 and v == len(chunks) - 1
                if not first:
                    x = torch.empty(s, b, chunk.config.hidden_size)
                    dist.recv(x, ps.get_pipeline_model_parallel_prev_rank())
                    chunk.set_input_tensor(x)
                y = chunk(input_ids=TOKENS, position_ids=pos, attention_mask=mask)
                if last:
                    out = y[..., :VOCAB].contiguous()
                else:
                    dist.send(y.contiguous(), ps.get_pipeline_model_parallel_next_rank())
    return out


def full_tensors(chunks, everyone=False):
    """{(key, prepend offsets): full Megatron tensor} on rank 0 (every rank with everyone=True),
    None elsewhere."""
    from shardd.megatron import _chunks, _primary, _sharded_tensors

    mine = []
    for gpt in _chunks(chunks):
        for st in _sharded_tensors(gpt):
            if _primary(st):
                p = st.prepend_axis_num
                mine.append((st.key, tuple(st.global_offset[:p]), tuple(st.global_shape[p:]),
                             tuple(st.global_offset[p:]), st.data.detach().clone()))
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    if dist.get_rank() and not everyone:
        return None
    full = {}
    for part in every:
        for key, prepend, shape, offset, data in part:
            t = full.setdefault((key, prepend), torch.full(shape, float("nan"), dtype=data.dtype))
            t[tuple(slice(o, o + n) for o, n in zip(offset, data.shape))] = data
    return full


def hf_names(full, cfg):
    """The gathered tensors as HF tensors, whole-tensor ops only."""
    moe, qwen = cfg.model_type in ("mixtral", "qwen2_moe"), cfg.model_type == "qwen2_moe"
    heads, groups, head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    out = {}
    for (key, prepend), t in full.items():
        if key == "embedding.word_embeddings.weight":
            out["model.embed_tokens.weight"] = t[:cfg.vocab_size]
            continue
        if key == "output_layer.weight":
            out["lm_head.weight"] = t[:cfg.vocab_size]
            continue
        if key == "decoder.final_layernorm.weight":
            out["model.norm.weight"] = t
            continue
        p = "model.layers.%d." % prepend[0]
        rest = key[len("decoder.layers."):]
        if rest.startswith("self_attention.linear_qkv.layer_norm"):
            out[p + "input_layernorm.weight"] = t
        elif rest.startswith("mlp.linear_fc1.layer_norm"):
            out[p + "post_attention_layernorm.weight"] = t
        elif rest.startswith("self_attention.linear_qkv."):
            kind = rest.rsplit(".", 1)[1]
            per = heads // groups
            g = t.reshape(groups, per + 2, head_dim, *t.shape[1:])
            out[p + "self_attn.q_proj." + kind] = g[:, :per].reshape(-1, *t.shape[1:])
            out[p + "self_attn.k_proj." + kind] = g[:, per].reshape(-1, *t.shape[1:])
            out[p + "self_attn.v_proj." + kind] = g[:, per + 1].reshape(-1, *t.shape[1:])
        elif rest == "self_attention.linear_proj.weight":
            out[p + "self_attn.o_proj.weight"] = t
        elif rest == "mlp.linear_fc1.weight":
            out[p + "mlp.gate_proj.weight"], out[p + "mlp.up_proj.weight"] = t.chunk(2)
        elif rest == "mlp.linear_fc2.weight":
            out[p + "mlp.down_proj.weight"] = t
        elif rest == "mlp.router.weight":
            out[p + ("mlp.gate.weight" if qwen else "block_sparse_moe.gate.weight")] = t
        elif rest.startswith("mlp.shared_experts."):
            if rest.endswith("gate_weight"):
                out[p + "mlp.shared_expert_gate.weight"] = t
            elif rest.endswith("linear_fc1.weight"):
                out[p + "mlp.shared_expert.gate_proj.weight"], out[p + "mlp.shared_expert.up_proj.weight"] = t.chunk(2)
            else:
                out[p + "mlp.shared_expert.down_proj.weight"] = t
        elif moe and rest.startswith("mlp.experts.experts."):
            # SequentialMLP: one tensor per expert; GroupedMLP: the layer's experts stacked.
            for expert, w in [(prepend[1], t)] if len(prepend) == 2 else enumerate(t):
                e = p + ("mlp" if qwen else "block_sparse_moe") + ".experts.%d." % expert
                gate, up, down = ("gate_proj", "up_proj", "down_proj") if qwen else ("w1", "w3", "w2")
                if rest.endswith("linear_fc1.weight"):
                    out[e + gate + ".weight"], out[e + up + ".weight"] = w.chunk(2)
                else:
                    out[e + down + ".weight"] = w
        else:
            raise AssertionError("the reference has no HF name for %s" % key)
    return {k: v.contiguous() for k, v in out.items()}


def reference(chunks, cfg, path):
    """Gather, map, write with safetensors (rank 0): the slow way, to compare bytes with."""
    from safetensors.torch import save_file

    full = full_tensors(chunks)
    if full is not None:
        for (key, _), t in full.items():
            assert not torch.isnan(t).any(), "no rank holds all of %s" % key
        save_file(hf_names(full, cfg), path)
