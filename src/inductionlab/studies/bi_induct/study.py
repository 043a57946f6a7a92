"""``inductionlab study bi-induct``: the Bi-Induct matched-compute experiment end to end (SPEC §6–§8).

Four curriculum variants (``none`` = natural-only, ``induction``, ``anti``, ``balanced``) are
trained at identical tokens, steps and FLOPs (asserted with :func:`inductionlab.train.flops.check_iso_flops`
and recorded), ``seeds`` seeds each; telemetry over checkpoints is aggregated; every final
checkpoint is evaluated (HITS@1/@3 probes at 1 and 10 shots, ICL score, held-out perplexity,
top-2%-per-layer induction vs random head ablation); a verdict per claim of the paper is decided
by the rules in :data:`~inductionlab.studies.bi_induct.verdicts.RULES` (stated in code, before any data
is seen).

Phases (the machinery is shared: :class:`inductionlab.studies.run.StudyRun`, the trainer, the
evaluation pieces; this module holds the phases; the config in
:mod:`~inductionlab.studies.bi_induct.config`, the training jobs in :mod:`~inductionlab.studies.bi_induct.jobs`,
the evaluation bridge in :mod:`~inductionlab.studies.bi_induct.evaluation`, the tables and verdicts in
:mod:`~inductionlab.studies.bi_induct.tables` and :mod:`~inductionlab.studies.bi_induct.verdicts`, the
report in :mod:`~inductionlab.studies.bi_induct.report`):

1. ``plan``: the budget of every run (:class:`~inductionlab.train.flops.Budget`), asserted equal,
   written as the first piece — a later call with another budget on the same ``--out`` is refused.
2. ``train``: one ``inductionlab train`` subprocess per (variant, seed) under
   ``<out>/runs/<variant>-s<seed>`` (``jobs`` at a time, one torch thread each; under a GPU
   launcher ``torchrun --nproc_per_node=N``). A finished run is reused; an interrupted one is
   resumed by the trainer itself from its last checkpoint. Piece ``train/<run>`` = its summary.
3. ``evaluate``: piece ``eval/<run>`` per final checkpoint
   (:func:`~inductionlab.studies.bi_induct.evaluation.evaluate_checkpoint`).
4. tables, figure, verdicts, ``report.md``, ``results.json``.

Presets (:data:`~inductionlab.studies.bi_induct.config.STUDY_PRESETS`): ``cpu-control`` (the CPU positive control of
docs/positive_control.md: forms an induction head on one CPU thread in ~5 min), ``tiny`` (CI), ``0.13b``
(the paper's smallest size, for GPUs).
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd

from ...errors import InductionLabError
from ...runtime.run_dir import final_checkpoint
from ...runtime.runs import own_entries, versions
from ..run import StudyRun, Verdict
from .config import BiInductStudyConfig, plan_budgets
from .evaluation import evaluate_checkpoint
from .jobs import run_finished, run_piece, train_runs
from .tables import runs_table, variants_table
from .verdicts import (ANTI_NEAR_ZERO, C_MEASURE, D_MEASURE, ICL_FLOOR, INDUCTION_EFFECT, MIN_SEEDS_FOR_CI, PROBE_FLOOR,
                       PROBE_MARGIN, RELATIVE_FLOOR, RULES, decide)

# ---- the study ------------------------------------------------------------------------------------

@dataclass
class BiInductStudy:
    out: Path
    config: BiInductStudyConfig
    table: pd.DataFrame
    verdicts: list[Verdict]
    record: dict
    timings: dict


def run_bi_induct_study(cfg: BiInductStudyConfig, out: str | Path, *, overwrite: bool = False, progress: bool = True,
                        partial: bool = False, on_checkpoint: Callable[[str], None] | None = None,
                        log: Callable[[str], None] = print) -> BiInductStudy:
    """Run (or resume) the whole study into ``out``; see the module docstring for the phases.

    ``partial``: train nothing; aggregate, evaluate and report the runs finished so far (e.g.
    while the study is still training in another process); the missing runs are listed in the
    record and the report, and claims without 2 seeds per compared variant are "not testable".

    Raises:
        InductionLabError: invalid config (before anything is written); ``out`` holding a study
            with other parameters (e.g. another budget); a training run that fails.
        TypeError: ``cfg`` not a BiInductStudyConfig (a dict included).
    """
    t_start = time.perf_counter()
    from ...checks import check_type

    check_type(cfg, BiInductStudyConfig, "run_bi_induct_study: cfg")
    cfg.validate()
    out = Path(out)
    inputs = [cfg.shards]                # the prepared corpus: never under --out (--overwrite would delete it)
    StudyRun.check_out(out, overwrite, inputs=inputs)
    params = cfg.params()
    run = StudyRun(out, "study-bi-induct", params, overwrite=overwrite, on_checkpoint=on_checkpoint,
                   inputs=inputs, started=t_start)
    if not overwrite and (out / "study.json").is_file() and own_entries(out / "runs"):
        old = json.loads((out / "study.json").read_text()).get("params", {})
        if old != run.params:
            diff = sorted(k for k in set(old) | set(run.params) if old.get(k) != run.params.get(k))
            raise InductionLabError(f"{out} holds a bi-induct study with different parameters ({', '.join(diff)}); "
                                    "use a new --out, the same options (budget, seeds, preset), or --overwrite")
    run.open()
    budgets = run.json("plan", lambda: {"budgets": plan_budgets(cfg), "versions": versions()})["budgets"]
    (out / "runs").mkdir(parents=True, exist_ok=True)
    with run.timed("train"):
        if partial:
            walls = {}
            runs = [r for r in cfg.runs() if run_finished(out / "runs" / r[0])]
            if not any(v == "none" for _, v, _ in runs):
                raise InductionLabError(f"{out} holds no finished natural-only run yet; wait, or run without --partial")
        else:
            walls = train_runs(cfg, out, progress=progress, log=log)
            runs = cfg.runs()
    missing = [n for n, _, _ in cfg.runs() if n not in {r[0] for r in runs}]
    from ...train.flops import check_iso_flops, read_budgets
    actual = read_budgets([out / "runs" / n for n, _, _ in runs])
    check_iso_flops(actual)
    for n in actual:
        if actual[n] != budgets[n]:
            raise InductionLabError(f"run {n} was trained with budget {actual[n]} but the study planned {budgets[n]}; "
                                    "use a new --out")
    pieces = {n: run.json(f"train/{n}", lambda n=n: run_piece(out / "runs" / n)) for n, _, _ in runs}
    evals: dict[str, dict] = {}
    if cfg.evaluate:
        for n, _, s in runs:
            def compute(n=n, s=s):
                if progress:
                    log(f"evaluate {n}")
                return evaluate_checkpoint(final_checkpoint(out / "runs" / n), cfg.shards, cfg.eval_config(),
                                           out / "evaluate" / cfg.eval_key() / n, seed=s)
            evals[n] = run.piece(f"{cfg.eval_key()}/{n}", compute, timing="evaluate")
    threshold = float(cfg.train_config("none", 0, "x").induction_threshold)
    table = runs_table(pieces, evals)
    vs = decide(table, threshold)
    b0 = next(iter(budgets.values()))
    from ...train.telemetry import predicted_emergence
    record = {"kind": "study-bi-induct", "params": params, "preset": dataclasses.asdict(cfg.recipe),
              "matched_compute": {"checked": True, "keys": ["n_params", "seq_len", "global_batch",
                                                             "tokens_per_update", "steps", "tokens", "flops"],
                                  "budget": b0, "budgets": actual},
              "predicted_emergence": predicted_emergence(b0["global_batch"], b0["seq_len"]),
              "rules": RULES, "thresholds": {"MIN_SEEDS_FOR_CI": MIN_SEEDS_FOR_CI, "INDUCTION_EFFECT": INDUCTION_EFFECT,
                                             "ANTI_NEAR_ZERO": ANTI_NEAR_ZERO, "PROBE_FLOOR": PROBE_FLOOR,
                                             "PROBE_MARGIN": PROBE_MARGIN, "ICL_FLOOR": ICL_FLOOR,
                                             "RELATIVE_FLOOR": RELATIVE_FLOOR, "D_MEASURE": D_MEASURE,
                                             "C_MEASURE": C_MEASURE,
                                             "induction_threshold": threshold},
              "runs": table.to_dict(orient="records"), "variants_table": variants_table(table),
              "verdicts": [v.to_dict() for v in vs],
              "evaluations": evals,
              "train_wall_s_this_call": walls,
              "train_time_s_total": float(sum(p["train_time_s"] or 0 for p in pieces.values())),
              "timings": run.timings, "versions": versions(), "resumed": run.resumed, "missing_runs": missing}
    study = BiInductStudy(out, cfg, table, vs, record, run.timings)
    from .report import write_bi_induct_outputs
    run.finish(record, lambda: write_bi_induct_outputs(out, study, pieces))
    return study


__all__ = ["BiInductStudy", "run_bi_induct_study"]
