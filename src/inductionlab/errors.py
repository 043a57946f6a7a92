"""User-facing errors.

Every mistake a user can make (unknown model, head out of range, pool too small, ...) raises
:class:`InductionLabError` with a one-line message that names the problem and the fix. The CLI
prints that line and exits with status 2; tracebacks are kept for real bugs.
"""


class InductionLabError(ValueError):
    """A user error: bad input, missing package or file, inconsistent options."""


# What to do about an error of the operating system, by errno name (the rest: "check the path").
_OS_FIXES = {
    "ENOSPC": "free space on that file system or pass a path on another one",
    "EDQUOT": "free space within your quota or pass a path on another file system",
    "ELOOP": "a symbolic link on the path points back to itself; fix or remove the link",
    "ENAMETOOLONG": "a name on the path is longer than the file system allows (255 bytes); use a shorter one",
    "EACCES": "check the permissions or pass another path",
    "EPERM": "check the permissions or pass another path",
    "EROFS": "the file system is read-only; pass a path on a writable one",
    "EIO": "the disk reported an I/O error; check it or pass a path on another one",
    "EMFILE": "too many open files; raise the limit (ulimit -n)",
    "ENOTDIR": "a part of the path is a file, not a directory; check the path",
}


def os_error(e: OSError, what: str | None = None) -> InductionLabError:
    """The one-line :class:`InductionLabError` of an error of the operating system (full disk,
    symbolic link loop, name too long, permissions, ...): the path (``e.filename``, else
    ``what``), the system's own words for the cause (``strerror`` and the errno name) and the
    fix. The CLI's top-level handler turns every ``OSError`` into this line (exit status 2).

    Args:
        e: the error (``OSError`` or a subclass).
        what: names the path when the error carries none (e.g. ``"--out runs/x"``).
    """
    import errno as _errno

    name = _errno.errorcode.get(e.errno, "") if e.errno is not None else ""
    cause = e.strerror or str(e) or type(e).__name__
    path = e.filename if e.filename is not None else what
    if e.filename is not None and what:
        path = what if str(e.filename) in what else f"{what}: {e.filename}"
    if e.filename2 is not None:
        path = f"{path} -> {e.filename2}"
    head = f"{path}: " if path is not None else ""
    fix = _OS_FIXES.get(name, "check the path and the file system")
    return InductionLabError(f"{head}{cause}{f' ({name})' if name else ''}; {fix}")
