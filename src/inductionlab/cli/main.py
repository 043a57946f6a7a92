"""The ``inductionlab`` command line: a thin layer that parses options, calls the Python API
and writes run directories. User mistakes print one line and exit with status 2; so does an error
of the system (full disk, link loop, name too long: the path and the cause, :func:`~inductionlab.errors.os_error`).
Run as a program it works in Python's UTF-8 mode whatever the locale, and a standard stream that cannot be
written (a full disk, a closed pipe) never changes its exit status."""

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


class _SafeStream:
    """A standard stream whose writes never fail the command: on the first error (a full disk, a closed
    pipe, a closed terminal) its descriptor is pointed at ``/dev/null`` and later writes are dropped, so
    the exit status stays the command's own (not 1 from a traceback, nor 120 from the flush at exit)."""

    def __init__(self, stream):
        self._stream, self.broken = stream, False

    def _broke(self) -> None:
        self.broken = True
        with contextlib.suppress(OSError, ValueError, AttributeError):
            import os

            os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())

    def write(self, text):
        if not self.broken:
            try:
                n = self._stream.write(text)
                self._stream.flush()
                return n
            except (OSError, ValueError):          # ValueError: the stream was closed
                self._broke()
        return len(text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        if not self.broken:
            try:
                self._stream.flush()
            except (OSError, ValueError):
                self._broke()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _utf8_process() -> None:
    """Run as a program under a locale that is not UTF-8 (``LANG=C``, ``PYTHONUTF8=0``): start again in
    Python's UTF-8 mode (``-X utf8``), so that non-ASCII paths, YAML and instructions reach every library
    (tokenizers, json, open) as text, not as undecodable bytes. Once only (an environment marker); if the
    interpreter cannot be started again, go on, with undecodable output escaped instead of raising."""
    import codecs
    import os

    if sys.flags.utf8_mode or codecs.lookup(sys.getfilesystemencoding()).name == "utf-8":
        return
    if not os.environ.get("INDUCTIONLAB_UTF8_RESTART") and sys.executable and getattr(sys, "orig_argv", None):
        os.environ["INDUCTIONLAB_UTF8_RESTART"] = "1"
        with contextlib.suppress(OSError):
            sys.stdout.flush()
            sys.stderr.flush()
            os.execv(sys.executable, [sys.executable, "-X", "utf8", *sys.orig_argv[1:]])
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError):
            stream.reconfigure(errors="backslashreplace")


class _Group(click.Group):
    def main(self, args=None, *a, **kw):
        if args is None:                  # run as a program (not click's test runner nor an embedding caller)
            _utf8_process()
            sys.stdout, sys.stderr = _SafeStream(sys.stdout), _SafeStream(sys.stderr)
        return super().main(args, *a, **kw)

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


# Sub-commands: the hand-written families (corpus, curriculum, train, lm-eval, view) live next to the API they
# wrap; every study's command is generated from its spec (studies/<name>/config.py), so a new study folder
# is a new command with no code here — except where a hand-written command of the same name fronts the spec
# (telemetry: its runs are positional arguments, which a generated command has not). Registered explicitly (no import cycle: those modules never import this one).
def _register() -> None:
    from ..studies.spec import specs
    from . import data as cli_data, lm_eval as cli_lm_eval, train as cli_train, view as cli_view
    from .generate import study_command

    for module in (cli_data, cli_train, cli_lm_eval, cli_view):
        for command in module.COMMANDS:
            main.add_command(command)
    for spec in specs():
        *groups, name = spec.command.split()
        parent = main
        for g in groups:
            if g not in parent.commands:
                parent.add_command(click.Group(g, help=_GROUP_HELP.get(g)))
            parent = parent.commands[g]
        if name not in parent.commands:     # a hand-written command fronts its spec (telemetry: RUN... arguments)
            parent.add_command(study_command(spec, name))


_GROUP_HELP = {"study": "Multi-protocol studies that reproduce a paper's experimental design on one model."}

_register()
