# shardd.megatron: Megatron-core models saved as, and loaded from, Hugging Face checkpoints, each rank handing over only its own shards.
"""Megatron-core GPT models to Hugging Face checkpoints with no gather.

    import shardd.megatron as sm
    sm.save_hf_weights(model, "run1/hf-step-100", hf_config=cfg)   # every rank, its own chunks
    sm.load_hf_weights(model, "/ckpt/Llama-3-8B")                  # every rank, any TP/PP/EP layout

Each rank reads where its local shards lie from the model's own
sharded_state_dict() (Megatron's ShardedTensors: global shape, offset and
replica id), maps those boxes to Hugging Face names and boxes
(_megatron_map: q/k/v out of each query group of linear_qkv, gate/up out
of linear_fc1, the padded vocab trimmed, global layer and expert numbers),
and hands them to the node's daemon through shardd.save; no collective
carries a tensor byte, and a replica (replica id not all zero) is handed
over by its one primary holder. Every rank declares every HF tensor (an
empty box where it holds none), so a tensor no rank covers fails the save
as `gap` rather than going missing from the index. Loading reads each
rank's boxes straight into its parameters.

A model, layout or parameter outside the table is refused (ShardError
"invalid_argument", naming it) before the daemon hears of the save.
megatron-core itself is never imported here: the model brings it.
"""
from __future__ import annotations

import copy
import os
import re
from typing import Any, Dict, List, Tuple

from ._errors import refusal
from ._megatron_map import Unmappable, check_config, hf_tensors, segments
from ._tensors import Slice

__all__ = ["save_hf_weights", "load_hf_weights", "hf_boxes"]

# (hf name, local view, start in the HF tensor, HF shape)
HFBox = Tuple[str, Any, Tuple[int, ...], Tuple[int, ...]]


def _gpt(chunk):
    """The GPTModel inside DDP / Float16Module wrappers."""
    inner = chunk
    while not hasattr(inner, "share_embeddings_and_output_weights") and hasattr(inner, "module"):
        inner = inner.module
    if not hasattr(inner, "sharded_state_dict") or not hasattr(inner, "share_embeddings_and_output_weights"):
        raise Unmappable("model chunk %s is not a Megatron-core GPTModel (nor one wrapped in .module)"
                         % type(chunk).__name__)
    return inner


def _chunks(model) -> List[Any]:
    chunks = list(model) if isinstance(model, (list, tuple)) else [model]
    if not chunks:
        raise Unmappable("model is an empty list of chunks")
    return [_gpt(c) for c in chunks]


def _flatten(value, out: List[Any], where: str) -> None:
    """Every ShardedTensor in a sharded state dict, factories built; _extra_state objects left out."""
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(v, out, "%s.%s" % (where, k) if where else str(k))
    elif isinstance(value, (list, tuple)):
        for v in value:
            _flatten(v, out, where)
    elif hasattr(value, "prepend_axis_num") and hasattr(value, "global_offset"):  # ShardedTensor
        out.append(value)
    elif callable(getattr(value, "build", None)) and hasattr(value, "key"):  # ShardedTensorFactory
        _flatten(value.build(), out, where)
    elif str(getattr(value, "key", "")).endswith("_extra_state") or value is None:
        return  # TransformerEngine's FP8 metadata: not a weight
    else:
        raise Unmappable("sharded state dict entry %r is a %s, not a tensor shardd.megatron maps"
                         % (getattr(value, "key", where), type(value).__name__))


def _sharded_tensors(gpt) -> List[Any]:
    out: List[Any] = []
    _flatten(gpt.sharded_state_dict(), out, "")
    for st in out:
        if getattr(st, "flattened_range", None) is not None:
            raise Unmappable("%s is a flattened (distributed optimizer) shard, not a model parameter"
                             % st.key)
    return out


def _primary(st) -> bool:
    rid = st.replica_id
    return all(int(r) == 0 for r in (rid if isinstance(rid, (tuple, list)) else (rid,)))


# Grouped-GEMM experts (GroupedMLP) give one tensor per layer under these keys, with the expert
# as its first real axis; SequentialMLP gives one per expert, the expert prepended. Same rows.
_GROUPED = ("decoder.layers.mlp.experts.experts.linear_fc1.weight",
            "decoder.layers.mlp.experts.experts.linear_fc2.weight")


