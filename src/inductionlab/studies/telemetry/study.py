"""``inductionlab telemetry``: head telemetry over training of one or more runs, and with ``--head-types`` every
head's type at every checkpoint (issue 26; the measures: :mod:`inductionlab.protocols.training_head_types`).

Run by :func:`inductionlab.studies.engine.run_study` like every study; it loads no model from the command line:
the training runs are its inputs (read, never written).

1. ``prepare``: open every run (its record, budget and checkpoint telemetry tables, read before anything is
   written), check that several runs are matched-compute, resolve the emergence threshold; the run's ``params``
   name each run by its path and the SHA-256 of each checkpoint's ``meta.json``, so a run trained again or
   further is not mixed with pieces of the old one.
2. ``phases``: with ``head_types.enabled``, one piece ``head_types/<run>/<step>`` per complete checkpoint (the
   checkpoint loaded in float32 on the CPU, :func:`~inductionlab.protocols.training_head_types.checkpoint_scores`
   with random tokens from the run's training split, :func:`training_pool`): an interrupted sweep resumes at the
   first checkpoint without its piece.
3. ``result``: the telemetry summaries and emergence per run, the head-type tables (crossings, CMR-like share,
   concentration) and, for several runs, their comparison by curriculum variant; ``write``
   (:mod:`~inductionlab.studies.telemetry.report`): the tables, figures and report.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ...checks import check_type
from ...config import to_dict
from ...errors import InductionLabError
from ...protocols import training_head_types as T
from ...protocols.configs import HeadTypeParams
from ...runtime.run_dir import Checkpoint, TrainRun
from ..engine import Context, StudyResult, run_study
from ..run import StudyRun
from ..spec import RunOptions, Study, StudyPlan
from .config import SPEC, TelemetryConfig
from .report import summary, write

#: The head-type scores in the order of every table (those a checkpoint did not compute are left out).
SCORES = ("induction", *T.ROUTE_NAMES, *T.CMR_NAMES)
#: The notes a piece holds beside its score grids.
NOTES = ("dual_route", "pool")


@dataclass
class RunInput:
    """One training run as :func:`prepare` read it: its path, record, telemetry tables (:func:`~inductionlab.train.
    telemetry.read_telemetry`: ``heads`` tidy rows, ``evals`` held-out rows) and complete checkpoints."""
    path: Path
    record: dict
    heads: pd.DataFrame
    evals: pd.DataFrame
    checkpoints: list[Checkpoint]


@dataclass(kw_only=True)
class Plan(StudyPlan):
    """What :func:`prepare` settles: the config, the runs by name, the emergence threshold, the run's ``params`` and
    the results header's ``model`` (the runs' architecture, from the first run's record)."""
    cfg: TelemetryConfig
    runs: dict[str, RunInput]
    threshold: float


@dataclass
class HeadTypeSweep:
    """The head types of one run: ``tidy`` rows ``step, layer, head, score, value`` of every checkpoint, ``notes``
    ``{step: {"dual_route", "pool"}}``, its tables (``transitions``, ``cmr_share``, ``concentration``) and
    ``record`` (NAME_head_types.json)."""
    tidy: pd.DataFrame
    notes: dict[int, dict]
    tables: dict[str, pd.DataFrame]
    record: dict


@dataclass(kw_only=True)
class TelemetryResult(StudyResult):
    """``summaries`` / ``evals`` / ``heads``: per run, :func:`~inductionlab.train.telemetry.summarize`, held-out and
    head-score tables; ``head_types``: per run (empty without ``--head-types``); ``comparison``: (per run, by group)
    of :func:`~inductionlab.protocols.training_head_types.compare_runs` for several swept runs, else None."""
    config: TelemetryConfig
    threshold: float
    summaries: dict[str, pd.DataFrame]
    evals: dict[str, pd.DataFrame]
    heads: dict[str, pd.DataFrame]
    head_types: dict[str, HeadTypeSweep] = field(default_factory=dict)
    comparison: tuple[pd.DataFrame, pd.DataFrame] | None = None


def read_paths(cfg: TelemetryConfig) -> list[Path]:
    """What the study reads of each run, which ``--out`` may not be, hold or lie inside: its record and its
    checkpoints (``RUN/telemetry``, the default ``--out``, is neither)."""
    return [p for r in cfg.runs for p in (TrainRun(r).record_path, TrainRun(r).checkpoints_dir)]


def _fingerprint(c: Checkpoint) -> str | None:
    """SHA-256 of a checkpoint's ``meta.json`` (which holds its files' checksums); None without one."""
    from ...runtime.runs import sha256_file

    meta = c.path / "meta.json"
    return sha256_file(meta) if meta.is_file() else None


