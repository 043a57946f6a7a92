"""``inductionlab study temporal``: how induction heads shape temporal dependencies in retrieval (SPEC §5)."""

from .config import TemporalStudyConfig, default_ks
from .report import temporal_report, write_temporal_outputs
from .study import TemporalStudy, run_temporal_study
from .verdicts import headline_table, decide

__all__ = ["TemporalStudy", "TemporalStudyConfig", "default_ks", "headline_table", "run_temporal_study", "temporal_report",
           "decide", "write_temporal_outputs"]
