"""Semi-synthetic "natural-but-tunable" text: sequences sampled from a prepared corpus's own bigram
statistics, with a set repetition probability P(A B … A) and reliability P(B | A B … A).

Source: Aoyama, Wilcox & Schneider, "Predicting the emergence of induction heads" (arXiv
2511.16893), generator ``DataGenerator.generate_sequences`` in ``src/data/data_generator.py`` of
their public repository t-aoyam/predict-ih-review (read at commit fef1d6f). What is kept from it:

* each sequence's first half is sampled from the bigram chain with no token repeated (so every
  repetition in a sequence is one the generator placed);
* in the second half, at every step, when the previous token ``A`` already occurred earlier
  (``A B … A``), the next token is, with probability ``reliability``, one of the tokens that followed
  ``A`` before (the distinct ones, weighted by the bigram probability ``P(B | A)``); otherwise it is
  a token that did not follow ``A`` before: with probability ``e`` a token seen earlier in the
  sequence (starting a new ``A B … A``), else a token not yet seen; when the previous token is new,
  the next one is a seen token with probability ``e``, else a new one;
* every choice is drawn from the bigram row of the previous token, restricted to the allowed set;
  the bigram probabilities are smoothed additively by ``alpha`` (theirs: 1e-6 for natural text).

What differs: under these rules their ``e = p / (1 + q)`` gives the repetition rate
``p / (1 − q² + pq)``, equal to ``p`` only when ``p = q``. Here ``e = p(1 − q) / (1 − pq)``, the value for which the repetition rate
``r_i = P(x_i occurred earlier)`` is a fixed point, ``r = rq + e(1 − rq)``, and the first
second-half position draws a repeat with probability ``p`` itself, so ``r_i = p`` at *every*
second-half position (not only in the limit); the reliability is ``q`` by construction. A token
never directly repeats itself (no ``A A``), as in theirs. The bigram table and the first-token
distribution (the unigram frequencies, the empirical stationary distribution; theirs: the
eigenvector of the transition matrix) come from the source's training split, pairs across a
document boundary (EOS) left out; only tokens that occur there are ever sampled, EOS never.

With ``repetition = 0`` no token repeats within a sequence: each token follows the source's bigram
row restricted to the tokens not yet in the sequence, which is the source's bigram row itself
whenever no likely continuation has been used up (on natural text it has, for frequent tokens).

Output: a prepared corpus (:mod:`inductionlab.data.shards` format) whose documents are
``seq_len − 1`` sampled tokens followed by EOS, so training windows of ``seq_len`` tokens (the
stream is read in consecutive windows) each hold one sequence; the held-out split is more
sequences from an independent stream of the same seed.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import opt
from ..errors import InductionLabError
from ..runtime.outputs import check_output_dir
from ..runtime.runs import atomic_write_json, own_entries, sha256_file, staged_run_dir, versions
from .shards import FORMAT, SPLITS, TokenShards

GENERATOR = "synth-bigram/1"
SOURCE = "Aoyama, Wilcox & Schneider, arXiv 2511.16893; github.com/t-aoyam/predict-ih-review src/data/data_generator.py"
MAX_VOCAB = 8192           # the bigram table is dense: vocab² int64 counts + float64 probabilities (1 GiB here)
CHUNK = 2048               # sequences sampled together; part of the seed stream, so fixed
DEFAULT_HELDOUT_TOKENS = 65536
_SPLIT_CODE = {"train": 0, "heldout": 1}


def new_token_rate(repetition: float, reliability: float) -> float:
    """``e = p(1 − q) / (1 − pq)``: the probability of starting a new ``A B … A`` that keeps the
    repetition rate at ``p`` with reliability ``q`` (module docstring); 1 when ``p = q = 1``."""
    p, q = float(repetition), float(reliability)
    return 1.0 if p * q >= 1.0 else p * (1.0 - q) / (1.0 - p * q)


def check_options(repetition: float, reliability: float, tokens: int, seq_len: int, alpha: float,
                  heldout_tokens: int, seed: int) -> None:
    """Range checks (each message names the option and the fix).

    Raises:
        InductionLabError: a probability outside [0, 1], ``tokens < seq_len``, ``seq_len < 8``,
            ``alpha < 0``, ``heldout_tokens < 0`` or ``seed < 0``.
    """
    for name, v in (("--repetition", repetition), ("--reliability", reliability)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and 0.0 <= v <= 1.0):
            raise InductionLabError(f"{name} must be a probability in [0, 1], got {v}")
    if seq_len < 8:
        raise InductionLabError(f"--seq-len must be >= 8 (a sequence needs a first half to repeat from), got {seq_len}")
    if tokens < seq_len:
        raise InductionLabError(f"--tokens must be >= --seq-len ({seq_len}) for at least one sequence, got {tokens}")
    if not (math.isfinite(alpha) and alpha >= 0):
        raise InductionLabError(f"--alpha must be >= 0, got {alpha}")
    if heldout_tokens < 0:
        raise InductionLabError(f"--heldout-tokens must be >= 0, got {heldout_tokens}")
    if seed < 0:
        raise InductionLabError(f"--seed must be >= 0, got {seed}")


class BigramTable:
    """Bigram statistics of a token stream.

    Attributes:
        probs: ``[V, V]`` float64, row ``a`` = P(next = b | a), smoothed by ``alpha`` over the
            support and renormalised; rows of tokens outside the support are zero.
        unigram: ``[V]`` float64, the frequency of each token (the first-token distribution).
        support: ``[V]`` bool, tokens that occur in the stream (EOS excluded).
        counts: ``[V, V]`` int64 raw pair counts (no smoothing).
    """

    def __init__(self, tokens: np.ndarray, vocab_size: int, eos_id: int | None, alpha: float = 1e-6):
        """``tokens``: 1-D ids < ``vocab_size``; pairs with EOS on either side are not counted.

        Raises:
            InductionLabError: ``vocab_size`` above :data:`MAX_VOCAB` (dense table), or fewer
                than two distinct tokens.
        """
        V = int(vocab_size)
        if V > MAX_VOCAB:
            raise InductionLabError(f"synth-bigram keeps a dense bigram table and supports vocabularies up to "
                                    f"{MAX_VOCAB} tokens, the source has {V}; prepare the source with a smaller "
                                    "--vocab-size")
        t = np.asarray(tokens, dtype=np.int64)
        uni = np.bincount(t, minlength=V).astype(np.int64)
        a, b = t[:-1], t[1:]
        keep = np.ones(a.shape, bool) if eos_id is None else (a != eos_id) & (b != eos_id)
        counts = np.bincount(a[keep] * V + b[keep], minlength=V * V).reshape(V, V)
        if eos_id is not None:
            uni[eos_id] = 0
        support = uni > 0
        if support.sum() < 2:
            raise InductionLabError("the source corpus has fewer than two distinct tokens; use a real corpus")
        probs = counts.astype(np.float64)
        probs[:, ~support] = 0.0
        rs = probs.sum(1, keepdims=True)
        probs = np.divide(probs, rs, out=np.zeros_like(probs), where=rs > 0)
        probs[support] += alpha * support          # additive smoothing over the support
        probs[~support] = 0.0
        rs = probs.sum(1, keepdims=True)
        self.probs = np.divide(probs, rs, out=np.zeros_like(probs), where=rs > 0)
        self.unigram = uni / uni.sum()
        self.support = support
        self.counts = counts
        self.alpha = float(alpha)
        self.vocab_size = V


def _choose(weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One index per row of ``weights`` [n, V] (non-negative, each row with positive sum), drawn
    with probability proportional to the weight (inverse CDF)."""
    c = np.cumsum(weights, axis=1)
    u = rng.random(len(weights)) * c[:, -1]
    return np.minimum((c <= u[:, None]).sum(1), weights.shape[1] - 1)


