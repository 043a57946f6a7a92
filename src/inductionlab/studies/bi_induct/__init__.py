"""``inductionlab study bi-induct``: the Bi-Induct curriculum at matched compute against natural-only
training, with telemetry, evaluation and verdicts decided by rules stated before the data (SPEC §6–§8)."""

from .study import (STUDY_PRESETS, VARIANTS, BiInductStudy, BiInductStudyConfig, StudyPreset, gpu_estimate,
                    plan_budgets, run_bi_induct_study)

__all__ = ["STUDY_PRESETS", "VARIANTS", "BiInductStudy", "BiInductStudyConfig", "StudyPreset", "gpu_estimate",
           "plan_budgets", "run_bi_induct_study"]
