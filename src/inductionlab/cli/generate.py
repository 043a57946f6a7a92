"""Commands generated from configs: every leaf of a config tree (:mod:`inductionlab.config`) is an option
— its flag, type, default and help from the field — and the options given on the command line are set on
the tree, over its defaults, its preset or a ``--config`` file. No option is written by hand for a config.

* :func:`config_options` — the click options of a config class;
* :func:`build_config` — the config of a command's parsed options (file, then preset, then the flags given);
* :func:`study_command` — a whole study command from its :class:`~inductionlab.studies.spec.StudySpec`:
  the config's options, the model's (``--model``, ``--dtype`` …), ``--out``, ``--overwrite``, ``--quiet``,
  ``--config``; it builds the config, loads the model and runs :func:`~inductionlab.studies.engine.run_study`.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Callable

import click

from .. import config as C
from ..checks import check_float, check_int, check_utf8, needs_error, off, overrides_error
from ..errors import InductionLabError


def _param(leaf_key: str) -> str:
    return "c__" + leaf_key.replace(".", "__")


class LeafType(click.ParamType):
    """An option's text as its leaf's annotation (:func:`inductionlab.config.coerce`: ``1e6`` is an int,
    ``5,10,20`` a tuple), refusing NaN, infinities, integers beyond 64 bits and text that is not UTF-8 with one
    line naming the flag."""

    def __init__(self, annotation, escapes: bool = False):
        self.annotation, self.escapes = annotation, escapes
        inner, _ = C._optional(annotation)
        self.name = {int: "integer", float: "float", str: "text"}.get(inner, "list" if C.is_sequence(annotation)
                                                                       else "text")

    def convert(self, value, param, ctx):
        flag = param.opts[0] if param is not None and param.opts else "value"
        if not isinstance(value, str):
            return value
        check_utf8(value, flag)
        if self.escapes:
            value = value.replace("\\n", "\n")
        try:
            v = C.coerce(value, self.annotation, flag)
        except InductionLabError:           # click's own usage message, as for every type it parses
            self.fail(f"{value!r} is not {C.wants(C._optional(self.annotation)[0])}", param, ctx)
        for x in (v if isinstance(v, (tuple, list)) else (v,)):
            if isinstance(x, bool):
                continue
            if isinstance(x, int):
                check_int(x, flag)
            elif isinstance(x, float):
                check_float(x, flag)
        return v


def _shown(value) -> str | None:
    """A default as the command line spells it (``(5, 10, 20)`` -> ``5,10,20``; empty -> None)."""
    if value is None or isinstance(value, (tuple, list)) and not value:
        return None
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value))
    return value


def _text(value) -> str | None:
    """A default as ``--help`` shows it: a string with spaces at its ends quoted (the separator ``' '``)."""
    return repr(value) if isinstance(value, str) and value != value.strip() else value


def _varying(cls) -> set[str]:
    """Leaves whose value differs between the presets of ``cls`` (none without presets)."""
    presets = getattr(cls, "PRESETS", None) or {}
    values: dict[str, set] = {}
    for make in presets.values():
        for leaf in C.leaves(make(), cli_only=True):
            values.setdefault(leaf.key, set()).add(repr(leaf.value))
    return {k for k, v in values.items() if len(v) > 1 and k != "preset"}   # preset: the selector itself


def config_options(cls_or_cfg) -> list[click.Option]:
    """One click option per flag of a config (a class: its default config; or an instance, the command's
    defaults): its leaves with ``cli``, type, choices and help from the field; the default is the config's
    value (a preset-built config: the default preset's, shown as "the preset's" where presets differ).
    Leaves that share a flag are one option (``--batch-size`` of the lag probe and of serial recall).

    Raises:
        TypeError: two leaves share a flag with different types or defaults (a bug in the configs)."""
    base = C.default(cls_or_cfg) if isinstance(cls_or_cfg, type) else cls_or_cfg
    varying = _varying(type(base))
    by_flag: dict[str, list[C.Leaf]] = {}
    for leaf in C.leaves(base, cli_only=True):
        by_flag.setdefault(leaf.flag, []).append(leaf)
    options = []
    for flag, group in by_flag.items():
        leaf = group[0]
        for other in group[1:]:
            if other.type != leaf.type or other.value != leaf.value:
                raise TypeError(f"{flag}: leaves {leaf.key} and {other.key} share the flag but not the type and "
                                "default; give one of them another flag")
        options.append(_option(leaf, varying))
    return options


def _option(leaf: C.Leaf, varying: set[str]) -> click.Option:
    md, f = leaf.field.metadata, leaf.field
    decls = [leaf.flag, *md.get("aliases", ()), _param(leaf.key)]
    help_ = md.get("help", "")
    own = f.default if f.default is not dataclasses.MISSING else None
    source = ""
    if md.get("source"):     # where the field's own default comes from; a command's other default says both
        source = f" ({md['source']})" if leaf.value == own else f"; {md['source']}: {_text(_shown(own))}"
    if leaf.type is bool:
        if "/" in leaf.flag:                                         # --x/--no-x: None = not given
            return click.Option([leaf.flag, _param(leaf.key)], default=None,
                                help=f"{help_} [default: {leaf.value}{source}]".strip())
        return click.Option(decls, is_flag=True, default=False, help=help_)
    if leaf.key in varying:
        shown, default_text = None, "the preset's"
    else:
        shown = _shown(leaf.value)
        default_text = md.get("none") if shown is None and md.get("none") else _text(shown)
    choices = md.get("choices")
    typ = click.Choice(list(choices)) if choices else LeafType(leaf.type, md.get("escapes", False))
    text = f"{help_} [default: {default_text}{source}]" if default_text not in (None, "") else help_
    return click.Option(decls, type=typ, default=shown, metavar=md.get("metavar"), help=text, show_default=False)


def given(ctx: click.Context, param: str) -> bool:
    """Whether the parameter ``param`` was given on the command line or through the environment."""
    from click.core import ParameterSource

    return ctx.get_parameter_source(param) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


def _groups(cfg) -> dict[str, list[C.Leaf]]:
    """flag -> the leaves it sets (an option is its first leaf's)."""
    groups: dict[str, list[C.Leaf]] = {}
    for leaf in C.leaves(cfg, cli_only=True):
        groups.setdefault(leaf.flag, []).append(leaf)
    return groups


def given_flags(cls_or_cfg) -> set[str]:
    """The flags of the config's options given on the current command line (or through the environment)."""
    ctx = click.get_current_context()
    base = C.default(cls_or_cfg) if isinstance(cls_or_cfg, type) else cls_or_cfg
    return {flag for flag, g in _groups(base).items() if given(ctx, _param(g[0].key))}


def build_config(cls_or_cfg, kw: dict, config_file: str | None = None) -> Any:
    """The config of a command's parsed options ``kw`` (their ``c__`` keys are popped): the ``--config``
    file over the default config (a class's default, a preset-built config's preset named by the file or
    ``--preset``, or the instance given), then every option given on the command line set on its leaves
    (shared flags: on each).

    Raises:
        InductionLabError: an unknown key or a bad value in the file; an option given without the option it
            needs (``--lm-eval-limit`` without ``--lm-eval-tasks``)."""
    ctx = click.get_current_context()
    values = {k: kw.pop(k) for k in [k for k in kw if k.startswith("c__")]}
    file_values = C.read_mapping(config_file) if config_file else {}
    if isinstance(cls_or_cfg, type):
        preset = None
        if getattr(cls_or_cfg, "PRESETS", None):
            preset = values.get(_param("preset")) if given(ctx, _param("preset")) else file_values.get("preset")
        cfg = C.default(cls_or_cfg, preset)
    else:
        cfg = cls_or_cfg
    if file_values:
        cfg = C.from_dict(cfg, file_values)
    groups = _groups(cfg)
    flags = {flag for flag, g in groups.items() if given(ctx, _param(g[0].key))}
    for flag in flags:
        for leaf in groups[flag]:
            v = values[_param(groups[flag][0].key)]
            if leaf.type is bool and "/" not in flag:             # a flag turns its leaf away from the default
                v = not leaf.field.default
            cfg = C.with_leaf(cfg, leaf.path, v)
    for flag, g in groups.items():         # given at its default value too (the config's own check sees values)
        md = g[0].field.metadata
        needed = groups.get(md.get("needs") or "")
        if needed and flag in flags and off(C.get(cfg, needed[0].path)):
            raise needs_error(flag, md["needs"])
        overrides = md.get("overrides")
        for o in (overrides,) if isinstance(overrides, str) else (overrides or ()):
            if flag in flags and o in flags:
                raise overrides_error(flag, o)
    return cfg


# ---- study commands --------------------------------------------------------------------------------

def _model_label(model: str) -> str:
    name = Path(str(model).rstrip("/")).name
    return name.removesuffix(".gguf") or "model"


def study_command(spec, name: str) -> click.Command:
    """The click command ``name`` of the study ``spec`` (see the module docstring)."""
    from .options import accelerator_options, model_options, quiet_option, run_dir_options

    def callback(**kw):
        _run(spec, kw)

    f = with_options(config_options(spec.config))(callback)
    f = click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
                     help="YAML, JSON or TOML file of the config's keys (nested tables or dotted keys); options "
                          "given on the command line override it.")(f)
    if spec.estimate:
        f = click.option("--estimate", is_flag=True, help="Print the budget and the expected cost, then exit.")(f)
    f = quiet_option(f)
    f = run_dir_options(spec.out.format(kind=spec.kind, time="<time>", model="<model>", cfg=_Placeholder()))(f)
    if spec.model is not None:
        f = accelerator_options(model_options(f))
        if spec.model == "argument":
            f = click.argument("model_arg", metavar="[MODEL]", required=False)(f)
    return click.command(name, help=spec.help, context_settings={"max_content_width": 120})(f)


class _Placeholder:
    """Stands for the config in ``--out``'s help: ``{cfg.preset}`` reads ``<preset>``."""

    def __getattr__(self, name):
        return f"<{name}>"


def with_options(options: list[click.Option]) -> Callable:
    """A decorator adding ``options`` (:func:`config_options`) to a click command, in their order."""
    def apply(f):
        f.__click_params__ = getattr(f, "__click_params__", [])
        f.__click_params__.extend(reversed(options))
        return f
    return apply


def _reads_out(spec, cfg) -> tuple[str, bool]:
    """``(flag, set)`` of the spec's ``reads_out`` leaf (Bi-Induct's ``--partial``); ``("", False)`` without one."""
    if spec.reads_out is None:
        return "", False
    path = tuple(spec.reads_out.split("."))
    leaf = next(leaf for leaf in C.leaves(cfg) if leaf.path == path)
    return leaf.flag, bool(leaf.value)


def _run(spec, kw: dict) -> None:
    from ..runtime.distributed import shutdown
    from ..runtime.runs import ResumableRun, timestamp
    from ..studies.spec import RunOptions
    from .options import join_processes, refuse_conflicts, start_run

    ctx = click.get_current_context()
    if spec.model == "argument":
        arg = kw.pop("model_arg")
        if arg is not None and given(ctx, "model"):
            raise InductionLabError(f"the model is named twice: MODEL {arg!r} and --model {kw['model']!r}; pass one "
                                    "of them")
        if arg is not None:
            kw["model"] = arg
    cfg = build_config(spec.config, kw, kw.pop("config_file"))
    out, overwrite, quiet = kw.pop("out"), kw.pop("overwrite"), kw.pop("quiet")
    reads_out = _reads_out(spec, cfg)                    # (flag, set): a leaf that takes what --out holds
    if kw.pop("estimate", False):
        refuse_conflicts(("--overwrite", "--estimate", overwrite), (reads_out[0], "--estimate", reads_out[1]))
        cfg.validate()
        click.echo(spec.load().estimate(cfg))
        return
    if overwrite and reads_out[1]:
        raise InductionLabError(f"{reads_out[0]} and --overwrite conflict: {reads_out[0]} takes what --out holds, "
                                "--overwrite deletes it first; drop one of them")
    cfg.validate()                                      # fail before the slow part
    model = kw.get("model", "")
    out = Path(out or spec.out.format(kind=spec.kind, time=timestamp(), model=_model_label(model), cfg=cfg))
    inputs = [C.get(cfg, tuple(p.split("."))) for p in spec.inputs]
    loaded, load_s, dist = None, 0.0, None
    if spec.model is not None:
        dist, out = join_processes(kw, out)
        loaded, load_s = start_run(kw, out, overwrite, quiet, inputs=[i for i in inputs if i])
    else:
        ResumableRun.check_out(out, overwrite, inputs=[i for i in inputs if i])
    from ..studies.engine import run_study

    res = run_study(spec, loaded, cfg, out, RunOptions(overwrite=overwrite, progress=not quiet, dist=dist,
                                                       log=click.echo))
    if dist is None or dist.is_main:
        from ..studies.run import format_verdicts

        summary = spec.load().summary
        lines = summary(res) if summary is not None else format_verdicts(res.verdicts)
        if lines:
            click.echo("")
            click.echo("\n".join(lines))
        load = f"model loaded in {load_s:.1f} s; " if loaded is not None else ""
        click.echo(f"\n{load}{spec.command} {res.timings['total_s']:.1f} s; report: {out / 'report.md'}")
    if spec.model is not None:
        shutdown()


__all__ = ["LeafType", "config_options", "build_config", "given_flags", "with_options", "given", "study_command"]
