"""Output paths checked up front: before any model, corpus or tokenizer is loaded, a command
knows it can write where it was told to (issue 11 §3).

    check_output_dir(path, "--out")     a directory to create or fill
    check_output_file(path, "--plot")   a file to create or replace

Both take the command's ``inputs`` (model, corpus, source, run directories, config files) and refuse
an output that is one of them, holds one of them (with ``--overwrite`` it would be deleted) or lies
inside one (it would change it).

A path the system cannot reach (a symbolic link loop, a name longer than the file system allows)
is refused with the system's cause (:func:`~inductionlab.errors.os_error`).

Both probe the nearest existing ancestor by creating (and removing) a temporary directory in it,
so a read-only mount, a folder without write permission (as any user) and a full path through a
file are all caught, with one line naming the option and the fix.

Inside a run directory, :func:`inside` is the one check of every path a run writes, reads back or
deletes (pieces, checkpoints, the names a checkpoint's meta.json lists): it must stay inside the
directory, through no link that leads out (:func:`check_no_links_out` refuses such links up front).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ..errors import InductionLabError, os_error


def _nearest_existing(path: Path) -> Path:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _reachable(path: Path, option: str) -> None:
    """Stat ``path``, else its nearest existing ancestor: an error other than "no such file" (a
    link loop, a name too long, no permission to search) is refused with its cause."""
    for q in (path, *path.parents):
        try:
            os.stat(q)
            return
        except (FileNotFoundError, NotADirectoryError):
            continue                      # not there yet / under a file (said by _probe)
        except OSError as e:
            raise os_error(e, f"{option} {path}") from None


def _partial_prefix(name: str, pid: int | None = None) -> str:
    """Prefix of a staging folder for the output ``name``: ``.<name>.partial-<pid>-<host>-``, so a
    later run can tell a dead process's leftovers from a live one's (the probe below uses it too, so
    a kill mid-probe leaves a name a rerun recognises as ours; :mod:`inductionlab.runtime.runs` imports it)."""
    import socket

    return f".{name}.partial-{os.getpid() if pid is None else pid}-{socket.gethostname()}-"


def _probe(parent: Path, path: Path, option: str) -> None:
    if not parent.is_dir():
        raise InductionLabError(f"{option} {path} lies under {parent}, which is a file; pass a path in a directory")
    try:
        tempfile.TemporaryDirectory(prefix=_partial_prefix("inductionlab-probe"), dir=parent).cleanup()
    except OSError as e:
        raise InductionLabError(f"{option} {path}: cannot write in {parent} ({e.strerror or e}); "
                                "pass a path in a writable directory") from None


def _check_not_input(p: Path, inputs, option: str, *, is_file: bool) -> None:
    rp = p.resolve()
    for i in inputs or ():
        if i is None or str(i) == "" or not Path(i).expanduser().exists():
            continue                      # a model name, 'demo', a dataset id: not a path here
        ip = Path(i).expanduser()
        ri = ip.resolve()
        clash = rp == ri or rp in ri.parents or ri in rp.parents
        if clash:
            how = "is" if rp == ri else ("contains" if rp in ri.parents else
                                         "is a file of" if is_file and rp.exists() else "lies inside")
            harm = "writing there would change it" if how == "lies inside" else "writing there would overwrite it"
            raise InductionLabError(f"{option} {p} {how} the input {ip}; {harm}, pass another {option}")


def _checked_path(path, option: str, inputs, *, is_file: bool) -> Path:
    """``path`` expanded, once the checks a directory and a file share have passed: reachable, not a
    dangling link, not an input (nor holding one / inside one)."""
    p = Path(path).expanduser()
    _reachable(p, option)
    if p.is_symlink() and not p.exists():
        raise InductionLabError(f"{option} {p} is a dangling symbolic link (to {os.readlink(p)}); remove it or "
                                "pass another path")
    _check_not_input(p, inputs, option, is_file=is_file)
    return p


def check_output_dir(path: str | os.PathLike, option: str = "--out", inputs=()) -> Path:
    """Raise unless ``path`` is (or can become) a writable directory that is not one of the
    command's ``inputs`` and does not hold one.

    Raises:
        InductionLabError: ``path`` is an existing file, lies under a file, its nearest
            existing ancestor is not writable (read-only folder or file system), the system cannot
            reach it (link loop, name too long), or it is, contains or lies inside an input path.
    """
    p = _checked_path(path, option, inputs, is_file=False)
    if p.exists() and not p.is_dir():
        raise InductionLabError(f"{option} {p} is a file, not a directory; pass a directory path")
    _probe(p if p.is_dir() else _nearest_existing(p.parent), p, option)
    return p


def check_output_file(path: str | os.PathLike, option: str = "--out", inputs=()) -> Path:
    """Raise unless a file can be written at ``path`` without replacing an input.

    Raises:
        InductionLabError: ``path`` is a directory, lies under a file, its folder is not writable,
            the system cannot reach it, or it is an input or an existing file inside an input directory.
    """
    p = _checked_path(path, option, inputs, is_file=True)
    if p.is_dir():
        raise InductionLabError(f"{option} {p} is a directory; pass a file path")
    _probe(_nearest_existing(p.parent), p, option)
    return p


def inside(root: str | os.PathLike, path: str | os.PathLike, what: str = "") -> Path:
    """``path`` (relative to the run directory ``root``, or a path under it), once it is known to stay inside
    ``root``: the one check of every path a run writes, reads back or deletes in its own directory.

    ``root`` itself is taken as it resolves (``--out`` may be a link the user made); below it, a name
    with ``..`` or an absolute path elsewhere, and a symbolic link (at any depth, the last name included)
    whose target lies outside ``root``, are refused. Links that stay inside are followed.

    ``path`` relative is taken from ``root`` (``"checkpoints/a.npz"``), whatever ``root`` is; absolute, it must
    lie under ``root`` (also absolute).

    Returns:
        ``root / path`` as given (not resolved), so messages keep the user's spelling.

    Raises:
        InductionLabError: the path leaves ``root``; the message names the path and, for a link, its target.
    """
    root = Path(root)
    p = Path(path)
    rel = p.relative_to(root) if p.is_absolute() and p.is_relative_to(root) else p
    label = f"{what} " if what else ""
    if rel.is_absolute() or ".." in rel.parts:
        raise InductionLabError(f"{label}{root / rel} leaves the run directory {root} (the name {str(rel)!r}); "
                                "a run only writes and reads inside its own directory: remove or correct that name")
    top = root.resolve()
    q = root
    for part in rel.parts:
        q = q / part
        if q.is_symlink():
            if _leaves(q, top):
                raise InductionLabError(f"{label}{_link_says(q, root)}; a run never writes or reads through it: "
                                        "replace the link by a folder, or pass another --out")
    return root / rel


def _leaves(q: Path, top: Path) -> bool:
    """Whether the link ``q`` resolves outside ``top`` (a loop counts as leaving: it cannot be checked)."""
    try:
        return not q.resolve().is_relative_to(top)
    except (OSError, RuntimeError):
        return True


def _link_says(q: Path, root: Path) -> str:
    """``q is a symbolic link to T, outside the run directory R`` (or ``... a loop``), for messages."""
    try:
        q.resolve()
        where = f"outside the run directory {root}"
    except (OSError, RuntimeError):
        where = "a loop that cannot be resolved"
    return f"{q} is a symbolic link to {os.readlink(q)}, {where}"


def links_leaving(root: str | os.PathLike) -> list[Path]:
    """The symbolic links under ``root`` (not followed, so each is met once) whose target lies outside
    it (dangling ones included: their target may appear later)."""
    root = Path(root)
    if not root.is_dir():
        return []
    top, out = root.resolve(), []
    for dirpath, dirnames, filenames in os.walk(root):       # os.walk never descends through a link
        for name in dirnames + filenames:
            q = Path(dirpath) / name
            if q.is_symlink() and _leaves(q, top):
                out.append(q)
    return out


def check_no_links_out(root: str | os.PathLike) -> None:
    """Raise when a symbolic link under ``root`` leads outside it (:func:`links_leaving`): a run that
    resumes, prunes or overwrites there would write, read or delete through it.

    Raises:
        InductionLabError: naming the first such link and its target."""
    bad = links_leaving(root)
    if bad:
        q = bad[0]
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise InductionLabError(f"{_link_says(q, root)}{more}; "
                                "a run never writes, reads or deletes through it: replace the link by a folder, "
                                "or pass another --out")
