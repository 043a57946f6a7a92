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


# Sub-commands live next to the API they wrap; each module registers itself on `main`.
from . import cli_data  # noqa: E402,F401
