"""The ``inductionlab`` command line: a thin layer that parses options, calls the Python API
and writes run directories. User mistakes print one line and exit with status 2; so does an error
of the system (full disk, link loop, name too long: the path and the cause, :func:`~inductionlab.errors.os_error`)."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

import click

from ..errors import InductionLabError, os_error
from .options import (INT, ablation_options, accelerator_options, head_score_options, lag_probe_config,
                          join_processes, lag_probe_options, start_run, model_options, quiet_option, run_dir_options)


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a job scheduler, torchrun stopping its workers), raised where the process
    was, so every ``except BaseException`` / ``finally`` cleanup runs as for Ctrl-C: staging
    folders and temporary files are removed, finished pieces stay."""


def _raise_terminated(signum, frame):
    raise Terminated()


@contextlib.contextmanager
def _sigterm_raises():
    """Turn SIGTERM into :class:`Terminated` while a command runs (main thread only; the previous
    handler is restored afterwards, so an embedding program keeps its own)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _Group(click.Group):
    def invoke(self, ctx):
        try:
            with _sigterm_raises():
                return super().invoke(ctx)
        except InductionLabError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)
        except OSError as e:              # full disk, link loop, name too long, ...: one line, path + cause
            click.echo(f"error: {os_error(e)}", err=True)
            sys.exit(2)
        except Terminated:
            click.echo("terminated", err=True)
            sys.exit(128 + signal.SIGTERM)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="inductionlab")
def main() -> None:
    """Study induction heads in Hugging Face causal language models."""
    import os

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # our own progress bars show the phases; set through the environment so that --help and option
    # parsing never import transformers (read when it is first imported)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules:     # already imported (in-process callers): set it directly
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()


@main.command()
@model_options
@accelerator_options
@run_dir_options("analyze")
@quiet_option
@ablation_options(ks="5,10,20", n_draws=2)
@click.option("--top", type=INT, default=10, show_default=True, help="Induction heads listed in the headline.")
@head_score_options
@lag_probe_options
def analyze(**kw):
    """The main job: score every head, list the top induction heads, and run the lag probe intact
    and with k induction heads vs k random heads ablated. Writes one run directory (resumable:
    the same command continues an interrupted run). Under torchrun the trials are sharded over the
    processes (README: Several processes / GPUs)."""
    from pathlib import Path

    from ..studies.analyze import AnalyzeConfig, analyze as run
    from ..runtime.distributed import shutdown
    from ..runtime.runs import default_run_dir

    out = Path(kw.pop("out") or default_run_dir("analyze"))
    overwrite, quiet = kw.pop("overwrite"), kw.pop("quiet")
    cfg = AnalyzeConfig(lag=lag_probe_config(kw), seed=kw["seed"], method=kw["method"], ks=tuple(kw["ks"]),
                        n_draws=kw["n_draws"], exclude_top_n=kw["exclude_top_n"], top=kw["top"],
                        score_seq_len=kw["score_seq_len"], score_batch_size=kw["score_batch_size"])
    cfg.validate()                                     # fail before the slow part
    dist, out = join_processes(kw, out)
    loaded, load_s = start_run(kw, out, overwrite, quiet)
    res = run(loaded, cfg, out, overwrite=overwrite, progress=not quiet, dist=dist, log=click.echo)
    if dist.is_main:
        _print_headline(res, out, load_s)
    shutdown()


def _print_headline(res, out, load_s: float) -> None:
    click.echo(f"\nTop {len(res.record['top_induction_heads'])} induction heads ({res.loaded.identity['name']}):")
    for i, h in enumerate(res.record["top_induction_heads"], 1):
        click.echo(f"  {i:2d}. L{h['layer']:<2d} H{h['head']:<2d}  {h['score']:.3f}")
    click.echo("\nLag probe, lag +1 probability [95% CI] per condition:")
    from ..studies.report import pooled_headline_rows

    for r in pooled_headline_rows(res.lag.headline()):
        click.echo(f"  {r['condition']:<14s} {r['lag_plus1']:.4f} [{r['lag_plus1_ci_low']:.4f}, "
                   f"{r['lag_plus1_ci_high']:.4f}]   lag -1 {r['lag_minus1']:.4f}   list mass {r['list_mass']:.3f}")
    from ..measures import serial_position

    if serial_position.has_cues(res.lag):
        tf = serial_position.cue_tables(res.lag)["temporal_factor"]
        click.echo(f"\nAll cues (--cues {res.lag.config.cues}, {len(res.lag.cue_positions)} per list): temporal factor "
                   "[95% CI over lists] (0.5 = chance; serial_position.csv, report.md):")
        for r in pooled_headline_rows(tf):
            click.echo(f"  {r['condition']:<14s} {r['temporal_factor']:.3f} [{r['temporal_factor_ci_low']:.3f}, "
                       f"{r['temporal_factor_ci_high']:.3f}]")
    t = res.timings
    click.echo(f"\nWall time {load_s + t['total_s']:.0f} s (load {load_s:.0f}, scores {t['head_scores_s']:.0f}, "
               f"lag probe {t['lag_probe_s']:.0f}). Run directory: {out}")


# Sub-commands live next to the API they wrap and are registered here, explicitly (no import cycle:
# the sub-command modules never import this one).
def _register() -> None:
    from . import data as cli_data, evaluate as cli_evaluate, study as cli_study, train as cli_train

    for module in (cli_data, cli_train, cli_study, cli_evaluate):
        for command in module.COMMANDS:
            main.add_command(command)


_register()

