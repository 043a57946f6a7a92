"""CIs, the x / x_ci_low / x_ci_high columns, pooling of random draws, paired contrasts — hand-worked."""

from __future__ import annotations

import math

import numpy as np
import pytest

from inductionlab.core.ablation import Condition
from inductionlab.measures.stats import (Z95, arm_values, ci, draws_by_k, drop_table, mean_ci, paired_by_k,
                                        paired_diff, pooled, pooled_arms, put_ci)


def test_mean_ci_hand_worked():
    # [1, 2, 3]: mean 2, sd (ddof 1) 1, half-width 1.96 / √3
    m, half = mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0 and half == pytest.approx(Z95 / math.sqrt(3))
    assert Z95 == pytest.approx(1.959964, abs=1e-6)
    # per column over axis 0; a constant column has a zero-width CI
    m, half = mean_ci(np.array([[0.0, 5.0], [2.0, 5.0]]))
    assert m.tolist() == [1.0, 5.0] and half[1] == 0.0 and half[0] == pytest.approx(Z95)   # sd √2, n 2
    m, half = mean_ci([4.0])                     # one trial: no CI
    assert m == 4.0 and math.isnan(half)


def test_put_ci_and_ci_columns():
    row = put_ci({"condition": "intact"}, "lag_plus1", [0.1, 0.3])
    # mean 0.2, sd 0.1414, half 1.96 · 0.1414 / √2 = 0.196
    assert row["lag_plus1"] == pytest.approx(0.2)
    assert row["lag_plus1_ci_low"] == pytest.approx(0.2 - Z95 * 0.1)
    assert row["lag_plus1_ci_high"] == pytest.approx(0.2 + Z95 * 0.1)
    assert ci([0.1, 0.3]) == pytest.approx((0.2, 0.2 - Z95 * 0.1, 0.2 + Z95 * 0.1))


def test_paired_diff_uses_trial_pairs():
    a, b = np.array([0.5, 0.7, 0.9]), np.array([0.4, 0.6, 0.8])   # every trial differs by exactly 0.1
    m, lo, hi = paired_diff(a, b)
    assert m == pytest.approx(0.1) and lo == pytest.approx(0.1) and hi == pytest.approx(0.1)  # unpaired would be wide


def test_pooling_of_random_draws():
    conds = [Condition("intact", "intact"), Condition("random-5-d0", "random", 5, 0), Condition("random-2-d0", "random", 2, 0),
             Condition("random-5-d1", "random", 5, 1), Condition("induction-2", "induction", 2)]
    assert draws_by_k(conds) == {2: ["random-2-d0"], 5: ["random-5-d0", "random-5-d1"]}
    assert list(draws_by_k(conds)) == [2, 5]                      # sorted by k
    assert draws_by_k(conds, "induction") == {2: ["induction-2"]}
    table = {"random-5-d0": np.array([0.0, 1.0]), "random-5-d1": np.array([1.0, 3.0])}
    assert pooled(table, ["random-5-d0", "random-5-d1"]).tolist() == [0.5, 2.0]   # per-trial mean over draws
    arms = pooled_arms(conds)
    assert [a[0] for a in arms] == ["intact", "random-5-d0", "random-2-d0", "random-5-d1", "induction-2",
                                    "random-2", "random-5"]
    assert arms[-1] == ("random-5", "random", 5, "mean of 2", ["random-5-d0", "random-5-d1"])
    assert pooled_arms(conds, draw="pooled")[-1][3] == "pooled"


def test_arm_values_and_paired_by_k():
    conds = [Condition("intact", "intact"), Condition("induction-5", "induction", 5), Condition("random-5-d0", "random", 5, 0),
             Condition("random-5-d1", "random", 5, 1), Condition("induction-2", "induction", 2)]   # k = 2: no random draw
    table = {"intact": np.array([9.0, 9.0]), "induction-5": np.array([1.0, 1.0]),
             "random-5-d0": np.array([0.0, 2.0]), "random-5-d1": np.array([2.0, 6.0]), "induction-2": np.array([7.0, 7.0])}
    calls = []

    def values(name):
        calls.append(name)
        return table[name]
    arms = arm_values(conds, values)
    assert [key for key, _ in arms] == [("intact", "intact", 0, "0"), ("induction-5", "induction", 5, "0"),
                                        ("random-5-d0", "random", 5, "0"), ("random-5-d1", "random", 5, "1"),
                                        ("induction-2", "induction", 2, "0"), ("random-5", "random", 5, "mean of 2")]
    assert arms[0][1] is table["intact"] and arms[-1][1].tolist() == [1.0, 4.0]     # per-trial mean over the draws
    assert sorted(calls) == sorted(table)                                             # each condition computed once
    (k, ind, rnd), = paired_by_k(conds, table)                                        # only k = 5 has both arms
    assert k == 5 and ind.tolist() == [1.0, 1.0] and rnd.tolist() == [1.0, 4.0]


def test_drop_table_pools_the_draws_and_pairs_each_arm_with_intact():
    """Three trials; intact x = [1, 2, 3]; induction-1 x = [0, 0, 3] (drop per trial [1, 2, 0]: mean 1, sd 1);
    the two random draws of 1 head [1, 2, 2] and [1, 1, 3] pool to [1, 1.5, 2.5] (drop [0, 0.5, 0.5]). The measure
    y is not measured (NaN) under the random draws: their row is left out."""
    conds = [Condition("intact", "intact"), Condition("induction-1", "induction", 1, heads=[(0, 0)]),
             Condition("random-all-1-d0", "random", 1, 0, heads=[(0, 1)]),
             Condition("random-all-1-d1", "random", 1, 1, heads=[(0, 2)])]
    nan = np.full(3, np.nan)
    vals = {"intact": {"x": np.array([1.0, 2, 3]), "y": np.array([1.0, 1, 1])},
            "induction-1": {"x": np.array([0.0, 0, 3]), "y": np.array([0.5, 0.5, 0.5])},
            "random-all-1-d0": {"x": np.array([1.0, 2, 2]), "y": nan}, "random-all-1-d1": {"x": np.array([1.0, 1, 3]), "y": nan}}
    t = drop_table(conds, vals.__getitem__, {1: 0.25})
    assert [(r.arm, r.kind, r.k, r.fraction, r.measure) for r in t.itertuples()] == [
        ("induction-1", "induction", 1, 0.25, "x"), ("induction-1", "induction", 1, 0.25, "y"),
        ("random-all-1", "random", 1, 0.25, "x")]
    ind = t.iloc[0]
    assert ind.value == 1.0 and ind.intact == 2.0 and ind.relative_drop == 0.5
    assert ind["drop"] == 1.0 and ind.drop_ci_high - 1.0 == pytest.approx(Z95 / math.sqrt(3))      # sd of [1, 2, 0]: 1
    rnd = t.iloc[2]
    assert rnd.value == pytest.approx(5 / 3) and rnd["drop"] == pytest.approx(1 / 3)
    assert rnd.drop_ci_low == pytest.approx(1 / 3 - Z95 * math.sqrt(1 / 12) / math.sqrt(3))   # sd of [0, .5, .5]
    assert "fraction" not in drop_table(conds, vals.__getitem__).columns
