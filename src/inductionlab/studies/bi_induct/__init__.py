"""``inductionlab study bi-induct``: the Bi-Induct curriculum at matched compute against natural-only
training, with telemetry, evaluation and verdicts decided by rules stated before the data (SPEC §6–§8).

Modules: ``config`` (the config, the presets as functions returning typed configs, the training config of
one run, the plan, ``SPEC``), ``jobs`` (the training subprocesses and the run reader), ``evaluation`` (the
bridge to ``studies/evaluate``), ``tables`` and ``verdicts`` (the rules and one verdict per claim), ``study``
(``prepare`` / ``phases`` / ``result``, ``STUDY``), ``report`` (report.md, tables, figure). Names are imported on first
use: importing ``config`` loads no torch.
"""

from ..spec import lazy_exports

_EXPORTS = {**dict.fromkeys(["PRESETS", "PRESET_NAMES", "VARIANTS", "BI_INDUCT", "BiInductStudyConfig", "SPEC",
                             "train_config", "evaluation_config", "cpu_control", "cpu_natural", "tiny", "paper_013b",
                             "gpu_estimate", "plan_budgets"], "config"),
            **dict.fromkeys(["evaluate_checkpoint"], "evaluation"),
            **dict.fromkeys(["train_and_check", "run_finished", "run_piece", "train_command", "train_runs"], "jobs"),
            **dict.fromkeys(["BiInductStudy", "run_bi_induct_study"], "study"),
            **dict.fromkeys(["runs_table", "variants_table"], "tables"),
            **dict.fromkeys(["ANTI_NEAR_ZERO", "C_MEASURE", "CLAIMS", "D_MEASURE", "ICL_FLOOR", "INDUCTION_EFFECT",
                             "MIN_SEEDS_FOR_CI", "PROBE_FLOOR", "PROBE_MARGIN", "RELATIVE_FLOOR", "RULES", "seed_ci",
                             "verdict_a", "verdict_b", "verdict_c", "verdict_d", "verdict_e", "decide"], "verdicts")}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = list(_EXPORTS)
