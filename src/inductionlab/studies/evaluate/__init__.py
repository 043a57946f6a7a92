"""``inductionlab evaluate``: function-style ICL probes, ICL score, perplexity, induction loss and the
load-bearing test (top induction heads vs matched random heads) on one model (SPEC §3, §8).

* ``config`` — :class:`EvaluateConfig` and its nested configs, :func:`parse_variant`, ``SPEC``;
* ``study`` — ``prepare`` / ``phases`` / ``result``, ``STUDY``, :func:`run_evaluate` and :class:`EvaluateResult`;
* ``tables`` — the tidy tables of a finished evaluation and the load-bearing conditions;
* ``report`` — tables/, plots/ and report.md of the run directory (``write``), ``summary``.

Names are imported on first use: importing ``config`` loads no torch.
"""

from ..spec import lazy_exports

_EXPORTS = {**dict.fromkeys(["EvaluateConfig", "ICLScoreConfig", "InductionLossConfig", "LmEvalConfig",
                             "LoadBearingConfig", "PerplexityConfig", "ProbeConfig", "RecallConfig", "parse_variant",
                             "SPEC"], "config"),
            **dict.fromkeys(["EvaluateResult", "run_evaluate", "token_pool"], "study"),
            **dict.fromkeys(["evaluate_report", "write_evaluate_outputs"], "report"),
            **dict.fromkeys(["SEQUENCE_MEASURES", "SequenceMeasure", "drops_by_measure", "hits_table", "icl_table",
                             "load_bearing_conditions"], "tables")}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = list(_EXPORTS)
