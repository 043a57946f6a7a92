"""Study bi-induct, phase 2 ``train``: one ``inductionlab train`` subprocess per (variant, seed)
(:func:`train_command`, :func:`train_runs`, ``jobs`` at a time), and the reader of a finished run
(:func:`run_piece`, through :class:`~inductionlab.runtime.run_dir.TrainRun`)."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from ...documents import read_json
from ...errors import InductionLabError
from ...runtime.run_dir import TrainRun
from ...runtime.runs import atomic_write_text
from .config import BiInductStudyConfig, train_config

# ---- phase 2: training (subprocesses) ----------------------------------------------------------------

def _die_with_parent() -> None:           # preexec_fn: a SIGKILLed study takes its trainers with it
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except OSError:
        pass


def _package_root() -> Path:
    """The folder holding the ``inductionlab`` package of this module (``src/`` of a checkout), first on the
    trainers' PYTHONPATH so that they run the study's own code; counted from the module's dotted name, so a
    move of this module keeps it right."""
    return Path(__file__).resolve().parents[len(__name__.split(".")) - 1]


def train_command(cfg: BiInductStudyConfig, config_file: Path) -> list[str]:
    """The command line of one training run: ``python -m inductionlab.cli train --config FILE``,
    or under ``torchrun --standalone --nproc_per_node=N`` when ``cfg.nproc > 1``."""
    if cfg.nproc > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={cfg.nproc}",
                "-m", "inductionlab.cli", "train", "--config", str(config_file)]
    return [sys.executable, "-m", "inductionlab.cli", "train", "--config", str(config_file)]


def _write_train_config(tc, path: Path) -> None:
    import yaml
    d = tc.to_dict()
    d["curriculum"] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in d["curriculum"].items()}
    atomic_write_text(path, yaml.safe_dump(d, sort_keys=True))


def run_finished(run_dir: Path) -> bool:
    return TrainRun(run_dir).is_complete


def train_runs(cfg: BiInductStudyConfig, out: Path, *, progress: bool = True,
               log: Callable[[str], None] = print) -> dict[str, float]:
    """Train every (variant, seed) run not finished yet, ``cfg.jobs`` at a time (``cfg.job_threads`` torch
    threads each). Returns run name ->
    wall seconds of this call's subprocess (0 for a run already finished).

    Raises: InductionLabError naming the failed run and its log file."""
    todo = [(n, v, s) for n, v, s in cfg.runs() if not run_finished(out / "runs" / n)]
    walls = {n: 0.0 for n, _, _ in cfg.runs()}
    env = {**os.environ, "OMP_NUM_THREADS": str(cfg.job_threads), "MKL_NUM_THREADS": str(cfg.job_threads),
           "PYTHONPATH": os.pathsep.join([str(_package_root()),
                                          *filter(None, [os.environ.get("PYTHONPATH")])])}
    running: dict[str, tuple[subprocess.Popen, float, Any]] = {}
    failed = []
    try:
        while todo or running:
            while todo and len(running) < cfg.jobs:
                name, v, s = todo.pop(0)
                rd = out / "runs" / name
                tc = train_config(cfg, v, s, str(rd))
                cfile = out / "runs" / f"{name}.yaml"
                _write_train_config(tc, cfile)
                logf = open(out / "runs" / f"{name}.log", "a")
                if progress:
                    log(f"train {name}: {tc.steps} updates x {tc.tokens_per_update} tokens")
                p = subprocess.Popen(train_command(cfg, cfile), stdout=logf, stderr=subprocess.STDOUT, env=env,
                                     preexec_fn=_die_with_parent if os.name == "posix" else None)
                running[name] = (p, time.perf_counter(), logf)
            time.sleep(0.2)
            for name in list(running):
                p, t0, logf = running[name]
                if p.poll() is None:
                    continue
                logf.close()
                del running[name]
                walls[name] = time.perf_counter() - t0
                if p.returncode != 0 or not run_finished(out / "runs" / name):
                    failed.append(name)
                elif progress:
                    log(f"done  {name}: {walls[name]:.0f} s")
            if failed:
                break
    finally:
        for name, (p, _, logf) in running.items():
            p.kill()
            p.wait()
            logf.close()
    if failed:
        tail = (out / "runs" / f"{failed[0]}.log").read_text().strip().splitlines()[-3:]
        raise InductionLabError(f"training run {failed[0]} failed (log: {out / 'runs' / failed[0]}.log): "
                                + " | ".join(tail))
    return walls


def run_piece(run_dir: Path) -> dict:
    """Summary of one finished run: its budget, results (run_summary) and telemetry summary rows."""
    from ...train.telemetry import read_telemetry, summarize

    rec = TrainRun.open(run_dir).record
    heads, evals = read_telemetry(run_dir)
    s = summarize(heads)
    s = s[s["score"].isin(["induction", "anti_induction", "copy_offset", "copy_offset_control"])]
    ev = evals.sort_values("step")
    return {"budget": rec["budget"], "results": rec["results"], "config": rec["config"],
            "train_time_s": rec["results"].get("train_time_s"),
            "summary": s[["step", "tokens", "score", "max", "top2pct_mean", "max_layer", "max_head"]]
            .to_dict(orient="list"),
            "evals": ev[["step", "tokens", "heldout_loss", "heldout_ppl"]].to_dict(orient="list"),
            "final_scores": _final_scores(run_dir)}


def _final_scores(run_dir: Path) -> dict:
    return read_json(TrainRun(run_dir).telemetry_files()[-1], "checkpoint telemetry")["scores"]


def train_and_check(ctx, cfg: BiInductStudyConfig, budgets: dict) -> tuple[list[tuple[str, str, int]], dict[str, float],
                                                                           list[str]]:
    """The study's training step: train every run not finished yet (:func:`train_runs`; with ``cfg.partial``,
    none: the finished ones are taken as they are), then check that every finished run was trained with the
    budget the study planned (``budgets``: run name -> budget; iso-FLOPs, :func:`~inductionlab.train.flops.check_iso_flops`).
    Timed as ``train``.

    Returns:
        ``(runs, walls, missing)``: the finished runs ``(name, variant, seed)``, run name -> wall seconds of
        this call's subprocess, the names of the runs not finished (``partial``).

    Raises:
        InductionLabError: a run that fails, no finished natural-only run (``partial``), a run trained with
            another budget."""
    from ...train.flops import check_iso_flops, read_budgets

    out = ctx.out
    (out / "runs").mkdir(parents=True, exist_ok=True)
    with ctx.timed("train"):
        if cfg.partial:
            walls = {}
            runs = [r for r in cfg.runs() if run_finished(out / "runs" / r[0])]
            if not any(v == "none" for _, v, _ in runs):
                raise InductionLabError(f"{out} holds no finished natural-only run yet; wait, or run without --partial")
        else:
            walls = train_runs(cfg, out, progress=ctx.opts.progress, log=ctx.log)
            runs = cfg.runs()
    actual = read_budgets([out / "runs" / n for n, _, _ in runs])
    check_iso_flops(actual)
    for n in actual:
        if actual[n] != budgets[n]:
            raise InductionLabError(f"run {n} was trained with budget {actual[n]} but the study planned {budgets[n]}; "
                                    "use a new --out")
    return runs, walls, [n for n, _, _ in cfg.runs() if n not in {r[0] for r in runs}]
