"""Protocol T1 — the lag probe (SPEC §4), free-recall style.

One trial: ``[BOS] w1 … w500`` then the cue ``w250`` again; the next-token distribution at
the last position is read, and the probability of the word at list position ``250 + k`` is
the probability at **lag k** (k ∈ [−249, +250]; lag 0 = repeating the cue). Each trial is a
fresh random order of a fixed set of the 500 most frequent single-token words (seed protocol:
one 500-word sequence, 5,000 permutations); ``resample_words`` draws a new set per trial.
Every condition sees the same trials (paired design).

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

from .ablation import Condition
from .checks import check_conditions, check_fields, check_loaded, check_type
from .errors import InductionLabError
from .models import LoadedModel
from .protocol import Trials, check_method, forward_logits, run_conditions
from .stats import draws_by_k, mean_ci, pooled, put_ci
from .stimuli import seed_for, single_token_words


@dataclass
class LagProbeConfig:
    """Lag-probe parameters; defaults follow the seed protocol (SPEC §4) except where noted."""
    list_length: int = 500          # words per list (seed protocol)
    cue_position: int = 250         # 1-based list position of the repeated word (seed protocol)
    n_permutations: int = 5000      # trials (seed protocol: 5,000; the CLI default is lower for CPU)
    batch_size: int | None = None   # trials per forward pass; None: from free GPU memory (CPU: 8)
    seed: int = 0
    resample_words: bool = False    # False: fixed set of the most frequent words, new order per trial
    pool_size: int = 2000           # pool to resample from when resample_words
    separator: str = " "            # between words: " " (each word its own leading-space token), ", ", "\n"
    instruction: str = ""           # optional text after BOS, before the list
    bos: bool = True
    method: str = "zero"            # ablation method: zero | mean | sink
    far_lag: int = 20               # word-prior baseline: trials where the word sits at |lag| > far_lag
    reuse_residual: bool = True     # skip layers below a condition's first ablated head (bit-identical; reuse.py)

    def validate(self) -> None:
        """Check the options that need no model (called before any model is loaded).

        Raises:
            InductionLabError: cue outside the list, fewer than 2 trials (no CI), bad batch size or method,
                a NaN / infinite / beyond-64-bit number (:func:`~inductionlab.checks.check_fields`).
            TypeError: a field of the wrong type.
        """
        check_fields(self)
        if self.list_length < 2:
            raise InductionLabError(f"list length {self.list_length} is too short; use at least 2 words")
        if not 1 <= self.cue_position <= self.list_length:
            raise InductionLabError(f"cue position {self.cue_position} is outside a list of {self.list_length} words")
        if self.n_permutations < 2:
            raise InductionLabError(f"n_permutations={self.n_permutations}: at least 2 trials are needed for a CI")
        if self.batch_size is not None and self.batch_size < 1:
            raise InductionLabError(f"batch size {self.batch_size} must be at least 1")
        if self.far_lag < 0:
            raise InductionLabError(f"far lag {self.far_lag} must be at least 0 (the default is 20)")
        check_method(self.method)


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
    """
    probs: dict[str, np.ndarray]
    list_mass: dict[str, np.ndarray]
    argmax_lag: dict[str, np.ndarray]
    conditions: list[Condition]
    config: LagProbeConfig
    words: list[str] = field(default_factory=list)
    list_ids: np.ndarray | None = None

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
        if e is not None:
            out["log_enrichment_definition"] = (
                f"log p(word at lag) − log baseline(word), nats; baseline = the word's mean probability over "
                f"trials where it sits at |lag| > {getattr(self.config, 'far_lag', 20)}, within the condition")
            out["contrasts_lag_plus1_log_enrichment"] = self.contrasts(1, corrected=True).to_dict(orient="records")
        return out


def build_trials(loaded: LoadedModel, cfg: LagProbeConfig) -> Trials:
    """All trials of a run.

    Returns: :class:`~inductionlab.protocol.Trials` with ``ids`` LongTensor ``[n_trials, T]``,
    ``list_ids`` LongTensor ``[n_trials, list_length]`` (the word at each list position), and the
    word set (fixed mode; empty when resampling).

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
    return Trials({"ids": torch.tensor(ids), "list_ids": torch.tensor(lists)}, words)


def measure_batch(model, batch: dict[str, torch.Tensor], cfg: LagProbeConfig) -> dict[str, torch.Tensor]:
    """One batch of trials: ``ids`` ``[b, T]``, ``list_ids`` ``[b, list_length]`` →
    ``probs`` float32 ``[b, list_length]`` (raw probability of each list position's word),
    ``list_mass`` float64 ``[b]``, ``argmax_lag`` float64 ``[b]`` (NaN: arg-max not a list word)."""
    lst = batch["list_ids"]
    p = torch.softmax(forward_logits(model, batch["ids"], 1)[:, -1], dim=-1)   # [b, V], last position only
    pl = p.gather(1, lst)                                                     # [b, list_length]
    hit = lst == p.argmax(1, keepdim=True)
    col = hit.float().argmax(1).double() + 1 - cfg.cue_position
    col[~hit.any(1)] = float("nan")
    return {"probs": pl, "list_mass": pl.sum(1).double(), "argmax_lag": col, "list_ids": lst.cpu()}


def run_lag_probe(loaded: LoadedModel, conditions: list[Condition], cfg: LagProbeConfig | None = None,
                  progress=None, dist=None) -> LagProbeResult:
    """Run the lag probe under each condition (intact or with its heads ablated by ``cfg.method``).

    Args:
        loaded: from :func:`inductionlab.models.load_model`.
        conditions: e.g. from :func:`inductionlab.ablation.ablation_conditions`.
        progress: optional callable(n_trials_done) for a progress bar.
        dist: a :class:`~inductionlab.distributed.Dist` to shard the trials' batches over (every rank
            calls with the same arguments and gets the same result; :func:`~inductionlab.protocol.run_conditions`).

    Raises:
        InductionLabError: see :func:`build_trials`; head out of range; unknown method; no conditions.
        TypeError: ``loaded`` not a LoadedModel, ``cfg`` not a LagProbeConfig, a condition not a Condition.
    """
    check_loaded(loaded, "run_lag_probe")
    cfg = LagProbeConfig() if cfg is None else cfg
    check_type(cfg, LagProbeConfig, "run_lag_probe: cfg")
    check_conditions(conditions, "run_lag_probe")
    trials = build_trials(loaded, cfg)
    data = run_conditions(loaded, conditions, trials, method=cfg.method,
                          batch_size=cfg.batch_size, measure_batch=partial(measure_batch, cfg=cfg), progress=progress,
                          dist=dist, reuse=cfg.reuse_residual)
    return LagProbeResult({n: d["probs"] for n, d in data.items()}, {n: d["list_mass"] for n, d in data.items()},
                          {n: d["argmax_lag"] for n, d in data.items()}, list(conditions), cfg, trials.words,
                          list_ids=list_ids_of(data))


def list_ids_of(parts: dict) -> np.ndarray | None:
    """The ``[n_trials, list_length]`` word ids from a run's per-condition measures (the same in
    every condition); None when they were not stored (runs from before they were)."""
    for d in parts.values():
        if "list_ids" in d:
            return np.asarray(d["list_ids"])
    return None