def _pieces(st):
    """[(key, prepend offsets, global shape, offset, local tensor)] of one ShardedTensor (after its
    prepended axes), a grouped-GEMM experts tensor cut into its experts."""
    p = int(st.prepend_axis_num)
    shape, offset = tuple(int(x) for x in st.global_shape[p:]), tuple(int(x) for x in st.global_offset[p:])
    local = st.data
    if len(local.shape) != len(shape) or any(o + c > g for o, c, g in zip(offset, local.shape, shape)):
        raise Unmappable("%s: the local tensor's shape %s does not fit its global shape %s"
                         % (st.key, list(local.shape), list(st.global_shape)))
    prepend = tuple(int(o) for o in st.global_offset[:p])
    if st.key in _GROUPED and p == 1 and len(shape) == 3:
        return [(st.key, prepend + (offset[0] + i,), shape[1:], offset[1:], local[i])
                for i in range(local.shape[0])]
    return [(st.key, prepend, shape, offset, local)]


def _boxes_of(st, hf_config, expected) -> List[HFBox]:
    """The HF boxes of one ShardedTensor's local tensor, each checked to lie inside its HF tensor."""
    out: List[HFBox] = []
    for key, prepend, shape, offset, local in _pieces(st):
        if not shape:
            raise Unmappable("%s is a scalar, which no HF tensor of this family is" % key)
        lo, n = offset[0], int(local.shape[0])
        for name, src, rows, dst in segments(key, prepend, shape, hf_config):
            hf_shape = expected.get(name)
            if hf_shape is None or tuple(hf_shape[1:]) != tuple(shape[1:]) or dst + rows > hf_shape[0]:
                raise Unmappable("Megatron parameter %r (global shape %s) maps to %s rows [%d, %d), but "
                                 "hf_config gives %s" % (st.key, list(st.global_shape), name, dst, dst + rows,
                                                         "no such tensor" if hf_shape is None
                                                         else "shape %s" % list(hf_shape)))
            a, b = max(lo, src), min(lo + n, src + rows)
            if a < b:
                start = (dst + a - src,) + offset[1:]
                out.append((name, local[a - lo:b - lo], start, tuple(hf_shape)))
    return out


def hf_boxes(model, hf_config, replicas: bool = False) -> Tuple[Dict[str, Tuple[int, ...]], List[HFBox]]:
    """({HF name: shape} of the whole checkpoint, [this rank's HF boxes]) of a model (one chunk or a
    list, VPP), checked against hf_config. replicas=True also gives the boxes of tensors another
    rank hands over (for loading); by default only those this rank is the primary holder of.
    Unmappable (a ValueError) names whatever does not fit."""
    chunks = _chunks(model)
    for gpt in chunks:
        check_config(gpt, hf_config)
    expected = hf_tensors(hf_config)
    boxes: List[HFBox] = []
    for gpt in chunks:
        for st in _sharded_tensors(gpt):
            mine = _boxes_of(st, hf_config, expected)
            if replicas or _primary(st):
                boxes.extend(mine)
    return expected, boxes


def _kind(name: str) -> str:
    """An HF name with its layer and expert numbers left out."""
    return re.sub(r"\.\d+\.", ".#.", name)


def _rank_world(options):
    import torch.distributed as dist

    if "rank" not in options and "world_size" not in options and dist.is_available() and dist.is_initialized():
        options = dict(options, rank=dist.get_rank(), world_size=dist.get_world_size())
    return options


def _config_files(hf_config, dtype) -> Dict[str, bytes]:
    from ._hf import config_json_files
    from ._megatron_map import family_of

    cfg = copy.deepcopy(hf_config)
    if not getattr(cfg, "architectures", None):
        cfg.architectures = [family_of(hf_config).architecture]
    cfg.dtype = str(dtype).split(".")[1]
    return config_json_files(cfg)


