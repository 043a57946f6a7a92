"""Checkpoints: log-spaced schedule, atomic writes, verified resume (SPEC §7).

Layout of a run directory's ``checkpoints/``::

    step_00000128/                 one checkpoint = a `save_pretrained` directory
        config.json, model.safetensors, generation_config.json
        tokenizer.json, tokenizer_config.json, ...        (the training tokenizer, next to the weights)
        trainer_state.pt       optimizer, LR scheduler, data-stream step, torch/numpy/python RNG
                               (only in the newest ``keep_resumable`` checkpoints)
        telemetry.json         head scores and held-out perplexity at this step (when measured)
        meta.json              step, tokens, kind, SHA-256 of every other file — written last

A checkpoint is assembled in a hidden ``.step_N.partial-*`` directory and published with one
``os.replace``; a kill at any moment leaves either the previous set of checkpoints or the new one,
never a half-written ``step_N``. On resume the newest resumable checkpoint is verified against the
checksums in its ``meta.json``; a mismatch is an error (the user decides whether to delete it).

Every path written, read or deleted stays inside the run directory
(:func:`~inductionlab.runtime.outputs.inside`): a ``checkpoints`` folder or ``step_N`` that links
elsewhere, and a name in ``meta.json`` that leaves its checkpoint (``../``), are refused. ``meta.json``
records the run's identity (``run``: :func:`~inductionlab.runtime.runs.run_identity` of run.json's
``identity``); a checkpoint of another run is refused on resume.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..documents import DocumentError, read_json
from ..errors import InductionLabError
from ..runtime.run_dir import CHECKPOINTS, TrainRun
from ..runtime.outputs import inside
from ..runtime.runs import atomic_write_json, sha256_file, swap_in

META = "meta.json"
STATE = "trainer_state.pt"


def checkpoint_schedule(total_steps: int, n_log: int = 12, dense_start: int = 0, dense_end: int = 0,
                        dense_every: int = 0) -> list[int]:
    """Steps (optimizer updates completed) at which to checkpoint and measure telemetry.

    Step 0 (initialisation) and ``total_steps`` always; ``n_log`` steps log-spaced between 1 and
    ``total_steps`` (rounded, duplicates dropped); every ``dense_every`` steps in
    ``[dense_start, dense_end]`` when ``dense_every > 0``.
    """
    steps = {0, total_steps}
    if n_log > 0 and total_steps > 1:
        steps.update(int(round(s)) for s in np.geomspace(1, total_steps, n_log))
    if dense_every > 0 and dense_end >= dense_start:
        steps.update(range(max(dense_start, 0), min(dense_end, total_steps) + 1, dense_every))
    return sorted(s for s in steps if 0 <= s <= total_steps)


def rng_state() -> dict[str, Any]:
    """torch, numpy and python RNG states in a form ``torch.load(weights_only=True)`` accepts."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)]}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(tuple(v if not isinstance(v, list) else tuple(v) for v in state["python"]))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_os_error(e: BaseException, path: Path) -> BaseException:
    """An error of the system met by a writer (safetensors says ``... (os error 28)``) as the
    ``OSError`` it is, naming ``path``; other errors unchanged."""
    import re

    m = None if isinstance(e, OSError) else re.search(r"\(os error (\d+)\)", str(e))
    if m:
        err = OSError(int(m[1]), os.strerror(int(m[1])), str(path))
        err.__cause__ = e
        return err
    if isinstance(e, OSError) and e.filename is None:
        e.filename = str(path)
    return e


