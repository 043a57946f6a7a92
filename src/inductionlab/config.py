"""The one config mechanism: typed dataclass trees.

A config is a dataclass; each field is a leaf declared with :func:`opt` (its default, help, where the
default comes from, its command-line flag) or a sub-config declared with :func:`nested`. From the tree
alone, and nowhere else:

* every command's options are generated (:mod:`inductionlab.cli.generate`): flag, type, default,
  help text (``--lag-probe options`` of ``analyze`` are the leaves of ``AnalyzeConfig.lag``);
* a YAML / JSON / TOML file loads into it (:func:`load`, :func:`from_dict`): nested tables for
  sub-configs, dotted keys (``lag.n_permutations: 64``), unknown keys refused with the closest name;
* values are coerced once, by the field's annotation (:func:`coerce`): a flag's text and a file's
  scalar become the same ``int`` / ``float`` / ``bool`` / tuple.

Ranges stay in each config's ``validate()`` (the API and the CLI both call it), which starts with
:func:`inductionlab.checks.check_fields` (numbers that fit; messages name the field's flag) and checks its
sub-configs with :func:`validate_tree` (each of its type, each validated once).

No torch import here, nor in a config module: ``inductionlab X --help`` builds its options from the
configs without loading torch.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from dataclasses import MISSING, Field
from pathlib import Path
from typing import Any, Callable, Iterator

from .errors import InductionLabError


def opt(default: Any = MISSING, help: str = "", *, source: str | None = None, flag: str | None = None,
        aliases: tuple[str, ...] = (), choices: tuple[str, ...] | None = None, none: str | None = None,
        cli: bool = True, factory: Callable[[], Any] | None = None, metavar: str | None = None,
        escapes: bool = False, needs: str | None = None, overrides: str | tuple[str, ...] | None = None,
        omit_default: bool = False, size: Callable[[Any], int] | None = None) -> Any:
    """A leaf of a config tree: a dataclass field with what the command line and the docs need.

    Args:
        default: the value (the paper's, the seed protocol's, or a decision: say which in ``source``).
        help: one line for ``--help``.
        source: where the default comes from (``"seed protocol"``, ``"paper"``, ``"decision"``,
            ``"Olsson et al. 2022"``), shown after it in ``--help``.
        flag: the option's name (default ``--<field-name>``). A ``bool`` whose default is True takes
            a ``--no-…`` flag that turns it off; one whose default is False a flag that turns it on.
            The same flag on two leaves of one command is one option setting both (``--batch-size``).
        aliases: other names of the option (``("--permutations",)``).
        choices: the values allowed (a ``click.Choice``).
        none: what a default of None means, for ``--help`` (``"from free GPU memory; 8 on CPU"``).
        cli: False: not an option of any command (file and API only).
        factory: a default factory instead of ``default`` (mutable defaults).
        metavar: the option's placeholder in ``--help`` (``LO,HI``).
        escapes: the flag's text may spell a newline as ``\\n`` (a separator typed in a shell).
        needs: the flag of another leaf of the same config without which this one has no effect: this leaf set
            (given on the command line, or away from its default in a file or through the API) while that leaf
            is off (false, None, empty) is refused (``--lm-eval-limit`` needs ``--lm-eval-tasks``; a ``--no-…``
            flag: this leaf has no effect when that flag is given, ``--route-prompts`` needs
            ``--no-dual-route``). Checked by :func:`inductionlab.checks.check_effects`.
        overrides: the flag(s) of other leaves of the same config that this one decides alone: both set, the
            command refuses them (``--span-range`` overrides ``--span-length``).
        omit_default: left out of :func:`to_dict` (records, a run's params) while at its default: an option
            added to a config after runs were recorded keeps their params, so they still resume.
        size: for a count, the bytes one unit of it makes the run hold, as a function of the config it sits in
            (``lambda c: TOKEN_BYTES * c.trial_tokens`` for trials): every config's ``validate()`` refuses a value
            whose total is more than a quarter of physical memory (:func:`inductionlab.checks.check_sizes`, the
            one memory check of every count; ``tests/test_bad_inputs_sizes.py`` walks every integer option).
    """
    meta = {"help": help, "source": source, "flag": flag, "aliases": tuple(aliases), "choices": choices,
            "none": none, "cli": cli, "metavar": metavar,
            "escapes": escapes, "needs": needs, "overrides": overrides, "omit_default": omit_default,
            "size": size}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def renamed_keywords(renamed: dict[str, tuple[str, ...]], until: str) -> Callable[[type], type]:
    """A class decorator (after ``@dataclass``) keeping a config's former keywords working for one minor version:
    ``renamed`` maps an old keyword to the path of the leaf that holds it now (``"ks": ("ablation", "ks")``);
    ``Config(ks=(5, 10))`` sets that leaf and warns (``DeprecationWarning``) with the new spelling and ``until``,
    the release that removes it. An old keyword beside its new leaf given explicitly: the old one wins, as
    given last.

    Raises (from the wrapped constructor): TypeError for any other unknown keyword, as the dataclass's own."""
    import warnings

    def wrap(cls: type) -> type:
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self, *args, **kw):
            old = {k: kw.pop(k) for k in list(kw) if k in renamed}
            init(self, *args, **kw)
            for k, v in old.items():
                path = renamed[k]
                new = f"{cls.__name__}({path[0]}={type(get(self, path[:1])).__name__}({'.'.join(path[1:])}=...))" \
                    if len(path) > 1 else f"{cls.__name__}({path[0]}=...)"
                warnings.warn(f"{cls.__name__}({k}=...) is deprecated and will be removed in {until}; use {new}",
                              DeprecationWarning, stacklevel=2)
                updated = with_leaf(self, path, v)
                for f in dataclasses.fields(cls):
                    object.__setattr__(self, f.name, getattr(updated, f.name))

        cls.__init__ = __init__
        cls.renamed_keywords = dict(renamed)
        return cls
    return wrap


