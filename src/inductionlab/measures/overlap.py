"""How two head rankings overlap (SPEC §10; Yin & Steinhardt 2025, arXiv 2502.14010, the
induction-vs-FV analysis of ``kayoyin/icl-heads`` ``notebooks/plots.ipynb``). Small functions over
two ``[n_layers, n_heads]`` score tables of one model (higher = more of the mechanism).

**Top sets.** A ranking's top fraction p of all N heads is its ``n = max(1, int(p·N))`` best heads
(the count of ``core.ablation.heads_for_fraction``), ties broken by (layer, head) order.

**Overlap against chance.** X = |top-n A ∩ top-n B|. If B's top set were n heads drawn at random,
X would be hypergeometric (population N, n marked heads, n draws): expectation ``n·n/N`` and tail
p-value ``P(X ≥ observed)`` = ``scipy.stats.hypergeom.sf(observed − 1, N, n, n)``.
E.g. N = 10, n = 3: E = 0.9; P(X ≥ 2) = (C(3,2)·C(7,1) + C(3,3)) / C(10,3) = 22/120.

**Percentile** of a head in a ranking: ``100 · #{heads j : s_j ≤ s_h} / N`` — 100 for the top head,
``100/N`` for a bottom head with a score of its own; tied heads share the higher value (scipy's
``percentileofscore(kind="weak")``). Yin's cross-percentile: the mean percentile in ranking B of
ranking A's top ``max(1, int(0.02·N))`` heads (about 50 for unrelated rankings, 100 when A's top
heads are B's top heads).

**Rank correlation**: Spearman's ρ over all N heads (``scipy.stats.spearmanr``; NaN when a table
is constant).

**An estimate against the exact score** (attribution patching against activation patching,
:func:`estimate_agreement`): ρ, the top-k recall ``|top-k exact ∩ top-k estimate| / k`` (k = 10 and
k = 5 % of the heads, as :func:`top_count`), and the largest misses: the exact top-k heads the estimate
ranks lowest, with both ranks (1 = the top).
"""

from __future__ import annotations

import warnings

import numpy as np
from scipy import stats

from ..errors import InductionLabError


def _tables(a, b) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.ndim != 2 or a.size == 0 or a.shape != b.shape:
        raise InductionLabError(f"score tables of shapes {a.shape} and {b.shape}: give two [n_layers, n_heads] "
                                "tables of one model")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise InductionLabError("a score table holds NaN or inf; recompute it (or drop those heads from both)")
    return a, b


