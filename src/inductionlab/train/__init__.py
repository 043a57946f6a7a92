"""Matched-compute pretraining engine (SPEC §7) with head telemetry (SPEC §8).

Public API::

    from inductionlab.train import TrainConfig, load_config, train, PRESETS, model_config
    result = train(load_config("run.yaml"))

Components (each its own module): ``config`` (presets, run config), ``schedule`` (warm-up +
cosine), ``flops`` (iso-FLOPs budget), ``checkpoint`` (atomic, verified, resumable; the ``Checkpointer`` owns the FSDP gather),
``telemetry`` (head scores, perplexity, the run summary :func:`run_summary`; figures in
:mod:`inductionlab.studies.plots`), ``TrainRun`` (the one reader of a run directory, torch-free: :mod:`inductionlab.runtime.run_dir`),
``distributed`` (torchrun, DDP,
FSDP2), ``metrics`` (JSONL/CSV, TensorBoard, progress), ``trainer`` (the loop).

Imports ``core`` (telemetry's head scores), ``data``, ``runtime`` and the package's face; never
``protocols`` (the same layer) or ``studies``. A new model preset is one entry of ``config.PRESETS``.
"""

from __future__ import annotations

import importlib

_EXPORTS = {"PRESETS": "config", "TrainConfig": "config", "config_from_dict": "config", "load_config": "config",
            "model_config": "config", "Budget": "flops", "budget": "flops", "check_iso_flops": "flops",
            "param_counts": "flops", "build_scheduler": "schedule", "lr_factor": "schedule",
            "run_summary": "telemetry", "TrainRun": "..runtime.run_dir", "TrainData": "trainer", "TrainResult": "trainer", "check_data": "trainer",
            "open_data": "trainer", "train": "trainer"}


def __getattr__(name):  # lazy, so the CLI's options (train.config) do not import torch
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name] if _EXPORTS[name].startswith(".") else f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'inductionlab.train' has no attribute {name!r}")


__all__ = ["PRESETS", "TrainConfig", "config_from_dict", "load_config", "model_config", "Budget", "budget",
           "check_iso_flops", "param_counts", "build_scheduler", "lr_factor", "TrainData", "TrainResult",
           "open_data", "check_data", "run_summary", "TrainRun", "train"]