def prepare(loaded, cfg: TelemetryConfig) -> Plan:
    """Open and read every run; nothing is written.

    Raises:
        InductionLabError: a path that is not a training run or has no telemetry, a damaged record or checkpoint
            telemetry, runs that are not matched-compute, a sweep over a run without a complete checkpoint."""
    from ...train.flops import check_iso_flops
    from ...train.telemetry import read_telemetry

    opened = {n: TrainRun.open(r) for n, r in zip(cfg.names(), cfg.runs)}
    budgets = {n: run.budget for n, run in opened.items()}
    if len(opened) > 1:
        check_iso_flops(budgets)
    first = next(iter(opened.values())).record
    threshold = float(first["config"].get("induction_threshold", 0.4)) if cfg.threshold is None else cfg.threshold
    sweep = cfg.head_types.enabled
    runs = {}
    for n, run in opened.items():
        heads, evals = read_telemetry(run.path)
        ckpts = run.checkpoints() if sweep else []
        if sweep and not ckpts:
            raise InductionLabError(f"{run.path} has no complete checkpoint; pass a run written by `inductionlab "
                                    "train`, or drop --head-types")
        runs[n] = RunInput(run.path, run.record, heads, evals, ckpts)
    params = {"config": to_dict(cfg) | {"runs": [os.path.abspath(r) for r in cfg.runs]}, "threshold": threshold,
              "runs": {n: {"path": os.path.abspath(r.path), "checkpoints": {str(c.step): _fingerprint(c)
                                                                            for c in r.checkpoints}}
                       for n, r in runs.items()}}
    conf, bud = first["config"], first["budget"]
    model = {"name": conf.get("preset"), "source": "checkpoints of the training runs", "runs": list(runs),
             **{k: bud[k] for k in ("n_params", "n_params_non_embedding") if k in bud}}
    return Plan(cfg=cfg, runs=runs, threshold=threshold, params=params, model=model)


def phases(plan: Plan, ctx: Context) -> dict:
    """With ``--head-types``, one piece per (run, checkpoint); else nothing to compute (the tables are read)."""
    if not plan.cfg.head_types.enabled:
        return {"head_types": {}}
    return {"head_types": {n: _sweep(ctx, n, run, plan.cfg.head_types) for n, run in plan.runs.items()}}


def _sweep(ctx: Context, name: str, run: RunInput, params: HeadTypeParams) -> dict[int, dict]:
    """The pieces ``head_types/<name>/<step>`` of every complete checkpoint of ``run``, in step order."""
    probe = RunProbe(run.path, params)
    by_step = {str(c.step): c for c in run.checkpoints}
    got = ctx.pieces(f"head_types/{name}", by_step, lambda step, progress: probe.measure(by_step[step]),
                     desc=f"head types {name}", unit="checkpoint", timing="head_types")
    return {int(step): value for step, value in got.items()}


class RunProbe:
    """The head-type measures of one run's checkpoints: the random-token pool (its training split's ids) and the
    dual-route prompts are built once, at the first checkpoint measured (they depend on the tokenizer, the same
    in every checkpoint, and on the seed alone: a resumed sweep builds the same ones)."""

    def __init__(self, run_dir: Path, params: HeadTypeParams):
        self.run_dir, self.params = run_dir, params
        self.pool = self.source = self.prompts = None

    def measure(self, c: Checkpoint) -> dict[str, np.ndarray]:
        """The piece of checkpoint ``c``: every score grid ``[n_layers, n_heads]`` (float64) and the notes."""
        from ...core.models import load_model

        loaded = load_model(c.path, dtype="float32")
        if self.prompts is None:
            self.pool, self.source = training_pool(self.run_dir, loaded.tokenizer)
            self.prompts = T.route_prompts(loaded.tokenizer, loaded.model.config.vocab_size, self.params, self.pool)
        scores, notes = T.checkpoint_scores(loaded.model, loaded.tokenizer, self.params, self.prompts, self.pool)
        return {**{k: np.asarray(v, dtype=np.float64) for k, v in scores.items()},
                "dual_route": np.asarray(notes["dual_route"]), "pool": np.asarray(self.source)}


def training_pool(run_dir, tokenizer) -> tuple[np.ndarray | None, str]:
    """The ids a run's training split uses (:meth:`~inductionlab.data.shards.TokenShards.token_pool`, minus the
    tokenizer's special ids), read from the shards its record names, as the training telemetry draws its probe
    tokens (traps.md: drawing from the whole vocabulary understates a small model's scores 2–3×). Returns
    ``(pool | None, note)``: None, with the reason, when the record names no shards or they are not there (the
    scores then draw from the whole vocabulary)."""
    from ...data.shards import TokenShards

    data = (TrainRun(run_dir).record.get("config") or {}).get("data")
    if not data or not Path(data).is_dir():
        return None, f"vocabulary (the training shards {data!r} are not here)"
    special = [int(i) for i in getattr(tokenizer, "all_special_ids", [])]
    return TokenShards.open(data).token_pool(exclude_ids=special), f"training split ({data})"


def sweep_rows(pieces: dict[int, dict]) -> tuple[pd.DataFrame, dict[int, dict]]:
    """A run's pieces ``{step: arrays}`` as (tidy rows of every checkpoint by step, ``{step: notes}``)."""
    frames, notes = [], {}
    for step in sorted(pieces):
        p = pieces[step]
        frames.append(T.tidy(step, {s: p[s] for s in SCORES if s in p}))
        notes[step] = {k: str(p[k]) for k in NOTES}
    return pd.concat(frames, ignore_index=True), notes


