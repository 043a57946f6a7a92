"""Every count is size-checked before a model loads (issue 36 §3): one memory check
(:func:`inductionlab.checks.check_sizes`, fed by ``opt(size=...)``) that every config's ``validate()`` runs.

:func:`test_every_integer_leaf_refuses_a_billion` walks every integer leaf of every command's config (options and
``--config`` keys) and sets it to 10^9: ``validate()`` must refuse it in one line, or the leaf is in
:data:`NOT_COUNTS` with the reason 10^9 is harmless or refused later (bounded by the model, capped by a list). A new
count added without ``size=`` fails here. The command-line cases then check the named options end to end: exit 2,
one ``error:`` line, nothing written, an existing unrelated ``--out`` byte-identical.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest

from inductionlab import checks
from inductionlab import config as C
from inductionlab.errors import InductionLabError
from inductionlab.studies.spec import specs
from inductionlab.studies.telemetry.config import TelemetryConfig
from inductionlab.train.config import TrainConfig
from test_bad_inputs import refused

BILLION = 10 ** 9
MEMORY = 64 << 30          # the machine the checks see: 64 GiB (a quarter: 16 GiB)

# leaf name -> why 10^9 is no memory count of its own (checked later against the model, capped, or not a count)
NOT_COUNTS = {
    "seed": "any integer in 0..2**63-1 is a seed",
    "top": "heads listed: capped by the model's heads",
    "exclude_top_n": "refused against the model's heads in prepare (check_ks), before anything is written",
    "load_bearing_top": "refused against the model's heads in prepare",
    "far_lag": "a distance: beyond the list every word uses all its positions (documented)",
    "word_lags": "range-checked against --list-length where it is used (--word-tokens > 1)",
    "word_top_n": "capped by wordfreq's word list",
    "word_pool": "capped by wordfreq's word list",
    "max_cue_bytes": "itself the limit of the per-cue probabilities",
    "layer": "refused against the model's layers in prepare",
    "late": "scaled down to the model's context (icl_positions)",
    "window": "capped by the early token (icl_summary)",
    "max_tokens": "capped by the held-out split",
    "top_k": "capped by the model's heads",
    "tokens": "a token budget: 10^9 is an ordinary training run",
    "anneal_tokens": "tokens of the curriculum's anneal, capped by the budget",
    "budget": "a token budget: 10^9 is an ordinary study",
    "sep_id": "checked against the corpus vocabulary before training",
    "dense_start": "a step: the dense window is capped by the run's steps",
    "dense_end": "a step: the dense window is capped by the run's steps",
    "dense_every": "a step interval, capped by the run's steps",
    "save_every": "a step interval",
    "keep_resumable": "checkpoints kept: capped by the checkpoints written",
    "log_every": "a step interval",
    "eval_tokens": "capped by the held-out split",
}


def _roots(tmp: Path):
    """(command, a config that validates) of every command with a config."""
    shards = tmp / "shards"
    shards.mkdir(exist_ok=True)
    (shards / "manifest.json").write_text("{}")
    text = tmp / "text.txt"                                 # not the demo corpus: a fresh clone has none
    text.write_text("some natural text\n")
    for spec in specs():
        cfg = C.default(spec.config)
        if spec.config is TelemetryConfig:
            cfg = dataclasses.replace(cfg, runs=("run",), head_types=dataclasses.replace(cfg.head_types, enabled=True))
        elif spec.command == "study routes":
            cfg = C.with_leaf(C.with_leaf(cfg, ("selection", "rankings"), ("induction", "anti_induction")),
                              ("icl", "text"), str(text))
        elif spec.command == "study head-types":
            cfg = C.with_leaf(C.with_leaf(cfg, ("cmr", "enabled"), True), ("icl", "text"), str(text))
        elif spec.command == "study bi-induct":
            cfg = C.with_leaf(cfg, ("shards",), str(shards))
        yield spec.command, cfg
    yield "train", TrainConfig(data=str(shards), out=str(tmp / "o"), tokens=65536 * 10)


@pytest.fixture()
def memory(monkeypatch):
    monkeypatch.setattr(checks, "physical_memory", lambda: MEMORY)


def test_every_integer_leaf_refuses_a_billion(tmp_path, memory):
    accepted, used = [], set()
    for command, base in _roots(tmp_path):
        base.validate()                                        # the base itself is fine
        for leaf in C.leaves(base):
            if "int" not in str(leaf.type) or "tuple" in str(leaf.type):
                continue
            name = leaf.path[-1]
            try:
                C.with_leaf(base, leaf.path, BILLION).validate()
            except InductionLabError as e:
                assert "\n" not in str(e), str(e)
                continue
            if name in NOT_COUNTS:
                used.add(name)
            else:
                accepted.append(f"{command}: {leaf.key} ({leaf.flag})")
    assert not accepted, "counts never size-checked (give them opt(size=...)): " + "; ".join(accepted)
    assert used == set(NOT_COUNTS), f"stale NOT_COUNTS entries: {set(NOT_COUNTS) - used}"


@pytest.mark.parametrize("value, refused_", [(BILLION, True), (1000, False)])
def test_the_check_is_the_quarter_of_memory(memory, value, refused_):
    """The need is value x bytes per unit; refused above a quarter of memory (worked out: 10^9 zero-shot prompts x
    15 tasks x 8 tokens x 16 bytes = 1.92e12 bytes > 16 GiB; 1,000 of them = 1.9 MB)."""
    from inductionlab.protocols.configs import FVScoreConfig

    cfg = FVScoreConfig(zero_shot_prompts=value)
    if refused_:
        with pytest.raises(InductionLabError, match=r"--fv-zero-shot-prompts 1,000,000,000: .* 1788\.1 GiB, more "
                                                    r"than a quarter of this machine's 64 GiB; lower"):
            cfg.validate()
    else:
        cfg.validate()


def _digest(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}



MISSING_MODEL = "/nonexistent/model"       # a count refused first: the model is never looked at
TEXT = "text.txt"                          # written in the test's folder: no demo corpus needed

CLI_CASES = [
    (["study", "head-types", MISSING_MODEL, "--fv-zero-shot-prompts", BILLION], "--fv-zero-shot-prompts"),
    (["study", "head-types", MISSING_MODEL, "--probe-prompts", BILLION], "--probe-prompts"),
    (["study", "head-types", MISSING_MODEL, "--fv-prompts", BILLION], "--fv-prompts"),
    (["study", "head-types", MISSING_MODEL, "--route-prompts", BILLION], "--route-prompts"),
    (["study", "head-types", MISSING_MODEL, "--cmr", "--cmr-runs", BILLION], "--cmr-runs"),
    (["study", "routes", MISSING_MODEL, "--rankings", "induction", "--copy-items", BILLION], "--copy-items"),
    (["study", "routes", MISSING_MODEL, "--rankings", "induction", "--copy-lists", BILLION], "--copy-lists"),
    (["analyze", "--model", MISSING_MODEL, "--list-length", BILLION], "--list-length"),
    (["telemetry", "run", "--head-types", "--head-types-batch", BILLION], "--head-types-batch"),
    (["telemetry", "run", "--head-types", "--head-types-cmr-runs", BILLION], "--head-types-cmr-runs"),
    (["telemetry", "run", "--head-types", "--head-types-seq-len", BILLION], "--head-types-seq-len"),
    (["train", "--data", "shards", "--tokens", 655360, "--telemetry-batch", BILLION], "--telemetry-batch"),
    (["train", "--data", "shards", "--tokens", 655360, "--log-checkpoints", BILLION], "--log-checkpoints"),
]


@pytest.mark.parametrize("args, flag", CLI_CASES, ids=[c[1] for c in CLI_CASES])
@pytest.mark.parametrize("out", ["absent", "victim"])
def test_cli_refuses_a_billion_before_the_model(args, flag, out, tmp_path, victim, memory, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / TEXT).write_text("some natural text\n")
    if args[0] == "study":
        args = [*args, "--icl-text", TEXT]
    target = tmp_path / "absent" if out == "absent" else victim
    before = _digest(victim)
    line = refused([*args, "--out", target], rf"{flag} 1,000,000,000: .* more than a quarter of this machine's",
                   tmp_path)
    assert "GiB" in line
    assert not (tmp_path / "absent").exists()
    assert _digest(victim) == before