def sample_sequences(table: BigramTable, n: int, length: int, repetition: float, reliability: float,
                     rng: np.random.Generator) -> tuple[np.ndarray, dict]:
    """Sample ``n`` sequences of ``length`` tokens (module docstring for the rule).

    Returns:
        ``(tokens [n, length] int64, counts)``; ``counts`` holds the number of fall-backs:
        ``"no_repeat_candidate"`` (a repeat was drawn but every seen token was excluded: a new
        token was used) and ``"no_new_candidate"`` (no unseen token left with positive weight:
        uniform over the unseen support, or a seen one if none is left).
    """
    V, P, sup = table.vocab_size, table.probs, table.support
    p, q = float(repetition), float(reliability)
    e = new_token_rate(p, q)
    h = length // 2
    x = np.zeros((n, length), np.int64)
    seen = np.zeros((n, V), bool)        # tokens at positions <= i-1
    seen2 = np.zeros((n, V), bool)       # tokens at positions <= i-2
    rows = np.arange(n)
    fb = {"no_repeat_candidate": 0, "no_new_candidate": 0}
    x[:, 0] = _choose(np.broadcast_to(table.unigram, (n, V)), rng)
    seen[rows, x[:, 0]] = True

    def fresh(idx: np.ndarray, prev: np.ndarray) -> np.ndarray:
        w = P[prev] * ~seen[idx]
        empty = w.sum(1) <= 0
        if empty.any():
            fb["no_new_candidate"] += int(empty.sum())
            alt = sup & ~seen[idx[empty]]
            none_left = ~alt.any(1)
            alt[none_left] = sup & (np.arange(V) != prev[empty][none_left, None])
            w[empty] = alt
        return _choose(w, rng)

    for i in range(1, length):
        prev = x[:, i - 1]
        out = np.empty(n, np.int64)
        if i < h:
            out[:] = fresh(rows, prev)
        else:
            rep_prev = seen2[rows, prev]
            u_copy, u_new = rng.random(n), rng.random(n)
            rate = p if i == h else e
            copy = rep_prev & (u_copy < q)
            make_rep = ~copy & (u_new < rate)
            new = ~copy & ~make_rep
            if copy.any() or (make_rep & rep_prev).any():
                # continuations of A = prev: tokens at j+1 for j <= i-2 with x_j = A
                need = np.flatnonzero(rep_prev)
                hit = x[need, : i - 1] == prev[need, None]
                r_, j_ = np.nonzero(hit)
                cont = np.zeros((len(need), V), bool)
                cont[r_, x[need[r_], j_ + 1]] = True
                pos = np.full(n, -1)
                pos[need] = np.arange(len(need))
            if copy.any():
                idx = np.flatnonzero(copy)
                out[idx] = _choose(P[prev[idx]] * cont[pos[idx]], rng)
            if make_rep.any():
                idx = np.flatnonzero(make_rep)
                allowed = seen2[idx].copy()
                allowed[np.arange(len(idx)), prev[idx]] = False
                rp = rep_prev[idx]
                if rp.any():
                    allowed[rp] &= ~cont[pos[idx[rp]]]
                w = P[prev[idx]] * allowed
                ok = w.sum(1) > 0
                if (~ok).any():
                    fb["no_repeat_candidate"] += int((~ok).sum())
                    new[idx[~ok]] = True
                if ok.any():
                    out[idx[ok]] = _choose(w[ok], rng)
            if new.any():
                idx = np.flatnonzero(new)
                out[idx] = fresh(idx, prev[idx])
        x[:, i] = out
        seen2[rows, prev] = True
        seen[rows, out] = True
    return x, fb


