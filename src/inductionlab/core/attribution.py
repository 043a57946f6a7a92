"""Gradient attribution of every query head at once: attribution patching (AtP, with AtP*'s GradDrop) and direct
logit attribution (DLA).

**Attribution patching** (Nanda 2023, "Attribution Patching: Activation Patching At Industrial Scale"; Kramár,
Lieberum, Shah & Nanda 2024, "AtP*: An efficient and scalable method for localizing LLM behaviour to components",
arXiv 2403.00745, eq. 4). The exact patching effect of setting head n's output (its slice of the input of its
layer's ``o_proj``) at some positions to a source value,

    c(n) = M(x | n ← n_src) − M(x),

is estimated to first order from one forward and one backward pass of the run ``x`` being patched:

    ĉ_AtP(n) = Σ_{p ∈ positions} (n_src[p] − n(x)[p]) · ∂M/∂n[p]  (at x).

One backward pass gives the gradient with respect to every head's output (a zero leaf added to each layer's head
outputs inside the instrumented attention call, ``instrument(grad_probes=True)``), so all heads cost one forward +
one backward per prompt (plus one forward of the source prompt when the source is a prompt), against one patched
forward per head (or per batch of heads: :mod:`inductionlab.core.patching`). The estimate is exact for a patch
that tends to 0 (``ĉ / c → 1``: ``tests/test_attribution.py``) and fails when the patch is large against the
curvature of the path from the head to the metric: a downstream softmax (attention or the output) that the patch
pushes into or out of saturation, or a probability metric near 0 or 1.

**AtP*'s two corrections, and which applies here.** (a) *Attention saturation* (Kramár et al. §3.1, the "QK fix"):
when the patched node is a query or a key, the patch passes through that head's own attention softmax, which AtP
linearises badly where it is saturated; AtP* recomputes that softmax exactly. We patch head *outputs* (the
attention-weighted values, after the softmax), so no softmax lies between the node and its patch and the fix has
nothing to recompute: it does not apply. Saturated softmaxes *downstream* of the head (later heads, the output)
are not fixed by AtP* either; they are the large-patch failure above. (b) *GradDrop* (§3.2, eq. 11): cancellation
between a node's direct and indirect paths can make ∂M/∂n small by accident (a brittle false negative). For each
layer ℓ the gradient is recomputed with the gradient through layer ℓ's residual-stream writes (its attention and
MLP outputs) set to zero, giving ĉ_ℓ(n); AtP* ranks by

    ĉ_GD(n) = 1/(L − 1) · Σ_ℓ |ĉ_ℓ(n)|,

an *unsigned* magnitude (ĉ_ℓ = ĉ_AtP for ℓ below n's layer, 0 for n's own layer, hence L − 1). We compute it for
node = head output exactly so, with one extra backward pass per layer (each only down to the layers below ℓ);
``graddrop=True``.

**Direct logit attribution** (Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits"; the
TransformerLens convention of a final-norm scale frozen from the clean run): per head, its last-position output
through its columns of ``o_proj`` (Gemma: then its post-attention norm, scale frozen likewise), through the final
norm with the normaliser of the clean run (RMSNorm: ``g ⊙ v / σ``, σ the clean residual's RMS; LayerNorm:
``g ⊙ (v − mean v) / σ``, σ its standard deviation; the norm's bias counts in the rest), then onto an unembedding
direction. Linear in the write, so heads + the rest (embeddings, MLPs, ``o_proj`` biases, the norm's and LM head's
biases) sum to the model's own value at the clean run.

Directions (:data:`DLA_KINDS`): ``logit`` — the answer's logit (``W_U[a]``); ``centered`` — the answer's logit
minus the mean logit over the vocabulary (``W_U[a] − mean_v W_U[v]``): the part of the answer's log-probability
that is linear in the residual stream (log p(a) = logit(a) − logsumexp, and the log-sum-exp, not linear, is
attributed to no head); ``diff`` — the logit difference against the clean run's top non-answer token.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np
import torch

from ..errors import InductionLabError
from .anatomy import (attention_module, final_norm, mlp_module, output_projection, post_attention_norm,
                      unembedding)
from .instrument import HeadIntervention, instrument, unwrap_model
from .models import attention_shape, forward
from .placement import execution_device

#: The metrics AtP differentiates, on the last position's logits: the answer's probability or log-probability.
METRICS = ("prob", "logprob")
#: The directions DLA reads (module docstring).
DLA_KINDS = ("logit", "centered", "diff")


def _metric(metric) -> Callable[[torch.Tensor, int], torch.Tensor]:
    if callable(metric):
        return metric
    if metric == "prob":
        return lambda logits, t: torch.softmax(logits.double(), -1)[t]
    if metric == "logprob":
        return lambda logits, t: torch.log_softmax(logits.double(), -1)[t]
    raise InductionLabError(f"unknown attribution metric {metric!r}; use one of {', '.join(METRICS)} or a callable "
                            "(logits [V], target) -> scalar")


def _positions(positions, T: int) -> list[int]:
    """Absolute positions of a prompt of ``T`` tokens (negative: from the end), sorted, unique.

    Raises: InductionLabError for an empty list or a position outside the prompt."""
    try:
        ps = [int(p) for p in ([positions] if isinstance(positions, (int, np.integer)) else positions)]
    except (TypeError, ValueError):
        raise InductionLabError(f"positions must be integers (negative: from the end), got {positions!r}") from None
    if not ps:
        raise InductionLabError("positions is empty, so nothing would be patched; give at least one (-1: the last)")
    out = sorted({p + T if p < 0 else p for p in ps})
    if out[0] < 0 or out[-1] >= T:
        raise InductionLabError(f"positions {ps} fall outside a prompt of {T} tokens")
    return out


def _targets(targets, n: int) -> list[int]:
    ts = [int(targets)] * n if isinstance(targets, (int, np.integer)) else [int(t) for t in targets]
    if len(ts) != n:
        raise InductionLabError(f"{len(ts)} targets for {n} prompts; give one per prompt (or one for all)")
    return ts


@dataclass
class AtPResult:
    """Attribution-patching estimates of every head, per prompt.

    Attributes:
        atp: float64 ``[n_prompts, n_layers, n_heads]``: ĉ_AtP, the signed first-order estimate of the change of
            the metric (its units: probability or log-probability) when the head's output at ``positions`` takes
            the source value.
        graddrop: float64 ``[n_prompts, n_layers, n_heads]`` (≥ 0) AtP*'s GradDrop magnitude ĉ_GD, or None when
            not asked for.
        metric: float64 ``[n_prompts]``: the metric on the unpatched run.
        metric_name: ``"prob"``, ``"logprob"`` or ``"custom"``; positions: what was patched (as given).
    """
    atp: np.ndarray
    graddrop: np.ndarray | None
    metric: np.ndarray
    metric_name: str
    positions: tuple = (-1,)

    def mean(self) -> np.ndarray:
        """ĉ_AtP averaged over prompts: float64 ``[n_layers, n_heads]`` (an estimate of the AIE)."""
        return self.atp.mean(0)


class _Gate(torch.autograd.Function):
    """Identity forward; backward passes the gradient, or zero while ``state["drop"]`` is this layer (GradDrop)."""

    @staticmethod
    def forward(ctx, x, state, layer):
        ctx.state, ctx.layer = state, layer
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return (torch.zeros_like(g) if ctx.state.get("drop") == ctx.layer else g), None, None


@contextlib.contextmanager
def _gradient_gates(model, L: int, state: dict) -> Iterator[None]:
    """Gate every layer's residual-stream writes (attention and MLP outputs) for GradDrop."""
    def hook(layer):
        def f(module, args, output):
            if isinstance(output, tuple):
                return (_Gate.apply(output[0], state, layer), *output[1:])
            return _Gate.apply(output, state, layer)
        return f
    handles = []
    try:
        for l in range(L):
            handles.append(attention_module(model, l).register_forward_hook(hook(l)))
            handles.append(mlp_module(model, l).register_forward_hook(hook(l)))
        yield
    finally:
        for h in handles:
            h.remove()


