"""The main job: find induction heads and run the lag probe with ablations (``inductionlab analyze``).

Phases: self-check the instrumentation → score every head (SPEC §3) → lag probe intact, with
the top-k induction heads ablated and with k random heads ablated (outside the top N, several
seeded draws) for each k (SPEC §4) → tables, plots, report. A study in the shape of
:mod:`inductionlab.studies.pieces`: the head scores and each condition's lag probe are pieces of a
:class:`~inductionlab.runtime.runs.ResumableRun`, so an interrupted run continues where it stopped.

This module holds the phases, :class:`AnalyzeResult` and :func:`analyze`; it imports the config from
:mod:`inductionlab.studies.analyze.config` and the run directory's files from
:mod:`inductionlab.studies.analyze.report`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from ...protocols import lag_probe

from . import report

from ...core.ablation import ablation_conditions, default_exclude_top_n, top_k_heads
from ...core.instrument import self_check
from ...core.models import LoadedModel, agree_dtype, announce_dtype, params_identity, ran_identity
from ...core.scores import HeadScores
from ...errors import InductionLabError
from ...measures import serial_position
from ...protocols.lag_probe import LagProbeResult
from ...runtime.distributed import Dist
from ...runtime.runs import atomic_write_text, versions
from ..pieces import Phase, check_call, check_ks, check_trial_ids, head_scores_piece, run_phases
from ..run import StudyRun
from .config import AnalyzeConfig

PHASES = (Phase("lag", "lag", "ablation"),)
PROTOCOLS = {"lag": lag_probe}


@dataclass
class AnalyzeResult:
    loaded: LoadedModel
    scores: HeadScores
    lag: LagProbeResult
    timings: dict
    record: dict


def analyze(loaded: LoadedModel, cfg: AnalyzeConfig, out: str | Path, *, overwrite: bool = False,
            progress: bool = True, on_checkpoint=None, dist=None, log=None) -> AnalyzeResult:
    """Run (or resume) the main job and write the run directory ``out``.

    With ``dist`` (a :class:`~inductionlab.runtime.distributed.Dist` of several processes, every rank
    calling with the same arguments) the head scores and the lag probe are sharded by batch over
    the ranks; every rank returns the same result and rank 0 alone writes ``out``. ``log`` (e.g.
    ``click.echo``) gets the line saying which dtype runs and why, once the checks have passed.

    Raises:
        InductionLabError: bad config (:meth:`AnalyzeConfig.validate`), k larger than the heads
            available (or than those left outside the top N), word pool smaller than the list,
            list longer than the context, ``out`` holding another run (other options, or another model:
            path, weight hashes, dtype that runs, architecture).
        TypeError: ``loaded`` not a LoadedModel, ``cfg`` not an AnalyzeConfig (a dict included).
    """
    t0 = time.perf_counter()
    check_call(loaded, cfg, AnalyzeConfig, "analyze")
    out = Path(out)
    agree_dtype(loaded, dist)             # torchrun: every rank in rank 0's dtype
    ident = ran_identity(loaded)          # the dtype / device that run, not those asked for at load
    n_total = ident["n_layers"] * ident["n_heads"]
    N = default_exclude_top_n(n_total) if cfg.exclude_top_n is None else cfg.exclude_top_n
    for k in cfg.ks:
        if k > n_total:
            raise InductionLabError(f"k={k} heads requested but the model has {n_total}; use k <= {n_total}")
    check_ks(cfg.ks, n_total, N)
    if cfg.top > n_total:
        raise InductionLabError(f"--top {cfg.top} exceeds the model's {n_total} heads")
    lag_cfg = cfg.protocol()
    check_trial_ids(lag_probe.build_trials(loaded, replace(lag_cfg, n_permutations=2)), loaded,   # pool, context,
                    "lag probe")                                                             # ids: before any file
    lag_probe.check_cues(loaded, lag_cfg)
    params = {**asdict(cfg), "exclude_top_n": N, "lag": asdict(lag_cfg)}
    params["model"] = params_identity(ident)          # a resume never mixes two models (nor two dtypes)
    run = StudyRun(out, "analyze", params, overwrite=overwrite, on_checkpoint=on_checkpoint,
                   inputs=[ident.get("path")], dist=dist, started=t0)
    run.open()
    announce_dtype(ident, log, run.is_main)

    with run.timed("self_check"):
        device = next(loaded.model.parameters()).device
        gen = torch.Generator().manual_seed(cfg.seed)
        V = ident["vocab_size"]
        check_ids = torch.randint(min(100, V // 2), min(V, 1000), (1, 16), generator=gen).to(device)
        check = self_check(loaded.model, check_ids, atol=1e-2 if ident.get("dtype") != "float32" else 1e-4)

    with run.timed("head_scores"):
        hs = head_scores_piece(run, loaded, seq_len=cfg.score_seq_len, batch_size=cfg.score_batch_size,
                               n_batches=cfg.score_batches, seed=cfg.seed, progress=progress)

    conditions = ablation_conditions(hs["induction"], cfg.ks, n_draws=cfg.n_draws, exclude_top_n=N, seed=cfg.seed)
    with run.timed("lag_probe"):
        parts, words = run_phases(run, loaded, PHASES, PROTOCOLS, {"lag": lag_cfg}, {"ablation": conditions},
                                  {"lag": lag_cfg.n_permutations}, progress=progress)
        lag = LagProbeResult.from_parts(parts["lag"], conditions, lag_cfg, words["lag"])

    top = top_k_heads(hs["induction"], cfg.top)
    record = {
        "model": ident,
        "params": params,
        "versions": versions(),
        "self_check": check,
        "heads": {**{k: v.tolist() for k, v in hs.scores.items()}, "induction_loss": hs.induction_loss,
                  "score_params": hs.params},
        "top_induction_heads": [{"layer": l, "head": h, "score": float(hs["induction"][l, h])} for l, h in top],
        "lag_probe": lag.to_json(),
        **({"lag_cues": serial_position.cue_json(lag)} if serial_position.has_cues(lag) else {}),
        "distributed": (dist or Dist()).record(),
        "timings": run.timings,
    }
    res = AnalyzeResult(loaded, hs, lag, run.timings, record)

    def write():
        report.write_analyze_outputs(out, res)
        atomic_write_text(out / "report.md", report.analyze_report(res))
    run.finish(record, write)             # rank 0: the files above, then results.json, timing.json
    return res
