"""``inductionlab lm-eval ...``: lm-evaluation-harness's own command line with the model type ``inductionlab``
registered (:mod:`inductionlab.protocols.lm_eval_model`; lm-eval discovers no model plugins by itself).

Every argument goes to lm-eval 0.4's CLI unchanged (``lm_eval._cli.harness.HarnessCLI``, which reads
``sys.argv``: its sub-commands ``run``, ``ls``, ``validate``, and ``run`` inserted when none is given, as
``lm-eval --model ...`` does)::

    inductionlab lm-eval run --model inductionlab \\
        --model_args pretrained=smollm2-135m,ablate=top-10:induction,method=mean --tasks hellaswag

An error of ours (a head out of range, a malformed ``ablate=``, a model argument the model type would ignore:
:func:`~inductionlab.protocols.lm_eval_model.check_model_args`) is one ``error:`` line and exit status 2, before the
model's first forward. So is one of lm-eval's own: its argument parser's (``argparse`` errors are raised instead of
printing its usage) and what it raises from its own code while setting the run up (``--tasks nosuch``: ValueError)
become ``error: lm-eval: <its message>``. With ``--model inductionlab``, ``--model_args`` text is checked before
lm-eval splits it: a piece with no ``=`` (a second head after a comma) is refused naming ``;`` / ``+``."""

from __future__ import annotations

import argparse
import sys
import traceback
from unittest import mock

import click

from ..errors import InductionLabError

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
    check_cut_model_args(args)
    argv = sys.argv
    sys.argv = ["lm-eval", *args]
    try:
        with mock.patch.object(argparse.ArgumentParser, "error", _parser_error):
            parser = HarnessCLI()
            parsed = parser.parse_args()
        parser.execute(parsed)
    except InductionLabError:
        raise
    except LM_EVAL_ERRORS as e:
        if not _raised_by_lm_eval(e):
            raise
        raise InductionLabError(f"lm-eval: {_first_line(e)}; see inductionlab lm-eval --help") from None
    finally:
        sys.argv = argv


#: What lm-eval raises for a user's mistake (``ValueError("Tasks not found: ...")``, ``TypeError`` of a keyword
#: given twice, ``FileNotFoundError`` of a config): one ``error:`` line when lm-eval's own code raised it.
LM_EVAL_ERRORS = (ValueError, TypeError, KeyError, AssertionError, FileNotFoundError, NotImplementedError)


def _parser_error(self, message):
    """``argparse.ArgumentParser.error`` while lm-eval parses: raise (one line) instead of usage + exit."""
    raise InductionLabError(f"lm-eval: {self.prog}: {message}; see inductionlab lm-eval --help")


def _raised_by_lm_eval(e: BaseException) -> bool:
    """Whether the innermost frame of ``e``'s traceback is lm-eval's own code (not ours, torch's, a bug)."""
    frames = traceback.extract_tb(e.__traceback__)
    return bool(frames) and "/lm_eval/" in frames[-1].filename.replace("\\", "/")


def _first_line(e: BaseException) -> str:
    text = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
    return next((line.strip() for line in text.splitlines() if line.strip()), type(e).__name__)


def check_cut_model_args(args) -> None:
    """With ``--model inductionlab``: every piece of ``--model_args`` / ``-a`` text (lm-eval's ``key=value,...``,
    several words allowed; a JSON object is left to lm-eval) has a ``=``: a second head after a comma
    (``ablate=L0H1,L0H2``) would be cut off as a key of its own.

    Raises:
        InductionLabError: the first piece without ``=``, saying to separate heads with ``;`` or ``+``."""
    from ..protocols.lm_eval_model import MODEL_NAME, SEPARATORS

    args = list(args)
    model = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--model"), None)
    model = model or next((a.split("=", 1)[1] for a in args if a.startswith("--model=")), None)
    if model != MODEL_NAME:
        return
    values, taking = [], False
    for a in args:
        if a in ("--model_args", "-a"):
            taking = True
            continue
        if a.startswith("--model_args="):
            values.append(a.split("=", 1)[1])
            continue
        if taking and a.startswith("-"):
            taking = False
        if taking:
            values.append(a)
    for v in values:
        if v.strip().startswith("{"):
            continue
        from lm_eval._cli.utils import split_top_level

        for piece in split_top_level(v):
            if "=" not in piece:
                raise InductionLabError(f"--model_args piece {piece!r} has no '=': lm-eval splits model_args at "
                                        f"commas, so a second head after a comma is cut off; separate heads with "
                                        f"{SEPARATORS} (ablate=L0H1;L0H2)")


COMMANDS = [lm_eval_cmd]
