"""Head-score formulas against hand-built attention patterns and a uniform-attention model,
batched == one-at-a-time, the score registry, and bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import make_tiny
from inductionlab.core import scores as scores_mod
from inductionlab.errors import InductionLabError
from inductionlab.core.instrument import instrument
from inductionlab.core.scores import (SCORE_NAMES, SCORES, ScoreSpec, build_sequences, compute_head_scores, repeated,
                                 score_from_pattern, score_names, score_targets)

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
    from inductionlab.core.stimuli import ordinary_token_ids, random_sequences
    pool = ordinary_token_ids(800, exclude_ids=[10], tokenizer=word_tokenizer)
    banned = set(word_tokenizer.all_special_ids) | {10}
    assert not banned & set(pool.tolist()) and len(pool) == 800 - len(banned)
    S = random_sequences(pool, 20, 30, seed=0)
    assert all(len(set(r.tolist())) == 30 for r in S)  # distinct tokens within a sequence
    assert torch.equal(S, random_sequences(pool, 20, 30, seed=0))


def uniform_llama(vocab=60, ctx=64):
    """q and k projections zero -> every attention logit 0 -> query q puts 1/(q+1) on each key."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=ctx)
    m = LlamaForCausalLM(cfg).eval()
    for layer in m.model.layers:
        layer.self_attn.q_proj.weight.data.zero_()
        layer.self_attn.k_proj.weight.data.zero_()
    return m


def test_registry_holds_every_score_and_the_defaults():
    assert set(score_names()) == {"induction", "anti_induction", "previous_token", "duplicate_token", "sink",
                                  "copy_offset", "copy_offset_control"}
    assert set(SCORE_NAMES) <= set(score_names())
    # the repeat scores share one sequence builder, hence one forward pass
    assert {SCORES[n].build for n in ("induction", "duplicate_token", "previous_token", "sink")} == {repeated}


def _first_token_targets(T, bos):
    """Toy rule: every query of the second copy -> the first token of S."""
    p0 = int(bos)
    t = torch.full((p0 + 2 * T,), -1, dtype=torch.long)
    t[p0 + T:] = p0
    return t


def test_a_new_score_is_one_function_and_one_entry(monkeypatch):
    monkeypatch.setitem(SCORES, "first_token", ScoreSpec("first_token", "toy", repeated, _first_token_targets))
    assert "first_token" in score_names()
    m = uniform_llama()
    hs = compute_head_scores(m, bos_id=1, seq_len=5, batch_size=3, exclude_ids=(0, 1),
                             names=("first_token", "previous_token"))
    # uniform causal attention: query i puts 1/(i+1) on key 1; queries 6..10 of [BOS] S S (T = 5)
    np.testing.assert_allclose(hs["first_token"], np.mean([1 / (i + 1) for i in range(6, 11)]), rtol=1e-5)
    np.testing.assert_allclose(hs["previous_token"], np.mean([1 / (i + 1) for i in range(1, 11)]), rtol=1e-5)
    assert hs["first_token"].shape == (2, 4)


def test_copy_offset_scores_through_the_registry():
    m = uniform_llama()
    pool = torch.arange(2, 60)
    hs = compute_head_scores(m, seq_len=5, pool=pool, sep_id=1, bos_id=0, batch_size=3,
                             names=("copy_offset", "copy_offset_control"), induction_loss=False)
    # [BOS] S(5) SEP X(5): queries 7..10 each put 1/(q+1) on their key
    want = np.mean([1 / (q + 1) for q in (7, 8, 9, 10)])
    for name in ("copy_offset", "copy_offset_control"):
        np.testing.assert_allclose(hs[name], want, rtol=1e-5)
    assert hs.induction_loss == {} and hs.params["sep_id"] == 1
    # the telemetry's function is this call (moved here from train/telemetry.py)
    old = scores_mod.copy_offset_scores(m, span_length=5, pool=pool, sep_id=1, bos_id=0, batch_size=3)
    for name in old:
        assert np.array_equal(old[name], hs[name])
    # S does not depend on whether a control score is asked: copy_offset alone gives the same
    alone = compute_head_scores(m, seq_len=5, pool=pool, sep_id=1, bos_id=0, batch_size=3, names="copy_offset",
                                induction_loss=False)
    assert np.array_equal(alone["copy_offset"], hs["copy_offset"])


def test_loaded_bundle_is_accepted(tiny_loaded):
    kw = dict(seq_len=6, batch_size=2, names=("induction", "sink"))
    a = compute_head_scores(tiny_loaded, **kw)
    b = compute_head_scores(tiny_loaded.model, tokenizer=tiny_loaded.tokenizer, **kw)
    assert a.params["bos_id"] == tiny_loaded.tokenizer.bos_token_id
    for n in kw["names"]:
        assert np.array_equal(a[n], b[n])