def nested(factory: Callable[[], Any] | None, help: str = "", *, cli: bool = True,
           shorthand: str | None = None, owns: dict[str, str] | None = None) -> Any:
    """A sub-config (a dataclass) of a config tree; its leaves are options of the commands that hold it.

    Args:
        factory: builds the default sub-config (``LagProbeConfig`` or ``lambda: LagProbeConfig(cues="all:10")``:
            a study's defaults for a protocol are written here, once); None: no default (a config built by
            a preset, :func:`default`).
        cli: False: none of its leaves are options (file and API only).
        shorthand: a leaf a plain value stands for in a file (``curriculum: anti`` = ``curriculum: {variant: anti}``).
        owns: leaves of the sub-config (dotted paths below it) that the holding config sets itself, and from
            what (``{"seed": "--seed", "method": "--lag-method"}``: the study runs the protocol with its own seed
            and method): a value given for one of them (a file, the API) would be recorded and not used, so
            :func:`inductionlab.checks.check_effects` refuses it.
    """
    meta = {"help": help, "nested": True, "cli": cli, "shorthand": shorthand, "owns": dict(owns or {})}
    if factory is None:
        return dataclasses.field(metadata=meta)
    return dataclasses.field(default_factory=factory, metadata=meta)


def default(cls: type, preset: str | None = None) -> Any:
    """The default config of ``cls``: ``cls()``; for a config built by presets (a class attribute
    ``PRESETS``: name -> function returning a config, and a ``preset`` leaf naming the default one), the
    config of ``preset`` (None: the default preset).

    Raises:
        InductionLabError: an unknown preset, naming the known ones."""
    presets = getattr(cls, "PRESETS", None)
    if not presets:
        return cls()
    name = preset if preset is not None else next(f.default for f in dataclasses.fields(cls) if f.name == "preset")
    if name not in presets:
        raise InductionLabError(f"unknown preset {name!r}; use one of {', '.join(presets)}")
    return presets[name]()


def is_nested(f: Field) -> bool:
    return bool(f.metadata.get("nested"))


