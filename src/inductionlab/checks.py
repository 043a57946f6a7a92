"""Checks every entry point shares, written once: the types of the loaded model and the config
an API function is handed, and the numbers in a config (integers that are integers and fit 64
bits, floats that are finite). Ranges proper (a list of at least 2 words, ...) stay in each
config's ``validate()``, which calls :func:`check_fields` first.

No torch import here: the CLI's option types use it before anything heavy is loaded.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import os
from typing import Any

from .errors import InductionLabError

INT64_MAX = 2 ** 63 - 1
TOKEN_BYTES = 16   # one token of a trial held while a run runs: its id and its list / mask id, int64 each
MAX_DRAWS = 1000   # random-head draws per k / variant: each is a full pass over the trials and a checkpoint piece


def _flag(name: str, prefix: str = "") -> str:
    return "--" + prefix + name.replace("_", "-")


def check_int(value, name: str, *, lo: int | None = None, hi: int | None = None) -> int:
    """``value`` is an integer (not a bool, not a float) within ``lo .. hi`` and 64 bits.

    Raises:
        TypeError: not an integer.
        InductionLabError: outside the range, naming ``name`` and the limits."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    value = int(value)
    if abs(value) > INT64_MAX:
        raise InductionLabError(f"{name} {value} does not fit a 64-bit integer; pass a smaller value")
    if lo is not None and value < lo or hi is not None and value > hi:
        rng = f"between {lo:,} and {hi:,}" if lo is not None and hi is not None else \
            f">= {lo:,}" if lo is not None else f"<= {hi:,}"
        raise InductionLabError(f"{name} {value:,} must be {rng}")
    return value


def check_float(value, name: str, *, lo: float | None = None, hi: float | None = None) -> float:
    """``value`` is a finite real number within ``lo .. hi``.

    Raises:
        TypeError: not a number.
        InductionLabError: NaN, infinite or outside the range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise InductionLabError(f"{name} must be a finite number, got {value}")
    if lo is not None and value < lo or hi is not None and value > hi:
        raise InductionLabError(f"{name} {value:g} must be between {lo:g} and {hi:g}" if lo is not None and hi is not None
                                else f"{name} {value:g} must be {'>=' if lo is not None else '<='} "
                                     f"{lo if lo is not None else hi:g}")
    return value


def physical_memory() -> int | None:
    """Bytes of physical memory (None where the platform does not say): the bound of up-front
    size checks (a plan or a trial set that cannot fit is refused before any work)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(need: int, option: str, value, what: str) -> None:
    """The one memory check of a count: ``need`` bytes (what ``option`` = ``value`` makes the run hold) must fit
    in a quarter of this machine's physical memory.

    Raises:
        InductionLabError: one line naming ``option``, its value, ``what`` it holds, the GiB needed and the
            machine's memory, and the fix (a lower value)."""
    mem = physical_memory()
    if mem and need > mem // 4:
        shown = f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)
        raise InductionLabError(f"{option} {shown}: {what} need {need / 2**30:.1f} GiB, more than a quarter of this "
                                f"machine's {mem / 2**30:.0f} GiB; lower {option}")


def check_sizes(cfg, prefix: str = "") -> None:
    """Every count leaf of the dataclass ``cfg`` (a field declared with ``opt(size=...)``: the bytes one unit of
    it makes the run hold, a function of ``cfg``) fits :func:`check_fits`. Called by :func:`check_fields`, so
    every config's ``validate()`` refuses an oversized count before a model loads or a file is written. A size
    that cannot be worked out (another field is itself invalid) is skipped: that field's own check refuses it.

    Raises:
        InductionLabError: a count whose need is more than a quarter of physical memory, naming its flag."""
    over = []                       # (how far from its default, field, value, bytes per unit) of every count too large
    for f in dataclasses.fields(cfg):
        size = f.metadata.get("size")
        value = getattr(cfg, f.name)
        if size is None or isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            continue
        try:
            per = int(size(cfg))
        except (InductionLabError, ArithmeticError, ValueError, TypeError, AttributeError):
            continue
        mem = physical_memory()
        if mem and int(value) * per > mem // 4:
            default = f.default if isinstance(f.default, numbers.Integral) and f.default > 0 else 1
            over.append((int(value) / default, f, int(value), per))
    if over:                        # counts multiply: blame the one moved furthest from its default
        _, f, value, per = max(over, key=lambda o: o[0])
        name = f.metadata.get("flag") or _flag(f.name, prefix)
        check_fits(value * per, name, value, f"{value:,} x {per:,} bytes")


