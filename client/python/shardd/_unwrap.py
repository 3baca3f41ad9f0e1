# The model save_pretrained writes: the wrappers transformers and accelerate take off are taken off; any other module that is not a PreTrainedModel is refused.
"""A wrapped model saved as it is would publish the wrapper's names
(`_orig_mod.*`, `module.*`, `base_model.model.*`) and class, which
from_pretrained loads as random weights without an error. So the wrappers
that transformers' and accelerate's own unwrapping removes are removed here
(torch.compile's OptimizedModule, DistributedDataParallel, DataParallel),
and anything else that is not a PreTrainedModel (an nn.Sequential around one,
a PEFT model inside another wrapper, ...) is refused before the daemon hears
of the save. A PEFT model itself is saved as its adapter (_peft.py).
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

__all__ = ["unwrap_model"]


def _inner(module) -> Optional[Tuple[Any, str]]:
    """(the wrapped module, the prefix the wrapper adds to its state dict's names), or None."""
    import torch

    compiled = getattr(getattr(torch, "_dynamo", None), "eval_frame", None)
    if compiled is not None and isinstance(module, compiled.OptimizedModule):
        return module._orig_mod, "_orig_mod."
    if isinstance(module, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
        return module.module, "module."
    return None


def unwrap_model(model, state_dict: Optional[Dict[str, Any]] = None):
    """(the PreTrainedModel inside `model`, `state_dict` with the wrappers' prefixes taken off its
    names). Raises TypeError naming the class of anything else."""
    from transformers import PreTrainedModel

    prefix = ""
    while not isinstance(model, PreTrainedModel):
        inner = _inner(model)
        if inner is None:
            cls = type(model)
            hint = ""
            if cls.__module__.split(".")[0] == "peft":
                hint = ("; pass the PEFT model itself (its adapter is written as PEFT writes it), "
                        "not wrapped")
            raise TypeError("shardd.torch.save_pretrained saves a transformers PreTrainedModel, or one "
                            "wrapped by torch.compile, DistributedDataParallel or DataParallel; got "
                            "%s.%s%s. Save other modules with save_state_dict"
                            % (cls.__module__, cls.__qualname__, hint))
        model, added = inner
        prefix += added
    if state_dict is not None and prefix:
        # A state dict taken from the wrapper carries its prefixes; the checkpoint must not.
        state_dict = {(k[len(prefix):] if k.startswith(prefix) else k): v for k, v in state_dict.items()}
    return model, state_dict
