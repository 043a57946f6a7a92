"""Overlap of two head rankings (SPEC §10): top-set overlap against the hypergeometric expectation and
tail, cross-percentiles, Spearman — on a 10-head table worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from inductionlab.errors import InductionLabError
from inductionlab.measures.overlap import (estimate_agreement, head_overlap, mean_percentile, percentiles, rank_correlation, top_count,
                                           top_overlap)

# 10 heads as 2 layers x 5. Head i (flat, layer-major) has score 9 - i in A, B_i in B.
A = np.arange(9, -1, -1, dtype=float).reshape(2, 5)
B = np.array([2, 9, 8, 0, 1, 3, 4, 5, 6, 7], dtype=float).reshape(2, 5)


def test_top_overlap_by_hand():
    # top 30 % = 3 heads: A's {0, 1, 2}, B's {1 (9), 2 (8), 9 (7)}: overlap {1, 2} = 2.
    # Hypergeometric, N = 10, n = 3 marked, 3 drawn: E = 3·3/10 = 0.9;
    # P(X >= 2) = [C(3,2)·C(7,1) + C(3,3)·C(7,0)] / C(10,3) = (21 + 1) / 120.
    got = top_overlap(A, B, 0.3)
    assert got["n_heads"] == 10 and got["n_top"] == 3 and got["overlap"] == 2
    assert got["expected"] == pytest.approx(0.9)
    assert got["p_value"] == pytest.approx(22 / 120)
    assert math.comb(3, 2) * math.comb(7, 1) + 1 == 22 and math.comb(10, 3) == 120
    # identical rankings: overlap 3, P(X >= 3) = 1/120; the reverse ranking: overlap 0, P(X >= 0) = 1
    assert top_overlap(A, A, 0.3)["p_value"] == pytest.approx(1 / 120)
    assert (top_overlap(A, -A, 0.3)["overlap"], top_overlap(A, -A, 0.3)["p_value"]) == (0, pytest.approx(1.0))
    # one head (5 % of 10 -> int(0.5) -> at least 1): A's head 0 vs B's head 1: 0 of 1, E = 1/10
    one = top_overlap(A, B)
    assert (one["n_top"], one["overlap"], one["expected"]) == (1, 0, pytest.approx(0.1))


def test_expectation_matches_independent_random_rankings():
    """Two independent random rankings of 100 heads, top 5 each, 4000 times: the mean overlap is the
    hypergeometric n·n/N = 0.25 (SE about 0.0075)."""
    rng = np.random.default_rng(0)
    xs = [top_overlap(rng.random((10, 10)), rng.random((10, 10)))["overlap"] for _ in range(4000)]
    assert top_overlap(rng.random((10, 10)), rng.random((10, 10)))["expected"] == 0.25
    assert np.mean(xs) == pytest.approx(0.25, abs=0.03)


def test_percentiles_and_mean_percentile_by_hand():
    # B's scores are 0..9, distinct: percentile = 100·(score + 1)/10
    assert percentiles(B).reshape(-1).tolist() == pytest.approx([30, 100, 90, 10, 20, 40, 50, 60, 70, 80])
    assert percentiles(np.array([[0.0, 0.0], [1.0, 1.0]])).tolist() == [[50, 50], [100, 100]]   # ties share the top
    # 20 % = 2 heads. A's top {0, 1} in B: (30 + 100)/2; B's top {1, 2} in A (scores 8, 7): (90 + 80)/2
    assert mean_percentile(A, B, 0.2) == pytest.approx(65.0)
    assert mean_percentile(B, A, 0.2) == pytest.approx(85.0)
    assert mean_percentile(A, B, 0.3) == pytest.approx((30 + 100 + 90) / 3)
    assert mean_percentile(A, B) == pytest.approx(30.0)                 # 2 % -> 1 head: head 0
    assert mean_percentile(A, A) == 100.0
    t = np.round(np.random.default_rng(1).random((6, 7)), 1)                # ties: scipy's "weak" percentile
    assert percentiles(t).reshape(-1).tolist() == pytest.approx(
        [stats.percentileofscore(t.reshape(-1), x, kind="weak") for x in t.reshape(-1)])


def test_rank_correlation_by_hand():
    # ranks (1..10): A's 10 - i, B's B_i + 1; d = 9 - i - B_i = 7,-1,-1,6,4,1,-1,-3,-5,-7; sum d² = 188
    rho, p = rank_correlation(A, B)
    assert rho == pytest.approx(1 - 6 * 188 / (10 * 99))
    assert 0 < p < 1
    assert rank_correlation(A, 2 * A + 1)[0] == pytest.approx(1.0)
    assert math.isnan(rank_correlation(A, np.ones_like(A))[0])         # a constant table


def test_head_overlap_row():
    row = head_overlap(A, B, ("induction", "fv"), top_fraction=0.3, percentile_fraction=0.2)
    assert row == {"a": "induction", "b": "fv", "n_heads": 10, "n_top": 3, "overlap": 2, "expected": pytest.approx(0.9),
                   "p_value": pytest.approx(22 / 120), "a_top_pct_in_b": pytest.approx(65.0),
                   "b_top_pct_in_a": pytest.approx(85.0), "spearman": pytest.approx(-138 / 990),
                   "spearman_p": pytest.approx(rank_correlation(A, B)[1])}


@pytest.mark.parametrize("call, match", [
    (lambda: top_overlap(A, B, 0.0), r"fraction=0.0 must be a number in \(0, 1\]"),
    (lambda: mean_percentile(A, B, 1.5), r"fraction=1.5 must be a number in \(0, 1\]"),
    (lambda: top_count(10, True), r"fraction=True"),
    (lambda: top_overlap(A, B.reshape(5, 2)), r"shapes \(2, 5\) and \(5, 2\)"),
    (lambda: rank_correlation(A[0], B[0]), r"shapes \(5,\) and \(5,\)"),
    (lambda: percentiles(np.full((2, 2), np.nan)), "NaN or inf"),
])
def test_overlap_errors(call, match):
    with pytest.raises(InductionLabError, match=match):
        call()


def test_estimate_agreement_by_hand():
    """Exact: heads 0..5 of a 2 x 3 table scored 6, 5, 4, 3, 2, 1 (flat order). The estimate swaps the exact top
    head (flat 0) to the bottom: top-2 exact {0, 1}, top-2 estimate {1, 2} -> recall 1/2; head 0 is the one miss,
    exact rank 1, estimate rank 6."""
    exact = np.array([[6.0, 5, 4], [3, 2, 1]])
    est = np.array([[0.0, 5, 4], [3, 2, 1]])
    r = estimate_agreement(est, exact, ks=(2, 0.5), n_misses=3)
    assert [x["recall"] for x in r["recall"]] == [0.5, 2 / 3]          # 50 % of 6 heads: k = 3, {0,1,2} vs {1,2,3}
    assert [x["label"] for x in r["recall"]] == ["2", "50%"]
    assert r["misses"] == [{"layer": 0, "head": 0, "exact_rank": 1, "estimate_rank": 6, "exact": 6.0, "estimate": 0.0}]
    assert r["spearman"] == pytest.approx(stats.spearmanr(est.ravel(), exact.ravel()).statistic)
    assert estimate_agreement(exact, exact)["misses"] == []
    with pytest.raises(InductionLabError, match="top k"):
        estimate_agreement(est, exact, ks=(0,))
    assert estimate_agreement(est, exact, ks=(10,))["recall"][0] == {"k": 6, "label": "6", "recall": 1.0}
