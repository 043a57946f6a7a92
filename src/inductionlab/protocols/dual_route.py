"""Concept and token induction heads: each query head's causal copying scores and value-weighted attention
(Feucht, Wallace & Bau 2025, "The Dual-Route Model of Induction", arXiv 2504.03022, code
``sfeucht/dual-route-induction``: ``scripts/causal_scores.py``, ``scripts/convert_causal_scores.py``,
``scripts/attention_scores.py``). SPEC §10.

**Causal copying** (``causal_scores.py``). For a multi-token word e = (e₀, e₁, …) of 2–5 tokens, R a context of
``seq_len − |e|`` random tokens and R′ one of ``seq_len`` fresh random tokens::

    clean    [BOS] R  e "\\n" R e₀
    corrupt  [BOS] R′   "\\n" R e₀          (same length as the clean prompt)

each head's output (the input of the output projection, its slice) at position −2 (R's last token in the
second half) in the corrupted run is set to its value there in the clean run. Then (``convert_causal_scores.py``)

    concept_copying(h) = mean over word prompts of  P(e₁ at −1 | patched) − P(e₁ at −1 | corrupt)
    token_copying(h)   = mean over random-token "words" of  P(e₀ at −2 | patched) − P(e₀ at −2 | corrupt)

(the authors' ``m1`` and ``m2``; a head at −2 that carries the whole word raises the token two steps ahead).
Words come from the model's own tokenizer: wordfreq's most frequent English words that the tokenizer splits
into 2–5 tokens (with a leading space, as in running text), balanced over the lengths as the authors balance
CounterFact subjects (:func:`~inductionlab.core.stimuli.sample_multi_token_words`); the random-token words are ordinary ids drawn uniformly (the authors shuffle Pile
tokens; this project has no outside text), and R, R′ are ordinary ids too. Probabilities are softmax
probabilities in float64. [Authors: 1,024 prompts per score, seq_len 30, seed 8.]

**Value-weighted attention** (``attention_scores.py``): on ``[BOS] R₁ e R₂ "\\n" R₁`` (e starting at a random
position in the second half of the ``seq_len``-token segment, R₁, R₂ random tokens), at the last position (R₁'s
last token, where e would repeat), ``a_ij·‖v_j‖`` renormalised over keys j, with v_j the head's value vector
(the value projection's output; a GQA head reads its group's): ``token_attention`` is the weight on e's first
token (next-token matching), ``concept_attention`` on its last token (last-token matching).

**Exact fast path** (:func:`inductionlab.core.patching.patched_suffix_logits`, with a suffix of two
tokens): the corrupted prompt without its last two tokens runs once and keeps its KV cache; one forward then
reads copies of the last two tokens against it, each copy at their positions and attending to the prefix and
its own tokens only, copy r + 1 with head r patched at its first token (copy 0 unpatched). Chunks of heads in
layer order start at their lowest layer from the unpatched residual stream there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from ..core.instrument import HeadIntervention, instrument, unwrap_model
from ..core.models import attention_shape
from ..core.patching import patched_suffix_logits
from ..core.placement import execution_device
from ..core.stimuli import WORD_LENGTHS, ordinary_token_ids
from ..core.stimuli import multi_token_words as word_pool, random_token_words as random_words
from ..core.stimuli import sample_multi_token_words as sample_words
from ..errors import InductionLabError
from ..measures.stats import Z95

#: The four per-head scores, in table order.
ROUTE_SCORES = ("concept_copying", "token_copying", "concept_attention", "token_attention")


# ---------------------------------------------------------------------------------------------
# Words and prompts


@dataclass(frozen=True)
class CopyPrompt:
    """One causal-copying pair: ``clean`` = ``[BOS] R e \\n R e₀``, ``corrupt`` = ``[BOS] R′ \\n R e₀`` (equal
    lengths), ``word`` = e."""
    word: tuple[int, ...]
    clean: tuple[int, ...]
    corrupt: tuple[int, ...]


@dataclass(frozen=True)
class AttentionPrompt:
    """``ids`` = ``[BOS] R₁ e R₂ \\n R₁``; ``first`` / ``last``: positions of e's first and last token."""
    word: tuple[int, ...]
    ids: tuple[int, ...]
    first: int
    last: int


def _filler(ids: torch.Tensor, n: int, g: torch.Generator) -> list[int]:
    return ids[torch.randint(len(ids), (n,), generator=g)].tolist()


