"""Head-score formulas against hand-built attention patterns, and batched == one-at-a-time."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import make_tiny
from inductionlab.ablation import (ablation_conditions, default_exclude_top_n, per_layer_top_p, random_heads,
                                   top_k_heads)
from inductionlab.errors import InductionLabError
from inductionlab.instrument import instrument
from inductionlab.scores import build_sequences, compute_head_scores, score_from_pattern, score_targets

T = 6  # tokens per copy; sequence [BOS] S S has 13 positions


def causal_uniform(n):
    p = torch.tril(torch.ones(n, n))
    return p / p.sum(-1, keepdim=True)


def pattern_on(targets, n, rest_on_bos=0.0):
    """A head that puts (1 - rest_on_bos) on each query's target and the rest on BOS."""
    p = torch.zeros(n, n)
    p[0, 0] = 1.0
    for q in range(1, n):
        t = int(targets[q])
        if t < 0:
            p[q, 0] = 1.0
        else:
            p[q, t] += 1.0 - rest_on_bos
            p[q, 0] += rest_on_bos
    return p


@pytest.mark.parametrize("name", ["induction", "anti_induction", "previous_token", "duplicate_token", "sink"])
def test_perfect_head_scores_one(name):
    t = score_targets(name, T)
    p = pattern_on(t, 2 * T + 1)[None, None]  # [B=1, H=1, Q, K]
    assert score_from_pattern(p, name, T)[0] == pytest.approx(1.0)


def test_uniform_head_scores_analytic_value():
    n = 2 * T + 1
    p = causal_uniform(n)[None, None]
    # induction queries i = 1+T .. 2T (0-based positions), each sees i+1 keys uniformly
    expected = np.mean([1.0 / (i + 1) for i in range(1 + T, 1 + 2 * T)])
    assert score_from_pattern(p, "induction", T)[0] == pytest.approx(expected)
    expected_prev = np.mean([1.0 / (i + 1) for i in range(1, n)])
    assert score_from_pattern(p, "previous_token", T)[0] == pytest.approx(expected_prev)


def test_bos_resting_head_is_not_renormalised():
    t = score_targets("induction", T)
    p = pattern_on(t, 2 * T + 1, rest_on_bos=0.99)[None, None]
    assert score_from_pattern(p, "induction", T)[0] == pytest.approx(0.01)
    assert score_from_pattern(p, "sink", T)[0] > 0.99


def test_targets_by_hand():
    # [BOS] a b c a b c : induction query 4 (a) -> 2 (b), query 6 (c) -> 4 (a, the token after c's first copy)
    assert score_targets("induction", 3).tolist() == [-1, -1, -1, -1, 2, 3, 4]
    assert score_targets("duplicate_token", 3).tolist() == [-1, -1, -1, -1, 1, 2, 3]
    # [BOS] a b c c b a : query 4 (c, earlier at 3) -> 2; query 5 (b, earlier at 2) -> 1; query 6 (a) has no key in S
    assert score_targets("anti_induction", 3).tolist() == [-1, -1, -1, -1, 2, 1, -1]
    assert score_targets("induction", 3, bos=False).tolist() == [-1, -1, -1, 1, 2, 3]
    S = torch.tensor([[7, 8, 9]])
    assert build_sequences(S, "anti_induction", 1).tolist() == [[1, 7, 8, 9, 9, 8, 7]]


def test_model_scores_match_full_patterns():
    model = make_tiny("llama", "eager")
    S = torch.randint(10, 700, (3, T))
    hs = compute_head_scores(model, sequences=S, bos_id=1, batch_size=3)
    ids = build_sequences(S, "induction", 1)
    with torch.inference_mode(), instrument(model, keep_patterns=True) as inst:
        model(input_ids=ids)
    for layer, pat in enumerate(inst.patterns):
        np.testing.assert_allclose(hs["induction"][layer], score_from_pattern(pat, "induction", T), atol=1e-6)
        np.testing.assert_allclose(hs["sink"][layer], score_from_pattern(pat, "sink", T), atol=1e-6)


def test_batched_equals_one_at_a_time_and_options_are_honoured():
    model = make_tiny("gpt2")
    kw = dict(bos_id=3, seq_len=7, seed=5, exclude_ids=range(0, 50))
    batched = compute_head_scores(model, batch_size=4, n_batches=1, **kw)
    single = compute_head_scores(model, batch_size=1, n_batches=4, **kw)
    for name in batched.scores:
        np.testing.assert_allclose(batched[name], single[name], atol=1e-6)
    assert batched.params["seq_len"] == 7 and batched.params["bos_id"] == 3 and single.params["batch_size"] == 1
    assert batched.induction_loss["second_copy"] == pytest.approx(single.induction_loss["second_copy"], abs=1e-5)
    # without BOS the targets shift: a different option gives a different (still honoured) result
    nobos = compute_head_scores(model, batch_size=4, seed=5, seq_len=7, exclude_ids=range(0, 50))
    assert nobos.params["bos_id"] is None and not np.allclose(nobos["sink"], batched["sink"])


def test_random_pool_excludes_special_tokens(word_tokenizer):
    from inductionlab.stimuli import ordinary_token_ids, random_sequences
    pool = ordinary_token_ids(800, exclude_ids=[10], tokenizer=word_tokenizer)
    banned = set(word_tokenizer.all_special_ids) | {10}
    assert not banned & set(pool.tolist()) and len(pool) == 800 - len(banned)
    S = random_sequences(pool, 20, 30, seed=0)
    assert all(len(set(r.tolist())) == 30 for r in S)  # distinct tokens within a sequence
    assert torch.equal(S, random_sequences(pool, 20, 30, seed=0))


# -- rankings -------------------------------------------------------------------------------

SC = np.array([[0.1, 0.9, 0.3], [0.8, 0.2, 0.7], [0.0, 0.5, 0.6]])


def test_top_k_and_per_layer_top_p():
    assert top_k_heads(SC, 3) == [(0, 1), (1, 0), (1, 2)]
    assert per_layer_top_p(SC, 0.02) == [(0, 1), (1, 0), (2, 2)]      # ceil(0.06) = 1 per layer
    assert per_layer_top_p(SC, 0.5) == [(0, 1), (0, 2), (1, 0), (1, 2), (2, 2), (2, 1)]  # ceil(1.5) = 2
    with pytest.raises(InductionLabError, match="k=10"):
        top_k_heads(SC, 10)


def test_random_heads_exclusion_seed_and_draws():
    excl = top_k_heads(SC, 4)
    draws = [random_heads(SC.shape, 3, excl, seed=s) for s in range(20)]
    assert all(not set(d) & set(excl) and len(set(d)) == 3 for d in draws)
    assert random_heads(SC.shape, 3, excl, seed=3) == draws[3]
    assert len({tuple(d) for d in draws}) > 1
    with pytest.raises(InductionLabError, match="only 5 remain"):
        random_heads(SC.shape, 6, excl)


def test_ablation_conditions():
    conds = ablation_conditions(SC, [2], n_draws=3, exclude_top_n=4, seed=0)
    assert [c.name for c in conds] == ["intact", "induction-2", "random-2-d0", "random-2-d1", "random-2-d2"]
    assert conds[1].heads == [(0, 1), (1, 0)]
    assert default_exclude_top_n(270) == 135 and default_exclude_top_n(2000) == 300
    with pytest.raises(InductionLabError):
        ablation_conditions(SC, [6], exclude_top_n=4)
