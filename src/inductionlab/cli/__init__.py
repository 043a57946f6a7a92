"""The command line, a thin layer over the Python API: ``inductionlab`` (the entry point) and
``python -m inductionlab.cli`` both run :func:`main`.

``main.py`` holds the group and registers the commands; ``generate.py`` makes every study's command from its
spec and config (``analyze``, ``evaluate``, ``study temporal``, ``study bi-induct``: a new study folder is a
new command, with no code here) and the options of any config; ``data.py`` (corpus, curriculum) and
``train.py`` (train, telemetry) hold the hand-written families, their configs' options generated too;
``lm_eval.py`` (``lm-eval``) passes its arguments to lm-evaluation-harness's own CLI, our model type registered;
``options.py`` the options that are no config's (model, device, run directory, ``--quiet``).
"""

from .main import main

__all__ = ["main"]
