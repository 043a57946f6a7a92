"""Perplexity on the MD5 held-out split against a by-hand computation; tokenizer mismatch refused."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from inductionlab.data.shards import prepare_corpus
from inductionlab.errors import InductionLabError
from inductionlab.protocols.perplexity import heldout_perplexity

WORDS = "the king queen castle sword river night morning letter crown ship storm garden horse".split()


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    rng = np.random.default_rng(0)
    docs = [f"Document {i}. " + " ".join(rng.choice(WORDS, size=int(rng.integers(20, 60)))) for i in range(80)]
    d = tmp_path_factory.mktemp("corpus")
    (d / "c.jsonl").write_text("".join(json.dumps({"text": x}) + "\n" for x in docs))
    return prepare_corpus(d / "c.jsonl", d / "shards", vocab_size=300, heldout_fraction=0.25, seed=0)


@pytest.fixture(scope="module")
def model(shards):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=shards.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(cfg).eval()


def by_hand(model, stream, context):
    """exp(mean −log p) over every window's tokens but the first, one window at a time."""
    total, n = 0.0, 0
    for s in range(0, len(stream), context):
        w = torch.as_tensor(np.asarray(stream[s:s + context], np.int64))[None]
        if w.shape[1] < 2:
            continue
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=w).logits[0, :-1].double(), -1)
        total -= logp[torch.arange(w.shape[1] - 1), w[0, 1:]].sum().item()
        n += w.shape[1] - 1
    return math.exp(total / n), n


def test_perplexity_by_hand(shards, model):
    r = heldout_perplexity(model, shards, tokenizer=shards.hf_tokenizer(), context=50, batch_size=3)
    ppl, n = by_hand(model, shards.heldout, 50)
    N = len(shards.heldout)
    assert r["n_tokens"] == N and r["n_scored"] == n
    assert r["n_windows"] == -(-N // 50) and r["n_scored"] == N - r["n_windows"] - (N % 50 == 1)
    assert r["perplexity"] == pytest.approx(ppl, rel=1e-4)
    assert 100 < r["perplexity"] < 1000          # a random model: near the vocabulary size (~300)


def test_max_tokens_exact(shards, model):
    r = heldout_perplexity(model, shards, context=16, max_tokens=40)
    ppl, n = by_hand(model, shards.heldout[:40], 16)
    assert (r["n_tokens"], r["n_scored"], r["n_windows"]) == (40, 37, 3) and n == 37
    assert r["perplexity"] == pytest.approx(ppl, rel=1e-4)


def test_tokenizer_mismatch_refused(shards, model, word_tokenizer):
    with pytest.raises(InductionLabError, match="not with the model's tokenizer.*corpus prepare"):
        heldout_perplexity(model, shards, tokenizer=word_tokenizer)
    from transformers import LlamaConfig, LlamaForCausalLM
    small = LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    with pytest.raises(InductionLabError, match=r"ids but the model has 100"):
        heldout_perplexity(small, shards)
    with pytest.raises(InductionLabError, match="context must be between"):
        heldout_perplexity(model, shards, context=1000)
