"""Protocol T1 — the lag probe (SPEC §4), free-recall style.

One trial: ``[BOS] w1 … w500`` then the cue ``w250`` again; the next-token distribution at
the last position is read, and the probability of the word at list position ``250 + k`` is
the probability at **lag k** (k ∈ [−249, +250]; lag 0 = repeating the cue). Each trial is a
fresh random order of a fixed set of the 500 most frequent single-token words (seed protocol:
one 500-word sequence, 5,000 permutations); ``resample_words`` draws a new set per trial.
Every condition sees the same trials (paired design).

**All cues at once** (``cues="all"``, ``"A-B"``, ``"all:S"``; issue 17): the list part of a trial is
the same whatever the cue, so it runs once and every chosen list position is cued after it in one
packed forward per chunk of cues (:mod:`inductionlab.protocols.packed`); cue i reads what the
single-cue trial with ``cue_position=i`` reads. The seed cue (``cue_position``) always runs, an extra
cue when it is not among the chosen ones: the headline, curves and contrasts are the seed protocol's,
from the same run; the per-cue arrays (``cue_probs`` …) add the other cues for the serial-position
analyses (:mod:`inductionlab.measures.serial_position`).

Reported per condition (:mod:`inductionlab.measures.lag`, pure functions over the per-trial arrays
that :class:`LagProbeResult` holds): mean raw probability per lag with a 95% CI over trials (normal
approximation, mean ± 1.96·sd/√n), the same renormalised over the list tokens, the list mass (total
probability on list tokens), the arg-max response's lag (for the psifr-style CRP), and the
**word-prior-corrected** curve (:func:`~inductionlab.measures.lag.log_enrichment`: ``log p(word at lag
k) − log baseline(word)``, nats, the baseline being the word's mean probability where it sits at
|lag| > ``far_lag``), reported next to the raw curve, never instead of it.

**Words of several tokens** (``word_tokens="2-4"``, issue 34; Feucht et al. 2025's concept heads copy
multi-token words as units, so a single-token list leaves them nothing to do). The list is ``n`` of the most
frequent wordfreq words that the tokenizer splits, with the list's leading space, into the asked numbers of
tokens (balanced over the lengths where the tokenizer has enough, **distinct first tokens**:
:func:`~inductionlab.core.stimuli.word_pool`; ``word_lengths`` records each position's count);
``[BOS] w1 … wL`` is built from each word's ids (no re-tokenising), and every trial permutes the same words.
Two readings of "the next word" per cue, both recorded:

* **first token**: the probability of each list word's first token after the cue — ``probs`` / ``cue_probs``
  and everything computed from them (curves, list mass, arg-max lag, log-enrichment) are this reading, for
  every lag, at no extra cost; with single-token words it is the single-token probe's value;
* **whole word**: ``log p(w) = Σ_i log p(w_i | list, cue, w_<i)`` (nats, teacher forcing: the word's tokens
  appended after the cue), in ``word_logp`` ``[n_trials, n_cues, 2R+1]`` for the lags ``-R..R``
  (``R = word_lags``).

Cost (the choice): the whole word at every lag would be one continuation per list word per cue — L copies
of up to M−1 tokens per cue (500 × 3 per cue for M = 4, 25× the list for 50 cues). The claims read lag +1
(R2: p(+1) pooled over cues), the headline lags 0 and ±1, and a word-prior baseline that needs far lags; so
only lags ``-R..R`` are scored whole (default R = 2), the far-lag baseline and the full curves stay on the
first-token reading. Everything runs in one packed forward per chunk of cues
(:func:`~inductionlab.protocols.packed.packed_word_batch`): the list once, then per cue its block ``sep w_c
sep`` (``2s + M`` tokens) and 2R+1 branches of ``M − 1`` tokens sharing it through the mask (the KV-cache
route without a cache, so the residual reuse across conditions still applies). Per trial that is
``S + n·(2s + M + (2R+1)(M−1))`` tokens for a list of S tokens and n cues: with M = 4, R = 2, a space list of
500 words (S ≈ 1,500) and 51 cues, ≈ 2,450 tokens, ≈ 1.6× the list and 1.4× what first tokens alone need,
against n + 1 forwards of ≈ 1,500 tokens for cue-by-cue runs. Measured (SmolLM2, fp32, one CPU thread, one list
of ``cues="all:10"``): 49 s, 2.8× a bare forward of the list; the single-token all-cue probe: 7.5 s. The packed forward needs the architecture's
4-D mask support and a fixed word set with every cue's ablation applied at all positions: ``--resample-words``,
``--method resample`` and ``--positions last`` are refused with multi-token words. The trials' ``ids`` are the
list part only (it is the same length in every trial; the cues differ in length).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import partial

import numpy as np
import pandas as pd
import torch

from ..checks import check_loaded, check_type
from ..core.ablation import Condition, check_conditions
from ..core.models import LoadedModel
from ..core.stimuli import TokenWord, seed_for, single_token_words, word_pool
from ..errors import InductionLabError
from ..measures.lag import (condition_json, contrast_table, curve_arms, curve_table, enrichment_table, headline_table,
                            lags_of, log_enrichment)
from ..measures.stats import ci
from .configs import LagProbeConfig
from .packed import check_packed_support, cue_chunk, cue_logits, word_cue_logits
from .runner import Probe, Trials, auto_batch_size, forward_logits


@dataclass
class Stimulus:
    """The token layout of one list format."""
    prefix_ids: list[int]
    sep_ids: list[int]
    word_prefix: str

    def trial(self, word_ids: list[int], cue: int) -> list[int]:
        """Token ids of one trial: prefix, words joined by separator, separator, cue, separator."""
        ids = list(self.prefix_ids)
        for j, w in enumerate(word_ids):
            if j:
                ids += self.sep_ids
            ids.append(w)
        return ids + self.sep_ids + [word_ids[cue - 1]] + self.sep_ids


def make_stimulus(tokenizer, separator: str = " ", instruction: str = "", bos: bool = True) -> Stimulus:
    """Token layout for a list format. A space separator folds into the words' leading space."""
    word_prefix = "" if separator.endswith("\n") else " "
    sep_text = separator.rstrip(" ")
    sep_ids = tokenizer.encode(sep_text, add_special_tokens=False) if sep_text else []
    prefix = []
    if bos:
        if tokenizer.bos_token_id is None:
            raise InductionLabError("the tokenizer has no BOS token; pass --no-bos")
        prefix.append(tokenizer.bos_token_id)
    if instruction:
        prefix += tokenizer.encode(instruction, add_special_tokens=False)
    return Stimulus(prefix, sep_ids, word_prefix)


