"""The one engine every study runs on: :func:`run_study`, and the :class:`Context` a study's phases work
through.

A study is one :class:`~inductionlab.studies.spec.Study` value (``STUDY`` at the end of its ``study.py``).
Its ``phases(plan, ctx)`` reads as the study's script; each call on ``ctx`` is one checkpointed step::

    def phases(plan, ctx):
        scores = ctx.head_scores(plan.cfg.scores, seed=plan.cfg.seed)          # piece "scores"
        conditions = ablation_conditions(scores["induction"], plan.ks, ...)
        runs = ctx.measure(Phase("lag", lag_probe.probe(plan.lag), conditions, plan.lag.n_permutations))
        fv = ctx.pieces("fv", tasks, score_task, desc="FV scores")             # pieces "fv/<task>"
        return {"scores": scores, "conditions": conditions, "lag": runs["lag"]}   # -> result(plan, pieces)

The engine owns everything around the science, once for every study:

1. the opening: the config's type and ``validate()``, the model's type, ``--out`` checked, the ranks'
   dtype agreed (torchrun), every weight finite (:mod:`~inductionlab.core.finite`), ``prepare(loaded, cfg)``
   (model-dependent checks: nothing is written before they pass; a
   :class:`~inductionlab.studies.spec.StudyPlan`), the run directory opened or resumed
   (:class:`~inductionlab.studies.run.StudyRun`: a run with other ``params`` is refused), the dtype line logged;
2. each step: timed (``timings["<name>_s"]``), checkpointed as a piece (a resumed run loads it), sharded
   over torchrun's ranks where it runs the model — :meth:`Context.head_scores`, :meth:`Context.measure`
   (probe phases over conditions: :class:`Phase`, one progress bar, a probe's trials and residual cache
   shared by its phases), :meth:`Context.pieces` (one piece per item under one bar and one timing),
   :meth:`Context.piece` / :meth:`Context.arrays` (one JSON / arrays computation); a forward pass whose logits
   hold a NaN or an inf stops the run with one line naming the module where they first appear;
3. the closing: ``result(plan, pieces)``, the **one results header** (:data:`HEADER`: kind, model, params,
   versions, distributed, resumed, timings; and ``warnings`` when a probe's or the head scores' sequences
   are longer than the model's sliding attention window) before the study's own record, ``write(out, result)``
   (rank 0), then results.json and timing.json (:meth:`~inductionlab.studies.run.StudyRun.finish`).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from ..checks import check_loaded, check_type
from ..errors import InductionLabError
from ..core.ablation import RANDOM_DRAWS, Condition
from ..core.finite import check_finite_weights, check_nonzero_weights, finite_outputs
from ..core.models import agree_dtype, announce_dtype, float32_model, params_identity, ran_identity
from ..core.placement import check_weights_present
from ..core.scores import HeadScores, compute_head_scores
from ..core.architecture import window_note
from ..core.support import check_supported
from ..protocols.runner import Probe, Trials, residual_cache
from ..runtime.distributed import Dist
from ..runtime.runs import ResumableRun, timed, versions
from .configs import HeadScoreConfig
from .run import StudyRun, Verdict
from .spec import RunOptions, StudyPlan, StudySpec

#: The keys every results.json opens with, in this order; the study's own record follows.
HEADER = ("kind", "model", "params", "versions", "distributed", "resumed", "timings")



def kept(run: ResumableRun, key: str, compute: Callable[[], Any], *, json: bool = False,
         check: Callable[[Any], Any] | None = None) -> Any:
    """The piece ``key`` of ``run`` (``.json`` with ``json``, else ``.npz``): loaded when finished, else
    ``compute()``d here and written, and returned as a reload returns it. The one place a piece is computed or
    loaded: the run directory only loads and stores (it never calls back up)."""
    found, value = run.load_json(key, check) if json else run.load_arrays(key, check)
    if found:
        return value
    value = compute()
    return run.save_json(key, value) if json else run.save_arrays(key, value)

@dataclass(kw_only=True)
class StudyResult:
    """What every study's result carries beside its own fields (a study's result dataclass extends it).

    Attributes:
        record: results.json: :data:`HEADER`, then the study's own entries (``result()`` fills those;
            the engine adds the header in front).
        timings: ``<part>_s`` -> wall seconds of this call (the same dict as ``record["timings"]``).
        verdicts: the claims decided on this run (empty for a study without claims); the engine adds them to
            the record as ``verdicts`` when the study's record has none, and the command prints them when the
            study has no ``summary``.
    """
    record: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    verdicts: list[Verdict] = field(default_factory=list)


class Context:
    """What a study's ``phases(plan, ctx)`` works through: the run directory's pieces, the model, the options,
    the progress bars and the timings. Every loop of a study, its bar, its timing and its checkpoints go through
    these methods; a study never reads the run directory itself.

    Args:
        run: the run directory (:class:`~inductionlab.studies.run.StudyRun`; the engine's, not the study's).
        loaded: the model (None for a study that loads none).
        opts: :class:`~inductionlab.studies.spec.RunOptions`.

    Attributes:
        loaded, opts: as given.
    """

    def __init__(self, run: StudyRun, loaded: Any, opts: RunOptions):
        self.run, self.loaded, self.opts = run, loaded, opts
        self._trials: dict[int, Trials] = {}       # a probe's trials, built once, shared by its phases
        self._caches: dict[int, Any] = {}          # a probe's residual cache (core.reuse)
        # every probe keyed above, held for the context's life: a freed probe's id() is reused by the next object
        # of its kind, which would be served the freed one's trials (a lag probe got the ICL windows once)
        self._held: dict[int, Probe] = {}
        self.warnings: list[str] = []            # results.json's "warnings": sequences longer than a sliding window

    def _window(self, tokens: int, what: str) -> None:
        """Record (and say once) that ``what``'s sequences outrun the model's sliding window
        (:func:`~inductionlab.core.support.window_note`)."""
        model = getattr(self.loaded, "model", None)
        note = window_note(model.config, tokens, what) if hasattr(model, "config") else None
        if note and note not in self.warnings:
            self.warnings.append(note)
            self.log(f"warning: {note}")

    def _hold(self, probe: Probe) -> int:
        """``id(probe)``, the key of its trials and residual cache, with ``probe`` held so that the id stays its own."""
        self._held[id(probe)] = probe
        return id(probe)

    @property
    def out(self) -> Path:
        """The run directory."""
        return self.run.out

    @property
    def dist(self) -> Dist | None:
        """The torchrun process group the work is sharded over (None: one process)."""
        return self.run.dist

    @property
    def is_main(self) -> bool:
        """Whether this process is rank 0 (the one that writes ``out``; True without torchrun)."""
        return self.run.is_main

    @property
    def bar(self) -> bool:
        """Whether this process shows progress bars (asked for, and rank 0)."""
        return self.opts.progress and self.run.is_main

    def log(self, line: str) -> None:
        """``line`` to the user (``RunOptions.log``, rank 0)."""
        if self.opts.log is not None and self.run.is_main:
            self.opts.log(line)

    def timed(self, name: str):
        """Context manager: the block's wall seconds added to the timing ``name`` (``timings["<name>_s"]``)."""
        return self.run.timed(name)

    def timing(self, name: str) -> float | None:
        """The wall seconds of ``name`` in this session so far (``timings["<name>_s"]``); None: never timed
        (0.0 for a phase loaded from its checkpoints)."""
        return self.run.timings.get(f"{name}_s")

    @contextlib.contextmanager
    def progress(self, total: int, desc: str, unit: str = "item", show: bool = True) -> Iterator[Callable[[int], None]]:
        """A progress bar of ``total`` units (shown where :attr:`bar` and ``show``): yields ``update(n)``, which
        advances it by ``n``."""
        with tqdm(total=total, desc=desc, unit=unit, disable=not (self.bar and show)) as bar:
            yield bar.update

    def trials(self, probe: Probe) -> Trials:
        """``probe``'s trials, built on first need (:meth:`Probe.build_trials`) and shared by every phase of it."""
        key = self._hold(probe)
        if key not in self._trials:
            self._trials[key] = probe.build_trials(self.loaded)
            self._window(int(self._trials[key].tensors["ids"].shape[-1]), f"the {probe.name} probe")
        return self._trials[key]

    def head_scores(self, cfg: HeadScoreConfig, seed: int, pool=None) -> HeadScores:
        """The head scores (SPEC §3) of ``cfg`` as the piece ``scores``: computed once, then loaded; sharded
        over the ranks; timed as ``head_scores``. Computed in float32 whatever dtype the model runs in
        (:func:`~inductionlab.core.models.float32_model`: the source loaded again in float32), so the heads a
        study ranks, excludes and draws around are the same in float32 and bfloat16. ``pool``: ids the random
        tokens are drawn from (None: the tokenizer's ordinary ids)."""
        run, model = self.run, self.loaded
        seqs = cfg.sequences(seed, pool)
        self._window(2 * cfg.seq_len + 1, "the head scores")     # [BOS] S S

        def compute():
            with self.progress(cfg.batch_size * cfg.n_batches, "head scores", "seq") as update, \
                    float32_model(model) as m32:             # the heads a study selects: the same in every dtype
                hs = compute_head_scores(m32, seqs, tokenizer=model.tokenizer, progress=update, dist=run.dist)
            return {"scores": hs.scores, "induction_loss": hs.induction_loss, "params": hs.params}
        def scores(raw) -> HeadScores:               # a piece of another shape raises here: recomputed
            table = {k: np.asarray(v, dtype=float) for k, v in raw["scores"].items()}
            shape = {v.shape for v in table.values()}
            if len(shape) != 1 or len(next(iter(shape))) != 2:
                raise ValueError(f"head score tables of shapes {sorted(shape)}, not one [layers, heads] shape")
            return HeadScores(table, raw["induction_loss"], dict(raw["params"]))

        with run.timed("head_scores"):
            raw = kept(self.run, "scores", compute, json=True, check=scores)
        return scores(raw)

    def measure(self, *phases: "Phase") -> dict[str, "PhaseRun"]:
        """Every phase's pieces ``<key>/<condition>`` (:func:`run_phases`). Returns phase key -> :class:`PhaseRun`."""
        return run_phases(self, phases)

    def piece(self, key: str, compute: Callable[[], Any], *, timing: str | None = None, save: bool = True) -> Any:
        """``compute()`` (JSON-able) as the piece ``key`` (``.json``): computed once, then loaded; ``save=False``:
        computed on every call, not checkpointed (a self-check). Timed as ``timing`` (default: the key with
        ``/`` as ``_``)."""
        with self.run.timed(timing or key.replace("/", "_")):
            return kept(self.run, key, compute, json=True) if save else compute()

    def arrays(self, key: str, compute: Callable[[], dict], *, timing: str | None = None) -> dict:
        """``compute()`` (a dict of numpy arrays) as the piece ``key`` (``.npz``): computed once, then loaded.
        Timed as ``timing`` (default: the key with ``/`` as ``_``)."""
        with self.run.timed(timing or key.replace("/", "_")):
            return kept(self.run, key, compute)

    def pieces(self, key: str, items: Iterable[str], compute: Callable[[str, Callable[[int], None]], Any], *,
               desc: str | None = None, unit: str = "item", timing: str | None = None,
               total: Callable[[str], int] | None = None, json: bool = False) -> dict[str, Any]:
        """One resumable piece per item, ``<key>/<item>``, under one progress bar and one timing: a finished
        item is loaded, the others computed, in order, each written as soon as it is done (an interrupted run
        resumes at the first unfinished item).

        Args:
            key: the pieces' folder (``"fv"`` -> ``fv/<item>.npz``).
            items: the item names, in order (task names, run names).
            compute: ``(item, progress) -> value``: a dict of numpy arrays (``.npz``), or with ``json`` a JSON-able
                value (``.json``); ``progress(n)`` advances the bar by ``n`` units.
            desc, unit: the bar's label and unit; ``desc`` None: no bar.
            timing: the name of the one timing of every item (default: ``key``), loads included.
            total: item -> its units on the bar (the bar's total is the sum over the unfinished items); None: one
                unit per item, advanced when it finishes (``progress`` then does nothing).
            json: the pieces are JSON (``.json``) rather than arrays.

        Returns:
            item -> its value (loaded or computed; a JSON piece as a reload returns it), in the order of ``items``.
        """
        run, items = self.run, list(items)
        ext = "json" if json else "npz"
        pending = [i for i in items if not run.done(f"{key}/{i}", ext)]
        size = (lambda i: 1) if total is None else total
        out: dict[str, Any] = {}
        with self.timed(timing or key), self.progress(sum(size(i) for i in pending), desc or "", unit,
                                                      show=desc is not None and bool(pending)) as update:
            for item in items:
                def make(item=item):
                    value = compute(item, update if total is not None else lambda n: None)
                    if total is None:
                        update(1)
                    return value
                out[item] = kept(self.run, f"{key}/{item}", make, json=json)
        return out