def check_utf8(text: str, name: str) -> str:
    """``text`` (a command-line value) is valid UTF-8: Python's UTF-8 mode passes an undecodable byte through as a
    lone surrogate (``\\udcff``), which a tokenizer cannot encode.

    Raises:
        InductionLabError: naming ``name``, the first bad byte and its position."""
    for i, ch in enumerate(text):
        if "\ud800" <= ch <= "\udfff":
            byte = f"byte 0x{ord(ch) - 0xDC00:02x}" if "\udc80" <= ch <= "\udcff" else f"U+{ord(ch):04X}"
            raise InductionLabError(f"{name}: the text is not valid UTF-8 ({byte} at character {i}); pass UTF-8 text")
    return text


def check_seed(seed, name: str = "--seed") -> int:
    """A seed torch's and numpy's generators take: an integer in 0 .. 2**63 - 1."""
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool) and not 0 <= seed <= INT64_MAX:
        raise InductionLabError(f"{name} {seed} must be between 0 and 2**63 - 1 (torch's generator)")
    return check_int(seed, name, lo=0)


def check_draws(n_draws, name: str = "--n-draws") -> int:
    """Random-head draws: 1 .. :data:`MAX_DRAWS` (each draw is one more condition run over every trial)."""
    n = check_int(n_draws, name)
    if n < 1:
        raise InductionLabError(f"{name} {n} must be >= 1: at least 1 random-head draw is needed (the control)")
    if n > MAX_DRAWS:
        raise InductionLabError(f"{name} {n:,}: at most {MAX_DRAWS:,} random-head draws (each is a full pass over "
                                f"every trial and a checkpoint piece; the CI over draws needs a few)")
    return n


def _field_kinds(annotation) -> tuple[type | None, bool, bool]:
    """(int or float or None, optional, tuple of them) of a field annotation (a string under
    ``from __future__ import annotations``)."""
    a = str(annotation).replace(" ", "")
    optional = a.endswith("|None") or a.startswith("None|")
    a = a.replace("|None", "").replace("None|", "")
    if a in ("int", "float"):
        return {"int": int, "float": float}[a], optional, False
    if a in ("tuple[int,...]", "list[int]"):
        return int, optional, True
    return None, optional, False


def check_fields(cfg, prefix: str = "", *, effects: bool = True) -> None:
    """Every ``int`` / ``float`` field of the dataclass ``cfg`` (also optional ones, and tuples
    or lists of ints) holds a number of its kind that fits: an integer of 64 bits, a finite float;
    then every count of it fits in memory (:func:`check_sizes`).
    Messages name the CLI flag (``n_draws`` -> ``--n-draws``; ``prefix="icl-"``: ``--icl-late``).

    Then the leaves that would do nothing in the run (:func:`check_effects`: ``needs``,
    ``overrides``, a sub-config's leaves the config ``owns``), whether set by a flag, a file or the API
    (``effects=False``: not those; a config whose recorded runs hold such values).

    Raises:
        TypeError: a field of the wrong type (``"64"``, ``3.5`` for an integer, ``True``).
        InductionLabError: a NaN or infinite float, an integer beyond 64 bits, a count too large for memory; a
            leaf with no effect."""
    for f in dataclasses.fields(cfg):
        kind, optional, many = _field_kinds(f.type)
        if kind is None:
            continue
        v = getattr(cfg, f.name)
        if v is None and optional:
            continue
        name = f.metadata.get("flag") or _flag(f.name, prefix)
        check = check_int if kind is int else check_float
        if many:
            if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__"):
                raise TypeError(f"{name} must be a sequence of integers, got {type(v).__name__} {v!r}")
            for x in v:
                check(x, name)
        else:
            check(v, name)
    check_sizes(cfg, prefix)
    if effects:
        check_effects(cfg)


