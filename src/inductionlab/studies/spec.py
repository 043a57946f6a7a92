"""What a study is, declared without running anything: :class:`StudySpec` (its command, kind, config type and
the name of its :class:`Study`), :class:`Study` (the functions the engine runs), :class:`StudyPlan` (what every
plan carries) and :class:`RunOptions` (how a run goes, not what it computes). No torch.

A study is a folder ``studies/<name>/``:

* ``config.py`` — its config (a typed tree: :mod:`inductionlab.config`) and ``SPEC = StudySpec(...)``.
  Light (no torch): the command line reads it to generate the command and its options;
* ``study.py`` — ``prepare(loaded, cfg)`` (the model-dependent checks, nothing written: a :class:`StudyPlan`
  with the run's ``params``), ``phases(plan, ctx)`` (the study's script: each step a call on the engine's
  :class:`~inductionlab.studies.engine.Context` — head scores, probe phases, resumable pieces — returning the
  pieces) and ``result(plan, pieces)`` (a pure function to the typed result, with verdicts); it ends with
  ``STUDY = Study(prepare, phases, result, write, summary, estimate)``;
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
from pathlib import Path
from typing import Any, Callable, Generic, TypeVar

C = TypeVar("C")                       # the study's config
P = TypeVar("P", bound="StudyPlan")    # its plan
R = TypeVar("R")                       # its result (a StudyResult)


@dataclass(kw_only=True)
class StudyPlan:
    """What every study's plan carries for the engine (a study's plan dataclass extends it; its own fields
    come first, these are keyword-only).

    Attributes:
        params: everything that defines the result (JSON-able): the run's ``params`` (a resume with other
            ``params`` is refused).
        owned: folders of ``--out`` (relative) whose entries count as finished work, like pieces (Bi-Induct's
            ``("runs",)``: its training runs).
        model: the results header's ``model`` for a study that loads none (Bi-Induct: the model it trains);
            None: the loaded model's identity.
    """
    params: dict
    owned: tuple[str, ...] = ()
    model: dict | None = None


@dataclass(frozen=True)
class Study(Generic[C, P, R]):
    """A study as the engine runs it: ``study.py`` ends with ``STUDY = Study(prepare, phases, result, write, ...)``.

    Attributes:
        prepare: ``(loaded, cfg) -> plan``: the model-dependent checks, nothing written (``loaded`` None for a
            study that loads no model); raises InductionLabError for what this model cannot run.
        phases: ``(plan, ctx) -> pieces``: the study's script on the engine's
            :class:`~inductionlab.studies.engine.Context` (each step checkpointed).
        result: ``(plan, pieces) -> result``: pure; the typed result (a
            :class:`~inductionlab.studies.engine.StudyResult`: ``record``, ``verdicts``).
        write: ``(out, result) -> None``: tables, figures and report.md (rank 0; results.json is the engine's).
        summary: ``result -> lines`` the command prints when done; None: the verdicts.
        estimate: ``cfg -> text`` of ``--estimate`` (the spec's ``estimate`` says the command has it); None: no
            estimate.
    """
    prepare: Callable[[Any, C], P]
    phases: Callable[[P, Any], Any]
    result: Callable[[P, Any], R]
    write: Callable[[Path, R], None]
    summary: Callable[[R], list[str]] | None = None
    estimate: Callable[[C], str] | None = None


@dataclass(frozen=True)
class StudySpec:
    """A study as the engine and the command line see it.

    Attributes:
        command: the command, words separated by spaces (``"analyze"``, ``"study temporal"``).
        config: the config dataclass (its leaves are the command's options).
        help: the command's ``--help`` text (first line: the summary in ``inductionlab --help``).
        study: where its :class:`Study` is, ``"module:NAME"``, imported on first use (:meth:`load`: the module
            loads torch); default: ``STUDY`` of the ``study`` module beside ``config``.
        model: how the command names the model: ``"option"`` (``--model``), ``"argument"`` (``MODEL`` or
            ``--model``), or None (the study loads no model: it trains its own).
        out: the default run directory, formatted with ``time``, ``model`` (the model's name) and ``cfg``.
        inputs: config leaves (dotted paths) that name paths the run reads: never under ``--out``.
        estimate: the study has ``estimate(cfg) -> str``: ``--estimate`` prints it and exits.
        reads_out: a ``bool`` config leaf (dotted path) that, set, makes the run take what ``--out`` already
            holds instead of making it (Bi-Induct's ``partial``: report the runs finished so far): the command
            refuses it beside ``--overwrite`` (which deletes ``--out`` first) and ``--estimate``.
    """
    command: str
    config: type
    help: str
    study: str | None = None
    model: str | None = "option"
    out: str = "runs/{kind}-{time}"
    inputs: tuple[str, ...] = ()
    estimate: bool = False
    reads_out: str | None = None

    @property
    def kind(self) -> str:
        """The run's kind: the command with hyphens (``"study-temporal"``), in the manifest and results.json."""
        return self.command.replace(" ", "-")

    def load(self) -> Study:
        """The :class:`Study` that :attr:`study` names (its module imported on first use: it loads torch).

        Raises:
            TypeError: the name holds no :class:`Study` (a bug in the study's folder)."""
        module, _, name = (self.study or self.config.__module__.rpartition(".")[0] + ".study:STUDY").partition(":")
        value = getattr(importlib.import_module(module), name or "STUDY", None)
        if not isinstance(value, Study):
            raise TypeError(f"{self.kind}: {module}:{name or 'STUDY'} is {type(value).__name__}, not a Study; end "
                            "the study's module with STUDY = Study(prepare, phases, result, write, ...)")
        return value


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


#: The release after which the deprecated keywords of 0.1 (the run keywords of ``analyze(...)``, the flat fields of
#: ``AnalyzeConfig(...)``) are removed: one minor version.
DEPRECATED_UNTIL = "0.2"


def run_options(opts: RunOptions | None, legacy: dict, where: str) -> RunOptions:
    """The :class:`RunOptions` of a study's public wrapper called the old way (before 0.1's engine), with the run's
    keywords (``analyze(lm, cfg, out, progress=False)``): each a :class:`RunOptions` field, taken with a
    ``DeprecationWarning`` until :data:`DEPRECATED_UNTIL`.

    Raises:
        TypeError: a keyword that is no RunOptions field (as Python's own for an unknown keyword), or ``opts`` and
            keywords both given."""
    if not legacy:
        return opts if opts is not None else RunOptions()
    import dataclasses
    import warnings

    known = {f.name for f in dataclasses.fields(RunOptions)}
    bad = sorted(set(legacy) - known)
    if bad:
        raise TypeError(f"{where}() got an unexpected keyword argument {bad[0]!r}")
    if opts is not None:
        raise TypeError(f"{where}(): pass the run's options either as opts=RunOptions(...) or as keywords, not both")
    given = ", ".join(f"{k}=..." for k in legacy)
    warnings.warn(f"{where}(..., {given}) is deprecated and will be removed in {DEPRECATED_UNTIL}: pass "
                  f"opts=RunOptions({given}) (from inductionlab.studies.spec import RunOptions)", DeprecationWarning,
                  stacklevel=3)
    return RunOptions(**legacy)


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


__all__ = ["StudySpec", "Study", "StudyPlan", "RunOptions", "specs", "lazy_exports"]
