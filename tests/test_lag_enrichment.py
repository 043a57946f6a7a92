"""The word-prior-corrected lag curve on a fake model whose word priors are known.

The fake model's next-token distribution gives each list word its own fixed prior (Zipf-like, so
a raw lag curve is dominated by which word happens to sit at a lag) and multiplies the word
at lag +1 by e^δ; most of the mass sits on one non-list token, so the normaliser is ~1. The
log-enrichment at lag +1 is then δ (to the normaliser's 1e-3), every other lag ≈ 0, and the
CI is far tighter than the raw curve's relative CI.
"""

from __future__ import annotations

import math
import types

import numpy as np
import pytest
import torch

from inductionlab.core.ablation import Condition
from inductionlab.errors import InductionLabError
from inductionlab.protocols.lag_probe import LagProbeConfig, log_enrichment, run_lag_probe
from inductionlab.core.models import LoadedModel

DELTA = 1.5
LIST_MASS = 1e-3     # total prior mass on list words; the rest on token 3 (a non-list token)


class PriorModel(torch.nn.Module):
    def __init__(self, vocab: int, word_ids, delta: float):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.vocab, self.words, self.delta = vocab, sorted(int(i) for i in word_ids), delta
        self.config = types.SimpleNamespace(vocab_size=vocab)
        prior = torch.zeros(vocab, dtype=torch.float64)
        ranks = torch.arange(1, len(self.words) + 1, dtype=torch.float64)
        prior[self.words] = (1.0 / ranks) / (1.0 / ranks).sum() * LIST_MASS
        prior[3] = 1 - LIST_MASS
        self.prior = prior
        self.word_set = set(self.words)

    def forward(self, input_ids, logits_to_keep=0, **kw):
        B, T = input_ids.shape
        out = torch.empty(B, 1, self.vocab)
        for b in range(B):
            row = input_ids[b].tolist()
            pos = [i for i, t in enumerate(row) if t in self.word_set]
            cue = row[pos[-1]]
            first = pos[[row[i] for i in pos].index(cue)]
            nxt = row[pos[pos.index(first) + 1]]
            p = self.prior.clone()
            p[nxt] *= math.exp(self.delta)
            out[b, 0] = torch.log(p / p.sum()).float()
        return types.SimpleNamespace(logits=out)


def test_log_enrichment_by_hand():
    lags = np.array([-3, -2, -1, 1, 2, 3])
    ids = np.array([[10, 11, 12, 13, 14, 15], [15, 14, 13, 12, 11, 10]])
    probs = np.array([[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [0.6, 0.5, 0.4, 0.3, 0.2, 0.1]])
    e = log_enrichment(probs, ids, lags, far_lag=2)
    # far positions (|lag| = 3): word 10 → 0.1 (trial 0) and 0.1 (trial 1 at lag 3): baseline 0.1
    assert e[0, 0] == pytest.approx(0.0) and e[1, 5] == pytest.approx(0.0)
    # word 13 never sits at |lag| > 2: its baseline is the mean over all its positions (0.4, 0.4)
    assert e[0, 3] == pytest.approx(0.0)
    # word 11 (never far): baseline mean(0.2, 0.2) = 0.2; word 15: far both times, 0.6 → 0
    assert e[1, 0] == pytest.approx(0.0)
    with pytest.raises(ValueError):
        log_enrichment(probs, ids[:, :5], lags, far_lag=2)


def test_prior_model_corrected_curve(word_tokenizer):
    V = len(word_tokenizer)
    model = PriorModel(V, range(5, V), DELTA)
    lm = LoadedModel(model, word_tokenizer, {"name": "prior", "max_position_embeddings": 4096})
    cfg = LagProbeConfig(list_length=40, cue_position=20, n_permutations=24, batch_size=8, far_lag=5)
    res = run_lag_probe(lm, [Condition("intact", "intact")], cfg)
    cs = res.corrected_summary().set_index("lag")
    assert cs.loc[1, "mean"] == pytest.approx(DELTA, abs=2e-3)
    near = cs.loc[[l for l in range(-5, 6) if l != 1], "mean"]
    assert near.abs().max() < 2e-3                      # lag 0 (the cue) and the rest: at the prior
    assert cs.loc[1, "ci_high"] - cs.loc[1, "ci_low"] < 1e-2
    raw = res.summary().set_index("lag")
    rel_raw = (raw.loc[1, "ci_high"] - raw.loc[1, "ci_low"]) / raw.loc[1, "mean"]
    assert rel_raw > 0.2                                 # the raw curve is dominated by word priors
    hl = res.headline().iloc[0]
    assert hl["lag_plus1_log_enrichment"] == pytest.approx(DELTA, abs=2e-3)
    js = res.to_json()
    assert js["conditions"][0]["log_enrichment"]["lags"][1] == pytest.approx(DELTA, abs=2e-3)
    assert "far_lag" in js["config"] and js["config"]["far_lag"] == 5


def test_corrected_contrast_and_bad_far_lag(word_tokenizer):
    """Two conditions on the same trials: a paired contrast of the log-enrichment (δ vs 0)."""
    V = len(word_tokenizer)
    lm = LoadedModel(PriorModel(V, range(5, V), DELTA), word_tokenizer, {"name": "prior", "max_position_embeddings": 4096})
    cfg = LagProbeConfig(list_length=30, cue_position=15, n_permutations=8, batch_size=8, far_lag=5)
    res = run_lag_probe(lm, [Condition("intact", "intact")], cfg)
    flat = PriorModel(V, range(5, V), 0.0)
    res0 = run_lag_probe(LoadedModel(flat, word_tokenizer, {"name": "flat", "max_position_embeddings": 4096}),
                         [Condition("intact", "intact")], cfg)
    assert res0.corrected_summary().set_index("lag").loc[1, "mean"] == pytest.approx(0.0, abs=2e-3)
    with pytest.raises(InductionLabError, match="far lag"):
        LagProbeConfig(list_length=30, cue_position=15, far_lag=-1).validate()
    assert res.has_corrected