# ---- phases -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PhaseRun:
    """The value of a :class:`Phase`: ``arrays[condition name][measure]`` ``[n_trials, ...]`` and the
    word set of its trials."""
    arrays: dict[str, dict[str, np.ndarray]]
    words: list[str]


@dataclass(frozen=True, eq=False)
class Phase:
    """Step: one probe under a list of conditions, on the first ``n_trials`` trials; pieces
    ``<key>/<condition>`` (``.npz``), each computed once, then loaded. Its value is a :class:`PhaseRun`.

    :meth:`Context.measure` runs phases; several in one call share one progress bar, and a probe's trials.

    Attributes:
        key: the piece folder (``"lag"``); ``timing``: the name of its time (default: ``key``).
        probe: a :class:`~inductionlab.protocols.runner.Probe` (``lag_probe.probe(cfg)``).
        conditions: :class:`~inductionlab.core.ablation.Condition` list, run in order on the same trials.
        n_trials: trials used (the first ones); None: all."""
    key: str
    probe: Probe
    conditions: Sequence[Condition]
    n_trials: int | None = None
    timing: str | None = None



def run_phases(ctx: Context, phases: Sequence[Phase]) -> dict[str, PhaseRun]:
    """Every piece ``<phase.key>/<condition>`` of ``phases``, in order: loaded if finished, else
    :meth:`Probe.run <inductionlab.protocols.runner.Probe.run>` on the phase's first ``n_trials`` trials
    (sharded over the ranks; the bar shows on rank 0). A probe's trials are built once, on first need,
    and one residual cache serves all its phases (:mod:`inductionlab.core.reuse`).

    Returns:
        phase key -> :class:`PhaseRun`."""
    run, loaded = ctx.run, ctx.loaded
    todo = [(ph, c) for ph in phases for c in ph.conditions]
    pending = [(ph, c) for ph, c in todo if not run.done(f"{ph.key}/{c.name}")]
    caches = ctx._caches
    for probe in {id(ph.probe): ph.probe for ph in phases if ph.probe.reuse}.values():
        conds = [c for ph in phases if ph.probe is probe for c in ph.conditions]
        if ctx._hold(probe) not in caches:
            caches[id(probe)] = residual_cache(loaded.model, conds)
        elif caches[id(probe)] is not None:
            caches[id(probe)].add_levels(conds)
    arrays: dict[str, dict[str, dict]] = {ph.key: {} for ph in phases}
    words: dict[str, list[str]] = {}

    def trials(ph: Phase) -> Trials:
        tr = ctx.trials(ph.probe)
        return tr if ph.n_trials is None else tr.head(ph.n_trials)

    for ph in phases:                                  # a resumed phase's time is 0 s, not missing
        run.timings.setdefault(f"{ph.timing or ph.key}_s", 0.0)
    total = sum(len(trials(ph)) if ph.n_trials is None else ph.n_trials for ph, _ in pending)
    with tqdm(total=total, desc="conditions", unit="trial", disable=not (ctx.bar and pending)) as bar:
        progress = _Estimate(ctx, bar, total, ", ".join(dict.fromkeys(ph.probe.name for ph, _ in pending)))
        for ph, c in todo:
            key = f"{ph.key}/{c.name}"

            def compute():
                with timed(run.timings, ph.timing or ph.key):
                    bar.set_postfix_str(key)
                    tr = trials(ph)
                    progress.start()
                    out = ph.probe.run(loaded, [c], tr, progress=progress, dist=run.dist,
                                       reuse=caches.get(id(ph.probe)) or False)[c.name]
                return {**out, "words": np.asarray(tr.words)}

            got = dict(kept(ctx.run, key, compute, check=_phase_piece))
            words[ph.key] = [str(w) for w in got.pop("words")]
            arrays[ph.key][c.name] = got
    return {ph.key: PhaseRun(arrays[ph.key], words.get(ph.key, [])) for ph in phases}


