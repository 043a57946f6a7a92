"""The attention function we register in transformers, and the state of one open context.

Registration is process-wide and happens once, at import: the name ``"inductionlab"``
(:data:`FUNCTION_NAME`) in transformers' ``AttentionInterface`` (:func:`_dispatch`) and in its
``AttentionMaskInterface`` (:func:`_mask`). A model runs it only while it is inside a context:
:meth:`Instrumentation.attach` points the model at the name and enters its attention modules in
``_ACTIVE`` (``id(module) -> (Instrumentation, layer)``, guarded by ``_ACTIVE_LOCK``), and
:func:`_dispatch` looks each call up there. A call from another thread than the context's runs
the model's own attention, untouched.

:class:`Instrumentation` holds one context's interventions, positions and results.
:meth:`Instrumentation._attention` is one attention call, in the four steps that
:mod:`inductionlab.core.instrument` explains, each a method:

1. :meth:`~Instrumentation._edit_mask` — mask edits: the ``cut`` of each mask-edit method on
   its query head,
2. :meth:`~Instrumentation._kernel` — the kernel: PyTorch's fused CPU flash attention with its
   log-sum-exp (:meth:`~Instrumentation._fused_attention`), the model's eager attention, or SDPA,
3. :meth:`~Instrumentation._edit_output` — output edits: the ``replace`` of each output-edit
   method, rows with every key cut written as 0, which intervention changed something,
4. :meth:`~Instrumentation._reductions` — reductions: target masses (from the pattern, or from
   the log-sum-exp: :meth:`~Instrumentation._mass_from_lse`), head-output sums, kept patterns.

Around the calls, forward hooks read each forward's absolute positions
(:meth:`~Instrumentation._pre_forward`) and tag the KV cache it returns with the context's
interventions (:data:`CACHE_TAG`), so a cache computed under other interventions is refused
(:class:`StaleKVCache`). The methods themselves are in :mod:`inductionlab.core.methods`.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import sys
import threading
from dataclasses import dataclass
from typing import Iterator, Mapping, NamedTuple, Sequence

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ..errors import InductionLabError
from .methods import (AblationMethod, HeadIntervention, Positions, check_positions, checked_intervention, query_mask,
                      selected)
from .models import attention_shape


FUNCTION_NAME = "inductionlab"


class UnsupportedArchitecture(InductionLabError):
    """The model does not dispatch attention through transformers' AttentionInterface."""


class NoOpIntervention(RuntimeError):
    """An intervention ran but provably changed nothing."""


class AlreadyInstrumented(InductionLabError, RuntimeError):
    """The model is inside another :func:`~inductionlab.core.instrument.instrument` /
    :func:`~inductionlab.core.instrument.ablate` context (this thread's or another's): one context
    per model at a time."""


class StaleKVCache(InductionLabError):
    """A KV cache computed under other interventions (or none) was passed into a context whose
    interventions differ: its cached keys and values would silently mix two models."""


# -- registration with transformers (process-wide, once at import) ----------------------------
@dataclass
class _Slot:
    """An attention module's entry in ``_ACTIVE``: the open context and the module's layer."""
    inst: "Instrumentation"
    layer: int


_ACTIVE: dict[int, _Slot] = {}  # id(attention module) -> slot, only while a context is open


_ACTIVE_LOCK = threading.Lock()   # guards the check-then-register of Instrumentation.attach()


def _dispatch(module, query, key, value, attention_mask, **kwargs):
    """The ``"inductionlab"`` attention function: the call of the module's open context
    (:meth:`Instrumentation._attention`), or the model's own attention for another thread."""
    slot = _ACTIVE.get(id(module))
    if slot is None:
        raise RuntimeError("inductionlab attention called outside an instrument() context; "
                           "reset the model with model.set_attn_implementation('sdpa')")
    if slot.inst.thread != threading.get_ident():
        # another thread's forward of the same model: the context belongs to the thread that opened
        # it, so this call runs the model's own attention, untouched (no intervention, no reduction)
        return slot.inst._plain_attention(module, query, key, value, attention_mask, **kwargs)
    return slot.inst._attention(slot.layer, module, query, key, value, attention_mask, **kwargs)


def _mask(*args, **kwargs):
    """The mask function of our attention: None where SDPA's own test says plain causal attention
    needs no mask (no padding; :func:`transformers.masking_utils.sdpa_mask` with
    ``allow_is_causal_skip``) and the model allows the skip, else eager's additive ``[B, 1, Q, K]`` mask (a model
    that adds a bias to it, Falcon's ALiBi, passes ``allow_is_causal_skip=False``). A None mask is made
    causal by the attention call only on the paths that need one (eager, mask edits), so the
    ``[Q, K]`` mask is not built for the fused and SDPA paths (67 MB at 4,097 tokens in fp32)."""
    allow = kwargs.pop("allow_is_causal_skip", True)     # False: the model adds to the mask (Falcon's ALiBi)
    skip = {k: v for k, v in kwargs.items() if k != "dtype"}
    if allow and sdpa_mask(*args, allow_is_causal_skip=True, **skip) is None:
        return None
    return eager_mask(*args, **kwargs)


