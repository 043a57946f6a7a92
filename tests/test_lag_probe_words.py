"""The lag probe with words of several tokens (issue 34, deliverable 5): each word's first-token probability
after every cue and the whole word's log-probability at lags -R..R, from one packed forward per chunk of cues.

References are plain forwards, independent of the packing: the seed trial continued by the word's tokens
(teacher forcing), the per-token log-probabilities summed by hand; and, with words of one token, today's
single-token probe on the same lists."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import make_tiny

from inductionlab.core.ablation import Condition
from inductionlab.core.models import LoadedModel, attention_shape
from inductionlab.core.stimuli import TokenWord, single_token_words, word_pool
from inductionlab.errors import InductionLabError
from inductionlab.protocols.lag_probe import (LagProbeConfig, build_trials, make_stimulus, measure_batch,
                                              probe, run_lag_probe, word_trials)

L, CUE = 24, 12
INTACT = Condition("intact", "intact")
ABLATED = Condition("ablated", "induction", k=2, heads=[(1, 0), (0, 1)])


def train_bpe(vocab_size: int):
    """A byte-level BPE of ``vocab_size`` ids trained on wordfreq's top words: common words are 1-5 tokens, the
    leading space folded into the first (as GPT-2 / SmolLM2)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from wordfreq import top_n_list

    words = [w for w in top_n_list("en", 5000) if w.isascii() and w.isalpha()]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator([" " + w for w in words], trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<bos>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>")


@pytest.fixture(scope="module")
def bpe_tokenizer():
    """600 ids: most common words split into 2-4 tokens."""
    return train_bpe(600)


def loaded(arch, tok):
    model = make_tiny(arch, vocab_size=len(tok))
    return LoadedModel(model, tok, {"name": arch, "dtype": "float32", **attention_shape(model.config)})


def config(**kw):
    return LagProbeConfig(**{"list_length": L, "cue_position": CUE, "n_permutations": 3, "batch_size": 2,
                             "word_tokens": "2-4", "word_top_n": 5000, "cues": "all:5", **kw})


def test_word_pool_lengths_balance_and_distinct_first_tokens(bpe_tokenizer):
    pool = word_pool(bpe_tokenizer, 30, lengths=(2, 3, 4), top_n=5000)
    lengths = [len(w.ids) for w in pool]
    assert [lengths.count(n) for n in (2, 3, 4)] == [10, 10, 10]
    assert len({w.ids[0] for w in pool}) == 30
    for w in pool:    # the ids are the word's own tokenisation with the list's leading space
        assert tuple(bpe_tokenizer.encode(" " + w.text, add_special_tokens=False)) == w.ids


def test_a_length_short_of_its_share_leaves_the_rest_to_the_others():
    from wordfreq import top_n_list

    tok = train_bpe(3000)                 # a larger vocabulary: few words of 4 tokens
    first, c4 = set(), 0                  # every 4-token word with a new first token, counted by hand
    for w in top_n_list("en", 5000):
        if w.isascii() and w.isalpha() and len(w) >= 2:
            ids = tok.encode(" " + w, add_special_tokens=False)
            if len(ids) == 4 and ids[0] not in first:
                first.add(ids[0])
                c4 += 1
    assert 5 <= c4 < 60
    n = 2 * c4 + 40                       # shares c4 + 20 each: four-token words fall 20 short
    pool = word_pool(tok, n, lengths=(2, 4), top_n=5000)
    lengths = [len(w.ids) for w in pool]
    assert len(pool) == n and lengths.count(4) == c4 and lengths.count(2) == n - c4
    assert len({w.ids[0] for w in pool}) == n
    assert [w.zipf for w in pool] == sorted((w.zipf for w in pool), reverse=True)   # most frequent first


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("sep", [" ", ", "])
def test_whole_word_logp_is_the_teacher_forced_sum(bpe_tokenizer, arch, sep):
    lm = loaded(arch, bpe_tokenizer)
    cfg = config(separator=sep)
    trials = build_trials(lm, cfg)
    t = trials.tensors
    with torch.inference_mode():
        out = measure_batch(lm.model, dict(t), cfg)
    stim = make_stimulus(bpe_tokenizer, sep)
    lags = cfg.word_lag_list()
    cues = cfg.cue_positions()
    assert out["word_logp"].shape == (3, len(cues), len(lags))
    assert int(t["word_len"].max()) == 4 and int(t["word_len"].min()) == 2
    checked = 0
    for r in range(3):
        words = [t["word_ids"][r, j, :t["word_len"][r, j]].tolist() for j in range(L)]
        for ci_, c in enumerate(cues):
            prompt = t["ids"][r].tolist() + stim.sep_ids + words[c - 1] + stim.sep_ids
            for kk, k in enumerate(lags):
                got = float(out["word_logp"][r, ci_, kk])
                if not 1 <= c + k <= L:
                    assert np.isnan(got)
                    continue
                target = words[c + k - 1]
                with torch.no_grad():
                    lp = torch.log_softmax(lm.model(torch.tensor([prompt + target])).logits[0].double(), -1)
                want = sum(float(lp[len(prompt) - 1 + i, tok]) for i, tok in enumerate(target))
                assert got == pytest.approx(want, abs=2e-4)
                checked += 1
            # the first-token reading: every list word's first token after the cue
            with torch.no_grad():
                p = torch.softmax(lm.model(torch.tensor([prompt])).logits[0, -1].double(), -1)
            np.testing.assert_allclose(out["cue_probs"][r, ci_].numpy(), p[t["list_ids"][r]].numpy(), atol=1e-6)
    assert checked > 3 * len(cues) * 3


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_one_token_words_give_the_single_token_probe(word_tokenizer, arch):
    """Words of one token through the multi-token path: its first-token reading is the single-token probe's value
    (same lists, same cues, intact and ablated), and the whole word's log-probability is its log."""
    lm = loaded(arch, word_tokenizer)
    single = replace(config(word_tokens="1"), method="zero")
    classic = run_lag_probe(lm, [INTACT, ABLATED], single)
    pool = [TokenWord(w.text, (w.token_id,), w.zipf) for w in single_token_words(word_tokenizer, L)]
    multi = replace(single, word_tokens="2-4")          # the multi-token path, here with one-token words
    trials = word_trials(lm, multi, pool)
    data = probe(multi).run(lm, [INTACT, ABLATED], trials)
    lags = multi.word_lag_list()
    cues = np.asarray(multi.cue_positions())
    for name in ("intact", "ablated"):
        np.testing.assert_array_equal(data[name]["list_ids"], classic.list_ids)
        np.testing.assert_allclose(data[name]["cue_probs"], classic.cue_probs[name], atol=1e-5)
        np.testing.assert_allclose(data[name]["probs"], classic.probs[name], atol=1e-5)
        for kk, k in enumerate(lags):
            j = cues + k
            ok = (j >= 1) & (j <= L)
            want = np.log(classic.cue_probs[name][:, ok, j[ok] - 1].astype(np.float64))
            np.testing.assert_allclose(data[name]["word_logp"][:, ok, kk], want, atol=1e-4)
            assert np.isnan(data[name]["word_logp"][:, ~ok, kk]).all()
    assert not np.allclose(data["intact"]["cue_probs"], data["ablated"]["cue_probs"])


def test_run_records_both_readings(bpe_tokenizer):
    lm = loaded("llama", bpe_tokenizer)
    res = run_lag_probe(lm, [INTACT, ABLATED], config(method="zero"))
    j = res.to_json()
    assert j["whole_word"]["token_lengths"] == [2, 3, 4]
    row = next(r for r in j["whole_word"]["by_lag"] if r["condition"] == "intact" and r["lag"] == 1
               and r["measure"] == "p")
    cp = np.asarray(res.cue_positions)
    v = np.exp(res.word_logp["intact"][:, cp + 1 <= L, 3].astype(np.float64)).mean(1)
    assert row["mean"] == pytest.approx(v.mean(), rel=1e-6)
    assert res.word_lengths.shape == (3, L)
    assert len(res.words) == L and res.headline().shape[0] == 2


def test_a_pool_too_small_is_refused(word_tokenizer, bpe_tokenizer):
    lm = loaded("llama", word_tokenizer)            # every word one token: none of 2-4
    with pytest.raises(InductionLabError, match=r"no words of 2 tokens.*--word-tokens"):
        build_trials(lm, config())
    with pytest.raises(InductionLabError, match=r"word pool too small.*--list-length.*--word-tokens"):
        build_trials(loaded("llama", bpe_tokenizer), config(list_length=1000))
    with pytest.raises(InductionLabError, match="word pool too small: only"):
        word_pool(bpe_tokenizer, 3000, lengths=(4,), top_n=5000)


@pytest.mark.parametrize("kw, match", [
    ({"word_tokens": "two"}, "--word-tokens 'two'"), ({"word_tokens": "0-3"}, "--word-tokens"),
    ({"resample_words": True}, "--resample-words needs --word-tokens 1"),
    ({"method": "resample", "cues": "seed"}, "--method resample needs --word-tokens 1"),
    ({"word_lags": -1}, "--word-lags -1")])
def test_bad_word_options_are_refused(kw, match):
    with pytest.raises(InductionLabError, match=match):
        config(**kw).validate()


def test_token_lengths_parse():
    assert config(word_tokens="2-4").token_lengths() == (2, 3, 4)
    assert config(word_tokens="3,2").token_lengths() == (2, 3)
    assert not config(word_tokens="1").multi_token and config(word_tokens="2").multi_token
    assert config(word_tokens="1").trial_tokens == L + 4
