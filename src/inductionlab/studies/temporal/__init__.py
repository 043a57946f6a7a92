"""``inductionlab study temporal``: how induction heads shape temporal dependencies in retrieval (SPEC §5)."""

from .study import TemporalStudy, TemporalStudyConfig, default_ks, headline_table, run_temporal_study, verdicts

__all__ = ["TemporalStudy", "TemporalStudyConfig", "default_ks", "headline_table", "run_temporal_study", "verdicts"]