@dataclass
class LagProbeResult:
    """Results of :func:`run_lag_probe`.

    Attributes:
        probs: condition name -> float32 ``[n_trials, list_length]`` raw probability of each
            list position's word (column j ↔ lag ``j + 1 - cue_position``).
        list_mass: condition name -> ``[n_trials]`` total probability on list tokens.
        argmax_lag: condition name -> ``[n_trials]`` lag of the arg-max token (NaN if it is not a list word).
        conditions: the :class:`Condition` list, in run order.
        config: the :class:`LagProbeConfig` used; words: the word set (fixed mode).
        list_ids: ``[n_trials, list_length]`` word at each list position (same in every
            condition); None (e.g. a run from before it was stored): no corrected curve.
        cue_probs: condition name -> float32 ``[n_trials, n_cues, list_length]``: probability of
            each list position's word after cue c (the word at list position ``cue_positions[c]``;
            column j ↔ lag ``j + 1 - cue_positions[c]``). ``cues="seed"``: one cue, equal to ``probs``.
        cue_list_mass: condition name -> float64 ``[n_trials, n_cues]`` total probability on list tokens.
        cue_argmax_lag: condition name -> float64 ``[n_trials, n_cues]`` lag of the arg-max token
            relative to its cue (NaN if it is not a list word).
        cue_positions: int ``[n_cues]`` the cued list positions, 1-based (None: not stored).
        word_logp: (multi-token words) condition name -> float32 ``[n_trials, n_cues, 2R+1]``: the whole word's
            log-probability (nats, teacher forcing) at lags ``config.word_lag_list()`` after cue c (NaN: lag outside
            the list); probs / cue_probs then hold each word's first-token probability.
        word_lengths: (multi-token words) int ``[n_trials, list_length]`` tokens of the word at each list position.
    """
    probs: dict[str, np.ndarray]
    list_mass: dict[str, np.ndarray]
    argmax_lag: dict[str, np.ndarray]
    conditions: list[Condition]
    config: LagProbeConfig
    words: list[str] = field(default_factory=list)
    list_ids: np.ndarray | None = None
    cue_probs: dict[str, np.ndarray] = field(default_factory=dict)
    cue_list_mass: dict[str, np.ndarray] = field(default_factory=dict)
    cue_argmax_lag: dict[str, np.ndarray] = field(default_factory=dict)
    cue_positions: np.ndarray | None = None
    word_logp: dict[str, np.ndarray] = field(default_factory=dict)
    word_lengths: np.ndarray | None = None

    @classmethod
    def from_parts(cls, parts: dict, conditions, config: "LagProbeConfig", words=()) -> "LagProbeResult":
        """A result from per-condition measures (condition name -> measure -> array, as from
        :func:`~inductionlab.protocols.runner.run_conditions` or a resumable run's pieces); the per-cue
        arrays are taken where they were stored (runs from before them have none)."""
        get = lambda key: {n: a[key] for n, a in parts.items() if key in a}   # noqa: E731
        cue_probs = get("cue_probs")
        return cls(get("probs"), get("list_mass"), get("argmax_lag"), list(conditions), config, list(words),
                   list_ids=list_ids_of(parts), cue_probs=cue_probs, cue_list_mass=get("cue_list_mass"),
                   cue_argmax_lag=get("cue_argmax_lag"),
                   cue_positions=np.asarray(config.cue_positions()) if cue_probs else None,
                   word_logp=get("word_logp"),
                   word_lengths=next((np.asarray(a["word_len"]) for a in parts.values() if "word_len" in a), None))

    def whole_word(self, name: str, lag: int = 1, *, log: bool = False) -> np.ndarray:
        """(multi-token words) float64 ``[n_trials]``: per trial, the whole word's probability at ``lag`` (or its
        log-probability, nats, with ``log``), averaged over the cues at which that lag exists.

        Raises: InductionLabError when the run scored no whole words or not this lag."""
        lags = self.config.word_lag_list()
        if name not in self.word_logp or lag not in lags:
            raise InductionLabError(f"no whole-word log-probabilities at lag {lag} in this lag-probe result; run with "
                                    f"--word-tokens 2-4 and --word-lags >= {abs(lag)}")
        v = self.word_logp[name][:, :, lags.index(lag)].astype(np.float64)
        return np.nanmean(v if log else np.exp(v), axis=1)

    @property
    def has_corrected(self) -> bool:
        return self.list_ids is not None

    @property
    def lags(self) -> np.ndarray:
        """``[list_length]`` lag of each list position after the seed cue."""
        return lags_of(self.config.list_length, self.config.cue_position)

    def enrichment(self) -> dict[str, np.ndarray]:
        """condition name -> float64 ``[n_trials, list_length]`` log-enrichment, nats
        (:func:`~inductionlab.measures.lag.log_enrichment`, baseline within the condition, ``config.far_lag``).
        Raises InductionLabError without ``list_ids``."""
        if self.list_ids is None:
            raise InductionLabError("this lag-probe result has no list_ids; re-run to get the corrected curve")
        if not hasattr(self, "_enrichment"):
            self._enrichment = {n: log_enrichment(p, self.list_ids, self.lags, self.config.far_lag)
                                for n, p in self.probs.items()}
        return self._enrichment

    def curves(self) -> list[tuple[str, str, int, str, np.ndarray]]:
        """(name, kind, k, draw, probs ``[n_trials, list_length]``) per condition, plus pooled ``random-k``
        curves (per-trial mean over the draws, ``draw == "pooled"``; :func:`~inductionlab.measures.lag.curve_arms`)."""
        return curve_arms(self.conditions, self.probs)

    def corrected_curves(self) -> list[tuple[str, str, int, str, np.ndarray]]:
        """As :meth:`curves`, for the log-enrichment (nats)."""
        return curve_arms(self.conditions, self.enrichment())

    def summary(self) -> pd.DataFrame:
        """Tidy table: one row per (condition, lag) with mean probability, 95% CI, renormalised mean and CI,
        pooled ``random-k`` rows included (:func:`~inductionlab.measures.lag.curve_table`)."""
        return curve_table(self.curves(), self.lags)

    def corrected_summary(self) -> pd.DataFrame:
        """Tidy table: one row per (condition, lag): ``mean`` log-enrichment (nats) and its 95% CI,
        ``measure == "log_enrichment"``, pooled ``random-k`` rows included (:func:`~inductionlab.measures.lag.enrichment_table`)."""
        return enrichment_table(self.corrected_curves(), self.lags)

    def headline(self) -> pd.DataFrame:
        """One row per condition plus pooled ``random-k`` rows (``draw == "mean of <n>"``): p(lag +1 / −1 / 0),
        list mass and, with ``list_ids``, the lag ±1 log-enrichment (:func:`~inductionlab.measures.lag.headline_table`)."""
        return headline_table(self.conditions, self.probs, self.list_mass, self.config.cue_position,
                              self.enrichment() if self.has_corrected else None)

    def contrasts(self, lag: int = 1, corrected: bool = False) -> pd.DataFrame:
        """Paired per-trial contrast at one lag for each k: random-k (mean of draws) − induction-k, with a
        95% CI over trials (:func:`~inductionlab.measures.lag.contrast_table`). ``corrected``: on the
        log-enrichment (nats) instead of the raw probability."""
        return contrast_table(self.conditions, self.enrichment() if corrected else self.probs, lag,
                              self.config.cue_position)

    def whole_word_json(self) -> dict:
        """The ``whole_word`` block of results.json: per condition and scored lag, the mean over trials of
        :meth:`whole_word` (``p`` and ``log_p``) with its 95% CI."""
        lags = self.config.word_lag_list()
        rows = []
        for c in self.conditions:
            for k in lags:
                for log in (True, False):
                    v = self.whole_word(c.name, k, log=log)
                    m, lo, hi = ci(v)
                    rows.append({"condition": c.name, "lag": k, "measure": "log_p" if log else "p", "mean": m,
                                 "ci_low": lo, "ci_high": hi})
        lengths = self.config.token_lengths()
        return {"definition": "whole next word: sum over its tokens of log p(token | list, cue, earlier tokens of the "
                              "word), nats (teacher forcing); p = exp(log_p); per trial the mean over the cues at which "
                              "the lag exists; probs / cue_probs / curves are each word's first-token probability",
                "token_lengths": list(lengths), "lags": lags, "by_lag": rows}

    def to_json(self) -> dict:
        """The ``lag_probe`` block of results.json."""
        e = self.enrichment() if self.has_corrected else None
        conds = [condition_json(c.to_dict(), self.probs[c.name], self.list_mass[c.name], self.argmax_lag[c.name],
                                self.config.cue_position, None if e is None else e[c.name]) for c in self.conditions]
        out = {"config": asdict(self.config), "words": self.words, "conditions": conds,
               "headline": self.headline().to_dict(orient="records"),
               "contrasts_lag_plus1": self.contrasts(1).to_dict(orient="records")}
        if self.word_logp:
            out["whole_word"] = self.whole_word_json()
        if self.cue_positions is not None:
            out["cues"] = {"n_cues": len(self.cue_positions), "first": int(self.cue_positions[0]),
                           "last": int(self.cue_positions[-1]), "headline_cue": self.config.cue_position,
                           "note": "headline, curves and contrasts: the seed cue (cue_position) only; "
                                   "per-cue arrays in lag_trials.npz (cue_probs/<condition>, …)"}
        if e is not None:
            out["log_enrichment_definition"] = (
                f"log p(word at lag) − log baseline(word), nats; baseline = the word's mean probability over "
                f"trials where it sits at |lag| > {self.config.far_lag}, within the condition")
            out["contrasts_lag_plus1_log_enrichment"] = self.contrasts(1, corrected=True).to_dict(orient="records")
        return out


