"""``inductionlab study temporal``: how induction heads shape temporal dependencies in retrieval (SPEC §4–§5).

``config`` (:class:`TemporalStudyConfig`, ``SPEC``), ``study`` (``prepare`` / ``phases`` / ``result``, ``STUDY``,
:func:`run_temporal_study`), ``verdicts`` (the claims' rules), ``report`` (``write``, ``summary``). Names are
imported on first use: importing ``config`` loads no torch.
"""

from ..spec import lazy_exports

__getattr__ = lazy_exports(__name__, {
    "TemporalStudyConfig": "config", "SPEC": "config", "default_ks": "config", "TemporalStudy": "study",
    "run_temporal_study": "study", "headline_table": "verdicts", "decide": "verdicts", "temporal_report": "report",
    "write_temporal_outputs": "report"})
__all__ = ["TemporalStudy", "TemporalStudyConfig", "SPEC", "default_ks", "headline_table", "run_temporal_study",
           "temporal_report", "decide", "write_temporal_outputs"]
