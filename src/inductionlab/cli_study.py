"""``inductionlab study``: multi-protocol studies. ``study temporal`` runs the whole design of the
temporal-dependencies paper (lag probe + serial recall under every ablation condition, per-head
load-bearing map, verdicts) on one model; see :mod:`inductionlab.study_temporal`."""

from __future__ import annotations

import time
from pathlib import Path

import click

from .cli_options import (ablation_options, accelerator_options, head_score_options, lag_probe_config,
                          lag_probe_options, load_from_options, model_options, quiet_option, recall_config,
                          recall_options, run_dir_options)
from .runs import timestamp


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
@click.option("--load-bearing-top", type=int, default=10, show_default=True,
              help="Per-head map over the top N induction heads (0 = off).")
@click.option("--load-bearing-permutations", type=int, default=None,
              help="Trials per single-head condition [default: --n-permutations].")
def temporal(**kw) -> None:
    """Lag probe + few-shot serial recall, intact and under top-k induction vs k random head ablation,
    per-head load-bearing map, and a report stating each claim of the temporal-dependencies paper.
    An existing study with the same options in --out is resumed."""
    from .runs import ResumableRun
    from .study_temporal import TemporalStudyConfig, run_temporal_study

    out = Path(kw.pop("out") or Path("runs") / f"study-temporal-{Path(kw['model']).stem}-{timestamp()}")
    overwrite, quiet = kw.pop("overwrite"), kw.pop("quiet")
    cfg = TemporalStudyConfig(lag=lag_probe_config(kw), recall=recall_config(kw), method=kw["method"], ks=kw["ks"],
                              n_draws=kw["n_draws"], exclude_top_n=kw["exclude_top_n"], seed=kw["seed"],
                              load_bearing_top=kw["load_bearing_top"],
                              load_bearing_permutations=kw["load_bearing_permutations"],
                              score_seq_len=kw["score_seq_len"], score_batch_size=kw["score_batch_size"])
    cfg.validate()                                     # fail before the slow part
    ResumableRun.check_out(out, overwrite, inputs=[kw["model"]])
    t0 = time.perf_counter()
    loaded = load_from_options(kw)
    load_s = time.perf_counter() - t0
    res = run_temporal_study(loaded, cfg, out, progress=not quiet, overwrite=overwrite)
    click.echo(f"model loaded in {load_s:.1f} s; study {res.timings['total_s']:.1f} s")
    for v in res.verdicts:
        click.echo(f"({v['claim']}) {'reproduced' if v['reproduced'] else 'NOT reproduced'}: {v['text']} — {v['evidence']}")
    click.echo(f"report: {out / 'report.md'}")


COMMANDS = [study]   # registered on `inductionlab` by cli.py