def build_trials(loaded: LoadedModel, cfg: LagProbeConfig) -> Trials:
    """All trials of a run.

    Returns: :class:`~inductionlab.protocols.runner.Trials` with ``ids`` LongTensor ``[n_trials, T]``,
    ``list_ids`` LongTensor ``[n_trials, list_length]`` (the word at each list position),
    ``cue_start`` LongTensor ``[n_trials]`` (index of the seed cue's first token: the list part is
    ``ids[:, :cue_start]``), and the word set (fixed mode; empty when resampling).

    Raises:
        InductionLabError: word pool smaller than the list; trial longer than the model's context;
            cue position outside the list.
    """
    cfg.validate()
    tok = loaded.tokenizer
    stim = make_stimulus(tok, cfg.separator, cfg.instruction, cfg.bos)
    if cfg.multi_token:
        return word_trials(loaded, cfg, word_pool(tok, cfg.list_length, lengths=cfg.token_lengths(),
                                                  prefix=stim.word_prefix, top_n=cfg.word_top_n), stim)
    n_pool = max(cfg.pool_size, cfg.list_length) if cfg.resample_words else cfg.list_length
    try:
        pool = single_token_words(tok, n_pool, prefix=stim.word_prefix)
    except InductionLabError as e:
        raise InductionLabError(f"{e} (list length {cfg.list_length})") from None
    length = len(stim.trial([p.token_id for p in pool[:cfg.list_length]], cfg.cue_position))
    ctx = loaded.identity.get("max_position_embeddings")
    if ctx and length > ctx:
        raise InductionLabError(f"a trial of {length} tokens exceeds the model's context of {ctx}; "
                                "use a shorter --list-length")
    ids, lists = [], []
    for t in range(cfg.n_permutations):
        rng = np.random.default_rng(seed_for(cfg.seed, t))
        if cfg.resample_words:
            chosen = [pool[i].token_id for i in rng.choice(len(pool), cfg.list_length, replace=False)]
        else:
            chosen = [pool[i].token_id for i in rng.permutation(cfg.list_length)]
        ids.append(stim.trial(chosen, cfg.cue_position))
        lists.append(chosen)
    words = [] if cfg.resample_words else [p.text for p in pool]
    start = length - (2 * len(stim.sep_ids) + 1)                       # where the seed cue's tokens begin
    return Trials({"ids": torch.tensor(ids), "list_ids": torch.tensor(lists),
                   "cue_start": torch.full((len(ids),), start, dtype=torch.long)}, words)


