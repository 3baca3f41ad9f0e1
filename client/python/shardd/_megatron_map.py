# Megatron-core's global tensors as Hugging Face tensors: the family table, the config check and each key's row segments.
"""Which rows of a Megatron global tensor are which rows of which HF tensor.

A Megatron ShardedTensor places a rank's local tensor in a global one
(after its prepended axes: the layer, and for experts the expert). Every
layout this module knows maps that global tensor to HF tensors along
dim 0 only, as runs of rows: `segments(key, prepend, shape)` gives
[(hf name, first Megatron row, rows, first HF row)], the same on every
rank, so a rank's box of rows becomes boxes of HF tensors with no talk:
  - linear_qkv is [q (heads_per_group x d), k (d), v (d)] per query group;
  - linear_fc1 (gated) is [gate; up] in the global view the sharded state
    dict gives (its factory splits each TP shard's [gate; up]);
  - embeddings and output are the padded vocab, trimmed to vocab_size;
  - everything else is one HF tensor of the same shape.
The HF names and shapes a family has come from its config alone
(`hf_tensors`), and a model whose Megatron config disagrees with it is
refused field by field before anything is mapped. Nothing here imports
torch or megatron.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

__all__ = ["Family", "FAMILIES", "family_of", "check_config", "hf_tensors", "segments", "Unmappable"]

# (hf name, first row in the Megatron global tensor, rows, first row in the HF tensor)
Segment = Tuple[str, int, int, int]


class Unmappable(ValueError):
    """A Megatron parameter, layout or config this table does not map (the message names it)."""


class Family:
    """One HF model family: its architecture, whether q/k/v carry biases, and its MoE names.

    moe: None for a dense MLP; else (router name, expert prefix, (gate, up, down) names,
    the config field holding the expert FFN size). shared: None, or (the shared expert's
    prefix, its sigmoid gate's name, the config field holding its FFN size).
    """

    def __init__(self, architecture: str, qkv_bias: bool, moe: Optional[Tuple[str, str, Tuple[str, str, str], str]] = None,
                 shared: Optional[Tuple[str, str, str]] = None):
        self.architecture = architecture
        self.qkv_bias = qkv_bias
        self.moe = moe
        self.shared = shared


FAMILIES: Dict[str, Family] = {
    "llama": Family("LlamaForCausalLM", qkv_bias=False),
    "qwen2": Family("Qwen2ForCausalLM", qkv_bias=True),
    "mixtral": Family("MixtralForCausalLM", qkv_bias=False,
                      moe=("block_sparse_moe.gate", "block_sparse_moe.experts", ("w1", "w3", "w2"),
                           "intermediate_size")),
    "qwen2_moe": Family("Qwen2MoeForCausalLM", qkv_bias=True,
                        moe=("mlp.gate", "mlp.experts", ("gate_proj", "up_proj", "down_proj"),
                             "moe_intermediate_size"),
                        shared=("mlp.shared_expert", "mlp.shared_expert_gate", "shared_expert_intermediate_size")),
}


def family_of(hf_config) -> Family:
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in FAMILIES:
        raise Unmappable("hf_config.model_type %r is not a family shardd.megatron maps (it maps %s)"
                         % (model_type, ", ".join(sorted(FAMILIES))))
    return FAMILIES[model_type]


class Dims:
    """The sizes the mapping needs, read from the HF config."""

    def __init__(self, hf_config):
        c, fam = hf_config, family_of(hf_config)
        self.hidden = int(c.hidden_size)
        self.layers = int(c.num_hidden_layers)
        self.heads = int(c.num_attention_heads)
        self.groups = int(getattr(c, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(c, "head_dim", None) or self.hidden // self.heads)
        self.vocab = int(c.vocab_size)
        self.tied = bool(getattr(c, "tie_word_embeddings", False))
        self.ffn = int(getattr(c, fam.moe[3]) if fam.moe else c.intermediate_size)
        self.experts = int(getattr(c, "num_local_experts", None) or getattr(c, "num_experts", None) or 0)
        self.shared = int(getattr(c, fam.shared[2])) if fam.shared else None


def _rope_theta(hf_config):
    params = getattr(hf_config, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        if params.get("rope_type", "default") != "default":
            raise Unmappable("hf_config rope_type %r: only plain RoPE is mapped" % params.get("rope_type"))
        return float(params["rope_theta"])
    theta = getattr(hf_config, "rope_theta", None)
    return None if theta is None else float(theta)


def check_config(gpt, hf_config) -> Family:
    """The family, once every field the weights depend on agrees between the Megatron model `gpt`
    (a GPTModel) and hf_config; Unmappable naming the first field that does not."""
    import torch.nn.functional as F

    fam = family_of(hf_config)
    c, d = gpt.config, Dims(hf_config)
    moe = fam.moe is not None
    pairs = [
        ("num_layers", c.num_layers, "num_hidden_layers", d.layers),
        ("hidden_size", c.hidden_size, "hidden_size", d.hidden),
        ("num_attention_heads", c.num_attention_heads, "num_attention_heads", d.heads),
        ("num_query_groups", c.num_query_groups or c.num_attention_heads, "num_key_value_heads", d.groups),
        ("kv_channels", c.kv_channels, "head_dim", d.head_dim),
        ("normalization", c.normalization, "(RMSNorm in %s)" % hf_config.model_type, "RMSNorm"),
        ("layernorm_epsilon", float(c.layernorm_epsilon), "rms_norm_eps", float(hf_config.rms_norm_eps)),
        ("gated_linear_unit", bool(c.gated_linear_unit), "(SwiGLU)", True),
        ("activation_func", getattr(c.activation_func, "__name__", c.activation_func), "(SwiGLU)", F.silu.__name__),
        ("add_bias_linear", bool(c.add_bias_linear), "(no linear biases)", False),
        ("add_qkv_bias", bool(c.add_qkv_bias), "(q/k/v biases of %s)" % hf_config.model_type, fam.qkv_bias),
        ("qk_layernorm", bool(c.qk_layernorm), "(no q/k norms)", False),
        ("share_embeddings_and_output_weights", bool(gpt.share_embeddings_and_output_weights),
         "tie_word_embeddings", d.tied),
        ("position_embedding_type", gpt.position_embedding_type, "(RoPE)", "rope"),
        ("rotary_percent", float(gpt.rotary_percent), "(full RoPE)", 1.0),
        ("rope_scaling", bool(getattr(gpt, "rotary_scaling", False)), "(plain RoPE)", False),
        ("multi_latent_attention", bool(getattr(c, "multi_latent_attention", False)), "(GQA)", False),
        ("num_moe_experts", c.num_moe_experts or 0, "num_local_experts / num_experts", d.experts),
    ]
    theta = _rope_theta(hf_config)
    if theta is not None:
        pairs.append(("rotary_base", float(gpt.rotary_base), "rope_theta", theta))
    if moe:
        pairs += [("moe_ffn_hidden_size", c.moe_ffn_hidden_size, fam.moe[3], d.ffn),
                  ("moe_router_topk", c.moe_router_topk, "num_experts_per_tok", int(hf_config.num_experts_per_tok)),
                  ("moe_shared_expert_intermediate_size", c.moe_shared_expert_intermediate_size,
                   fam.shared[2] if fam.shared else "(no shared experts)", d.shared),
                  ("moe_shared_expert_gate", bool(c.moe_shared_expert_gate), "(a sigmoid-gated shared expert)",
                   bool(fam.shared)),
                  # Mixtral renormalises its top-k softmax (Megatron: top-k, then softmax); Qwen2-MoE
                  # without norm_topk_prob keeps the full softmax's values (Megatron: pre-softmax).
                  ("moe_router_pre_softmax", bool(c.moe_router_pre_softmax), "norm_topk_prob",
                   not bool(getattr(hf_config, "norm_topk_prob", True))),
                  ("moe_router_topk_scaling_factor", c.moe_router_topk_scaling_factor, "(no scaling)", None),
                  ("moe_router_enable_expert_bias", bool(c.moe_router_enable_expert_bias), "(no expert bias)", False),
                  ("moe_router_score_function", c.moe_router_score_function, "(softmax router)", "softmax"),
                  ("moe_layer_freq", c.moe_layer_freq, "(every layer MoE)", 1)]
    else:
        pairs.append(("ffn_hidden_size", c.ffn_hidden_size, "intermediate_size", d.ffn))
    for field, plain in (("decoder_sparse_step", 1), ("mlp_only_layers", []), ("use_sliding_window", False)):
        if getattr(hf_config, field, plain) not in (plain, None):
            raise Unmappable("hf_config.%s is %r: the Megatron model has no such layout (%r)"
                             % (field, getattr(hf_config, field), plain))
    for m_name, m_value, h_name, h_value in pairs:
        if m_value != h_value:
            raise Unmappable("the Megatron model's %s is %r but hf_config's %s gives %r"
                             % (m_name, m_value, h_name, h_value))
    if gpt.vocab_size < d.vocab:
        raise Unmappable("the Megatron model's vocab_size %d (padded) is below hf_config.vocab_size %d"
                         % (gpt.vocab_size, d.vocab))
    return fam


def hf_tensors(hf_config) -> Dict[str, Tuple[int, ...]]:
    """{HF name: shape} of every tensor the checkpoint holds, in the order transformers lists them."""
    fam, d = family_of(hf_config), Dims(hf_config)
    q, kv, h = d.heads * d.head_dim, d.groups * d.head_dim, d.hidden
    out: Dict[str, Tuple[int, ...]] = {"model.embed_tokens.weight": (d.vocab, h)}
    for layer in range(d.layers):
        p = "model.layers.%d." % layer
        for proj, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            out[p + "self_attn.%s.weight" % proj] = (rows, h)
            if fam.qkv_bias:
                out[p + "self_attn.%s.bias" % proj] = (rows,)
        out[p + "self_attn.o_proj.weight"] = (h, q)
        if fam.moe:
            router, experts, (gate, up, down), _ = fam.moe
            out[p + router + ".weight"] = (d.experts, h)
            for e in range(d.experts):
                e_p = "%s%s.%d." % (p, experts, e)
                for name, shape in ((gate, (d.ffn, h)), (down, (h, d.ffn)), (up, (d.ffn, h))):
                    out[e_p + name + ".weight"] = shape
            if fam.shared:
                shared, gate = fam.shared[:2]
                for name, shape in (("gate_proj", (d.shared, h)), ("up_proj", (d.shared, h)),
                                    ("down_proj", (h, d.shared))):
                    out[p + "%s.%s.weight" % (shared, name)] = shape
                out[p + gate + ".weight"] = (1, h)
        else:
            for name, shape in (("gate_proj", (d.ffn, h)), ("up_proj", (d.ffn, h)), ("down_proj", (h, d.ffn))):
                out[p + "mlp.%s.weight" % name] = shape
        out[p + "input_layernorm.weight"] = (h,)
        out[p + "post_attention_layernorm.weight"] = (h,)
    out["model.norm.weight"] = (h,)
    if not d.tied:
        out["lm_head.weight"] = (d.vocab, h)
    return out


def _qkv(stem: str, rows: int, d: Dims, key: str) -> List[Segment]:
    per_group = d.heads // d.groups
    span = (per_group + 2) * d.head_dim
    if rows != d.groups * span:
        raise Unmappable("%s has %d rows, not the %d of %d query groups of [%d q heads, k, v] x %d"
                         % (key, rows, d.groups * span, d.groups, per_group, d.head_dim))
    out: List[Segment] = []
    for g in range(d.groups):
        at = g * span
        out.append((stem % "q_proj", at, per_group * d.head_dim, g * per_group * d.head_dim))
        out.append((stem % "k_proj", at + per_group * d.head_dim, d.head_dim, g * d.head_dim))
        out.append((stem % "v_proj", at + (per_group + 1) * d.head_dim, d.head_dim, g * d.head_dim))
    return out


def _gated(gate: str, up: str, rows: int, ffn: int, key: str) -> List[Segment]:
    if rows != 2 * ffn:
        raise Unmappable("%s has %d rows, not [gate; up] of %d each" % (key, rows, ffn))
    return [(gate, 0, ffn, 0), (up, ffn, ffn, 0)]


# Keys of the layers' tensors (after "decoder.layers."), by what they become.
_LAYER_PLAIN = {
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    # Local specs name their norms apart; the sharded state dict gives TE's fused names either way.
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "input_layernorm.weight": "input_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "post_attention_layernorm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
}


def segments(key: str, prepend: Sequence[int], shape: Sequence[int], hf_config) -> List[Segment]:
    """Where the rows of the Megatron global tensor `key` (its shape after the prepended axes, whose
    offsets are `prepend`: the layer, then the expert) go. Unmappable for anything else."""
    fam, d = family_of(hf_config), Dims(hf_config)
    rows = int(shape[0]) if shape else 0

    def trimmed(name):
        if rows < d.vocab:
            raise Unmappable("%s has %d rows, fewer than vocab_size %d" % (key, rows, d.vocab))
        return [(name, 0, d.vocab, 0)]

    if key == "embedding.word_embeddings.weight" and not prepend:
        return trimmed("model.embed_tokens.weight")
    if key == "output_layer.weight" and not prepend:
        if d.tied:
            raise Unmappable("%s: the Megatron model has an output layer of its own but hf_config "
                             "ties it to the embedding (tie_word_embeddings)" % key)
        return trimmed("lm_head.weight")
    if key == "decoder.final_layernorm.weight" and not prepend:
        return [("model.norm.weight", 0, rows, 0)]
    if not key.startswith("decoder.layers.") or not prepend:
        raise Unmappable("Megatron parameter %r has no Hugging Face name in %s"
                         % (key, hf_config.model_type))
    rest = key[len("decoder.layers."):]
    p = "model.layers.%d." % prepend[0]
    if len(prepend) == 1:
        if rest in _LAYER_PLAIN and not (fam.moe and rest.startswith("mlp.linear_fc2")):
            return [(p + _LAYER_PLAIN[rest], 0, rows, 0)]
        if rest in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias") and (
                rest.endswith("weight") or fam.qkv_bias):
            return _qkv(p + "self_attn.%s." + rest.rsplit(".", 1)[1], rows, d, key)
        if rest == "mlp.linear_fc1.weight" and not fam.moe:
            return _gated(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight", rows, d.ffn, key)
        if rest == "mlp.router.weight" and fam.moe:
            return [(p + fam.moe[0] + ".weight", 0, rows, 0)]
        if rest.startswith("mlp.shared_experts.") and fam.shared:
            shared, gate = fam.shared[:2]
            if rest == "mlp.shared_experts.linear_fc1.weight":
                return _gated(p + shared + ".gate_proj.weight", p + shared + ".up_proj.weight", rows, d.shared, key)
            if rest == "mlp.shared_experts.linear_fc2.weight":
                return [(p + shared + ".down_proj.weight", 0, rows, 0)]
            if rest == "mlp.shared_experts.gate_weight":
                return [(p + gate + ".weight", 0, rows, 0)]
    if len(prepend) == 2 and fam.moe:
        _, experts, (gate, up, down), _ = fam.moe
        e_p = "%s%s.%d." % (p, experts, prepend[1])
        if rest == "mlp.experts.experts.linear_fc1.weight":
            return _gated(e_p + gate + ".weight", e_p + up + ".weight", rows, d.ffn, key)
        if rest == "mlp.experts.experts.linear_fc2.weight":
            return [(e_p + down + ".weight", 0, rows, 0)]
    raise Unmappable("Megatron parameter %r (layer %d%s) has no Hugging Face name in %s"
                     % (key, prepend[0], "" if len(prepend) < 2 else ", expert %d" % prepend[1],
                        hf_config.model_type))
