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
   keeping ``[B, H, T, T]`` patterns unless ``keep_patterns=True``. With reductions alone (CPU,
   no softcapping) no pattern is built at all: SDPA's fused CPU flash kernel computes the
   output and the row log-sum-exp, and each target probability is
   ``exp(scale·q·k_target + mask_target − lse)`` — O(T) memory per row, equal to the eager
   pattern's value within 1e-6 in fp32 (tests/test_fused_reductions.py),
4. apply ``zero`` / ``mean`` interventions on the per-head attention output (the input of
   ``o_proj``, split with ``config.head_dim``), so only the named query head changes.

Positions are **absolute**: position 0 is each sequence's first real token (left padding
excluded, read from the 2-D ``attention_mask`` passed to the model), and a query decoded
against a KV cache keeps the position it has in the whole sequence. Sink, knockout edges and
reduction targets all name absolute positions, so a left-padded batch gives each row what it
gives alone, and cached decoding gives what the full forward gives (dynamic caches, including
sliding-window layers; a static cache's unused slots count as padding).

Ablation methods live in one table, :data:`ABLATION_METHODS` (name -> :class:`AblationMethod`):
each entry is either a **mask edit** (``cut``: which query→key edges to mask before the
softmax) or an **output edit** (``replace``: the head's new output). Adding a method is one
function and one entry; validation and the CLI read the table (:func:`ablation_methods`).

On exit the model's original attention implementation (and each module's train / eval mode:
measurements run in eval mode) is restored; registering the name is the only global change and
it alters no other model. A context edits only the forwards of the thread that opened it, and a
KV cache computed under other interventions than the context's is refused. Any intervention
that provably did nothing (a head whose output was already what we wrote, edges that were
already masked) and any model whose attention never dispatched through the registry raise an
error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import sys
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ..errors import InductionLabError
from ..names import ABLATION_METHOD_NEEDS, check_registry
from .models import attention_shape

FUNCTION_NAME = "inductionlab"


class UnsupportedArchitecture(InductionLabError):
    """The model does not dispatch attention through transformers' AttentionInterface."""


class NoOpIntervention(RuntimeError):
    """An intervention ran but provably changed nothing."""


class AlreadyInstrumented(InductionLabError, RuntimeError):
    """The model is inside another :func:`instrument` / :func:`ablate` context (this thread's or
    another's): one context per model at a time."""


class StaleKVCache(InductionLabError):
    """A KV cache computed under other interventions (or none) was passed into a context whose
    interventions differ: its cached keys and values would silently mix two models."""


@dataclass(frozen=True)
class HeadIntervention:
    """One intervention on one query head.

    Attributes:
        layer, head: query-head address (0-based integers). Under GQA only this query head changes.
        method: a name in :data:`ABLATION_METHODS`: ``zero`` (head output 0; equivalent to an
            all-zero attention pattern), ``mean`` (head output replaced by ``value``, its mean
            over a reference batch), ``sink`` (every key but absolute position 0, the sequence's
            first real token, masked before the softmax), ``knockout`` (the query→key edges in
            ``edges`` masked before the softmax; a query row with every key knocked out writes
            0, the softmax of nothing taken as 0).
        value: for ``mean``: tensor ``[head_dim]``.
        edges: for ``knockout``: bool tensor ``[Q, K]`` (True = knock out) or a list of
            ``(query, key)`` pairs, both indexed by absolute positions.
    """
    layer: int
    head: int
    method: str = "zero"
    value: torch.Tensor | None = None
    edges: object = None


@dataclass(frozen=True)
class Positions:
    """Absolute positions of the queries and keys of one attention call.

    Attributes:
        query: LongTensor ``[B, Q]``: absolute position of each query slot (0 = the row's first
            real token); ``-1`` for padding.
        key: LongTensor ``[B, K]``: absolute position of each key slot; ``-1`` for padding and
            for unused cache slots.
    """
    query: torch.Tensor
    key: torch.Tensor


@dataclass(frozen=True)
class AblationMethod:
    """One entry of :data:`ABLATION_METHODS`: exactly one of ``cut`` (mask edit) or ``replace``
    (output edit).

    Attributes:
        name: the method's name (``HeadIntervention.method``, ``ablate(method=)``, CLI choice).
        description: one line for help texts.
        cut: mask edit, ``cut(intervention, positions) -> bool [B, Q, K]`` (True = mask this
            query→key edge before the softmax, on this query head only).
        replace: output edit, ``replace(intervention, out) -> [B, Q, head_dim]``: the head's new
            output given its output ``out`` ``[B, Q, head_dim]``.
        needs: ``"value"`` (a ``[head_dim]`` tensor: :func:`ablate` fills it with the head's mean
            over ``reference_ids``), ``"edges"`` (knockout edges: only through
            :func:`instrument`) or None.
        zero_pattern: the ablated head's attention probabilities read as 0 (zero ablation).
    """
    name: str
    description: str
    cut: Callable[[HeadIntervention, Positions], torch.Tensor] | None = None
    replace: Callable[[HeadIntervention, torch.Tensor], torch.Tensor] | None = None
    needs: str | None = None
    zero_pattern: bool = False

    def __post_init__(self):
        if (self.cut is None) == (self.replace is None):
            raise ValueError(f"ablation method {self.name!r}: give exactly one of cut (mask edit) or replace (output edit)")
        if self.needs not in (None, "value", "edges"):
            raise ValueError(f"ablation method {self.name!r}: needs must be None, 'value' or 'edges'")


def _zero_output(iv: HeadIntervention, out: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(out)


def _mean_output(iv: HeadIntervention, out: torch.Tensor) -> torch.Tensor:
    return iv.value.to(out.device, out.dtype).expand_as(out)


def _sink_cut(iv: HeadIntervention, pos: Positions) -> torch.Tensor:
    B, Q = pos.query.shape
    return (pos.key != 0)[:, None, :].expand(B, Q, -1)


def _knockout_cut(iv: HeadIntervention, pos: Positions) -> torch.Tensor:
    E = iv.edges.to(pos.query.device)                              # [Qe, Ke] bool, absolute positions
    q, k = pos.query, pos.key
    ok = ((q >= 0) & (q < E.shape[0]))[:, :, None] & ((k >= 0) & (k < E.shape[1]))[:, None, :]
    qi = q.clamp(0, E.shape[0] - 1)[:, :, None]
    ki = k.clamp(0, E.shape[1] - 1)[:, None, :]
    return E[qi, ki] & ok


#: The ablation methods: name -> :class:`AblationMethod`. Add a method with one function and
#: one entry here; :func:`instrument`, :func:`ablate` and the CLI read this table.
ABLATION_METHODS: dict[str, AblationMethod] = {m.name: m for m in (
    AblationMethod("zero", "head output set to 0 (Olsson et al. 2022)", replace=_zero_output, zero_pattern=True),
    AblationMethod("mean", "head output set to its mean over a reference batch (Wang et al. 2022)",
                   replace=_mean_output, needs="value"),
    AblationMethod("sink", "every key but the first real token masked before the softmax", cut=_sink_cut),
    AblationMethod("knockout", "named query→key edges masked before the softmax (Wang et al. 2022)",
                   cut=_knockout_cut, needs="edges"),
)}
check_registry("ablation method", ABLATION_METHODS, ABLATION_METHOD_NEEDS)
assert all(m.needs == ABLATION_METHOD_NEEDS[n] for n, m in ABLATION_METHODS.items()), "names.ABLATION_METHOD_NEEDS disagrees"
METHODS = tuple(ABLATION_METHODS)  # the built-in names (kept for callers of 0.x); read ABLATION_METHODS


def ablation_methods(*, with_edges: bool = False) -> tuple[str, ...]:
    """Names of the registered ablation methods usable by :func:`ablate` (a head list is
    enough); ``with_edges=True`` adds those that need knockout edges (:func:`instrument` only)."""
    return tuple(n for n, m in ABLATION_METHODS.items() if with_edges or m.needs != "edges")


def ablation_method(name: str) -> AblationMethod:
    """The registry entry of ``name``. Raises InductionLabError naming the known methods."""
    try:
        return ABLATION_METHODS[name]
    except (KeyError, TypeError):
        raise InductionLabError(f"unknown ablation method {name!r}; use one of "
                                f"{', '.join(ablation_methods(with_edges=True))}") from None


def check_head(layer, head, n_layers: int, n_heads: int) -> tuple[int, int]:
    """``(layer, head)`` as Python ints after checking they are integers in range.

    Raises:
        InductionLabError: not an integer (6.7, "6", True) or outside ``0..n_layers-1`` /
            ``0..n_heads-1``; the message gives the valid range.
    """
    def as_int(x, what, n):
        if isinstance(x, bool) or not isinstance(x, (int, np.integer)) and not (
                isinstance(x, torch.Tensor) and x.dim() == 0 and not x.is_floating_point() and x.dtype != torch.bool):
            raise InductionLabError(f"head ({layer!r}, {head!r}): {what} must be an integer in 0-{n - 1}, "
                                    f"got {x!r}")
        return int(x)
    l, h = as_int(layer, "layer", n_layers), as_int(head, "head", n_heads)
    if not (0 <= l < n_layers and 0 <= h < n_heads):
        raise InductionLabError(f"head ({l}, {h}) out of range: the model has {n_layers} layers "
                                f"(0-{n_layers - 1}) x {n_heads} query heads (0-{n_heads - 1})")
    return l, h


def _edges_tensor(edges, where: str) -> torch.Tensor:
    """Knockout edges as a bool ``[Qe, Ke]`` tensor indexed by absolute (query, key) positions."""
    if isinstance(edges, torch.Tensor):
        if edges.dim() != 2:
            raise InductionLabError(f"{where}: knockout edges must be a [Q, K] bool tensor, got shape "
                                    f"{tuple(edges.shape)}")
        return edges.to(torch.bool)
    try:
        pairs = [(int(q), int(k)) for q, k in edges]
    except (TypeError, ValueError):
        raise InductionLabError(f"{where}: knockout edges must be a [Q, K] bool tensor or (query, key) "
                                "integer pairs") from None
    if not pairs:
        raise InductionLabError(f"{where}: knockout needs at least one (query, key) edge")
    if min(min(p) for p in pairs) < 0:
        raise InductionLabError(f"{where}: knockout positions must be >= 0 (absolute positions), got {pairs}")
    e = torch.zeros(max(q for q, _ in pairs) + 1, max(k for _, k in pairs) + 1, dtype=torch.bool)
    for q, k in pairs:
        e[q, k] = True
    return e


@dataclass
class _Slot:
    inst: "Instrumentation"
    layer: int


def _is_plain_causal(mask: torch.Tensor) -> bool:
    """Whether an additive mask ``[B, 1, Q, Q]`` is exactly the causal one (0 on and below the
    diagonal, the dtype's minimum above)."""
    Q = mask.shape[-1]
    upper = torch.ones(Q, Q, dtype=torch.bool, device=mask.device).triu(1)
    neg = torch.finfo(mask.dtype).min
    return bool(((mask == 0) == ~upper).all()) and bool((mask.masked_select(upper) == neg).all()) if Q > 1 else bool((mask == 0).all())


# PyTorch's fused CPU attention, which also returns the row log-sum-exp ([B, H, Q], float32)
_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)

_ACTIVE: dict[int, _Slot] = {}  # id(attention module) -> slot, only while a context is open


_ACTIVE_LOCK = threading.Lock()   # guards the check-then-register of instrument()


def _dispatch(module, query, key, value, attention_mask, **kwargs):
    slot = _ACTIVE.get(id(module))
    if slot is None:
        raise RuntimeError("inductionlab attention called outside an instrument() context; "
                           "reset the model with model.set_attn_implementation('sdpa')")
    if slot.inst.thread != threading.get_ident():
        # another thread's forward of the same model: the context belongs to the thread that opened
        # it, so this call runs the model's own attention, untouched (no intervention, no reduction)
        return slot.inst._plain_attention(module, query, key, value, attention_mask, **kwargs)
    return slot.inst._attention(slot.layer, module, query, key, value, attention_mask, **kwargs)


AttentionInterface.register(FUNCTION_NAME, _dispatch)
def _mask(*args, **kwargs):
    """The mask function of our attention: None where SDPA's own test says plain causal attention
    needs no mask (no padding; :func:`transformers.masking_utils.sdpa_mask` with
    ``allow_is_causal_skip``), else eager's additive ``[B, 1, Q, K]`` mask. A None mask is made
    causal by the attention call only on the paths that need one (eager, mask edits), so the
    ``[Q, K]`` mask is not built for the fused and SDPA paths (67 MB at 4,097 tokens in fp32)."""
    kwargs.pop("allow_is_causal_skip", None)
    skip = {k: v for k, v in kwargs.items() if k != "dtype"}
    if sdpa_mask(*args, allow_is_causal_skip=True, **skip) is None:
        return None
    return eager_mask(*args, **kwargs)


def _causal_mask(Q: int, K: int, dtype, device) -> torch.Tensor:
    """Additive causal mask ``[1, 1, Q, K]`` for the last ``Q`` of ``K`` positions (query i sees keys
    ``≤ i + K − Q``): 0 where attended, the dtype's minimum elsewhere."""
    m = torch.zeros(Q, K, dtype=dtype, device=device)
    return m.masked_fill(torch.ones(Q, K, dtype=torch.bool, device=device).triu(K - Q + 1),
                         torch.finfo(dtype).min)[None, None]


AttentionMaskInterface.register(FUNCTION_NAME, _mask)


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


@contextlib.contextmanager
def eval_mode(model) -> Iterator[None]:
    """Every submodule of ``model`` in eval mode (dropout off) for the block; each module's own
    train / eval flag restored after. Measurements run under it, so a model left in ``train()``
    gives the same scores on identical calls."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


class Instrumentation:
    """State of one :func:`instrument` context. Read results after the forward passes.

    Attributes:
        reduced: name -> float32 tensor ``[n_layers, B, n_heads, Qt]`` indexed by **absolute**
            query position (``Qt`` = the targets' length). A forward without a KV cache starts
            it afresh; a cached forward fills in the queries it decodes (so prefix + decoded
            tokens together equal the full forward). Padding queries stay 0.
        patterns: list (per layer) of float32 ``[B, n_heads, Q, K]`` if ``keep_patterns``
            (slots of the last call, not absolute positions).
        head_output_sum / head_output_count: running sums of per-head outputs
            ``[n_layers, n_heads, head_dim]`` over real (non-padding) query tokens, and the
            number of those tokens, if ``capture_head_means`` (see :func:`head_output_means`).
        calls: number of attention calls seen (per forward: one per layer).
    """

    def __init__(self, model, interventions: Sequence[HeadIntervention], reductions: Mapping[str, torch.Tensor],
                 keep_patterns: bool, capture_head_means: bool, need_probs: bool | None):
        self.model = model
        self.shape = attention_shape(model.config)
        L, H = self.shape["n_layers"], self.shape["n_heads"]
        self.by_layer: dict[int, list[tuple[int, HeadIntervention, AblationMethod]]] = {}
        checked = []
        for i, iv in enumerate(interventions):
            m = ablation_method(iv.method)
            layer, head = check_head(iv.layer, iv.head, L, H)
            where = f"{iv.method} on head ({layer}, {head})"
            if m.needs == "value" and iv.value is None:
                raise InductionLabError(f"{where} needs the head's mean output; pass reference_ids to ablate()")
            if m.needs == "edges":
                if iv.edges is None:
                    raise InductionLabError(f"{where} needs edges (a [Q, K] bool mask or (query, key) pairs)")
                iv = dataclasses.replace(iv, edges=_edges_tensor(iv.edges, where))
            iv = dataclasses.replace(iv, layer=layer, head=head)
            checked.append(iv)
            self.by_layer.setdefault(layer, []).append((i, iv, m))
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
        self.head_output_sum: torch.Tensor | None = None
        self.head_output_count = 0
        self.need_probs = bool(reductions) or keep_patterns if need_probs is None else need_probs
        # reductions alone: the attention from the fused kernel (SDPA's CPU flash attention) and the
        # target probability from its log-sum-exp; no [B, H, Q, K] pattern is built
        self.fused_reductions = bool(reductions) and not keep_patterns and need_probs is None
        self.calls = 0
        self.fused_calls = 0     # attention calls that ran the fused kernel (reductions from its log-sum-exp)
        self._forward_pos: tuple[torch.Tensor, int, int] | None = None   # (abs [B, Ktot], past, T)
        self._pos_cache: dict[tuple[int, int, int], Positions] = {}
        self._causal_cache: dict[tuple, bool] = {}   # per forward: is this (shared) layer mask plain causal?
        self._signature = None
        self.thread = threading.get_ident()          # the one thread whose forwards this context edits
        self.cache_tag = _interventions_key(checked)  # what a KV cache computed here was computed under

    # -- KV caches ----------------------------------------------------------------------------
    def _check_cache(self, cache) -> None:
        """Refuse a KV cache with cached positions computed under other interventions than this
        context's (a plain forward's cache inside ablate(), or another ablation's); tag an empty one."""
        if cache is None:
            return
        past = int(cache.get_seq_length()) if hasattr(cache, "get_seq_length") else 0
        tag = getattr(cache, CACHE_TAG, ())
        if past > 0 and tag != self.cache_tag:
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
        self._check_cache(cache)
        if isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.shape[0] == B and mask.shape[1] >= T:
            past = mask.shape[1] - T
            real = mask.to(torch.bool)
        else:
            past = int(cache.get_seq_length()) if cache is not None and hasattr(cache, "get_seq_length") else 0
            real = torch.ones(B, past + T, dtype=torch.bool, device=x.device)
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

    def _fused_ok(self, module, query, kwargs) -> bool:
        return (self.fused_reductions and _FLASH_CPU is not None and query.device.type == "cpu"
                and self._orig_impl != "eager" and kwargs.get("softcap") is None and kwargs.get("s_aux") is None
                and not module.training)

    def _plain_causal(self, mask: torch.Tensor) -> bool:
        """:func:`_is_plain_causal`, checked once per forward for the mask every layer shares
        (the check reads all Q² entries; 30 layers of it cost ~6% of a 513-token forward)."""
        key = (mask.data_ptr(), tuple(mask.shape), tuple(mask.stride()), mask.dtype)
        if key not in self._causal_cache:
            self._causal_cache[key] = _is_plain_causal(mask)
        return self._causal_cache[key]

    def _fused_attention(self, module, query, key, value, attention_mask, kwargs, edited: bool):
        """SDPA's CPU flash kernel on the (edited) additive mask: ``(out [B, Q, H, D], lse [B, H, Q])``
        plus what is needed to read target probabilities from the log-sum-exp (:meth:`_mass_from_lse`).
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
        return out.transpose(1, 2), (query, key, mask, scale, lse)

    @staticmethod
    def _mass_from_lse(ctx, slot: torch.Tensor) -> torch.Tensor:
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
        pos = self._positions(B, Q, K, query.device)
        row_dead = None
        mask_edits = [(i, iv, m) for i, iv, m in ivs if m.cut is not None]
        if attention_mask is None and Q > 1 and (mask_edits or not (
                self._fused_ok(module, query, kwargs) or self._base(module, kwargs) is ALL_ATTENTION_FUNCTIONS["sdpa"])):
            attention_mask = _causal_mask(Q, K, query.dtype, query.device)   # _mask skipped it: this path needs it
        if mask_edits:
            if attention_mask is None:
                attention_mask = torch.zeros(B, 1, Q, K, dtype=query.dtype, device=query.device)
            attention_mask = attention_mask[..., :K]
            neg = torch.finfo(attention_mask.dtype).min
            new = attention_mask.expand(B, H, Q, K).clone()
            row_dead = torch.zeros(B, H, Q, dtype=torch.bool, device=query.device)
            for i, iv, m in mask_edits:
                cut = m.cut(iv, pos).to(query.device, torch.bool).expand(B, Q, K)
                before_open = new[:, iv.head] > neg / 2
                if (before_open & cut).any():
                    self.effect[i] = True
                new[:, iv.head] = new[:, iv.head].masked_fill(cut, neg)
                row_dead[:, iv.head] |= ~(new[:, iv.head] > neg / 2).any(-1)
            attention_mask = new
        fused = None
        if self._fused_ok(module, query, kwargs):
            out, fused = self._fused_attention(module, query, key, value, attention_mask, kwargs, bool(mask_edits))
            weights = None
            self.fused_calls += 1
        else:
            out, weights = self._base(module, kwargs)(module, query, key, value, attention_mask, **kwargs)
        # out: [B, Q, H, D]; weights: [B, H, Q, K] or None (fused: the log-sum-exp instead)
        zeroed = []
        edits = [(i, iv, m) for i, iv, m in ivs if m.replace is not None]
        if edits or (row_dead is not None and row_dead.any()):
            out = out.clone()
            if weights is not None:
                weights = weights.clone()
            if row_dead is not None and row_dead.any():
                out = out.masked_fill(row_dead.transpose(1, 2)[..., None], 0.0)
                if weights is not None:
                    weights = weights.masked_fill(row_dead[..., None], 0.0)
            for i, iv, m in edits:
                new_val = m.replace(iv, out[:, :, iv.head]).to(out.dtype).expand_as(out[:, :, iv.head])
                if not torch.equal(out[:, :, iv.head], new_val):
                    self.effect[i] = True
                out[:, :, iv.head] = new_val
                if m.zero_pattern:
                    zeroed.append(iv.head)
                    if weights is not None:
                        weights[:, iv.head] = 0.0
        if self.capture_head_means:
            real = (pos.query >= 0).to(out.dtype)                     # [B, Q]: padding queries excluded
            s = (out.detach() * real[:, :, None, None]).float().sum(dim=(0, 1))  # [H, D]
            if self.head_output_sum is None:
                self.head_output_sum = torch.zeros(self.shape["n_layers"], *s.shape)
            self.head_output_sum[layer] += s.cpu()
            if layer == 0:
                self.head_output_count += int((pos.query >= 0).sum().item())
        if self.reduction_targets:
            if weights is None and fused is None:
                raise UnsupportedArchitecture("the attention function returned no probabilities")
            for name, targets in self.reduction_targets.items():
                if fused is None:
                    mass, qa = self._reduce(weights.detach(), targets, pos)      # [B, H, Q], [B, Q]
                else:
                    slot, qa = self._target_slots(targets, pos, B, Q, K, query.device)
                    with torch.no_grad():
                        mass = self._mass_from_lse(fused, slot)
                    if row_dead is not None:
                        mass = mass.masked_fill(row_dead, 0.0)
                    if zeroed:
                        mass[:, zeroed] = 0.0
                Qt = targets.shape[-1]
                if name not in self.reduced or self.reduced[name].shape[1] != B:
                    self.reduced[name] = torch.zeros(self.shape["n_layers"], B, self.shape["n_heads"], Qt)
                row = torch.cat([self.reduced[name][layer], torch.zeros(B, H, 1)], -1)   # extra column: dropped
                idx = torch.where(qa >= 0, qa, Qt).cpu()[:, None, :].expand(B, H, Q)
                row.scatter_(-1, idx, mass.cpu())
                self.reduced[name][layer] = row[..., :Qt]
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


def unwrap_model(model):
    """The ``torch.nn.Module`` of ``model``: itself, or the ``.model`` of a LoadedModel bundle.

    Raises:
        TypeError: neither a module with a ``config`` nor a bundle holding one (None included).
    """
    if isinstance(model, torch.nn.Module) and hasattr(model, "config"):
        return model
    inner = getattr(model, "model", None)
    if isinstance(inner, torch.nn.Module) and hasattr(inner, "config"):
        return inner
    raise TypeError(f"expected a transformers model (or a LoadedModel bundle from inductionlab.load_model), got "
                    f"{type(model).__name__}")


@contextlib.contextmanager
def instrument(model, interventions: Iterable[HeadIntervention] = (), *,
               reductions: Mapping[str, torch.Tensor] | None = None, keep_patterns: bool = False,
               capture_head_means: bool = False, need_probs: bool | None = None,
               strict: bool = True) -> Iterator[Instrumentation]:
    """Point ``model`` at the inductionlab attention function for the duration of the block.

    Args:
        model: a transformers causal LM whose attention dispatches through ``AttentionInterface``
            (or a LoadedModel bundle holding one).
        interventions: :class:`HeadIntervention` items (query-head indexing, absolute positions).
        reductions: name -> target key per query, LongTensor ``[Qt]`` or ``[B, Qt]`` indexed by
            absolute query position and giving an absolute key position (``-1`` = none); after
            a forward, ``inst.reduced[name]`` is float32 ``[n_layers, B, n_heads, Qt]``.
        keep_patterns: also keep full ``[B, H, Q, K]`` probabilities per layer (memory heavy).
        capture_head_means: accumulate per-head outputs over real tokens for mean ablation.
        need_probs: force (True) or forbid (False) the eager path; default: eager only when
            probabilities are needed or the model was loaded with eager attention.
        strict: on exit, raise :class:`NoOpIntervention` if an intervention changed nothing.

    The model runs in eval mode inside the block (dropout off, :func:`eval_mode`; each module's
    mode restored on exit). The context belongs to the thread that opened it: another thread's
    forward of the same model meanwhile runs the model's own attention, with no intervention and
    no reduction. A KV cache passed to a forward inside the block must have been computed under
    the same interventions (in this context or an equal one); the model's own cache, built
    inside, is.

    Raises:
        InductionLabError: head out of range or not an integer, unknown method, missing mean
            value / edges, malformed edges or targets.
        AlreadyInstrumented: the model is already inside a context (this thread's: nest the
            interventions in one call; another thread's: one context per model at a time).
        StaleKVCache: (from a forward in the block) a KV cache with cached positions computed
            under other interventions, e.g. a plain forward's cache reused inside :func:`ablate`.
        UnsupportedArchitecture: the model never called the registered attention function.
        NoOpIntervention: (``strict``) an intervention provably did nothing.
    """
    model = unwrap_model(model)
    inst = Instrumentation(model, list(interventions), reductions or {}, keep_patterns,
                           capture_head_means, need_probs)
    modules = _model_attention_modules(model)
    if not modules:
        raise UnsupportedArchitecture(f"{type(model).__name__}: no attention modules with layer_idx found; "
                                      "only architectures that dispatch through transformers' AttentionInterface are supported")
    with _ACTIVE_LOCK:
        clash = [_ACTIVE[m] for m in modules if m in _ACTIVE]
        if clash:
            if clash[0].inst.thread != inst.thread:
                raise AlreadyInstrumented("this model is inside an instrument() / ablate() context of another thread; "
                                          "one context per model at a time: give each thread its own copy of the "
                                          "model, or wait until that context closes")
            raise AlreadyInstrumented("this model is already instrumented; nest interventions in one instrument() call")
        for mid, layer in modules.items():
            _ACTIVE[mid] = _Slot(inst, layer)
    orig = model.config._attn_implementation
    inst._orig_impl = orig
    hook = model.register_forward_pre_hook(inst._pre_forward, with_kwargs=True)
    post = model.register_forward_hook(inst._post_forward, with_kwargs=True)
    modes = eval_mode(model)
    ok = False
    try:
        modes.__enter__()
        model.set_attn_implementation(FUNCTION_NAME)
        if model.config._attn_implementation != FUNCTION_NAME:
            raise UnsupportedArchitecture(f"{type(model).__name__} does not support setting its attention "
                                          "implementation through AttentionInterface")
        yield inst
        ok = True
    finally:
        hook.remove()
        post.remove()
        model.set_attn_implementation(orig)
        modes.__exit__(None, None, None)
        with _ACTIVE_LOCK:
            for mid in modules:
                _ACTIVE.pop(mid, None)
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
        attention_mask: optional ``[B, T]`` (1 = real token, 0 = padding); padding slots are
            left out of the mean.

    Returns:
        float32 ``[n_layers, n_heads, head_dim]``: mean over the batch's real tokens of each
        query head's output (the input of ``o_proj``). Convention: position-independent mean, as
        in mean ablation of Wang et al. 2022 / Todd et al. 2024 (mean over a reference set).

    Raises:
        InductionLabError: the batch holds no real token.
    """
    model = unwrap_model(model)
    with torch.inference_mode(), instrument(model, capture_head_means=True) as inst:
        model(input_ids=input_ids, attention_mask=attention_mask)
    if inst.head_output_count == 0:
        raise InductionLabError("the mean-ablation reference batch holds no real token; pass a non-empty batch")
    return inst.head_output_sum / inst.head_output_count


@contextlib.contextmanager
def ablate(model, heads: Iterable[tuple[int, int]], method: str = "zero", *,
           reference_ids: torch.Tensor | None = None, reference_mask: torch.Tensor | None = None,
           strict: bool = True) -> Iterator[Instrumentation]:
    """Ablate a set of query heads while the block runs.

    Args:
        model: the model (or a LoadedModel bundle).
        heads: ``(layer, head)`` integer pairs, query-head indexing.
        method: a name in :func:`ablation_methods` (``zero`` | ``mean`` | ``sink`` built in;
            ``knockout`` needs edges: use :func:`instrument`).
        reference_ids: ``[B, T]`` reference batch for methods that need a value (``mean``).
        reference_mask: optional ``[B, T]`` attention mask of the reference batch (padding is
            left out of the mean).

    The ablation is per thread and per model: it edits only the forwards of the thread that
    opened it (another thread's forward of the same model meanwhile runs unablated), a second
    ``ablate()`` / :func:`instrument` of the same model while it is open is refused, and the
    model runs in eval mode inside. A KV cache computed outside the block (or under another
    ablation) is refused when passed to a forward inside it (:class:`StaleKVCache`): recompute
    the prefix inside the block.

    Raises:
        InductionLabError: unknown method, head out of range or not an integer, ``mean``
            without reference_ids, no heads (nothing would be ablated: almost surely a bug; run
            the model without ``ablate()`` for the intact model); :class:`AlreadyInstrumented`,
            :class:`StaleKVCache` (see :func:`instrument`).
    """
    heads = list(heads)
    if not heads:
        raise InductionLabError("ablate(): heads is empty, so nothing would be ablated; pass at least one "
                                "(layer, head) pair, or run the model without ablate() for the intact model")
    model = unwrap_model(model)
    m = ablation_method(method)
    if m.needs == "edges":
        raise InductionLabError(f"{method} needs edges; use instrument(model, [HeadIntervention(layer, head, "
                                f"{method!r}, edges=...)]) or one of {', '.join(ablation_methods())}")
    shape = attention_shape(model.config)
    heads = [check_head(*lh, shape["n_layers"], shape["n_heads"]) for lh in heads]
    means = None
    if m.needs == "value":
        if reference_ids is None:
            raise InductionLabError(f"{method} ablation needs a reference batch (reference_ids)")
        means = head_output_means(model, reference_ids, attention_mask=reference_mask)
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