class _Estimate:
    """The progress callback of :func:`run_phases`: advances the bar and, after the first batch of trials, logs
    the estimated time of all pending trials (the first batch's seconds per trial × trials; the first
    condition is usually the intact model, which runs every layer, so the estimate errs long)."""

    def __init__(self, ctx: Context, bar, total: int, name: str):
        self.ctx, self.bar, self.total, self.name = ctx, bar, total, name
        self.t0: float | None = None
        self.done = False

    def start(self) -> None:
        """Called before a condition's first batch: the clock of the first batch starts here."""
        if self.t0 is None:
            self.t0 = time.perf_counter()

    def __call__(self, n: int) -> None:
        self.bar.update(n)
        if not self.done and self.t0 is not None and n > 0:
            self.done = True
            s = time.perf_counter() - self.t0
            est = s / n * self.total
            self.ctx.log(f"{self.name}: first batch of {n} trials in {s:.1f} s; estimated {self.total} trials "
                         f"≈ {_duration(est)} (at most: later conditions skip the layers below their first ablated head)")


def _duration(s: float) -> str:
    """``s`` seconds as ``42 s`` or ``6.3 min`` or ``2.1 h``."""
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.1f} min" if s < 5400 else f"{s / 3600:.1f} h"


def _phase_piece(arrays: dict) -> None:
    """Raise unless ``arrays`` has the shape of a phase piece: a ``words`` column and one array per measure."""
    if "words" not in arrays or arrays["words"].ndim != 1 or len(arrays) < 2:
        raise ValueError("not a phase piece (it needs a 1-d 'words' array and the measures)")


