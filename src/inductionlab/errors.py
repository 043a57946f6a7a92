"""User-facing errors.

Every mistake a user can make (unknown model, head out of range, pool too small, ...) raises
:class:`InductionLabError` with a one-line message that names the problem and the fix. The CLI
prints that line and exits with status 2; tracebacks are kept for real bugs.
"""


class InductionLabError(ValueError):
    """A user error: bad input, missing package or file, inconsistent options."""
