"""inductionlab: find, measure, remove and grow induction heads in causal language models."""

__version__ = "0.1.0"

_EXPORTS = {
    "load_model": "core.support", "LoadedModel": "core.models",
    "instrument": "core.instrument", "ablate": "core.instrument", "HeadIntervention": "core.instrument",
    "compute_head_scores": "core.scores", "HeadScores": "core.scores", "induction_sequence": "core.scores",
    "ScoreSequences": "core.scores",
    "attention_patterns": "core.instrument",
    "ablation_conditions": "core.ablation", "top_k_heads": "core.ablation", "per_layer_top_p": "core.ablation",
    "random_heads": "core.ablation", "Condition": "core.ablation",
    "run_lag_probe": "protocols.lag_probe", "LagProbeConfig": "protocols.lag_probe", "LagProbeResult": "protocols.lag_probe",
    "run_serial_recall": "protocols.serial_recall", "SerialRecallConfig": "protocols.serial_recall",
    "run_conditions": "protocols.runner", "Trials": "protocols.runner", "mean_ci": "measures.stats",
    "analyze": "studies.analyze", "AnalyzeConfig": "studies.analyze",
    "run_temporal_study": "studies.temporal", "TemporalStudyConfig": "studies.temporal",
    "InductionLabError": "errors",
}


def __getattr__(name):  # lazy, so `import inductionlab.data` does not pull in transformers
    if name in _EXPORTS:
        import importlib
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'inductionlab' has no attribute {name!r}")


__all__ = list(_EXPORTS)