def repetition_stats(seqs: np.ndarray, start: int) -> dict:
    """Realised rates over positions ``i >= start`` of each row of ``seqs`` [n, L]:
    ``repetition`` = P(x_i occurred earlier in its row), ``reliability`` = P(x_{i+1} followed an
    earlier occurrence of x_i | x_i occurred earlier), with the counts they are made of."""
    n, L = seqs.shape
    rep = rel_hits = rel_n = rep_n = 0
    for i in range(start, L):
        cur = seqs[:, i]
        earlier = (seqs[:, :i] == cur[:, None])
        is_rep = earlier.any(1)
        rep += int(is_rep.sum())
        rep_n += n
        if i + 1 < L:
            nxt = seqs[:, i + 1]
            follow = earlier[:, : i] & (seqs[:, 1: i + 1] == nxt[:, None])   # x_j = x_i and x_{j+1} = x_{i+1}, j < i
            rel_hits += int((follow.any(1) & is_rep).sum())
            rel_n += int(is_rep.sum())
    return {"repetition": rep / rep_n if rep_n else None, "repeat_positions": rep, "positions": rep_n,
            "reliability": rel_hits / rel_n if rel_n else None, "copies": rel_hits, "repeats_followed": rel_n}


def _sample_split(table: BigramTable, n_seq: int, length: int, p: float, q: float, seed: int,
                  split: str) -> tuple[np.ndarray, dict]:
    parts, fb = [], {"no_repeat_candidate": 0, "no_new_candidate": 0}
    for c, lo in enumerate(range(0, n_seq, CHUNK)):
        rng = np.random.default_rng([seed, _SPLIT_CODE[split], c])
        s, f = sample_sequences(table, min(CHUNK, n_seq - lo), length, p, q, rng)
        parts.append(s)
        for k in fb:
            fb[k] += f[k]
    return (np.concatenate(parts) if parts else np.zeros((0, length), np.int64)), fb


