"""``inductionlab study bi-induct``: the Bi-Induct curriculum at matched compute against natural-only
training, with telemetry, evaluation and verdicts decided by rules stated before the data (SPEC §6–§8).

Modules: ``config`` (variants, presets, :class:`BiInductStudyConfig`, the plan), ``jobs`` (the training
subprocesses and the run reader), ``evaluation`` (the bridge to ``studies/evaluate``), ``tables`` and
``verdicts`` (the rules and one verdict per claim), ``study`` (the phases), ``report`` (report.md, tables,
figure; not imported here: it loads matplotlib)."""

from .config import STUDY_PRESETS, VARIANTS, BiInductStudyConfig, StudyPreset, gpu_estimate, plan_budgets
from .evaluation import evaluate_checkpoint, evaluation_config
from .jobs import run_finished, run_piece, train_command, train_runs
from .study import BiInductStudy, run_bi_induct_study
from .tables import runs_table, variants_table
from .verdicts import (ANTI_NEAR_ZERO, C_MEASURE, CLAIMS, D_MEASURE, ICL_FLOOR, INDUCTION_EFFECT, MIN_SEEDS_FOR_CI,
                       PROBE_FLOOR, PROBE_MARGIN, RELATIVE_FLOOR, RULES, seed_ci, verdict_a, verdict_b, verdict_c,
                       verdict_d, verdict_e, decide)

__all__ = ["STUDY_PRESETS", "VARIANTS", "BiInductStudy", "BiInductStudyConfig", "StudyPreset", "gpu_estimate",
           "plan_budgets", "run_bi_induct_study", "evaluate_checkpoint", "evaluation_config", "run_finished",
           "run_piece", "train_command", "train_runs", "runs_table", "variants_table", "ANTI_NEAR_ZERO", "C_MEASURE",
           "CLAIMS", "D_MEASURE", "ICL_FLOOR", "INDUCTION_EFFECT", "MIN_SEEDS_FOR_CI", "PROBE_FLOOR", "PROBE_MARGIN",
           "RELATIVE_FLOOR", "RULES", "seed_ci", "verdict_a", "verdict_b", "verdict_c", "verdict_d", "verdict_e",
           "decide"]
