"""Non-finite values (NaN, ±inf) in a model, found where they first appear and named.

A NaN in one weight spreads through every later layer: each measure then averages NaN, and the
first symptom used to be a pandas error about "all NA values" while the report was written. Two
checks, both raising one :class:`~inductionlab.errors.InductionLabError` line:

1. :func:`check_finite_weights`, before a study writes anything: the first parameter (in
   the model's own order) holding a NaN or an inf is named, with the counts (``lm_head.weight: 3 NaN
   of 22,528 values``).
2. :func:`finite_outputs`, while a study runs: a hook on the model's forward checks its logits; on the
   first non-finite logit it runs the same forward again with a hook on every sub-module and names the
   first module (in call order) whose output is non-finite — an overflow of the dtype when every
   weight is finite (float16's largest value is 65,504), with the fix.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from ..errors import InductionLabError


def _counts(t: torch.Tensor) -> str:
    nan = int(torch.isnan(t).sum())
    inf = int(torch.isinf(t).sum())
    parts = [f"{nan:,} NaN"] * bool(nan) + [f"{inf:,} inf"] * bool(inf)
    return f"{' and '.join(parts)} of {t.numel():,} values"


def first_nonfinite_weight(model: torch.nn.Module) -> tuple[str, torch.Tensor] | None:
    """The first (name, tensor) of the model's parameters holding a NaN or an inf; None if all are finite.
    Weights on the meta device (not loaded) are skipped; buffers too (a causal mask may hold -inf)."""
    for name, t in model.named_parameters():
        if not _finite(t):
            return name, t
    return None


def check_finite_weights(model: torch.nn.Module, what: str = "the model") -> None:
    """Refuse a model with a non-finite weight, naming the first one.

    Raises:
        InductionLabError: ``<what>: weight lm_head.weight holds 3 NaN of 22,528 values; ...``."""
    bad = first_nonfinite_weight(model)
    if bad is not None:
        name, t = bad
        raise InductionLabError(f"{what}: weight {name} holds {_counts(t.detach())}, so every output computed "
                                "from it is NaN or inf; repair or re-download the checkpoint")


def check_nonzero_weights(model: torch.nn.Module, what: str = "the model") -> None:
    """Refuse a degenerate model whose every weight matrix is zero: its logits do not depend on its input, so
    no head can be scored or ablated (the self-check would blame the instrumentation). Weights on the meta device
    are skipped; a model without matrices (a fake) passes.

    Raises:
        InductionLabError: ``<what>: every one of its N weight matrices is zero; ...``."""
    mats = [p for p in model.parameters() if p.dim() >= 2 and not p.is_meta]
    if mats and not any(bool(p.detach().any()) for p in mats):
        raise InductionLabError(f"{what}: every one of its {len(mats)} weight matrices is zero, so its output does not "
                                "depend on its input and no head can be measured; load a trained (or randomly "
                                "initialised) checkpoint")


def _tensor(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return None


def _finite(t: torch.Tensor | None) -> bool:
    """No NaN and no inf; the common case from ``aminmax`` (NaN propagates; no tensor of the logits' size
    is allocated, where ``isfinite`` would take one byte per logit)."""
    if t is None or not t.is_floating_point() or t.numel() == 0 or t.device.type == "meta":
        return True
    lo, hi = torch.aminmax(t.detach())
    return bool(torch.isfinite(lo)) and bool(torch.isfinite(hi))


def _logits_ok(t: torch.Tensor | None) -> bool:
    """No NaN, no +inf, and no row of only -inf (a -inf logit alone is a masked token: probability 0)."""
    if _finite(t):
        return True
    return not (bool(torch.isnan(t).any()) or bool(torch.isposinf(t).any())
                or bool(torch.isneginf(t).all(dim=-1).any()))


def _first_module(model: torch.nn.Module, args, kwargs) -> tuple[str, torch.nn.Module, torch.Tensor] | None:
    """Run ``model(*args, **kwargs)`` again with a hook on every sub-module; the first (in call order)
    whose output is non-finite."""
    found: list = []
    names = {m: n for n, m in model.named_modules() if n}

    def hook(module, _args, out):
        if not found and module in names:
            t = _tensor(out)
            if not _finite(t):
                found.append((names[module], module, t.detach()))

    handles = [m.register_forward_hook(hook) for m in names]
    try:
        with torch.no_grad():
            model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return found[0] if found else None


def _message(model: torch.nn.Module, logits: torch.Tensor, args, kwargs) -> str:
    bad = first_nonfinite_weight(model)
    if bad is not None:
        return (f"the model's logits hold {_counts(logits)}: weight {bad[0]} holds {_counts(bad[1].detach())}; "
                "repair or re-download the checkpoint")
    dtype = str(logits.dtype).removeprefix("torch.")
    try:
        first = _first_module(model, args, kwargs)
    except Exception:  # noqa: BLE001 - a forward that cannot run twice (a cache it extends): name no module
        first = None
    where = (f"they first appear in the output of {first[0]} ({type(first[1]).__name__}: {_counts(first[2])})"
             if first else "no sub-module could be named as their source")
    fix = ("the activations overflow float16 (largest value 65,504): run with --dtype float32 or bfloat16"
           if logits.dtype == torch.float16 or (first and first[2].dtype == torch.float16) else
           f"every weight is finite, so an activation overflows {dtype}: check the scale of the weights of "
           f"{first[0] if first else 'the LM head'} and of the modules before it")
    return f"the model's logits hold {_counts(logits)} on a forward pass; {where}; {fix}"


@contextlib.contextmanager
def finite_outputs(model: torch.nn.Module) -> Iterator[None]:
    """While open, every forward pass of ``model`` whose logits hold a NaN or an inf raises one
    :class:`InductionLabError` line naming where they first appear (module docstring)."""
    busy = []

    def hook(module, args, kwargs, out):
        if busy:
            return None
        logits = _tensor(out)
        if _logits_ok(logits):
            return None
        busy.append(1)
        try:
            msg = _message(model, logits.detach(), args, kwargs)
        finally:
            busy.clear()
        raise InductionLabError(msg)

    handle = model.register_forward_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()