@dataclass
class SynthBigramConfig:
    """How :func:`prepare_synth_bigram` samples a corpus (``inductionlab corpus prepare synth-bigram``): the
    command's synth-bigram options, generated from these fields. ``repetition``, ``reliability`` and
    ``tokens`` have no default: the study they serve chooses them."""
    source: str | None = opt(None, "synth-bigram: the prepared corpus whose bigram statistics and tokenizer to use.",
                             flag="--from", metavar="DIR")
    repetition: float | None = opt(None, "synth-bigram: P(A B ... A), in [0, 1].")
    reliability: float | None = opt(None, "synth-bigram: P(B | A B ... A), in [0, 1].")
    tokens: int | None = opt(None, "synth-bigram: training tokens to sample.")
    seq_len: int = opt(64, "synth-bigram: tokens per sequence, EOS included (train with the same --seq-len).")
    alpha: float = opt(1e-6, "synth-bigram: additive smoothing of the bigram probabilities.",
                       source="Aoyama et al. 2025")
    heldout_tokens: int = opt(DEFAULT_HELDOUT_TOKENS, "synth-bigram: held-out tokens (sequences of an independent "
                                                      "stream).")
    seed: int = opt(0, "Seed of every draw.")


def prepare_synth_bigram(source: str | os.PathLike, out_dir: str | os.PathLike, *, repetition: float,
                         reliability: float, tokens: int, seq_len: int = SynthBigramConfig.seq_len,
                         alpha: float = SynthBigramConfig.alpha, heldout_tokens: int = DEFAULT_HELDOUT_TOKENS,
                         seed: int = 0, overwrite: bool = False) -> TokenShards:
    """Write a semi-synthetic prepared corpus sampled from the bigram statistics of ``source``.

    Args:
        source: a prepared corpus directory (``inductionlab corpus prepare``); its training split
            gives the bigram table, its tokenizer is copied.
        out_dir: the new corpus directory (new or empty unless ``overwrite``).
        repetition: P(A B … A), the probability that a second-half token occurred earlier in its
            sequence, in [0, 1].
        reliability: P(B | A B … A), the probability that the token after a repeated ``A`` is one
            that followed ``A`` before, in [0, 1].
        tokens: training tokens to write, rounded up to whole sequences of ``seq_len``.
        seq_len: tokens per document, EOS included (train with the same ``--seq-len``).
        alpha: additive smoothing of the bigram probabilities (Aoyama et al.: 1e-6).
        heldout_tokens: held-out tokens (whole sequences, rounded up; 0 = none).
        seed: seeds every draw; the output is a function of (source, options, seed).

    Returns:
        The opened :class:`TokenShards`; its manifest records the generator, its options, the
        seed, the source's checksums and the realised repetition and reliability.

    Raises:
        InductionLabError: an option out of range, the source not a prepared corpus, a source
            vocabulary above :data:`MAX_VOCAB`, fewer distinct source tokens than ``2 · seq_len``,
            or a non-empty ``out_dir`` without ``overwrite``.
    """
    check_options(repetition, reliability, tokens, seq_len, alpha, heldout_tokens, seed)
    src = TokenShards.open(source)
    out_dir = check_output_dir(out_dir, inputs=[source])
    if own_entries(out_dir) and not overwrite:
        raise InductionLabError(f"output directory {out_dir} already exists and is not empty; "
                                "pass a new --out or --overwrite")
    table = BigramTable(np.asarray(src.train), src.vocab_size, src.eos_id, alpha)
    if int(table.support.sum()) < 2 * seq_len:
        raise InductionLabError(f"the source has {int(table.support.sum())} distinct tokens, fewer than 2 x --seq-len "
                                f"({2 * seq_len}) that sequences without repeats need; use a larger corpus or a "
                                "smaller --seq-len")
    dtype = np.dtype(src.manifest["dtype"])
    length = seq_len - 1
    h = length // 2
    counts, realised, fallbacks = {}, {}, {}
    with staged_run_dir(out_dir, overwrite=overwrite) as stage:
        for split, want in (("train", tokens), ("heldout", heldout_tokens)):
            n_seq = -(-int(want) // seq_len)
            seqs, fb = _sample_split(table, n_seq, length, repetition, reliability, seed, split)
            docs = np.concatenate([seqs, np.full((n_seq, 1), src.eos_id, np.int64)], axis=1)
            docs.astype(dtype).tofile(stage / f"{split}.bin")
            counts[split] = {"documents": n_seq, "tokens": int(docs.size),
                             "sha256": sha256_file(stage / f"{split}.bin")}
            realised[split] = repetition_stats(seqs, h) if n_seq else None
            fallbacks[split] = fb
        for f in sorted(Path(src.path).iterdir()):
            if f.is_file() and f.name not in {"manifest.json", *(f"{s}.bin" for s in SPLITS)}:
                shutil.copy2(f, stage / f.name)
        sm = src.manifest
        manifest = {
            "format": FORMAT,
            "source": {"spec": "synth-bigram", "kind": "synth-bigram", "from": str(Path(source).resolve()),
                       "from_corpus_sha256": sm.get("corpus_sha256"),
                       "from_train_sha256": sm["splits"]["train"].get("sha256"),
                       "from_tokens": int(len(src.train)), "from_source": sm.get("source"),
                       "repetition": repetition, "reliability": reliability, "seed": seed},
            "generator": {"name": GENERATOR, "method": SOURCE, "repetition": repetition,
                          "reliability": reliability, "new_repeat_rate": new_token_rate(repetition, reliability),
                          "seq_len": seq_len, "sampled_per_sequence": length, "enforced_from_position": h,
                          "alpha": alpha, "tokens_requested": tokens, "heldout_tokens_requested": heldout_tokens,
                          "seed": seed, "chunk_sequences": CHUNK, "support_tokens": int(table.support.sum()),
                          "realised": realised, "fallbacks": fallbacks},
            "corpus_sha256": counts["train"]["sha256"],   # the sampled text is the corpus
            "documents": int(sum(c["documents"] for c in counts.values())),
            "heldout_fraction": counts["heldout"]["tokens"] / max(1, sum(c["tokens"] for c in counts.values())),
            "heldout_fraction_requested": f"{heldout_tokens} tokens",
            "split_rule": "held-out split: sequences from an independent stream of the same seed",
            "seed": seed,
            "shuffle": False,
            "dtype": dtype.name,
            "tokenizer": sm["tokenizer"],
            "splits": counts,
            "versions": versions(),
        }
        atomic_write_json(stage / "manifest.json", manifest)
    return TokenShards.open(out_dir)


__all__ = ["BigramTable", "prepare_synth_bigram", "sample_sequences", "repetition_stats", "new_token_rate"]
