"""``inductionlab study``: multi-protocol studies. ``study temporal`` runs the whole design of the
temporal-dependencies paper (lag probe + serial recall under every ablation condition, per-head
load-bearing map, verdicts) on one model; see :mod:`inductionlab.study_temporal`."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import click
import torch

from .errors import InductionLabError
from .models import DEFAULT_MODEL, load_model
from .runs import timestamp


def _int_list(ctx, param, value):
    if value is None:
        return None
    try:
        out = [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers, e.g. 10,20,50") from None
    if not out or min(out) < 1:
        raise click.BadParameter("give at least one k, each >= 1")
    return out


@click.group("study")
def study() -> None:
    """Multi-protocol studies that reproduce a paper's experimental design on one model."""


@study.command("temporal")
@click.option("--model", "-m", default=DEFAULT_MODEL, show_default=True,
              help="smollm2-135m | gemma3-270m | local dir | .gguf file | cached hub id")
@click.option("--out", "-o", type=click.Path(file_okay=False), default=None,
              help="run directory (default runs/study-temporal-<model>-<time>); an existing study with the same "
                   "options is resumed")
@click.option("--overwrite", is_flag=True, help="delete an existing --out first instead of resuming")
@click.option("--method", type=click.Choice(["zero", "mean", "sink"]), default="zero", show_default=True,
              help="ablation method")
@click.option("--ks", callback=_int_list, default=None,
              help="comma-separated k list (default: 10,20,50,100 clipped/scaled to the model's heads)")
@click.option("--n-draws", type=click.IntRange(1), default=3, show_default=True, help="random-head draws per k")
@click.option("--exclude-top-n", "--exclude-top", type=click.IntRange(0), default=None,
              help="random heads are drawn outside the top N by induction score (default min(300, heads // 2))")
@click.option("--permutations", "--n-permutations", type=click.IntRange(2), default=64, show_default=True,
              help="lag-probe trials per condition (seed protocol: 5000)")
@click.option("--list-length", type=click.IntRange(2), default=500, show_default=True)
@click.option("--cue-position", type=click.IntRange(1), default=250, show_default=True)
@click.option("--recall-trials", type=click.IntRange(2), default=64, show_default=True,
              help="serial-recall prompts per condition")
@click.option("--recall-list-length", type=click.IntRange(2), default=14, show_default=True)
@click.option("--shots", type=click.IntRange(0), default=3, show_default=True)
@click.option("--no-generate", is_flag=True, help="skip greedy generation (exact match, CRP of recalls)")
@click.option("--load-bearing-top", type=click.IntRange(0), default=10, show_default=True,
              help="per-head map over the top N induction heads (0 = off)")
@click.option("--load-bearing-permutations", type=click.IntRange(2), default=None,
              help="trials per single-head condition (default: --permutations)")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--device", default="cpu", show_default=True, help="cpu | cuda | cuda:N")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="bfloat16", show_default=True)
@click.option("--device-map", default=None, help='e.g. "auto" to spread a model over several GPUs')
@click.option("--batch-size", type=click.IntRange(1), default=None,
              help="trials per forward pass (default: from free GPU memory; 8 on CPU)")
@click.option("--threads", type=click.IntRange(1), default=None, help="torch CPU threads")
@click.option("--no-progress", "--quiet", is_flag=True, help="no progress bars")
def temporal(model, out, overwrite, method, ks, n_draws, exclude_top_n, permutations, list_length, cue_position,
             recall_trials, recall_list_length, shots, no_generate, load_bearing_top, load_bearing_permutations,
             seed, device, dtype, device_map, batch_size, threads, no_progress) -> None:
    """Lag probe + few-shot serial recall, intact and under top-k induction vs k random head ablation,
    per-head load-bearing map, and a report stating each claim of the temporal-dependencies paper."""
    from .study_temporal import TemporalStudyConfig, run_temporal_study

    if threads:
        torch.set_num_threads(threads)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InductionLabError("--device cuda requested but torch sees no CUDA device; use --device cpu")
    out = Path(out) if out else Path("runs") / f"study-temporal-{Path(model).stem}-{timestamp()}"
    if overwrite and out.exists():
        shutil.rmtree(out)
    t0 = time.perf_counter()
    loaded = load_model(model, dtype=dtype, device=device, device_map=device_map)
    load_s = time.perf_counter() - t0
    cfg = TemporalStudyConfig(method=method, ks=ks, n_draws=n_draws, exclude_top_n=exclude_top_n, seed=seed,
                              n_permutations=permutations, list_length=list_length, cue_position=cue_position,
                              recall_trials=recall_trials, recall_list_length=recall_list_length, n_shots=shots,
                              generate=not no_generate, load_bearing_top=load_bearing_top,
                              load_bearing_permutations=load_bearing_permutations, batch_size=batch_size)
    res = run_temporal_study(loaded, cfg, out, progress=not no_progress)
    click.echo(f"model loaded in {load_s:.1f} s; study {res.timings['total_s']:.1f} s")
    for v in res.verdicts:
        click.echo(f"({v['claim']}) {'reproduced' if v['reproduced'] else 'NOT reproduced'}: {v['text']} — {v['evidence']}")
    click.echo(f"report: {out / 'report.md'}")


COMMANDS = [study]   # registered on `inductionlab` by cli.py