def _source_outputs(model, source, L: int, H: int, D: int, under) -> torch.Tensor:
    """Every head's outputs ``[L, T, H, D]`` (float64) over the source prompt ``source`` (token ids)."""
    dev = execution_device(model)
    with torch.no_grad(), instrument(model, list(under), grad_probes=True, strict=False) as inst:
        forward(model, torch.tensor([list(source)], device=dev), keep=1, use_cache=False)
    return torch.stack([inst.probes[l][1][0] for l in range(L)]).double()


def _model_and_prompts(model, prompts, who: str):
    """The unwrapped model, its ``(n_layers, n_heads, head_dim)`` and the prompts as lists; refuses no prompts or an
    empty one (``who``: the caller's name, for the message)."""
    model = unwrap_model(model)
    s = attention_shape(model.config)
    prompts = [list(p) for p in prompts]
    if not prompts or any(len(p) < 1 for p in prompts):
        raise InductionLabError(f"{who}() needs at least one non-empty prompt")
    return model, (s["n_layers"], s["n_heads"], s["head_dim"]), prompts


def attribution_patching(model, prompts: Sequence[Sequence[int]], targets, source, *, positions=(-1,),
                         metric="prob", under: Sequence[HeadIntervention] = (), graddrop: bool = False) -> AtPResult:
    """AtP estimates (module docstring) of setting each query head's output at ``positions`` to ``source``, on
    the metric of the last position's logits, for every head and every prompt.

    Args:
        model: a causal LM whose attention the instrumentation supports (or a LoadedModel bundle).
        prompts: token-id lists (each at least 1 token), the runs being patched (the FV score's corrupted prompts).
        targets: the answer token of each prompt (one int for all).
        source: the heads' new output: ``"zero"``; a tensor ``[n_layers, n_heads, head_dim]`` written at every
            patched position (a mean: the FV score's task mean at the last position); or one source prompt per
            prompt (token-id lists), each head taking its own output there at the same ``positions`` (counted in
            the source prompt; activation patching from another prompt).
        positions: the patched positions (ints; negative from the end; default the last).
        metric: ``"prob"`` (softmax probability of the target, float64), ``"logprob"``, or a callable
            ``(logits [V], target) -> scalar tensor``.
        under: interventions applied to every forward (as :func:`~inductionlab.core.patching.patched_last_logits`).
        graddrop: also compute AtP*'s GradDrop magnitude (one more backward pass per layer, each down to the layers
            below it).

    Returns: :class:`AtPResult` (estimates ``[n_prompts, n_layers, n_heads]``, float64).

    Raises: InductionLabError for no prompts, a mis-shaped source, a source prompt list of another length than the
        prompts, positions outside a prompt, an unknown metric, a model whose head outputs get no gradient."""
    model, (L, H, D), prompts = _model_and_prompts(model, prompts, "attribution_patching")
    ts = _targets(targets, len(prompts))
    fn = _metric(metric)
    per_prompt_source = not (isinstance(source, str) or torch.is_tensor(source))
    if isinstance(source, str) and source != "zero":
        raise InductionLabError(f"source {source!r}: use 'zero', a [n_layers, n_heads, head_dim] tensor or source "
                                "prompts")
    if torch.is_tensor(source) and tuple(source.shape) != (L, H, D):
        raise InductionLabError(f"a source of shape {tuple(source.shape)} for a model of {L} layers x {H} heads x "
                                f"head_dim {D}; give [n_layers, n_heads, head_dim]")
    if per_prompt_source and len(source) != len(prompts):
        raise InductionLabError(f"{len(source)} source prompts for {len(prompts)} prompts; give one per prompt")
    dev = execution_device(model)
    atp = np.zeros((len(prompts), L, H))
    gd = np.zeros((len(prompts), L, H)) if graddrop else None
    values = np.zeros(len(prompts))
    state: dict = {}
    for i, (ids, t) in enumerate(zip(prompts, ts)):
        pos = _positions(positions, len(ids))
        if per_prompt_source:
            src_out = _source_outputs(model, source[i], L, H, D, under)            # [L, T', H, D]
            src = src_out[:, _positions(positions, src_out.shape[1])]               # [L, P, H, D]
            if src.shape[1] != len(pos):
                raise InductionLabError(f"the source prompt {i} names {src.shape[1]} positions, the prompt {len(pos)}")
        gates = _gradient_gates(model, L, state) if graddrop else contextlib.nullcontext()
        with torch.enable_grad(), gates, instrument(model, list(under), grad_probes=True, strict=False) as inst:
            logits = forward(model, torch.tensor([ids], device=dev), keep=1, use_cache=False).logits[0, -1]
            m = fn(logits, t)
            probes = [inst.probes[l][0] for l in range(L)]
            if not m.requires_grad:
                raise InductionLabError("the metric has no gradient with respect to the head outputs (is the model "
                                        "run under torch.inference_mode()?)")
            state.pop("drop", None)
            grads = torch.autograd.grad(m, probes, retain_graph=graddrop, allow_unused=True)
            clean = torch.stack([inst.probes[l][1][0, pos] for l in range(L)]).double()   # [L, P, H, D]
            if per_prompt_source:
                delta = src.to(clean.device) - clean
            elif isinstance(source, str):
                delta = -clean
            else:
                delta = source.to(clean.device, torch.float64)[:, None] - clean

            def estimate(gs, layers):
                g = torch.stack([torch.zeros_like(probes[l][0, pos]) if gs[j] is None else gs[j][0, pos]
                                 for j, l in enumerate(layers)]).double()               # [l, P, H, D]
                return (delta[layers[0]:layers[-1] + 1] * g).sum((1, 3)).cpu().numpy()  # [l, H]

            atp[i] = estimate(grads, list(range(L)))
            if graddrop:
                total = np.zeros((L, H))
                for drop in range(L):              # ĉ_drop = ĉ_AtP above the dropped layer, 0 at it
                    total[drop + 1:] += np.abs(atp[i, drop + 1:])
                    if drop == 0:
                        continue
                    state["drop"] = drop
                    below = list(range(drop))
                    gs = torch.autograd.grad(m, [probes[l] for l in below], retain_graph=drop < L - 1,
                                             allow_unused=True)
                    total[:drop] += np.abs(estimate(gs, below))
                state.pop("drop", None)
                gd[i] = total / max(L - 1, 1)
            values[i] = float(m.detach())
    name = metric if isinstance(metric, str) else "custom"
    return AtPResult(atp, gd, values, name, tuple(positions) if not isinstance(positions, int) else (positions,))


