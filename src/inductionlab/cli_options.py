"""Option groups shared by the sub-commands, declared once: the same name, type, default and
meaning in every command that takes them.

Each group is a decorator that adds its options to a click command, e.g.::

    @click.command()
    @model_options
    @run_dir_options("analyze")
    def analyze(model, dtype, device, out, overwrite, ...): ...
"""

from __future__ import annotations

from typing import Callable

import click

from .models import DEFAULT_MODEL


def _stack(*decorators: Callable) -> Callable:
    def apply(f):
        for d in reversed(decorators):
            f = d(f)
        return f
    return apply


model_options = _stack(
    click.option("--model", "-m", "model", default=DEFAULT_MODEL, show_default=True,
                 help="smollm2-135m, gemma3-270m, a local model directory, a .gguf file or a cached hub id."),
    click.option("--dtype", default="bfloat16", show_default=True,
                 type=click.Choice(["bfloat16", "float32", "float16"])),
    click.option("--device", default="cpu", show_default=True, help="cpu | cuda | cuda:N"),
)


def run_dir_options(kind: str, *, required: bool = False) -> Callable:
    """``--out/-o DIR`` and ``--overwrite``.

    ``--overwrite`` means the same in every command: delete what ``--out`` holds and start
    afresh. Without it a one-shot command refuses a non-empty ``--out`` and a resumable study
    resumes the run it holds."""
    default_help = "" if required else f" [default: runs/{kind}-<time>]"
    return _stack(
        click.option("--out", "-o", "out", required=required, default=None,
                     type=click.Path(file_okay=False), help=f"Run directory.{default_help}"),
        click.option("--overwrite", is_flag=True,
                     help="Delete an existing --out and start afresh (without it: refuse, or resume a study)."),
    )
