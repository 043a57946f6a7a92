"""The ablation methods (SPEC §2): add a method here: one function and one entry.

:data:`ABLATION_METHODS` maps a name to an :class:`AblationMethod`, which is either a **mask
edit** (``cut``: which query→key edges of one query head to mask before the softmax) or an
**output edit** (``replace``: the head's new output, the input of ``o_proj``). The attention
call (:mod:`inductionlab.core.attention`) applies every cut in its first step and every replace
in its third; :func:`~inductionlab.core.instrument.ablate`, the configs and the CLI read the
table (:func:`ablation_methods`), and the name with what it needs stands in
:data:`inductionlab.names.ABLATION_METHOD_NEEDS` (checked at import).

Positions are absolute (0 = each sequence's first real token; see :class:`Positions`). An output
edit applies at every query position, or only at chosen ones (``HeadIntervention.positions``: the
last query of each forward call, named absolute positions, positions counted from the end) and in
chosen batch rows (``rows``): activation patching at a position, as in Todd et al. 2024 (the last
position) and Feucht et al. 2025 (position −2). This module needs torch only, not transformers.
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
            ``patch`` / ``resample``: the head's output replaced by ``value``, its output in a source
            run (another prompt's, or random tokens').
        value: the head's new output: ``[head_dim]`` (every selected query); ``[R, head_dim]`` (one
            per row, R = the rows edited: ``rows``, else the batch); ``[R, P, head_dim]`` (per row, the
            p-th selected query of the row taking ``value[r, p]``, queries in position order).
        edges: for ``knockout``: bool tensor ``[Q, K]`` (True = knock out) or a list of
            ``(query, key)`` pairs, both indexed by absolute positions.
        positions: the query positions an output edit applies at: ``"all"``; ``"last"`` (the last
            query of each forward call: a prompt's last token, and under KV-cached generation every
            generated token — Yin & Steinhardt 2025's accuracy ablation); or a sequence of ints, absolute
            positions (0 = the first real token), negative ones counted from the call's end (``-1`` is
            ``"last"``, ``-2`` the query before it). Mask edits (``sink``, ``knockout``) apply at every query.
        rows: the batch rows edited (None: every row), e.g. one head per row in a batched patching sweep.
    """
    layer: int
    head: int
    method: str = DEFAULT_METHOD
    value: torch.Tensor | None = None
    edges: object = None
    positions: object = "all"
    rows: tuple[int, ...] | None = None


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
        replace: output edit, ``replace(intervention, out, where) -> [B, Q, head_dim]``: the head's new
            output given its output ``out`` ``[B, Q, head_dim]`` and the queries edited, ``where``
            ``[B, Q]`` bool (:func:`selected`); only those queries take the new output.
        needs: ``"value"`` (a ``[head_dim]`` tensor: :func:`~inductionlab.core.instrument.ablate` fills
            it with the head's mean over ``reference_ids``), ``"source"`` / ``"random"`` (the head's
            outputs in a source run: ``ablate(source_ids=...)``; the protocol runner draws random tokens
            for ``"random"``), ``"edges"`` (knockout edges: only through
            :func:`~inductionlab.core.instrument.instrument`) or None.
        zero_pattern: the ablated head's attention probabilities read as 0 (zero ablation).
    """
    name: str
    description: str
    cut: Callable[[HeadIntervention, Positions], torch.Tensor] | None = None
    replace: Callable[[HeadIntervention, torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    needs: str | None = None
    zero_pattern: bool = False

    def __post_init__(self):
        if (self.cut is None) == (self.replace is None):
            raise ValueError(f"ablation method {self.name!r}: give exactly one of cut (mask edit) or replace (output edit)")
        if self.needs not in (None, "value", "source", "random", "edges"):
            raise ValueError(f"ablation method {self.name!r}: needs must be None, 'value', 'source', 'random' or "
                             "'edges'")


def query_mask(positions, pos: Positions) -> torch.Tensor | None:
    """The queries of one attention call that ``positions`` names (:attr:`HeadIntervention.positions`; a
    LongTensor ``[B, P]`` names absolute positions per row, ``-1`` none): bool ``[B, Q]``, or None for
    ``"all"``. Padding queries are never named."""
    B, Q = pos.query.shape
    dev = pos.query.device
    if isinstance(positions, str):
        if positions == "all":
            return None
        sel = torch.zeros(B, Q, dtype=torch.bool, device=dev)            # "last": the call's last query slot
        sel[:, -1] = True
        return sel & (pos.query >= 0)
    p = torch.as_tensor(positions, dtype=torch.long, device=dev)
    if p.dim() == 2:                                                     # per row: absolute positions
        return (pos.query[:, :, None] == p[:, None, :]).any(-1) & (pos.query >= 0)
    sel = torch.isin(pos.query, p[p >= 0]) & (pos.query >= 0)
    from_end = p[p < 0] + Q                                              # -1: the call's last query slot
    slots = from_end[(from_end >= 0) & (from_end < Q)]
    if slots.numel():
        sel[:, slots] = True
        sel &= pos.query >= 0
    return sel


def selected(iv: HeadIntervention, pos: Positions) -> torch.Tensor | None:
    """The queries an output edit of ``iv`` applies to in one attention call: bool ``[B, Q]``, or None
    for every query of every row (``positions="all"``, all rows: the edit covers the whole slice).

    Raises:
        InductionLabError: a row outside the batch."""
    sel = query_mask(iv.positions, pos)
    B, Q = pos.query.shape
    if iv.rows is not None:
        if max(iv.rows, default=-1) >= B:
            raise InductionLabError(f"{iv.method} on head ({iv.layer}, {iv.head}): rows {list(iv.rows)} outside the "
                                    f"batch of {B}")
        keep = torch.zeros(B, dtype=torch.bool, device=pos.query.device)
        keep[list(iv.rows)] = True
        sel = keep[:, None].expand(B, Q) if sel is None else sel & keep[:, None]
    return sel


def _zero_output(iv: HeadIntervention, out: torch.Tensor, where) -> torch.Tensor:
    return torch.zeros_like(out)


def _value_output(iv: HeadIntervention, out: torch.Tensor, where) -> torch.Tensor:
    """``value`` written at the selected queries (shapes: :class:`HeadIntervention`)."""
    v = iv.value.to(out.device, out.dtype)
    if v.dim() == 1:
        return v.expand_as(out)
    B, Q, D = out.shape
    rows = list(iv.rows) if iv.rows is not None else list(range(B))
    if v.shape[0] != len(rows):
        raise InductionLabError(f"{iv.method} on head ({iv.layer}, {iv.head}): value has {v.shape[0]} rows but "
                                f"{len(rows)} rows are edited")
    new = out.clone()
    for r, row in enumerate(rows):
        slots = torch.arange(Q, device=out.device) if where is None else where[row].nonzero().flatten()
        if v.dim() == 2:
            new[row, slots] = v[r]
        elif v.shape[1] == len(slots):
            new[row, slots] = v[r]
        else:
            raise InductionLabError(f"{iv.method} on head ({iv.layer}, {iv.head}): value has {v.shape[1]} "
                                    f"positions for row {row} but {len(slots)} queries are selected there")
    return new


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
                   replace=_value_output, needs="value"),
    AblationMethod("sink", "every key but the first real token masked before the softmax", cut=_sink_cut),
    AblationMethod("resample", "head output set to its output on random tokens, position by position (Yin & "
                               "Steinhardt 2025's token-loss ablation, at the query head)",
                   replace=_value_output, needs="random"),
    AblationMethod("patch", "head output set to its output in a source run of another prompt (activation "
                            "patching, Todd et al. 2024; Feucht et al. 2025)", replace=_value_output, needs="source"),
    AblationMethod("knockout", "named query→key edges masked before the softmax (Wang et al. 2022)",
                   cut=_knockout_cut, needs="edges"),
)}
check_registry("ablation method", ABLATION_METHODS, ABLATION_METHOD_NEEDS)
assert all(m.needs == ABLATION_METHOD_NEEDS[n] for n, m in ABLATION_METHODS.items()), "names.ABLATION_METHOD_NEEDS disagrees"
METHODS = tuple(ABLATION_METHODS)  # the built-in names (kept for callers of 0.x); read ABLATION_METHODS


def ablation_methods(*, with_edges: bool = False) -> tuple[str, ...]:
    """Names of the registered ablation methods every protocol can run from a head list
    (:func:`~inductionlab.core.instrument.ablate`; ``resample`` draws its random tokens per batch);
    ``with_edges=True`` adds those that need knockout edges (:func:`~inductionlab.core.instrument.instrument`
    only) or a protocol's own source run (``patch``)."""
    return tuple(n for n, m in ABLATION_METHODS.items() if with_edges or m.needs not in ("edges", "source"))


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