# ---------------------------------------------------------------------------------------------
# Direct logit attribution


@dataclass
class FrozenNorm:
    """A norm linearised at one input ``x``: ``apply(v) = gain ⊙ (v − centre·mean v) / sigma``, and
    ``bias`` (added by the norm, not by any write).

    Attributes: gain, bias float64 ``[hidden]``; sigma the clean normaliser (float); centre (LayerNorm)."""
    gain: torch.Tensor
    bias: torch.Tensor
    sigma: float
    centre: bool

    def apply(self, v: torch.Tensor) -> torch.Tensor:
        """``v`` ``[..., hidden]`` (float64) through the frozen norm (no bias)."""
        if self.centre:
            v = v - v.mean(-1, keepdim=True)
        return self.gain * v / self.sigma


def _wide(norm: torch.nn.Module, v: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, float]:
    """``(norm(v) in float64, the check's relative tolerance)``: the norm called on float64 input (transformers'
    RMSNorms compute in float32 at least and multiply their weight in the input's dtype, so a bf16 model's norm
    is read to float32 precision: 1e-3); a norm that refuses another dtype than its weights' is called in the
    model's ``dtype``, and the tolerance is that dtype's (4 ulp: bf16 rounds to 2^-8)."""
    try:
        return norm(v).double(), 1e-3
    except RuntimeError:
        return norm(v.to(dtype)).double(), max(1e-3, 4 * torch.finfo(dtype).eps)


