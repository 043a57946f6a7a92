"""The semi-synthetic bigram corpus (issue 19 A; Aoyama, Wilcox & Schneider, arXiv 2511.16893):
realised repetition and reliability against the options, the bigram statistics at repetition 0,
determinism under a seed, the manifest, and the CLI's bad inputs."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from inductionlab.cli import main
from inductionlab.data.shards import TokenShards
from inductionlab.data.synth_bigram import (BigramTable, new_token_rate, prepare_synth_bigram,
                                            sample_sequences)
from inductionlab.errors import InductionLabError
from test_train_helpers import make_corpus


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("src"))


def zipf_table(V=200, n=100_000, seed=0):
    rng = np.random.default_rng(seed)
    return BigramTable(rng.zipf(1.3, size=n) % V, V, None)


def counts_by_hand(seqs, start):
    """Per sequence: (positions, repeats, repeats followed by a next token, copies), counted with
    Python sets (independent of the library's vectorised code): x_i is a repeat when it occurred
    before position i; it is copied when x_{i+1} followed an earlier occurrence of x_i."""
    out = []
    for s in seqs.tolist():
        r = [s[i] in s[:i] for i in range(start, len(s))]
        c = [s[i + 1] in {s[j + 1] for j in range(i) if s[j] == s[i]}
             for i in range(start, len(s) - 1) if s[i] in s[:i]]
        out.append((len(r), sum(r), len(c), sum(c)))
    return np.array(out, dtype=float)


def pooled(num, den):
    """Pooled ratio sum(num)/sum(den) over independent sequences and its standard error
    (the ratio estimator's linearisation: sd of num - R den, over mean den, over sqrt(n))."""
    R = num.sum() / den.sum()
    return R, (num - R * den).std(ddof=1) / den.mean() / math.sqrt(len(num))


def rates_by_hand(seqs, start):
    c = counts_by_hand(seqs, start)
    return pooled(c[:, 1], c[:, 0]), pooled(c[:, 3], c[:, 2])


def test_new_token_rate_keeps_the_repetition_rate_fixed():
    # r = r q + e (1 - r q) at r = p: e = p (1 - q) / (1 - p q); p = q = 0.9 gives 0.09 / 0.19
    assert new_token_rate(0.9, 0.9) == pytest.approx(0.09 / 0.19)
    assert new_token_rate(0.5, 0.0) == 0.5 and new_token_rate(0.0, 0.7) == 0.0 and new_token_rate(1, 1) == 1.0
    for p, q in ((0.3, 0.6), (0.8, 0.2)):
        e = new_token_rate(p, q)
        assert p * q + e * (1 - p * q) == pytest.approx(p)


@pytest.mark.parametrize("p,q", [(0.9, 0.9), (0.5, 0.8), (0.3, 0.2), (0.8, 0.5)])
def test_realised_repetition_and_reliability_match_the_options(p, q):
    seqs, fb = sample_sequences(zipf_table(), 600, 63, p, q, np.random.default_rng(1))
    assert fb == {"no_repeat_candidate": 0, "no_new_candidate": 0}
    (rep, rep_se), (rel, rel_se) = rates_by_hand(seqs, 31)
    # sequences are independent: within 4 standard errors of the pooled rates
    assert abs(rep - p) < 4 * rep_se and abs(rel - q) < 4 * rel_se
    assert rep_se < 0.02 and rel_se < 0.02                               # the check has teeth
    # the first half never repeats a token, and no token directly repeats itself
    assert all(len(set(s[:31])) == 31 for s in seqs.tolist())
    assert not (seqs[:, 1:] == seqs[:, :-1]).any()


def test_extreme_options_are_exact():
    t = zipf_table()
    none, _ = sample_sequences(t, 200, 40, 0.0, 0.9, np.random.default_rng(2))
    assert all(len(set(s)) == 40 for s in none.tolist())                 # no repeat anywhere
    every, _ = sample_sequences(t, 200, 40, 1.0, 1.0, np.random.default_rng(2))
    (rep, _), (rel, _) = rates_by_hand(every, 20)
    assert rep == 1.0 and rel == 1.0


def test_repetition_zero_keeps_the_source_bigram_frequencies():
    # a source chain a -> a+1 (prob 0.7) or a+2 (0.3) mod 300: within 50 tokens it never returns to a
    # used token, so the no-repeat rule never binds and the output's bigrams are the source's.
    rng = np.random.default_rng(3)
    V, steps = 300, rng.choice([1, 2], p=[0.7, 0.3], size=200_000)
    stream = np.cumsum(steps) % V
    src_p1 = np.mean((np.diff(stream) % V) == 1)                         # the source's own frequency
    seqs, _ = sample_sequences(BigramTable(stream, V, None), 2000, 50, 0.0, 0.5, np.random.default_rng(4))
    d = (np.diff(seqs, axis=1) % V).ravel()
    n = d.size
    assert abs(np.mean(d == 1) - src_p1) < 4 * math.sqrt(0.21 / n) + 4 * math.sqrt(0.21 / stream.size)
    assert np.mean((d != 1) & (d != 2)) < 1e-3                          # only the smoothing (1e-6 per token)
    # per source token too: P(a+1 | a) for the ten most frequent tokens
    first = seqs[:, :-1].ravel()
    for a in np.bincount(first, minlength=V).argsort()[-10:]:
        m = first == a
        assert abs(np.mean(d[m] == 1) - 0.7) < 4 * math.sqrt(0.21 / m.sum()) + 0.01
    # the first token follows the unigram frequencies: here uniform over 300 tokens
    assert len(np.unique(seqs[:, 0])) > 250


def test_bigram_table_counts_pairs_within_documents_only():
    eos = 0
    t = np.array([1, 2, 3, eos, 2, 3, eos, 3, 1])
    tab = BigramTable(t, 5, eos, alpha=0.0)
    assert tab.counts[1, 2] == 1 and tab.counts[2, 3] == 2 and tab.counts[3, 1] == 1
    assert tab.counts[3, eos] == 0 and tab.counts[eos].sum() == 0
    np.testing.assert_allclose(tab.probs[2], [0, 0, 0, 1, 0])
    np.testing.assert_allclose(tab.unigram, [0, 2 / 7, 2 / 7, 3 / 7, 0])
    assert not tab.support[eos] and not tab.support[4]


def test_corpus_is_deterministic_and_its_manifest_records_everything(source, tmp_path):
    kw = dict(repetition=0.7, reliability=0.8, tokens=5000, seq_len=16, heldout_tokens=500)
    a = prepare_synth_bigram(source, tmp_path / "a", seed=3, **kw)
    b = prepare_synth_bigram(source, tmp_path / "b", seed=3, **kw)
    c = prepare_synth_bigram(source, tmp_path / "c", seed=4, **kw)
    assert np.array_equal(a.train, b.train) and np.array_equal(a.heldout, b.heldout)
    assert not np.array_equal(a.train, c.train)
    src = TokenShards.open(source)
    m = a.manifest
    g = m["generator"]
    assert (g["repetition"], g["reliability"], g["seed"], g["seq_len"], g["alpha"]) == (0.7, 0.8, 3, 16, 1e-6)
    assert m["source"]["from_corpus_sha256"] == src.manifest["corpus_sha256"]
    assert m["source"]["from_train_sha256"] == src.manifest["splits"]["train"]["sha256"]
    assert m["tokenizer"] == src.manifest["tokenizer"] and a.vocab_size == src.vocab_size
    assert m["corpus_sha256"] == m["splits"]["train"]["sha256"] != c.manifest["corpus_sha256"]
    a.verify()
    # 5000 tokens -> 313 documents of 15 sampled tokens + EOS; EOS exactly at every 16th position
    assert m["splits"]["train"]["documents"] == 313 and len(a.train) == 313 * 16
    docs = np.asarray(a.train).reshape(313, 16)
    assert (docs[:, -1] == a.eos_id).all() and not (docs[:, :-1] == a.eos_id).any()
    assert len(a.heldout) == 32 * 16 and not np.array_equal(np.asarray(a.heldout)[:16], docs[0])
    (rep, rep_se), (rel, rel_se) = rates_by_hand(docs[:, :-1], 7)
    assert g["realised"]["train"]["repetition"] == pytest.approx(rep)
    assert g["realised"]["train"]["reliability"] == pytest.approx(rel)
    assert abs(rep - 0.7) < 4 * rep_se and abs(rel - 0.8) < 4 * rel_se
    # only tokens of the source's training split occur (EOS only at the ends)
    tab = BigramTable(np.asarray(src.train), src.vocab_size, src.eos_id, alpha=0.0)
    assert tab.support[docs[:, :-1]].all()


def test_training_windows_are_the_sequences(source, tmp_path):
    from inductionlab.data.curriculum import BiInductStream, CurriculumConfig
    s = prepare_synth_bigram(source, tmp_path / "s", repetition=0.5, reliability=0.5, tokens=2048, seq_len=16,
                             heldout_tokens=0)
    stream = BiInductStream.from_shards(s, CurriculumConfig(variant="none"), batch_size=4, seq_len=16,
                                        total_tokens=2048)
    b = stream.batch(1)
    np.testing.assert_array_equal(np.asarray(b.input_ids), np.asarray(s.train[64:128]).reshape(4, 16))


def test_api_errors(source, tmp_path):
    with pytest.raises(InductionLabError, match="--reliability must be a probability"):
        prepare_synth_bigram(source, tmp_path / "x", repetition=0.5, reliability=-0.1, tokens=100, seq_len=16)
    with pytest.raises(InductionLabError, match="not a prepared corpus"):
        prepare_synth_bigram(tmp_path, tmp_path / "x", repetition=0.5, reliability=0.5, tokens=100, seq_len=16)
    with pytest.raises(InductionLabError, match="distinct tokens"):
        prepare_synth_bigram(source, tmp_path / "x", repetition=0.5, reliability=0.5, tokens=10_000, seq_len=4000)
    with pytest.raises(InductionLabError, match="vocabularies up to"):
        BigramTable(np.arange(10), 70_000, None)
    assert not (tmp_path / "x").exists()


def test_cli_writes_the_corpus(source, tmp_path):
    out = tmp_path / "cli"
    r = CliRunner().invoke(main, ["corpus", "prepare", "synth-bigram", "--from", str(source), "--repetition", "0.9",
                                  "--reliability", "0.9", "--tokens", "3000", "--seq-len", "16", "--seed", "2",
                                  "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "repetition 0.9 (realised" in r.output and "reliability 0.9" in r.output
    m = json.loads((out / "manifest.json").read_text())
    assert m["generator"]["seed"] == 2 and m["generator"]["tokens_requested"] == 3000


@pytest.mark.parametrize("args,msg", [
    (["--repetition", "1.2"], "--repetition must be a probability in [0, 1]"),
    (["--reliability", "nan"], "--reliability must be a finite number"),
    (["--tokens", "5"], "--tokens must be >= --seq-len"),
    (["--seq-len", "4"], "--seq-len must be >= 8"),
    (["--alpha", "-1"], "--alpha must be >= 0"),
    (["--heldout-tokens", "-1"], "--heldout-tokens must be >= 0"),
    (["--vocab-size", "300"], "--vocab-size: not used by synth-bigram"),
    (["--repetition", None], "synth-bigram needs --repetition"),
])
def test_cli_bad_inputs_one_line_exit_2_nothing_written(source, tmp_path, args, msg):
    base = {"--from": str(source), "--repetition": "0.5", "--reliability": "0.5", "--tokens": "1000",
            "--seq-len": "16"}
    for k, v in zip(args[::2], args[1::2]):
        base[k] = v
    flat = [x for k, v in base.items() if v is not None for x in (k, v)]
    out = tmp_path / "bad"
    r = CliRunner().invoke(main, ["corpus", "prepare", "synth-bigram", *flat, "--out", str(out)])
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and msg in lines[0], r.output
    assert not out.exists() and not list(tmp_path.glob(".bad*"))


def test_cli_synth_options_need_synth_source(tmp_path):
    r = CliRunner().invoke(main, ["corpus", "prepare", "demo", "--repetition", "0.5", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "--repetition: only for SOURCE synth-bigram" in r.output
