"""The command line, a thin layer over the Python API: ``inductionlab`` (the entry point) and
``python -m inductionlab.cli`` both run :func:`main`.

``main.py`` holds the group and ``analyze``; one module per command family (``data``: corpus and
curriculum, ``train``, ``evaluate``, ``study``); ``options.py`` the option groups they share.
A new command: a ``@main.command()`` in the family's module (or a new module registered in
``main._register``) that parses options into the API's config and calls the API.
"""

from .main import main

__all__ = ["main"]
