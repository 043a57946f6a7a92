"""The ablation methods (SPEC §2): add a method here: one function and one entry.

:data:`ABLATION_METHODS` maps a name to an :class:`AblationMethod`, which is either a **mask
edit** (``cut``: which query→key edges of one query head to mask before the softmax) or an
**output edit** (``replace``: the head's new output, the input of ``o_proj``). The attention
call (:mod:`inductionlab.core.attention`) applies every cut in its first step and every replace
in its third; :func:`~inductionlab.core.instrument.ablate`, the configs and the CLI read the
table (:func:`ablation_methods`), and the name with what it needs stands in
:data:`inductionlab.names.ABLATION_METHOD_NEEDS` (checked at import).

Positions are absolute (0 = each sequence's first real token; see :class:`Positions`). This
module needs torch only, not transformers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ..errors import InductionLabError
from ..names import ABLATION_METHOD_NEEDS, DEFAULT_METHOD, check_registry


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
    method: str = DEFAULT_METHOD
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
        needs: ``"value"`` (a ``[head_dim]`` tensor: :func:`~inductionlab.core.instrument.ablate`
            fills it with the head's mean over ``reference_ids``), ``"edges"`` (knockout edges: only
            through :func:`~inductionlab.core.instrument.instrument`) or None.
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
#: one entry here; :func:`~inductionlab.core.instrument.instrument`,
#: :func:`~inductionlab.core.instrument.ablate` and the CLI read this table.
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
    """Names of the registered ablation methods usable by :func:`~inductionlab.core.instrument.ablate`
    (a head list is enough); ``with_edges=True`` adds those that need knockout edges
    (:func:`~inductionlab.core.instrument.instrument` only)."""
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


def checked_intervention(iv: HeadIntervention, n_layers: int, n_heads: int) -> tuple[HeadIntervention, AblationMethod]:
    """``iv`` ready for the attention call, and its method's entry: its head as Python ints
    (:func:`check_head`), its knockout edges as a bool ``[Qe, Ke]`` tensor.

    Raises:
        InductionLabError: unknown method, head out of range or not an integer, a method that
            needs a value (``mean``) without one, or one that needs edges without them or with
            malformed ones.
    """
    m = ablation_method(iv.method)
    layer, head = check_head(iv.layer, iv.head, n_layers, n_heads)
    where = f"{iv.method} on head ({layer}, {head})"
    if m.needs == "value" and iv.value is None:
        raise InductionLabError(f"{where} needs the head's mean output; pass reference_ids to ablate()")
    if m.needs == "edges":
        if iv.edges is None:
            raise InductionLabError(f"{where} needs edges (a [Q, K] bool mask or (query, key) pairs)")
        iv = dataclasses.replace(iv, edges=_edges_tensor(iv.edges, where))
    return dataclasses.replace(iv, layer=layer, head=head), m