def save_hf_weights(model, path, hf_config=None, show_progress: bool = False, strict: bool = True,
                    distributed_save: bool = True, save_every_n_ranks: int = 1, **options):
    """Writes the Hugging Face checkpoint of a Megatron-core GPTModel (or a list of its VPP chunks) to
    `path` in one atomic save, each rank handing its own shards' boxes to its node's daemon.

    Every rank calls it with its model chunks and hf_config, the transformers
    config of the family it becomes (llama, qwen2, mixtral). Written: the HF
    tensors under their names (the padded vocab trimmed to vocab_size, a tied
    embedding once), config.json, and the index when several files. The
    call takes Megatron-Bridge's save_hf_weights arguments: show_progress,
    distributed_save and save_every_n_ranks change nothing (every rank always
    writes its own part), strict=False is refused (nothing is ever guessed).
    rank and world_size default to torch.distributed's. Every other option
    goes to shardd.save (max_shard_size, wait=False, timeout, overwrite,
    keep_last, socket, ...). Refusals (ShardError "invalid_argument") come
    before the daemon hears of the save.
    """
    from ._save import save

    if hf_config is None:
        raise refusal("invalid_argument", "save_hf_weights needs hf_config=, the transformers config "
                                          "of the family to write")
    if not strict:
        raise refusal("invalid_argument", "strict=False would skip parameters it cannot map; "
                                          "shardd.megatron maps every parameter or refuses")
    if not isinstance(save_every_n_ranks, int) or save_every_n_ranks < 1:
        raise refusal("invalid_argument", "save_every_n_ranks must be an integer >= 1")
    try:
        expected, boxes = hf_boxes(model, hf_config)
    except Unmappable as e:
        raise refusal("invalid_argument", str(e)) from None
    tensors: Dict[str, List[Slice]] = {name: [] for name in expected}
    # A rank declares a tensor it holds none of in the dtype its own tensors of that kind have
    # (the same module in another layer or expert), else params_dtype; a wrong guess there
    # fails the save as a mismatch naming the tensor, never writes it wrong.
    kinds: Dict[str, Any] = {}
    for name, view, start, shape in boxes:
        tensors[name].append(Slice(view, shape, start))
        if kinds.setdefault(_kind(name), view.dtype) != view.dtype:
            raise refusal("invalid_argument", "%s is %s but other tensors of its kind are %s"
                          % (name, view.dtype, kinds[_kind(name)]))
    dtype = _chunks(model)[0].config.params_dtype
    for name, shape in expected.items():
        if not tensors[name]:  # declared, so that a tensor nobody holds fails as a gap
            import torch

            empty = torch.empty((0,) + shape[1:], dtype=kinds.get(_kind(name), dtype))
            tensors[name].append(Slice(empty, shape, (0,) * len(shape)))
    files = _config_files(hf_config, dtype)
    files.update(options.pop("files", None) or {})
    order = {name: i for i, name in enumerate(expected)}
    return save(tensors, os.fspath(path), ordered=order, files=files, **_rank_world(options))


def load_hf_weights(model, path, hf_config=None, verify: bool = False) -> None:
    """Fills every local parameter of a Megatron-core GPTModel (or a list of its VPP chunks) from the
    Hugging Face checkpoint folder `path`, each rank reading only its own boxes, in any TP, PP,
    VPP and EP layout.

    hf_config defaults to the folder's config.json. Every box is checked
    (present, shape, dtype) before a byte is read: a ShardError ("mismatch"
    or "invalid_argument") names what does not fit, and leaves the model as
    it was. Rows of Megatron's padded vocab beyond vocab_size are left as
    they were. verify=True checks the files' recorded checksums first.
    """
    import torch

    from ._load import Checkpoint
    from ._load_runs import read_boxes
    from ._torch_load import _check

    path = os.fspath(path)
    if hf_config is None:
        from transformers import AutoConfig

        hf_config = AutoConfig.from_pretrained(path)
    try:
        _, boxes = hf_boxes(model, hf_config, replicas=True)
    except Unmappable as e:
        raise refusal("invalid_argument", str(e)) from None
    _check_covered(model, boxes)
    with Checkpoint(path) as ck:
        wrong = ["%r is missing" % name if name not in ck else _check(ck, name, shape, view.dtype)
                 for name, view, start, shape in boxes]
        wrong = [w for w in wrong if w]
        if wrong:
            raise refusal("mismatch", "%s does not fit the model (nothing was filled): %s"
                          % (path, "; ".join(sorted(set(wrong)))))
        if verify:
            ck.verify()
        with torch.no_grad():
            read_boxes(ck, [(name, view, start, tuple(view.shape)) for name, view, start, _ in boxes])


def _check_covered(model, boxes) -> None:
    """Refuses a parameter that no sharded tensor fills (it would keep its old values unseen)."""
    filled = set()
    for _, view, _, _ in boxes:
        filled.add(view.untyped_storage().data_ptr())
    for gpt in _chunks(model):
        for name, p in gpt.named_parameters():
            if p.numel() and p.untyped_storage().data_ptr() not in filled:
                raise refusal("invalid_argument", "Megatron parameter %r is in no sharded tensor this "
                                                  "table maps, so loading would leave it as it is" % name)