def freeze_norm(norm: torch.nn.Module, x: torch.Tensor) -> FrozenNorm:
    """``norm`` (LayerNorm or an RMSNorm: Llama's ``weight ⊙``, Gemma's ``(1 + weight) ⊙``) linearised at its
    clean input ``x`` ``[hidden]``: the scale frozen, so the map is linear in what the writes add.

    The RMSNorm's gain is read as ``norm(1) · sqrt(1 + eps)`` (whatever its parametrisation; the norm called
    on float64 input, so a bf16 model's gain is not rounded to bf16: :func:`_wide`) and checked:
    ``gain ⊙ x / σ`` must give ``norm(x)``.

    Raises: InductionLabError for a norm that is neither (the check fails, or no ``eps``)."""
    x = x.detach()
    p = x.to(torch.float64)
    with torch.no_grad():
        if isinstance(norm, torch.nn.LayerNorm):
            w = norm.weight.double() if norm.weight is not None else torch.ones_like(p)
            b = norm.bias.double() if norm.bias is not None else torch.zeros_like(p)
            sigma = float(torch.sqrt(p.var(unbiased=False) + norm.eps))
            frozen = FrozenNorm(w.to(p.device), b.to(p.device), sigma, True)
        else:
            eps = getattr(norm, "variance_epsilon", None)
            eps = getattr(norm, "eps", None) if eps is None else eps
            if eps is None:
                raise InductionLabError(f"{type(norm).__name__}: neither a LayerNorm nor an RMSNorm with an eps; direct "
                                        "logit attribution cannot freeze its scale")
            ones = torch.ones(1, x.shape[-1], dtype=torch.float64, device=x.device)
            gain, tol = _wide(norm, ones, x.dtype)
            gain = gain[0] * float(np.sqrt(1.0 + float(eps)))
            sigma = float(torch.sqrt((p * p).mean() + float(eps)))
            frozen = FrozenNorm(gain, torch.zeros_like(p), sigma, False)
        want, tol = _wide(norm, p[None], x.dtype)
        want = want[0]
    got = frozen.apply(p) + frozen.bias
    if not torch.allclose(got, want, rtol=tol, atol=tol * float(want.abs().max())):
        raise InductionLabError(f"{type(norm).__name__} is not a LayerNorm or RMSNorm that direct logit attribution "
                                "understands (its frozen-scale linearisation does not reproduce it)")
    return frozen


