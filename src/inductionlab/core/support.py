"""The supported-architecture policy: which causal LMs the instrumentation measures, checked once per model.

A model is measured when each of its layers runs one softmax attention through the ``"inductionlab"``
attention function (:mod:`inductionlab.core.attention`) and what the instrumentation reads and writes
there is what the model computes: a head is then one slice of the output projection's input, and one
attention map. Anything else is refused with one line naming the reason, before anything is written:
:func:`load_model` here (``inductionlab.load_model``, the command line, lm-eval's model type) and the study
engine's opening call :func:`check_supported`; every instrumentation context runs checks 1-3
(:mod:`inductionlab.core.architecture`, no forward).

The checks, in order (each refusal raises :class:`~inductionlab.core.attention.UnsupportedArchitecture`):

1. **no attention** — a state-space or recurrent model (:data:`~inductionlab.core.architecture.NO_ATTENTION`, or no module whose class
   name holds ``Attention``, ``Attn`` or ``MLA``): "has no attention layers";
2. **differential attention** (:data:`~inductionlab.core.architecture.DIFFERENTIAL`): a head's output is the difference of two softmax maps
   normalised over the group — "a head is two maps", so neither one slice nor one map names it;
3. **one head grid** — the config gives one number of layers and heads (not per-layer sizes);
4. **causal** — the logits before the last position do not move when the last token changes (an encoder
   used as a decoder, or a decoder config with ``is_decoder`` off, is bidirectional);
5. **dispatch** — in an instrumented forward every layer ``0..L-1`` calls the attention function exactly
   once with the config's number of query heads: none called is "does not dispatch through transformers'
   attention interface", some is a **hybrid** (its other layers are state-space or linear attention, whose
   heads cannot be named in the grid), a layer called twice is a weight-shared loop;
6. **transparent** — the instrumented forward without interventions equals the plain one;
7. **patterns** — the per-head maps read inside the call equal the model's own ``output_attentions``
   under eager attention (where the model returns them);
8. **a head is a slice** — zero-ablating head 0 of every layer inside the call equals zeroing its slice
   of the output projection's input (where the projection is found: a Linear named ``o_proj``,
   ``out_proj``, ``dense``, ``c_proj``, ``wo`` or ``o`` whose input is ``heads x value head size`` wide;
   a model without one is refused: a head could not be checked to be a slice).

Checks 4-8 run on one row of :data:`PROBE_TOKENS` tokens: seven forwards of an 8-token input (well
under a second on a CPU for a 1B model). Tolerances: 1e-4 in float32, 3e-2 in half precision, times
the largest logit magnitude when that exceeds 1 (checks 4, 6, 8); 1e-4 / 1e-2 on probabilities (7).
tests/test_architectures.py runs the policy on every causal-LM architecture transformers ships and
checks each measured one against an independent hook reference.
"""

from __future__ import annotations

import contextlib
import os
import weakref

import torch

from ..errors import InductionLabError
from ..names import DEFAULT_MODEL
from .architecture import refusal, static_reason
from .attention import UnsupportedArchitecture, _model_attention_modules
from .models import LoadedModel, attention_shape
from .models import load_model as _load

PROBE_TOKENS = 8

_CHECKED: "weakref.WeakSet" = weakref.WeakSet()     # models that passed, once per model
_OUT_PROJ = ("o_proj", "out_proj", "dense", "c_proj", "wo", "Wo", "o")


def _tol(dtype: torch.dtype, scale: float) -> float:
    return (1e-4 if dtype == torch.float32 else 3e-2) * max(1.0, scale)


def _dtype(model) -> torch.dtype:
    p = next(model.parameters(), None)
    return p.dtype if p is not None else torch.float32


