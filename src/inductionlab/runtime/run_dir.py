"""The one reader of a training run directory (what ``inductionlab train --out`` writes).

Layout::

    <run>/
        run.json                   the run record: kind, status ("running" | "complete"), identity,
                                   config (the TrainConfig; config.data = the corpus), model_config,
                                   budget (train.flops.Budget), checkpoint_steps, seeds, versions,
                                   results (once complete)
        checkpoints/
            step_00000128/         one checkpoint (layout: inductionlab.train.checkpoint); complete
                                   (published, loadable) when it holds config.json
                telemetry.json     head scores and held-out perplexity at this step (when measured)
                meta.json          step, tokens, kind, SHA-256 of the other files
        metrics.jsonl, ...         training curves (train.metrics), telemetry tables (train.telemetry)

The writers are :mod:`inductionlab.train.trainer` (run.json) and
:class:`inductionlab.train.checkpoint.CheckpointManager` (checkpoints); every other module reads
through :class:`TrainRun`. Torch-free (plain JSON and paths), so the model-spec lookup
(:mod:`inductionlab.runtime.model_specs`) and ``data/`` may use it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InductionLabError

RECORD = "run.json"
CHECKPOINTS = "checkpoints"
TELEMETRY = "telemetry.json"
MODEL_CONFIG = "config.json"      # a checkpoint holding it is complete (a save_pretrained directory)
STEP_PREFIX = "step_"


@dataclass(frozen=True)
class Checkpoint:
    """One ``checkpoints/step_N`` directory of a run."""
    step: int
    path: Path

    @property
    def complete(self) -> bool:
        """Published and loadable: it holds ``config.json``."""
        return (self.path / MODEL_CONFIG).is_file()

    @property
    def telemetry(self) -> Path | None:
        """Its ``telemetry.json``, or None when this step was not measured."""
        p = self.path / TELEMETRY
        return p if p.is_file() else None


def _step_of(p: Path) -> int | None:
    """N of a ``step_N`` directory name, or None for any other name."""
    tail = p.name.removeprefix(STEP_PREFIX)
    return int(tail) if p.name.startswith(STEP_PREFIX) and tail.isascii() and tail.isdigit() else None


class TrainRun:
    """A training run directory, read: its record, status, budget, config, checkpoints, telemetry
    files and corpus (layout: the module docstring).

    ``TrainRun(path)`` checks nothing (for the layout questions: which checkpoints, is it complete);
    :meth:`open` checks that ``path`` is a training run with a readable record."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._record: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return f"TrainRun({str(self.path)!r})"

    # ---- finding one ---------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike) -> "TrainRun":
        """The training run at ``path``, its record read and checked (:attr:`record`).

        Raises:
            InductionLabError: no run.json (not a training run), or one that is unreadable, not JSON
                or without ``budget`` and ``config`` objects (damaged)."""
        run = cls(path)
        if not run.has_record:
            raise InductionLabError(f"{path} is not a training run (no run.json); pass a directory written by "
                                    "`inductionlab train`")
        run._record = run._checked_record()
        return run

    @staticmethod
    def is_run(path: str | os.PathLike) -> bool:
        """Whether ``path`` is a directory holding a ``run.json``."""
        return (Path(path) / RECORD).is_file()

    @classmethod
    def of_checkpoint(cls, ckpt: str | os.PathLike) -> "TrainRun | None":
        """The run of a checkpoint ``<run>/checkpoints/step_N`` (its run holds run.json), or None."""
        ckpt = Path(ckpt)
        run = ckpt.parent.parent
        return cls(run) if ckpt.parent.name == CHECKPOINTS and cls.is_run(run) else None

    # ---- the record ----------------------------------------------------------------------------

    @property
    def record_path(self) -> Path:
        return self.path / RECORD

    @property
    def has_record(self) -> bool:
        return self.record_path.is_file()

    def read_record(self) -> dict[str, Any] | None:
        """``run.json`` as it is now (read afresh, unchecked), or None when it is absent, unreadable,
        not JSON or not an object (a run still being written is read without error)."""
        try:
            from ..documents import read_json
            rec = read_json(self.record_path, "training run record")
        except (OSError, ValueError):
            return None
        return rec if isinstance(rec, dict) else None

    def _checked_record(self) -> dict[str, Any]:
        p = self.record_path
        try:
            from ..documents import read_json
            rec = read_json(p, "training run record")
            ok = isinstance(rec, dict) and isinstance(rec.get("budget"), dict) and isinstance(rec.get("config"), dict)
            why = "no 'budget' and 'config' objects"
        except (OSError, ValueError) as e:
            msg = e.msg if isinstance(e, json.JSONDecodeError) else str(e)     # the parser's reason, not the path again
            ok, why = False, " ".join(msg.split())[:160] or type(e).__name__
        if not ok:
            raise InductionLabError(f"training run record {p} is damaged ({why}); restore it from a copy of the run, "
                                    "or train the run again with `inductionlab train --out` a new directory")
        return rec

    @property
    def record(self) -> dict[str, Any]:
        """``run.json``, checked to hold ``budget`` and ``config`` objects (read once, then kept).

        Raises: InductionLabError as :meth:`open`."""
        if self._record is None:
            self._record = TrainRun.open(self.path)._record
        return self._record

    @property
    def budget(self) -> dict[str, Any]:
        """The run's compute budget (:meth:`inductionlab.train.flops.Budget.to_dict`)."""
        return self.record["budget"]

    @property
    def config(self) -> dict[str, Any]:
        """The run's config (:meth:`inductionlab.train.config.TrainConfig.to_dict`)."""
        return self.record["config"]

    @property
    def is_complete(self) -> bool:
        """Whether the run has finished: ``run.json`` (read afresh) says ``status: complete``. False
        for a run in progress, a missing or unreadable record."""
        rec = self.read_record()
        return rec is not None and rec.get("status") == "complete"

    @property
    def corpus(self) -> Path | None:
        """The training corpus named in the record (``config.data``; a relative path is taken from
        the run directory when it exists there, else as given), or None when the record is missing,
        unreadable or names none."""
        rec = self.read_record()
        try:
            data = rec["config"]["data"] if rec is not None else None
        except (KeyError, TypeError):
            data = None
        if not data:
            return None
        p = Path(data)
        return p if p.is_absolute() else (self.path / data if (self.path / data).exists() else p)

    # ---- checkpoints ---------------------------------------------------------------------------

    @property
    def checkpoints_dir(self) -> Path:
        return self.path / CHECKPOINTS

    def checkpoints(self, complete: bool = True) -> list[Checkpoint]:
        """The run's ``checkpoints/step_N`` directories, by step; only complete ones (holding
        config.json) unless ``complete=False``. Hidden staging directories are never listed.

        Raises:
            InductionLabError: ``checkpoints`` or a ``step_N`` is a symbolic link that leads outside the run
                (:func:`~inductionlab.runtime.outputs.inside`): a resume, a pruning or a reader would work
                on a folder that is not this run's."""
        from .outputs import inside

        if not inside(self.path, CHECKPOINTS, "checkpoints folder").is_dir():
            return []
        out = [Checkpoint(s, inside(self.path, Path(CHECKPOINTS) / p.name, "checkpoint")) for p in self.checkpoints_dir.iterdir()
               if (s := _step_of(p)) is not None and p.is_dir()]
        return sorted((c for c in out if c.complete or not complete), key=lambda c: c.step)

    def final_checkpoint(self) -> Path:
        """The newest complete checkpoint (the final one once the run has finished).

        Raises:
            InductionLabError: the run has no complete checkpoint."""
        c = self.checkpoints()
        if not c:
            raise InductionLabError(f"training run {self.path} has no published checkpoint yet; wait for checkpoint 0, "
                                    "train it again, or pass a checkpoint directory")
        return c[-1].path

    def telemetry_files(self) -> list[Path]:
        """The ``telemetry.json`` of every checkpoint that has one, by step (complete or not: the
        telemetry tables of a run need no weights)."""
        return [c.telemetry for c in self.checkpoints(complete=False) if c.telemetry is not None]


def final_checkpoint(run_dir: str | os.PathLike) -> Path:
    """The newest published checkpoint ``checkpoints/step_N`` of a training run directory
    (``inductionlab train --out``; the final one once the run has finished): :meth:`TrainRun.final_checkpoint`.

    Raises:
        InductionLabError: the run has no published checkpoint."""
    return TrainRun(run_dir).final_checkpoint()


__all__ = ["TrainRun", "Checkpoint", "final_checkpoint", "RECORD", "CHECKPOINTS", "TELEMETRY"]