def flag_of(f: Field) -> str:
    """The command-line name of a leaf: its ``flag`` (``--no-bos``), else ``--<field-name>``."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


@functools.lru_cache(maxsize=None)
def hints(cls: type) -> dict[str, Any]:
    """Field name -> resolved annotation of the dataclass ``cls``."""
    return typing.get_type_hints(cls)


@dataclasses.dataclass(frozen=True)
class Leaf:
    """One leaf of a config tree, as a command sees it.

    Attributes:
        path: field names from the root (``("lag", "n_permutations")``).
        field: the dataclass field (its metadata: help, source, flag, ...).
        type: the resolved annotation (``int``, ``int | None``, ``tuple[int, ...]``).
        value: its value in the tree walked (the command's default when that is the default config).
    """
    path: tuple[str, ...]
    field: Field
    type: Any
    value: Any

    @property
    def flag(self) -> str:
        return flag_of(self.field)

    @property
    def key(self) -> str:
        return ".".join(self.path)


def leaves(cfg: Any, path: tuple[str, ...] = (), *, cli_only: bool = False) -> Iterator[Leaf]:
    """Every leaf of the config instance ``cfg``, depth first, with its value (sub-configs descended).
    ``cli_only``: the leaves that are options (``cli=False`` fields and sub-configs left out)."""
    h = hints(type(cfg))
    for f in dataclasses.fields(cfg):
        if cli_only and not f.metadata.get("cli", True):
            continue
        v = getattr(cfg, f.name)
        if is_nested(f) or dataclasses.is_dataclass(v) and not isinstance(v, type):
            yield from leaves(v, path + (f.name,), cli_only=cli_only)
        else:
            yield Leaf(path + (f.name,), f, h[f.name], v)


def validate_tree(cfg: Any, runs: Callable[[], dict[str, Any]] | None = None, *, validate: bool = True) -> None:
    """Check every sub-config of the tree ``cfg`` once, in field order: first that each is an instance of its
    field's dataclass, then each one's own ``validate()`` (which checks its sub-configs in turn). A config's
    ``validate()`` calls this for its sub-configs, then checks what ties them together.

    Args:
        cfg: a config instance.
        runs: returns field name -> the sub-config the study runs in that field's place (the protocol's config
            with the study's seed and ablation method), validated instead of the field's own; called after the
            type checks.
        validate: False: the type checks only (sub-configs a study validates its own way).

    Raises:
        TypeError: a sub-config of another type (a dict, another config), naming ``Config.field``.
        InductionLabError: what a sub-config's ``validate()`` refuses."""
    from .checks import check_type

    h = hints(type(cfg))
    subs = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if is_nested(f)}
    for name, value in subs.items():
        check_type(value, h[name], f"{type(cfg).__name__}.{name}")
    if not validate:
        return
    subs |= runs() if runs is not None else {}
    for value in subs.values():
        if hasattr(value, "validate"):
            value.validate()


