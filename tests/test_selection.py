"""Selection by a score's ranking (SPEC §10): a fraction of all heads or top-k, with another
ranking's top 2 % excluded, against a port of the authors' ``get_heads_to_ablate``; the conditions
with their random controls; the errors."""

from __future__ import annotations

import numpy as np
import pytest

from inductionlab.core.ablation import (ablation_conditions, heads_for_fraction, random_heads, select_heads,
                                        selection_conditions, top_k_heads)
from inductionlab.core.stimuli import seed_for
from inductionlab.errors import InductionLabError
from inductionlab.measures.stats import draws_by_k


def oracle_heads_to_ablate(heads: dict, other: dict, num_ablate, exclude_other_heads: bool, excl_num=0.02):
    """Yin & Steinhardt's selection, ported from ``kayoyin/icl-heads`` ``src/utils/ablate_utils.py::
    get_heads_to_ablate`` (Apache-2.0) step by step, the pickles replaced by the dicts they hold
    (``"layer.head" -> score``, layer-major order); the ``"random"`` branch left out."""
    if num_ablate == 0:
        return []
    ranked = sorted(heads, key=lambda name: heads[name], reverse=True)      # stable: ties keep dict order
    if num_ablate < 1:                                                      # a fraction of all heads
        num_ablate = int(num_ablate * len(ranked))
    if num_ablate == 0:
        num_ablate = 1
    if exclude_other_heads:
        n_excl = int(excl_num * len(ranked))
        top_other = sorted(other, key=lambda name: other[name], reverse=True)[:n_excl]
        ranked = [name for name in ranked if name not in top_other]
    return [tuple(int(x) for x in name.split(".")) for name in ranked[:int(num_ablate)]]


def as_dict(table: np.ndarray) -> dict:
    return {f"{l}.{h}": float(table[l, h]) for l in range(table.shape[0]) for h in range(table.shape[1])}


def tables():
    """Pairs of synthetic score tables: shapes of small and real models, continuous and tied scores,
    correlated and independent rankings."""
    rng = np.random.default_rng(2025)
    out = []
    for shape in [(4, 6), (5, 3), (12, 12), (30, 9), (24, 16), (32, 32)]:
        a = rng.random(shape)
        out.append((a, rng.random(shape)))                                  # independent
        out.append((a, a + 0.3 * rng.random(shape)))                         # correlated
        out.append((np.round(a, 1), np.round(rng.random(shape), 1)))         # many ties
    out.append((np.zeros((6, 8)), np.ones((6, 8))))                          # all tied
    return out


FRACTIONS = (0.001, 0.01, 0.03, 0.05, 0.07, 0.09, 0.15, 0.2, 0.29, 0.5, 0.9)   # Yin's run.sh: 0.01 ... 0.2


