"""The temporal-dependencies study (``inductionlab study temporal``): the whole experimental
design of protocol T (SPEC §4–§5) on one model, resumable, with one report.

This module holds the study's phase list, :class:`TemporalStudy` and :func:`run_temporal_study`; its
config is in :mod:`inductionlab.studies.temporal.config`, its headline and verdicts in
:mod:`inductionlab.studies.temporal.verdicts`, its tables, figures and report text in
:mod:`inductionlab.studies.temporal.report`. The plumbing is shared:
trials × conditions × ablation in :mod:`inductionlab.protocols.runner`, checkpoints in
:class:`inductionlab.runtime.runs.ResumableRun`, CIs in :mod:`inductionlab.measures.stats`, figures in
:mod:`inductionlab.studies.plots`, the shared report pieces in :mod:`inductionlab.studies.report`.

Pieces, each checkpointed in ``<out>/checkpoints/`` as soon as it finishes (atomic writes, so an
interrupted or killed run never leaves a half-written file and a re-run with the same ``--out``
continues from the finished pieces):

1. head scores (SPEC §3) → ``scores.json``;
2. :data:`PHASES`: for every condition — intact; top-k induction heads ablated; k random heads
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
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import pandas as pd

from ...protocols import lag_probe, serial_recall

from . import report

from ...core.ablation import Condition, ablation_conditions, default_exclude_top_n
from ...core.models import LoadedModel, agree_dtype, announce_dtype, params_identity, ran_identity, with_dtype_choice
from ...core.scores import HeadScores
from ...errors import InductionLabError
from ...measures import serial_position
from ...measures.crp import lag_probe_crp
from ...protocols.lag_probe import LagProbeResult
from ...protocols.load_bearing import concentration, load_bearing_table, single_head_conditions
from ...protocols.runner import auto_batch_size
from ...protocols.serial_recall import SerialRecallResult
from ...runtime.distributed import Dist
from ...runtime.runs import versions
from ..pieces import Phase, check_call, check_ks, check_trial_ids, head_scores_piece, run_phases
from ..run import StudyRun, Verdict
from .config import TemporalStudyConfig, default_ks
from .verdicts import MEASURES, headline_table, decide

PHASES = (Phase("lag", "lag", "ablation"), Phase("recall", "recall", "ablation"),
          Phase("single", "lag_seed", "single"), Phase("single_recall", "recall", "single"))
PROTOCOLS = {"lag": lag_probe, "lag_seed": lag_probe, "recall": serial_recall}   # lag_seed: the seed cue only


# -- the study ----------------------------------------------------------------------------
@dataclass
class TemporalStudy:
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
    verdicts: list[Verdict]
    record: dict
    ks: list[int] = field(default_factory=list)
    timings: dict = field(default_factory=dict)


def _resolve(loaded: LoadedModel, cfg: TemporalStudyConfig):
    """ks, N and the protocol configs with batch sizes, for this model."""
    ident = loaded.identity
    n_total = ident["n_layers"] * ident["n_heads"]
    N = default_exclude_top_n(n_total) if cfg.exclude_top_n is None else int(cfg.exclude_top_n)
    ks = sorted(set(int(k) for k in cfg.ks)) if cfg.ks else default_ks(n_total, N)
    check_ks(ks, n_total, N)
    if cfg.load_bearing_top > n_total:
        raise InductionLabError(f"--load-bearing-top {cfg.load_bearing_top:,} exceeds the model's {n_total} heads; use "
                                f"at most {n_total}")
    lag_cfg, rec_cfg = cfg.protocols()
    lag_cfg = replace(lag_cfg, batch_size=lag_cfg.batch_size or auto_batch_size(loaded, lag_cfg.list_length + 4))
    rec_cfg = replace(rec_cfg, batch_size=rec_cfg.batch_size or auto_batch_size(
        loaded, (rec_cfg.n_shots + 1) * (2 * rec_cfg.list_length + 4), rec_cfg.list_length))
    return ks, N, lag_cfg, rec_cfg


def _params(loaded, cfg, ks, N, lag_cfg, rec_cfg) -> dict:
    """What defines the study's result (batch sizes change nothing but speed: left out)."""
    drop = lambda d: {k: v for k, v in d.items() if k != "batch_size"}  # noqa: E731
    config = asdict(cfg)
    config["lag"], config["recall"] = drop(asdict(lag_cfg)), drop(asdict(rec_cfg))   # with the study's seed, method
    return {"config": config, "ks": ks, "exclude_top_n": N, "lag_probe": drop(asdict(lag_cfg)),
            "serial_recall": drop(asdict(rec_cfg)), "load_bearing_permutations": cfg.load_bearing_n,
            "model": params_identity(ran_identity(loaded))}


