# torch.distributed.checkpoint plugins: dcp.save / async_save / load straight into and out of shardd's HF layout.
"""shardd.torch.StorageWriter and StorageReader.

    dcp.save(state_dict, storage_writer=st.StorageWriter("run1/step-100"))
    dcp.load(state_dict, storage_reader=st.StorageReader("/ckpt/run1/step-100"))

The writer hands each rank's planned tensors to the node's daemon in one
shardd save (its boxes are DCP's chunks; DCP's planner already gave each
replicated tensor to one rank), so the checkpoint is the final HF layout
the moment it commits, its files following the state dict's order as
save_pretrained's do: no per-rank files, no second pass, no consolidation.
The tensors of a top-level dict other than "model" (an optimizer's) go in
files named after its key, beside the model's, under the one index. DCP's planning exchanges only metadata, never tensor bytes.
DCP's bytes items (the values that are not tensors: steps, schedulers, RNG
states) go into one file, each rank's part joined by the daemon, in the same
save (_dcp_bytes.py). The reader describes a shardd or save_pretrained folder to
DCP as one chunk per tensor (and those bytes items) and serves each rank's
boxes through the strict reader.
"""
from __future__ import annotations

import dataclasses
import io
import os

import torch
from torch.distributed.checkpoint import StorageReader as _Reader
from torch.distributed.checkpoint import StorageWriter as _Writer
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata, Metadata,
                                                   TensorProperties, TensorStorageMetadata)
from torch.distributed.checkpoint.planner import LoadItemType, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult

from ._dcp_bytes import BYTES_FILE, bytes_part, read_bytes_files
from ._load import Checkpoint, torch_dtype
from ._nested import series_of
from ._save import paused_gc, save
from ._hf_convert import piece_parts
from ._load_runs import read_boxes
from ._torch_load import converted
from ._tensors import Slice

__all__ = ["StorageWriter", "StorageReader"]


def _done(value):
    f = torch.futures.Future()
    f.set_result(value)
    return f


class StorageWriter(_Writer):
    """A DCP StorageWriter that saves through the node's shardd daemon into `dir` (relative to its
    root), in the HF safetensors layout. Every other keyword (max_shard_size, overwrite, metadata,
    files, keep_last, timeout, socket, ...) goes to shardd.save, as save_state_dict takes them."""

    def __init__(self, dir, **save_options):
        super().__init__()
        self.dir = os.fspath(dir)
        self.options = save_options

    def reset(self, checkpoint_id=None):
        if checkpoint_id is not None:
            self.dir = os.fspath(checkpoint_id)

    def set_up_storage_writer(self, is_coordinator, *args, **kwargs):
        pass  # every rank does the same: the daemons coordinate among themselves

    def prepare_local_plan(self, plan):
        # The state dict's order, seen before DCP drops replicas from all but one rank.
        order = list(dict.fromkeys(item.index.fqn for item in plan.items))
        return dataclasses.replace(plan, storage_data={"shardd_order": order})

    def prepare_global_plan(self, plans):
        # One order for every rank, so the files follow the state dict as save_pretrained's do:
        # the longest rank's, then whatever only others hold, in the order they hold it.
        merged = {}
        for plan in sorted(plans, key=lambda p: -len(p.storage_data["shardd_order"])):
            for fqn in plan.storage_data["shardd_order"]:
                merged.setdefault(fqn, len(merged))
        return [dataclasses.replace(plan, storage_data={"shardd_index": merged}) for plan in plans]

    def write_data(self, plan, planner):
        tensors, results, items = {}, [], {}
        name = _hf_names(planner)
        prefixes = {name(fqn): prefix for fqn, prefix in _series(planner).items()}
        for item in plan.items:
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                # A step, a scheduler, an RNG state: into this rank's part of the file beside the shards.
                items[item.index.fqn] = data.getvalue()
                results.append(WriteResult(index=item.index, size_in_bytes=len(items[item.index.fqn]),
                                           storage_data=None))
                continue
            chunk, size = item.tensor_data.chunk, item.tensor_data.size
            tensors.setdefault(name(item.index.fqn), []).append(Slice(data, tuple(size), tuple(chunk.offsets)))
            results.append(WriteResult(index=item.index, size_in_bytes=data.numel() * data.element_size(),
                                       storage_data=None))
        # Ranks hold different names once DCP has deduplicated replicas: the coordinator's indices.
        options = dict(self.options)
        if items:
            options["file_parts"] = dict(options.get("file_parts") or {}, **{BYTES_FILE: bytes_part(items)})
        ordered = {name(fqn): i for fqn, i in plan.storage_data["shardd_index"].items()}
        if prefixes:
            options["prefixes"] = {**(options.get("prefixes") or {}), **prefixes}
        save(tensors, self.dir, ordered=ordered, **options)
        return _done(results)

    def finish(self, metadata, results):
        # The daemon wrote and published the index with the shards: nothing is left to write.
        return None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return isinstance(checkpoint_id, (str, os.PathLike)) and not os.path.isabs(os.fspath(checkpoint_id))


