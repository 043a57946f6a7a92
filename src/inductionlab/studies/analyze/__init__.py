"""``inductionlab analyze``: head scores, the lag probe and ablation vs k on one model (the main job)."""

from .study import AnalyzeConfig, AnalyzeResult, analyze

__all__ = ["AnalyzeConfig", "AnalyzeResult", "analyze"]
