"""Head instrumentation (SPEC §2): one mechanism for every analysis.

We register one attention function, ``"inductionlab"``, in transformers' own
``AttentionInterface`` (and the matching additive-mask builder in ``AttentionMaskInterface``)
and point a model at it for the duration of an :func:`instrument` context. Inside each
attention call we

1. edit the additive mask per **query head** for ``sink`` and ``knockout`` interventions
   (pre-softmax; K/V shared by a GQA group are never touched),
2. delegate to the model's own attention math (its module's ``eager_attention_forward`` when
   probabilities are needed, else transformers' SDPA kernel), so numbers come from the native
   forward, not a re-implementation,
3. reduce the attention probabilities in place to the statistics an analysis asked for
   (``reductions``: the probability on one target key per query, shape ``[B, H, Q]``), never
   keeping ``[B, H, T, T]`` patterns unless ``keep_patterns=True``,
4. apply ``zero`` / ``mean`` interventions on the per-head attention output (the input of
   ``o_proj``, split with ``config.head_dim``), so only the named query head changes.

On exit the model's original attention implementation is restored; registering the name is
the only global change and it alters no other model. Any intervention that provably did
nothing (a head whose output was already what we wrote, edges that were already masked) and
any model whose attention never dispatched through the registry raise an error.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping, Sequence

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .errors import InductionLabError
from .models import attention_shape

FUNCTION_NAME = "inductionlab"
METHODS = ("zero", "mean", "sink", "knockout")


class UnsupportedArchitecture(InductionLabError):
    """The model does not dispatch attention through transformers' AttentionInterface."""


class NoOpIntervention(RuntimeError):
    """An intervention ran but provably changed nothing."""


@dataclass(frozen=True)
class HeadIntervention:
    """One intervention on one query head.

    Attributes:
        layer, head: query-head address (0-based). Under GQA only this query head changes.
        method: ``zero`` (head output 0; equivalent to an all-zero attention pattern),
            ``mean`` (head output replaced by ``value``, its mean over a reference batch),
            ``sink`` (all keys but position 0 masked before the softmax),
            ``knockout`` (the query→key edges in ``edges`` masked before the softmax; a query
            row with every key knocked out writes 0, the softmax of nothing taken as 0).
        value: for ``mean``: tensor ``[head_dim]``.
        edges: for ``knockout``: bool tensor ``[Q, K]`` (True = knock out) or a list of
            ``(query, key)`` position pairs.
    """
    layer: int
    head: int
    method: str = "zero"
    value: torch.Tensor | None = None
    edges: object = None


@dataclass
class _Slot:
    inst: "Instrumentation"
    layer: int


_ACTIVE: dict[int, _Slot] = {}  # id(attention module) -> slot, only while a context is open


def _dispatch(module, query, key, value, attention_mask, **kwargs):
    slot = _ACTIVE.get(id(module))
    if slot is None:
        raise RuntimeError("inductionlab attention called outside an instrument() context; "
                           "reset the model with model.set_attn_implementation('sdpa')")
    return slot.inst._attention(slot.layer, module, query, key, value, attention_mask, **kwargs)


AttentionInterface.register(FUNCTION_NAME, _dispatch)
AttentionMaskInterface.register(FUNCTION_NAME, eager_mask)