AttentionInterface.register(FUNCTION_NAME, _dispatch)
AttentionMaskInterface.register(FUNCTION_NAME, _mask)


# -- masks and the fused kernel ------------------------------------------------------------------
def _causal_mask(Q: int, K: int, dtype, device) -> torch.Tensor:
    """Additive causal mask ``[1, 1, Q, K]`` for the last ``Q`` of ``K`` positions (query i sees keys
    ``≤ i + K − Q``): 0 where attended, the dtype's minimum elsewhere."""
    m = torch.zeros(Q, K, dtype=dtype, device=device)
    return m.masked_fill(torch.ones(Q, K, dtype=torch.bool, device=device).triu(K - Q + 1),
                         torch.finfo(dtype).min)[None, None]


def _is_plain_causal(mask: torch.Tensor) -> bool:
    """Whether an additive mask ``[B, 1, Q, Q]`` is exactly the causal one (0 on and below the
    diagonal, the dtype's minimum above)."""
    Q = mask.shape[-1]
    upper = torch.ones(Q, Q, dtype=torch.bool, device=mask.device).triu(1)
    neg = torch.finfo(mask.dtype).min
    return bool(((mask == 0) == ~upper).all()) and bool((mask.masked_select(upper) == neg).all()) if Q > 1 else bool((mask == 0).all())


# PyTorch's fused CPU attention, which also returns the row log-sum-exp ([B, H, Q], float32)
_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


class _Fused(NamedTuple):
    """What the fused kernel's target probabilities are read from (:meth:`Instrumentation._mass_from_lse`)."""
    query: torch.Tensor        # [B, H, Q, D]
    key: torch.Tensor          # [B, H_kv, K, D]
    mask: torch.Tensor | None  # the additive mask the kernel ran with, [B, 1 or H, Q, K] or [Q, K]; None: causal
    scale: float
    lse: torch.Tensor          # [B, H, Q] row log-sum-exp, float32


# -- reductions, modules, KV-cache tags ----------------------------------------------------------
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


# Attention modules that compute attention in a method of their own instead of dispatching through
# AttentionInterface, each checked against the hook reference (tests/test_architectures.py): class name ->
# the name of its layer-index attribute. Their ``_attn(query [B, H, Q, D], key, value [B, H_kv, K, D],
# attention_mask) -> (out [B, H, Q, D], weights [B, H, Q, K])`` is routed through the context while it is
# open (:meth:`Instrumentation.attach`), and is the kernel the context runs (:func:`_legacy_kernel`).
LEGACY_ATTN = {"GPTNeoSelfAttention": "layer_id"}


def _legacy(module) -> bool:
    return type(module).__name__ in LEGACY_ATTN


def _legacy_kernel(module, query, key, value, attention_mask, **kwargs):
    """The module's own ``_attn`` in the attention-function convention: ``(out [B, Q, H, D], weights)``."""
    out, weights = type(module)._attn(module, query, key, value, attention_mask)
    return out.transpose(1, 2), weights


def _legacy_entry(module):
    """The ``_attn`` set on a legacy module's instance while a context is open: :func:`_dispatch`, with its
    output back in the module's ``[B, H, Q, D]``."""
    def _attn(query, key, value, attention_mask=None):
        out, weights = _dispatch(module, query, key, value, attention_mask)
        return out.transpose(1, 2), weights
    return _attn


def _model_attention_modules(model) -> dict[int, int]:
    """id(module) -> layer index for every attention module that carries ``layer_idx`` (or is a
    :data:`LEGACY_ATTN` module, with its own layer-index attribute)."""
    mods = {}
    for name, m in model.named_modules():
        if _legacy(m) and isinstance(getattr(m, LEGACY_ATTN[type(m).__name__], None), int):
            mods[id(m)] = getattr(m, LEGACY_ATTN[type(m).__name__])
        elif name.endswith(("attn", "attention", "self_attn")) and hasattr(m, "layer_idx") and isinstance(m.layer_idx, int):
            mods[id(m)] = m.layer_idx
    return mods


def attention_modules(model) -> dict[int, torch.nn.Module]:
    """Layer index -> the attention module the instrumentation hooks in that layer (the first one found
    with that index: a module carrying ``layer_idx`` and named ``*attn`` / ``*attention``, or a
    :data:`LEGACY_ATTN` module)."""
    ids = _model_attention_modules(model)
    out: dict[int, torch.nn.Module] = {}
    for m in model.modules():
        if id(m) in ids:
            out.setdefault(ids[id(m)], m)
    return out


CACHE_TAG = "_inductionlab_interventions"   # attribute set on a KV cache: the interventions it was computed under


def _digest(t) -> str | None:
    if t is None:
        return None
    t = torch.as_tensor(t).detach()
    data = t.float().cpu().contiguous().numpy().tobytes() if t.dtype != torch.bool else t.cpu().numpy().tobytes()
    return hashlib.sha1(str(tuple(t.shape)).encode() + data).hexdigest()[:16]


def _interventions_key(ivs) -> tuple:
    """A comparable record of a context's interventions: () when it has none (a plain forward's
    cache is intact too)."""
    return tuple(sorted((iv.method, iv.layer, iv.head, _digest(iv.value), _digest(iv.edges)) for iv in ivs))


