"""Protocol T1 — the lag probe (SPEC §4), free-recall style.

One trial: ``[BOS] w1 … w500`` then the cue ``w250`` again; the next-token distribution at
the last position is read, and the probability of the word at list position ``250 + k`` is
the probability at **lag k** (k ∈ [−249, +250]; lag 0 = repeating the cue). Each trial is a
fresh random order of a fixed set of the 500 most frequent single-token words (seed protocol:
one 500-word sequence, 5,000 permutations); ``resample_words`` draws a new set per trial.
Every condition sees the same trials (paired design).

**All cues at once** (``cues="all"`` or ``"A-B"``; issue 17): the list part of a trial
(``[BOS] w1 … w500``) is the same whatever the cue, so it runs once and every chosen list
position i is cued by the seed trial's own cue tokens ``sep w_i sep`` appended after it. One
packed forward reads ``[list ; cue_1 ; cue_2 ; …]`` with a 4-D additive attention mask (list
tokens: causal over the list; cue tokens: the whole list and their own cue, causally; a
sliding-window layer also applies its window, on position ids) and explicit position ids (each
cue's tokens take the positions they have in the single-cue trial), so cue i reads what the
single-cue trial with ``cue_position=i`` reads (equal within 1e-5 in fp32:
tests/test_lag_probe_cues.py). Cues go in chunks whose tokens do not outnumber the list's, so a
forward holds at most twice the seed trial's tokens. The seed cue (``cue_position``) always
runs, an extra cue when it is not among the chosen ones: the headline, curves and contrasts
are the seed protocol's, from the same run; the per-cue arrays (``cue_probs`` …) add the other
cues for the serial-position analyses. Chosen over a KV cache of the list reused by the cue
tokens: that forward was 10% faster (SmolLM2, fp32, one thread: 3.5 s against 4.0 s per trial)
but a cached call cannot take the residual reuse across conditions (:mod:`inductionlab.core.reuse`,
20% of the lag-probe phase), and the packed forward is one ordinary call of the model.

Reported per condition: mean raw probability per lag with a 95% CI over trials (normal
approximation, mean ± 1.96·sd/√n), the same renormalised over the list tokens, the list mass
(total probability on list tokens), and the arg-max response's lag (for the psifr-style CRP).

**Word-prior-corrected curve** (:func:`log_enrichment`): a frequent word is likely anywhere, so
one word per lag and trial makes the raw curve noisy. Within each condition, each word's
baseline is its mean probability over the trials where it sits far from the cue
(|lag| > ``far_lag``, default 20); the per-trial log-enrichment at lag k is
``log p(word at lag k) − log baseline(word)`` (nats; 0 = no more likely than its prior), with the
same CI over trials; reported next to the raw curve, never instead of it.
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
from ..core.stimuli import seed_for, single_token_words
from ..errors import InductionLabError
from ..measures.stats import draws_by_k, mean_ci, pooled, put_ci
from .configs import LagProbeConfig
from .runner import Probe, Trials, auto_batch_size, forward_logits, run_conditions


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


def log_enrichment(probs: np.ndarray, list_ids: np.ndarray, lags: np.ndarray, far_lag: int = 20,
                   floor: float = 1e-30) -> np.ndarray:
    """Word-prior-corrected lag probe: per trial and list position, ``log p − log baseline(word)``.

    Args:
        probs: ``[n_trials, list_length]`` probability of each list position's word (one condition).
        list_ids: ``[n_trials, list_length]`` the word (token id) at each list position.
        lags: ``[list_length]`` lag of each list position.
        far_lag: a word's baseline is its mean probability over the (trial, position) pairs where
            it sits at ``|lag| > far_lag``; a word never that far uses all its positions.
        floor: probabilities are clamped below at ``floor`` before the log.

    Returns:
        float64 ``[n_trials, list_length]`` log-enrichment in nats.
    """
    p = np.asarray(probs, dtype=np.float64)
    ids = np.asarray(list_ids)
    if p.shape != ids.shape or p.shape[1] != len(lags):
        raise ValueError(f"probs {p.shape}, list_ids {ids.shape} and lags ({len(lags)}) do not match")
    uniq, inv = np.unique(ids, return_inverse=True)
    inv = inv.reshape(ids.shape)
    far = np.broadcast_to(np.abs(np.asarray(lags))[None, :] > far_lag, p.shape)
    n = len(uniq)
    s_far = np.bincount(inv[far], weights=p[far], minlength=n)
    c_far = np.bincount(inv[far], minlength=n)
    s_all = np.bincount(inv.ravel(), weights=p.ravel(), minlength=n)
    c_all = np.bincount(inv.ravel(), minlength=n)
    base = np.where(c_far > 0, s_far / np.maximum(c_far, 1), s_all / np.maximum(c_all, 1))
    return np.log(np.maximum(p, floor)) - np.log(np.maximum(base[inv], floor))


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
                   cue_positions=np.asarray(config.cue_positions()) if cue_probs else None)

    @property
    def has_corrected(self) -> bool:
        return self.list_ids is not None

    def enrichment(self) -> dict[str, np.ndarray]:
        """condition name -> ``[n_trials, list_length]`` log-enrichment (:func:`log_enrichment`,
        baseline within the condition). Raises InductionLabError without ``list_ids``."""
        if self.list_ids is None:
            raise InductionLabError("this lag-probe result has no list_ids; re-run to get the corrected curve")
        if not hasattr(self, "_enrichment"):
            far = getattr(self.config, "far_lag", 20)
            self._enrichment = {n: log_enrichment(p, self.list_ids, self.lags, far) for n, p in self.probs.items()}
        return self._enrichment

    def corrected_curves(self) -> list[tuple[str, str, int, str, np.ndarray]]:
        """As :meth:`curves`, for the log-enrichment (pooled random-k: per-trial mean over draws)."""
        e = self.enrichment()
        out = [(c.name, c.kind, c.k, str(c.draw), e[c.name]) for c in self.conditions]
        for k, names in draws_by_k(self.conditions).items():
            out.append((f"random-{k}", "random", k, "pooled", pooled(e, names)))
        return out

    def corrected_summary(self) -> pd.DataFrame:
        """Tidy table: one row per (condition, lag): ``mean`` log-enrichment (nats) and its 95% CI
        (``ci_low``, ``ci_high``), ``measure == "log_enrichment"``; pooled ``random-k`` rows included."""
        rows = []
        for name, kind, k, draw, e in self.corrected_curves():
            m, half = mean_ci(e)
            rows.append(pd.DataFrame({"condition": name, "kind": kind, "k": k, "draw": draw, "measure": "log_enrichment",
                                      "lag": self.lags, "mean": m, "ci_low": m - half, "ci_high": m + half}))
        return pd.concat(rows, ignore_index=True)

    @property
    def lags(self) -> np.ndarray:
        return np.arange(1, self.config.list_length + 1) - self.config.cue_position

    def _col(self, lag: int) -> int:
        return lag + self.config.cue_position - 1

    def curves(self) -> list[tuple[str, str, int, str, np.ndarray]]:
        """(name, kind, k, draw, probs [n_trials, list_length]) per condition, plus pooled
        ``random-k`` curves (per-trial mean over the random draws for that k)."""
        out = [(c.name, c.kind, c.k, str(c.draw), self.probs[c.name]) for c in self.conditions]
        for k, names in draws_by_k(self.conditions).items():
            out.append((f"random-{k}", "random", k, "pooled", pooled(self.probs, names)))
        return out

    def summary(self) -> pd.DataFrame:
        """Tidy table: one row per (condition, lag) with mean, 95% CI, renormalised mean and CI.
        Includes pooled ``random-k`` rows (``draw == "pooled"``)."""
        rows = []
        for name, kind, k, draw, probs in self.curves():
            p = probs.astype(np.float64)
            pr = p / p.sum(1, keepdims=True)
            for arr, tag in ((p, ""), (pr, "_renorm")):
                m, half = mean_ci(arr)
                if tag == "":
                    base = pd.DataFrame({"condition": name, "kind": kind, "k": k, "draw": draw,
                                         "lag": self.lags, "mean": m, "ci_low": m - half, "ci_high": m + half})
                else:
                    base["mean_renorm"], base["ci_low_renorm"], base["ci_high_renorm"] = m, m - half, m + half
            rows.append(base)
        return pd.concat(rows, ignore_index=True)

    def headline(self) -> pd.DataFrame:
        """One row per condition plus pooled ``random-k`` rows (per-trial mean over draws)."""
        rows = []
        e = self.enrichment() if self.has_corrected else None
        for c in self.conditions:
            rows.append(self._headline_row(c.name, c.kind, c.k, str(c.draw), self.probs[c.name], self.list_mass[c.name],
                                           None if e is None else e[c.name]))
        for k, names in draws_by_k(self.conditions).items():
            rows.append(self._headline_row(f"random-{k}", "random", k, f"mean of {len(names)}",
                                           pooled(self.probs, names), pooled(self.list_mass, names),
                                           None if e is None else pooled(e, names)))
        return pd.DataFrame(rows)

    def contrasts(self, lag: int = 1, corrected: bool = False) -> pd.DataFrame:
        """Paired per-trial contrast at one lag for each k: random-k (mean of draws) − induction-k,
        with a 95% CI over trials (same trials in every condition). ``corrected``: on the
        log-enrichment (nats) instead of the raw probability."""
        rows = []
        col = self._col(lag)
        table = self.enrichment() if corrected else self.probs
        random = draws_by_k(self.conditions)
        for k, ind in draws_by_k(self.conditions, "induction").items():
            if k not in random:
                continue
            pi = table[ind[0]][:, col].astype(np.float64)
            pr = pooled(table, random[k])[:, col].astype(np.float64)
            m, half = mean_ci(pr - pi)
            rows.append({"k": k, "lag": lag, "induction": pi.mean(), "random": pr.mean(),
                         "random_minus_induction": float(m), "ci_low": float(m - half), "ci_high": float(m + half)})
        return pd.DataFrame(rows)

    def _headline_row(self, name, kind, k, draw, p, mass, e=None) -> dict:
        p = p.astype(np.float64)
        out = {"condition": name, "kind": kind, "k": k, "draw": draw}
        for lag, key in ((1, "lag_plus1"), (-1, "lag_minus1"), (0, "lag0")):
            put_ci(out, key, p[:, self._col(lag)])
        put_ci(out, "list_mass", mass)
        if e is not None:
            for lag, key in ((1, "lag_plus1_log_enrichment"), (-1, "lag_minus1_log_enrichment")):
                put_ci(out, key, e[:, self._col(lag)])
        return out

    def to_json(self) -> dict:
        """The ``lag_probe`` block of results.json."""
        conds = []
        e = self.enrichment() if self.has_corrected else None
        for c in self.conditions:
            p = self.probs[c.name].astype(np.float64)
            m, half = mean_ci(p)
            h = self._headline_row(c.name, c.kind, c.k, str(c.draw), p, self.list_mass[c.name])
            conds.append({**c.to_dict(), "n_trials": int(p.shape[0]),
                          "lag_plus1": h["lag_plus1"], "lag_minus1": h["lag_minus1"], "lag0": h["lag0"],
                          "list_mass": h["list_mass"],
                          "lags": {int(l): float(v) for l, v in zip(self.lags, m)},
                          "ci95": {int(l): [float(v - e), float(v + e)] for l, v, e in zip(self.lags, m, half)},
                          "argmax_in_list": float(np.mean(~np.isnan(self.argmax_lag[c.name])))})
            if e is not None:
                em, eh = mean_ci(e[c.name])
                conds[-1]["log_enrichment"] = {
                    "lags": {int(l): float(v) for l, v in zip(self.lags, em)},
                    "ci95": {int(l): [float(v - x), float(v + x)] for l, v, x in zip(self.lags, em, eh)}}
        out = {"config": asdict(self.config), "words": self.words, "conditions": conds,
               "headline": self.headline().to_dict(orient="records"),
               "contrasts_lag_plus1": self.contrasts(1).to_dict(orient="records")}
        if self.cue_positions is not None:
            out["cues"] = {"n_cues": len(self.cue_positions), "first": int(self.cue_positions[0]),
                           "last": int(self.cue_positions[-1]), "headline_cue": self.config.cue_position,
                           "note": "headline, curves and contrasts: the seed cue (cue_position) only; "
                                   "per-cue arrays in lag_trials.npz (cue_probs/<condition>, …)"}
        if e is not None:
            out["log_enrichment_definition"] = (
                f"log p(word at lag) − log baseline(word), nats; baseline = the word's mean probability over "
                f"trials where it sits at |lag| > {getattr(self.config, 'far_lag', 20)}, within the condition")
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


def measure_batch(model, batch: dict[str, torch.Tensor], cfg: LagProbeConfig) -> dict[str, torch.Tensor]:
    """One batch of trials: ``ids`` ``[b, T]`` (the seed trials), ``list_ids`` ``[b, list_length]``,
    ``cue_start`` ``[b]`` (where the seed trial's cue tokens begin) →
    ``probs`` float32 ``[b, list_length]`` (raw probability of each list position's word after the
    seed cue ``cue_position``), ``list_mass`` float64 ``[b]``, ``argmax_lag`` float64 ``[b]`` (NaN:
    arg-max not a list word), and per chosen cue c (``cfg.cue_positions()``): ``cue_probs`` float32
    ``[b, n_cues, list_length]``, ``cue_list_mass`` float64 ``[b, n_cues]``, ``cue_argmax_lag``
    float64 ``[b, n_cues]`` (lag relative to cue c).

    ``cues="seed"``: one forward of the seed trial, the last position read. Otherwise one packed
    forward per cue chunk (:func:`packed_cue_batch`).

    Raises:
        InductionLabError: (all-cue) the architecture cannot take a custom 4-D mask (:func:`check_packed_support`).
    """
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
    cue_len = ids.shape[1] - start
    chunk = cfg.cue_chunk or max(1, start // cue_len)
    pls, masses, cols = [], [], []
    for c0 in range(0, len(run), chunk):
        cues = run[c0:c0 + chunk]
        kw, readout = packed_cue_batch(model, ids, lst, start, cues)
        logits = _logits_at(model, kw, readout)                                  # [b, n, V] float32
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


def check_packed_support(model) -> None:
    """Refuse an architecture that cannot take the all-cue forward: it must build its masks with
    transformers' ``masking_utils`` (which passes a prepared 4-D mask through as it is), take
    ``position_ids``, and have no chunked attention.

    Raises:
        InductionLabError: one line naming the model class and the fix (``--cues seed``)."""
    import inspect
    import sys

    mod = sys.modules.get(type(getattr(model, "base_model", model)).__module__)
    cfg = getattr(model, "config", None)
    ok = (mod is not None and hasattr(mod, "create_causal_mask") and cfg is not None
          and "position_ids" in inspect.signature(model.forward).parameters
          and getattr(cfg, "attention_chunk_size", None) is None)
    if not ok:
        raise InductionLabError(f"{type(model).__name__} cannot take the all-cue lag probe's custom attention mask; "
                                "use --cues seed (one cue per forward)")


def batch_size(loaded, trials: Trials, cfg: LagProbeConfig) -> int | None:
    """Trials per forward, decided here for every caller: ``cfg.batch_size``; else, from free GPU memory
    (:func:`~inductionlab.protocols.runner.auto_batch_size`; 8 on a CPU), at the length a forward really
    has: the seed trial for ``cues="seed"``, the packed list and one chunk of cues (with one logit row
    per cue) otherwise."""
    if cfg.batch_size or not len(trials):
        return cfg.batch_size
    t = trials.tensors
    if cfg.cues.strip() == "seed":
        return auto_batch_size(loaded, t["ids"].shape[1])
    start = int(t["cue_start"][0])
    cue_len = t["ids"].shape[1] - start
    n = len(cfg.cue_positions()) + (cfg.cue_position not in cfg.cue_positions())
    chunk = min(n, cfg.cue_chunk or max(1, start // cue_len))
    return auto_batch_size(loaded, start + chunk * cue_len, chunk)


def probe(cfg: LagProbeConfig) -> Probe:
    """The lag probe bound to ``cfg``: trials (:func:`build_trials`), ``measure_batch`` and the batch size
    (:func:`batch_size`), for :func:`~inductionlab.protocols.runner.run_conditions` and a study's phases.

    Raises:
        InductionLabError: ``cfg`` invalid (:meth:`LagProbeConfig.validate`)."""
    cfg.validate()
    return Probe("lag probe", partial(build_trials, cfg=cfg), partial(measure_batch, cfg=cfg),
                 partial(batch_size, cfg=cfg), cfg.method, cfg.reuse_residual)


def check_cues(loaded: LoadedModel, cfg: LagProbeConfig) -> None:
    """Before a run: the model can take the cues asked for (``seed`` always; otherwise
    :func:`check_packed_support`). Raises InductionLabError (one line, the fix: ``--cues seed``)."""
    if cfg.cues.strip() != "seed":
        check_packed_support(loaded.model)


def packed_cue_batch(model, ids: torch.Tensor, list_ids: torch.Tensor, start: int, cues: list[int]):
    """The all-cue forward's inputs for one chunk of cues.

    Args:
        ids: ``[b, T]`` seed trials; ``ids[:, :start]`` is the list part (prefix + words and
            separators) and ``ids[:, start:]`` the seed cue's tokens ``sep w sep``.
        list_ids: ``[b, L]`` the word at each list position.
        cues: 1-based list positions to cue.

    Returns:
        ``(kwargs, readout)``: model keyword arguments ``input_ids`` ``[b, start + n·c]`` (the list,
        then each cue's ``sep w_i sep``), ``attention_mask`` additive in the model dtype
        ``[1, 1, T', T']``, the same for every row (a dict by layer type where the model has sliding-window layers) and
        ``position_ids`` ``[b, T']``; ``readout`` LongTensor ``[n]``: index of each cue's last token.
    """
    b, T = ids.shape
    c = T - start
    s = (c - 1) // 2
    dev = ids.device
    sep = ids[:, start:start + s]
    idx = torch.as_tensor(cues, device=dev) - 1
    words = list_ids[:, idx]                                                   # [b, n]
    n = len(cues)
    block = torch.cat([sep[:, None, :].expand(b, n, s), words[:, :, None], sep[:, None, :].expand(b, n, s)], 2)
    input_ids = torch.cat([ids[:, :start], block.reshape(b, n * c)], 1)
    Tp = input_ids.shape[1]
    pos = torch.cat([torch.arange(start, device=dev), (start + torch.arange(c, device=dev)).repeat(n)])
    group = torch.cat([torch.full((start,), -1, device=dev), torch.arange(n, device=dev).repeat_interleave(c)])
    q, k = torch.arange(Tp, device=dev)[:, None], torch.arange(Tp, device=dev)[None, :]
    allowed = (k <= q) & ((group[None, :] == -1) | (group[None, :] == group[:, None]))
    dtype = next(model.parameters()).dtype
    neg = torch.finfo(dtype).min

    def additive(ok):
        return torch.zeros(Tp, Tp, dtype=dtype, device=dev).masked_fill(~ok, neg)[None, None]   # broadcast over b

    mask = additive(allowed)
    cfg = model.config
    types = set(getattr(cfg, "layer_types", None) or ())
    window = getattr(cfg, "sliding_window", None)
    if "sliding_attention" in types and window:
        near = (pos[:, None] - pos[None, :]) < window                          # transformers: kv > q - window
        mask = {t: (additive(allowed & near) if t == "sliding_attention" else mask) for t in types}
    elif types - {"full_attention"}:
        raise InductionLabError(f"{type(model).__name__} has layer types {sorted(types)} the all-cue lag probe "
                                "does not handle; use --cues seed")
    readout = start + torch.arange(n, device=dev) * c + c - 1
    return {"input_ids": input_ids, "attention_mask": mask, "position_ids": pos[None].expand(b, Tp)}, readout


def _logits_at(model, kw: dict, readout: torch.Tensor) -> torch.Tensor:
    """Float32 logits ``[b, n, V]`` at the ``readout`` positions ``[n]`` (``logits_to_keep`` as an
    index tensor where the model takes it, so the LM head runs on those positions only)."""
    try:
        out = model(**kw, logits_to_keep=readout).logits
        if out.shape[1] == len(readout):
            return out.float()
    except TypeError:   # architectures without logits_to_keep
        pass
    return model(**kw).logits[:, readout].float()


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