def run_temporal_study(loaded: LoadedModel, cfg: TemporalStudyConfig, out: str | Path, *, progress: bool = True,
                       overwrite: bool = False, on_checkpoint=None, dist=None, log=None) -> TemporalStudy:
    """Run (or resume) the study and write the run directory ``out``.

    Args:
        loaded: the model (:func:`inductionlab.core.models.load_model`).
        out: run directory. If it holds checkpoints of a study with the same parameters and
            model, finished pieces are loaded instead of recomputed.
        overwrite: delete ``out`` first and start afresh.
        on_checkpoint: optional callable(key) called after each checkpoint is written.
        dist: a :class:`~inductionlab.runtime.distributed.Dist` of several processes (torchrun; every rank
            calls with the same arguments): head scores, lag probe and serial recall are sharded
            by batch over the ranks, every rank returns the same study, rank 0 alone writes ``out``.
        log: optional callable(str) (the CLI: ``click.echo``) given the line saying which dtype runs
            and why, once the checks have passed (:func:`inductionlab.core.models.announce_dtype`).

    Returns: :class:`TemporalStudy`.

    Raises:
        InductionLabError: bad config (:meth:`TemporalStudyConfig.validate`); ``out`` holds another
            study or other files; k larger than the heads available; pool / context too small
            (see the lag probe and serial recall).
        TypeError: ``loaded`` not a LoadedModel, ``cfg`` not a TemporalStudyConfig (a dict included).
    """
    t_start = time.perf_counter()
    check_call(loaded, cfg, TemporalStudyConfig, "run_temporal_study")
    out = Path(out)
    agree_dtype(loaded, dist)             # torchrun: every rank in rank 0's dtype
    ks, N, lag_cfg, rec_cfg = _resolve(loaded, cfg)
    lb_n = cfg.load_bearing_n
    # model-dependent checks (pool, context) before any file is written
    check_trial_ids(lag_probe.build_trials(loaded, replace(lag_cfg, n_permutations=2)), loaded, "lag probe")
    lag_probe.check_cues(loaded, lag_cfg)
    check_trial_ids(serial_recall.build_trials(loaded, replace(rec_cfg, n_trials=1)), loaded, "serial recall")
    run = StudyRun(out, "study-temporal", _params(loaded, cfg, ks, N, lag_cfg, rec_cfg), overwrite=overwrite,
                   on_checkpoint=on_checkpoint, inputs=[loaded.identity.get("path")], dist=dist, started=t_start)
    run.open()
    announce_dtype(ran_identity(loaded), log, run.is_main)

    with run.timed("head_scores"):
        hs = head_scores_piece(run, loaded, seq_len=cfg.score_seq_len, batch_size=cfg.score_batch_size,
                               seed=cfg.seed, progress=progress)
    induction = hs["induction"]
    conditions = ablation_conditions(induction, ks, n_draws=cfg.n_draws, exclude_top_n=N, seed=cfg.seed)
    singles = single_head_conditions(induction, cfg.load_bearing_top) if cfg.load_bearing_top > 0 else []
    parts, words = run_phases(run, loaded, PHASES, PROTOCOLS, {"lag": lag_cfg, "lag_seed": replace(lag_cfg, cues="seed"),
                                                               "recall": rec_cfg},
                              {"ablation": conditions, "single": singles},
                              {"lag": lag_cfg.n_permutations, "recall": rec_cfg.n_trials, "single": lb_n,
                               "single_recall": rec_cfg.n_trials}, progress=progress, timings=run.timings)

    lag_parts = parts["lag"]
    lag = LagProbeResult.from_parts(lag_parts, conditions, lag_cfg, words["lag"])
    recall = SerialRecallResult(parts["recall"], conditions, rec_cfg, words["recall"])
    lb_table = conc = None
    if singles:
        lb_table, conc = _load_bearing(induction, singles, lag, recall, parts, lb_n)
    head = headline_table(lag, recall, ks)
    verd = decide(lag, recall, head, ks)
    record = {
        "kind": "study-temporal", "model": with_dtype_choice(run.params["model"], loaded), "params": run.params,
        "versions": versions(),
        "seeds": {"study": cfg.seed, "lag_probe_trials": "seed_for(seed, trial)",
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
        "distributed": (dist or Dist()).record(),
    }
    study = TemporalStudy(loaded, cfg, hs, conditions, lag, recall, lb_table, conc, head, verd, record, ks,
                          run.timings)
    run.finish(record, lambda: report.write_temporal_outputs(out, study, MEASURES))   # rank 0 writes
    return study


def _load_bearing(induction, singles, lag, recall, parts, lb_n):
    """Per-head Δ table and concentration (lag probe p(+1) on the first ``lb_n`` trials, recall)."""
    col = lag.config.cue_position  # column of lag +1 (0-based index cue_position)
    single_rec = SerialRecallResult(parts["single_recall"], singles, recall.config)
    rec_intact = recall.trial_measures("intact")
    intact = {"lag_plus1": lag.probs["intact"][:lb_n, col], "recall_lag_plus1": rec_intact["lag_plus1"],
              "recall_accuracy": rec_intact["accuracy"]}
    single = {c.name: {"lag_plus1": parts["single"][c.name]["probs"][:, col],
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