# ---- the engine ---------------------------------------------------------------------------------

def _inputs(spec: StudySpec, loaded, cfg) -> list:
    """The paths the run reads (never under ``--out``): the model's, and the config's ``spec.inputs`` leaves."""
    from ..config import get

    found = [loaded.identity.get("path")] if loaded is not None else []
    return found + [get(cfg, tuple(p.split("."))) for p in spec.inputs]


def check_model_fit(cfg, loaded) -> None:
    """Call ``check_model_fit(loaded)`` of every node of the config tree ``cfg`` that has one (a nested config that
    needs the model to be checked: :meth:`~inductionlab.studies.configs.HeadScoreConfig.check_model_fit`), so a
    study's ``prepare`` need not repeat it and it runs before the run directory is opened.

    Raises:
        InductionLabError: what a node refuses for this model."""
    import dataclasses

    check = getattr(cfg, "check_model_fit", None)
    if callable(check):
        check(loaded)
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            check_model_fit(v, loaded)


def _check_reads_out(spec: StudySpec, cfg, out: Path) -> None:
    """A run told to take what ``out`` holds (the spec's ``reads_out`` leaf set: Bi-Induct's ``--partial``) needs a
    run there: refused before anything is written when ``out`` holds none.

    Raises:
        InductionLabError: the leaf set and no ``study.json`` in ``out``."""
    if spec.reads_out is None:
        return
    from ..config import flag_of, get

    path = tuple(spec.reads_out.split("."))
    if not get(cfg, path):
        return
    import dataclasses

    parent = get(cfg, path[:-1])
    flag = flag_of(next(f for f in dataclasses.fields(parent) if f.name == path[-1]))
    if not (out / "study.json").is_file():
        raise InductionLabError(f"{flag} takes the runs {out} already holds, but it holds no {spec.kind} run; start "
                                f"it without {flag}")


