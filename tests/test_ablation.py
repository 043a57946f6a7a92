"""Rankings and ablation conditions: top-k, per-layer top-p%, random and per-layer matched random
heads, and the checks on k, ks, draws and head addresses."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from inductionlab.core.ablation import (ablation_conditions, default_exclude_top_n, matched_random_heads,
                                   per_layer_top_p, random_heads, top_k_heads)
from inductionlab.errors import InductionLabError

SC = np.array([[0.1, 0.9, 0.3], [0.8, 0.2, 0.7], [0.0, 0.5, 0.6]])


def test_top_k_and_per_layer_top_p():
    assert top_k_heads(SC, 3) == [(0, 1), (1, 0), (1, 2)]
    assert per_layer_top_p(SC, 0.02) == [(0, 1), (1, 0), (2, 2)]      # ceil(0.06) = 1 per layer
    assert per_layer_top_p(SC, 0.5) == [(0, 1), (0, 2), (1, 0), (1, 2), (2, 2), (2, 1)]  # ceil(1.5) = 2
    with pytest.raises(InductionLabError, match="k=10"):
        top_k_heads(SC, 10)
    with pytest.raises(InductionLabError, match="NaN"):
        top_k_heads(np.full((2, 3), np.nan), 1)                # scores of empty sequences
    with pytest.raises(InductionLabError, match=r"p=nan"):
        per_layer_top_p(SC, float("nan"))


def test_random_heads_exclusion_seed_and_draws():
    excl = top_k_heads(SC, 4)
    draws = [random_heads(SC.shape, 3, excl, seed=s) for s in range(20)]
    assert all(not set(d) & set(excl) and len(set(d)) == 3 for d in draws)
    assert random_heads(SC.shape, 3, excl, seed=3) == draws[3]
    assert len({tuple(d) for d in draws}) > 1
    with pytest.raises(InductionLabError, match="only 5 remain"):
        random_heads(SC.shape, 6, excl)
    with pytest.raises(InductionLabError, match=r"head \(3, 0\) out of range: the model has 3 layers \(0-2\)"):
        random_heads(SC.shape, 1, [(3, 0)])


def test_ablation_conditions():
    conds = ablation_conditions(SC, [2], n_draws=3, exclude_top_n=4, seed=0)
    assert [c.name for c in conds] == ["intact", "induction-2", "random-2-d0", "random-2-d1", "random-2-d2"]
    assert conds[1].heads == [(0, 1), (1, 0)]
    assert default_exclude_top_n(270) == 135 and default_exclude_top_n(2000) == 300
    with pytest.raises(InductionLabError):
        ablation_conditions(SC, [6], exclude_top_n=4)


@pytest.mark.parametrize("kw, match", [
    (dict(ks=[0]), "k=0 must be an integer >= 1"),                 # would ablate nothing
    (dict(ks=[2, 2]), "ks lists k=2 more than once"),              # would pool one random draw twice
    (dict(ks=[1.5]), "k=1.5 must be an integer"),
    (dict(ks=[]), "ks is empty"),
    (dict(ks=[1], n_draws=-1), "n_draws=-1 must be an integer >= 0"),
    (dict(ks=[1], exclude_top_n=10), "exclude_top_n=10 must be between 0 and the model's 9 heads"),
])
def test_ablation_conditions_refuse_bad_ks_and_draws(kw, match):
    with pytest.raises(InductionLabError, match=match):
        ablation_conditions(SC, **kw)


G = np.arange(4 * 6, dtype=float).reshape(4, 6)          # 4 layers x 6 heads


def test_matched_random_heads_match_per_layer_counts_and_respect_exclusions():
    chosen = [(0, 5), (0, 4), (2, 1), (3, 0), (3, 1), (3, 2)]
    exclude = [(0, 0), (2, 3), (1, 2)]
    for draw in range(10):
        got = matched_random_heads(G.shape, chosen, exclude=exclude, seed=7, draw=draw)
        assert Counter(l for l, _ in got) == Counter(l for l, _ in chosen)   # same number per layer
        assert not set(got) & (set(chosen) | set(exclude)) and len(set(got)) == len(got)
        assert got == sorted(got)
    # the per-layer top-p% selection and its matched control
    top = per_layer_top_p(G, 0.34)                                            # 3 per layer
    ctrl = matched_random_heads(G.shape, top, seed=0)
    assert Counter(l for l, _ in ctrl) == {0: 3, 1: 3, 2: 3, 3: 3} and not set(ctrl) & set(top)


def test_matched_random_heads_seeded_and_draws_differ():
    chosen = [(0, 1), (1, 1), (2, 1), (3, 1)]
    a = matched_random_heads(G.shape, chosen, seed=1, draw=0)
    assert a == matched_random_heads(G.shape, chosen, seed=1, draw=0)
    draws = {tuple(matched_random_heads(G.shape, chosen, seed=1, draw=d)) for d in range(8)}
    assert len(draws) == 8                                                  # 5^4 possible sets
    assert matched_random_heads(G.shape, chosen, seed=2, draw=0) != a


@pytest.mark.parametrize("chosen, exclude, match", [
    ([(0, 0), (0, 1), (0, 2), (0, 3)], [(0, 4)], r"layer 0: 4 matched random heads needed but only 1 of 6 remain"),
    ([(4, 0)], [], r"head \(4, 0\) out of range: the model has 4 layers \(0-3\) x 6 query heads \(0-5\)"),
    ([(0, 6)], [], r"out of range"),
    ([(0, 1.5)], [], r"head must be an integer in 0-5"),
    ([(0, 1), (0, 1)], [], "lists a head twice"),
    ([(0, 1)], [(0, -1)], r"out of range"),
])
def test_matched_random_heads_errors(chosen, exclude, match):
    with pytest.raises(InductionLabError, match=match):
        matched_random_heads(G.shape, chosen, exclude=exclude)


def _boundary_pair(shape=(6, 8), N=24, seed=3):
    """A score table and a copy moved by ±1e-3 so that exactly one head crosses the top-N boundary:
    ``(a, b, x, y)``, x entering b's top N and y leaving it."""
    a = np.random.default_rng(seed).permutation(np.arange(shape[0] * shape[1])).reshape(shape) / 100.0
    flat = np.argsort(-a.reshape(-1), kind="stable")
    inside, outside = divmod(int(flat[N - 1]), shape[1]), divmod(int(flat[N]), shape[1])
    a[outside] = a[inside] - 5e-4                      # the first head outside, just below the last inside
    b = a.copy()
    b[outside] += 1e-3                                 # ... now just above it
    b[inside] -= 1e-3
    assert set(top_k_heads(a, N)) ^ set(top_k_heads(b, N)) == {inside, outside}
    return a, b, outside, inside