def _describe_key(key: tuple) -> str:
    if not key:
        return "without interventions"
    heads = ", ".join(f"{m} ({l}, {h})" for m, l, h, *_ in key[:4]) + (f" and {len(key) - 4} more" if len(key) > 4 else "")
    return f"with {heads}"


def _tag_cache(cache, key: tuple) -> None:
    with contextlib.suppress(AttributeError, TypeError):     # a tuple cache cannot carry the tag
        setattr(cache, CACHE_TAG, key)


class Instrumentation:
    """State of one :func:`~inductionlab.core.instrument.instrument` context. Read results after
    the forward passes.

    Attributes:
        reduced: name -> float32 tensor ``[n_layers, B, n_heads, Qt]`` indexed by **absolute**
            query position (``Qt`` = the targets' length). A forward without a KV cache starts
            it afresh; a cached forward fills in the queries it decodes (so prefix + decoded
            tokens together equal the full forward). Padding queries stay 0.
        patterns: list (per layer) of float32 ``[B, n_heads, Q, K]`` if ``keep_patterns``
            (slots of the last call, not absolute positions).
        head_output_sum / head_output_count: running sums of per-head outputs
            ``[n_layers, n_heads, head_dim]`` over real (non-padding) query tokens at ``mean_positions``,
            and the number of those tokens, if ``capture_head_means`` (see
            :func:`~inductionlab.core.instrument.head_output_means`).
        captured: ``(layer, head)`` -> the head's output ``[B, Q, head_dim]`` (model dtype) in the last
            call, for each head of ``capture_heads`` (see :func:`~inductionlab.core.instrument.head_outputs`).
        value_norms: list (per layer) of float32 ``[B, n_kv_heads, K]``, the L2 norm of each key slot's value
            vector in the last call, if ``capture_value_norms`` (value-weighted attention; slots as ``patterns``).
        probes: layer -> ``(probe, out)`` of the last call, if ``grad_probes``: ``probe`` a zero leaf tensor
            ``[B, Q, H, D]`` added to the layer's (edited) head outputs, so ``torch.autograd.grad(metric, probe)``
            is d metric / d (each query head's output, the input of ``o_proj``); ``out`` those outputs, detached
            (see :mod:`inductionlab.core.attribution`). The forward must run with gradients enabled.
        calls: number of attention calls seen (per forward: one per layer).
    """

    def __init__(self, model, interventions: Sequence[HeadIntervention], reductions: Mapping[str, torch.Tensor],
                 keep_patterns: bool, capture_head_means: bool, need_probs: bool | None, capture_heads=(),
                 mean_positions="all", capture_value_norms: bool = False, grad_probes: bool = False):
        self.model = model
        self.shape = attention_shape(model.config)
        L, H = self.shape["n_layers"], self.shape["n_heads"]
        self.by_layer: dict[int, list[tuple[int, HeadIntervention, AblationMethod]]] = {}
        checked = []
        for i, iv in enumerate(interventions):
            iv, m = checked_intervention(iv, L, H)
            checked.append(iv)
            self.by_layer.setdefault(iv.layer, []).append((i, iv, m))
        self.interventions = checked
        self.effect = {i: False for i in range(len(self.interventions))}
        self.reduction_targets = {n: torch.as_tensor(t, dtype=torch.long) for n, t in dict(reductions).items()}
        for n, t in self.reduction_targets.items():
            if t.dim() not in (1, 2):
                raise InductionLabError(f"reduction {n!r}: targets must be [Q] or [B, Q] key positions, "
                                        f"got shape {tuple(t.shape)}")
        self.reduced: dict[str, torch.Tensor] = {}
        self.keep_patterns = keep_patterns
        self.patterns: list[torch.Tensor | None] = [None] * L
        self.capture_head_means = capture_head_means
        self.mean_positions = check_positions(mean_positions, "head output means")
        self.head_output_sum: torch.Tensor | None = None
        self.head_output_count = 0
        self.capture_heads = {(int(l), int(h)) for l, h in capture_heads}
        self.captured: dict[tuple[int, int], torch.Tensor] = {}
        self.capture_value_norms = capture_value_norms
        self.value_norms: list[torch.Tensor | None] = [None] * L
        self.grad_probes = grad_probes
        self.probes: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.need_probs = bool(reductions) or keep_patterns if need_probs is None else need_probs
        # reductions alone: the attention from the fused kernel (SDPA's CPU flash attention) and the
        # target probability from its log-sum-exp; no [B, H, Q, K] pattern is built
        self.fused_reductions = bool(reductions) and not keep_patterns and need_probs is None
        self.calls = 0
        self.layer_calls: dict[int, list[tuple[int, int]]] = {}   # layer -> (query heads, value head size) per call
        self.fused_calls = 0     # attention calls that ran the fused kernel (reductions from its log-sum-exp)
        self._forward_pos: tuple[torch.Tensor, int, int] | None = None   # (abs [B, Ktot], past, T)
        self._pos_cache: dict[tuple[int, int, int], Positions] = {}
        self._causal_cache: dict[tuple, bool] = {}   # per forward: is this (shared) layer mask plain causal?
        self._signature = None
        self.thread = threading.get_ident()          # the one thread whose forwards this context edits
        self.cache_tag = _interventions_key(checked)  # what a KV cache computed here was computed under
        self._orig_impl: str | None = None           # the model's own attention implementation (attach())

    # -- the model ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def attach(self) -> Iterator[None]:
        """Point the model at the ``"inductionlab"`` attention for the block; undo it on exit.

        Enters the model's attention modules in ``_ACTIVE`` (so :func:`_dispatch` finds this
        context), records the model's own attention implementation (restored on exit; its
        eager / SDPA choice is the one the kernel step follows), hooks the model's forward
        (:meth:`_pre_forward`, :meth:`_post_forward`) and sets its implementation to
        :data:`FUNCTION_NAME`.

        Raises:
            UnsupportedArchitecture: no attention module with an integer ``layer_idx``, or the
                model does not take an attention implementation through AttentionInterface.
            AlreadyInstrumented: the model is inside another context (this thread's or another's).
        """
        model = self.model
        modules = _model_attention_modules(model)
        if not modules:
            raise UnsupportedArchitecture(f"{type(model).__name__}: no attention modules with layer_idx found; "
                                          "only architectures that dispatch through transformers' AttentionInterface are supported")
        self._register(modules)
        self._orig_impl = model.config._attn_implementation
        legacy = [m for m in model.modules() if id(m) in modules and _legacy(m)]
        hook = model.register_forward_pre_hook(self._pre_forward, with_kwargs=True)
        post = model.register_forward_hook(self._post_forward, with_kwargs=True)
        try:
            for m in legacy:                    # their own _attn, routed through the context
                m._attn = _legacy_entry(m)
            if len(legacy) < len(modules):
                model.set_attn_implementation(FUNCTION_NAME)
                if model.config._attn_implementation != FUNCTION_NAME:
                    raise UnsupportedArchitecture(f"{type(model).__name__} does not support setting its attention "
                                                  "implementation through AttentionInterface")
            yield
        finally:
            hook.remove()
            post.remove()
            for m in legacy:
                m.__dict__.pop("_attn", None)
            if len(legacy) < len(modules):
                model.set_attn_implementation(self._orig_impl)
            with _ACTIVE_LOCK:
                for mid in modules:
                    _ACTIVE.pop(mid, None)

    def _register(self, modules: dict[int, int]) -> None:
        """Enter ``modules`` (``id(module) -> layer``) in ``_ACTIVE`` for this context, unless one of
        them is in a context already (raises AlreadyInstrumented)."""
        with _ACTIVE_LOCK:
            clash = [_ACTIVE[m] for m in modules if m in _ACTIVE]
            if clash:
                if clash[0].inst.thread != self.thread:
                    raise AlreadyInstrumented("this model is inside an instrument() / ablate() context of another thread; "
                                              "one context per model at a time: give each thread its own copy of the "
                                              "model, or wait until that context closes")
                raise AlreadyInstrumented("this model is already instrumented; nest interventions in one instrument() call")
            for mid, layer in modules.items():
                _ACTIVE[mid] = _Slot(self, layer)

    # -- KV caches ----------------------------------------------------------------------------
    def _after_cache(self, cached: torch.Tensor | None, tag: tuple) -> bool:
        """Whether a cache computed under the interventions ``tag`` serves this context: every intervention
        of this context that is not in ``tag`` is an output edit at explicit absolute positions at or past
        each row's ``cached`` real tokens (``[B]``), so it edits only queries the cache does not hold, and the
        others are exactly ``tag``'s. Then the cache is what this context would have computed (activation
        patching at the last position: the prefix is the corrupted run's, under the same base ablation)."""
        if cached is None:
            return False
        rest = []
        for iv in self.interventions:
            p = iv.positions
            if iv.method in ("knockout", "sink") or isinstance(p, str):
                rest.append(iv)
                continue
            p = torch.as_tensor(p, dtype=torch.long, device=cached.device)
            first = p.masked_fill(p < 0, torch.iinfo(torch.long).max).min(-1).values if p.dim() == 2 else \
                (p.min() if (p >= 0).all() else torch.tensor(-1, device=cached.device))
            if bool((first < cached).any()):
                rest.append(iv)
        return _interventions_key(rest) == tag

    def _check_cache(self, cache, cached: torch.Tensor | None = None) -> None:
        """Refuse a KV cache with cached positions computed under other interventions than this
        context's (a plain forward's cache inside ablate(), or another ablation's), unless it was computed
        under this context's interventions less those that edit only positions past it (:meth:`_after_cache`;
        ``cached``: real tokens per row in the cache); tag an empty one."""
        if cache is None:
            return
        past = int(cache.get_seq_length()) if hasattr(cache, "get_seq_length") else 0
        tag = getattr(cache, CACHE_TAG, ())
        if past > 0 and tag != self.cache_tag and not self._after_cache(cached, tag):
            now = _describe_key(self.cache_tag)
            was = _describe_key(tag)
            raise StaleKVCache(f"the KV cache passed in holds {past} positions computed {was}, but this context "
                               f"runs {now}: its keys and values were computed without the same interventions; "
                               "recompute the prefix inside the context (pass no cache, or an empty one)")
        if past == 0:
            _tag_cache(cache, self.cache_tag)

    def _post_forward(self, module, args, kwargs, output):
        """Model forward hook: tag the KV cache this forward returned with this context's interventions."""
        if threading.get_ident() != self.thread:
            return
        cache = getattr(output, "past_key_values", None)
        cache = getattr(output, "cache", None) if cache is None else cache
        if cache is not None:
            _tag_cache(cache, self.cache_tag)

    def _plain_attention(self, module, query, key, value, attention_mask, **kwargs):
        """The model's own attention for a forward of another thread (see :func:`_dispatch`)."""
        if _legacy(module):
            return _legacy_kernel(module, query, key, value, attention_mask)
        eager = kwargs.get("softcap") is not None or self._orig_impl == "eager"
        fn = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None) if eager else None
        if fn is None:
            return ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask, **kwargs)
        if attention_mask is None and query.shape[-2] > 1:       # _mask skipped it: eager needs it
            attention_mask = _causal_mask(query.shape[-2], key.shape[-2], query.dtype, query.device)
        return fn(module, query, key, value, attention_mask, **kwargs)

    # -- absolute positions ---------------------------------------------------------------
    def _pre_forward(self, module, args, kwargs):
        """Model forward pre-hook: absolute positions of this forward from its 2-D mask and cache;
        the cache's check (:meth:`_check_cache`). Another thread's forward is left alone."""
        if threading.get_ident() != self.thread:
            return
        if self._signature is None:
            self._signature = inspect.signature(module.forward)
        try:
            bound = self._signature.bind_partial(*args, **kwargs).arguments
        except TypeError:
            bound = dict(kwargs)
        extra = bound.get("kwargs", {})
        get = lambda n: bound.get(n, extra.get(n) if isinstance(extra, dict) else None)  # noqa: E731
        x = get("input_ids")
        x = get("inputs_embeds") if x is None else x
        self._pos_cache = {}
        self._causal_cache = {}
        if x is None or x.dim() < 2:
            self._forward_pos = None
            return
        B, T = x.shape[0], x.shape[1]
        mask = get("attention_mask")
        cache = get("cache")
        cache = get("past_key_values") if cache is None else cache
        if isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.shape[0] == B and mask.shape[1] >= T:
            past = mask.shape[1] - T
            real = mask.to(torch.bool)
        else:
            past = int(cache.get_seq_length()) if cache is not None and hasattr(cache, "get_seq_length") else 0
            real = torch.ones(B, past + T, dtype=torch.bool, device=x.device)
        self._check_cache(cache, real[:, :past].sum(1))
        abs_pos = torch.where(real, real.long().cumsum(1) - 1, torch.full_like(real, -1, dtype=torch.long))
        self._forward_pos = (abs_pos, past, T)
        if past == 0:
            self.reduced = {}

    def _positions(self, B: int, Q: int, K: int, device) -> Positions:
        key = (B, Q, K)
        if key in self._pos_cache:
            return self._pos_cache[key]
        fp = self._forward_pos
        if fp is None or fp[0].shape[0] != B or fp[2] != Q:
            # the model was called in a way the pre-hook could not read: slots are positions
            q = torch.arange(K - Q, K, device=device).expand(B, Q)
            k = torch.arange(K, device=device).expand(B, K)
        else:
            abs_pos, past, _ = fp
            abs_pos = abs_pos.to(device)
            Ktot = abs_pos.shape[1]
            q = abs_pos[:, past:past + Q]
            if K <= Ktot:        # dynamic caches (sliding-window layers keep the most recent keys)
                k = abs_pos[:, Ktot - K:]
            else:                # static cache: slots past the written ones are unused
                k = torch.cat([abs_pos, torch.full((B, K - Ktot), -1, dtype=torch.long, device=device)], 1)
        pos = Positions(q, k)
        self._pos_cache[key] = pos
        return pos

    def _reduce(self, weights: torch.Tensor, targets: torch.Tensor, pos: Positions) -> tuple[torch.Tensor, torch.Tensor]:
        """Probability on each query's target key: ``([B, H, Q] mass, [B, Q] absolute query index or -1)``."""
        B, H, Q, K = weights.shape
        slot, qa = self._target_slots(targets, pos, B, Q, K, weights.device)
        mass = weights.gather(-1, slot.clamp(min=0)[:, None, :, None].expand(B, H, Q, 1)).squeeze(-1).float()
        return mass * (slot >= 0)[:, None, :], qa

    def _target_slots(self, targets: torch.Tensor, pos: Positions, B: int, Q: int, K: int, dev):
        """``([B, Q] key slot of each query's target or -1, [B, Q] absolute query index or -1)``."""
        t = targets.to(dev)
        if t.dim() == 1:
            t = t.unsqueeze(0).expand(B, -1)
        if t.shape[0] != B:
            raise ValueError(f"targets batch {t.shape[0]} does not match the model's batch {B}")
        Qt = t.shape[1]
        qa = pos.query
        q_ok = (qa >= 0) & (qa < Qt)
        ta = torch.where(q_ok, t.gather(1, qa.clamp(0, Qt - 1)), torch.full_like(qa, -1))   # [B, Q] absolute key
        ka = pos.key
        A = int(max(ka.max().item(), ta.max().item(), 0)) + 2
        inv = torch.full((B, A), -1, dtype=torch.long, device=dev)                          # absolute -> key slot
        inv.scatter_(1, torch.where(ka >= 0, ka, A - 1), torch.arange(K, device=dev).expand(B, K).contiguous())
        inv[:, A - 1] = -1
        slot = torch.where(ta >= 0, inv.gather(1, ta.clamp(min=0)), torch.full_like(ta, -1))
        return slot, torch.where(q_ok, qa, torch.full_like(qa, -1))

    # -- the fused kernel: attention and target probabilities from the log-sum-exp -----------
    def _fused_ok(self, module, query, value, kwargs) -> bool:
        return (self.fused_reductions and _FLASH_CPU is not None and query.device.type == "cpu"
                and self._orig_impl != "eager" and kwargs.get("softcap") is None and kwargs.get("s_aux") is None
                and value.shape[-1] == query.shape[-1] and not module.training and not _legacy(module))

    def _plain_causal(self, mask: torch.Tensor) -> bool:
        """:func:`_is_plain_causal`, checked once per forward for the mask every layer shares
        (the check reads all Q² entries; 30 layers of it cost ~6% of a 513-token forward)."""
        key = (mask.data_ptr(), tuple(mask.shape), tuple(mask.stride()), mask.dtype)
        if key not in self._causal_cache:
            self._causal_cache[key] = _is_plain_causal(mask)
        return self._causal_cache[key]

    def _fused_attention(self, module, query, key, value, attention_mask, kwargs, edited: bool):
        """SDPA's CPU flash kernel on the (edited) additive mask: ``(out [B, Q, H, D], fused)``, where
        ``fused`` holds the row log-sum-exp ``[B, H, Q]`` and what else :meth:`_mass_from_lse` reads.
        GQA key/value heads go in as they are (the kernel maps query head h to KV head
        ``h // (H / H_kv)``, as ``repeat_kv`` does), so they are never copied."""
        B, H, Q, D = query.shape
        K = key.shape[-2]
        scale = kwargs.get("scaling")
        scale = D ** -0.5 if scale is None else float(scale)
        mask = None if attention_mask is None else attention_mask[..., :K].to(query.dtype)
        if mask is not None and not edited and Q == K and mask.shape[1] == 1 and self._plain_causal(mask):
            mask = None                    # no padding, window or edit: the kernel skips the masked blocks
        causal = mask is None and Q == K and Q > 1
        if mask is None and not causal and Q > 1:              # no mask and Q != K: bottom-right causal
            mask = torch.zeros(Q, K, dtype=query.dtype, device=query.device).masked_fill(
                torch.ones(Q, K, dtype=torch.bool, device=query.device).triu(K - Q + 1), torch.finfo(query.dtype).min)
        out, lse = _FLASH_CPU(query, key, value, 0.0, causal, attn_mask=mask, scale=scale)
        return out.transpose(1, 2), _Fused(query, key, mask, scale, lse)

    @staticmethod
    def _mass_from_lse(ctx: _Fused, slot: torch.Tensor) -> torch.Tensor:
        """``[B, H, Q]`` probability of each query's target slot: ``exp(scale·q·k_t + mask_t − lse)``."""
        query, key, mask, scale, lse = ctx
        B, H, Q, D = query.shape
        Hkv = key.shape[1]                                       # GQA: query head h reads KV head h // (H / Hkv)
        k_t = key.gather(2, slot.clamp(min=0)[:, None, :, None].expand(B, Hkv, Q, D))     # [B, Hkv, Q, D]
        q = query.float().reshape(B, Hkv, H // Hkv, Q, D)
        logit = (q * k_t.float()[:, :, None]).sum(-1).view(B, H, Q) * scale
        if mask is not None:
            m = mask if mask.dim() == 4 else mask[None, None]
            m = m.expand(B, m.shape[1], Q, m.shape[-1])
            logit = logit + m.gather(-1, slot.clamp(min=0)[:, None, :, None].expand(B, m.shape[1], Q, 1)).squeeze(-1).float()
        else:                                                   # causal: keys after the query are masked
            K = key.shape[-2]
            q_slot = torch.arange(K - Q, K, device=slot.device)
            logit = logit.masked_fill((slot > q_slot)[:, None, :], float("-inf"))
        return torch.exp(logit - lse.float()) * (slot >= 0)[:, None, :]

    def _base(self, module, kwargs):
        """The kernel when the fused one does not run: a :data:`LEGACY_ATTN` module's own ``_attn``; else the
        module's own ``eager_attention_forward`` when probabilities are needed (or softcapping, or a model loaded
        with eager attention), else transformers' SDPA. Raises UnsupportedArchitecture: eager needed but not found."""
        if _legacy(module):
            return _legacy_kernel
        if self.need_probs or kwargs.get("softcap") is not None or self._orig_impl == "eager":
            fn = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
            if fn is None:
                raise UnsupportedArchitecture(f"{type(module).__name__} has no eager_attention_forward; "
                                              "attention probabilities cannot be read for this architecture")
            return fn
        return ALL_ATTENTION_FUNCTIONS["sdpa"]

    # -- the attention call: four steps ---------------------------------------------------
    def _attention(self, layer, module, query, key, value, attention_mask, **kwargs):
        """One attention call of ``layer`` in this context's thread (from :func:`_dispatch`).

        ``query`` ``[B, H, Q, D]``, ``key`` / ``value`` ``[B, H_kv, K, D]``, ``attention_mask``
        additive ``[B, 1, Q, K]`` or None (plain causal, no padding: :func:`_mask`). Returns what
        the model's attention returns: ``out`` ``[B, Q, H, D]`` (the input of ``o_proj``) and the
        probabilities ``[B, H, Q, K]``, or None when they were not computed.
        """
        self.calls += 1
        B, H, Q, _ = query.shape
        self.layer_calls.setdefault(layer, []).append((H, value.shape[-1]))
        K = key.shape[-2]
        pos = self._positions(B, Q, K, query.device)
        ivs = self.by_layer.get(layer, ())
        cuts = [(i, iv, m) for i, iv, m in ivs if m.cut is not None]
        replaces = [(i, iv, m) for i, iv, m in ivs if m.replace is not None]
        kernel = None if self._fused_ok(module, query, value, kwargs) else self._base(module, kwargs)   # None: fused
        mask, row_dead = self._edit_mask(cuts, attention_mask, pos, query, K, kernel)             # 1.
        out, weights, fused = self._kernel(kernel, module, query, key, value, mask, kwargs, bool(cuts))  # 2.
        if self.capture_value_norms:
            self.value_norms[layer] = value.detach().float().norm(dim=-1).cpu()
        out, weights, zeroed = self._edit_output(replaces, out, weights, row_dead, pos)           # 3.
        if self.grad_probes:                       # d(metric)/d(out) lands on the probe: attribution patching
            probe = torch.zeros_like(out, requires_grad=True)
            self.probes[layer] = (probe, out.detach())
            out = out + probe
        self._reductions(layer, pos, out, weights, fused, row_dead, zeroed)                       # 4.
        return out, weights

    def _edit_mask(self, cuts, mask, pos: Positions, query, K: int, kernel):
        """Step 1, mask edits: ``(mask, row_dead)``, the additive mask ``kernel`` is called with and
        the ``[B, H, Q]`` query rows left with no key (None without ``cuts``).

        Each ``cut`` (``(index, intervention, method)`` of a mask-edit method) masks its edges on
        its own query head only, so the edited mask is ``[B, H, Q, K]``; an intervention whose
        edges were all masked already changed nothing. A None ``mask`` (plain causal) stays None
        for the fused kernel and SDPA, which run causal without one."""
        B, H, Q, _ = query.shape
        if mask is None and Q > 1 and (cuts or not (kernel is None or kernel is ALL_ATTENTION_FUNCTIONS["sdpa"])):
            mask = _causal_mask(Q, K, query.dtype, query.device)   # _mask skipped it: this path needs it
        if not cuts:
            return mask, None
        if mask is None:
            mask = torch.zeros(B, 1, Q, K, dtype=query.dtype, device=query.device)
        mask = mask[..., :K]
        neg = torch.finfo(mask.dtype).min
        new = mask.expand(B, H, Q, K).clone()
        row_dead = torch.zeros(B, H, Q, dtype=torch.bool, device=query.device)
        for i, iv, m in cuts:
            cut = m.cut(iv, pos).to(query.device, torch.bool).expand(B, Q, K)
            before_open = new[:, iv.head] > neg / 2
            if (before_open & cut).any():
                self.effect[i] = True
            new[:, iv.head] = new[:, iv.head].masked_fill(cut, neg)
            row_dead[:, iv.head] |= ~(new[:, iv.head] > neg / 2).any(-1)
        return new, row_dead

    def _kernel(self, kernel, module, query, key, value, mask, kwargs, edited: bool):
        """Step 2, the kernel: ``(out [B, Q, H, D], weights [B, H, Q, K] or None, fused)``.

        ``kernel`` is the model's eager attention or SDPA (:meth:`_base`), or None for the fused
        CPU kernel (:meth:`_fused_attention`, ``edited``: the mask carries edits); then ``weights``
        is None and ``fused`` holds what :meth:`_mass_from_lse` reads (else None)."""
        if kernel is None:
            out, fused = self._fused_attention(module, query, key, value, mask, kwargs, edited)
            self.fused_calls += 1
            return out, None, fused
        out, weights = kernel(module, query, key, value, mask, **kwargs)
        return out, weights, None

    def _edit_output(self, replaces, out, weights, row_dead, pos: Positions):
        """Step 3, output edits: ``(out, weights, zeroed)`` with each ``replace`` (``(index,
        intervention, method)`` of an output-edit method) written on its query head's slice of
        ``out`` ``[B, Q, H, D]`` at the queries it selects (:func:`~inductionlab.core.methods.selected`:
        its positions and rows), and the ``row_dead`` rows (every key cut) written as 0 in ``out``
        and ``weights``. ``zeroed``: ``(head, queries)`` whose probabilities now read as 0 (zero
        ablation; their ``weights`` are zeroed too; queries None: all). An intervention whose head
        already held its new output changed nothing. ``out`` and ``weights`` are copied before the
        first edit."""
        zeroed = []
        dead = row_dead is not None and row_dead.any()
        if not (replaces or dead):
            return out, weights, zeroed
        out = out.clone()
        if weights is not None:
            weights = weights.clone()
        if dead:
            out = out.masked_fill(row_dead.transpose(1, 2)[..., None], 0.0)
            if weights is not None:
                weights = weights.masked_fill(row_dead[..., None], 0.0)
        for i, iv, m in replaces:
            where = selected(iv, pos)                                        # [B, Q] or None: every query
            cur = out[:, :, iv.head]
            new_val = m.replace(iv, cur, where).to(out.dtype).expand_as(cur)
            if where is not None:
                new_val = torch.where(where[..., None], new_val, cur)
            if not torch.equal(cur, new_val):
                self.effect[i] = True
            out[:, :, iv.head] = new_val
            if m.zero_pattern:
                zeroed.append((iv.head, where))
                if weights is not None:
                    weights[:, iv.head] = 0.0 if where is None else weights[:, iv.head].masked_fill(where[..., None], 0.0)
        return out, weights, zeroed

    def _reductions(self, layer, pos: Positions, out, weights, fused, row_dead, zeroed) -> None:
        """Step 4, reductions of the edited call: the per-head output sums (``capture_head_means``),
        each reduction's target mass into ``reduced`` (from ``weights``, already edited, or from
        the fused kernel's log-sum-exp) and the pattern (``keep_patterns``)."""
        if self.capture_head_means:
            self._add_head_outputs(layer, pos, out)
        for l, h in self.capture_heads:
            if l == layer:
                self.captured[(l, h)] = out[:, :, h].detach().clone()
        if self.reduction_targets:
            if weights is None and fused is None:
                raise UnsupportedArchitecture("the attention function returned no probabilities")
            for name, targets in self.reduction_targets.items():
                if fused is None:
                    mass, qa = self._reduce(weights.detach(), targets, pos)      # [B, H, Q], [B, Q]
                else:
                    mass, qa = self._fused_target_mass(targets, pos, fused, row_dead, zeroed)
                self._store_reduced(name, layer, mass, qa, targets.shape[-1])
        if self.keep_patterns:
            self.patterns[layer] = weights.detach().float().cpu()

    def _add_head_outputs(self, layer, pos: Positions, out) -> None:
        """Add this call's per-head outputs ``out`` ``[B, Q, H, D]`` over real queries at ``mean_positions``
        to ``head_output_sum[layer]``; count those queries once per forward (at layer 0)."""
        named = query_mask(self.mean_positions, pos)
        real = (pos.query >= 0) if named is None else named
        count = int(real.sum().item())
        real = real.to(out.dtype)                                  # [B, Q]: padding queries excluded
        s = (out.detach() * real[:, :, None, None]).float().sum(dim=(0, 1))  # [H, D]
        if self.head_output_sum is None:
            self.head_output_sum = torch.zeros(self.shape["n_layers"], *s.shape)
        self.head_output_sum[layer] += s.cpu()
        if layer == 0:
            self.head_output_count += count

    def _fused_target_mass(self, targets, pos: Positions, fused: _Fused, row_dead, zeroed):
        """:meth:`_reduce` for the fused kernel: ``([B, H, Q] mass, [B, Q] absolute query index or
        -1)`` from its log-sum-exp, with step 3's edits applied (dead rows and ``zeroed`` heads read 0)."""
        B, _, Q, _ = fused.query.shape
        slot, qa = self._target_slots(targets, pos, B, Q, fused.key.shape[-2], fused.query.device)
        with torch.no_grad():
            mass = self._mass_from_lse(fused, slot)
        if row_dead is not None:
            mass = mass.masked_fill(row_dead, 0.0)
        for head, where in zeroed:
            mass[:, head] = 0.0 if where is None else mass[:, head].masked_fill(where, 0.0)
        return mass, qa

    def _store_reduced(self, name: str, layer: int, mass, qa, Qt: int) -> None:
        """Write ``mass`` ``[B, H, Q]`` into ``reduced[name][layer]`` at the queries' absolute
        positions ``qa`` ``[B, Q]`` (``-1``: none); a new batch size starts ``reduced[name]`` afresh."""
        B, H, Q = mass.shape
        if name not in self.reduced or self.reduced[name].shape[1] != B:
            self.reduced[name] = torch.zeros(self.shape["n_layers"], B, self.shape["n_heads"], Qt)
        row = torch.cat([self.reduced[name][layer], torch.zeros(B, H, 1)], -1)   # extra column: dropped
        idx = torch.where(qa >= 0, qa, Qt).cpu()[:, None, :].expand(B, H, Q)
        row.scatter_(-1, idx, mass.cpu())
        self.reduced[name][layer] = row[..., :Qt]

    def check_effects(self) -> None:
        """Raise :class:`NoOpIntervention` if some intervention never changed anything."""
        dead = [self.interventions[i] for i, hit in self.effect.items() if not hit]
        if dead and self.calls:
            iv = dead[0]
            raise NoOpIntervention(f"{iv.method} intervention on head ({iv.layer}, {iv.head}) changed nothing "
                                   f"({len(dead)} of {len(self.interventions)} interventions were no-ops)")