def test_select_heads_equals_the_authors_selection():
    """Every table pair, fraction and k, with and without the exclusion (default 2 % and 10 %):
    the same heads in the same order. (A fraction of exactly 1 is all heads here; the authors'
    code reads 1 as one head, so the port is compared below 1.)"""
    compared = 0
    for a, b in tables():
        total = a.size
        da, db = as_dict(a), as_dict(b)
        for size in FRACTIONS + (1, 3, 10):
            if size >= 1 and size > total // 2:
                continue
            kw = dict(fraction=size) if size < 1 else dict(k=size)
            assert select_heads(a, **kw) == oracle_heads_to_ablate(da, db, size, False)
            for excl in (0.02, 0.1):
                # one deliberate difference (issue 36): where the authors' int(excl x N) is 0 we exclude one head,
                # so the oracle is asked for an exclusion of exactly one head (int(1.5) = 1) there
                ours = excl if int(excl * total) >= 1 else 1.5 / total
                assert select_heads(a, **kw, exclude_scores=b, exclude_fraction=excl) \
                    == oracle_heads_to_ablate(da, db, size, True, ours)
            compared += 3
    assert compared == 3 * sum(len(FRACTIONS) + sum(k <= a.size // 2 for k in (1, 3, 10)) for a, _ in tables())


def test_select_heads_properties_over_random_tables():
    """A seeded loop over random tables (no hypothesis here): an excluded head is never selected, the
    count is max(1, int(f N)), and every head left out (and not excluded) scores at most the lowest
    selected one."""
    rng = np.random.default_rng(7)
    for _ in range(300):
        shape = tuple(int(x) for x in rng.integers(1, 20, size=2))
        total = shape[0] * shape[1]
        a = np.round(rng.random(shape), int(rng.integers(1, 4)))             # ties at times
        b = rng.random(shape)
        f = float(rng.uniform(1e-4, 1.0))
        ef = float(rng.choice([0.0, 0.02, 0.1, rng.uniform(0, 0.6)]))
        excluded = set(top_k_heads(b, 0 if ef == 0 else max(1, int(ef * total))))   # at least one (issue 36)
        n = max(1, int(f * total))
        assert heads_for_fraction(total, f) == n
        if n > total - len(excluded):
            with pytest.raises(InductionLabError, match="remain after excluding"):
                select_heads(a, fraction=f, exclude_scores=b, exclude_fraction=ef)
            continue
        got = select_heads(a, fraction=f, exclude_scores=b, exclude_fraction=ef)
        assert len(got) == len(set(got)) == n
        assert not set(got) & excluded
        rest = [a[h] for h in np.ndindex(shape) if h not in excluded and h not in set(got)]
        assert not rest or max(rest) <= min(a[h] for h in got)


def test_fraction_counts_by_hand():
    # 270 heads (SmolLM2-135M): 1 % = int(2.7) = 2, 5 % = 13, 2 % excluded = 5; 24 heads: 1 % -> at least 1
    assert [heads_for_fraction(270, f) for f in (0.01, 0.05, 0.2, 1.0)] == [2, 13, 54, 270]
    assert heads_for_fraction(24, 0.01) == 1
    assert heads_for_fraction(100, 0.29) == 28              # int(28.999999999999996): the authors' rounding
    sc = np.arange(12, dtype=float).reshape(3, 4)           # head (2, 3) best ... (0, 0) worst
    other = sc[::-1, ::-1].copy()                           # the reverse ranking: (0, 0) best
    assert select_heads(sc, fraction=0.25) == [(2, 3), (2, 2), (2, 1)]
    assert select_heads(sc, k=2, exclude_scores=-sc, exclude_fraction=0.2) == [(2, 3), (2, 2)]   # excludes 2 worst
    assert select_heads(sc, k=2, exclude_scores=sc, exclude_fraction=0.2) == [(2, 1), (2, 0)]    # its own top 2 gone
    assert select_heads(sc, k=2, exclude_scores=other, exclude_fraction=0.0) == [(2, 3), (2, 2)]


@pytest.mark.parametrize("kw, match", [
    (dict(fraction=0.0), r"fraction=0.0 must be a number in \(0, 1\]"),
    (dict(fraction=1.5), r"fraction=1.5 must be a number in \(0, 1\]"),
    (dict(fraction=float("nan")), r"fraction=nan must be a number in \(0, 1\]"),
    (dict(fraction=True), r"fraction=True must be a number"),
    (dict(k=13), "k=13 heads requested but the model has 12; use k <= 12"),
    (dict(k=0), "k=0 must be an integer >= 1"),
    (dict(), "give exactly one of fraction= .* and k="),
    (dict(fraction=0.1, k=2), "give exactly one of fraction= .* and k="),
    (dict(k=11, exclude_scores=np.ones((3, 4)), exclude_fraction=0.2),
     "11 heads requested but only 10 of 12 remain after excluding the other ranking's top 2; lower the fraction"),
    (dict(k=1, exclude_scores=np.ones((3, 4)), exclude_fraction=1.0),
     r"exclude_fraction=1.0 must be a number in \[0, 1\)"),
    (dict(k=1, exclude_scores=np.ones((4, 3))), r"exclude_scores has shape \(4, 3\) but scores \(3, 4\)"),
])
def test_select_heads_errors(kw, match):
    with pytest.raises(InductionLabError, match=match):
        select_heads(np.arange(12.0).reshape(3, 4), **kw)


FV = np.random.default_rng(1).random((10, 10))
IND = np.random.default_rng(2).random((10, 10))


def test_selection_conditions_names_heads_and_draws():
    conds = selection_conditions(FV, fractions=(0.05, 0.005), exclude_scores=IND, exclude_label="induction",
                                 n_draws=2, seed=3)
    assert [c.name for c in conds] == [
        "intact", "fv-5pct", "fv-excl-induction-5pct", "random-5pct-d0", "random-5pct-d1",
        "fv-0.5pct", "fv-excl-induction-0.5pct", "random-0.5pct-d0", "random-0.5pct-d1"]
    by = {c.name: c for c in conds}
    assert [by["fv-5pct"].k, by["fv-0.5pct"].k] == [5, 1]                  # int(0.5) -> at least 1
    assert by["fv-5pct"].heads == top_k_heads(FV, 5) and by["fv-5pct"].kind == "fv"
    excl = by["fv-excl-induction-5pct"]
    assert excl.kind == "fv-excl-induction" and not set(excl.heads) & set(top_k_heads(IND, 2))
    assert excl.heads == select_heads(FV, fraction=0.05, exclude_scores=IND)
    # random over all heads (no exclusion), seeded as ablation_conditions' draws
    assert by["random-5pct-d1"].heads == random_heads((10, 10), 5, (), seed_for(3, 5, 1))
    assert draws_by_k(conds) == {1: ["random-0.5pct-d0", "random-0.5pct-d1"], 5: ["random-5pct-d0", "random-5pct-d1"]}


def test_selection_conditions_random_outside_top_n_equal_ablation_conditions():
    sel = selection_conditions(IND, ks=(5, 10), n_draws=3, random="outside-top-n", seed=0, label="induction")
    abl = ablation_conditions(IND, (5, 10), n_draws=3, seed=0)
    assert [c.name for c in sel] == [c.name.replace("random-", "random-outside-") for c in abl]
    assert [(c.kind, c.k, c.draw, c.heads) for c in sel] == [(c.kind, c.k, c.draw, c.heads) for c in abl]
    top = set(top_k_heads(IND, 50))
    assert all(not set(c.heads) & top for c in sel if c.kind == "random")


@pytest.mark.parametrize("kw, match", [
    (dict(), "give exactly one of fractions= .* and ks="),
    (dict(fractions=(0.1,), ks=(2,)), "give exactly one of fractions= .* and ks="),
    (dict(fractions=()), "no size given"),
    (dict(fractions=(0.01, 0.015)), "sizes 1pct and 1.5pct both select 1 of 100 heads; give each count once"),
    (dict(ks=(3, 3)), "sizes 3 and 3 both select 3 of 100 heads"),
    (dict(fractions=(1.2,)), r"fraction=1.2 must be a number in \(0, 1\]"),
    (dict(ks=(101,)), "k=101 heads requested but the model has 100"),
    (dict(ks=(2,), random="outside"), "random='outside': use one of outside-top-n, all"),
    (dict(ks=(2,), exclude_top_n=10), "exclude_top_n is for random='outside-top-n'"),
    (dict(ks=(2,), random="outside-top-n", exclude_top_n=101), "exclude_top_n=101 must be between 0 and"),
    (dict(ks=(60,), random="outside-top-n"), "k=60 random heads requested but only 50 remain"),
    (dict(ks=(2,), exclude_scores=IND), "exclude_scores needs exclude_label="),
    (dict(ks=(2,), n_draws=-1), "n_draws=-1 must be an integer >= 0"),
])
def test_selection_conditions_errors(kw, match):
    with pytest.raises(InductionLabError, match=match):
        selection_conditions(FV, **kw)