def _head_types(name: str, run: RunInput, pieces: dict[int, dict], params: HeadTypeParams) -> HeadTypeSweep:
    """One run's head types: the tidy rows, the tables and the record (what NAME_head_types.json holds)."""
    tidy, notes = sweep_rows(pieces)
    thresholds = params.thresholds()
    tables = {"transitions": T.transition_table(tidy, thresholds), "cmr_share": T.cmr_share(tidy, params.cmr_threshold),
              "concentration": T.concentration(tidy, params.top_k)}
    present = set(tidy["score"])
    files = [f"{name}_{k}.csv" for k in ("scores", *tables)]
    files += [f"{name}_{score}.png" for score in thresholds if score in present]
    first = notes[min(notes)]["dual_route"]
    record = {"run": str(run.path), "params": params.to_dict(),
              "thresholds": {k: {"value": v, "crossed_when": f"score {d} value"} for k, (v, d) in thresholds.items()},
              "steps": sorted(notes), "notes": {str(k): v for k, v in notes.items()},
              "not_computed": {s: first for s in T.ROUTE_NAMES if s not in present}, "files": files}
    return HeadTypeSweep(tidy, notes, tables, record)


def result(plan: Plan, pieces: dict) -> TelemetryResult:
    """The summaries and emergence of every run, its head types where swept, their comparison for several runs."""
    from ...train.telemetry import DEFAULT_THRESHOLDS, run_summary, summarize

    cfg, threshold = plan.cfg, plan.threshold
    thresholds = tuple(sorted(set(DEFAULT_THRESHOLDS) | {threshold}))
    summaries, report, swept = {}, {}, {}
    for name, run in plan.runs.items():
        s = summaries[name] = summarize(run.heads, thresholds)
        cur, bud = run.record["config"].get("curriculum"), run.record.get("budget", {})
        report[name] = {**run_summary(run.heads, run.evals, threshold, summary=s,
                                      batch_sequences=bud.get("global_batch"), context=bud.get("seq_len")),
                        "curriculum": cur.get("variant") if isinstance(cur, dict) else cur}
        if name in pieces["head_types"]:
            swept[name] = _head_types(name, run, pieces["head_types"][name], cfg.head_types)
            report[name]["head_types"] = {k: swept[name].record[k] for k in ("params", "not_computed", "files")}
    record = {"runs": [str(r) for r in cfg.runs], "threshold": threshold,
              "budgets": {n: r.record["budget"] for n, r in plan.runs.items()}, "results": report}
    comparison = None
    if len(swept) > 1:
        ht = cfg.head_types
        comparison = T.compare_runs({n: (str(report[n]["curriculum"]), s.tidy) for n, s in swept.items()},
                                    ht.top_k, ht.cmr_threshold, ht.induction_threshold)
        record["head_types_comparison"] = {"per_run": comparison[0].to_dict(orient="records"),
                                           "by_group": comparison[1].to_dict(orient="records"),
                                           "files": ["comparison.csv", "comparison_by_group.csv", "comparison.png"]}
    return TelemetryResult(config=cfg, threshold=threshold, summaries=summaries,
                           evals={n: r.evals for n, r in plan.runs.items()},
                           heads={n: r.heads for n, r in plan.runs.items()}, head_types=swept,
                           comparison=comparison, record=record)


def run_telemetry(cfg: TelemetryConfig, out: str | Path | None = None, opts: RunOptions | None = None
                  ) -> TelemetryResult:
    """Run (or resume) the telemetry of ``cfg.runs`` into ``out``
    (:func:`~inductionlab.studies.engine.run_study` of :data:`~inductionlab.studies.telemetry.config.SPEC`).

    Args:
        out: the run directory; None: ``RUN/telemetry`` of the one run (several runs need one). It may not be,
            hold or lie inside what is read of a run (its run.json and checkpoints).

    Raises:
        InductionLabError: a bad config (:meth:`TelemetryConfig.validate`), several runs without ``out``, a bad
            ``out`` (a file, holding another run or something else, an input), what :func:`prepare` refuses — all
            before anything is written.
        TypeError: ``cfg`` not a TelemetryConfig (a dict included).
    """
    check_type(cfg, TelemetryConfig, "telemetry: cfg")
    cfg.validate()
    if out is None:
        if len(cfg.runs) > 1:
            raise InductionLabError("several runs need --out DIR for the comparison plots")
        out = SPEC.out.format(cfg=cfg)
    StudyRun.check_out(out, opts is not None and opts.overwrite, inputs=read_paths(cfg))
    return run_study(SPEC, None, cfg, out, opts)


STUDY: Study[TelemetryConfig, Plan, TelemetryResult] = Study(prepare, phases, result, write, summary)

__all__ = ["STUDY", "TelemetryResult", "HeadTypeSweep", "RunInput", "Plan", "SCORES", "prepare", "phases", "result",
           "read_paths", "training_pool", "RunProbe", "sweep_rows", "run_telemetry"]
