"""``inductionlab study``: multi-protocol studies. ``study temporal`` runs the whole design of the
temporal-dependencies paper (lag probe + serial recall under every ablation condition, per-head
load-bearing map, verdicts) on one model; see :mod:`inductionlab.studies.temporal`."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import InductionLabError
from ..runtime.runs import timestamp
from ..studies.run import format_verdicts
from .options import (FLOAT, INT, ablation_options, refuse_conflicts, accelerator_options, head_score_options, join_processes, lag_probe_config,
                          lag_probe_options, start_run, model_options, quiet_option, recall_config,
                          recall_options, run_dir_options)


@click.group("study")
def study() -> None:
    """Multi-protocol studies that reproduce a paper's experimental design on one model."""


@study.command("temporal")
@model_options
@accelerator_options
@run_dir_options("study-temporal-<model>")
@quiet_option
@ablation_options(ks=None, n_draws=3)
@head_score_options
@lag_probe_options
@recall_options
@click.option("--load-bearing-top", type=INT, default=10, show_default=True,
              help="Per-head map over the top N induction heads (0 = off).")
@click.option("--load-bearing-permutations", type=INT, default=None,
              help="Trials per single-head condition [default: --n-permutations].")
def temporal(**kw) -> None:
    """Lag probe + few-shot serial recall, intact and under top-k induction vs k random head ablation,
    per-head load-bearing map, and a report stating each claim of the temporal-dependencies paper.
    An existing study with the same options in --out is resumed."""
    from ..runtime.distributed import shutdown
    from ..studies.temporal import TemporalStudyConfig, run_temporal_study

    out = Path(kw.pop("out") or Path("runs") / f"study-temporal-{Path(kw['model']).stem}-{timestamp()}")
    overwrite, quiet = kw.pop("overwrite"), kw.pop("quiet")
    cfg = TemporalStudyConfig(lag=lag_probe_config(kw), recall=recall_config(kw), method=kw["method"], ks=kw["ks"],
                              n_draws=kw["n_draws"], exclude_top_n=kw["exclude_top_n"], seed=kw["seed"],
                              load_bearing_top=kw["load_bearing_top"],
                              load_bearing_permutations=kw["load_bearing_permutations"],
                              score_seq_len=kw["score_seq_len"], score_batch_size=kw["score_batch_size"])
    cfg.validate()                                     # fail before the slow part
    dist, out = join_processes(kw, out)
    loaded, load_s = start_run(kw, out, overwrite, quiet)
    res = run_temporal_study(loaded, cfg, out, progress=not quiet, overwrite=overwrite, dist=dist, log=click.echo)
    shutdown()
    if not dist.is_main:
        return
    click.echo(f"model loaded in {load_s:.1f} s; study {res.timings['total_s']:.1f} s")
    click.echo("\n".join(format_verdicts(res.verdicts)))
    click.echo(f"report: {out / 'report.md'}")


@study.command("bi-induct")
@click.option("--preset", type=click.Choice(["cpu-control", "cpu-natural", "tiny", "0.13b"]), default="cpu-control",
              show_default=True,
              help="Study recipe: cpu-control (the CPU positive control, ~5 min per run on one thread), tiny (CI), "
                   "0.13b (paper size, GPUs).")
@click.option("--shards", type=click.Path(file_okay=False), default=None,
              help="Prepared corpus (`inductionlab corpus prepare`) [default: data/demo-512 for cpu-control, data/synth90 for cpu-natural].")
@click.option("--budget", type=FLOAT, default=None,
              help="Training tokens per run (rounded down to whole updates) [default: the preset's].")
@click.option("--seeds", type=INT, default=None, help="Seeds per variant [default: the preset's].")
@click.option("--jobs", type=INT, default=1, show_default=True,
              help="Training runs at a time (subprocesses with one torch thread each).")
@click.option("--nproc", type=INT, default=1, show_default=True,
              help="Processes per run: > 1 runs each training under torchrun --nproc_per_node=N (GPUs).")
@click.option("--variants", default=",".join(("none", "induction", "anti", "balanced")), show_default=True,
              help="Comma-separated curriculum variants (none is the baseline and required).")
@click.option("--no-evaluate", is_flag=True, help="Train and aggregate telemetry only.")
@click.option("--partial", is_flag=True,
              help="Train nothing: aggregate, evaluate and report the runs finished so far (missing runs listed).")
@click.option("--estimate", is_flag=True, help="Print the budget and the expected GPU hours, then exit.")
@run_dir_options("study-bi-induct-<preset>")
@quiet_option
def bi_induct(preset, shards, budget, seeds, jobs, nproc, variants, no_evaluate, partial, estimate, out, overwrite,
              quiet):
    """Bi-Induct at matched compute: train none / induction / anti / balanced at identical tokens,
    steps and FLOPs (seeds each), aggregate telemetry, evaluate every final checkpoint (probes,
    ICL score, perplexity, top-2% vs random ablation) and decide each claim of the paper by rules
    stated before the data. Each run is resumable; an existing study with the same options in
    --out is resumed (finished runs reused)."""
    from ..studies.bi_induct import BiInductStudyConfig, gpu_estimate, run_bi_induct_study

    refuse_conflicts(("--partial", "--estimate", estimate and partial), ("--overwrite", "--estimate", estimate and overwrite))
    if partial and overwrite:
        raise InductionLabError("--partial and --overwrite conflict: --partial reports the runs finished in --out, "
                                "--overwrite deletes them first; drop one of them")
    if shards is None:
        shards = {"cpu-control": "data/demo-512", "cpu-natural": "data/synth90"}.get(preset, "")
    cfg = BiInductStudyConfig(preset=preset, shards=shards, budget=None if budget is None else int(budget),
                              seeds=seeds, jobs=jobs, nproc=nproc,
                              variants=tuple(v.strip() for v in variants.split(",") if v.strip()),
                              evaluate=not no_evaluate)
    cfg.validate()
    if estimate:
        e = gpu_estimate(cfg)
        click.echo(f"{e['runs']} runs x {e['tokens_per_run']:,} tokens, {e['flops_per_run']:.3e} FLOPs per run; "
                   f"~{e['gpu_hours_per_run']:.2f} GPU-hours per run, ~{e['gpu_hours_total']:.1f} in all "
                   f"(at {e['assumed_flops_per_s'] / 1e12:.0f} TFLOP/s, {e['assumed_mfu']:.0%} MFU)")
        return
    out = Path(out or Path("runs") / f"study-bi-induct-{preset}-{timestamp()}")
    res = run_bi_induct_study(cfg, out, overwrite=overwrite, progress=not quiet, partial=partial, log=click.echo)
    click.echo(f"study {res.timings['total_s']:.0f} s (training {res.timings.get('train_s', 0):.0f} s)")
    click.echo("\n".join(format_verdicts(res.verdicts)))
    click.echo(f"report: {out / 'report.md'}")


COMMANDS = [study]   # registered on `inductionlab` by cli/main._register
