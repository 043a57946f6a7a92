"""Stimuli: random token sequences for head scores and word pools for the recall protocols.

Everything is built as token ids, never by decoding to text and re-tokenising.
"""

from __future__ import annotations

from dataclasses import dataclass

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
