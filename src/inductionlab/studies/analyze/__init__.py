"""``inductionlab analyze``: head scores, the lag probe and ablation vs k on one model (the main job)."""

from .config import AnalyzeConfig
from .report import analyze_report, write_analyze_outputs
from .study import AnalyzeResult, analyze

__all__ = ["AnalyzeConfig", "AnalyzeResult", "analyze", "analyze_report", "write_analyze_outputs"]