def copying_prompts(words: Sequence[tuple[int, ...]], filler: torch.Tensor, *, bos_id: int, newline_id: int,
                    seq_len: int = 30, seed: int = 0) -> list[CopyPrompt]:
    """The clean and corrupted prompt of each word (``causal_scores.generate_seq_batch``): R of ``seq_len − |e|``
    and R′ of ``seq_len`` tokens drawn uniformly from ``filler`` (LongTensor) by ``seed``.

    Raises: InductionLabError for a word not shorter than ``seq_len``."""
    g = torch.Generator().manual_seed(int(seed))
    out = []
    for e in words:
        if len(e) >= seq_len:
            raise InductionLabError(f"a word of {len(e)} tokens does not fit a context of {seq_len}; raise seq_len")
        r, r2 = _filler(filler, seq_len - len(e), g), _filler(filler, seq_len, g)
        tail = [newline_id, *r, e[0]]
        out.append(CopyPrompt(tuple(e), (bos_id, *r, *e, *tail), (bos_id, *r2, *tail)))
    return out


def attention_prompts(words: Sequence[tuple[int, ...]], filler: torch.Tensor, *, bos_id: int, newline_id: int,
                      seq_len: int = 30, seed: int = 0) -> list[AttentionPrompt]:
    """``[BOS] R₁ e R₂ \\n R₁`` per word (``attention_scores.generate_ragged_batch``): |R₁| drawn uniformly from
    ``seq_len // 2 .. seq_len − |e|``, |R₂| = ``seq_len − |R₁| − |e|``, tokens from ``filler`` by ``seed``."""
    g = torch.Generator().manual_seed(int(seed))
    out = []
    for e in words:
        lo, hi = seq_len // 2, seq_len - len(e)
        if hi < lo:
            raise InductionLabError(f"a word of {len(e)} tokens does not fit the second half of a context of "
                                    f"{seq_len}; raise seq_len")
        p = int(torch.randint(lo, hi + 1, (1,), generator=g))
        r1, r2 = _filler(filler, p, g), _filler(filler, seq_len - p - len(e), g)
        out.append(AttentionPrompt(tuple(e), (bos_id, *r1, *e, *r2, newline_id, *r1), p + 1, p + len(e)))
    return out


def special_ids(tokenizer) -> tuple[int, int]:
    """``(bos, newline)``: the tokenizer's BOS (else its EOS, GPT-2's document separator) and the last id of
    ``"\\n"``. Raises InductionLabError when either is missing."""
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    nl = tokenizer.encode("\n", add_special_tokens=False)
    if bos is None or not nl:
        raise InductionLabError("the dual-route prompts need a BOS (or EOS) token and a newline token; this "
                                "tokenizer lacks " + ("a BOS/EOS" if bos is None else "a newline token"))
    return int(bos), int(nl[-1])


# ---------------------------------------------------------------------------------------------
# The fast path: copies of a two-token suffix


def _heads(model, heads):
    s = attention_shape(unwrap_model(model).config)
    L, H = s["n_layers"], s["n_heads"]
    return L, H, [(l, h) for l in range(L) for h in range(H)] if heads is None else [(int(l), int(h)) for l, h in heads]


def clean_values(model, ids: Sequence[int], heads, *, position: int = -2, under: Sequence[HeadIntervention] = ()
                 ) -> dict[tuple[int, int], torch.Tensor]:
    """Each head's output (the input of the output projection) at ``position`` of one forward of ``ids``:
    ``{(layer, head): [head_dim]}``."""
    model = unwrap_model(model)
    x = torch.tensor([list(ids)], device=execution_device(model))
    with torch.inference_mode(), instrument(model, list(under), capture_heads=heads, strict=False) as inst:
        model(input_ids=x, use_cache=False)
    return {lh: inst.captured[lh][0, position].clone() for lh in heads}


