"""Protocol T2 — few-shot serial recall (SPEC §5).

A trial is a few-shot prompt: ``n_shots`` study lists, each followed by its exact ordered
recall, then a new study list and the recall cue. Lists hold 14 single-token words (SPEC §5);
every word of a trial is distinct, so each item occurs exactly once per study list. Template
(decision: 3 shots, plain text; each word is its own leading-space token)::

    <BOS>Study: w1 w2 … w14
    Recall: w1 w2 … w14

    Study: …                      (× n_shots)
    Recall: …

    Study: v1 v2 … v14
    Recall:                       ← the model continues with v1 … v14

The prompt is assembled from token ids (template pieces encoded once, words as their single
token ids), never by re-tokenising text.

Metrics, per condition (intact or ablated, the same :class:`~inductionlab.core.ablation.Condition`
list as the lag probe; every condition sees the same trials):

* teacher-forced per-position accuracy: the arg-max next token (whole vocabulary) equals the
  next list item, positions 1…14 (position 1 follows the cue);
* exact match of greedy generation: the 14 greedily generated tokens equal the list;
* lag +1 transition probability: at output positions 2…14 (teacher-forced), the probability
  of the item that followed the previous item, renormalised over the 14 list items;
* the full transition lag curve: the same renormalised probability for every lag
  (item position − previous item's position, −(L−1)…L−1; lag 0 = repeating the previous item),
  averaged over the output positions at which that lag exists;
* the psifr-style lag-CRP of the greedy recalls (:func:`inductionlab.measures.crp.lag_crp`) and the
  probability-weighted CRP of the teacher-forced distributions over not-yet-recalled items
  (:func:`inductionlab.measures.crp.prob_lag_crp`).

Confidence intervals: 95%, normal approximation over trials (mean ± 1.96·sd/√n), as the lag probe.
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
from ..measures.crp import lag_crp, prob_lag_crp
from ..measures.stats import mean_ci, pooled_arms, put_ci
from .configs import SerialRecallConfig
from .runner import Probe, Trials, auto_batch_size, forward_logits, greedy_tokens


@dataclass
class RecallTrials:
    """All prompts of a run. ``prompt`` ``[n, P]``, ``targets`` ``[n, L]`` (token ids)."""
    prompt: torch.Tensor
    targets: torch.Tensor
    words: list[str]


def build_recall_trials(tokenizer, cfg: SerialRecallConfig, max_len: int | None = None) -> RecallTrials:
    """Token ids of every serial-recall prompt and its target list.

    Raises:
        InductionLabError: fewer than ``(n_shots + 1) × list_length`` words in the pool, a
            prompt longer than the model's context, a tokenizer without BOS when ``bos``,
            non-positive sizes.
    """
    cfg.validate()
    L, S = cfg.list_length, cfg.n_shots
    need = (S + 1) * L
    pool_n = max(cfg.pool_size, need)
    try:
        pool = single_token_words(tokenizer, pool_n, prefix=" ")
    except InductionLabError:
        raise InductionLabError(f"word pool too small for serial recall: {need} distinct single-token words are "
                                f"needed ({S + 1} lists of {L}); use fewer shots or a shorter list") from None
    enc = lambda t: tokenizer.encode(t, add_special_tokens=False) if t else []  # noqa: E731
    study, recall, sep = enc(cfg.study_prefix), enc(cfg.recall_prefix), enc(cfg.shot_separator)
    head = []
    if cfg.bos:
        if tokenizer.bos_token_id is None:
            raise InductionLabError("the tokenizer has no BOS token; pass --no-bos")
        head = [tokenizer.bos_token_id]
    prompts, targets = [], []
    for t in range(cfg.n_trials):
        rng = np.random.default_rng(seed_for(cfg.seed, 7, t))   # 7: stream id, apart from the lag probe's
        pick = [pool[i].token_id for i in rng.choice(len(pool), need, replace=False)]
        lists = [pick[i * L:(i + 1) * L] for i in range(S + 1)]
        ids = list(head)
        for lst in lists[:-1]:
            ids += study + lst + recall + lst + sep
        ids += study + lists[-1] + recall
        prompts.append(ids)
        targets.append(lists[-1])
    if max_len and len(prompts[0]) + L > max_len:
        raise InductionLabError(f"a serial-recall prompt of {len(prompts[0]) + L} tokens exceeds the model's context "
                                f"of {max_len}; use fewer shots or a shorter list")
    return RecallTrials(torch.tensor(prompts), torch.tensor(targets), [w.text for w in pool])


@dataclass
class SerialRecallResult:
    """Results of :func:`run_serial_recall`.

    Attributes:
        data: condition name -> arrays:
            ``correct`` bool ``[n, L]`` (teacher-forced arg-max equals the item),
            ``trans`` float32 ``[n, L-1, L]`` (output positions 2…L: probability of each list
            position's item renormalised over the list),
            ``list_mass`` float32 ``[n, L]`` (raw probability on list items per output position),
            ``generated`` float64 ``[n, L]`` (serial position of each greedily generated token,
            NaN = not a list item; absent when ``generate`` is off),
            ``exact`` bool ``[n]`` (greedy generation equals the list).
        conditions: the :class:`Condition` list; config: the :class:`SerialRecallConfig`.
    """
    data: dict[str, dict[str, np.ndarray]]
    conditions: list[Condition]
    config: SerialRecallConfig
    words: list[str] = field(default_factory=list)

    @property
    def lags(self) -> np.ndarray:
        L = self.config.list_length
        return np.arange(-(L - 1), L)

    # -- per-trial measures -----------------------------------------------------------
    def trial_measures(self, name: str) -> dict[str, np.ndarray]:
        """Per-trial accuracy (mean over positions), lag +1 probability, exact match, list mass. Each ``[n]``."""
        d = self.data[name]
        L = self.config.list_length
        lag1 = d["trans"][:, np.arange(L - 1), np.arange(1, L)]       # item i+1 given previous item i
        out = {"accuracy": d["correct"].mean(1), "lag_plus1": lag1.mean(1), "list_mass": d["list_mass"].mean(1)}
        if "exact" in d:
            out["exact_match"] = d["exact"].astype(np.float64)
        return out

    def curve(self, name: str) -> np.ndarray:
        """Per-trial transition lag curve ``[n, 2L-1]`` (NaN where a lag never exists)."""
        tr = self.data[name]["trans"].astype(np.float64)               # [n, L-1, L]
        n, P, L = tr.shape
        out = np.zeros((n, 2 * L - 1))
        cnt = np.zeros(2 * L - 1)
        for i in range(P):                                             # previous item = position i+1 (1-based)
            idx = np.arange(L) - i + L - 1
            out[:, idx] += tr[:, i]
            cnt[idx] += 1
        with np.errstate(invalid="ignore"):
            return np.where(cnt > 0, out / np.where(cnt > 0, cnt, 1), np.nan)

    def pooled_measures(self, names: list[str]) -> dict[str, np.ndarray]:
        """Per-trial measures averaged over several conditions (random draws), trial by trial."""
        ms = [self.trial_measures(n) for n in names]
        return {key: np.mean([m[key] for m in ms], axis=0) for key in ms[0]}

    def headline(self) -> pd.DataFrame:
        """One row per condition plus pooled ``random-k`` rows: mean and 95% CI of each measure."""
        rows = []
        for name, kind, k, draw, names in pooled_arms(self.conditions):
            m = self.pooled_measures(names)
            row = {"condition": name, "kind": kind, "k": k, "draw": draw, "n_trials": len(m["accuracy"])}
            for key, v in m.items():
                put_ci(row, key, v)
            rows.append(row)
        return pd.DataFrame(rows)

    def positions(self) -> pd.DataFrame:
        """Tidy: teacher-forced accuracy per (condition, output position 1…L) with 95% CI."""
        rows = []
        for c in self.conditions:
            m, half = mean_ci(self.data[c.name]["correct"].astype(np.float64))
            rows.append(pd.DataFrame({"condition": c.name, "kind": c.kind, "k": c.k, "draw": c.draw,
                                      "position": np.arange(1, len(m) + 1), "accuracy": m,
                                      "ci_low": m - half, "ci_high": m + half}))
        return pd.concat(rows, ignore_index=True)

    def transition_curve(self) -> pd.DataFrame:
        """Tidy: renormalised transition probability per (condition, lag) with 95% CI (pooled random rows too)."""
        rows = []
        for name, kind, k, draw, names in pooled_arms(self.conditions):
            cur = np.mean([self.curve(n) for n in names], axis=0)
            m, half = mean_ci(cur)
            rows.append(pd.DataFrame({"condition": name, "kind": kind, "k": k, "draw": draw, "lag": self.lags,
                                      "mean": m, "ci_low": m - half, "ci_high": m + half}))
        return pd.concat(rows, ignore_index=True).dropna(subset=["mean"])

    def crp(self) -> pd.DataFrame:
        """Tidy lag-CRPs per condition: ``source`` = ``generated`` (psifr counts over the greedy
        recalls) and ``teacher_forced`` (probability-weighted, over items not yet recalled)."""
        rows = []
        L = self.config.list_length
        for c in self.conditions:
            d = self.data[c.name]
            tr = d["trans"].astype(np.float64)
            n = tr.shape[0]
            prev = np.tile(np.arange(1, L), n)                       # previous item i (1-based) at output i+1
            avail = np.tile(np.arange(L)[None, :] >= np.arange(1, L)[:, None], (n, 1))  # items i+1…L remain
            tabs = [("teacher_forced", prob_lag_crp(prev, tr.reshape(-1, L), avail))]
            if "generated" in d:
                tabs.append(("generated", lag_crp(d["generated"], L)))
            for src, t in tabs:
                t.insert(0, "condition", c.name)
                t.insert(1, "kind", c.kind)
                t.insert(2, "k", c.k)
                t.insert(3, "draw", c.draw)
                t.insert(4, "source", src)
                rows.append(t)
        return pd.concat(rows, ignore_index=True)

    def to_json(self) -> dict:
        """The ``serial_recall`` block of results.json."""
        return {"config": asdict(self.config), "conditions": [c.to_dict() for c in self.conditions],
                "headline": self.headline().to_dict(orient="records"),
                "accuracy_by_position": {c.name: self.data[c.name]["correct"].mean(0).tolist() for c in self.conditions}}


def build_trials(loaded: LoadedModel, cfg: SerialRecallConfig) -> Trials:
    """The protocol runner's view of :func:`build_recall_trials`: ``ids`` ``[n, P + L]`` (prompt
    then the list, so the list is teacher-forced) and ``targets`` ``[n, L]``."""
    t = build_recall_trials(loaded.tokenizer, cfg, (loaded.identity or {}).get("max_position_embeddings"))
    return Trials({"ids": torch.cat([t.prompt, t.targets], 1), "targets": t.targets}, t.words)


def measure_batch(model, batch: dict[str, torch.Tensor], cfg: SerialRecallConfig) -> dict[str, torch.Tensor]:
    """One batch: ``ids`` ``[b, P + L]`` (prompt then the list), ``targets`` ``[b, L]`` → the
    per-trial arrays of :class:`SerialRecallResult` (``generated`` / ``exact`` only when ``cfg.generate``)."""
    ids, tgt, L = batch["ids"], batch["targets"], cfg.list_length
    logits = forward_logits(model, ids[:, :-1], L)                   # [b, L, V]: predicts targets 1..L
    pl = torch.softmax(logits, -1).gather(2, tgt[:, None, :].expand(-1, L, -1))   # [b, out pos, item]
    out = {"correct": logits.argmax(-1) == tgt, "list_mass": pl.sum(-1).float(),
           "trans": (pl[:, 1:] / pl[:, 1:].sum(-1, keepdim=True)).float()}
    if cfg.generate:
        gen = greedy_tokens(model, ids[:, :-L], L)[1]                 # [b, L]
        hit = gen[:, :, None] == tgt[:, None, :]                      # [b, L, L]
        pos = hit.float().argmax(-1).double() + 1
        pos[~hit.any(-1)] = float("nan")
        out["generated"], out["exact"] = pos, (gen == tgt).all(1)
    return out


def batch_size(loaded, trials: Trials, cfg: SerialRecallConfig) -> int | None:
    """Prompts per forward: ``cfg.batch_size``; else from free GPU memory at the prompts' length with a
    logit row per list item (:func:`~inductionlab.protocols.runner.auto_batch_size`; 8 on a CPU)."""
    if cfg.batch_size or not len(trials):
        return cfg.batch_size
    return auto_batch_size(loaded, trials.tensors["ids"].shape[1], cfg.list_length)


def probe(cfg: SerialRecallConfig) -> Probe:
    """Few-shot serial recall bound to ``cfg`` (:func:`build_trials`, :func:`measure_batch`, :func:`batch_size`),
    for :func:`~inductionlab.protocols.runner.run_conditions` and a study's phases.

    Raises:
        InductionLabError: ``cfg`` invalid (:meth:`SerialRecallConfig.validate`)."""
    cfg.validate()
    return Probe("serial recall", partial(build_trials, cfg=cfg), partial(measure_batch, cfg=cfg),
                 partial(batch_size, cfg=cfg), cfg.method, cfg.reuse_residual, cfg.positions)


def run_serial_recall(loaded: LoadedModel, conditions: list[Condition], cfg: SerialRecallConfig | None = None,
                      progress=None, dist=None) -> SerialRecallResult:
    """Run few-shot serial recall under each condition (intact or heads ablated by ``cfg.method``).

    Args:
        loaded: a :class:`~inductionlab.core.models.LoadedModel` (any object with ``.model``,
            ``.tokenizer`` and ``.identity`` works; the model takes ``input_ids`` and returns ``.logits``).
        conditions: e.g. from :func:`inductionlab.core.ablation.ablation_conditions`.
        progress: optional callable(n_trials_done).
        dist: a :class:`~inductionlab.runtime.distributed.Dist` to shard the prompts' batches over (every rank
            calls with the same arguments and gets the same result; :func:`~inductionlab.protocols.runner.run_conditions`).

    Returns: :class:`SerialRecallResult`.

    Raises:
        InductionLabError: see :func:`build_recall_trials`; head out of range; unknown method; no conditions.
        TypeError: ``loaded`` without ``.model`` / ``.tokenizer`` / ``.identity``, ``cfg`` not a
            SerialRecallConfig, a condition not a Condition.
    """
    check_loaded(loaded, "run_serial_recall")
    cfg = SerialRecallConfig() if cfg is None else cfg
    check_type(cfg, SerialRecallConfig, "run_serial_recall: cfg")
    check_conditions(conditions, "run_serial_recall")
    p = probe(cfg)
    trials = p.build_trials(loaded)
    data = p.run(loaded, conditions, trials, progress=progress, dist=dist)
    return SerialRecallResult(data, list(conditions), cfg, trials.words)
