"""Stimuli: random token sequences for head scores and word pools for the recall protocols.

Everything is built as token ids, never by decoding to text and re-tokenising.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ..errors import InductionLabError


def ordinary_token_ids(vocab_size: int, exclude_ids=(), tokenizer=None) -> torch.Tensor:
    """Ids ``0..vocab_size-1`` minus special / added tokens and ``exclude_ids``. Returns LongTensor [V']."""
    excl = set(int(i) for i in exclude_ids)
    if tokenizer is not None:
        excl |= set(int(i) for i in getattr(tokenizer, "all_special_ids", []) or [])
        excl |= set(int(i) for i in (getattr(tokenizer, "added_tokens_decoder", None) or {}))
    keep = torch.ones(vocab_size, dtype=torch.bool)
    idx = [i for i in excl if 0 <= i < vocab_size]
    keep[idx] = False
    return torch.nonzero(keep).squeeze(1)


def random_sequences(pool: torch.Tensor, n: int, length: int, seed: int) -> torch.Tensor:
    """``n`` sequences of ``length`` distinct tokens drawn uniformly from ``pool``.

    Tokens are distinct within a sequence so every query in a repeated copy has exactly one
    earlier occurrence (decision; TransformerLens allows repeats, which blurs the target).

    Returns: LongTensor ``[n, length]``.
    """
    if length > len(pool):
        raise InductionLabError(f"sequence length {length} exceeds the {len(pool)} ordinary tokens available")
    g = torch.Generator().manual_seed(int(seed))
    rows = [pool[torch.randperm(len(pool), generator=g)[:length]] for _ in range(n)]
    return torch.stack(rows)


@dataclass(frozen=True)
class Word:
    """A word that is one token in the model's tokenizer (in the form used in the lists)."""
    text: str
    token_id: int
    zipf: float


def single_token_words(tokenizer, n: int | None = None, *, prefix: str = " ", lang: str = "en",
                       candidates: int = 30000, min_length: int = 2) -> list[Word]:
    """Common English words that are a single token (with ``prefix``) in ``tokenizer``.

    Words come from the ``wordfreq`` frequency list (Speer 2022), most frequent first; a word is
    kept if it is alphabetic, at least ``min_length`` letters, encodes to exactly one non-special
    token, and that token is new (distinct ids). The model's vocabulary is never scraped.

    Args:
        n: number of words wanted (None = all found).
        prefix: text before the word in context: ``" "`` for space-separated lists, ``""`` after a newline.

    Raises:
        InductionLabError: fewer than ``n`` words qualify.
    """
    from wordfreq import top_n_list, zipf_frequency

    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    out, seen = [], set()
    for w in top_n_list(lang, candidates):
        if not (w.isascii() and w.isalpha() and len(w) >= min_length):
            continue
        ids = tokenizer.encode(prefix + w, add_special_tokens=False)
        if len(ids) != 1 or ids[0] in special or ids[0] in seen:
            continue
        seen.add(ids[0])
        out.append(Word(w, ids[0], zipf_frequency(w, lang)))
        if n is not None and len(out) >= n:
            break
    if n is not None and len(out) < n:
        raise InductionLabError(f"word pool too small: only {len(out)} single-token words found, {n} needed; "
                                "use a shorter list")
    return out


def seed_for(*parts: int) -> int:
    """A 32-bit seed derived from integers (numpy SeedSequence), for per-trial / per-draw seeds."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


# Multi-token words (Feucht et al. 2025's entities of 2-5 tokens; protocols.dual_route)

#: Word lengths in tokens of the dual-route scores (Feucht et al. 2025).
WORD_LENGTHS = (2, 3, 4, 5)


def _word_splits(tokenizer, lengths: Sequence[int], top_n: int, prefix: str = " ", lang: str = "en"):
    """``(word, ids)`` for wordfreq's ``top_n`` most frequent words (alphabetic ASCII), most frequent first, each
    encoded as ``prefix + word`` without special tokens, when it splits into one of ``lengths`` tokens (a fast
    tokenizer encodes them in batches: the same ids, ~10× sooner)."""
    from wordfreq import top_n_list

    want = {int(n) for n in lengths}
    words = [w for w in top_n_list(lang, int(top_n)) if w.isascii() and w.isalpha()]
    step = 4096 if getattr(tokenizer, "is_fast", False) else 1
    for i in range(0, len(words), step):
        part = words[i:i + step]
        if step > 1:
            enc = tokenizer([prefix + w for w in part], add_special_tokens=False)["input_ids"]
        else:
            enc = [tokenizer.encode(prefix + part[0], add_special_tokens=False)]
        for w, ids in zip(part, enc):
            if len(ids) in want:
                yield w, tuple(ids)


def multi_token_words(tokenizer, *, lengths: Sequence[int] = WORD_LENGTHS,
                      top_n: int = 50_000) -> dict[int, list[tuple[int, ...]]]:
    """Multi-token words of the tokenizer: wordfreq's ``top_n`` most frequent English words (alphabetic ASCII),
    each encoded with a leading space and no special tokens, kept when it splits into one of ``lengths`` tokens.

    Returns: ``{length: [token ids, ...]}`` in frequency order (distinct id tuples)."""
    out: dict[int, list[tuple[int, ...]]] = {n: [] for n in sorted({int(n) for n in lengths})}
    seen = set()
    for _, ids in _word_splits(tokenizer, lengths, top_n):
        if ids not in seen:
            seen.add(ids)
            out[len(ids)].append(ids)
    return out


@dataclass(frozen=True)
class TokenWord:
    """A word of one or more tokens in the model's tokenizer (in the form used in the lists): ``ids`` its tokens."""
    text: str
    ids: tuple[int, ...]
    zipf: float


def word_pool(tokenizer, n: int, *, lengths: Sequence[int], prefix: str = " ", top_n: int = 50_000,
              min_length: int = 2, lang: str = "en") -> list[TokenWord]:
    """``n`` common English words of ``lengths`` tokens (with ``prefix``) for the lag probe's lists, with
    **distinct first tokens** (so a first token's probability names one word), no special token, alphabetic and at
    least ``min_length`` letters; words from :func:`_word_splits` (wordfreq, as :func:`multi_token_words`; the
    vocabulary is never scraped). ``lengths == (1,)`` gives the words of :func:`single_token_words`.

    Balanced over the lengths where the tokenizer allows: each length's share (``n // k``, the shortest ``n mod k``
    lengths one more) is filled longest first (long words are the rarest; they claim their first tokens first),
    most frequent first within a length; a length short of its share leaves the rest to the others, one word at a
    time, shortest first. (SmolLM2 has 234 four-token words with distinct first tokens among wordfreq's top 50,000;
    Gemma 3 has 62.)

    Returns: the words, most frequent first over all lengths.

    Raises:
        InductionLabError: a length without any qualifying word, or fewer than ``n`` in all (one line naming the
            fixes)."""
    from wordfreq import zipf_frequency

    lengths = sorted({int(x) for x in lengths})
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    cands: dict[int, list] = {k: [] for k in lengths}
    for rank, (w, ids) in enumerate(_word_splits(tokenizer, lengths, top_n, prefix, lang)):
        if len(w) >= min_length and not special.intersection(ids):
            cands[len(ids)].append((rank, w, ids))
    empty = [k for k in lengths if not cands[k]]
    if empty:
        raise InductionLabError(f"no words of {empty[0]} tokens among wordfreq's top {top_n:,} under this tokenizer; "
                                "use other --word-tokens")
    first, taken, at = set(), {k: [] for k in lengths}, {k: 0 for k in lengths}

    def take(k: int, m: int) -> int:
        got = 0
        while got < m and at[k] < len(cands[k]):
            item = cands[k][at[k]]
            at[k] += 1
            if item[2][0] not in first:
                first.add(item[2][0])
                taken[k].append(item)
                got += 1
        return got

    for k, share in sorted(zip(lengths, _per_length(int(n), lengths)), reverse=True):
        take(k, share)
    total = sum(map(len, taken.values()))
    while total < n:                             # a length short of its share: the others fill in, shortest first
        more = 0
        for k in lengths:
            if total < n and take(k, 1):
                total, more = total + 1, more + 1
        if not more:
            break
    chosen = sorted(x for k in lengths for x in taken[k])
    if len(chosen) < n:
        counts = ", ".join(f"{len(taken[k])} of {k}" for k in lengths)
        raise InductionLabError(f"word pool too small: only {len(chosen)} words with distinct first tokens ({counts} "
                                f"tokens) among wordfreq's top {top_n:,} under this tokenizer, {n} needed; use a "
                                "shorter --list-length or other --word-tokens")
    return [TokenWord(w, ids, zipf_frequency(w, lang)) for _, w, ids in chosen]


def _per_length(n: int, lengths: Sequence[int]) -> list[int]:
    k = len(lengths)
    return [n // k + (i < n % k) for i in range(k)]


def sample_multi_token_words(tokenizer, n: int, *, seed: int = 0, lengths: Sequence[int] = WORD_LENGTHS,
                 top_n: int = 50_000) -> list[tuple[int, ...]]:
    """``n`` distinct words of :func:`multi_token_words`, split evenly over ``lengths`` (the first ``n mod |lengths|``
    lengths one more), drawn without replacement by ``seed``; shortest words first.

    Raises: InductionLabError when a length has fewer words than needed (one line naming the fix)."""
    pool = multi_token_words(tokenizer, lengths=lengths, top_n=top_n)
    rng = np.random.default_rng(int(seed))
    out = []
    for length, k in zip(sorted(pool), _per_length(int(n), sorted(pool))):
        words = pool[length]
        if len(words) < k:
            raise InductionLabError(f"only {len(words)} words of {length} tokens among wordfreq's top {top_n} under "
                                    f"this tokenizer, {k} needed; lower the number of words or lengths")
        out += [words[i] for i in sorted(rng.choice(len(words), size=k, replace=False))]
    return out


def random_token_words(ids: torch.Tensor, n: int, *, seed: int = 0,
                       lengths: Sequence[int] = WORD_LENGTHS) -> list[tuple[int, ...]]:
    """``n`` random-token "words" (the authors' ``--random_tok_entities``) of distinct ids drawn uniformly from
    ``ids`` (LongTensor ``[V']``), split over ``lengths`` as :func:`sample_multi_token_words`."""
    g = torch.Generator().manual_seed(int(seed))
    out = []
    for length, k in zip(sorted(lengths), _per_length(int(n), sorted(lengths))):
        for _ in range(k):
            out.append(tuple(int(i) for i in ids[torch.randperm(len(ids), generator=g)[:length]]))
    return out
