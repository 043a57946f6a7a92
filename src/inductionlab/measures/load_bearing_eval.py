"""Load-bearing test measures (SPEC §3, §8): relative drops with paired CIs, and how concentrated
the induction score is across heads. Small functions over arrays and tidy tables.

**Relative change (paired).** For a measure oriented so that larger is better (HITS@1, the ICL
benefit ``loss(early) − loss(late)``, the induction benefit ``loss(first copy) − loss(second
copy)``), measured per unit (prompt or sequence) on the intact model (``i_j``) and on the same
units with heads ablated (``a_j``)::

    r = mean(a) / mean(i) − 1                     (−0.226 is the papers' "−22.6%")

with a 95% CI from the delta method on the paired units: influence values
``d_j = (a_j − (mean(a)/mean(i))·i_j) / mean(i)``, ``se = sd(d) / √n``, ``r ± 1.96·se``. When
several random draws are ablated, each unit's ablated value is its mean over draws (pooled
random). The induction − random contrast ``(mean(a_ind) − mean(a_rand)) / mean(i)`` gets its CI
the same way. This is the relative ICL drop of the Bi-Induct paper (natural-only models:
−22.6% at 0.13B, −19.5% at 1B).

**Concentration** of the induction score over all heads: share of the total held by the top
2% of heads (``ceil(0.02 · n_heads)``, at least 1), the Gini coefficient (0 = equal, → 1 = one
head holds all; ``G = 2·Σ_i i·x_(i) / (n·Σx) − (n + 1)/n`` over ascending ``x_(i)``), and the
number of heads with score strictly above 0.1, 0.2, 0.4.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

from ..errors import InductionLabError
from .stats import Z95, ranked_kind

def _paired(intact, ablated) -> tuple[np.ndarray, np.ndarray]:
    i = np.asarray(intact, np.float64).reshape(-1)
    a = np.asarray(ablated, np.float64)
    if a.ndim == 2:               # [draws, units] -> per-unit mean over draws
        a = a.mean(0)
    if a.shape != i.shape:
        raise ValueError(f"intact has {i.size} units but ablated has {a.shape}; pair the same units")
    return i, a


def relative_change(intact, ablated) -> dict:
    """Paired relative change ``mean(ablated)/mean(intact) − 1`` with a delta-method 95% CI.

    Args:
        intact: ``[n]`` per-unit values on the intact model.
        ablated: ``[n]`` or ``[draws, n]`` (averaged over draws per unit), same units in order.

    Returns: ``{"n", "intact", "ablated", "relative", "ci_low", "ci_high", "headline"}``
    (``relative`` a fraction; NaN when mean(intact) is 0).
    """
    i, a = _paired(intact, ablated)
    mi, ma = i.mean(), a.mean()
    if mi == 0:
        r = lo = hi = float("nan")
    else:
        r = ma / mi - 1.0
        d = (a - (ma / mi) * i) / mi
        half = Z95 * d.std(ddof=1) / math.sqrt(len(d)) if len(d) > 1 else float("nan")
        lo, hi = r - half, r + half
    return {"n": int(i.size), "intact": float(mi), "ablated": float(ma), "relative": float(r),
            "ci_low": float(lo), "ci_high": float(hi), "headline": headline(r)}


def relative_contrast(intact, ablated_a, ablated_b) -> dict:
    """``(mean(a) − mean(b)) / mean(intact)`` (e.g. induction-ablated minus random-ablated, in
    units of the intact mean) with a paired delta-method 95% CI. Arrays as in :func:`relative_change`."""
    i, a = _paired(intact, ablated_a)
    _, b = _paired(intact, ablated_b)
    mi = i.mean()
    if mi == 0:
        return {"n": int(i.size), "contrast": float("nan"), "ci_low": float("nan"), "ci_high": float("nan")}
    c = (a.mean() - b.mean()) / mi
    d = (a - b - c * i) / mi
    half = Z95 * d.std(ddof=1) / math.sqrt(len(d)) if len(d) > 1 else float("nan")
    return {"n": int(i.size), "contrast": float(c), "ci_low": float(c - half), "ci_high": float(c + half)}


def absolute_change(intact, ablated, baseline=None) -> dict:
    """Paired absolute change ``mean(ablated − intact)`` (in the measure's units: nats, accuracy
    points as a fraction) with a 95% CI over units (normal approximation on the per-unit
    differences). With ``baseline`` (e.g. the random-ablated values), ``mean(ablated − baseline)``
    instead: the induction − random contrast. Arrays as in :func:`relative_change`.

    Returns: ``{"n", "absolute", "absolute_ci_low", "absolute_ci_high"}``. Well defined however
    small the intact mean is (the relative change divides by it)."""
    i, a = _paired(intact, ablated)
    b = i if baseline is None else _paired(intact, baseline)[1]
    d = a - b
    m = float(d.mean())
    half = Z95 * d.std(ddof=1) / math.sqrt(len(d)) if len(d) > 1 else float("nan")
    return {"n": int(d.size), "absolute": m, "absolute_ci_low": float(m - half), "absolute_ci_high": float(m + half)}


def headline(relative: float, digits: int = 1) -> str:
    """The papers' headline form: ``−0.226`` → ``"−22.6%"`` (Unicode minus), ``0.05`` → ``"+5.0%"``."""
    if relative is None or not np.isfinite(relative):
        return "n/a"
    pct = round(100.0 * relative, digits)
    sign = "−" if pct < 0 else "+"
    return f"{sign}{abs(pct):.{digits}f}%"


