# bench_torch's MoE models: a Qwen3-MoE-shaped and a DeepSeek-V3-shaped model, fused experts under EP x 4 or FSDP2 x 4.
"""The MoE layouts of bench_torch.py:

  qwen3moe_ep4    Qwen3-MoE-shaped, 64 experts per layer, experts Shard(0) on a 4-rank ep mesh
                  (torchtitan's expert parallel), every other parameter FSDP2 over the 4 ranks
  qwen3moe_fsdp4  the same model, FSDP2 x 4 over everything (experts Shard(0), 16 a rank)
  dsv3_ep4        DeepSeek-V3-shaped: 61 layers (3 dense), 256 routed experts and a shared one, MLA,
                  the real names and tensor count (58 x 256 x 3 = 44,544 expert matrices), dims
                  scaled down; experts as in qwen3moe_ep4

Sizes: --moe-hidden and --moe-inter (defaults: 1024 and 256 for qwen3moe, 8 layers; 128 and
80 for dsv3) give about 1 GiB in bf16. The per-expert ways and the fused ones (DCP, which has no
conversion) are compared within their kind.
"""
import os

LAYOUTS = ("qwen3moe_ep4", "qwen3moe_fsdp4", "dsv3_ep4")


def is_moe(layout):
    return layout in LAYOUTS


def config(args, layout):
    from transformers import DeepseekV3Config, Qwen3MoeConfig

    dsv3 = layout.startswith("dsv3")
    hidden = args.get("moe_hidden") or (128 if dsv3 else 1024)
    inter = args.get("moe_inter") or (80 if dsv3 else 256)
    if dsv3:
        return DeepseekV3Config(vocab_size=args["vocab"], hidden_size=hidden, intermediate_size=4 * inter,
                                moe_intermediate_size=inter, num_hidden_layers=61, first_k_dense_replace=3,
                                n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8,
                                num_attention_heads=4, num_key_value_heads=4, q_lora_rank=hidden // 2,
                                kv_lora_rank=hidden // 4, qk_rope_head_dim=16, qk_nope_head_dim=32,
                                v_head_dim=32, n_group=8, topk_group=4, tie_word_embeddings=False)
    return Qwen3MoeConfig(vocab_size=args["vocab"], hidden_size=hidden, intermediate_size=4 * inter,
                          moe_intermediate_size=inter, num_hidden_layers=args["layers"], num_experts=64,
                          num_experts_per_tok=8, num_attention_heads=16, num_key_value_heads=4,
                          head_dim=hidden // 16, tie_word_embeddings=False)


def build_model(args, layout):
    """The model on the meta device, laid out, then each rank's own shards made on the CPU."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard, distribute_tensor
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(config(args, layout), dtype=torch.bfloat16)
    mesh = init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))
    experts = [layer.mlp.experts for layer in m.model.layers if hasattr(layer.mlp, "experts")]
    ignored = set()
    if layout.endswith("_ep4"):
        for e in experts:
            for key, p in list(e.named_parameters(recurse=False)):
                e._parameters[key] = torch.nn.Parameter(distribute_tensor(p, mesh, [Shard(0)], src_data_rank=None))
                ignored.add(e._parameters[key])
    for layer in m.model.layers:
        fully_shard(layer, mesh=mesh, ignored_params=ignored or None)
    fully_shard(m, mesh=mesh, ignored_params=ignored or None)
    m.to_empty(device="cpu")
    return m


def saved_tensors(m, full):
    """What transformers' save_pretrained writes from a full state dict: tied names dropped,
    the experts converted back to one tensor each."""
    from transformers import modeling_utils
    from transformers.core_model_loading import revert_weight_conversion

    return revert_weight_conversion(m, modeling_utils.remove_tied_weights_from_state_dict(full, m))


def save_like_transformers(tensors, path, max_shard_size):
    """The files transformers' save_pretrained writes for these tensors (huggingface_hub's split;
    safetensors' save_file of each shard, the per-expert views of one storage included; the
    index): huggingface_hub's save_torch_state_dict refuses views that do not cover their storage."""
    import json

    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors.torch import save_file

    split = split_torch_state_dict_into_shards(tensors, max_shard_size=max_shard_size)
    for name, keys in split.filename_to_tensors.items():
        save_file({k: tensors[k].contiguous() for k in keys}, os.path.join(path, name), metadata={"format": "pt"})
    if split.is_sharded:
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": split.metadata, "weight_map": split.tensor_to_filename}, f, indent=2)
