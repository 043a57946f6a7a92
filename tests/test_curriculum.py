"""Bi-Induct stream (SPEC §6): snippet formats, schedule, iso-token budget, order, resume, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from inductionlab.data.curriculum import BiInductStream, CurriculumConfig
from inductionlab.errors import InductionLabError

V = 50_000           # vocabulary; the natural stream is 0, 1, 2, ... so order is visible
SEP = 49_999
N_TOK = 40_000


def make(variant="induction", *, tokens=None, bs=4, T=64, total=64 * 4 * 100, **kw):
    tokens = np.arange(N_TOK, dtype=np.int64) if tokens is None else tokens
    cfg = CurriculumConfig(variant=variant, **{"span_length": 6, **kw})
    return BiInductStream(tokens, cfg, batch_size=bs, seq_len=T, total_tokens=total,
                          vocab_size=V, sep_id=SEP)


def natural_of(stream, start=0, stop=None):
    """Concatenated natural (non-snippet) tokens of batches [start, stop)."""
    out = []
    for b in stream.batches(start):
        if stop is not None and b.step >= stop:
            break
        out.append(b.input_ids[~b.synthetic_mask])
    return torch.cat(out).numpy()


@pytest.mark.parametrize("variant", ["induction", "anti", "balanced"])
def test_snippet_format_exact(variant):
    s = make(variant, span_length=7)
    seen = 0
    for b in s.batches():
        ids, mask = b.input_ids.numpy(), b.synthetic_mask.numpy()
        expect_mask = np.zeros_like(mask)
        for row, c, L, d in b.snippets:
            S, sep, copy = ids[row, c:c + L], ids[row, c + L], ids[row, c + L + 1:c + 2 * L + 1]
            assert L == 7 and sep == SEP
            # S is a contiguous span of the natural stream 0, 1, 2, ...
            assert np.array_equal(np.diff(S), np.ones(L - 1))
            if variant == "induction":
                assert d == "forward"
            if variant == "anti":
                assert d == "backward"
            want = S if d == "forward" else S[::-1]
            assert np.array_equal(copy, want)
            expect_mask[row, c:c + 2 * L + 1] = True
            seen += 1
        assert np.array_equal(mask, expect_mask)   # mask is exactly S, SEP and the copy
    assert seen > 100


def test_balanced_direction_is_a_fair_coin():
    s = make("balanced", span_length=4, total=64 * 4 * 300)
    dirs = [d for b in s.batches() for (_, _, _, d) in b.snippets]
    n, k = len(dirs), dirs.count("forward")
    assert n > 1000
    # Binomial(n, 1/2): P(|k - n/2| > 4 sd) < 1e-4
    assert abs(k - n / 2) <= 4 * math.sqrt(n) / 2


def test_expected_fraction_hand_values():
    s = make("induction", m0=0.5, anneal_tokens=1000)
    assert s.expected_fraction(0) == 0.5
    assert s.expected_fraction(500) == 0.25
    assert s.expected_fraction(1000) == 0.0
    assert s.expected_fraction(5000) == 0.0
    assert make("none").expected_fraction(0) == 0.0


def test_realised_fraction_follows_schedule_and_is_zero_after_anneal():
    bs, T, L = 4, 128, 10
    total = bs * T * 400                      # 1600 windows
    Ta = total // 2
    s = make("anti", bs=bs, T=T, total=total, span_length=L, m0=0.5, anneal_tokens=Ta)
    fr = s.realised_fractions()
    # realised_fractions agrees with the batches themselves
    for step in (0, 57, 399):
        b = s.batch(step)
        assert b.synthetic_fraction == pytest.approx(b.synthetic_mask.float().mean().item())
        assert fr[step] == pytest.approx(b.synthetic_fraction)
    # Windows of 40 batches (160 rows): each row's synthetic count is floor or ceil of its target
    # (in units of s = 2L+1), so the row fraction deviates from its mean by at most s/T; Hoeffding
    # over 160 rows with eps = 0.05 gives P < 2 exp(-2*160*0.05**2/(21/128)**2) = 2e-13.
    s_len = 2 * L + 1
    for w in range(0, 200, 40):               # before T_a
        t = np.arange(w * bs * T, (w + 40) * bs * T)
        m = np.mean(0.5 * np.maximum(0, 1 - t / Ta))
        assert abs(fr[w:w + 40].mean() - m) < 0.05, (w, fr[w:w + 40].mean(), m)
    assert s_len / T < 0.17
    assert np.all(fr[200:] == 0)              # zero after T_a (row starts at t >= T_a)
    for step in (200, 300, 399):
        assert not s.batch(step).synthetic_mask.any()
    # whole-run average is m0/2 for a linear decay to zero at T_a = budget/2 -> 0.125
    assert abs(fr.mean() - 0.125) < 0.01


def test_realised_fraction_with_span_range():
    bs, T = 4, 128
    total = bs * T * 300
    s = make("balanced", bs=bs, T=T, total=total, span_length_range=(3, 12), m0=0.4,
             anneal_tokens=10 * total)           # ~constant 0.4 -> 0.38
    fr = s.realised_fractions()
    t = np.arange(total)
    assert abs(fr.mean() - np.mean(0.4 * (1 - t / (10 * total)))) < 0.02
    lens = {L for b in s.batches(0) for (_, _, L, _) in b.snippets}
    assert min(lens) >= 3 and max(lens) <= 12 and len(lens) == 10   # all lengths drawn


@pytest.mark.parametrize("kw", [{}, {"span_length_range": (2, 9)}, {"span_source": "random"}])
def test_all_variants_same_tokens_batches_and_shapes(kw):
    streams = {v: make(v, total=64 * 4 * 50 + 17, **kw) for v in ("none", "induction", "anti", "balanced")}
    nb = {v: s.num_batches for v, s in streams.items()}
    assert set(nb.values()) == {50}
    for v, s in streams.items():
        bs = list(s.batches())
        assert len(bs) == 50
        assert all(b.input_ids.shape == (4, 64) and b.input_ids.dtype == torch.long for b in bs)
        assert all(b.synthetic_mask.shape == (4, 64) and b.synthetic_mask.dtype == torch.bool for b in bs)
        assert [b.tokens_before for b in bs] == [i * 256 for i in range(50)]
        assert sum(b.input_ids.numel() for b in bs) == 50 * 256
    # same seed: identical placements across the three snippet variants
    pl = {v: [(b.step, r, c, L) for b in streams[v].batches() for (r, c, L, _) in b.snippets]
          for v in ("induction", "anti", "balanced")}
    assert pl["induction"] == pl["anti"] == pl["balanced"]
    assert len(pl["induction"]) > 0


@pytest.mark.parametrize("variant", ["induction", "anti", "balanced"])
def test_surviving_natural_tokens_keep_order(variant):
    s = make(variant, total=64 * 4 * 80)
    nat = natural_of(s)
    assert np.array_equal(nat, np.arange(nat.size))       # exactly the stream prefix, in order
    assert nat.size == s.natural_tokens_used
    assert nat.size < 80 * 256                            # some tokens were replaced


def test_m0_zero_and_none_are_the_plain_stream():
    for s in (make("induction", m0=0.0), make("balanced", m0=0.0), make("none", m0=0.5)):
        ids = torch.cat([b.input_ids for b in s.batches()])
        assert np.array_equal(ids.numpy().ravel(), np.arange(100 * 256))
        assert all(b.synthetic_fraction == 0.0 and not b.synthetic_mask.any() for b in s.batches())


def test_resume_reproduces_stream_bit_for_bit():
    kw = dict(total=64 * 4 * 60, span_length_range=(3, 9), seed=7)
    full = list(make("balanced", **kw).batches())
    resumed = list(make("balanced", **kw).batches(start_step=23))   # a fresh object, as after a restart
    assert len(resumed) == len(full) - 23
    for a, b in zip(full[23:], resumed):
        assert a.step == b.step and a.tokens_before == b.tokens_before
        assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.synthetic_mask, b.synthetic_mask)
        assert a.snippets == b.snippets
    # random access equals iteration
    s = make("balanced", **kw)
    assert torch.equal(s.batch(41).input_ids, full[41].input_ids)
    # resuming from a token offset: 23 batches of 4 x 64 tokens
    assert s.step_at_tokens(23 * 256) == 23
    with pytest.raises(InductionLabError, match="multiple of 256"):
        s.step_at_tokens(23 * 256 + 5)


def test_seed_changes_placements():
    a, b = make("induction", seed=0).batch(3), make("induction", seed=1).batch(3)
    assert not torch.equal(a.input_ids, b.input_ids)


def test_wraps_around_short_stream():
    tokens = np.arange(1000, dtype=np.uint16)
    s = make("anti", tokens=tokens, total=64 * 4 * 20)      # 5120 tokens from a 1000-token stream
    assert s.epochs > 3
    nat = natural_of(s)
    assert np.array_equal(nat, np.arange(nat.size) % 1000)


def test_random_spans_avoid_specials_and_sep():
    tokens = np.arange(N_TOK, dtype=np.int64) % 12                # natural ids inside the vocabulary too
    cfg = CurriculumConfig(variant="induction", span_length=5, span_source="random", seed=3)
    s = BiInductStream(tokens, cfg, batch_size=4, seq_len=64, total_tokens=64 * 4 * 20,
                       vocab_size=12, sep_id=11, special_ids=(0, 1))
    spans = [b.input_ids[r, c:c + L] for b in s.batches() for (r, c, L, _) in b.snippets]
    allv = torch.cat(spans)
    assert set(allv.tolist()) == set(range(2, 11))           # ids 2..10 only, all of them used


def test_natural_spans_avoid_special_ids():
    tokens = np.arange(N_TOK, dtype=np.int64) % 50           # id 0 every 50 tokens ("EOS")
    cfg = CurriculumConfig(variant="induction", span_length=10, seed=1)
    s = BiInductStream(tokens, cfg, batch_size=4, seq_len=64, total_tokens=64 * 4 * 30,
                       vocab_size=V, sep_id=SEP, special_ids=(0,))
    for b in s.batches():
        for r, c, L, _ in b.snippets:
            assert 0 not in b.input_ids[r, c:c + L].tolist()


def test_sep_from_config_overrides():
    s = make("induction", sep_id=7)
    b = s.batch(0)
    r, c, L, _ = b.snippets[0]
    assert b.input_ids[r, c + L].item() == 7


@pytest.mark.parametrize("kw, msg", [
    (dict(variant="sideways"), "unknown curriculum variant"),
    (dict(m0=1.5), "m0 must be in [0, 1]"),
    (dict(m0=-0.1), "m0 must be in [0, 1]"),
    (dict(span_length=40), "does not fit the context"),
    (dict(span_length_range=(5, 32)), "does not fit the context"),
    (dict(span_length=0), "span length must be >= 1"),
    (dict(span_source="web"), "unknown span source"),
    (dict(anneal_tokens=0), "anneal_tokens must be > 0"),
    (dict(total=100), "below one batch"),
    (dict(tokens=np.zeros(0, dtype=np.int64)), "empty"),
])
def test_bad_inputs_one_line_errors(kw, msg):
    with pytest.raises(InductionLabError) as e:
        make(**{"variant": "induction", **kw})
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_step_out_of_range():
    with pytest.raises(InductionLabError, match="outside"):
        make("induction").batch(100)
