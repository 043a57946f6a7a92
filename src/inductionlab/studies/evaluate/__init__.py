"""``inductionlab evaluate``: function-style ICL probes, ICL score, perplexity, induction loss and the
load-bearing test (top induction heads vs matched random heads) on one model (SPEC §3, §8).

* ``config`` — :class:`EvaluateConfig` and its nested configs, :func:`parse_variant`;
* ``study`` — :func:`run_evaluate` (phases through :class:`~inductionlab.studies.run.StudyRun`) and
  :class:`EvaluateResult`;
* ``tables`` — the tidy tables of a finished evaluation and the load-bearing conditions;
* ``report`` — tables/, plots/ and report.md of the run directory.
"""

from .config import (EvaluateConfig, ICLScoreConfig, InductionLossConfig, LmEvalConfig, LoadBearingConfig,
                     PerplexityConfig, ProbeConfig, RecallConfig, parse_variant)
from .report import evaluate_report, write_evaluate_outputs
from .study import EvaluateResult, run_evaluate, token_pool
from .tables import SEQUENCE_MEASURES, SequenceMeasure, drops_by_measure, hits_table, icl_table, load_bearing_conditions

__all__ = ["EvaluateConfig", "EvaluateResult", "ICLScoreConfig", "InductionLossConfig", "LmEvalConfig",
           "LoadBearingConfig", "PerplexityConfig", "ProbeConfig", "RecallConfig", "run_evaluate", "parse_variant",
           "load_bearing_conditions", "hits_table", "drops_by_measure", "icl_table", "token_pool",
           "evaluate_report", "write_evaluate_outputs", "SEQUENCE_MEASURES", "SequenceMeasure"]
