"""``inductionlab train`` and ``inductionlab telemetry``: thin click layers over
:mod:`inductionlab.train`.

Every :class:`~inductionlab.train.TrainConfig` leaf is also a flag (``seq_len`` -> ``--seq-len``,
``curriculum.span_length`` -> ``--span-length``; :mod:`inductionlab.cli.generate`); a flag overrides the
same key of ``--config FILE``. Under ``torchrun --nproc_per_node=N`` the same
command trains data-parallel (``--parallel ddp``) or sharded (``--parallel fsdp``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import click

from ..errors import InductionLabError
from ..protocols.configs import HeadTypeParams
from ..train.config import TrainConfig
from .generate import build_config, config_options, with_options as _with
from .options import FLOAT, refuse_conflicts, run_dir_options


@click.command("train", context_settings={"max_content_width": 120})
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
              help="YAML, JSON or TOML run config; flags override its keys.")
@click.option("--print-config", is_flag=True, help="Print the resolved config and budget, then exit.")
@run_dir_options("train")
@_with(config_options(TrainConfig))
def train_cmd(config_file, print_config, out, overwrite, **flags):
    """Pretrain a Llama-style model from scratch at matched compute (SPEC §7), with head telemetry.

    Resumes automatically when --out holds the same run (e.g. after a crash); refuses an --out
    that holds a different one. Every TrainConfig field is an option; options given override the
    keys of --config FILE. Guide: docs/train.md.
    """
    refuse_conflicts(("--overwrite", "--print-config", print_config and overwrite))
    from ..train import train
    from ..train.config import model_config
    from ..train.flops import budget
    from ..train.telemetry import format_emergence

    cfg = build_config(TrainConfig, flags, config_file)
    if out is not None:
        cfg.out = out
    elif not cfg.out:
        from ..runtime.runs import default_run_dir
        cfg.out = str(default_run_dir("train"))
    if print_config:
        d = cfg.to_dict()
        try:
            from ..data.shards import TokenShards
            vocab = TokenShards.open(cfg.data).vocab_size if cfg.data else None
        except InductionLabError:
            vocab = None
        if vocab and cfg.steps >= 1:
            d["budget"] = budget(model_config(cfg.preset, vocab, max_position_embeddings=cfg.seq_len),
                                 seq_len=cfg.seq_len, tokens_per_update=cfg.tokens_per_update,
                                 steps=cfg.steps).to_dict()
        click.echo(json.dumps(d, indent=2))
        return
    if config_file:                       # an input too: --out may not be, hold or lie inside it
        from ..runtime.outputs import check_output_dir
        check_output_dir(cfg.out, inputs=[config_file])
    res = train(cfg, overwrite=overwrite)
    r = res.record.get("results", {})
    b = res.record["budget"]
    loss = r.get("final_loss")
    loss = f"{loss:.4f}" if isinstance(loss, float) else "-"
    click.echo(f"run {res.run_dir}: {res.steps} steps, {res.tokens} tokens, "
               f"{b['n_params']:,} params ({b['n_params_non_embedding']:,} non-embedding), "
               f"{b['flops']:.3e} FLOPs; final loss {loss}, "
               f"{format_emergence(r.get('emergence_tokens'), r.get('emergence_step'), r.get('predicted_emergence'))} "
               f"(threshold {r.get('induction_threshold')})")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # The run is complete and the process group destroyed. Skip interpreter teardown: with
        # gloo, C++ static destructors can meet a still-joinable worker thread and abort
        # ("terminate called without an active exception"), turning a finished run into exit -6.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


@click.command("telemetry")
@click.argument("runs", nargs=-1, required=True, type=click.Path())
@run_dir_options("telemetry")
@click.option("--threshold", type=FLOAT, default=None,
              help="Induction-score threshold of the emergence step (default: the run's induction_threshold).")
@_with(config_options(HeadTypeParams))
def telemetry_cmd(runs, out, overwrite, threshold, **flags):
    """Plot head telemetry over training: score heat maps, max / top-2% mean / heads-above-threshold
    curves, held-out perplexity and the emergence step. Several RUNS must be matched-compute.

    With --head-types, also every head's induction, concept / token copying and CMR fit at every checkpoint,
    crossings of each type's threshold, CMR-like share per layer and induction concentration (OUT/head_types/).

    --out defaults to RUN/telemetry for one run (required for several). Guide: docs/train.md."""
    import math

    from ..runtime.outputs import check_output_dir
    from ..studies.plots import training_curves, training_heatmaps
    from ..runtime.runs import atomic_write_json, own_entries, staged_run_dir, versions
    from ..train.flops import check_iso_flops
    from ..runtime.run_dir import TrainRun
    from ..train.telemetry import DEFAULT_THRESHOLDS, format_emergence, read_telemetry, run_summary, summarize

    ht = build_config(HeadTypeParams, flags)
    ht.validate()
    if threshold is not None and not (math.isfinite(threshold) and 0 <= threshold <= 1):
        raise InductionLabError(f"--threshold must be an attention probability in [0, 1], got {threshold}")
    if len(runs) > 1 and out is None:
        raise InductionLabError("several runs need --out DIR for the comparison plots")
    if len({Path(r).name for r in runs}) != len(runs):
        raise InductionLabError("run directories must have distinct names")
    # the inputs are what is read of each run (RUN/telemetry, the default --out, is not one of them)
    out = check_output_dir(Path(out) if out else Path(runs[0]) / "telemetry",
                           inputs=[p for r in runs for p in (TrainRun(r).record_path, TrainRun(r).checkpoints_dir)])
    if own_entries(out) and not overwrite:
        raise InductionLabError(f"output directory {out} already exists and is not empty; pass a new --out "
                                "or --overwrite")
    opened = {Path(r).name: TrainRun.open(r) for r in runs}
    budgets = {name: run.budget for name, run in opened.items()}
    if len(runs) > 1:
        check_iso_flops(budgets)
    records = {name: run.record for name, run in opened.items()}
    if threshold is None:
        threshold = float(next(iter(records.values()))["config"].get("induction_threshold", 0.4))
    tables = {Path(r).name: read_telemetry(r) for r in runs}          # raises before anything is written
    thresholds = tuple(sorted(set(DEFAULT_THRESHOLDS) | {threshold}))
    summaries, evals, report = {}, {}, {}
    with staged_run_dir(out, overwrite=True) as stage:
        for name, (heads, ev) in tables.items():
            s = summarize(heads, thresholds)
            summaries[name], evals[name] = s, ev
            s.to_csv(stage / f"{name}_summary.csv", index=False)
            ev.to_csv(stage / f"{name}_eval.csv", index=False)
            training_heatmaps(heads, stage / f"{name}_heatmaps.png", f"{name}: head scores over training")
            cur = records[name]["config"].get("curriculum")
            bud = records[name].get("budget", {})
            report[name] = {**run_summary(heads, ev, threshold, summary=s, batch_sequences=bud.get("global_batch"),
                                          context=bud.get("seq_len")),
                            "curriculum": cur.get("variant") if isinstance(cur, dict) else cur}
        comparison = None
        if ht.enabled:
            swept = {}
            for name, r in zip(tables, runs):
                report[name]["head_types"], swept[name] = _head_types(r, name, ht, stage / "head_types")
            if len(swept) > 1:
                comparison = _compare_head_types(swept, {n: str(report[n]["curriculum"]) for n in swept}, ht,
                                                 stage / "head_types")
        training_curves(summaries, evals, {n: r["emergence_tokens"] for n, r in report.items()},
                        stage / "curves.png", threshold)
        atomic_write_json(stage / "telemetry.json", {"kind": "telemetry", "runs": [str(r) for r in runs],
                                                      "threshold": threshold, "budgets": budgets,
                                                      "results": report, "versions": versions(),
                                                      **({"head_types_comparison": comparison}
                                                         if comparison is not None else {})})
    for name, rep in report.items():
        ind = rep["final"]["induction"]
        ppl = rep["final_heldout_ppl"]
        ppl = f"{ppl:.1f}" if isinstance(ppl, float) else "-"
        em = format_emergence(rep["emergence_tokens"], rep["emergence_step"], rep.get("predicted_emergence"))
        click.echo(f"{name}: {em} (induction > {threshold:g}); "
                   f"final max induction {ind['max']:.3f} at L{ind['max_layer_head'][0]}H{ind['max_layer_head'][1]}, "
                   f"max anti-induction {rep['final']['anti_induction']['max']:.3f}, held-out ppl {ppl}")
    click.echo(f"wrote {out}")


def _head_types(run, name: str, params: HeadTypeParams, folder: Path) -> dict:
    """The head-type sweep of one run (:mod:`inductionlab.protocols.training_head_types`) written to ``folder``
    as ``<name>_scores.csv`` (tidy), ``_transitions.csv``, ``_cmr_share.csv``, ``_concentration.csv``, one
    ``_<score>.png`` per type and ``_head_types.json`` (parameters, notes, files); returns (that record, the tidy
    rows)."""
    from ..runtime.runs import atomic_write_json
    from ..protocols import training_head_types as T
    from ..studies.plots import head_type_plot

    folder.mkdir(parents=True, exist_ok=True)
    tidy, notes = T.sweep(run, params)
    thresholds = params.thresholds()
    tables = {"scores": tidy, "transitions": T.transition_table(tidy, thresholds),
              "cmr_share": T.cmr_share(tidy, params.cmr_threshold),
              "concentration": T.concentration(tidy, params.top_k)}
    files = []
    for key, df in tables.items():
        df.to_csv(folder / f"{name}_{key}.csv", index=False)
        files.append(f"{name}_{key}.csv")
    present = set(tidy["score"])
    for score, (thr, direction) in thresholds.items():
        if score in present:
            head_type_plot(tidy, score, thr, direction, folder / f"{name}_{score}.png",
                           f"{name}: {score} over training")
            files.append(f"{name}_{score}.png")
    skipped = {s: notes[min(notes)]["dual_route"] for s in T.ROUTE_NAMES if s not in present}
    rec = {"run": str(run), "params": params.to_dict(),
           "thresholds": {k: {"value": v, "crossed_when": f"score {d} value"} for k, (v, d) in thresholds.items()},
           "steps": sorted(int(s) for s in notes), "notes": {str(k): v for k, v in notes.items()},
           "not_computed": skipped, "files": files}
    atomic_write_json(folder / f"{name}_head_types.json", rec)
    return {k: rec[k] for k in ("params", "not_computed", "files")}, tidy


def _compare_head_types(swept: dict[str, pd.DataFrame], groups: dict[str, str], params: HeadTypeParams,
                        folder: Path) -> dict:
    """Several runs' head types side by side, grouped by curriculum variant
    (:func:`~inductionlab.protocols.training_head_types.compare_runs`): ``comparison.csv`` (per run, last
    checkpoint), ``comparison_by_group.csv`` (mean, min, max over a group's runs) and ``comparison.png`` (over
    checkpoints); returns the record for telemetry.json."""
    from ..protocols import training_head_types as T
    from ..studies.plots import head_type_comparison

    per_run, by_group = T.compare_runs({n: (groups[n], t) for n, t in swept.items()}, params.top_k,
                                       params.cmr_threshold, params.induction_threshold)
    per_run.to_csv(folder / "comparison.csv", index=False)
    by_group.to_csv(folder / "comparison_by_group.csv", index=False)
    head_type_comparison({n: (groups[n], T.concentration(t, 1), T.cmr_share(t, params.cmr_threshold))
                          for n, t in swept.items()}, folder / "comparison.png",
                         "Head types over training: " + " vs ".join(dict.fromkeys(groups.values())))
    return {"per_run": per_run.to_dict(orient="records"), "by_group": by_group.to_dict(orient="records"),
            "files": ["comparison.csv", "comparison_by_group.csv", "comparison.png"]}


COMMANDS = [train_cmd, telemetry_cmd]   # registered on `inductionlab` by cli/main._register
