"""The temporal-dependencies study (``inductionlab study temporal``): the whole experimental
design of protocol T (SPEC §4–§5) on one model, resumable, with one report.

This module holds the study's ``prepare`` / ``phases`` / ``result``, :class:`TemporalStudy` and
:func:`run_temporal_study`; its config is in :mod:`inductionlab.studies.temporal.config`, its headline and
verdicts in :mod:`inductionlab.studies.temporal.verdicts`, its tables, figures and report text in
:mod:`inductionlab.studies.temporal.report`. The engine (:func:`inductionlab.studies.engine.run_study`) runs it.

Pieces, each checkpointed in ``<out>/checkpoints/`` as soon as it finishes (atomic writes, so an
interrupted or killed run never leaves a half-written file and a re-run with the same ``--out``
continues from the finished pieces):

1. head scores (SPEC §3) → ``scores.json``;
2. the phases: for every condition — intact; top-k induction heads ablated; k random heads
   outside the top N (``n_draws`` seeded draws), for each k — the lag probe
   (``lag/<condition>.npz``) and few-shot serial recall (``recall/<condition>.npz``); then the
   per-head load-bearing map: each of the top-N induction heads ablated alone, lag probe on the
   first ``load_bearing_permutations`` trials (``single/<condition>.npz``) and serial recall
   (``single_recall/<condition>.npz``).

Then ``results.json``, ``tables/*.csv``, ``plots/*.png`` and ``report.md`` are written, stating
each claim of the temporal-dependencies paper on this model as reproduced / not reproduced:

(A) the lag curve peaks at lag +1;
(B) ablating the top-k induction heads lowers p(lag +1) far more than ablating k random heads;
(C) random ablation leaves p(lag +1) intact or raises it;
(D) serial recall suffers more under induction ablation than under random ablation.

Decision rules (this project's; the paper states the claims without tests) are in
:func:`~inductionlab.studies.temporal.verdicts.decide`, each claim a :class:`~inductionlab.studies.run.Verdict`. All CIs are 95%, normal approximation over trials; differences between
conditions are paired (every condition sees the same trials).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from ...config import to_dict
from ...core.ablation import Condition
from ...core.models import LoadedModel
from ...core.scores import HeadScores
from ...errors import InductionLabError
from ...measures import serial_position
from ...measures.crp import lag_probe_crp
from ...protocols import lag_probe, serial_recall
from ...protocols.configs import LagProbeConfig, SerialRecallConfig
from ...protocols.lag_probe import LagProbeResult
from ...protocols.load_bearing import concentration, load_bearing_table, single_head_conditions
from ...protocols.serial_recall import SerialRecallResult
from ..configs import check_trial_ids, default_ks
from ..engine import Context, Phase, StudyResult, run_study
from ..spec import RunOptions, Study, StudyPlan
from .config import SPEC, TemporalStudyConfig
from .report import summary, write
from .verdicts import decide, headline_table


@dataclass(kw_only=True)
class Plan(StudyPlan):
    """What :func:`prepare` settles for this model: ks, the exclusion N, the protocols' configs with the
    study's seed and method, and the run's ``params``."""
    loaded: LoadedModel
    cfg: TemporalStudyConfig
    ks: list[int]
    exclude_top_n: int
    lag: LagProbeConfig
    recall: SerialRecallConfig
    file_scores: dict = field(default_factory=dict)


@dataclass(kw_only=True)
class TemporalStudy(StudyResult):
    """Everything a finished study computed (also written to the run directory)."""
    loaded: LoadedModel
    config: TemporalStudyConfig
    scores: HeadScores
    conditions: list[Condition]
    lag: LagProbeResult
    recall: SerialRecallResult
    load_bearing: pd.DataFrame | None
    concentration: dict[str, dict] | None
    headline: pd.DataFrame
    ks: list[int]
    exclude_top_n: int


def prepare(loaded: LoadedModel, cfg: TemporalStudyConfig) -> Plan:
    """The checks that need the model, before anything is written: ks within the heads left for random
    draws, the per-head map within the heads, pool, context and vocabulary of both protocols.

    Raises:
        InductionLabError: what the checks refuse (one line naming the option and the fix)."""
    ident = loaded.identity
    n_total = ident["n_layers"] * ident["n_heads"]
    ab = cfg.ablation
    N = ab.top_n(n_total)
    ks = sorted(set(int(k) for k in ab.ks)) if ab.ks else default_ks(n_total, N)
    ab.check_model(ks, n_total)
    file_scores = ab.score_tables((ident["n_layers"], ident["n_heads"]))
    if cfg.load_bearing_top > n_total:
        raise InductionLabError(f"--load-bearing-top {cfg.load_bearing_top:,} exceeds the model's {n_total} heads; use "
                                f"at most {n_total}")
    lag, rec = cfg.protocols()
    check_trial_ids(lag_probe.build_trials(loaded, replace(lag, n_permutations=2)), loaded, "lag probe")
    lag_probe.check_cues(loaded, lag)
    check_trial_ids(serial_recall.build_trials(loaded, replace(rec, n_trials=1)), loaded, "serial recall")
    drop = lambda d: {k: v for k, v in d.items() if k != "batch_size"}  # noqa: E731  (speed only)
    config = to_dict(cfg)
    config["lag"], config["recall"] = drop(to_dict(lag)), drop(to_dict(rec))
    params = {"config": config, "ks": ks, "exclude_top_n": N, "load_bearing_permutations": cfg.load_bearing_n,
              **ab.params()}
    return Plan(loaded=loaded, cfg=cfg, ks=ks, exclude_top_n=N, lag=lag, recall=rec, file_scores=file_scores,
                params=params)


def phases(plan: Plan, ctx: Context) -> dict:
    """Head scores, then the lag probe and serial recall under every condition and the per-head map (each
    head ablated alone), as one step over four phases (one progress bar)."""
    cfg = plan.cfg
    scores = ctx.head_scores(cfg.scores, seed=cfg.seed)
    conditions = cfg.ablation.conditions({**plan.file_scores, **scores.scores}, plan.ks, seed=cfg.seed,
                                         exclude_top_n=plan.exclude_top_n)
    singles = single_head_conditions(scores["induction"], cfg.load_bearing_top) if cfg.load_bearing_top > 0 else []
    lag, recall = lag_probe.probe(plan.lag), serial_recall.probe(plan.recall)
    n_rec = plan.recall.n_trials
    runs = ctx.measure(Phase("lag", lag, conditions, plan.lag.n_permutations),
                       Phase("recall", recall, conditions, n_rec),
                       Phase("single", lag_probe.probe(replace(plan.lag, cues="seed")), singles, cfg.load_bearing_n),
                       Phase("single_recall", recall, singles, n_rec))
    return {"scores": scores, "conditions": conditions, "singles": singles, **runs}


def result(plan: Plan, pieces: dict) -> TemporalStudy:
    hs, conditions, singles = pieces["scores"], pieces["conditions"], pieces["singles"]
    lag = LagProbeResult.from_parts(pieces["lag"].arrays, conditions, plan.lag, pieces["lag"].words)
    recall = SerialRecallResult(pieces["recall"].arrays, conditions, plan.recall, pieces["recall"].words)
    lb_table = conc = None
    lb_n = plan.cfg.load_bearing_n
    if singles:
        lb_table, conc = _load_bearing(hs["induction"], singles, lag, recall, pieces, lb_n)
    head = headline_table(lag, recall, plan.ks)
    verd = decide(lag, recall, head, plan.ks)
    record = {
        "seeds": {"study": plan.cfg.seed, "lag_probe_trials": "seed_for(seed, trial)",
                  "serial_recall_trials": "seed_for(seed, 7, trial)", "random_draws": "seed_for(seed, k, draw)"},
        "head_scores": {**hs.to_dict(), "params": hs.params},
        "conditions": [c.to_dict() for c in conditions],
        "headline": head.to_dict(orient="records"),
        "verdicts": [v.to_dict() for v in verd],
        "lag_probe": lag.to_json(),
        **({"lag_cues": serial_position.cue_json(lag)} if serial_position.has_cues(lag) else {}),
        "lag_crp_argmax": _crp_block(lag_probe_crp(lag)),
        "serial_recall": recall.to_json(),
        "load_bearing": None if lb_table is None else {"table": lb_table.to_dict(orient="records"),
                                                       "concentration": conc, "n_trials": lb_n},
    }
    return TemporalStudy(loaded=plan.loaded, config=plan.cfg, scores=hs, conditions=conditions, lag=lag, recall=recall,
                         load_bearing=lb_table, concentration=conc, headline=head, ks=plan.ks,
                         exclude_top_n=plan.exclude_top_n, verdicts=verd, record=record)


def run_temporal_study(loaded: LoadedModel, cfg: TemporalStudyConfig, out: str | Path,
                       opts: RunOptions | None = None) -> TemporalStudy:
    """Run (or resume) the study on ``loaded`` and write the run directory ``out``
    (:func:`~inductionlab.studies.engine.run_study` of :data:`~inductionlab.studies.temporal.config.SPEC`).

    Raises:
        InductionLabError: bad config (:meth:`TemporalStudyConfig.validate`); what :func:`prepare` refuses;
            ``out`` holding another study or other files.
        TypeError: ``loaded`` not a LoadedModel, ``cfg`` not a TemporalStudyConfig (a dict included).
    """
    return run_study(SPEC, loaded, cfg, out, opts)


def _load_bearing(induction, singles, lag, recall, parts, lb_n):
    """Per-head Δ table and concentration (lag probe p(+1) on the first ``lb_n`` trials, recall)."""
    col = lag.config.cue_position  # column of lag +1 (0-based index cue_position)
    single_rec = SerialRecallResult(parts["single_recall"].arrays, singles, recall.config)
    rec_intact = recall.trial_measures("intact")
    intact = {"lag_plus1": lag.probs["intact"][:lb_n, col], "recall_lag_plus1": rec_intact["lag_plus1"],
              "recall_accuracy": rec_intact["accuracy"]}
    single = {c.name: {"lag_plus1": parts["single"].arrays[c.name]["probs"][:, col],
                       **{f"recall_{k}": v for k, v in single_rec.trial_measures(c.name).items()
                          if k in ("lag_plus1", "accuracy")}} for c in singles}
    table = load_bearing_table(induction, singles, intact, single)
    return table, {m: concentration(table, m) for m in intact}


def _crp_block(crp: pd.DataFrame, window: int = 10) -> dict:
    """CRP of arg-max responses near the cue, per condition (full table in tables/lag_crp_argmax.csv)."""
    near = crp[crp.lag.abs() <= window]
    return {name: {"n_transitions": int(d.n_transitions.iloc[0]),
                   "crp": {int(r.lag): (None if math.isnan(r.prob) else float(r.prob)) for r in d.itertuples()}}
            for name, d in near.groupby("condition", sort=False)}


STUDY: Study[TemporalStudyConfig, Plan, TemporalStudy] = Study(prepare, phases, result, write, summary)

__all__ = ["TemporalStudy", "Plan", "prepare", "phases", "result", "run_temporal_study", "STUDY"]
