"""Lag-probe bookkeeping on fake models whose answer is known exactly."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from inductionlab.core.ablation import Condition
from inductionlab.errors import InductionLabError
from inductionlab.protocols.lag_probe import LagProbeConfig, build_trials, make_stimulus, run_lag_probe
from inductionlab.core.models import LoadedModel


class CopyModel(torch.nn.Module):
    """Next-token distribution one-hot on the word at a fixed lag from the cue's first occurrence.

    The cue is the last token that is a list word; ``shift=+1`` is a perfect induction copier.
    """

    def __init__(self, vocab: int, word_ids, shift: int):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.vocab, self.words, self.shift = vocab, set(int(i) for i in word_ids), shift
        self.config = types.SimpleNamespace(vocab_size=vocab)

    def forward(self, input_ids, logits_to_keep=0, **kw):
        B, T = input_ids.shape
        logits = torch.full((B, 1, self.vocab), -1e4)
        for b in range(B):
            row = input_ids[b].tolist()
            pos = [i for i, t in enumerate(row) if t in self.words]
            cue = row[pos[-1]]
            first = pos[[row[i] for i in pos].index(cue)]
            target = row[pos[pos.index(first) + self.shift]]
            logits[b, 0, target] = 1e4
        return types.SimpleNamespace(logits=logits)


def loaded_fake(word_tokenizer, shift, list_length=20):
    model = CopyModel(len(word_tokenizer), range(5, len(word_tokenizer)), shift)  # ids 0-4: specials, "," "."
    return LoadedModel(model, word_tokenizer, {"name": "fake", "max_position_embeddings": 4096})


@pytest.mark.parametrize("shift,separator", [(1, " "), (-1, " "), (3, ", "), (1, "\n")])
def test_one_hot_lag_model(word_tokenizer, shift, separator):
    lm = loaded_fake(word_tokenizer, shift)
    cfg = LagProbeConfig(list_length=20, cue_position=10, n_permutations=6, batch_size=4, separator=separator)
    res = run_lag_probe(lm, [Condition("intact", "intact")], cfg)
    summ = res.summary()
    curve = summ.set_index("lag")["mean"]
    assert curve[shift] == pytest.approx(1.0)
    assert curve.drop(shift).abs().max() == 0.0
    np.testing.assert_allclose(res.list_mass["intact"], 1.0)
    assert (res.argmax_lag["intact"] == shift).all()
    row = res.headline().iloc[0]
    assert row["lag_plus1"] == pytest.approx(1.0 if shift == 1 else 0.0)
    assert row["lag_minus1"] == pytest.approx(1.0 if shift == -1 else 0.0)
    js = res.to_json()["conditions"][0]
    assert js["lags"][shift] == pytest.approx(1.0) and js["ci95"][shift] == pytest.approx([1.0, 1.0])


def test_trials_are_permutations_of_a_fixed_set(word_tokenizer):
    lm = loaded_fake(word_tokenizer, 1)
    cfg = LagProbeConfig(list_length=30, cue_position=12, n_permutations=5)
    tr = build_trials(lm, cfg)
    ids, lists, words = tr.tensors["ids"], tr.tensors["list_ids"], tr.words
    assert len(words) == 30 and ids.shape == (5, 1 + 30 + 1)
    sets = {frozenset(r.tolist()) for r in lists}
    assert len(sets) == 1 and len({tuple(r.tolist()) for r in lists}) == 5
    assert (ids[:, -1] == lists[:, 11]).all() and (ids[:, 0] == word_tokenizer.bos_token_id).all()
    assert torch.equal(ids, build_trials(lm, cfg).tensors["ids"])
    re = build_trials(lm, LagProbeConfig(list_length=30, cue_position=12, n_permutations=5, resample_words=True,
                                         pool_size=200))
    re_lists, re_words = re.tensors["list_ids"], re.words
    assert re_words == [] and len({frozenset(r.tolist()) for r in re_lists}) == 5


def test_stimulus_layout(word_tokenizer):
    st = make_stimulus(word_tokenizer, ", ", instruction="the list")
    comma = word_tokenizer.convert_tokens_to_ids(",")
    assert st.sep_ids == [comma] and st.word_prefix == " "
    assert st.prefix_ids[0] == word_tokenizer.bos_token_id and len(st.prefix_ids) == 3
    assert st.trial([11, 12, 13], 2) == st.prefix_ids + [11, comma, 12, comma, 13, comma, 12, comma]


def test_bad_inputs(word_tokenizer):
    lm = loaded_fake(word_tokenizer, 1)
    with pytest.raises(InductionLabError, match="word pool too small"):
        build_trials(lm, LagProbeConfig(list_length=5000, cue_position=10, n_permutations=2))
    lm.identity["max_position_embeddings"] = 16
    with pytest.raises(InductionLabError, match="exceeds the model's context of 16"):
        build_trials(lm, LagProbeConfig(list_length=20, cue_position=10, n_permutations=2))
    with pytest.raises(InductionLabError, match="at least 2 trials"):
        LagProbeConfig(n_permutations=1).validate()
    with pytest.raises(InductionLabError, match="outside a list"):
        build_trials(lm, LagProbeConfig(list_length=20, cue_position=21, n_permutations=2))
