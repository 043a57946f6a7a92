"""``inductionlab analyze``: head scores, the lag probe and ablation vs k on one model (the main job).

``config`` (:class:`AnalyzeConfig`, ``SPEC``), ``study`` (``prepare`` / ``phases`` / ``result``, ``STUDY``, :func:`analyze`),
``report`` (``write``, ``summary``). Names are imported on first use: importing ``config`` loads no torch.
"""

from ..spec import lazy_exports

__getattr__ = lazy_exports(__name__, {
    "AnalyzeConfig": "config", "SPEC": "config", "AnalyzeResult": "study", "analyze": "study",
    "analyze_report": "report", "write_analyze_outputs": "report"})
__all__ = ["AnalyzeConfig", "SPEC", "AnalyzeResult", "analyze", "analyze_report", "write_analyze_outputs"]