@pytest.mark.parametrize("kw, match", [
    (dict(names=["inductoin"]), r"unknown head score 'inductoin'; use one of induction, anti_induction"),
    (dict(names=[]), "no head score named"),
    (dict(seq_len=0), "seq_len=0 must be an integer >= 2"),
    (dict(seq_len=1), "seq_len=1 must be an integer >= 2"),
    (dict(seq_len=2.5), "seq_len=2.5 must be an integer"),
    (dict(batch_size=0), "batch_size=0 must be an integer >= 1"),
    (dict(n_batches=0), "n_batches=0 must be an integer >= 1"),
    (dict(seq_len=1100), "exceeds the model's context of 2048"),
    (dict(sequences=torch.zeros(0, 5, dtype=torch.long)), "non-empty"),
])
def test_bad_arguments_fail_with_one_line(kw, match):
    model = make_tiny("gpt2")
    with pytest.raises(InductionLabError, match=match) as e:
        compute_head_scores(model, **kw)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("arch, softcap, chunk", [("llama", None, 256), ("gpt2", None, 256), ("gemma3", None, 256),
                                                  ("gemma3", 3.0, 256), ("llama", None, 7), ("gemma3", 3.0, 1)])
def test_induction_loss_without_batch_logits_equals_the_full_logits_loss(arch, softcap, chunk, monkeypatch):
    # chunk 7 / 1: the loss's logits are built a few positions at a time (a partial last chunk
    # included) and must give the same loss as the whole sequence's logits
    monkeypatch.setattr(scores_mod, "LOSS_CHUNK", chunk)
    model = make_tiny(arch)
    if softcap is not None:
        model.config.final_logit_softcapping = softcap
    S = torch.randint(10, 700, (3, T))
    hs = compute_head_scores(model, sequences=S, bos_id=1, batch_size=3, names=("induction",))
    ids = build_sequences(S, "induction", 1)
    with torch.inference_mode():
        logits = model(input_ids=ids).logits.float()
    nll = -torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1).double()
    assert hs.induction_loss["first_copy"] == pytest.approx(nll[:, 1:T].mean(1).mean().item(), abs=1e-6)
    assert hs.induction_loss["second_copy"] == pytest.approx(nll[:, T:].mean(1).mean().item(), abs=1e-6)
    # the scores do not depend on whether the loss is computed
    lean = compute_head_scores(model, sequences=S, bos_id=1, batch_size=3, names=("induction",), induction_loss=False)
    assert np.array_equal(lean["induction"], hs["induction"]) and lean.induction_loss == {}


def test_one_sequences_value_gives_the_head_scores_the_crp_and_the_pattern_sequence_the_same_rows():
    """A study's ``HeadScoreConfig.sequences`` is the one value every ``[BOS] S S`` reader takes: the attention CRP
    at lag 0 is, by definition, the duplicate-token score (every second-copy query ``p0 + T + j`` -> key ``p0 + j``),
    so on the same value they agree (lag +1 is not the induction score: that one also counts the last query, whose
    target is the second copy's first token); ``induction_sequence`` is its first row, drawn from the pool;
    keywords replace fields of the value."""
    from dataclasses import replace

    from inductionlab.core.scores import ScoreSequences, attention_crp, induction_sequence
    from inductionlab.core.stimuli import random_sequences
    from inductionlab.studies.configs import HeadScoreConfig

    model = make_tiny("llama")
    pool = torch.arange(10, 60)
    seqs = HeadScoreConfig(seq_len=6, batch_size=2, n_batches=2).sequences(seed=3, pool=pool)
    assert isinstance(seqs, ScoreSequences)
    assert (seqs.seq_len, seqs.batch_size, seqs.n_batches, seqs.seed) == (6, 2, 2, 3) and seqs.pool is pool
    hs = compute_head_scores(model, seqs, names=("induction", "duplicate_token"), induction_loss=False)
    assert {k: hs.params[k] for k in ("seq_len", "batch_size", "n_sequences", "seed", "bos_id")} == \
        {"seq_len": 6, "batch_size": 2, "n_sequences": 4, "seed": 3, "bos_id": None}
    crp = attention_crp(model, seqs, max_lag=3)
    assert crp.lags.tolist() == [-3, -2, -1, 0, 1, 2, 3]
    np.testing.assert_allclose(crp.profile[..., 3], hs["duplicate_token"], atol=1e-7, rtol=0)
    S0 = random_sequences(pool, 1, 6, 3)[0]
    assert induction_sequence(model, seqs).tolist() == S0.tolist() * 2
    assert set(S0.tolist()) <= set(range(10, 60)) and len(set(S0.tolist())) == 6
    other = compute_head_scores(model, seqs, seed=4, names=("induction",), induction_loss=False)
    assert np.array_equal(other["induction"], compute_head_scores(model, replace(seqs, seed=4), names=("induction",),
                                                                  induction_loss=False)["induction"])
    assert not np.array_equal(other["induction"], hs["induction"]) and other.params["seed"] == 4


def test_an_unknown_sequence_keyword_is_named():
    with pytest.raises(TypeError, match=r"compute_head_scores\(\) got unexpected keyword argument\(s\) seq_length; "
                                        r"the sequence fields are seq_len, batch_size"):
        compute_head_scores(make_tiny("gpt2"), seq_length=5)
