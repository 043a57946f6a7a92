"""``inductionlab view RUN_DIR``: a thin click layer over :func:`inductionlab.studies.view.write_view` (one
self-contained HTML page of a finished run; guide: docs/view.md)."""

from __future__ import annotations

import click

from ..errors import InductionLabError
from .options import refuse_conflicts


@click.command("view", context_settings={"max_content_width": 120})
@click.argument("run_dir", type=click.Path())
@click.option("--text", default=None, help="Also show every head's pattern on this text (needs the model; at most "
                                           "128 tokens, the model's BOS first).")
@click.option("--out", "-o", "out", default=None, type=click.Path(dir_okay=False),
              help="The HTML file. [default: RUN_DIR/view.html]")
@click.option("--model", "-m", "model", default=None,
              help="The run's model, where results.json's spec does not load it here (a moved directory). "
                   "[default: results.json's model spec]")
@click.option("--no-model", is_flag=True,
              help="Load no model: the patterns the run stored only (analyze: its top induction heads and one "
                   "random head on [BOS] S S).")
@click.option("--dtype", default=None, type=click.Choice(["auto", "bfloat16", "float32", "float16"]),
              help="The model's dtype. [default: the dtype the run ran in]")
@click.option("--device", default="cpu", show_default=True, help="cpu | cuda | cuda:N")
def view_cmd(run_dir, text, out, model, no_model, dtype, device):
    """Write one self-contained HTML page of a finished run (opens offline, no server): attention patterns with
    token hover, the head-score heat maps (click a head to show its pattern), the lag and serial-position curves.

    With the run's model (loaded from results.json's spec unless --no-model) every head's pattern on the
    [BOS] S S sequence is computed, and --text adds a text of yours; without it, the heads the run stored.
    Guide: docs/view.md.
    """
    refuse_conflicts(("--model", "--no-model", no_model and model is not None),
                     ("--text", "--no-model", no_model and text is not None),
                     ("--dtype", "--no-model", no_model and dtype is not None))
    from ..studies.view import check_out, read_run, run_model, write_view

    path = check_out(run_dir, out)                 # the page's path and a finished run, before any model loads
    view = read_run(run_dir)
    loaded = None
    if not no_model:
        spec = run_model(view)
        if model is None and spec is None:
            if text is not None:
                raise InductionLabError("results.json names no model to load for --text; pass --model with the "
                                        "run's model")
            click.echo("results.json names no model spec: the page shows the patterns the run stored (pass --model "
                       "for every head)")
        else:
            from ..core.models import check_device, load_model

            check_device(device)
            loaded = load_model(model or spec[0], dtype=dtype or (spec[1] if spec else "auto"), device=device)
    written = write_view(run_dir, path, loaded=loaded, text=text)
    click.echo(f"wrote {written} ({written.stat().st_size / 1e6:.1f} MB)")


COMMANDS = [view_cmd]   # registered on `inductionlab` by cli/main._register