def head_columns(model, layer: int) -> torch.Tensor:
    """The output projection of ``layer`` as a matrix: float64 ``[n_heads · head_dim, hidden]``, row block h the
    columns of ``W_O`` that head h's output multiplies (``o_proj(a) = a @ M + bias``; Linear and GPT-2's Conv1D
    alike, read as ``proj(I) − proj(0)``)."""
    proj = output_projection(model, layer)
    p = next(proj.parameters())
    n = attention_shape(unwrap_model(model).config)
    n_in = n["n_heads"] * n["head_dim"]
    with torch.no_grad():
        eye = torch.eye(n_in, dtype=p.dtype, device=p.device)
        return (proj(eye) - proj(torch.zeros_like(eye[:1]))).double()


@dataclass
class DLAResult:
    """Direct logit attribution of every head at the last position, per prompt.

    Attributes:
        heads: kind (:data:`DLA_KINDS`) -> float64 ``[n_prompts, n_layers, n_heads]``, logit units (nats of the
            logit scale).
        rest: kind -> float64 ``[n_prompts]``: everything else (embeddings, MLPs, ``o_proj`` and norm biases,
            the LM head's bias), through the same frozen norm.
        total: kind -> float64 ``[n_prompts]``: the model's own value (the answer's logit; minus the mean logit;
            minus the rival's logit): ``heads.sum((1, 2)) + rest`` equals it to float error.
        answer, rival: int ``[n_prompts]``: the answer token and the clean top non-answer token (``diff``).
    """
    heads: dict[str, np.ndarray]
    rest: dict[str, np.ndarray]
    total: dict[str, np.ndarray]
    answer: np.ndarray
    rival: np.ndarray

    def mean(self, kind: str = "logit") -> np.ndarray:
        """The heads' DLA averaged over prompts: float64 ``[n_layers, n_heads]``."""
        return self.heads[kind].mean(0)


def dla_unsupported(model) -> str | None:
    """Why :func:`direct_logit_attribution` cannot be defined on ``model`` (one line), or None: final-logit
    soft-capping (Gemma 2's tanh) makes the logit a non-linear function of the residual stream."""
    model = unwrap_model(model)
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if getattr(cfg, "final_logit_softcapping", None):
        return ("the model soft-caps its final logits (tanh), which is not linear: direct logit attribution is "
                "defined for uncapped logits only")
    return None


