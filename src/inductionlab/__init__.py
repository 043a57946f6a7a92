"""inductionlab: find, measure, remove and grow induction heads in causal language models."""

__version__ = "0.1.0"

_EXPORTS = {
    "load_model": "models", "LoadedModel": "models",
    "instrument": "instrument", "ablate": "instrument", "HeadIntervention": "instrument",
    "compute_head_scores": "scores", "HeadScores": "scores",
    "ablation_conditions": "ablation", "top_k_heads": "ablation", "per_layer_top_p": "ablation",
    "random_heads": "ablation", "Condition": "ablation",
    "run_lag_probe": "lag_probe", "LagProbeConfig": "lag_probe", "LagProbeResult": "lag_probe",
    "run_serial_recall": "serial_recall", "SerialRecallConfig": "serial_recall",
    "run_conditions": "protocol", "Trials": "protocol", "mean_ci": "stats",
    "AnalyzeConfig": "analyze",   # the function: inductionlab.analyze.analyze (the name is the module's)
    "run_temporal_study": "study_temporal", "TemporalStudyConfig": "study_temporal",
    "InductionLabError": "errors",
}


def __getattr__(name):  # lazy, so `import inductionlab.data` does not pull in transformers
    if name in _EXPORTS:
        import importlib
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'inductionlab' has no attribute {name!r}")


__all__ = list(_EXPORTS)