def run_study(spec: StudySpec, loaded, cfg, out: str | Path, opts: RunOptions | None = None):
    """Run (or resume) the study ``spec`` on ``loaded`` with ``cfg`` and write the run directory ``out``.

    Args:
        spec: the study (``studies/<name>/config.py``'s ``SPEC``; its :class:`~inductionlab.studies.spec.Study`
            is imported here).
        loaded: the model (:func:`inductionlab.core.models.load_model`); None for a study that loads none
            (``spec.model is None``: Bi-Induct trains its own).
        cfg: a ``spec.config`` (validated here, before anything else).
        out: the run directory; holding a run of the same kind with the same parameters and model, its
            finished pieces are loaded instead of computed again.
        opts: :class:`~inductionlab.studies.spec.RunOptions` (overwrite, progress, on_checkpoint, dist, log).

    Returns:
        the study's result (a :class:`StudyResult`), ``record`` = results.json. Under torchrun every rank
        returns the same result and rank 0 alone writes ``out``.

    Raises:
        TypeError: ``loaded`` not a loaded model, ``cfg`` not a ``spec.config`` (a dict included).
        InductionLabError: a bad config, a bad ``out`` (a file, holding another run, inside an input), what
            the study's ``prepare`` refuses for this model, an architecture the instrumentation would not
            measure exactly (:func:`~inductionlab.core.support.check_supported`) — all before anything is written.
        TypeError: (a bug in the study) ``spec`` names no Study, ``prepare`` returns no StudyPlan.
    """
    t0 = time.perf_counter()
    opts = RunOptions() if opts is None else opts
    study = spec.load()
    if spec.model is not None:
        check_loaded(loaded, spec.kind)
        check_weights_present(loaded.model)       # weights on the meta device, nothing to load them
    check_type(cfg, spec.config, f"{spec.kind}: cfg")
    cfg.validate()
    out = Path(out)
    inputs = _inputs(spec, loaded, cfg)
    StudyRun.check_out(out, opts.overwrite, inputs=inputs)
    _check_reads_out(spec, cfg, out)
    if loaded is not None:
        agree_dtype(loaded, opts.dist)               # torchrun: every rank in rank 0's dtype
        what = f"model {loaded.identity.get('spec') or loaded.identity.get('name')}"
        check_finite_weights(loaded.model, what)
        check_nonzero_weights(loaded.model, what)
        if isinstance(loaded.model, PreTrainedModel):
            check_supported(loaded.model)            # the architecture policy (once per model): one line
        check_model_fit(cfg, loaded)                 # every sub-config's own model check (the head scores' context)
    plan = study.prepare(loaded, cfg)                # model-dependent checks: nothing written yet
    check_type(plan, StudyPlan, f"{spec.kind}: the plan of prepare()")
    params = dict(plan.params) | {"random_draws": RANDOM_DRAWS}
    if loaded is not None:
        params["model"] = params_identity(ran_identity(loaded))   # a resume never mixes two models (nor dtypes)
    run = StudyRun(out, spec.kind, params, overwrite=opts.overwrite, on_checkpoint=opts.on_checkpoint,
                   inputs=inputs, dist=opts.dist, started=t0, owned=plan.owned)
    run.open()
    if loaded is not None:                           # the first line a user sees: the dtype and why
        announce_dtype(ran_identity(loaded), opts.log, run.is_main)
    if run.resumed and opts.log is not None and run.is_main:
        opts.log(f"resuming {out}: finished pieces are loaded, the rest computed")
    ctx = Context(run, loaded, opts)
    with finite_outputs(loaded.model) if loaded is not None else contextlib.nullcontext():
        pieces = study.phases(plan, ctx)             # a NaN logit: one line naming where it starts
    res = study.result(plan, pieces)
    if res.verdicts and "verdicts" not in res.record:
        res.record["verdicts"] = [v.to_dict() for v in res.verdicts]
    model = ran_identity(loaded) if loaded is not None else plan.model
    res.record = {"kind": spec.kind, "model": model, "params": run.params, "versions": versions(),
                  "distributed": (opts.dist or Dist()).record(), "resumed": run.resumed, "timings": run.timings,
                  **({"warnings": ctx.warnings} if ctx.warnings else {}), **res.record}
    res.timings = run.timings
    run.finish(res.record, lambda: study.write(out, res))
    return res


__all__ = ["HEADER", "StudyResult", "Context", "Phase", "PhaseRun", "run_phases", "run_study"]