def drops_table(rows: pd.DataFrame, value: str = "value", unit: str = "unit") -> pd.DataFrame:
    """Relative change per ablation from a tidy table.

    Args:
        rows: one row per (condition, unit) with columns ``variant`` (e.g. ``per-layer-2pct``;
            ``intact`` for the intact model), ``kind`` (``intact`` | ``induction`` | ``random``; the ranked
            kind may be another ranking's label, :func:`~inductionlab.measures.stats.ranked_kind`, which then
            replaces ``induction`` in the output's kinds),
            ``draw`` (int), ``unit`` and the measure ``value``. Every condition must cover the
            intact units.

    Returns: DataFrame ``variant, kind, draw, n, intact, ablated, relative, ci_low, ci_high,
    headline, absolute, absolute_ci_low, absolute_ci_high`` (:func:`absolute_change`): one row per ablated condition, one ``draw == "pooled"`` row per variant's random
    draws (per-unit mean over draws), and one ``kind == "induction-random"`` row per variant
    with both (the contrast in units of the intact mean).

    Raises: ValueError when there is no intact condition or units do not match.
    """
    base = rows[rows["kind"] == "intact"].set_index(unit)[value].sort_index()
    if base.empty:
        raise ValueError("drops_table needs the intact condition's rows (kind == 'intact')")
    units = base.index
    out = []

    def vec(g: pd.DataFrame) -> np.ndarray:
        s = g.set_index(unit)[value]
        if set(s.index) != set(units) or len(s) != len(units):
            raise ValueError("an ablated condition does not cover exactly the intact units")
        return s.reindex(units).to_numpy(np.float64)

    arm = ranked_kind(rows["kind"].unique())
    for variant, gv in rows[rows["kind"] != "intact"].groupby("variant", sort=False):
        ind = gv[gv["kind"] == arm]
        rnd = {d: vec(g) for d, g in gv[gv["kind"] == "random"].groupby("draw")}
        for kind, g in ((arm, ind),):
            if len(g):
                out.append({"variant": variant, "kind": kind, "draw": str(g["draw"].iloc[0]),
                            **relative_change(base.to_numpy(), vec(g)), **absolute_change(base.to_numpy(), vec(g))})
        for d, v in rnd.items():
            out.append({"variant": variant, "kind": "random", "draw": str(d), **relative_change(base.to_numpy(), v),
                        **absolute_change(base.to_numpy(), v)})
        if rnd:
            pooled = np.stack(list(rnd.values()))
            out.append({"variant": variant, "kind": "random", "draw": "pooled",
                        **relative_change(base.to_numpy(), pooled), **absolute_change(base.to_numpy(), pooled)})
            if len(ind):
                c = relative_contrast(base.to_numpy(), vec(ind), pooled)
                out.append({"variant": variant, "kind": f"{arm}-random", "draw": "pooled", "n": c["n"],
                            "relative": c["contrast"], "ci_low": c["ci_low"], "ci_high": c["ci_high"],
                            "headline": headline(c["contrast"]),
                            **absolute_change(base.to_numpy(), vec(ind), pooled.mean(0))})
    return pd.DataFrame(out)


def score_concentration(scores, *, top_fraction: float = 0.02, thresholds: Sequence[float] = (0.1, 0.2, 0.4)) -> dict:
    """How concentrated a head score (e.g. induction) is across all heads.

    Args:
        scores: ``[n_layers, n_heads]`` non-negative scores.
        top_fraction: the top share is held by ``ceil(top_fraction · n)`` heads (at least 1).

    Returns: ``{"n_heads", "total", "max", "top_n", "top_share", "top_mean", "gini",
    "above": {threshold: count}, "strongest": [layer, head]}``.

    Raises: InductionLabError for negative scores or a fraction outside (0, 1].
    """
    s = np.asarray(scores, np.float64)
    x = s.reshape(-1)
    if not 0 < top_fraction <= 1:
        raise InductionLabError(f"top_fraction must be in (0, 1], got {top_fraction}")
    if x.size == 0 or np.any(x < 0):
        raise InductionLabError("score concentration needs a non-empty array of non-negative scores")
    n_top = max(1, math.ceil(top_fraction * x.size))
    top = np.sort(x)[::-1][:n_top]
    total = float(x.sum())
    strongest = np.unravel_index(int(np.argmax(s)), s.shape) if s.ndim == 2 else (int(np.argmax(x)),)
    return {"n_heads": int(x.size), "total": total, "max": float(x.max()), "top_n": n_top,
            "top_share": float(top.sum() / total) if total > 0 else 0.0, "top_mean": float(top.mean()),
            "gini": gini(x), "above": {float(t): int((x > t).sum()) for t in thresholds},
            "strongest": [int(v) for v in strongest]}


def gini(values) -> float:
    """Gini coefficient of non-negative values: ``2·Σ_i i·x_(i) / (n·Σx) − (n+1)/n`` (ascending,
    1-based i); 0 for all-equal or all-zero values."""
    x = np.sort(np.asarray(values, np.float64).reshape(-1))
    n, tot = x.size, x.sum()
    if n == 0 or tot == 0:
        return 0.0
    return float(2.0 * np.sum(np.arange(1, n + 1) * x) / (n * tot) - (n + 1) / n)


__all__ = ["relative_change", "relative_contrast", "absolute_change", "headline", "drops_table",
           "score_concentration", "gini"]
