"""``inductionlab evaluate``: function-style ICL probes, ICL score, perplexity, induction loss and the
load-bearing test (top induction heads vs matched random heads) on one model (SPEC §3, §8)."""

from .study import (EvaluateConfig, EvaluateResult, ICLScoreConfig, InductionLossConfig, LmEvalConfig,
                    LoadBearingConfig, PerplexityConfig, ProbeConfig, RecallConfig, run_evaluate)

__all__ = ["EvaluateConfig", "EvaluateResult", "ICLScoreConfig", "InductionLossConfig", "LmEvalConfig",
           "LoadBearingConfig", "PerplexityConfig", "ProbeConfig", "RecallConfig", "run_evaluate"]
