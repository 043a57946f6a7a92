"""Static facts of a model's architecture that decide, before any forward, whether the instrumentation can
name its heads (checks 1-3 of the policy in :mod:`inductionlab.core.support`), and its sliding window.

:func:`refuse_static` runs in every :func:`~inductionlab.core.instrument.instrument` context (cached per
model); :func:`window_note` is what a run records when its sequences outrun the model's sliding window.
"""

from __future__ import annotations

import contextlib
import re
import weakref

from .attention import UnsupportedArchitecture
from .models import attention_shape

# model types whose layers hold no softmax attention (transformers' state-space and recurrent models)
NO_ATTENTION = {"mamba": "Mamba (state-space)", "mamba2": "Mamba-2 (state-space)",
                "falcon_mamba": "Falcon-Mamba (state-space)", "rwkv": "RWKV (linear recurrence)",
                "xlstm": "xLSTM (recurrent)"}
# model types whose heads are differences of two softmax maps (Ye et al. 2024, "Differential Transformer")
DIFFERENTIAL = {"diffllama"}

_ATTENTION_CLASS = re.compile(r"Attention|Attn|MLA")     # class names of attention modules (any kind)


def refusal(model, reason: str) -> UnsupportedArchitecture:
    """The one-line refusal ``"<Class> (<model_type>) <reason>"``."""
    mt = getattr(model.config, "model_type", "?")
    return UnsupportedArchitecture(f"{type(model).__name__} ({mt}) {reason}")


_STATIC: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # model -> its static_reason, once per model


def static_reason(model) -> str | None:
    """Checks 1-3 (no forward): the refusal reason, or None. Computed once per model (every
    :func:`~inductionlab.core.instrument.instrument` context asks)."""
    try:
        return _STATIC[model]
    except (KeyError, TypeError):
        pass
    reason = _static_reason(model)
    with contextlib.suppress(TypeError):
        _STATIC[model] = reason
    return reason


def refuse_static(model) -> None:
    """Raise :class:`~inductionlab.core.attention.UnsupportedArchitecture` for a model that checks 1-3 refuse
    (the API's contexts call it: a model built without :func:`~inductionlab.core.models.load_model`)."""
    reason = static_reason(model)
    if reason:
        raise refusal(model, reason)


def _static_reason(model) -> str | None:
    mt = getattr(model.config, "model_type", "")
    if mt in NO_ATTENTION or not any(_ATTENTION_CLASS.search(type(m).__name__) for m in model.modules()):
        what = NO_ATTENTION.get(mt, "a model without attention modules")
        return f"has no attention layers ({what}): there is no head to score or ablate"
    if mt in DIFFERENTIAL:
        return ("uses differential attention: a head is two maps (two softmax patterns subtracted, then "
                "normalised over the group), so neither one output slice nor one attention map names it")
    try:
        attention_shape(model.config)
    except Exception as e:  # noqa: BLE001 - transformers' per-layer configs raise their own kinds
        detail = " ".join(str(e).split())[:160]
        return f"has no single head grid: its config gives sizes per layer ({type(e).__name__}: {detail})"
    return None


_SLIDING = ("sliding_attention", "local", "chunked_attention")


def sliding_window(config) -> int | None:
    """The attention window of the model's sliding-window layers (keys further back than it are masked), or
    None when no layer slides: ``sliding_window`` (Mistral, Gemma 2/3, Qwen2 with ``use_sliding_window``),
    ``window_size`` (GPT-Neo's local layers) or ``attention_window_size``, counted only where the config's
    ``layer_types`` / ``attention_layers`` name a sliding or local layer (when it lists them)."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(cfg, "use_sliding_window", True) is False:
        return None
    w = next((v for k in ("sliding_window", "window_size", "attention_window_size")
              if isinstance(v := getattr(cfg, k, None), int) and not isinstance(v, bool) and v > 0), None)
    types = getattr(cfg, "layer_types", None) or getattr(cfg, "attention_layers", None)
    if w is None or (types is not None and not any(t in _SLIDING for t in types)):
        return None
    return w


def window_note(config, tokens: int, what: str) -> str | None:
    """The warning a run records when ``what``'s sequences of ``tokens`` tokens are longer than the model's
    sliding window (:func:`sliding_window`): its sliding layers cannot attend back over the whole sequence, so
    a lag, an induction score or a copy further back than the window is measured through the other layers
    only. None when the window covers the sequences (or nothing slides)."""
    w = sliding_window(config)
    if w is None or tokens <= w:
        return None
    return (f"{what}: sequences of {tokens} tokens are longer than the model's sliding attention window of {w} "
            f"tokens: its sliding-window layers see only the last {w} tokens, so what lies further back is measured "
            "through its full-attention layers only")