def get(cfg: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        cfg = getattr(cfg, name)
    return cfg


def with_leaf(cfg: Any, path: tuple[str, ...], value: Any) -> Any:
    """A copy of the tree ``cfg`` with the leaf at ``path`` set to ``value`` (sub-configs copied on the way)."""
    if len(path) == 1:
        return dataclasses.replace(cfg, **{path[0]: value})
    return dataclasses.replace(cfg, **{path[0]: with_leaf(getattr(cfg, path[0]), path[1:], value)})


# ---- coercion by annotation ---------------------------------------------------------------------

def _optional(t) -> tuple[Any, bool]:
    """``(inner type, optional)`` of ``X | None`` (else ``(t, False)``)."""
    if isinstance(t, types.UnionType) or typing.get_origin(t) is typing.Union:
        args = [a for a in typing.get_args(t) if a is not type(None)]
        return (args[0] if len(args) == 1 else t), len(args) < len(typing.get_args(t))
    return t, False


def is_sequence(t) -> bool:
    return typing.get_origin(_optional(t)[0]) in (tuple, list)


def _scalar(value: Any, t, where: str) -> Any:
    if t is bool:
        if isinstance(value, str):
            low = value.strip().lower()
            if low not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(value)
            return low in ("true", "1", "yes")
        if isinstance(value, (bool, int)) and value in (0, 1):
            return bool(value)
        raise ValueError(value)
    if t is int:
        if isinstance(value, bool) or isinstance(value, float) and not value.is_integer():
            raise ValueError(value)
        if isinstance(value, str):
            s = value.strip()
            return int(float(s)) if "e" in s.lower() and float(s).is_integer() else int(s)
        return int(value)
    if t is float:
        if isinstance(value, bool):
            raise ValueError(value)
        return float(value)
    if t is str:
        if isinstance(value, (dict, list, tuple)):
            raise ValueError(value)
        return str(value)
    return value


def coerce(value: Any, t: Any, where: str) -> Any:
    """``value`` (a flag's text, a file's scalar or list) as the annotation ``t``: ``bool``, ``int``
    (``"1e6"`` → 1000000; 3.5 refused), ``float``, ``str``, ``X | None`` (``none`` / ``null``, and ``auto`` for an
    ``int | None``), ``tuple[int, ...]`` /
    ``list[int]`` / ``tuple[str, ...]`` (a list, or comma-separated text), ``tuple[int, int]``
    (``"LO,HI"``); other annotations (``dict``) are taken as they are.

    Raises:
        InductionLabError: a value the annotation cannot hold, naming ``where`` (the key or flag) and what
            it takes."""
    inner, optional = _optional(t)
    if value is None or optional and isinstance(value, str) and (value.strip().lower() in ("none", "null") or
                                                                 inner is int and value.strip().lower() == "auto"):
        if optional:
            return None
        raise InductionLabError(f"{where} needs {wants(inner)}, got none")
    try:
        origin = typing.get_origin(inner)
        if origin in (tuple, list):
            args = typing.get_args(inner)
            item = args[0] if args else str
            items = [x.strip() for x in value.split(",") if x.strip()] if isinstance(value, str) else value
            if not isinstance(items, (list, tuple)):
                raise ValueError(value)
            out = [_scalar(x, item, where) for x in items]
            if origin is tuple and len(args) == 2 and args[1] is not Ellipsis and len(out) != 2:
                raise ValueError(value)
            return tuple(out) if origin is tuple else out
        return _scalar(value, inner, where)
    except (TypeError, ValueError):
        raise InductionLabError(f"{where} {value!r} is not {wants(inner)}") from None


def wants(t) -> str:
    """What an annotation takes, in words (for messages)."""
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is tuple and len(args) == 2 and args[1] is not Ellipsis:
        return "LO,HI (two integers, e.g. 10,30)"
    if origin in (tuple, list):
        item = args[0] if args else str
        return f"a comma-separated list of {wants(item).removeprefix('a valid ').removeprefix('a ')}s" + \
            (", e.g. 10,20,50" if item is int else "")
    return {bool: "true or false", int: "a valid integer", float: "a valid number", str: "a text"}.get(t, f"a {t}")


# ---- files ----------------------------------------------------------------------------------------

def from_dict(cls_or_cfg: Any, d: dict, *, where: str = "") -> Any:
    """A config of type ``cls_or_cfg`` (a dataclass type: its defaults; or an instance: a copy of it)
    with the entries of the mapping ``d`` set: nested mappings for sub-configs, dotted keys
    (``"lag.n_permutations"``), a plain value for a sub-config with a ``shorthand`` leaf; a mapping
    under a key that is no field groups keys of this level (``schedule: {lr: 1e-3}`` reads as ``lr``).
    Keys may use hyphens (``n-permutations``).

    Raises:
        InductionLabError: an unknown key (with the closest known one), a value of the wrong type."""
    if isinstance(cls_or_cfg, type):
        cfg = default(cls_or_cfg, d.get("preset") if getattr(cls_or_cfg, "PRESETS", None) else None)
    else:
        cfg = dataclasses.replace(cls_or_cfg)
    fields = {f.name: f for f in dataclasses.fields(cfg)}
    h = hints(type(cfg))
    grouped: dict[str, Any] = {}
    for key, value in d.items():
        k = str(key).replace("-", "_")
        head, dot, rest = k.partition(".")
        if dot:
            grouped.setdefault(head, {})
            if not isinstance(grouped[head], dict):
                grouped[head] = {fields[head].metadata.get("shorthand"): grouped[head]} if head in fields else {}
            grouped[head][rest] = value
        elif k not in fields and isinstance(value, dict):
            for kk, vv in value.items():                 # grouping only
                grouped[str(kk).replace("-", "_")] = vv
        else:
            grouped[k] = value
    for k, value in grouped.items():
        name = f"{where}{k}"
        if k not in fields:
            raise InductionLabError(f"unknown config key {name!r}; {_suggest(cfg, k, where)}")
        f = fields[k]
        if is_nested(f):
            sub = getattr(cfg, k)
            if dataclasses.is_dataclass(value):
                value = dataclasses.asdict(value)
            if not isinstance(value, dict):
                short = f.metadata.get("shorthand")
                if short is None:
                    raise InductionLabError(f"config key {name!r} is a table of settings; give it as a mapping "
                                            f"({name}: {{key: value}})")
                value = {short: value}
            setattr(cfg, k, from_dict(sub, value, where=f"{name}."))
        else:
            setattr(cfg, k, coerce(value, h[k], f"config key {name!r}"))
    return cfg


def _suggest(cfg: Any, key: str, where: str) -> str:
    """The closest known key to ``key``: a field of this level, or a leaf of a sub-config under its dotted
    name (``span_length`` -> ``curriculum.span_length``)."""
    names = {f.name: f.name for f in dataclasses.fields(cfg)}
    for leaf in leaves(cfg):
        if len(leaf.path) > 1:
            names.setdefault(leaf.path[-1], leaf.key)
    close = difflib.get_close_matches(key, list(names), n=1)
    if close:
        return f"did you mean '{where}{names[close[0]]}'?"
    return "see the config's fields (or the command's --help)"


def read_mapping(path: str | Path) -> dict:
    """The mapping of a YAML (``.yaml`` / ``.yml``), JSON (``.json``) or TOML (``.toml``) file.

    Raises:
        InductionLabError: a missing or unparsable file, another suffix, a file that is not a mapping."""
    p = Path(path)
    if not p.is_file():
        raise InductionLabError(f"config file {p} does not exist; check the path")
    if p.suffix not in (".yaml", ".yml", ".json", ".toml"):
        raise InductionLabError(f"config file {p} must end in .yaml, .yml, .json or .toml")
    from .documents import read_document

    try:
        d = read_document(p, "config file")
        d = {} if d is None else d
    except InductionLabError:
        raise
    except Exception as e:                       # yaml.YAMLError, json / toml decode errors
        if isinstance(e, OSError):
            raise
        raise InductionLabError(f"cannot parse {p}: {str(e).splitlines()[0] if str(e) else type(e).__name__}; "
                                "fix the file") from None
    if not isinstance(d, dict):
        raise InductionLabError(f"config file {p} must hold a mapping of key: value")
    return d


def load(cls_or_cfg: Any, path: str | Path) -> Any:
    """A config of type ``cls_or_cfg`` (or over that instance) with the entries of the file ``path``:
    :func:`from_dict` of :func:`read_mapping` (``load(AnalyzeConfig, "analyze.yaml")``)."""
    return from_dict(cls_or_cfg, read_mapping(path))


def to_dict(cfg: Any) -> dict:
    """The tree as plain JSON-able values (tuples as lists), for records and files; a leaf declared with
    ``omit_default=True`` is left out while it holds its default."""
    def plain(v):
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)
                    if not (f.metadata.get("omit_default") and getattr(v, f.name) == f.default)}
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        return v
    return plain(cfg)


__all__ = ["opt", "nested", "default", "Leaf", "leaves", "validate_tree", "get", "with_leaf", "coerce", "from_dict", "read_mapping", "load",
           "to_dict", "wants", "flag_of", "is_nested", "is_sequence", "hints"]