def _device(model) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def _probe_ids(vocab: int, device) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    lo = min(8, max(vocab // 4, 1))
    return torch.randint(lo, max(vocab - 1, lo + 1), (1, PROBE_TOKENS), generator=g).to(device)


def _out_projection(module, width: int):
    for name in _OUT_PROJ:
        proj = getattr(module, name, None)
        proj = getattr(proj, "linear", proj)          # a wrapper holding its Linear
        if isinstance(proj, torch.nn.Linear) and proj.in_features == width:
            return proj
        if type(proj).__name__ == "Conv1D" and proj.weight.shape[0] == width:
            return proj
    return None


@contextlib.contextmanager
def _zero_slices(projections, width: int, head: int = 0):
    """Forward pre-hooks zeroing ``head``'s ``width``-wide input slice of each projection."""
    def hook(mod, args):
        x = args[0].clone()
        x[..., head * width:(head + 1) * width] = 0
        return (x,) + tuple(args[1:])
    handles = [p.register_forward_pre_hook(hook) for p in projections]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def check_supported(model) -> None:
    """Refuse a model the instrumentation would not measure exactly (the policy of this module's docstring).

    Args:
        model: a transformers causal LM (or a LoadedModel bundle), in eval mode or not (the probe runs in
            eval mode; the model's modes and attention implementation are restored).

    Raises:
        UnsupportedArchitecture: one line, ``"<Class> (<model_type>) <reason>"``.
    """
    from .instrument import ablate, eval_mode, instrument, unwrap_model

    model = unwrap_model(model)
    if model in _CHECKED:
        return
    reason = static_reason(model)
    if reason:
        raise refusal(model, reason)
    shape = attention_shape(model.config)
    L, H = shape["n_layers"], shape["n_heads"]
    dtype, device = _dtype(model), _device(model)
    ids = _probe_ids(shape["vocab_size"], device)
    alt = ids.clone()
    alt[0, -1] = ids[0, -1] - 1 if int(ids[0, -1]) > 0 else 1
    with torch.inference_mode(), eval_mode(model):
        plain = model(input_ids=ids).logits.float()
        scale = float(plain.abs().max())
        moved = float((model(input_ids=alt).logits.float()[:, :-1] - plain[:, :-1]).abs().max())
        if moved > _tol(dtype, scale):
            raise refusal(model, f"is not causal: changing the last token moves the earlier positions' logits by "
                                 f"{moved:.3g} (bidirectional attention, e.g. an encoder or a config with is_decoder "
                                 "off); the probes read next-token predictions of a causal LM")
        modules = _model_attention_modules(model)
        if not modules:
            raise refusal(model, "does not dispatch through transformers' attention interface (no attention module "
                                 "carries a layer index), so no head can be instrumented")
        try:
            with instrument(model, keep_patterns=True, need_probs=True, strict=False) as inst:
                same = model(input_ids=ids).logits.float()
        except UnsupportedArchitecture as e:
            raise refusal(model, f"does not dispatch through transformers' attention interface ({e})") from None
        except InductionLabError:
            raise
        except Exception as e:  # noqa: BLE001 - a model's own code failing under the registered function
            raise refusal(model, f"does not run through transformers' attention interface with the instrumentation "
                                 f"({type(e).__name__}: {' '.join(str(e).split())[:120]})") from None
        _check_calls(model, inst.layer_calls, L, H)
        diff = float((same - plain).abs().max())
        if diff > _tol(dtype, scale):
            raise refusal(model, f"does not reproduce its own forward through transformers' attention interface "
                                 f"(logits differ by {diff:.3g})")
        _check_patterns(model, ids, inst.patterns, dtype)
        widths = {layer: calls[0][0] * calls[0][1] for layer, calls in inst.layer_calls.items()}
        projections = {}
        for m in model.modules():
            layer = modules.get(id(m))
            if layer is not None and layer not in projections:
                proj = _out_projection(m, widths.get(layer, -1))
                if proj is not None:
                    projections[layer] = proj
        if len(projections) < L:
            raise refusal(model, "has no output projection of its heads' outputs that the instrumentation can find (a "
                                 "Linear named o_proj, out_proj, dense, c_proj, wo or o taking heads x head size), so a "
                                 "head cannot be checked to be one slice of it (e.g. a mixture of attention experts)")
        with ablate(model, [(layer, 0) for layer in range(L)], strict=False):
            ours = model(input_ids=ids).logits.float()
        with _zero_slices(list(projections.values()), widths[0] // H):
            ref = model(input_ids=ids).logits.float()
        diff = float((ours - ref).abs().max())
        if diff > _tol(dtype, scale):
            raise refusal(model, f"changes a head's output on its way to the output projection (zeroing head 0 "
                                 f"inside attention and zeroing its slice of the projection's input differ by "
                                 f"{diff:.3g} in the logits: a norm, gate or mix of heads sits between them)")
    _CHECKED.add(model)


def load_model(spec: str | os.PathLike = DEFAULT_MODEL, **kw) -> LoadedModel:
    """:func:`inductionlab.core.models.load_model` (same arguments and identity record), then the architecture
    policy (:func:`check_supported`) on the loaded model: the package's ``inductionlab.load_model`` and the
    command line's loader.

    Raises:
        UnsupportedArchitecture: (an InductionLabError) the architecture would not be measured exactly
            (:func:`check_supported`): one line, before anything is written.
        InductionLabError, TypeError: what :func:`~inductionlab.core.models.load_model` raises.
    """
    loaded = _load(spec, **kw)
    check_supported(loaded.model)
    return loaded


def _check_calls(model, layer_calls: dict, L: int, H: int) -> None:
    """Check 5: every layer called once with ``H`` query heads."""
    if not layer_calls:
        raise refusal(model, "does not dispatch through transformers' attention interface (its attention never "
                             "called the registered function)")
    missing = [layer for layer in range(L) if layer not in layer_calls]
    if missing:
        shown = ", ".join(map(str, missing[:8])) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise refusal(model, f"is a hybrid: layer(s) {shown} of {L} run no softmax attention through transformers' "
                             "attention interface (state-space, recurrent or linear-attention layers), and a head of "
                             "such a layer cannot be named in the layer x head grid")
    twice = {layer: len(c) for layer, c in layer_calls.items() if len(c) != 1}
    if twice:
        layer, n = next(iter(twice.items()))
        raise refusal(model, f"runs layer {layer}'s attention {n} times in one forward (a weight-shared loop or a "
                             "second attention per layer), so a head is not one map")
    heads = {c[0][0] for c in layer_calls.values()}
    if heads != {H}:
        raise refusal(model, f"has {sorted(heads)} query heads per attention call, not the config's {H}: the head "
                             "grid does not match its layers")


def _check_patterns(model, ids, patterns, dtype) -> None:
    """Check 7: the maps read inside the call equal the model's ``output_attentions`` under eager attention."""
    impl = model.config._attn_implementation
    try:
        model.set_attn_implementation("eager")
        attentions = model(input_ids=ids, output_attentions=True).attentions
    except (ValueError, TypeError, AttributeError, NotImplementedError):
        return                                   # no eager implementation to compare against
    finally:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            model.set_attn_implementation(impl)
    if not attentions or any(a is None for a in attentions) or len(attentions) != len(patterns):
        return
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    for layer, (a, p) in enumerate(zip(attentions, patterns)):
        if p is None or tuple(a.shape) != tuple(p.shape):
            raise refusal(model, f"reports attention maps of another shape than its attention function computes "
                                 f"(layer {layer}), so a head's pattern cannot be read")
        diff = float((a.float().cpu() - p.float()).abs().max())
        if diff > tol:
            raise refusal(model, f"reports other attention maps than its attention function computes (layer {layer}: "
                                 f"{diff:.3g}; the model edits the probabilities outside the attention function)")
