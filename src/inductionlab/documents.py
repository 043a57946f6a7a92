"""One bounded reader for every JSON / YAML / TOML document the tool reads.

A document (``study.json``, ``run.json``, a checkpoint's ``meta.json`` and ``telemetry.json``, a
corpus manifest, a ``--config`` file, a model folder's ``config.json`` and tokenizer files) is read
in four steps, each with a limit, so a hostile or damaged file gives one :class:`DocumentError`
line instead of a ``RecursionError`` traceback, a ``MemoryError`` or a hang:

1. open it: a regular file only (a named pipe or a device, also through a link, would block or
   never end), read at most ``max_bytes`` (:data:`MAX_BYTES`) plus one byte;
2. decode it as UTF-8 (a BOM allowed), naming the first bad byte's offset otherwise;
3. measure its nesting depth *without recursion* (the brackets outside strings, one pass in numpy;
   YAML also its block nesting, from the parser's event stream, which has no recursion)
   and refuse one deeper than ``max_depth`` (:data:`MAX_DEPTH`) before any recursive parser runs;
4. parse it (a parser's ``RecursionError`` is still turned into the same line, as a backstop).

:class:`DocumentError` is an :class:`~inductionlab.errors.InductionLabError`, hence a
``ValueError``: a caller that treats a damaged resume piece as absent (``except ValueError``) treats
a too-deep or too-large piece the same way. Parse errors keep their own types (``yaml.YAMLError``,
``tomllib.TOMLDecodeError``); a JSON one is a :class:`JSONDocumentError`, both a ``DocumentError`` (one line
naming the file, line and column) and a ``json.JSONDecodeError``.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from .errors import InductionLabError

# Limits (decision): the documents this tool writes are kilobytes and nest fewer than 10 levels; a
# model's config.json nests about 4. The largest tokenizer.json files of released models are tens
# of MB (Gemma 3's: 33 MB), hence the larger cap for model-folder files.
MAX_BYTES = 64 * 2 ** 20
MODEL_FILE_MAX_BYTES = 1024 * 2 ** 20
MAX_DEPTH = 100
MAX_VALUES = 1_000_000      # values of a YAML / TOML document once its aliases are expanded


class DocumentError(InductionLabError):
    """A document that is too large, too deeply nested, not UTF-8 or not a regular file."""


class JSONDocumentError(DocumentError, json.JSONDecodeError):
    """A JSON document that does not parse: one line naming the file, line and column. Also a
    ``json.JSONDecodeError``, so a caller that treats a damaged file as absent (a checkpoint piece computed again)
    keeps doing so."""

    def __init__(self, message: str, e: json.JSONDecodeError):
        json.JSONDecodeError.__init__(self, e.msg, e.doc, e.pos)
        self.args = (message,)

    def __str__(self) -> str:
        return self.args[0]


def _size(n: int) -> str:
    return f"{n / 2 ** 20:.0f} MiB" if n >= 2 ** 20 else f"{n} bytes"


def read_bytes(path: str | os.PathLike, what: str = "file", max_bytes: int = MAX_BYTES) -> bytes:
    """At most ``max_bytes`` of a regular file, read without blocking on a pipe or a device.

    Raises:
        DocumentError: not a regular file, or larger than ``max_bytes``.
        OSError: the file cannot be opened (missing, permissions): the caller's usual error."""
    p = Path(path)
    st = os.stat(p)                     # follows links: a link to /dev/zero is a device
    if not stat.S_ISREG(st.st_mode):
        kind = ("a named pipe" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode)
                or stat.S_ISBLK(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else
                "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file")
        raise DocumentError(f"{what} {p} is {kind}, not a regular file; pass a regular file")
    if st.st_size > max_bytes:
        raise DocumentError(f"{what} {p} is {_size(st.st_size)}, more than the {_size(max_bytes)} this tool reads; "
                            "check the file (it is not one this tool wrote)")
    fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):     # replaced between stat and open
            raise DocumentError(f"{what} {p} is not a regular file; pass a regular file")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise DocumentError(f"{what} {p} is more than the {_size(max_bytes)} this tool reads; check the file")
    return data


