# A PEFT model's adapter written as PEFT's own save_pretrained writes it (adapter_model.safetensors and adapter_config.json), from every rank's shards.
"""PeftModel.save_pretrained writes only the adapter: the adapter's tensors
under the names get_peft_model_state_dict gives (the adapter's own name taken
out of them) into one file, adapter_model.safetensors, and its config as
adapter_config.json, written with inference_mode on. The same is written
here from each rank's state dict (DTensors included, no gather), through the
node daemons, so that PeftModel.from_pretrained loads it."""
from __future__ import annotations

import os
import tempfile

__all__ = ["peft_model", "save_adapter"]

# PEFT reads one file: the adapter is never split.
_ONE_FILE = 1 << 53  # the largest max_shard_size a begin takes


def peft_model(model):
    """model when it is a peft.PeftModel, else None (peft need not be installed)."""
    if type(model).__module__.split(".")[0] != "peft":
        return None
    try:
        import peft
    except ImportError:
        return None
    return model if isinstance(model, peft.PeftModel) else None


def _config_json(model, adapter_name) -> bytes:
    """adapter_config.json as PeftModel.save_pretrained writes it: the base model's name filled in
    when the config has none, inference_mode on, and, with no task type, the base model's class
    and library for PEFT's auto classes."""
    config = model.peft_config[adapter_name]
    base = model.get_base_model()
    if config.base_model_name_or_path is None:
        config.base_model_name_or_path = base.__dict__.get("name_or_path", None) or None
    auto_mapping = None
    if config.task_type is None:
        auto_mapping = {"base_model_class": type(base).__name__, "parent_library": type(base).__module__}
    inference_mode = config.inference_mode
    config.inference_mode = True
    try:
        with tempfile.TemporaryDirectory() as tmp:
            config.save_pretrained(tmp, auto_mapping_dict=auto_mapping)
            with open(os.path.join(tmp, "adapter_config.json"), "rb") as f:
                return f.read()
    finally:
        config.inference_mode = inference_mode


def save_adapter(model, dir, state_dict=None, files=None, adapter_name="default", **kwargs):
    """What model.save_pretrained(dir) writes for a PeftModel: its adapter's tensors in
    adapter_model.safetensors and adapter_config.json, saved from every rank's own shards."""
    from peft.utils import get_peft_model_state_dict

    from ._save import save
    from ._torch_state import state_dict_tensors

    if adapter_name not in model.peft_config:
        raise ValueError("the PEFT model has no adapter %r (it has %s)"
                         % (adapter_name, ", ".join(map(repr, model.peft_config))))
    if state_dict is None:
        state_dict = model.state_dict()
    adapter = get_peft_model_state_dict(model, state_dict=state_dict, adapter_name=adapter_name)
    all_files = {"adapter_config.json": _config_json(model, adapter_name)}
    all_files.update(files or {})
    kwargs.pop("max_shard_size", None)
    return save(state_dict_tensors(adapter), dir, prefix="adapter_model", max_shard_size=_ONE_FILE,
                files=all_files, **kwargs)