def check_positions(positions, where: str):
    """``positions`` (:attr:`HeadIntervention.positions`) as ``"all"``, ``"last"``, a tuple of ints or a
    LongTensor ``[B, P]`` (absolute positions per row, ``-1`` none).

    Raises:
        InductionLabError: another string, a non-integer, an empty list, a tensor of another shape."""
    if isinstance(positions, str):
        if positions not in ("all", "last"):
            raise InductionLabError(f"{where}: positions {positions!r}: use 'all', 'last' or a list of positions "
                                    "(negative: from the end, -1 = last)")
        return positions
    if isinstance(positions, torch.Tensor) and positions.dim() == 2:
        if positions.is_floating_point() or positions.dtype == torch.bool:
            raise InductionLabError(f"{where}: per-row positions must be an integer tensor [B, P]")
        return positions.long()
    try:
        positions = tuple(int(p) for p in positions)
    except (TypeError, ValueError):
        raise InductionLabError(f"{where}: positions must be 'all', 'last' or integers, got {positions!r}") from None
    if not positions:
        raise InductionLabError(f"{where}: positions is empty, so nothing would change; give at least one")
    return positions


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
    if m.needs in ("source", "random") and iv.value is None:
        raise InductionLabError(f"{where} needs the head's output in a source run; pass source_ids to ablate()")
    positions = check_positions(iv.positions, where)
    if not (isinstance(positions, str) and positions == "all") and m.replace is None:
        raise InductionLabError(f"{where}: {iv.method} edits the attention pattern at every query; positions apply "
                                "to output edits (zero, mean, resample, patch)")
    rows = None if iv.rows is None else tuple(int(r) for r in iv.rows)
    if rows is not None and (not rows or min(rows) < 0):
        raise InductionLabError(f"{where}: rows {iv.rows!r} must be batch indices >= 0 (None: every row)")
    iv = dataclasses.replace(iv, positions=positions, rows=rows)
    if m.needs == "edges":
        if iv.edges is None:
            raise InductionLabError(f"{where} needs edges (a [Q, K] bool mask or (query, key) pairs)")
        iv = dataclasses.replace(iv, edges=_edges_tensor(iv.edges, where))
    return dataclasses.replace(iv, layer=layer, head=head), m