def copying_effects(model, prompt: CopyPrompt, *, heads: Sequence[tuple[int, int]] | None = None, rows: int = 64,
                    under: Sequence[HeadIntervention] = (), skip: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Each head's causal copying effect on one prompt pair: its clean output at −2 patched into the corrupted run.

    Returns: ``(p_corrupt, effect)``: float64 ``[2]`` = (P(e₁ at −1), P(e₀ at −2)) unpatched, and float64
    ``[2, n_layers, n_heads]``: patched − unpatched of the same two (``m1``, ``m2``; NaN for heads not patched; a
    patch that wrote the value the head already had gives exactly 0)."""
    L, H, heads = _heads(model, heads)
    e = prompt.word
    vals = clean_values(model, prompt.clean, heads, under=under)
    base, logits, changed = patched_suffix_logits(model, prompt.corrupt, [[(l, h, vals[(l, h)])] for l, h in heads],
                                                  suffix=2, at=0, rows=rows, under=under, skip=skip)
    pb = torch.softmax(base.double(), -1)
    pp = torch.softmax(logits.double(), -1)
    p0 = np.array([float(pb[1, e[1]]), float(pb[0, e[0]])])
    m1 = (pp[:, 1, e[1]] - pb[1, e[1]]).cpu().numpy()
    m2 = (pp[:, 0, e[0]] - pb[0, e[0]]).cpu().numpy()
    eff = np.full((2, L, H), np.nan)
    for k, ((l, h), c) in enumerate(zip(heads, changed)):
        eff[:, l, h] = (m1[k], m2[k]) if c else (0.0, 0.0)
    return p0, eff


def value_weighted(weights: torch.Tensor, value_norms: torch.Tensor) -> torch.Tensor:
    """Value-weighted attention (Kobayashi et al. 2020, as Feucht's ``get_l2_attn_weights``): ``a_ij·‖v_j‖``
    renormalised over keys j. ``weights`` ``[..., K]``, ``value_norms`` broadcastable to it; float64 out."""
    w = weights.double() * value_norms.double()
    return w / w.sum(-1, keepdim=True)


def attention_scores(model, prompt: AttentionPrompt, *, under: Sequence[HeadIntervention] = ()) -> np.ndarray:
    """Value-weighted attention of every head from the last position to the word's first and last token.

    Returns: float64 ``[2, n_layers, n_heads]``: (first token: next-token matching, last token: concept)."""
    model = unwrap_model(model)
    s = attention_shape(model.config)
    L, H = s["n_layers"], s["n_heads"]
    x = torch.tensor([list(prompt.ids)], device=execution_device(model))
    with torch.inference_mode(), instrument(model, list(under), keep_patterns=True, capture_value_norms=True,
                                            strict=False) as inst:
        model(input_ids=x, use_cache=False)
    out = np.empty((2, L, H))
    for l in range(L):
        a = inst.patterns[l][0, :, -1]                                          # [H, K]
        v = inst.value_norms[l][0]                                              # [H_kv, K]
        v = v.repeat_interleave(H // v.shape[0], dim=0)
        vw = value_weighted(a, v)
        out[0, l], out[1, l] = vw[:, prompt.first].numpy(), vw[:, prompt.last].numpy()
    return out


# ---------------------------------------------------------------------------------------------
# All heads, many prompts


@dataclass
class RouteScores:
    """Per-prompt dual-route effects of every head.

    Attributes:
        word: float64 ``[n_words, 2, n_layers, n_heads]``: (m1, m2) effects on the word prompts.
        random: float64 ``[n_random, 2, n_layers, n_heads]``: the same on random-token words.
        attention: float64 ``[n_attention, 2, n_layers, n_heads]``: value-weighted attention to the word's
            (first, last) token.
        p_word, p_random: float64 ``[n, 2]``: the corrupted runs' (P(e₁ at −1), P(e₀ at −2)).
        params: what produced them.
    """
    word: np.ndarray
    random: np.ndarray
    attention: np.ndarray
    p_word: np.ndarray
    p_random: np.ndarray
    params: dict = field(default_factory=dict)

    def per_prompt(self, name: str) -> np.ndarray:
        """The per-prompt values ``[n, n_layers, n_heads]`` behind score ``name`` (:data:`ROUTE_SCORES`)."""
        return {"concept_copying": self.word[:, 0], "token_copying": self.random[:, 1],
                "concept_attention": self.attention[:, 1], "token_attention": self.attention[:, 0]}[name]

    def score(self, name: str) -> np.ndarray:
        """The mean over prompts: float64 ``[n_layers, n_heads]``."""
        return self.per_prompt(name).mean(0)

    def scores(self) -> dict[str, np.ndarray]:
        return {n: self.score(n) for n in ROUTE_SCORES}

    def table(self) -> pd.DataFrame:
        """``layer, head`` and per score its mean and 95% normal CI over prompts (``<score>_ci_low`` /
        ``_ci_high``), one row per head."""
        cols = {}
        for name in ROUTE_SCORES:
            x = self.per_prompt(name)
            m = x.mean(0)
            half = Z95 * x.std(0, ddof=1) / np.sqrt(len(x)) if len(x) > 1 else np.full_like(m, np.nan)
            cols[name], cols[f"{name}_ci_low"], cols[f"{name}_ci_high"] = m, m - half, m + half
        L, H = cols[ROUTE_SCORES[0]].shape
        return pd.DataFrame([{"layer": l, "head": h, **{k: float(v[l, h]) for k, v in cols.items()}}
                             for l in range(L) for h in range(H)])

    def top(self, name: str, k: int = 10) -> list[tuple[int, int, float]]:
        """The ``k`` heads with the largest score ``name``: ``(layer, head, score)``, ties in (layer, head) order."""
        s = self.score(name)
        order = sorted(range(s.size), key=lambda i: (-s.flat[i], i))[:k]
        return [(i // s.shape[1], i % s.shape[1], float(s.flat[i])) for i in order]


def bare_forward_seconds(model, sequences: Sequence[Sequence[int]]) -> float:
    """Wall time of one plain forward per sequence (no instrumentation, after one warm-up forward of the first):
    the cost unit of SPEC §10."""
    model = unwrap_model(model)
    dev = execution_device(model)
    with torch.inference_mode():
        model(input_ids=torch.tensor([list(sequences[0])], device=dev), use_cache=False)
    t = time.perf_counter()
    with torch.inference_mode():
        for ids in sequences:
            model(input_ids=torch.tensor([list(ids)], device=dev), use_cache=False)
    return time.perf_counter() - t


def build_prompts(tokenizer, vocab_size: int, *, n_words: int, n_attention: int, seq_len: int = 30,
                  lengths: Sequence[int] = WORD_LENGTHS, top_n: int = 50_000, seed: int = 0,
                  pool=None) -> tuple[list[CopyPrompt], list[CopyPrompt], list[AttentionPrompt]]:
    """The word prompts, random-token prompts and attention prompts of :func:`route_scores` (seeded by ``seed``:
    words ``seed``, random words ``seed + 1``, contexts ``seed + 2..4``). Random-token words and filler come from
    the tokenizer's ordinary ids, or from ``pool`` (e.g. the ids a small model's training split uses, so that no
    random token has an embedding training never updated) minus BOS and newline."""
    bos, nl = special_ids(tokenizer)
    if pool is None:
        filler = ordinary_token_ids(min(int(vocab_size), len(tokenizer)), (bos, nl), tokenizer)
    else:
        keep = np.asarray(pool, dtype=np.int64)
        filler = torch.as_tensor(keep[~np.isin(keep, [i for i in (bos, nl) if i is not None])])
    words = sample_words(tokenizer, n_words, seed=seed, lengths=lengths, top_n=top_n)
    att_words = words if n_attention <= n_words else sample_words(tokenizer, n_attention, seed=seed, lengths=lengths,
                                                                  top_n=top_n)
    att_words = [att_words[i] for i in np.random.default_rng(seed + 4).permutation(len(att_words))[:n_attention]]
    rand = random_words(filler, n_words, seed=seed + 1, lengths=lengths)
    kw = dict(bos_id=bos, newline_id=nl, seq_len=seq_len)
    return (copying_prompts(words, filler, seed=seed + 2, **kw), copying_prompts(rand, filler, seed=seed + 3, **kw),
            attention_prompts(att_words, filler, seed=seed + 4, **kw))


def route_scores(model, word_prompts: Sequence[CopyPrompt], random_prompts: Sequence[CopyPrompt],
                 att_prompts: Sequence[AttentionPrompt], *, rows: int = 64, under: Sequence[HeadIntervention] = (),
                 measure_cost: bool = True, progress=None, params: dict | None = None) -> RouteScores:
    """Every head's dual-route scores on the prompts of :func:`build_prompts`; with ``measure_cost`` the run's
    wall time as a ratio to one bare forward of every prompt (clean, corrupted, attention) in ``params["cost"]``.

    Raises: InductionLabError for no prompts of a kind."""
    if not word_prompts or not random_prompts or not att_prompts:
        raise InductionLabError("the dual-route scores need word, random-token and attention prompts (none given "
                                "for one kind)")
    t0 = time.perf_counter()
    res = []
    for prompts in (word_prompts, random_prompts):
        p, e = [], []
        for pr in prompts:
            a, b = copying_effects(model, pr, rows=rows, under=under)
            p.append(a)
            e.append(b)
            if progress:
                progress(1)
        res.append((np.asarray(p), np.stack(e)))
    att = []
    for pr in att_prompts:
        att.append(attention_scores(model, pr, under=under))
        if progress:
            progress(1)
    params = dict(params or {})
    if measure_cost:
        seconds = time.perf_counter() - t0
        seqs = [s for pr in (*word_prompts, *random_prompts) for s in (pr.clean, pr.corrupt)] + [a.ids for a in att_prompts]
        bare = bare_forward_seconds(model, seqs)
        params["cost"] = {"seconds": seconds, "bare_forward_seconds": bare, "ratio": seconds / bare,
                          "bare_forwards": len(seqs)}
    return RouteScores(res[0][1], res[1][1], np.stack(att), res[0][0], res[1][0], params)


__all__ = ["ROUTE_SCORES", "WORD_LENGTHS", "word_pool", "sample_words", "random_words", "CopyPrompt",
           "AttentionPrompt", "copying_prompts", "attention_prompts", "special_ids", "clean_values", "copying_effects",
           "value_weighted", "attention_scores", "RouteScores", "bare_forward_seconds", "build_prompts", "route_scores"]