def _hf_names(planner):
    """fqn -> checkpoint name: a top-level "model" dict's tensors (DCP's `model.` + their own name)
    keep their own names, as from_pretrained expects them; every other tensor keeps DCP's fqn."""
    paths = getattr(planner, "mappings", None) or {}
    names = {}
    for fqn, path in paths.items():
        if len(path) == 2 and path[0] == "model" and isinstance(path[1], str):
            names[fqn] = path[1]
    clash = set(names.values()) & (set(paths) - set(names))
    if clash:
        raise ValueError("state dict names %s both inside and outside its 'model' dict"
                         % ", ".join(map(repr, sorted(clash)[:5])))
    return lambda fqn: names.get(fqn, fqn)


def _series(planner):
    """fqn -> file prefix for the tensors under a top-level dict other than "model" (an
    optimizer's): they go in files named after its key, as save_state_dict puts them."""
    paths = getattr(planner, "mappings", None) or {}
    series = {fqn: series_of(path) for fqn, path in paths.items()}
    return {fqn: prefix for fqn, prefix in series.items() if prefix is not None}


# The most bytes of resolved tensors StorageReader.read_data holds before it reads and commits them.
READ_BATCH = 1 << 30


def _read_and_commit(ck, planner, fills, resolved) -> None:
    with torch.no_grad():
        read_boxes(ck, fills)
    for item, target in resolved:
        planner.commit_tensor(item, target)


class StorageReader(_Reader):
    """A DCP StorageReader over a shardd or save_pretrained checkpoint folder (a path on this
    machine): dcp.load fills tensors and DTensors of any layout, each rank reading its boxes.

    model: the transformers model being loaded, for a folder save_pretrained
    wrote with converted names (fused MoE experts as one tensor per expert
    and projection): DCP is shown the model's own names and shapes, and each
    rank reads only the per-expert boxes of its chunks."""

    def __init__(self, path, model=None):
        super().__init__()
        self.path = os.fspath(path)
        self.model = model
        self.held_as = {}
        self.byte_items = None  # DCP's bytes items, {fqn: bytes}, read with the metadata

    def reset(self, checkpoint_id=None):
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)

    def read_metadata(self, *args, **kwargs):
        entries = {}
        if self.model is not None:
            sd = self.model.state_dict()
            self.held_as = {k: v for k, v in converted(self.model, sd).items()
                            if [n for n, _ in v] != [k] or not v[0][1].is_whole(sd[k].shape)}
        with Checkpoint(self.path) as ck:
            for key, held in self.held_as.items():
                if all(name in ck for name, _ in held):
                    shape = torch.Size(sd[key].shape)
                    entries[key] = TensorStorageMetadata(
                        properties=TensorProperties(dtype=torch_dtype(ck.info(held[0][0]).dtype)), size=shape,
                        chunks=[ChunkStorageMetadata(offsets=torch.Size([0] * len(shape)), sizes=shape)])
            for name in ck:
                info = ck.info(name)
                shape = torch.Size(info.shape)
                entries[name] = TensorStorageMetadata(
                    properties=TensorProperties(dtype=torch_dtype(info.dtype)), size=shape,
                    chunks=[ChunkStorageMetadata(offsets=torch.Size([0] * len(shape)), sizes=shape)])
                # A {"model": ...} state dict asks for DCP's "model." + the name the writer kept.
                entries.setdefault("model." + name, entries[name])
        self.byte_items = read_bytes_files(self.path)
        entries.update({fqn: BytesStorageMetadata() for fqn in self.byte_items})
        return Metadata(state_dict_metadata=entries)

    def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):
        pass  # read_metadata already described everything from the folder itself

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def read_data(self, plan, planner):
        with paused_gc(), Checkpoint(self.path) as ck:
            table = ck.tensors()
            fills, resolved, held = [], [], 0
            for item in plan.items:
                if item.type == LoadItemType.BYTE_IO:
                    if self.byte_items is None:
                        self.byte_items = read_bytes_files(self.path)
                    planner.load_bytes(item, io.BytesIO(self.byte_items[item.storage_index.fqn]))
                    continue
                name = item.storage_index.fqn
                if name not in table and name.startswith("model.") and name[6:] in table:
                    name = name[6:]
                start, count = tuple(item.storage_offsets), tuple(item.lengths)
                target = planner.resolve_tensor(item).detach()
                if name in self.held_as:
                    for source, piece in self.held_as[name]:
                        fills.extend((source, view, at, n) for view, at, n in
                                     piece_parts(piece, target, [(start, count, (0,) * len(start))]))
                else:
                    fills.append((name, target, start, count))
                resolved.append((item, target))
                held += target.numel() * target.element_size()
                # Read together, file by file; committed in batches, as a planner's resolve_tensor
                # may hand out a buffer of its own for each item.
                if held >= READ_BATCH:
                    _read_and_commit(ck, planner, fills, resolved)
                    fills, resolved, held = [], [], 0
            _read_and_commit(ck, planner, fills, resolved)
        return _done(None)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return os.path.isdir(os.fspath(checkpoint_id))
