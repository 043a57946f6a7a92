"""The ``inductionlab`` command line: a thin layer that parses options, calls the Python API
and writes run directories. User mistakes print one line and exit with status 2."""

from __future__ import annotations

import sys

import click

from .errors import InductionLabError


class _Group(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except InductionLabError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="inductionlab")
def main() -> None:
    """Study induction heads in Hugging Face causal language models."""
    import os

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()      # our own progress bars show the phases
    hf_logging.disable_progress_bar()


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise InductionLabError(f"expected a comma-separated list of integers, got {text!r}") from None


@main.command()
@click.option("--model", "-m", "model", default="smollm2-135m", show_default=True,
              help="smollm2-135m, gemma3-270m, a local model directory, a .gguf file or a cached hub id.")
@click.option("--dtype", default="bfloat16", show_default=True, type=click.Choice(["bfloat16", "float32", "float16"]))
@click.option("--device", default="cpu", show_default=True)
@click.option("--out", "-o", type=click.Path(file_okay=False), default=None, help="Run directory [default: runs/analyze-<time>].")
@click.option("--overwrite", is_flag=True, help="Replace an existing, non-empty --out.")
@click.option("--seed", default=0, show_default=True)
@click.option("--top", default=10, show_default=True, help="Induction heads listed in the headline.")
@click.option("--ks", default="5,10,20", show_default=True, help="Numbers of heads to ablate.")
@click.option("--n-draws", default=2, show_default=True, help="Random-head draws per k.")
@click.option("--exclude-top", "--exclude-top-n", type=int, default=None, help="Random heads come from outside the top N [default: min(300, heads/2)].")
@click.option("--method", default="zero", show_default=True, type=click.Choice(["zero", "mean", "sink"]))
@click.option("--n-permutations", "--permutations", default=64, show_default=True, help="Lag-probe trials per condition (seed protocol: 5000).")
@click.option("--batch-size", default=8, show_default=True, help="Lag-probe trials per forward pass.")
@click.option("--list-length", default=500, show_default=True)
@click.option("--cue-position", default=250, show_default=True)
@click.option("--separator", default=" ", help='Between words: " " (default: each word is its own leading-space token), ", " or "\\n".')
@click.option("--instruction", default="", help="Text after BOS, before the list.")
@click.option("--no-bos", is_flag=True, help="Do not prepend BOS.")
@click.option("--resample-words", is_flag=True, help="Draw a new word set per trial instead of permuting a fixed set.")
@click.option("--score-seq-len", default=50, show_default=True, help="T, tokens per copy for head scores.")
@click.option("--score-batch-size", default=16, show_default=True)
@click.option("--quiet", "--no-progress", is_flag=True, help="No progress bars.")
def analyze(model, dtype, device, out, overwrite, seed, top, ks, n_draws, exclude_top, method, n_permutations,
            batch_size, list_length, cue_position, separator, instruction, no_bos, resample_words, score_seq_len,
            score_batch_size, quiet):
    """The main job: score every head, list the top induction heads, and run the lag probe intact
    and with k induction heads vs k random heads ablated. Writes one run directory."""
    from pathlib import Path

    from .analyze import AnalyzeConfig, analyze as run, write_run
    from .lag_probe import LagProbeConfig
    from .runs import default_run_dir

    out = Path(out) if out else default_run_dir("analyze")
    if out.exists() and any(out.iterdir()) and not overwrite:  # fail before the slow part
        raise InductionLabError(f"output directory {out} already exists and is not empty; pass a new --out or --overwrite")
    separator = separator.replace("\\n", "\n")
    if quiet:  # also silences the GGUF de-quantisation bar, which ignores transformers' logging switch
        import os
        os.environ["TQDM_DISABLE"] = "1"
    lag = LagProbeConfig(list_length=list_length, cue_position=cue_position, n_permutations=n_permutations,
                         batch_size=batch_size, seed=seed, resample_words=resample_words, separator=separator,
                         instruction=instruction, bos=not no_bos, method=method)
    cfg = AnalyzeConfig(model=model, dtype=dtype, device=device, seed=seed, score_seq_len=score_seq_len,
                        score_batch_size=score_batch_size, top=top, ks=_ints(ks), n_draws=n_draws,
                        exclude_top_n=exclude_top, lag=lag)
    res = run(cfg, progress=not quiet)
    write_run(res, out, overwrite=overwrite)
    _print_headline(res, out)


def _print_headline(res, out) -> None:
    click.echo(f"\nTop {len(res.record['top_induction_heads'])} induction heads ({res.loaded.identity['name']}):")
    for i, h in enumerate(res.record["top_induction_heads"], 1):
        click.echo(f"  {i:2d}. L{h['layer']:<2d} H{h['head']:<2d}  {h['score']:.3f}")
    click.echo("\nLag probe, lag +1 probability [95% CI] per condition:")
    hl = res.lag.headline()
    for _, r in hl.iterrows():
        if r["kind"] == "random" and "mean" not in str(r["draw"]):
            continue
        click.echo(f"  {r['condition']:<14s} {r['lag_plus1']:.4f} [{r['lag_plus1_ci_low']:.4f}, "
                   f"{r['lag_plus1_ci_high']:.4f}]   lag -1 {r['lag_minus1']:.4f}   list mass {r['list_mass']:.3f}")
    t = res.timings
    click.echo(f"\nWall time {t['total_s']:.0f} s (load {t['load_s']:.0f}, scores {t['head_scores_s']:.0f}, "
               f"lag probe {t['lag_probe_s']:.0f}). Run directory: {out}")


# Sub-commands live next to the API they wrap and are registered here, explicitly (no import cycle:
# the sub-command modules never import this one).
def _register() -> None:
    from . import cli_data, cli_study, cli_train

    for module in (cli_data, cli_train, cli_study):
        for command in module.COMMANDS:
            main.add_command(command)


_register()
