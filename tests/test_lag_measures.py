"""The lag probe's measures over per-trial arrays (measures/lag.py), hand-worked: curve, headline,
contrasts, and the one word-prior correction for one cue and for several."""

from __future__ import annotations

import numpy as np
import pytest

from inductionlab.core.ablation import Condition
from inductionlab.measures import lag as M

CONDS = [Condition("intact", "intact"), Condition("induction-1", "induction", 1),
         Condition("random-1-d0", "random", 1, 0), Condition("random-1-d1", "random", 1, 1)]
#                  lag:  −1    0    +1   +2      (cue at list position 2 of 4)
PROBS = {"intact":      np.array([[0.1, 0.0, 0.6, 0.1], [0.1, 0.0, 0.4, 0.1]], np.float32),
         "induction-1": np.array([[0.2, 0.0, 0.1, 0.1], [0.2, 0.0, 0.1, 0.1]], np.float32),
         "random-1-d0": np.array([[0.1, 0.0, 0.5, 0.1], [0.1, 0.0, 0.3, 0.1]], np.float32),
         "random-1-d1": np.array([[0.1, 0.0, 0.3, 0.1], [0.1, 0.0, 0.5, 0.1]], np.float32)}
MASS = {n: p.sum(1, dtype=np.float64) for n, p in PROBS.items()}


def test_lags_and_columns():
    assert M.lags_of(4, 2).tolist() == [-1, 0, 1, 2] and M.column(1, 2) == 2 and M.column(-1, 2) == 0


def test_headline_curve_and_contrast_by_hand():
    hl = M.headline_table(CONDS, PROBS, MASS, 2).set_index("condition")
    assert hl.loc["intact", "lag_plus1"] == pytest.approx(0.5) and hl.loc["induction-1", "lag_minus1"] == pytest.approx(0.2)
    assert hl.loc["random-1", "draw"] == "mean of 2" and hl.loc["random-1", "lag_plus1"] == pytest.approx(0.4)
    assert hl.loc["random-1", "lag_plus1_ci_low"] == pytest.approx(0.4)    # both trials pool to 0.4: no spread
    assert "lag_plus1_log_enrichment" not in hl
    curve = M.curve_table(M.curve_arms(CONDS, PROBS), M.lags_of(4, 2))
    pooled = curve[curve.condition == "random-1"].set_index("lag")
    assert set(pooled.draw) == {M.CURVE_POOLED_DRAW} and pooled.loc[1, "mean"] == pytest.approx(0.4)
    assert pooled.loc[1, "mean_renorm"] == pytest.approx(np.mean([0.4 / 0.6, 0.4 / 0.6]))
    (row,) = M.contrast_table(CONDS, PROBS, 1, 2).to_dict("records")
    assert row["k"] == 1 and row["random_minus_induction"] == pytest.approx(0.3) and row["ci_low"] == pytest.approx(0.3)


def test_one_log_enrichment_for_one_cue_and_for_several():
    rng = np.random.default_rng(0)
    n, L, far = 6, 9, 2
    ids = np.stack([rng.permutation(L) + 50 for _ in range(n)])
    p = rng.random((n, 3, L))
    cues = np.array([2, 5, 9])
    lags = np.arange(1, L + 1)[None, :] - cues[:, None]
    base = np.exp(M.log_baseline(p, ids, lags, far))
    for t, j in ((0, 0), (3, 4), (5, 8)):                                  # brute force: far triples of the word
        w = ids[t, j]
        far_vals = [p[a, c, b] for a in range(n) for c in range(3) for b in range(L)
                    if ids[a, b] == w and abs(lags[c, b]) > far]
        assert base[t, j] == pytest.approx(np.mean(far_vals))
    one = M.log_enrichment(p[:, 1], ids, lags[1], far)                      # the seed cue: the same function
    assert np.allclose(one, np.log(p[:, 1]) - M.log_baseline(p[:, 1:2], ids, lags[1:2], far), atol=0)
    with pytest.raises(ValueError):
        M.log_baseline(p, ids[:, :5], lags, far)