def gather_targets(weights: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Attention probability on one target key per query.

    Args:
        weights: ``[B, H, Q, K]`` attention probabilities.
        targets: ``[B, Q]`` or ``[Q]`` key indices; ``-1`` marks queries without a target.

    Returns:
        ``[B, H, Q]`` float32; 0 where the target is ``-1``. Raw mass, never renormalised.
    """
    B, H, Q, K = weights.shape
    if targets.dim() == 1:
        targets = targets.unsqueeze(0).expand(B, -1)
    targets = targets.to(weights.device)
    if targets.shape != (B, Q):
        raise ValueError(f"targets shape {tuple(targets.shape)} does not match batch {B} x queries {Q}")
    valid = targets >= 0
    idx = targets.clamp(min=0)[:, None, :, None].expand(B, H, Q, 1)
    out = weights.gather(-1, idx).squeeze(-1).float()
    return out * valid[:, None, :]


def _model_attention_modules(model) -> dict[int, int]:
    """id(module) -> layer index for every attention module that carries ``layer_idx``."""
    mods = {}
    for name, m in model.named_modules():
        if name.endswith(("attn", "attention", "self_attn")) and hasattr(m, "layer_idx") and isinstance(m.layer_idx, int):
            mods[id(m)] = m.layer_idx
    return mods


class Instrumentation:
    """State of one :func:`instrument` context. Read results after the forward passes.

    Attributes:
        reduced: name -> float32 tensor ``[n_layers, B, n_heads, Q]`` (from the last forward).
        patterns: list (per layer) of float32 ``[B, n_heads, Q, K]`` if ``keep_patterns``.
        head_output_sum / head_output_count: running sums of per-head outputs
            ``[n_layers, n_heads, head_dim]`` if ``capture_head_means`` (see :func:`head_output_means`).
        calls: number of attention calls seen (per forward: one per layer).
    """

    def __init__(self, model, interventions: Sequence[HeadIntervention], reductions: Mapping[str, torch.Tensor],
                 keep_patterns: bool, capture_head_means: bool, need_probs: bool | None):
        self.model = model
        self.shape = attention_shape(model.config)
        L, H = self.shape["n_layers"], self.shape["n_heads"]
        self.by_layer: dict[int, list[tuple[int, HeadIntervention]]] = {}   # layer -> [(index, intervention)]
        for i, iv in enumerate(interventions):
            if iv.method not in METHODS:
                raise InductionLabError(f"unknown ablation method {iv.method!r}; use one of {', '.join(METHODS)}")
            if not (0 <= iv.layer < L and 0 <= iv.head < H):
                raise InductionLabError(f"head ({iv.layer}, {iv.head}) out of range: the model has {L} layers "
                                        f"(0-{L - 1}) x {H} query heads (0-{H - 1})")
            if iv.method == "mean" and iv.value is None:
                raise InductionLabError("mean ablation needs the head's mean output; pass reference_ids to ablate()")
            if iv.method == "knockout" and iv.edges is None:
                raise InductionLabError("knockout needs edges (a [Q, K] bool mask or (query, key) pairs)")
            self.by_layer.setdefault(iv.layer, []).append((i, iv))
        self.interventions = list(interventions)
        self.effect = {i: False for i in range(len(self.interventions))}
        self.reduction_targets = dict(reductions)
        self.reduced: dict[str, torch.Tensor] = {}
        self.keep_patterns = keep_patterns
        self.patterns: list[torch.Tensor | None] = [None] * L
        self.capture_head_means = capture_head_means
        self.head_output_sum: torch.Tensor | None = None
        self.head_output_count = 0
        self.need_probs = bool(reductions) or keep_patterns if need_probs is None else need_probs
        self.calls = 0

    # -- the attention call -------------------------------------------------------------
    def _base(self, module, kwargs):
        if self.need_probs or kwargs.get("softcap") is not None or self._orig_impl == "eager":
            fn = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
            if fn is None:
                raise UnsupportedArchitecture(f"{type(module).__name__} has no eager_attention_forward; "
                                              "attention probabilities cannot be read for this architecture")
            return fn
        return ALL_ATTENTION_FUNCTIONS["sdpa"]

    def _attention(self, layer, module, query, key, value, attention_mask, **kwargs):
        self.calls += 1
        ivs = self.by_layer.get(layer, ())
        B, H, Q, _ = query.shape
        K = key.shape[-2]
        row_dead = None
        mask_edits = [(i, iv) for i, iv in ivs if iv.method in ("sink", "knockout")]
        if mask_edits:
            if attention_mask is None:
                attention_mask = torch.zeros(B, 1, Q, K, dtype=query.dtype, device=query.device)
            attention_mask = attention_mask[..., :K]
            neg = torch.finfo(attention_mask.dtype).min
            new = attention_mask.expand(B, H, Q, K).clone()
            row_dead = torch.zeros(B, H, Q, dtype=torch.bool, device=query.device)
            for i, iv in mask_edits:
                cut = torch.zeros(Q, K, dtype=torch.bool, device=query.device)
                if iv.method == "sink":
                    cut[:, 1:] = True
                elif isinstance(iv.edges, torch.Tensor):
                    e = iv.edges.to(query.device, torch.bool)
                    cut[: e.shape[0], : e.shape[1]] = e[:Q, :K]
                else:
                    for q, k in iv.edges:
                        cut[q, k] = True
                before_open = new[:, iv.head] > neg / 2
                if (before_open & cut).any():
                    self.effect[i] = True
                new[:, iv.head] = new[:, iv.head].masked_fill(cut, neg)
                row_dead[:, iv.head] |= ~(new[:, iv.head] > neg / 2).any(-1)
            attention_mask = new
        out, weights = self._base(module, kwargs)(module, query, key, value, attention_mask, **kwargs)
        # out: [B, Q, H, D]; weights: [B, H, Q, K] or None
        edits = [(i, iv) for i, iv in ivs if iv.method in ("zero", "mean")]
        if edits or (row_dead is not None and row_dead.any()):
            out = out.clone()
            if weights is not None:
                weights = weights.clone()
            if row_dead is not None and row_dead.any():
                out = out.masked_fill(row_dead.transpose(1, 2)[..., None], 0.0)
                if weights is not None:
                    weights = weights.masked_fill(row_dead[..., None], 0.0)
            for i, iv in edits:
                new_val = torch.zeros_like(out[:, :, iv.head]) if iv.method == "zero" else \
                    iv.value.to(out.device, out.dtype).expand_as(out[:, :, iv.head])
                if not torch.equal(out[:, :, iv.head], new_val):
                    self.effect[i] = True
                out[:, :, iv.head] = new_val
                if weights is not None and iv.method == "zero":
                    weights[:, iv.head] = 0.0
        if self.capture_head_means:
            s = out.detach().float().sum(dim=(0, 1))  # [H, D]
            if self.head_output_sum is None:
                self.head_output_sum = torch.zeros(self.shape["n_layers"], *s.shape)
            self.head_output_sum[layer] += s.cpu()
            if layer == 0:
                self.head_output_count += B * Q
        if self.reduction_targets:
            if weights is None:
                raise UnsupportedArchitecture("the attention function returned no probabilities")
            for name, targets in self.reduction_targets.items():
                r = gather_targets(weights.detach(), targets)
                if name not in self.reduced or self.reduced[name].shape[1:] != r.shape:
                    self.reduced[name] = torch.zeros(self.shape["n_layers"], *r.shape)
                self.reduced[name][layer] = r.cpu()
        if self.keep_patterns:
            self.patterns[layer] = weights.detach().float().cpu()
        return out, weights

    def check_effects(self) -> None:
        """Raise :class:`NoOpIntervention` if some intervention never changed anything."""
        dead = [self.interventions[i] for i, hit in self.effect.items() if not hit]
        if dead and self.calls:
            iv = dead[0]
            raise NoOpIntervention(f"{iv.method} intervention on head ({iv.layer}, {iv.head}) changed nothing "
                                   f"({len(dead)} of {len(self.interventions)} interventions were no-ops)")


@contextlib.contextmanager
def instrument(model, interventions: Iterable[HeadIntervention] = (), *,
               reductions: Mapping[str, torch.Tensor] | None = None, keep_patterns: bool = False,
               capture_head_means: bool = False, need_probs: bool | None = None,
               strict: bool = True) -> Iterator[Instrumentation]:
    """Point ``model`` at the inductionlab attention function for the duration of the block.

    Args:
        model: a transformers causal LM whose attention dispatches through ``AttentionInterface``.
        interventions: :class:`HeadIntervention` items (query-head indexing).
        reductions: name -> target key indices ``[B, Q]`` or ``[Q]`` (``-1`` = none); after a
            forward, ``inst.reduced[name]`` is float32 ``[n_layers, B, n_heads, Q]``.
        keep_patterns: also keep full ``[B, H, Q, K]`` probabilities per layer (memory heavy).
        capture_head_means: accumulate per-head outputs for mean ablation.
        need_probs: force (True) or forbid (False) the eager path; default: eager only when
            probabilities are needed or the model was loaded with eager attention.
        strict: on exit, raise :class:`NoOpIntervention` if an intervention changed nothing.

    Raises:
        InductionLabError: head out of range, unknown method, missing mean value / edges.
        UnsupportedArchitecture: the model never called the registered attention function.
        NoOpIntervention: (``strict``) an intervention provably did nothing.
    """
    inst = Instrumentation(model, list(interventions), reductions or {}, keep_patterns,
                           capture_head_means, need_probs)
    modules = _model_attention_modules(model)
    if not modules:
        raise UnsupportedArchitecture(f"{type(model).__name__}: no attention modules with layer_idx found; "
                                      "only architectures that dispatch through transformers' AttentionInterface are supported")
    clash = [m for m in modules if m in _ACTIVE]
    if clash:
        raise RuntimeError("this model is already instrumented; nest interventions in one instrument() call")
    orig = model.config._attn_implementation
    inst._orig_impl = orig
    for mid, layer in modules.items():
        _ACTIVE[mid] = _Slot(inst, layer)
    ok = False
    try:
        model.set_attn_implementation(FUNCTION_NAME)
        if model.config._attn_implementation != FUNCTION_NAME:
            raise UnsupportedArchitecture(f"{type(model).__name__} does not support setting its attention "
                                          "implementation through AttentionInterface")
        yield inst
        ok = True
    finally:
        for mid in modules:
            _ACTIVE.pop(mid, None)
        model.set_attn_implementation(orig)
    if ok:
        if inst.calls == 0 and (inst.interventions or inst.reduction_targets):
            raise UnsupportedArchitecture(f"{type(model).__name__} ran without calling the registered attention "
                                          "function: it does not dispatch through AttentionInterface")
        if strict:
            inst.check_effects()


def head_output_means(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean per-head attention output over a reference batch (for ``mean`` ablation).

    Args:
        input_ids: ``[B, T]`` token ids of the reference batch.

    Returns:
        float32 ``[n_layers, n_heads, head_dim]``: mean over batch and positions of each query
        head's output (the input of ``o_proj``). Convention: position-independent mean, as in
        mean ablation of Wang et al. 2022 / Todd et al. 2024 (mean over a reference set).
    """
    with torch.inference_mode(), instrument(model, capture_head_means=True) as inst:
        model(input_ids=input_ids, attention_mask=attention_mask)
    return inst.head_output_sum / max(inst.head_output_count, 1)


@contextlib.contextmanager
def ablate(model, heads: Iterable[tuple[int, int]], method: str = "zero", *,
           reference_ids: torch.Tensor | None = None, strict: bool = True) -> Iterator[Instrumentation]:
    """Ablate a set of query heads while the block runs.

    Args:
        heads: ``(layer, head)`` pairs, query-head indexing.
        method: ``zero`` | ``mean`` | ``sink`` (``knockout`` needs edges: use :func:`instrument`).
        reference_ids: ``[B, T]`` reference batch for ``mean`` ablation.

    Raises:
        InductionLabError: unknown method, head out of range, ``mean`` without reference_ids.
    """
    heads = [(int(l), int(h)) for l, h in heads]
    if method not in ("zero", "mean", "sink"):
        raise InductionLabError(f"unknown ablation method {method!r}; use zero, mean or sink")
    means = None
    if method == "mean":
        if reference_ids is None:
            raise InductionLabError("mean ablation needs a reference batch (reference_ids)")
        means = head_output_means(model, reference_ids)
    ivs = [HeadIntervention(l, h, method, value=None if means is None else means[l, h]) for l, h in heads]
    with instrument(model, ivs, strict=strict) as inst:
        yield inst


def self_check(model, input_ids: torch.Tensor, *, atol: float = 1e-4) -> dict:
    """Prove the instrumentation is live and transparent on this model.

    1. Instrumented forward without interventions equals the plain forward (bit-identical
       when both use the same kernel; within ``atol`` across kernels).
    2. Zero-ablating every head of the middle layer changes the logits.

    Returns: ``{"max_abs_diff_plain": float, "ablation_changes_logits": True}``.

    Raises:
        UnsupportedArchitecture: the registered function was never called, or ablation is a no-op.
        AssertionError: instrumented logits differ from plain logits.
    """
    with torch.inference_mode():
        plain = model(input_ids=input_ids).logits.float()
        with instrument(model, need_probs=model.config._attn_implementation == "eager") as inst:
            same = model(input_ids=input_ids).logits.float()
        if inst.calls == 0:
            raise UnsupportedArchitecture(f"{type(model).__name__} does not dispatch through AttentionInterface")
        diff = (plain - same).abs().max().item()
        if diff > atol:
            raise AssertionError(f"instrumented logits differ from plain logits by {diff:.3g} > {atol}")
        shape = attention_shape(model.config)
        mid = shape["n_layers"] // 2
        with ablate(model, [(mid, h) for h in range(shape["n_heads"])], strict=False):
            abl = model(input_ids=input_ids).logits.float()
        if torch.equal(abl, plain):
            raise UnsupportedArchitecture("zero-ablating a whole layer did not change the logits: the "
                                          "instrumentation is not reaching the model")
    return {"max_abs_diff_plain": diff, "ablation_changes_logits": True}