def word_trials(loaded: LoadedModel, cfg: LagProbeConfig, pool: list[TokenWord], stim: Stimulus | None = None
                ) -> Trials:
    """The trials of a list of (multi-token) words ``pool`` (its first ``list_length``, permuted per trial by
    ``seed_for(cfg.seed, t)`` as the single-token probe's fixed set).

    Returns: :class:`~inductionlab.protocols.runner.Trials` with ``ids`` LongTensor ``[n_trials, S]`` (the list
    part: prefix, words and separators), ``list_ids`` ``[n_trials, L]`` each position's first token, ``word_ids``
    ``[n_trials, L, M]`` its tokens (padded with its first), ``word_len`` ``[n_trials, L]``, ``sep``
    ``[n_trials, s]`` the separator's ids, ``cue_start`` ``[n_trials]`` = S; and the words' texts.

    Raises:
        InductionLabError: fewer words than the list; the longest seed trial exceeds the model's context."""
    stim = stim or make_stimulus(loaded.tokenizer, cfg.separator, cfg.instruction, cfg.bos)
    L = cfg.list_length
    if len(pool) < L:
        raise InductionLabError(f"word pool too small: {len(pool)} words, {L} needed; use a shorter --list-length")
    pool = pool[:L]
    M = max(len(w.ids) for w in pool)
    ids, firsts, toks, lens = [], [], [], []
    for t in range(cfg.n_permutations):
        order = np.random.default_rng(seed_for(cfg.seed, t)).permutation(L)
        row = list(stim.prefix_ids)
        for j, i in enumerate(order):
            row += (stim.sep_ids if j else []) + list(pool[i].ids)
        ids.append(row)
        firsts.append([pool[i].ids[0] for i in order])
        toks.append([list(pool[i].ids) + [pool[i].ids[0]] * (M - len(pool[i].ids)) for i in order])
        lens.append([len(pool[i].ids) for i in order])
    S = len(ids[0])
    longest = S + 2 * len(stim.sep_ids) + 2 * M - 1
    ctx = loaded.identity.get("max_position_embeddings")
    if ctx and longest > ctx:
        raise InductionLabError(f"a trial of up to {longest} tokens exceeds the model's context of {ctx}; "
                                "use a shorter --list-length or --word-tokens")
    n = len(ids)
    return Trials({"ids": torch.tensor(ids), "list_ids": torch.tensor(firsts), "word_ids": torch.tensor(toks),
                   "word_len": torch.tensor(lens),
                   "sep": torch.tensor([stim.sep_ids] * n, dtype=torch.long).reshape(n, -1),
                   "cue_start": torch.full((n,), S, dtype=torch.long)}, [w.text for w in pool])


