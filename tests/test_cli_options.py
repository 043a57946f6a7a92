"""Every command keeps its options: names, types, defaults and flags, compared against the command tree of
commit 7389233 (tests/data/cli_options_7389233.json), before the commands were generated from the configs.
The differences are exactly the intended ones, listed here."""

from __future__ import annotations

import json
from pathlib import Path

import click

from inductionlab.cli import main

BEFORE = Path(__file__).parent / "data" / "cli_options_7389233.json"

# (command, option names) -> what changed on purpose
NEW = {("analyze", ("--config",)), ("evaluate", ("--config",)), ("study temporal", ("--config",)),
       ("study bi-induct", ("--config",)),                        # the config trees load from YAML / JSON / TOML
       ("study bi-induct", ("--job-threads",)),                   # was the undocumented STUDY_THREADS variable
       ("study temporal", ("--recall-shots",)),                   # was --shots, which evaluate uses for its probes
       ("analyze", ("--positions",)), ("study temporal", ("--positions",)),  # issue 25: position-restricted
       ("evaluate", ("--positions",)),                                        # ablation (all | last)
       *{(c, (f,)) for c in ("analyze", "study temporal", "evaluate")        # issue 25: selection by any ranking
         for f in ("--rank-by", "--exclude-by", "--exclude-fraction", "--random", "--scores-file")},
       ("evaluate", ("--no-lm-eval-ablated",)),                    # issue 27: lm-eval under every ablation
       *{("telemetry", (f,)) for f in ("--head-types", "--head-types-seq-len", "--head-types-batch",   # issue 26:
         "--head-types-seed", "--head-types-words", "--head-types-attention-prompts",                 # head types
         "--head-types-word-pool", "--head-types-cmr-runs", "--head-types-cmr-starts",                # over training
         "--induction-threshold", "--concept-threshold", "--token-threshold", "--concentration-top")},
       *{(c, (f,)) for c in ("analyze", "study temporal")                     # issue 34: lag-probe words of
         for f in ("--word-tokens", "--word-lags")}}                           # several tokens
HAND_WRITTEN = {"lm-eval",           # issue 27: lm-eval's own CLI with the model type inductionlab registered
                "view"}              # issue 37: the interactive page of a finished run
GONE = {("study temporal", ("--shots",))}
CHANGED = {
    ("evaluate", ("--method",), "type"),                          # free text -> a choice, as in every command
    ("analyze", ("--method",), "type"), ("study temporal", ("--method",), "type"),   # issue 25: + resample
    ("study bi-induct", ("--budget",), "type"),                   # float -> integer (1e6 still reads as 1000000)
    ("analyze", ("--n-permutations", "--permutations"), "default"), ("analyze", ("--cues",), "default"),   # issue 27: 11 lists x
}                                                                 # 500 cues, sized for 10 min on an AVX2-only CPU
FILE_OVERRIDES = ("train", "curriculum preview")   # defaults were None ("not given"), now the config's values


def describe(p: click.Parameter) -> dict:
    t = p.type
    typ = {"choices": list(t.choices)} if isinstance(t, click.Choice) else getattr(t, "name", type(t).__name__)
    return {"opts": list(p.opts), "secondary": list(getattr(p, "secondary_opts", [])), "type": typ,
            "default": p.default if not callable(p.default) else "<callable>",
            "flag": bool(getattr(p, "is_flag", False)), "required": p.required, "nargs": p.nargs,
            "kind": "argument" if isinstance(p, click.Argument) else "option"}


def tree(cmd: click.Command, path=()) -> dict:
    if isinstance(cmd, click.Group):
        return {k: v for name, sub in sorted(cmd.commands.items()) for k, v in tree(sub, path + (name,)).items()}
    return {" ".join(path): {p.name: describe(p) for p in cmd.params if p.name != "help"}}


def _by_names(options: dict) -> dict:
    return {tuple(sorted(o["opts"] + o["secondary"])): o for o in options.values()}


def _normal(o: dict) -> dict:
    o = dict(o)
    if o["flag"] and o["default"] in (False, "Sentinel.UNSET"):  # a flag's unset default, as click spelled it then
        o["default"] = False
    if o["type"] in ("path", "directory", "text", "list"):        # comma lists are read as lists; paths as text
        o["type"] = "text"
    return o


def test_every_command_keeps_its_options():
    from inductionlab.studies.spec import specs

    before, after = json.loads(BEFORE.read_text()), json.loads(json.dumps(tree(main), default=str))
    assert set(before) <= set(after) and set(after) - set(before) <= {s.command for s in specs()} | HAND_WRITTEN
    new, gone, changed = set(), set(), set()
    for cmd in before:
        a, b = _by_names(before[cmd]), _by_names(after[cmd])
        new |= {(cmd, n) for n in b.keys() - a.keys()}
        gone |= {(cmd, n) for n in a.keys() - b.keys()}
        for n in a.keys() & b.keys():
            x, y = _normal(a[n]), _normal(b[n])
            for field in x:
                if x[field] != y[field] and not (field == "default" and cmd in FILE_OVERRIDES and x[field] is None):
                    changed.add((cmd, n, field))
    assert new == NEW and gone == GONE and changed == CHANGED


def test_a_config_file_and_the_flags_build_the_same_config(tmp_path):
    """--config FILE and flags set the same leaves; a flag given overrides the file."""
    from click.testing import CliRunner

    from inductionlab.cli.generate import build_config
    from inductionlab.studies.analyze.config import AnalyzeConfig

    seen = {}

    @click.command()
    @click.option("--config", "config_file", default=None)
    def cmd(config_file, **kw):
        seen["cfg"] = build_config(AnalyzeConfig, kw, config_file)

    from inductionlab.cli.generate import config_options, with_options
    cmd = with_options(config_options(AnalyzeConfig))(cmd.callback)
    cmd = click.command()(click.option("--config", "config_file", default=None)(cmd))
    (tmp_path / "a.yaml").write_text("seed: 3\nablation: {ks: [1, 2]}\nlag.n_permutations: 8\nlag:\n  cues: seed\n")
    r = CliRunner().invoke(cmd, ["--config", str(tmp_path / "a.yaml"), "--n-permutations", "5", "--no-bos"])
    assert r.exit_code == 0, r.output
    c = seen["cfg"]
    assert (c.seed, c.ablation.ks, c.lag.n_permutations, c.lag.cues, c.lag.bos) == (3, (1, 2), 5, "seed", False)
    assert c.ablation.n_draws == AnalyzeConfig().ablation.n_draws         # untouched leaves keep their defaults