def top_count(n_heads: int, fraction: float) -> int:
    """``max(1, int(fraction · n_heads))``. Raises InductionLabError: ``fraction`` outside (0, 1]."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float, np.integer, np.floating)) \
            or not 0 < fraction <= 1:
        raise InductionLabError(f"fraction={fraction!r} must be a number in (0, 1] (e.g. 0.05 for the top 5 %)")
    return max(1, int(fraction * n_heads))


def _top(scores: np.ndarray, n: int) -> np.ndarray:
    """Flat indices of the ``n`` best heads (ties by (layer, head) order)."""
    return np.argsort(-scores.reshape(-1), kind="stable")[:n]


def percentiles(scores) -> np.ndarray:
    """``[n_layers, n_heads]``: each head's percentile in its ranking, ``100 · #{j : s_j ≤ s_h} / N``
    (100 = the top head; ties share the higher value). Raises InductionLabError: not a finite 2-D table."""
    s, _ = _tables(scores, scores)
    flat = s.reshape(-1)
    return (100.0 * np.searchsorted(np.sort(flat), flat, side="right") / flat.size).reshape(s.shape)


def top_overlap(a, b, fraction: float = 0.05) -> dict:
    """|top-p A ∩ top-p B| against its hypergeometric expectation.

    Args:
        a, b: ``[n_layers, n_heads]`` score tables of one model.
        fraction: p, the top fraction of all N heads [0.05, Yin].

    Returns: ``{"n_heads": N, "n_top": n, "overlap": X, "expected": n·n/N, "p_value": P(X ≥ overlap)}``.

    Raises:
        InductionLabError: tables of different shapes or not finite, ``fraction`` outside (0, 1].
    """
    a, b = _tables(a, b)
    N = a.size
    n = top_count(N, fraction)
    x = len(set(_top(a, n).tolist()) & set(_top(b, n).tolist()))
    return {"n_heads": N, "n_top": n, "overlap": x, "expected": n * n / N,
            "p_value": float(stats.hypergeom.sf(x - 1, N, n, n))}


def mean_percentile(a, b, fraction: float = 0.02) -> float:
    """The mean percentile (:func:`percentiles`) in ranking ``b`` of ranking ``a``'s top
    ``max(1, int(fraction · N))`` heads [0.02, Yin]. Raises InductionLabError as :func:`top_overlap`."""
    a, b = _tables(a, b)
    return float(percentiles(b).reshape(-1)[_top(a, top_count(a.size, fraction))].mean())


def rank_correlation(a, b) -> tuple[float, float]:
    """Spearman's ρ of two tables over all heads and its two-sided p-value (NaN for a constant table).
    Raises InductionLabError as :func:`top_overlap`."""
    a, b = _tables(a, b)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.ConstantInputWarning)
        r = stats.spearmanr(a.reshape(-1), b.reshape(-1))
    return float(r.statistic), float(r.pvalue)


def head_overlap(a, b, names: tuple[str, str] = ("a", "b"), *, top_fraction: float = 0.05,
                 percentile_fraction: float = 0.02) -> dict:
    """One row of the overlap table of two rankings (e.g. ``names=("induction", "fv")``):
    ``a``, ``b`` (the names), the :func:`top_overlap` fields at ``top_fraction``, ``a_top_pct_in_b`` /
    ``b_top_pct_in_a`` (:func:`mean_percentile` at ``percentile_fraction``), ``spearman`` and
    ``spearman_p``. Raises InductionLabError as :func:`top_overlap`."""
    rho, p = rank_correlation(a, b)
    return {"a": names[0], "b": names[1], **top_overlap(a, b, top_fraction),
            "a_top_pct_in_b": mean_percentile(a, b, percentile_fraction),
            "b_top_pct_in_a": mean_percentile(b, a, percentile_fraction), "spearman": rho, "spearman_p": p}


def estimate_agreement(estimate, exact, *, ks=(10, 0.05), n_misses: int = 5) -> dict:
    """How well an estimated score table ranks the heads of an exact one (higher = more of the effect).

    Args:
        estimate, exact: ``[n_layers, n_heads]`` tables of one model (e.g. AtP's and the exact FV AIE).
        ks: top sizes: an int is a count of heads (at most N: a larger one is N), a float in (0, 1) a fraction of
            them (:func:`top_count`).
        n_misses: how many misses to list (of the largest k's top set).

    Returns: ``{"spearman": ρ, "recall": [{"k": k, "label": "10" or "5%", "recall": x}, ...],
    "misses": [{"layer", "head", "exact_rank", "estimate_rank", "exact", "estimate"}, ...]}``; ranks are 1-based
    (ties by (layer, head) order); misses are the top-k exact heads outside the estimate's top k, worst first.

    Raises: InductionLabError as :func:`top_overlap`, a k < 1."""
    est, ex = _tables(estimate, exact)
    N = ex.size
    rank_est = np.empty(N, dtype=int)
    rank_est[_top(est, N)] = np.arange(1, N + 1)
    rank_ex = np.empty(N, dtype=int)
    rank_ex[_top(ex, N)] = np.arange(1, N + 1)
    recall, k_max = [], 0
    for k in ks:
        frac = isinstance(k, float) and 0 < k < 1
        n = top_count(N, k) if frac else min(int(k), N)
        if n < 1:
            raise InductionLabError(f"top k = {k!r}: give a count >= 1 or a fraction in (0, 1)")
        hit = len(set(_top(ex, n).tolist()) & set(_top(est, n).tolist()))
        recall.append({"k": n, "label": f"{k:.0%}" if frac else str(n), "recall": hit / n})
        k_max = max(k_max, n)
    H = ex.shape[1]
    top = [int(i) for i in _top(ex, k_max) if rank_est[i] > k_max]
    top.sort(key=lambda i: (-rank_est[i], i))
    misses = [{"layer": i // H, "head": i % H, "exact_rank": int(rank_ex[i]), "estimate_rank": int(rank_est[i]),
               "exact": float(ex.flat[i]), "estimate": float(est.flat[i])} for i in top[:n_misses]]
    return {"spearman": rank_correlation(est, ex)[0], "recall": recall, "misses": misses}