def direct_logit_attribution(model, prompts: Sequence[Sequence[int]], targets, *,
                             under: Sequence[HeadIntervention] = ()) -> DLAResult:
    """Per head and prompt, the direct contribution of the head's last-position output to the answer's logit
    (module docstring: frozen norm scale from the clean run; three directions, :data:`DLA_KINDS`).

    Args:
        prompts: token-id lists; targets: the answer token of each (one int for all).
        under: interventions applied in the forward (the heads' outputs read are the edited ones).

    Returns: :class:`DLAResult`.

    Raises: InductionLabError for no prompts, a final norm that is neither LayerNorm nor RMSNorm, a model with
        final logit soft-capping (not linear), a model without the parts (:mod:`inductionlab.core.anatomy`)."""
    model, (L, H, D), prompts = _model_and_prompts(model, prompts, "direct_logit_attribution")
    why = dla_unsupported(model)
    if why:
        raise InductionLabError(why)
    ts = _targets(targets, len(prompts))
    dev = execution_device(model)
    cols = [head_columns(model, l).reshape(H, D, -1) for l in range(L)]          # [H, D, hidden]
    norms = {l: post_attention_norm(model, l) for l in range(L)}
    fin = final_norm(model)
    head = unembedding(model)
    W = head.weight.detach()
    b = getattr(head, "bias", None)
    b = None if b is None else b.detach()
    W_mean = W.float().mean(0).double()
    kinds = {k: np.zeros((len(prompts), L, H)) for k in DLA_KINDS}
    rest = {k: np.zeros(len(prompts)) for k in DLA_KINDS}
    total = {k: np.zeros(len(prompts)) for k in DLA_KINDS}
    rival = np.zeros(len(prompts), dtype=np.int64)
    seen: dict = {}

    def record(key):
        def f(module, args, output):
            if seen.get("on"):                     # the model's forward, not freeze_norm's own calls
                seen[key] = args[0][0, -1].detach()
        return f
    hooks = [fin.register_forward_hook(record("final"))]
    hooks += [n.register_forward_hook(record(l)) for l, n in norms.items() if n is not None]
    heads = [(l, h) for l in range(L) for h in range(H)]
    try:
        for i, (ids, a) in enumerate(zip(prompts, ts)):
            seen["on"] = True
            with torch.no_grad(), instrument(model, list(under), capture_heads=heads, strict=False) as inst:
                logits = forward(model, torch.tensor([ids], device=dev), keep=1, use_cache=False).logits[0, -1]
            seen["on"] = False
            logits = logits.double()
            r = int(torch.topk(logits, 2).indices[1] if int(logits.argmax()) == a else logits.argmax())
            rival[i] = r
            x = seen["final"].double()
            frozen = freeze_norm(fin, seen["final"])
            writes = torch.zeros(L, H, x.shape[-1], dtype=torch.float64, device=x.device)
            for l in range(L):
                out = torch.stack([inst.captured[(l, h)][0, -1] for h in range(H)]).double()   # [H, D]
                w = torch.einsum("hd,hdk->hk", out, cols[l].to(out.device))
                if norms[l] is not None:
                    w = freeze_norm(norms[l], seen[l]).apply(w)
                writes[l] = w
            through = frozen.apply(writes)                                      # [L, H, hidden]
            other = frozen.apply(x - writes.sum((0, 1))) + frozen.bias          # the rest's part of norm(x)
            dirs = {"logit": W[a].double(), "centered": W[a].double() - W_mean, "diff": (W[a] - W[r]).double()}
            bias = {"logit": 0.0, "centered": 0.0, "diff": 0.0}
            if b is not None:
                bb = b.double()
                bias = {"logit": float(bb[a]), "centered": float(bb[a] - bb.mean()), "diff": float(bb[a] - bb[r])}
            own = {"logit": float(logits[a]), "centered": float(logits[a] - logits.mean()),
                   "diff": float(logits[a] - logits[r])}
            for k, u in dirs.items():
                u = u.to(through.device)
                kinds[k][i] = (through @ u).cpu().numpy()
                rest[k][i] = float(other @ u) + bias[k]
                total[k][i] = own[k]
    finally:
        for h in hooks:
            h.remove()
    return DLAResult(kinds, rest, total, np.asarray(ts, dtype=np.int64), rival)


__all__ = ["dla_unsupported", "METRICS", "DLA_KINDS", "AtPResult", "attribution_patching", "FrozenNorm", "freeze_norm", "head_columns",
           "DLAResult", "direct_logit_attribution"]
