"""``inductionlab lm-eval ...``: lm-evaluation-harness's own command line with the model type ``inductionlab``
registered (:mod:`inductionlab.protocols.lm_eval_model`; lm-eval discovers no model plugins by itself).

Every argument goes to lm-eval 0.4's CLI unchanged (``lm_eval._cli.harness.HarnessCLI``, which reads
``sys.argv``: its sub-commands ``run``, ``ls``, ``validate``, and ``run`` inserted when none is given, as
``lm-eval --model ...`` does)::

    inductionlab lm-eval run --model inductionlab \\
        --model_args pretrained=smollm2-135m,ablate=top-10:induction,method=mean --tasks hellaswag

An error of ours (a head out of range, a malformed ``ablate=``) is one ``error:`` line and exit status 2,
before the model's first forward."""

from __future__ import annotations

import sys

import click

HELP = ("Run lm-evaluation-harness (its own options, passed through) with the model type `inductionlab` registered: "
        "--model inductionlab --model_args pretrained=MODEL,ablate=top-10:induction|random-10|L18H6;L17H3,"
        "method=zero|mean|sink,positions=all|last,seed=N,dtype=D runs every forward and generation of any task "
        "with those heads ablated. Guide: docs/evaluate.md.")


@click.command("lm-eval", help=HELP, add_help_option=False,
               context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def lm_eval_cmd(args) -> None:
    from ..protocols.lm_eval_tasks import _require_lm_eval

    _require_lm_eval()
    if not args or args[0] in ("-h", "--help"):
        click.echo(f"Usage: inductionlab lm-eval [LM-EVAL ARGUMENTS]...\n\n  {HELP}\n\nlm-eval's own help follows.\n")
        args = ("--help",)
    from lm_eval._cli.harness import HarnessCLI
    from lm_eval.utils import setup_logging

    from ..protocols import lm_eval_model  # noqa: F401  (registers the model type)

    setup_logging()
    argv = sys.argv
    sys.argv = ["lm-eval", *args]
    try:
        parser = HarnessCLI()
        parser.execute(parser.parse_args())
    finally:
        sys.argv = argv


COMMANDS = [lm_eval_cmd]