#: bytes of float32 logits one packed multi-token forward may hold (bounds the cues per chunk; SmolLM2, 8 lists,
#: words of 2-4 tokens, 5 scored lags: 25 MB per cue, so 51 cues in one forward)
WORD_LOGIT_BYTES = 2 << 30


def word_chunk(b: int, list_tokens: int, cfg: LagProbeConfig, M: int, s: int, vocab: int) -> int:
    """Cues per packed multi-token forward: the cue tokens at most the list's
    (:func:`~inductionlab.protocols.packed.cue_chunk`) and the logits read at most :data:`WORD_LOGIT_BYTES`
    (``cfg.cue_chunk`` overrides both)."""
    K = len(cfg.word_lag_list())
    per_cue = 2 * s + M + K * (M - 1)
    reads = 1 + K * (M - 1)
    return cfg.cue_chunk or max(1, min(cue_chunk(list_tokens, per_cue), WORD_LOGIT_BYTES // (4 * b * reads * vocab)))


def measure_words(model, batch: dict[str, torch.Tensor], cfg: LagProbeConfig, lags: list[int] | None = None
                  ) -> dict[str, torch.Tensor]:
    """One batch of multi-token trials (:func:`word_trials`) → the measures of :func:`measure_batch` on each
    word's first token, and ``word_logp`` float32 ``[b, n_cues, K]``: ``log p`` of the whole word at each of the
    lags ``cfg.word_lag_list()`` (``lags``: others) after cue c (NaN: outside the list); ``word_len`` ``[b, L]``.
    Packed forwards of :func:`~inductionlab.protocols.packed.word_cue_logits`, the seed cue run with the chosen
    ones (as :func:`measure_batch`'s all-cue path).

    Raises:
        InductionLabError: the architecture cannot take a custom 4-D mask."""
    check_packed_support(model)
    lags = cfg.word_lag_list() if lags is None else list(lags)
    lst, words, wlen = batch["list_ids"], batch["word_ids"], batch["word_len"]
    sep = batch["sep"][0].tolist()
    positions = cfg.cue_positions()
    run = positions if cfg.cue_position in positions else positions + [cfg.cue_position]
    b, L = lst.shape
    M, K = words.shape[2], len(lags)
    chunk = word_chunk(b, batch["ids"].shape[1], cfg, M, len(sep), model.config.vocab_size)
    pls, masses, cols, wlps = [], [], [], []
    dev = lst.device
    ar = torch.arange(M - 1, device=dev)
    for c0 in range(0, len(run), chunk):
        cues = run[c0:c0 + chunk]
        logits = word_cue_logits(model, batch["ids"], words, wlen, sep, cues, lags)   # [b, n, 1 + K(M-1), V]
        n = len(cues)
        first = logits[:, :, 0]
        lse = []
        for j in range(0, n, _SOFTMAX_CUES):                                       # bounded copies of the logits
            part = torch.softmax(first[:, j:j + _SOFTMAX_CUES], dim=-1)
            pl, mass, col = _read(part, lst, torch.tensor(cues[j:j + _SOFTMAX_CUES], device=dev))
            pls.append(pl), masses.append(mass), cols.append(col)
            lse.append(torch.logsumexp(logits[:, j:j + _SOFTMAX_CUES], dim=-1))
        lse = torch.cat(lse, 1)                                                    # [b, n, R]

        def logp(rows: slice, ids: torch.Tensor) -> torch.Tensor:                 # log p of ids [b, n, r]
            return logits[:, :, rows].gather(-1, ids[..., None]).squeeze(-1) - lse[:, :, rows]
        cue_t = torch.tensor(cues, device=dev)
        for kk, k in enumerate(lags):
            j = cue_t + k                                                          # [n] 1-based target
            ok = (j >= 1) & (j <= L)
            ji = torch.where(ok, j, cue_t) - 1
            tgt = words[:, ji]                                                     # [b, n, M]
            tl = wlen[:, ji]                                                       # [b, n]
            lp = logp(slice(0, 1), tgt[:, :, :1])[..., 0]                          # first token, [b, n]
            if M > 1:                                                              # the branch's M-1 reads
                more = logp(slice(1 + kk * (M - 1), 1 + (kk + 1) * (M - 1)), tgt[:, :, 1:])   # [b, n, M-1]
                lp = lp + torch.where(ar[None, None] < (tl[:, :, None] - 1), more, torch.zeros_like(more)).sum(-1)
            wlps.append(torch.where(ok[None], lp, torch.full_like(lp, float("nan"))).float())
        del logits
    pl, mass, col = torch.cat(pls, 1), torch.cat(masses, 1), torch.cat(cols, 1)
    n_chunks = -(-len(run) // chunk)
    wl = torch.stack([torch.cat([wlps[c * K + kk] for c in range(n_chunks)], 1) for kk in range(K)], -1)   # [b, n, K]
    seed, n = run.index(cfg.cue_position), len(positions)
    return {"probs": pl[:, seed], "list_mass": mass[:, seed], "argmax_lag": col[:, seed], "list_ids": lst.cpu(),
            "cue_probs": pl[:, :n], "cue_list_mass": mass[:, :n], "cue_argmax_lag": col[:, :n],
            "word_logp": wl[:, :n], "word_len": wlen.cpu()}


def measure_batch(model, batch: dict[str, torch.Tensor], cfg: LagProbeConfig) -> dict[str, torch.Tensor]:
    """One batch of trials: ``ids`` ``[b, T]`` (the seed trials), ``list_ids`` ``[b, list_length]``,
    ``cue_start`` ``[b]`` (where the seed trial's cue tokens begin) →
    ``probs`` float32 ``[b, list_length]`` (raw probability of each list position's word after the
    seed cue ``cue_position``), ``list_mass`` float64 ``[b]``, ``argmax_lag`` float64 ``[b]`` (NaN:
    arg-max not a list word), and per chosen cue c (``cfg.cue_positions()``): ``cue_probs`` float32
    ``[b, n_cues, list_length]``, ``cue_list_mass`` float64 ``[b, n_cues]``, ``cue_argmax_lag``
    float64 ``[b, n_cues]`` (lag relative to cue c).

    ``cues="seed"``: one forward of the seed trial, the last position read. Otherwise one packed
    forward per cue chunk (:func:`~inductionlab.protocols.packed.cue_logits`).

    Raises:
        InductionLabError: (all-cue) the architecture cannot take a custom 4-D mask
            (:func:`~inductionlab.protocols.packed.check_packed_support`).

    Multi-token words (``cfg.multi_token``): :func:`measure_words`.
    """
    if cfg.multi_token:
        return measure_words(model, batch, cfg)
    lst = batch["list_ids"]
    positions = cfg.cue_positions()
    if cfg.cues.strip() == "seed":
        p = torch.softmax(forward_logits(model, batch["ids"], 1)[:, -1], dim=-1)   # [b, V], last position only
        pl, mass, col = _read(p[:, None], lst, torch.tensor([cfg.cue_position], device=lst.device))
        return {"probs": pl[:, 0], "list_mass": mass[:, 0], "argmax_lag": col[:, 0], "list_ids": lst.cpu(),
                "cue_probs": pl, "cue_list_mass": mass, "cue_argmax_lag": col}
    check_packed_support(model)
    run = positions if cfg.cue_position in positions else positions + [cfg.cue_position]
    ids, start = batch["ids"], int(batch["cue_start"][0])
    chunk = cue_chunk(start, ids.shape[1] - start, cfg.cue_chunk)
    pls, masses, cols = [], [], []
    for c0 in range(0, len(run), chunk):
        cues = run[c0:c0 + chunk]
        logits = cue_logits(model, ids, lst, start, cues)                       # [b, n, V] float32
        for j in range(0, len(cues), _SOFTMAX_CUES):                            # bounded softmax copies
            part = torch.softmax(logits[:, j:j + _SOFTMAX_CUES], dim=-1)
            pl, mass, col = _read(part, lst, torch.tensor(cues[j:j + _SOFTMAX_CUES], device=lst.device))
            pls.append(pl), masses.append(mass), cols.append(col)
        del logits
    pl, mass, col = torch.cat(pls, 1), torch.cat(masses, 1), torch.cat(cols, 1)
    seed = run.index(cfg.cue_position)
    n = len(positions)
    return {"probs": pl[:, seed], "list_mass": mass[:, seed], "argmax_lag": col[:, seed], "list_ids": lst.cpu(),
            "cue_probs": pl[:, :n], "cue_list_mass": mass[:, :n], "cue_argmax_lag": col[:, :n]}


_SOFTMAX_CUES = 16     # cues per softmax over the vocabulary (bounds the copy of the logits)


def _read(p: torch.Tensor, lst: torch.Tensor, cues: torch.Tensor):
    """``p`` ``[b, n, V]`` next-token probabilities after ``n`` cues at 1-based list positions
    ``cues`` ``[n]``, ``lst`` ``[b, L]`` → (float32 ``[b, n, L]`` probability of each list word,
    float64 ``[b, n]`` list mass, float64 ``[b, n]`` lag of the arg-max, NaN if not a list word)."""
    b, n, _ = p.shape
    pl = p.gather(2, lst[:, None, :].expand(b, n, -1)).float()
    hit = lst[:, None, :] == p.argmax(-1, keepdim=True)                      # [b, n, L]
    col = hit.float().argmax(-1).double() + 1 - cues.double()[None, :]
    col[~hit.any(-1)] = float("nan")
    return pl, pl.sum(-1).double(), col


def batch_size(loaded, trials: Trials, cfg: LagProbeConfig) -> int | None:
    """Trials per forward, decided here for every caller: ``cfg.batch_size``; else, from free GPU memory
    (:func:`~inductionlab.protocols.runner.auto_batch_size`; 8 on a CPU), at the length a forward really
    has: the seed trial for ``cues="seed"``, the packed list and one chunk of cues (with one logit row
    per cue) otherwise."""
    if cfg.batch_size or not len(trials):
        return cfg.batch_size
    t = trials.tensors
    if cfg.multi_token:
        S, M, s = t["ids"].shape[1], t["word_ids"].shape[2], t["sep"].shape[1]
        K = len(cfg.word_lag_list())
        n = len(cfg.cue_positions()) + (cfg.cue_position not in cfg.cue_positions())
        per_cue = 2 * s + M + K * (M - 1)
        chunk = min(n, cfg.cue_chunk or cue_chunk(S, per_cue))
        return auto_batch_size(loaded, S + chunk * per_cue, chunk * (1 + K * (M - 1)))
    if cfg.cues.strip() == "seed":
        return auto_batch_size(loaded, t["ids"].shape[1])
    start = int(t["cue_start"][0])
    cue_len = t["ids"].shape[1] - start
    n = len(cfg.cue_positions()) + (cfg.cue_position not in cfg.cue_positions())
    chunk = min(n, cue_chunk(start, cue_len, cfg.cue_chunk))
    return auto_batch_size(loaded, start + chunk * cue_len, chunk)


def probe(cfg: LagProbeConfig) -> Probe:
    """The lag probe bound to ``cfg``: trials (:func:`build_trials`), ``measure_batch`` and the batch size
    (:func:`batch_size`), for :func:`~inductionlab.protocols.runner.run_conditions` and a study's phases.

    Raises:
        InductionLabError: ``cfg`` invalid (:meth:`LagProbeConfig.validate`)."""
    cfg.validate()
    return Probe("lag probe", partial(build_trials, cfg=cfg), partial(measure_batch, cfg=cfg),
                 partial(batch_size, cfg=cfg), cfg.method, cfg.reuse_residual, cfg.positions)


def check_cues(loaded: LoadedModel, cfg: LagProbeConfig) -> None:
    """Before a run: the model can take the cues asked for (``seed`` always; otherwise
    :func:`~inductionlab.protocols.packed.check_packed_support`). Raises InductionLabError (one line, the fix: ``--cues seed``)."""
    if cfg.cues.strip() != "seed" or cfg.multi_token:
        check_packed_support(loaded.model)


def run_lag_probe(loaded: LoadedModel, conditions: list[Condition], cfg: LagProbeConfig | None = None,
                  progress=None, dist=None) -> LagProbeResult:
    """Run the lag probe under each condition (intact or with its heads ablated by ``cfg.method``).

    Args:
        loaded: from :func:`inductionlab.core.models.load_model`.
        conditions: e.g. from :func:`inductionlab.core.ablation.ablation_conditions`.
        progress: optional callable(n_trials_done) for a progress bar.
        dist: a :class:`~inductionlab.runtime.distributed.Dist` to shard the trials' batches over (every rank
            calls with the same arguments and gets the same result; :func:`~inductionlab.protocols.runner.run_conditions`).

    Raises:
        InductionLabError: see :func:`build_trials`; head out of range; unknown method; no conditions.
        TypeError: ``loaded`` not a LoadedModel, ``cfg`` not a LagProbeConfig, a condition not a Condition.
    """
    check_loaded(loaded, "run_lag_probe")
    cfg = LagProbeConfig() if cfg is None else cfg
    check_type(cfg, LagProbeConfig, "run_lag_probe: cfg")
    check_conditions(conditions, "run_lag_probe")
    p = probe(cfg)
    trials = p.build_trials(loaded)
    check_cues(loaded, cfg)
    data = p.run(loaded, conditions, trials, progress=progress, dist=dist)
    return LagProbeResult.from_parts(data, conditions, cfg, trials.words)


def list_ids_of(parts: dict) -> np.ndarray | None:
    """The ``[n_trials, list_length]`` word ids from a run's per-condition measures (the same in
    every condition); None when they were not stored (runs from before they were)."""
    for d in parts.values():
        if "list_ids" in d:
            return np.asarray(d["list_ids"])
    return None
