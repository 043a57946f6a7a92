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
        except click.UsageError as e:     # a sub-command's option click refused (a choice, a type): one line too
            where = e.ctx.command_path if e.ctx is not None else "inductionlab"
            click.echo(f"error: {e.format_message()} (see: {where} --help)", err=True)
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


# Sub-commands: the hand-written families (corpus, curriculum, train, telemetry) live next to the API they
# wrap; every study's command is generated from its spec (studies/<name>/config.py), so a new study folder
# is a new command with no code here. Registered explicitly (no import cycle: those modules never import this one).
def _register() -> None:
    from ..studies.spec import specs
    from . import data as cli_data, train as cli_train
    from .generate import study_command

    for module in (cli_data, cli_train):
        for command in module.COMMANDS:
            main.add_command(command)
    for spec in specs():
        *groups, name = spec.command.split()
        parent = main
        for g in groups:
            if g not in parent.commands:
                parent.add_command(click.Group(g, help=_GROUP_HELP.get(g)))
            parent = parent.commands[g]
        parent.add_command(study_command(spec, name))


_GROUP_HELP = {"study": "Multi-protocol studies that reproduce a paper's experimental design on one model."}

_register()
