"""What a study is, declared without running anything: :class:`StudySpec` (its command, kind and config
type) and :class:`RunOptions` (how a run goes, not what it computes).

A study is a folder ``studies/<name>/``:

* ``config.py`` — its config (a typed tree: :mod:`inductionlab.config`) and ``SPEC = StudySpec(...)``.
  Light (no torch): the command line reads it to generate the command and its options;
* ``study.py`` — ``prepare(loaded, cfg)`` (the model-dependent checks, nothing written: a plan with
  the run's ``params``), ``phases(plan, ctx)`` (the study's script: each step a call on the engine's
  :class:`~inductionlab.studies.engine.Context` — head scores, probe phases, a JSON piece — returning the
  pieces) and ``result(plan, pieces)`` (a pure function to the typed result, with verdicts);
* ``report.py`` — ``write(out, result)``: tables, figures and report.md; optionally ``summary(result)`` (the
  lines the command prints) and ``estimate(cfg)``;
* ``__init__.py`` — names the public API, lazily (:func:`lazy_exports`).

:func:`inductionlab.studies.engine.run_study` runs any spec: the opening (checks, the run directory,
resume), each step, the one results header and the closing. See ``studies/analyze/`` for the
smallest complete example.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class StudySpec:
    """A study as the engine and the command line see it.

    Attributes:
        command: the command, words separated by spaces (``"analyze"``, ``"study temporal"``).
        config: the config dataclass (its leaves are the command's options).
        help: the command's ``--help`` text (first line: the summary in ``inductionlab --help``).
        module: the module holding ``prepare``, ``phases``, ``result`` (and ``write``, ``summary``,
            ``estimate``); default: the ``study`` module beside ``config``.
        model: how the command names the model: ``"option"`` (``--model``), ``"argument"`` (``MODEL`` or
            ``--model``), or None (the study loads no model: it trains its own).
        out: the default run directory, formatted with ``time``, ``model`` (the model's name) and ``cfg``.
        inputs: config leaves (dotted paths) that name paths the run reads: never under ``--out``.
        estimate: the module has ``estimate(cfg) -> str``: ``--estimate`` prints it and exits.
    """
    command: str
    config: type
    help: str
    module: str | None = None
    model: str | None = "option"
    out: str = "runs/{kind}-{time}"
    inputs: tuple[str, ...] = ()
    estimate: bool = False

    @property
    def kind(self) -> str:
        """The run's kind: the command with hyphens (``"study-temporal"``), in the manifest and results.json."""
        return self.command.replace(" ", "-")

    @property
    def impl(self):
        """The module of ``prepare`` / ``phases`` / ``result`` (imported on first use: it loads torch)."""
        name = self.module or self.config.__module__.rpartition(".")[0] + ".study"
        return importlib.import_module(name)


@dataclass(frozen=True)
class RunOptions:
    """How a study runs, never what it computes (none of it is in ``params``).

    Attributes:
        overwrite: delete ``out`` first and start afresh (else: resume the same run, refuse another).
        progress: progress bars (rank 0 only).
        on_checkpoint: callable(key) after each piece is written (tests interrupt here).
        dist: a :class:`~inductionlab.runtime.distributed.Dist` of several processes (torchrun; every rank
            calls with the same arguments): the work is sharded, rank 0 alone writes ``out``.
        log: callable(str) given the lines a user should see (the CLI: ``click.echo``): which dtype runs and
            why, once the checks pass; a study's progress notes.
    """
    overwrite: bool = False
    progress: bool = True
    on_checkpoint: Callable[[str], None] | None = None
    dist: Any = None
    log: Callable[[str], None] | None = None


def specs() -> list[StudySpec]:
    """Every study of the package: the ``SPEC`` of each ``studies/<name>/config.py`` (imported without torch),
    in folder order. A new study folder with a spec is found here, so it needs no command-line code."""
    import pkgutil
    from pathlib import Path

    package = __name__.rpartition(".")[0]
    found = []
    for m in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if m.ispkg:
            spec = getattr(importlib.import_module(f"{package}.{m.name}.config"), "SPEC", None)
            if isinstance(spec, StudySpec):
                found.append(spec)
    return found


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for a study's ``__init__``: ``name`` -> imported from the submodule
    ``exports[name]`` on first use, so importing the package (``studies.analyze.config``, for the
    command line) does not import torch."""
    def __getattr__(name: str) -> Any:
        if name in exports:
            return getattr(importlib.import_module(f"{package}.{exports[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return __getattr__


__all__ = ["StudySpec", "RunOptions", "specs", "lazy_exports"]
