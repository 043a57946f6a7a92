"""psifr-convention lag-CRP on hand-worked free-recall examples."""

from __future__ import annotations

import math

import numpy as np
import pytest

from inductionlab.core.ablation import Condition
from inductionlab.measures.crp import lag_crp, lag_crp_items, lag_probe_crp, prob_lag_crp
from inductionlab.errors import InductionLabError
from inductionlab.protocols.lag_probe import LagProbeConfig, LagProbeResult


def _by_lag(t):
    return {int(r.lag): (r.actual, r.possible, r.prob) for r in t.itertuples()}


def test_repeat_breaks_the_chain_hand_worked():
    # List of 6; recalls 6 2 3 6 1 4 (the second 6 is a repeat).
    #   6→2: lag −4; pool {1..5} from 6: lags −5 −4 −3 −2 −1
    #   2→3: lag +1; pool {1,3,4,5} from 2: −1 +1 +2 +3
    #   3→6: 6 already left the pool → skipped (3 leaves the pool)
    #   6→1: previous item is a repeat → skipped
    #   1→4: lag +3; pool {4,5} from 1: +3 +4
    t = _by_lag(lag_crp([[6, 2, 3, 6, 1, 4]], 6))
    assert set(t) == set(range(-5, 6))
    actual = {l: a for l, (a, _, _) in t.items() if a}
    possible = {l: p for l, (_, p, _) in t.items() if p}
    assert actual == {-4: 1, 1: 1, 3: 1}
    assert possible == {-5: 1, -4: 1, -3: 1, -2: 1, -1: 2, 1: 1, 2: 1, 3: 2, 4: 1}
    assert t[3][2] == 0.5 and t[-1][2] == 0.0 and t[1][2] == 1.0
    assert math.isnan(t[0][2]) and math.isnan(t[5][2])   # nothing possible


def test_intrusion_and_item_identities_hand_worked():
    # study a b c d; recall b X c d a (X an intrusion).
    #   b→X: b leaves the pool, X is not on the list → skipped
    #   X→c: previous is an intrusion → skipped
    #   c→d: lag +1; pool {a, d} from c(3): −2, +1
    #   d→a: lag −3; pool {a} from d(4): −3
    t = _by_lag(lag_crp_items([list("abcd")], [list("bXcda")]))
    assert {l: a for l, (a, _, _) in t.items() if a} == {1: 1, -3: 1}
    assert {l: p for l, (_, p, _) in t.items() if p} == {-2: 1, 1: 1, -3: 1}
    # the same recalls as serial positions, intrusion written as None / NaN / 0
    for intr in (None, float("nan"), 0):
        got = lag_crp([[2, intr, 3, 4, 1]], 4)
        assert list(got.actual) == [r[0] for _, r in sorted(t.items())]
        assert list(got.possible) == [r[1] for _, r in sorted(t.items())]


def test_recall_of_item_already_recalled_is_not_a_transition():
    # 1→2 (lag +1, possible +1 +2); 2→1: 1 already recalled → skipped; 1→3: previous is a repeat → skipped
    t = _by_lag(lag_crp([[1, 2, 1, 3]], 3))
    assert {l: a for l, (a, _, _) in t.items() if a} == {1: 1}
    assert {l: p for l, (_, p, _) in t.items() if p} == {1: 1, 2: 1}


def test_several_lists_add_counts():
    # list 1: 1→2→3 (L=3): actual +1,+1; possible {+1,+2} then {+1}
    # list 2: 3→1: actual −2; possible {−2, −1}
    t = _by_lag(lag_crp([[1, 2, 3], [3, 1]], 3))
    assert t[1] == (2, 2, 1.0)
    assert t[2] == (0, 1, 0.0)
    assert t[-2] == (1, 1, 1.0)
    assert t[-1] == (0, 1, 0.0)


def test_prob_crp_reduces_to_counts_for_one_hot_and_renormalises():
    # one-hot version of the psifr example's three counted transitions
    L = 6
    prev = np.array([6, 2, 1])
    curr = np.array([2, 3, 4])
    avail = np.array([[1, 1, 1, 1, 1, 0], [1, 0, 1, 1, 1, 0], [0, 0, 0, 1, 1, 0]], bool)
    probs = np.eye(L)[curr - 1]
    got = prob_lag_crp(prev, probs, avail)
    want = lag_crp([[6, 2, 3, 6, 1, 4]], L)
    assert np.allclose(got.actual, want.actual) and np.allclose(got.possible, want.possible)
    # L=3, previous item 2, raw p = (0.2, 0.5, 0.6); the previous item is not available:
    # renormalised over {1, 3}: 0.25 at lag −1, 0.75 at lag +1
    t = _by_lag(prob_lag_crp(np.array([2]), np.array([[0.2, 0.5, 0.6]]), np.array([[True, False, True]])))
    assert t[-1] == pytest.approx((0.25, 1, 0.25))
    assert t[1] == pytest.approx((0.75, 1, 0.75))


def test_lag_probe_crp_from_argmax_and_samples():
    # list of 5, cue at position 3: possible lags −2 −1 +1 +2.
    # arg-max lags: +1 +1 −1 (off-list) (lag 0 = repeat of the cue) +2 → 4 transitions
    cfg = LagProbeConfig(list_length=5, cue_position=3, n_permutations=6)
    c = Condition("intact", "intact")
    amax = np.array([1, 1, -1, np.nan, 0, 2], float)
    res = LagProbeResult({"intact": np.zeros((6, 5))}, {"intact": np.zeros(6)}, {"intact": amax}, [c], cfg)
    t = lag_probe_crp(res)
    assert list(t.lag) == [-2, -1, 1, 2]
    assert list(t.actual) == [0, 1, 2, 1]
    assert list(t.possible) == [4, 4, 4, 4]
    assert list(t.prob) == [0, 0.25, 0.5, 0.25]
    assert (t.n_transitions == 4).all() and (t.n_trials == 6).all()
    # sampled: one-hot on lag +2 (column 4), on lag −2 (column 0), and no list mass (intrusion)
    probs = np.zeros((3, 5))
    probs[0, 4] = 1.0
    probs[1, 0] = 1.0
    res = LagProbeResult({"intact": probs}, {"intact": probs.sum(1)}, {"intact": amax[:3]}, [c], cfg)
    t = lag_probe_crp(res, response="sample", seed=1)
    assert list(t.actual) == [1, 0, 0, 1] and list(t.possible) == [2, 2, 2, 2]


def test_bad_input():
    with pytest.raises(InductionLabError, match="outside a list of 4"):
        lag_crp([[1, 5]], 4)
    with pytest.raises(InductionLabError, match="at least 2"):
        lag_crp([[1]], 1)
    with pytest.raises(InductionLabError, match="different lengths"):
        lag_crp_items([[1, 2], [1, 2, 3]], [[1], [2]])
    with pytest.raises(InductionLabError, match="unknown response"):
        lag_probe_crp(None, response="mode")
