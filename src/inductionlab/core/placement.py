"""Where a model runs: the device its forward takes inputs on, for plain models and for models dispatched
by accelerate (``device_map="auto"``, CPU or disk offload).

A dispatched model's offloaded weights sit on the ``meta`` device between forwards; accelerate's hooks
(``module._hf_hook``) bring them to the hook's ``execution_device`` for each call. So "the device of the
first parameter" — ``next(model.parameters()).device`` — is ``meta`` there, and inputs sent to it fail
("Cannot copy out of meta tensor"). :func:`execution_device` is the one answer every protocol uses;
:func:`check_weights_present` refuses a model whose weights are on ``meta`` with nothing to load them
(built under ``init_empty_weights`` / ``device="meta"`` and never filled).
"""

from __future__ import annotations

import itertools

import torch

from ..errors import InductionLabError


def _hooks(module) -> list:
    """The accelerate hooks on ``module`` (a ``SequentialHook`` unrolled), or []."""
    hook = getattr(module, "_hf_hook", None)
    if hook is None:
        return []
    return list(getattr(hook, "hooks", None) or [hook])


def _hook_device(module) -> torch.device | None:
    for hook in _hooks(module):
        dev = getattr(hook, "execution_device", None)
        if dev is not None:
            return torch.device(dev)
    return None


def execution_device(model) -> torch.device:
    """The device ``model``'s forward takes its inputs on.

    In order: the execution device of the hook on the input embeddings (a dispatched model: where its first
    layer runs), else their weight's device; the hook on the model itself, then on any of its modules
    (CPU / disk offload); else the first parameter or buffer that is not on ``meta``; CPU for a model
    without any (an exact fake).

    Raises:
        InductionLabError: every weight on ``meta`` and no hook to load them (:func:`check_weights_present`)."""
    try:
        emb = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):      # not a transformers model (an exact fake)
        emb = None
    if isinstance(emb, torch.nn.Module):
        dev = _hook_device(emb)
        if dev is not None:
            return dev
        w = getattr(emb, "weight", None)
        if isinstance(w, torch.Tensor) and w.device.type != "meta":
            return w.device
    if isinstance(model, torch.nn.Module):
        for m in model.modules():
            dev = _hook_device(m)
            if dev is not None:
                return dev
        for t in itertools.chain(model.parameters(), model.buffers()):
            if t.device.type != "meta":
                return t.device
        check_weights_present(model)
    return torch.device("cpu")


def _offloaded(hook) -> bool:
    return bool(getattr(hook, "offload", False)) or getattr(hook, "weights_map", None) is not None


def meta_weights_without_hooks(model) -> list[str]:
    """Names of ``model``'s parameters and buffers on the ``meta`` device that no offload hook (on their
    module or one above it) loads before a forward; [] for a plain or a dispatched model."""
    if not isinstance(model, torch.nn.Module):
        return []
    modules = dict(model.named_modules())
    loaded_by_hook = {name for name, m in modules.items() if any(_offloaded(h) for h in _hooks(m))}
    out = []
    for name, t in itertools.chain(model.named_parameters(), model.named_buffers()):
        if t.device.type != "meta":
            continue
        parts = name.split(".")[:-1]
        owners = {".".join(parts[:i]) for i in range(len(parts) + 1)}     # its module and every one above it
        if not owners & loaded_by_hook:
            out.append(name)
    return out


def check_weights_present(model) -> None:
    """Refuse a model whose weights are on the ``meta`` device with no offload hook to load them: its
    forward has no numbers to compute with. A study calls it before it writes anything.

    Raises:
        InductionLabError: naming the first such weight, the count and the fix."""
    missing = meta_weights_without_hooks(model)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise InductionLabError(
            f"the model's weight {missing[0]}{more} is on the meta device (no data) and no offload hook loads it; "
            "load the weights (load_model, from_pretrained or load_state_dict), or dispatch the model with "
            "accelerate (device_map / cpu_offload) so that its hooks bring them in")


__all__ = ["execution_device", "check_weights_present", "meta_weights_without_hooks"]
