"""``inductionlab study bi-induct``: the Bi-Induct matched-compute experiment end to end (SPEC §6–§8).

Four curriculum variants (``none`` = natural-only, ``induction``, ``anti``, ``balanced``) are
trained at identical tokens, steps and FLOPs (asserted with :func:`inductionlab.train.flops.check_iso_flops`
and recorded), ``seeds`` seeds each; telemetry over checkpoints is aggregated; every final
checkpoint is evaluated (HITS@1/@3 probes at 1 and 10 shots, ICL score, held-out perplexity,
top-2%-per-layer induction vs random head ablation); a verdict per claim of the paper is decided
by the rules in :data:`~inductionlab.studies.bi_induct.verdicts.RULES` (stated in code, before any data
is seen).

Phases (run by :func:`inductionlab.studies.engine.run_study`, like every study; this module holds
``prepare`` / ``phases`` / ``result``; the config and presets in :mod:`~inductionlab.studies.bi_induct.config`,
the training jobs in :mod:`~inductionlab.studies.bi_induct.jobs`, the evaluation bridge in
:mod:`~inductionlab.studies.bi_induct.evaluation`, the tables and verdicts in
:mod:`~inductionlab.studies.bi_induct.tables` and :mod:`~inductionlab.studies.bi_induct.verdicts`, the report
in :mod:`~inductionlab.studies.bi_induct.report`):

1. ``plan``: the budget of every run (:class:`~inductionlab.train.flops.Budget`), asserted equal,
   written as the first piece — a later call with another budget on the same ``--out`` is refused.
2. ``train`` (:func:`~inductionlab.studies.bi_induct.jobs.train_and_check`): one ``inductionlab train`` subprocess per (variant, seed) under
   ``<out>/runs/<variant>-s<seed>`` (``jobs`` at a time, one torch thread each; under a GPU
   launcher ``torchrun --nproc_per_node=N``). A finished run is reused; an interrupted one is
   resumed by the trainer itself from its last checkpoint. Piece ``train/<run>`` = its summary.
3. ``evaluate``: piece ``eval/<run>`` per final checkpoint
   (:func:`~inductionlab.studies.bi_induct.evaluation.evaluate_checkpoint`).
4. tables, figure, verdicts, ``report.md``, ``results.json``.

Presets (:data:`~inductionlab.studies.bi_induct.config.PRESETS`, functions returning typed configs):
``cpu-control`` (the CPU positive control of docs/positive_control.md: forms an induction head on one CPU
thread in ~5 min), ``cpu-natural`` (the CPU study), ``tiny`` (CI), ``0.13b`` (the paper's smallest size, for GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ...config import to_dict
from ...runtime.run_dir import final_checkpoint
from ...runtime.runs import versions
from ...train.config import PRESETS as MODEL_PRESETS
from ..engine import Context, StudyResult, run_study
from ..spec import RunOptions, Study, StudyPlan
from .config import SPEC, BiInductStudyConfig, evaluation_config, plan_budgets
from .evaluation import evaluate_checkpoint
from .jobs import run_piece, train_and_check
from .report import estimate, summary, write
from .tables import runs_table, variants_table
from .verdicts import (ANTI_NEAR_ZERO, C_MEASURE, D_MEASURE, ICL_FLOOR, INDUCTION_EFFECT, MIN_SEEDS_FOR_CI, PROBE_FLOOR,
                       PROBE_MARGIN, RELATIVE_FLOOR, RULES, decide)


@dataclass(kw_only=True)
class Plan(StudyPlan):
    """What :func:`prepare` settles: the config, the corpus's vocabulary, the run's ``params``, the model
    the study trains (the results header's ``model``), and ``owned = ("runs",)``: the training runs count
    as finished work of the study (a study with other parameters is refused while they exist)."""
    cfg: BiInductStudyConfig
    vocab_size: int


@dataclass(kw_only=True)
class BiInductStudy(StudyResult):
    config: BiInductStudyConfig
    table: pd.DataFrame
    pieces: dict


def prepare(loaded, cfg: BiInductStudyConfig) -> Plan:
    """Open the corpus (its vocabulary sizes the models; its hash is a parameter). Nothing is written."""
    from ...data.shards import TokenShards

    sh = TokenShards.open(cfg.shards)
    layers, hidden, mlp, heads, kv = MODEL_PRESETS[cfg.train.preset]
    model = {"name": cfg.train.preset, "source": "trained by this study", "architecture": "LlamaForCausalLM",
             "n_layers": layers, "n_heads": heads, "n_kv_heads": kv, "head_dim": hidden // heads,
             "hidden_size": hidden, "intermediate_size": mlp, "vocab_size": sh.vocab_size,
             "max_position_embeddings": cfg.train.seq_len}
    return Plan(cfg=cfg, vocab_size=sh.vocab_size, params=cfg.params(sh.manifest.get("corpus_sha256")), model=model,
                owned=("runs",))


def phases(plan: Plan, ctx: Context) -> dict:
    """The plan (every run's budget, asserted iso-FLOPs), the training jobs, each finished run's summary,
    then each final checkpoint evaluated (a nested evaluation study per checkpoint)."""
    cfg = plan.cfg
    budgets = ctx.piece("plan", lambda: {"budgets": plan_budgets(cfg, plan.vocab_size), "versions": versions()})
    runs, walls, missing = train_and_check(ctx, cfg, budgets["budgets"])
    names, seeds = [n for n, _, _ in runs], {n: s for n, _, s in runs}
    pieces = ctx.pieces("train", names, lambda n, _: run_piece(ctx.out / "runs" / n), timing="train_pieces", json=True)
    evals = ctx.pieces(cfg.eval_key(), names, lambda n, _: _evaluate(ctx, cfg, n, seeds[n]), timing="evaluate",
                       json=True) if cfg.evaluate else {}
    return {"budgets": budgets["budgets"], "runs": runs, "walls": walls, "missing": missing, "pieces": pieces, "evals": evals}


def _evaluate(ctx: Context, cfg: BiInductStudyConfig, name: str, seed: int) -> dict:
    if ctx.opts.progress:
        ctx.log(f"evaluate {name}")
    return evaluate_checkpoint(final_checkpoint(ctx.out / "runs" / name), evaluation_config(cfg, seed),
                               ctx.out / "evaluate" / cfg.eval_key() / name, cfg.calibration_lengths)


def result(plan: Plan, p: dict) -> BiInductStudy:
    from ...train.telemetry import predicted_emergence

    cfg = plan.cfg
    threshold = float(cfg.train.induction_threshold)
    table = runs_table(p["pieces"], p["evals"])
    vs = decide(table, threshold)
    b0 = next(iter(p["budgets"].values()))
    actual = {n: p["budgets"][n] for n, _, _ in p["runs"]}
    record = {"preset": {"name": cfg.preset, "description": _description(cfg.preset), "config": to_dict(cfg)},
              "matched_compute": {"checked": True, "keys": ["n_params", "seq_len", "global_batch",
                                                             "tokens_per_update", "steps", "tokens", "flops"],
                                  "budget": b0, "budgets": actual},
              "predicted_emergence": predicted_emergence(b0["global_batch"], b0["seq_len"]),
              "rules": RULES, "thresholds": {"MIN_SEEDS_FOR_CI": MIN_SEEDS_FOR_CI, "INDUCTION_EFFECT": INDUCTION_EFFECT,
                                             "ANTI_NEAR_ZERO": ANTI_NEAR_ZERO, "PROBE_FLOOR": PROBE_FLOOR,
                                             "PROBE_MARGIN": PROBE_MARGIN, "ICL_FLOOR": ICL_FLOOR,
                                             "RELATIVE_FLOOR": RELATIVE_FLOOR, "D_MEASURE": D_MEASURE,
                                             "C_MEASURE": C_MEASURE, "induction_threshold": threshold},
              "runs": table.to_dict(orient="records"), "variants_table": variants_table(table),
              "verdicts": [v.to_dict() for v in vs],
              "evaluations": p["evals"],
              "train_wall_s_this_call": p["walls"],
              "train_time_s_total": float(sum(x["train_time_s"] or 0 for x in p["pieces"].values())),
              "missing_runs": p["missing"]}
    return BiInductStudy(config=cfg, table=table, pieces=p["pieces"], verdicts=vs, record=record)


def _description(preset: str) -> str:
    from .config import PRESETS

    return " ".join((PRESETS[preset].__doc__ or "").strip().split("\n\n")[0].split()).rstrip(".")


def run_bi_induct_study(cfg: BiInductStudyConfig, out: str | Path, opts: RunOptions | None = None) -> BiInductStudy:
    """Run (or resume) the whole study into ``out`` (:func:`~inductionlab.studies.engine.run_study` of
    :data:`~inductionlab.studies.bi_induct.config.SPEC`); see the module docstring for the phases.

    ``cfg.partial``: train nothing; aggregate, evaluate and report the runs finished so far (e.g. while the
    study is still training in another process); the missing runs are listed in the record and the report,
    and claims without 2 seeds per compared variant are "not testable".

    Raises:
        InductionLabError: invalid config (before anything is written); ``out`` holding a study with other
            parameters (e.g. another budget); a training run that fails.
        TypeError: ``cfg`` not a BiInductStudyConfig (a dict included).
    """
    return run_study(SPEC, None, cfg, out, opts)


STUDY: Study[BiInductStudyConfig, Plan, BiInductStudy] = Study(prepare, phases, result, write, summary, estimate)

__all__ = ["STUDY", "BiInductStudy", "Plan", "prepare", "phases", "result", "run_bi_induct_study"]