class CheckpointManager:
    """Writes, lists, prunes and verifies the checkpoints of one run directory."""

    def __init__(self, run_dir: str | Path, keep_resumable: int = 2, run: str | None = None):
        self.run_dir = Path(run_dir)
        self.dir = self.run_dir / CHECKPOINTS
        self.keep_resumable = keep_resumable
        self.run = run          # the run's identity, recorded in every meta.json and checked on resume

    @staticmethod
    def name(step: int) -> str:
        return f"step_{step:08d}"

    def path(self, step: int) -> Path:
        return self.dir / self.name(step)

    def list(self) -> list[tuple[int, Path, dict]]:
        """Published checkpoints, oldest first, as (step, path, meta) (the ``step_N`` directories
        :meth:`~inductionlab.runtime.run_dir.TrainRun.checkpoints` lists, complete or not)."""
        out = []
        for c in TrainRun(self.run_dir).checkpoints(complete=False):   # refuses links out of the run
            try:
                meta = read_json(c.path / META, "checkpoint meta")
            except (OSError, ValueError, RecursionError, InductionLabError):
                meta = {}
            out.append((c.step, c.path, meta if isinstance(meta, dict) else {}))
        return out

    def clean_partials(self) -> None:
        """Remove staging directories left by a process killed mid-write."""
        if inside(self.run_dir, CHECKPOINTS, "checkpoints folder").is_dir():
            for p in self.dir.glob(".step_*"):
                shutil.rmtree(p, ignore_errors=True)

    def save(self, step: int, *, model, state_dict: dict | None, tokenizer, trainer_state: dict | None,
             meta: dict, extra_json: dict[str, Any] | None = None) -> Path:
        """Write checkpoint ``step`` atomically and return its path.

        Args:
            model: a ``PreTrainedModel`` whose ``save_pretrained`` writes config + weights.
            state_dict: full (unsharded) state dict to save instead of ``model.state_dict()``.
            tokenizer: a ``PreTrainedTokenizerBase`` (saved next to the weights) or None.
            trainer_state: optimizer / scheduler / RNG / stream state (``torch.save``), or None.
            meta: JSON-able facts about the step (tokens, kind, ...); checksums are added here.
            extra_json: more JSON files to place in the checkpoint, name -> object.
        """
        inside(self.run_dir, CHECKPOINTS, "checkpoints folder").mkdir(parents=True, exist_ok=True)
        self.list()                           # refuses a step_N linking out of the run before anything is written
        final = inside(self.run_dir, Path(CHECKPOINTS) / self.name(step), "checkpoint")
        stage = Path(tempfile.mkdtemp(prefix=f".{final.name}.partial-", dir=self.dir))
        from transformers.utils import logging as hf_logging
        bars = hf_logging.is_progress_bar_enabled()
        try:
            hf_logging.disable_progress_bar()
            try:
                model.save_pretrained(stage, state_dict=state_dict, safe_serialization=True)
            finally:
                if bars:
                    hf_logging.enable_progress_bar()
            if tokenizer is not None:
                tokenizer.save_pretrained(stage)
            if trainer_state is not None:
                with open(stage / STATE, "wb") as f:   # through Python's file: a full disk is an OSError
                    torch.save(trainer_state, f)
            for name, obj in (extra_json or {}).items():
                atomic_write_json(stage / name, obj)
            files = sorted(p for p in stage.rglob("*") if p.is_file())
            sums = {}
            for p in files:
                with open(p, "rb") as f:
                    os.fsync(f.fileno())
                sums[str(p.relative_to(stage))] = sha256_file(p)
            atomic_write_json(stage / META, {**meta, "step": step, "resumable": trainer_state is not None,
                                             **({"run": self.run} if self.run is not None else {}), "sha256": sums})
            swap_in(stage, final)                         # a re-run of a step after resume replaces it
        except BaseException as e:
            shutil.rmtree(stage, ignore_errors=True)
            raise _as_os_error(e, final)
        self._prune()
        return final

    def _prune(self) -> None:
        """Drop rolling checkpoints that are no longer the newest, and optimizer state from all but
        the newest ``keep_resumable`` checkpoints."""
        ckpts = self.list()
        for step, p, meta in ckpts[:-1]:
            if meta.get("kind") == "rolling":
                trash = self.dir / f".{p.name}.old-prune"
                os.replace(p, trash)
                shutil.rmtree(trash, ignore_errors=True)
        resumable = [(s, p, m) for s, p, m in self.list() if m.get("resumable")]
        for step, p, meta in resumable[:-self.keep_resumable]:
            meta = {**meta, "resumable": False}
            sums = meta.get("sha256")
            meta["sha256"] = {k: v for k, v in sums.items() if k != STATE} if isinstance(sums, dict) else {}
            atomic_write_json(p / META, meta)       # first say it is not resumable, then delete
            (p / STATE).unlink(missing_ok=True)

    def verify(self, path: Path) -> dict:
        """Check every file of a checkpoint against its recorded SHA-256; return its meta.

        Raises:
            InductionLabError: missing ``meta.json``, missing file or checksum mismatch.
        """
        fix = f"delete {path} to resume from the previous checkpoint, or pass a new --out"
        try:
            meta = read_json(path / META, "checkpoint meta")
            sums = meta["sha256"]
        except (OSError, ValueError, KeyError, TypeError, RecursionError, DocumentError):
            raise InductionLabError(f"checkpoint {path} is corrupt (unreadable {META}); {fix}") from None
        if not (isinstance(sums, dict) and all(isinstance(k, str) and k and isinstance(v, str) for k, v in sums.items())):
            raise InductionLabError(f"checkpoint {path} is corrupt ({META} has no sha256 table of file -> digest); {fix}")
        if self.run is not None and meta.get("run", self.run) != self.run:
            raise InductionLabError(f"checkpoint {path} was written by another training run (its {META} names another "
                                    f"run identity); {fix}")
        for rel, digest in sums.items():
            try:
                f = inside(path, rel)                 # a name with ../ or through a link out is never followed
            except InductionLabError:
                raise InductionLabError(f"checkpoint {path} is corrupt ({META} names {rel!r}, outside the checkpoint); "
                                        f"{fix}") from None
            if not f.is_file():
                raise InductionLabError(f"checkpoint {path} is corrupt ({rel} is missing); {fix}")
            if sha256_file(f) != digest:
                raise InductionLabError(f"checkpoint {path} is corrupt ({rel} fails its checksum); {fix}")
        return meta

    def latest_resumable(self) -> tuple[int, Path, dict] | None:
        """The newest checkpoint holding trainer state, verified; None when there is none."""
        for step, p, meta in reversed(self.list()):
            if not meta:
                self.verify(p)                         # raises: a published dir without meta is corrupt
            if meta.get("resumable"):
                return step, p, self.verify(p)
        return None

    @staticmethod
    def load_trainer_state(path: Path) -> dict:
        """The trainer state of checkpoint ``path``, checked to have the shape :meth:`Checkpointer.save` writes.

        Raises:
            InductionLabError: unreadable, not a trainer state, or of another shape (one line, never a traceback)."""
        fix = f"delete {path} to resume from the previous checkpoint"
        try:
            state = torch.load(inside(path, STATE), map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - any unpickling failure means a damaged file
            raise InductionLabError(f"checkpoint {path} is corrupt ({STATE}: {str(e).splitlines()[0] if str(e) else e!r}); "
                                    f"{fix}") from None
        need = {"step": int, "scheduler": dict, "rng": dict}
        if not (isinstance(state, dict) and all(isinstance(state.get(k), t) for k, t in need.items())
                and (state.get("optimizer") is None or isinstance(state["optimizer"], dict))):
            raise InductionLabError(f"checkpoint {path} is corrupt ({STATE} is not a trainer state: it needs "
                                    f"{', '.join(need)} and optimizer); {fix}")
        return state


class Checkpointer:
    """The trainer's checkpoint component: gathers the full state of a (possibly FSDP-sharded)
    model and optimizer, and publishes it with :class:`CheckpointManager`.

    :meth:`gather` is collective (every rank calls it); :meth:`save` runs on rank 0 only.

    Args:
        manager: the run's :class:`CheckpointManager`.
        wrapped, model: the module being trained (DDP/FSDP wrapper or the model itself) and the
            plain model.
        optimizer, scheduler: AdamW and its LR schedule (their state goes into ``trainer_state.pt``).
        mcfg: the model config (an unsharded host copy is built from it under FSDP).
        parallel, dist: the parallel mode and process group (:mod:`.distributed`).
        tokenizer: saved next to every checkpoint (or None).
        tokens_per_update: tokens per optimizer step (recorded per checkpoint).
    """

    def __init__(self, manager: CheckpointManager, wrapped, model, optimizer, scheduler, mcfg, *, parallel: str,
                 dist, tokenizer=None, tokens_per_update: int):
        self.manager, self.wrapped, self.model = manager, wrapped, model
        self.optimizer, self.scheduler, self.mcfg = optimizer, scheduler, mcfg
        self.parallel, self.dist, self.tokenizer = parallel, dist, tokenizer
        self.tokens_per_update = tokens_per_update
        self.fsdp = dist.distributed and parallel == "fsdp"
        self._optimizer_state: dict | None = None

    def gather(self, step: int):
        """Collective: the full model on rank 0 (the model itself, or under FSDP a plain copy
        loaded from the gathered state dict), None elsewhere; the optimizer state is gathered too
        (none before the first update: the FSDP state-dict API would otherwise initialise it
        with a zero-lr step, advancing AdamW's step count)."""
        from . import distributed as D
        sd = D.full_model_state(self.wrapped, self.parallel, self.dist) if self.fsdp else None
        self._optimizer_state = (D.optimizer_state(self.wrapped, self.optimizer, self.parallel, self.dist)
                                 if step > 0 else None)
        if not self.dist.is_main:
            return None
        if not self.fsdp:
            return self.model
        from transformers import LlamaForCausalLM
        host = LlamaForCausalLM(self.mcfg)
        host.load_state_dict(sd)
        return host.to(self.dist.device)

    def save(self, step: int, kind: str, host, *, elapsed_s: float, extra_json: dict | None = None) -> Path:
        """Rank 0: publish checkpoint ``step`` (``kind`` "schedule" or "rolling") of the model
        returned by :meth:`gather`, with optimizer / scheduler / RNG / data-position state."""
        tokens = step * self.tokens_per_update
        trainer_state = {"step": step, "stream_step": step, "tokens": tokens,
                         "optimizer": self._optimizer_state, "optimizer_format": "fqn" if self.fsdp else "plain",
                         "scheduler": self.scheduler.state_dict(), "rng": rng_state(),
                         "world_size": self.dist.world_size, "elapsed_s": elapsed_s}
        meta = {"tokens": tokens, "kind": kind, "lr_next": self.scheduler.get_last_lr()[0]}
        return self.manager.save(step, model=host, state_dict=None, tokenizer=self.tokenizer,
                                 trainer_state=trainer_state, meta=meta, extra_json=extra_json)