def decode(data: bytes, path: str | os.PathLike, what: str = "file") -> str:
    """UTF-8 text (a BOM removed).

    Raises:
        DocumentError: not UTF-8, naming the offset of the first bad byte."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DocumentError(f"{what} {path} is not UTF-8 text (byte {e.start}: {data[e.start:e.start + 1]!r}); "
                            "save it as UTF-8") from None


_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_YAML_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|\'[^\']*\'|#[^\n]*', re.S)
_TOML_STRING = re.compile(rb'"""(?:[^\\]|\\.)*?"""|\'\'\'.*?\'\'\'|"[^"\\\n]*(?:\\.[^"\\\n]*)*"|\'[^\'\n]*\'|#[^\n]*',
                          re.S)


def bracket_depth(data: bytes, strings: re.Pattern = _JSON_STRING) -> int:
    """The deepest nesting of ``[`` / ``{`` outside strings (no recursion: one numpy pass)."""
    import numpy as np

    table = np.zeros(256, dtype=np.int8)
    table[[ord("["), ord("{")]], table[[ord("]"), ord("}")]] = 1, -1
    step = table[np.frombuffer(strings.sub(b"", data), dtype=np.uint8)]
    return int(np.cumsum(step, dtype=np.int64).max()) if step.size else 0


def _yaml_depth(text: str) -> int:
    import yaml

    depth = deepest = 0
    for ev in yaml.parse(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
        if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            deepest = max(deepest, depth)
        elif isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
    return deepest


def object_depth(obj: Any, max_values: int = MAX_VALUES, what: str = "document", path: Any = "") -> int:
    """The nesting depth of parsed lists / dicts (iterative), refusing more than ``max_values`` values
    in all (YAML aliases repeat one list many times over: "a billion laughs")."""
    deepest, stack, seen = 0, [(obj, 1)], 0
    while stack:
        o, d = stack.pop()
        if isinstance(o, dict):
            o = list(o.values())
        elif not isinstance(o, list):
            continue
        seen += len(o)
        if seen > max_values:
            raise DocumentError(f"{what} {path} expands to more than {max_values:,} values (through aliases or "
                                "repeats); check the file (it is not one this tool wrote)")
        deepest = max(deepest, d)
        stack.extend((v, d + 1) for v in o if isinstance(v, (dict, list)))
    return deepest


def _too_deep(what: str, path, depth: int | None, max_depth: int) -> DocumentError:
    got = f"{depth} levels" if depth is not None else "too many levels"
    return DocumentError(f"{what} {path} nests {got} deep, more than the {max_depth} this tool reads; "
                         "check the file (it is not one this tool wrote)")


def _checked_depth(depth: int, what: str, path, max_depth: int) -> None:
    if depth > max_depth:
        raise _too_deep(what, path, depth, max_depth)


def loads_json(text: str, what: str = "JSON", path: str | os.PathLike = "", max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` with the depth limit (for JSON held in memory: a line of a JSONL file)."""
    _checked_depth(bracket_depth(text.encode("utf-8", "surrogatepass")), what, path, max_depth)
    try:
        return json.loads(text)
    except RecursionError:
        raise _too_deep(what, path, None, max_depth) from None
    except json.JSONDecodeError as e:
        where = f"{path}" if path else what
        raise JSONDocumentError(f"{where}: {what} is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}); "
                                "repair or recreate it", e) from None


def read_json(path: str | os.PathLike, what: str = "JSON file", *, max_bytes: int = MAX_BYTES,
              max_depth: int = MAX_DEPTH) -> Any:
    """A JSON document, bounded (module docstring). ``what`` names it in errors (``"run record"``)."""
    return loads_json(decode(read_bytes(path, what, max_bytes), path, what), what, path, max_depth)


def read_yaml(path: str | os.PathLike, what: str = "YAML file", *, max_bytes: int = MAX_BYTES,
              max_depth: int = MAX_DEPTH) -> Any:
    """A YAML document (``yaml.safe_load``), bounded (module docstring)."""
    import yaml

    data = read_bytes(path, what, max_bytes)
    text = decode(data, path, what)
    # flow brackets first (a scan of [[[[... nests in the parsers' own limits, or takes minutes), then blocks
    _checked_depth(bracket_depth(data, _YAML_STRING), what, path, max_depth)
    _checked_depth(_yaml_depth(text), what, path, max_depth)
    try:
        obj = yaml.safe_load(text)
    except RecursionError:
        raise _too_deep(what, path, None, max_depth) from None
    _checked_depth(object_depth(obj, what=what, path=path), what, path, max_depth)     # aliases can nest what the text does not
    return obj


def read_toml(path: str | os.PathLike, what: str = "TOML file", *, max_bytes: int = MAX_BYTES,
              max_depth: int = MAX_DEPTH) -> Any:
    """A TOML document (``tomllib``), bounded (module docstring)."""
    import tomllib

    data = read_bytes(path, what, max_bytes)
    text = decode(data, path, what)
    _checked_depth(bracket_depth(data, _TOML_STRING), what, path, max_depth)
    try:
        obj = tomllib.loads(text)
    except RecursionError:
        raise _too_deep(what, path, None, max_depth) from None
    _checked_depth(object_depth(obj, what=what, path=path), what, path, max_depth)     # dotted keys nest without brackets
    return obj


def read_document(path: str | os.PathLike, what: str = "file", **kw) -> Any:
    """:func:`read_json`, :func:`read_yaml` or :func:`read_toml` by the suffix."""
    suffix = Path(path).suffix.lower()
    reader = {".json": read_json, ".toml": read_toml, ".yaml": read_yaml, ".yml": read_yaml}.get(suffix)
    if reader is None:
        raise DocumentError(f"{what} {path} must end in .json, .yaml, .yml or .toml")
    return reader(path, what, **kw)


def check_json(path: str | os.PathLike, what: str = "JSON file", *, max_bytes: int = MAX_BYTES,
               max_depth: int = MAX_DEPTH) -> None:
    """Check a JSON file another library will parse (size, regular file, UTF-8, depth); no parse."""
    data = read_bytes(path, what, max_bytes)
    decode(data, path, what)
    _checked_depth(bracket_depth(data), what, path, max_depth)


def check_model_folder(path: str | os.PathLike, files=None) -> None:
    """Check every JSON file of a model or tokenizer folder (``config.json``, ``tokenizer.json``,
    ``tokenizer_config.json``, ...; or just ``files``) before transformers or tokenizers parse it.
    A hub id: its snapshot folder in the local cache, if there is one; a GGUF file: nothing to check."""
    p = Path(path)
    if not p.is_dir() and not p.exists() and files is None:
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(str(path), "config.json")
        except Exception:  # noqa: BLE001 - not a hub id, or no cache: transformers says what is missing
            cached = None
        p = Path(cached).parent if isinstance(cached, str) else p
    if not p.is_dir():
        return
    for f in sorted(p.glob("*.json")) if files is None else files:
        check_json(f, "model file", max_bytes=MODEL_FILE_MAX_BYTES)
