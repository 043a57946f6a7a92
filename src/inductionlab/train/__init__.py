"""Matched-compute pretraining engine (SPEC §7) with head telemetry (SPEC §8).

Public API::

    from inductionlab.train import TrainConfig, load_config, train, PRESETS, model_config
    result = train(load_config("run.yaml"))

Components (each its own module): ``config`` (presets, run config), ``schedule`` (warm-up +
cosine), ``flops`` (iso-FLOPs budget), ``checkpoint`` (atomic, verified, resumable; the ``Checkpointer`` owns the FSDP gather),
``telemetry`` (head scores, perplexity, the run summary :func:`run_summary`; figures in
:mod:`inductionlab.plots`), ``distributed`` (torchrun, DDP,
FSDP2), ``metrics`` (JSONL/CSV, TensorBoard, progress), ``trainer`` (the loop).
"""

from __future__ import annotations

from .config import PRESETS, TrainConfig, config_from_dict, load_config, model_config
from .flops import Budget, budget, check_iso_flops, param_counts
from .schedule import build_scheduler, lr_factor
from .telemetry import run_summary
from .trainer import TrainData, TrainResult, check_data, open_data, train

__all__ = ["PRESETS", "TrainConfig", "config_from_dict", "load_config", "model_config", "Budget", "budget",
           "check_iso_flops", "param_counts", "build_scheduler", "lr_factor", "TrainData", "TrainResult",
           "open_data", "check_data", "run_summary", "train"]
