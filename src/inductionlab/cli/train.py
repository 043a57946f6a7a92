"""``inductionlab train`` and ``inductionlab telemetry``: thin click layers over :mod:`inductionlab.train` and
the study :mod:`inductionlab.studies.telemetry` (whose runs are positional arguments: this command fronts its spec).

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
from ..studies.telemetry.config import SPEC as TELEMETRY, TelemetryConfig
from ..train.config import TrainConfig
from .generate import build_config, config_options, with_options as _with
from .options import refuse_conflicts, run_dir_options


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


@click.command("telemetry", help=TELEMETRY.help, context_settings={"max_content_width": 120})
@click.argument("runs", nargs=-1, required=True, type=click.Path())
@run_dir_options("RUN/telemetry for one run; required for several")
@_with(config_options(TelemetryConfig))
def telemetry_cmd(runs, out, overwrite, **flags):
    """The study ``telemetry`` (:mod:`inductionlab.studies.telemetry`) of RUNS: the one command it has (its
    runs are positional arguments, so this command fronts the spec instead of a generated one)."""
    from ..studies.spec import RunOptions
    from ..studies.telemetry.report import summary
    from ..studies.telemetry.study import run_telemetry

    cfg = dataclasses.replace(build_config(TelemetryConfig, flags), runs=tuple(runs))
    res = run_telemetry(cfg, out, RunOptions(overwrite=overwrite, log=click.echo))
    click.echo("\n".join(summary(res)))
    click.echo(f"wrote {out or Path(runs[0]) / 'telemetry'}")


COMMANDS = [train_cmd, telemetry_cmd]   # registered on `inductionlab` by cli/main._register