def test_random_draws_stable_when_one_head_crosses_the_exclusion_boundary():
    a, b, x, y = _boundary_pair()
    ea, eb = top_k_heads(a, 24), top_k_heads(b, 24)       # x in eb only, y in ea only
    changed = 0
    for k in (1, 3, 5, 10, 20, 24):
        for s in range(50):
            da, db = random_heads(a.shape, k, ea, seed=s), random_heads(a.shape, k, eb, seed=s)
            if x not in da and y not in db:               # neither crossing head is drawn: the same heads
                assert da == db, (k, s)
            else:                                         # one head swapped, and a crossing head is in it
                diff = set(da) ^ set(db)
                assert len(diff) == 2 and diff & {x, y}, (k, s, diff)
                changed += 1
    assert 0 < changed < 6 * 50                           # the crossing heads were drawn in some draws only
    # through ablation_conditions (the main job's draws): names and heads agree outside the crossing heads
    for ca, cb in zip(ablation_conditions(a, [2, 5, 10], n_draws=4, exclude_top_n=24, seed=0),
                      ablation_conditions(b, [2, 5, 10], n_draws=4, exclude_top_n=24, seed=0)):
        assert ca.name == cb.name
        if ca.kind == "random" and not {x, y} & (set(ca.heads) | set(cb.heads)):
            assert ca.heads == cb.heads


def test_matched_random_heads_stable_when_one_chosen_head_moves():
    chosen = [(0, 1), (1, 1), (2, 1), (3, 1)]
    moved = [(0, 2), (1, 1), (2, 1), (3, 1)]                # layer 0's chosen head changes
    for d in range(20):
        a = matched_random_heads(G.shape, chosen, seed=4, draw=d)
        b = matched_random_heads(G.shape, moved, seed=4, draw=d)
        assert [h for h in a if h[0] > 0] == [h for h in b if h[0] > 0]        # other layers untouched
        if (0, 2) not in a and (0, 1) not in b:              # layer 0: unchanged unless a moved head is drawn
            assert a == b