# ---- leaves that would do nothing: the fields' needs / overrides / owns metadata (inductionlab.config.opt) ----

def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:            # type: ignore[misc]
        return f.default_factory()                  # type: ignore[misc]
    return dataclasses.MISSING


def _is_set(cfg: Any, f: dataclasses.Field) -> bool:
    """Whether the leaf ``f`` of ``cfg`` is away from its field's default (a flag given, a file's key, the API)."""
    d = _field_default(f)
    return d is dataclasses.MISSING or getattr(cfg, f.name) != d


def _flag_of(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")   # as inductionlab.config.flag_of


def off(value: Any) -> bool:
    """Whether a leaf another one ``needs`` is off: False, None, empty."""
    return value is None or value is False or (isinstance(value, (str, tuple, list)) and not value)


def needs_error(flag: str, needed: str) -> InductionLabError:
    """The one line of a leaf set while the leaf it needs is off (``needed``: that leaf's flag)."""
    if needed.startswith("--no-"):
        return InductionLabError(f"{flag} has no effect with {needed}; drop one of them")
    return InductionLabError(f"{flag} has no effect without {needed}; add {needed} or drop {flag}")


def overrides_error(flag: str, other: str) -> InductionLabError:
    """The one line of two leaves set where ``flag`` decides alone."""
    return InductionLabError(f"{other} and {flag} conflict: {flag} decides alone, so {other} would be ignored; "
                             "drop one of them")


def check_effects(cfg: Any) -> None:
    """Refuse a value that would do nothing in the run, whether it came from a flag, a ``--config`` file or the API,
    by the fields' metadata (one level of the tree: :func:`check_fields` calls it for every config's ``validate()``):

    * a leaf with ``needs`` set (away from its default) while the leaf it needs is off;
    * a leaf with ``overrides`` set while a leaf it overrides is set too;
    * a leaf of a sub-config that this config ``owns`` (:func:`nested`) away from the sub-config's default.

    Raises:
        InductionLabError: the first such leaf, naming its flag (or its key) and the fix.
        TypeError: ``needs`` / ``overrides`` naming no leaf of the config (a bug in the configs)."""
    fields = dataclasses.fields(cfg)
    by_flag = {}
    for f in fields:
        if not f.metadata.get("nested"):
            for name in (_flag_of(f), *f.metadata.get("aliases", ())):
                by_flag[name] = f
    for f in fields:
        md = f.metadata
        if f.metadata.get("nested"):
            sub = getattr(cfg, f.name)
            if not dataclasses.is_dataclass(sub) or isinstance(sub, type):
                continue                                 # validate_tree refuses it, naming the field
            for path, source in (md.get("owns") or {}).items():
                *up, last = path.split(".")
                holder = functools.reduce(getattr, up, sub)
                leaf = next((x for x in dataclasses.fields(holder) if x.name == last), None)
                if leaf is None:
                    raise TypeError(f"{type(cfg).__name__}.{f.name}: owns {path!r}, which is no leaf of it")
                if _is_set(holder, leaf):
                    raise InductionLabError(f"config key '{f.name}.{path}' = {getattr(holder, last)!r} is not used: the "
                                            f"study sets it from {source}; drop it (or set {source})")
            continue
        flag = _flag_of(f) if md.get("cli", True) else f"config key '{f.name}'"   # a file's / the API's leaf
        if md.get("needs"):
            other = by_flag.get(md["needs"])
            if other is None:
                raise TypeError(f"{type(cfg).__name__}.{f.name}: needs {md['needs']}, no leaf of the same config")
            if _is_set(cfg, f) and off(getattr(cfg, other.name)):
                raise needs_error(flag, md["needs"])
        overrides = md.get("overrides")
        for o in (overrides,) if isinstance(overrides, str) else (overrides or ()):
            other = by_flag.get(o)
            if other is None:
                raise TypeError(f"{type(cfg).__name__}.{f.name}: overrides {o}, no leaf of the same config")
            if _is_set(cfg, f) and _is_set(cfg, other):
                raise overrides_error(flag, o)


def check_method(method: str) -> None:
    """``method`` is a registered ablation method that works from a head list
    (:data:`inductionlab.names.ABLATION_METHOD_NEEDS`; knockout needs edges).

    Raises:
        InductionLabError: any other name, listing the methods."""
    from .names import ablation_method_names

    if method not in ablation_method_names():
        raise InductionLabError(f"unknown ablation method {method!r}; use {', '.join(ablation_method_names())}")


#: Where an output-edit ablation applies, as the configs name it (per-position lists: the Python API).
ABLATION_POSITIONS = ("all", "last")


def check_ablation_positions(positions: str) -> None:
    """``positions`` is one of :data:`ABLATION_POSITIONS`: ``all`` (every query) or ``last`` (the last query
    of each forward call: a prompt's last token; under cached generation, every generated token too).

    Raises:
        InductionLabError: anything else."""
    if positions not in ABLATION_POSITIONS:
        raise InductionLabError(f"--positions {positions!r}: use all or last (the last token of each forward)")


def check_type(value, expected: type | tuple[type, ...], what: str, hint: str = "") -> None:
    """``value`` is an instance of ``expected`` (a loaded model, a config, ...).

    Raises:
        TypeError: naming ``what``, the expected type and what was given (a plain dict as a config
            names the way to build one: ``inductionlab.config.from_dict(LagProbeConfig, d)``, nested tables and
            presets included)."""
    if isinstance(value, expected):
        return
    names = " or ".join(t.__name__ for t in (expected if isinstance(expected, tuple) else (expected,)))
    if not hint and isinstance(value, dict) and dataclasses.is_dataclass(expected):
        hint = f"; build one with inductionlab.config.from_dict({expected.__name__}, your_dict)"
    raise TypeError(f"{what} must be a {names}, got {type(value).__name__}{hint}")


def check_loaded(loaded, what: str, needs: tuple[str, ...] = ("model", "tokenizer", "identity")) -> None:
    """``loaded`` is a :class:`~inductionlab.core.models.LoadedModel` (what :func:`~inductionlab.load_model`
    returns) or an object with the same attributes ``needs`` (tests pass exact fakes).

    Raises:
        TypeError: anything else (None, a bare model, a dict), naming ``what`` (the function) and the fix."""
    if all(hasattr(loaded, a) for a in needs) and not isinstance(loaded, (dict, type)):
        return
    hint = "; load one with inductionlab.load_model(...)"
    if hasattr(loaded, "forward"):
        hint = "; this is a bare model: wrap it as LoadedModel(model, tokenizer, identity) or use load_model(...)"
    raise TypeError(f"{what}: loaded must be a LoadedModel (from inductionlab.load_model), got "
                    f"{type(loaded).__name__}{hint}")


def check_not_empty(values, what: str, fix: str) -> None:
    """Raises InductionLabError: ``values`` is empty (almost surely a bug in the caller)."""
    if values is not None and len(values) == 0:
        raise InductionLabError(f"{what} is empty; {fix}")


def check_path_like(value, what: str) -> str:
    """``value`` is a ``str`` or an ``os.PathLike``; returns it as a ``str``.

    Raises: TypeError otherwise (None included)."""
    if isinstance(value, (str, os.PathLike)):
        return os.fspath(value)
    raise TypeError(f"{what} must be a str or a path (pathlib.Path), got {type(value).__name__}")
