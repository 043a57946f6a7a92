"""Relative drops with paired CIs, the headline form, and score concentration on hand-worked values."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from inductionlab.errors import InductionLabError
from inductionlab.measures.load_bearing_eval import (drops_table, gini, headline, relative_change,
                                            relative_contrast, score_concentration)

Z = 1.959963984540054


def test_ci_by_hand():   # the evaluation pieces use stats.ci (one CI convention)
    from inductionlab.measures.stats import ci
    m, lo, hi = ci([1, 2, 3, 4])
    assert m == 2.5 and hi - m == pytest.approx(Z * math.sqrt(5 / 3) / 2)
    assert math.isnan(ci([1.0])[1])


def test_relative_change_by_hand():
    # intact all 1, ablated [.5, .7, .9, .7]: r = −0.3; d = a − 0.7 = [−.2, 0, .2, 0], sd = sqrt(.08/3)
    r = relative_change([1, 1, 1, 1], [0.5, 0.7, 0.9, 0.7])
    half = Z * math.sqrt(0.08 / 3) / 2
    assert r["relative"] == pytest.approx(-0.3)
    assert (r["ci_low"], r["ci_high"]) == pytest.approx((-0.3 - half, -0.3 + half))
    assert r["headline"] == "−30.0%" and r["n"] == 4


def test_relative_change_paired_uses_intact_variation():
    # ablated = 0.8 × intact exactly: r = −0.2 with zero-width CI (the pairing removes unit noise)
    i = np.array([2.0, 5.0, 1.0, 9.0])
    r = relative_change(i, 0.8 * i)
    assert r["relative"] == pytest.approx(-0.2) and r["ci_high"] - r["ci_low"] == pytest.approx(0, abs=1e-12)


def test_draws_are_averaged_per_unit_and_contrast():
    i = np.ones(4)
    draws = np.array([[1.0, 0.8, 1.0, 1.0], [1.0, 1.0, 0.8, 1.0]])    # per-unit mean [1, .9, .9, 1]
    r = relative_change(i, draws)
    assert r["relative"] == pytest.approx(-0.05)
    c = relative_contrast(i, [0.5, 0.7, 0.9, 0.7], draws)               # .7 − .95
    assert c["contrast"] == pytest.approx(-0.25)
    d = np.array([0.5, 0.7, 0.9, 0.7]) - np.array([1, 0.9, 0.9, 1]) + 0.25
    assert c["ci_high"] - c["contrast"] == pytest.approx(Z * d.std(ddof=1) / 2)


def test_headline_format():
    assert headline(-0.226) == "−22.6%" and headline(-0.0494) == "−4.9%"
    assert headline(0.05) == "+5.0%" and headline(float("nan")) == "n/a"


def test_drops_table():
    rows = []
    for u, v in enumerate([1.0, 1, 1, 1]):
        rows.append({"variant": "intact", "kind": "intact", "draw": 0, "unit": u, "value": v})
    for u, v in enumerate([0.5, 0.7, 0.9, 0.7]):
        rows.append({"variant": "per-layer-2pct", "kind": "induction", "draw": 0, "unit": u, "value": v})
    for d, vals in enumerate([[1.0, 0.8, 1.0, 1.0], [1.0, 1.0, 0.8, 1.0]]):
        for u, v in enumerate(vals):
            rows.append({"variant": "per-layer-2pct", "kind": "random", "draw": d, "unit": u, "value": v})
    t = drops_table(pd.DataFrame(rows).sample(frac=1, random_state=0))    # order must not matter
    got = {(r.kind, r.draw): r.relative for r in t.itertuples()}
    assert got == pytest.approx({("induction", "0"): -0.3, ("random", "0"): -0.05, ("random", "1"): -0.05,
                                 ("random", "pooled"): -0.05, ("induction-random", "pooled"): -0.25})
    with pytest.raises(ValueError, match="intact"):
        drops_table(pd.DataFrame(rows[4:]))


def test_gini_by_hand():
    assert gini([0, 0, 0, 1]) == pytest.approx(0.75)     # 2·4·1/(4·1) − 5/4
    assert gini([1, 1, 1, 1]) == 0 and gini([0, 0]) == 0
    assert gini([1, 2, 3]) == pytest.approx(2 * (1 + 4 + 9) / (3 * 6) - 4 / 3)


def test_score_concentration_by_hand():
    s = np.zeros((10, 10))
    s[3, 4], s[5, 0], s[0, 0] = 0.9, 0.5, 0.15
    s[9, :] = 0.05                                          # total 0.9 + 0.5 + 0.15 + 0.5 = 2.05
    c = score_concentration(s)
    assert c["top_n"] == 2 and c["top_share"] == pytest.approx(1.4 / 2.05)
    assert c["top_mean"] == pytest.approx(0.7) and c["max"] == 0.9 and c["strongest"] == [3, 4]
    assert c["above"] == {0.1: 3, 0.2: 2, 0.4: 2}
    assert c["gini"] == pytest.approx(gini(s))
    assert score_concentration(np.ones((2, 3)), top_fraction=0.5)["top_n"] == 3
    with pytest.raises(InductionLabError):
        score_concentration(-s)
