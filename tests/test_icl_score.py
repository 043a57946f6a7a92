"""ICL score on a fake model with a known loss curve; positions scaled to the context; windows;
the induction loss equals scores.py's on the same sequences."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from inductionlab.errors import InductionLabError
from inductionlab.protocols.icl_score import (heldout_windows, icl_positions, icl_score, induction_loss, text_windows,
                                    token_losses)

V = 64


def curve(t):
    """The known loss (nats) of the token at index t."""
    return 4.0 / (1.0 + t / 20.0)


class CurveModel(torch.nn.Module):
    """Predicts x + 1 (mod V) after token x; at position t (predicting index t + 1) it puts logit
    a on that token and 0 elsewhere, with a chosen so that −log p = curve(t + 1) exactly.
    Sequences whose first token is odd get a flat curve (4 nats) instead."""

    def __init__(self, ctx=2048):
        super().__init__()
        self.dummy = torch.nn.Parameter(torch.zeros(1))
        self.config = SimpleNamespace(vocab_size=V, max_position_embeddings=ctx)

    def forward(self, input_ids, **kw):
        B, T = input_ids.shape
        t = torch.arange(T, dtype=torch.float64) + 1
        loss = torch.where((input_ids[:, :1] % 2 == 1), torch.full((B, T), 4.0, dtype=torch.float64),
                           curve(t)[None].expand(B, T))
        p = torch.exp(-loss)
        a = torch.log((V - 1) * p / (1 - p))                 # softmax([a, 0 × (V−1)])[0] = p
        logits = torch.zeros(B, T, V, dtype=torch.float64)
        logits.scatter_(2, ((input_ids + 1) % V)[..., None], a[..., None])
        return SimpleNamespace(logits=logits)


def seqs(starts, T):
    return torch.stack([(torch.arange(T) + s) % V for s in starts])


def test_token_losses_follow_the_curve():
    nll = token_losses(CurveModel(), seqs([0, 2], 30))
    assert nll.shape == (2, 29)
    assert np.allclose(nll[0], [curve(t) for t in range(1, 30)])


def test_icl_score_known_curve_and_ci():
    r = icl_score(CurveModel(), seqs([0, 2, 4, 6], 600))
    assert (r["late"], r["early"]) == (500, 50)
    assert r["score"] == pytest.approx(curve(500) - curve(50))
    assert r["ci_high"] - r["ci_low"] == pytest.approx(0, abs=1e-5)   # float32 logits
    # half the sequences flat (score 0): per-sequence [d, 0, d, 0]
    r = icl_score(CurveModel(), seqs([0, 1, 2, 3], 600))
    d = curve(500) - curve(50)
    assert r["score"] == pytest.approx(d / 2)
    assert r["ci_high"] - r["score"] == pytest.approx(1.959964 * np.std([d, 0, d, 0], ddof=1) / 2, rel=1e-5)
    assert np.allclose(r["per_sequence"]["benefit"], [-d, 0, -d, 0])


def test_icl_score_window_averages_the_curve():
    r = icl_score(CurveModel(), seqs([0, 2], 600), window=5)
    want = np.mean([curve(t) for t in range(496, 501)]) - np.mean([curve(t) for t in range(46, 51)])
    assert r["window"] == 5 and r["score"] == pytest.approx(want, rel=1e-5)
    assert icl_score(CurveModel(), seqs([0], 600), late=20, early=3, window=9)["window"] == 3
    with pytest.raises(InductionLabError, match="window"):
        icl_score(CurveModel(), seqs([0], 600), window=0)


def test_positions_scaled_to_short_context():
    assert icl_positions(2048) == (500, 50)
    assert icl_positions(100) == (99, 10)                      # 50 · 99 / 500 = 9.9
    assert icl_positions(501) == (500, 50)
    r = icl_score(CurveModel(ctx=100), seqs([0, 2], 300))
    assert (r["late"], r["early"]) == (99, 10) and r["score"] == pytest.approx(curve(99) - curve(10))
    with pytest.raises(InductionLabError, match="early < late"):
        icl_positions(100, late=50, early=50)


def test_heldout_windows_start_at_documents():
    eos = 0
    docs = [list(range(1, 8)), list(range(10, 13)), list(range(20, 30)), list(range(40, 46))]
    stream = np.array([t for d in docs for t in d + [eos]])
    w = heldout_windows(stream, eos, n=10, length=6)
    assert w.tolist() == [[1, 2, 3, 4, 5, 6], [20, 21, 22, 23, 24, 25], [40, 41, 42, 43, 44, 45]]
    w = heldout_windows(stream, eos, n=1, length=4, bos_id=99, seed=3)
    assert w.shape == (1, 4) and w[0, 0] == 99 and w[0, 1].item() in (1, 10, 20, 40)
    with pytest.raises(InductionLabError, match="no held-out document has 11 tokens"):
        heldout_windows(stream, eos, n=2, length=11)


def test_text_windows(word_tokenizer):
    w = text_windows(word_tokenizer, "the king of the people is here and now", 3)
    ids = word_tokenizer.encode("the king of the people is here and now", add_special_tokens=False)
    assert w.tolist() == [ids[0:3], ids[3:6], ids[6:9]]
    with pytest.raises(InductionLabError, match="fewer than one window"):
        text_windows(word_tokenizer, "the king", 5)


def test_induction_loss_matches_scores_py():
    from conftest import make_tiny

    from inductionlab.core.scores import compute_head_scores
    model = make_tiny("llama")
    r = induction_loss(model, seq_len=12, n=6, seed=4, bos_id=1, batch_size=4)
    ref = compute_head_scores(model, seq_len=12, batch_size=6, seed=4, bos_id=1, names=("induction",))
    assert r["first_copy"] == pytest.approx(ref.induction_loss["first_copy"], rel=1e-5)
    assert r["second_copy"] == pytest.approx(ref.induction_loss["second_copy"], rel=1e-5)
    assert r["benefit"] == pytest.approx(r["first_copy"] - r["second_copy"])
    abl = _ablated_induction_loss(model, [(1, h) for h in range(8)], seq_len=12, n=6, seed=4, bos_id=1)
    assert not math.isclose(abl["second_copy"], r["second_copy"])


def _ablated_induction_loss(model, heads, **kw) -> dict:
    """The induction loss with ``heads`` zero-ablated: its trials under one condition of the runner."""
    from functools import partial

    from inductionlab.core.ablation import Condition
    from inductionlab.protocols.icl_score import induction_ids, induction_summary, measure_batch
    from inductionlab.protocols.runner import Trials, run_conditions

    ids, T, bos = induction_ids(model, **kw)
    a = run_conditions(SimpleNamespace(model=model), [Condition("ablated", "induction", heads=heads)],
                       Trials({"ids": ids}), batch_size=16, measure_batch=partial(measure_batch, hits=True))["ablated"]
    return induction_summary(a["nll"], a["hits"], T, bos)


def test_measure_at_reads_the_losses_of_the_full_measure_at_its_positions():
    from conftest import make_tiny
    from inductionlab.protocols.icl_score import measure_at, measure_batch
    model = make_tiny("llama")
    x = torch.randint(5, 800, (3, 40), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        full = measure_batch(model, {"ids": x})["nll"]
        some = measure_at(model, {"ids": x}, (5, 39))["nll"]
    assert some.shape == (3, 2) and torch.allclose(some, full[:, [4, 38]], atol=1e-5)
