"""Issue 18, kinds 5, 8 and 9: numbers checked before anything is written (NaN, infinities,
beyond 64 bits, negative, absurdly large), conflicting options refused with one line, and the
Python API's types (a Path is a path; None, a bare model or a dict where a LoadedModel or a
config belongs: TypeError; empty conditions or heads: refused).

CLI cases use :func:`test_bad_inputs.refused` (exit 2, one ``error:`` line, nothing written);
the numeric-type cases are generated from the click command tree, so a new option joins them.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
import re

import click
import pytest
import torch

from inductionlab.core.ablation import Condition
from inductionlab.cli import main
from inductionlab.cli.generate import LeafType
from inductionlab.cli.options import _Number
from inductionlab.errors import InductionLabError
from test_bad_inputs import _args, corpus, model_dir, refused  # noqa: F401  (fixtures)
from test_cli_train_data import _fake_run
from test_train_helpers import tiny_flags


def _commands(group=main, path=()):
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*path, name))
        else:
            yield " ".join((*path, name)), cmd


COMMANDS = dict(_commands())


def _numeric(cmd) -> list[tuple[str, str]]:
    """(flag, "integer" | "float") of every numeric option of a command."""
    return [(p.opts[0], "float" if isinstance(p.type, click.types.FloatParamType) or getattr(p.type, "kind", None)
             is float or p.type.name == "float" else "integer") for p in cmd.params
            if isinstance(p.type, (click.types.IntParamType, click.types.FloatParamType, _Number))
            or isinstance(p.type, LeafType) and p.type.name in ("integer", "float")]


def _base(command: str, tmp_path, model, corpus) -> list:
    """A fast, valid argument list of ``command`` writing under tmp_path/out."""
    out = tmp_path / "out"
    if command in ("analyze", "study temporal", "evaluate"):
        return _args(command, model, out)
    return {
        "study head-types": ["study", "head-types", model, "--out", out, "--quiet"],
        "study routes": ["study", "routes", model, "--rankings", "induction", "--out", out, "--quiet"],
        "study bi-induct": ["study", "bi-induct", "--preset", "tiny", "--shards", corpus, "--out", out, "--quiet"],
        "train": ["train", *tiny_flags(corpus, out)],
        "curriculum preview": ["curriculum", "preview", corpus, "--seq-len", "64", "--batch-size", "2"],
        "corpus prepare": ["corpus", "prepare", corpus.parent / "corpus.txt", "--out", out, "--vocab-size", "300"],
        "telemetry": ["telemetry", tmp_path / "run", "--out", out],
    }[command]


NUMERIC = [(c, flag, kind) for c, cmd in COMMANDS.items() for flag, kind in _numeric(cmd)]


def test_every_numeric_option_uses_the_checked_type():
    """A plain ``type=int`` / ``type=float`` (or an int default, which click types as INT) would
    let NaN, infinities and 2**70 through to a traceback."""
    plain = [f"{c} {p.opts[0]}" for c, cmd in COMMANDS.items() for p in cmd.params
             if isinstance(p.type, (click.types.IntParamType, click.types.FloatParamType))]
    assert not plain, plain
    assert len(NUMERIC) > 60        # analyze, study temporal/bi-induct, evaluate, train, corpus, curriculum, telemetry


@pytest.mark.parametrize("command, flag, kind", NUMERIC, ids=[f"{c}:{f}" for c, f, _ in NUMERIC])
def test_numbers_of_every_option(tmp_path, model_dir, corpus, command, flag, kind):
    """Every numeric option of every command: NaN / ±inf (floats) and 2**70 (integers) refused
    at parse time, naming the option; nothing written."""
    if command == "telemetry":
        _fake_run(tmp_path / "run")
    base = _base(command, tmp_path, model_dir, corpus)
    if kind == "float":
        for v in ("nan", "inf", "-inf"):
            refused([*base, flag, v], rf"{re.escape(flag)} must be a finite number", tmp_path)
    else:
        refused([*base, flag, str(2 ** 70)], rf"{re.escape(flag)} .*64-bit", tmp_path)
        refused([*base, flag, "1.5"], "not a valid integer", tmp_path)


# ranges proper: negative, and absurdly large (the limit said in the message)
RANGES = [
    ("evaluate", ["--seed", "-1"], "--seed -1 must be between 0 and 2\\*\\*63 - 1"),
    ("evaluate", ["--draws", "1000000000"], "--draws 1,000,000,000: at most 1,000"),
    ("evaluate", ["--prompts", "1000000000"], "--prompts 1,000,000,000: .* GiB"),
    ("evaluate", ["--icl-sequences", str(10 ** 12)], "--icl-sequences .* GiB"),
    ("evaluate", ["--induction-seq-len", str(10 ** 12)], "--induction-seq-len .* GiB"),
    ("evaluate", ["--score-batch-size", str(10 ** 12)], "--score-batch-size .* GiB"),
    ("evaluate", ["--score-seq-len", str(10 ** 12)], "GiB"),
    ("analyze", ["--n-draws", "1000000000"], "--n-draws 1,000,000,000: at most 1,000"),
    ("study temporal", ["--n-draws", "1000000000"], "--n-draws 1,000,000,000: at most 1,000"),
    ("study temporal", ["--load-bearing-top", "1000000000"], "--load-bearing-top 1,000,000,000 exceeds the model's 8"),
    ("study bi-induct", ["--budget", "nan"], "'nan' is not a valid integer"),
    ("study bi-induct", ["--budget", "1e300"], "64-bit"),
    ("study bi-induct", ["--budget", "-5"], "--budget"),
    ("study bi-induct", ["--seeds", "1000000000"], "--seeds 1,000,000,000: at most 1000"),
    ("study bi-induct", ["--jobs", "1000000000"], f"this machine has {os.cpu_count()} CPUs"),
    ("study bi-induct", ["--nproc", "1000000"], f"this machine has {os.cpu_count()} CPUs"),
    ("curriculum preview", ["--m0", "inf"], "--m0 must be a finite number"),
    ("curriculum preview", ["--seed", "-1"], "seed must be >= 0"),
    ("corpus prepare", ["--heldout-fraction", "inf"], "--heldout-fraction must be a finite number"),
    ("train", ["--warmup-frac", "nan"], "--warmup-frac must be a finite number"),
    ("train", ["--seed", "-1"], "--seed must be >= 0"),
    ("telemetry", ["--threshold", "-inf"], "--threshold must be a finite number"),
]


@pytest.mark.parametrize("command, extra, pattern", RANGES, ids=[f"{c}:{' '.join(a)}" for c, a, _ in RANGES])
def test_numeric_ranges(tmp_path, model_dir, corpus, command, extra, pattern):
    if command == "telemetry":
        _fake_run(tmp_path / "run")
    refused([*_base(command, tmp_path, model_dir, corpus), *extra], pattern, tmp_path)


def _configs():
    from inductionlab.studies.analyze import AnalyzeConfig
    from inductionlab.studies.evaluate import EvaluateConfig, ICLScoreConfig, LoadBearingConfig, ProbeConfig
    from inductionlab.protocols.lag_probe import LagProbeConfig
    from inductionlab.protocols.serial_recall import SerialRecallConfig
    from inductionlab.studies.configs import AblationConfig
    from inductionlab.studies.temporal import TemporalStudyConfig

    return [
        (LagProbeConfig(n_permutations=2 ** 70), InductionLabError, "--n-permutations .*64-bit"),
        (LagProbeConfig(n_permutations=3.5), TypeError, "--n-permutations must be an integer"),
        (LagProbeConfig(far_lag="20"), TypeError, "--far-lag must be an integer"),
        (SerialRecallConfig(n_trials=True), TypeError, "--recall-trials must be an integer"),
        (AnalyzeConfig(ablation=AblationConfig(n_draws=10 ** 9)), InductionLabError, "at most 1,000"),
        (AnalyzeConfig(ablation=AblationConfig(ks=(5, 2 ** 64))), InductionLabError, "--ks .*64-bit"),
        (AnalyzeConfig(lag={"n_permutations": 3}), TypeError, "AnalyzeConfig.lag must be a LagProbeConfig"),
        (TemporalStudyConfig(ablation=AblationConfig(n_draws=5000)), InductionLabError, "at most 1,000"),
        (TemporalStudyConfig(recall={}), TypeError, "TemporalStudyConfig.recall must be a SerialRecallConfig"),
        (EvaluateConfig(seed=-1), InductionLabError, "--seed -1"),
        (EvaluateConfig(seed=2 ** 63), InductionLabError, "--seed"),
        (EvaluateConfig(load_bearing=LoadBearingConfig(n_draws=10 ** 6)), InductionLabError, "--draws .* at most"),
        (EvaluateConfig(probes=ProbeConfig(n_prompts=10 ** 9)), InductionLabError, "--prompts .* GiB"),
        (EvaluateConfig(icl=ICLScoreConfig(n_sequences=float("nan"))), TypeError, "--icl-sequences"),
        (EvaluateConfig(probes={"n_prompts": 3}), TypeError, "EvaluateConfig.probes must be a ProbeConfig"),
    ]


@pytest.mark.parametrize("i", range(15))
def test_configs_refuse_the_same_numbers(i):
    """The Python API: each config's validate() refuses the numbers the CLI refuses."""
    cfg, exc, pattern = _configs()[i]
    with pytest.raises(exc, match=re.compile(pattern, re.I)):
        cfg.validate()


def test_bi_induct_config_refuses_numbers(corpus):
    from dataclasses import replace

    from inductionlab.studies.bi_induct import tiny

    for kw, pattern in ((dict(budget=2 ** 70), "64-bit"), (dict(budget=-1), "--budget"),
                        (dict(seeds=10 ** 6), "at most 1000"), (dict(jobs=10 ** 6), "CPUs")):
        with pytest.raises(InductionLabError, match=pattern):
            replace(tiny(), shards=str(corpus), **kw).validate()


# -- kind 8: conflicting options refused with one line -------------------------------------------

CONFLICTS = [
    (c, extra, "--device and --device-map conflict")
    for c in ("analyze", "study temporal", "evaluate")
    for extra in (["--device", "cuda", "--device-map", "auto"], ["--device", "cpu", "--device-map", "auto"])
] + [
    ("study temporal", ["--load-bearing-top", "0", "--load-bearing-permutations", "2"],
     "--load-bearing-permutations 2 has no effect with --load-bearing-top 0"),
    ("evaluate", ["--lm-eval-limit", "5"], "--lm-eval-limit has no effect without --lm-eval-tasks"),
    ("evaluate", ["--lm-eval-fewshot", "1"], "--lm-eval-fewshot has no effect without --lm-eval-tasks"),
    ("study bi-induct", ["--estimate", "--partial"], "--partial and --estimate conflict"),
    ("study bi-induct", ["--estimate", "--overwrite"], "--overwrite and --estimate conflict"),
    ("study bi-induct", ["--partial", "--overwrite"], "--partial and --overwrite conflict"),
    ("train", ["--print-config", "--overwrite"], "--overwrite and --print-config conflict"),
    ("corpus prepare", ["--no-shuffle", "--seed", "3"], "--seed orders the shuffled documents"),
    ("train", ["--span-range", "4,8"], "--span-length and --span-range conflict"),   # tiny_flags sets --span-length
    ("curriculum preview", ["--span-length", "4", "--span-range", "4,8"], "--span-length and --span-range conflict"),
]


@pytest.mark.parametrize("command, extra, pattern", CONFLICTS, ids=[f"{c}:{' '.join(a)}" for c, a, _ in CONFLICTS])
def test_conflicting_options(tmp_path, model_dir, corpus, command, extra, pattern):
    refused([*_base(command, tmp_path, model_dir, corpus), *extra], pattern, tmp_path)


def test_evaluate_model_named_twice(tmp_path, model_dir):
    refused(["evaluate", model_dir, "--model", "smollm2-135m", "--out", tmp_path / "out", "--prompts", "2"],
            "the model is named twice: MODEL .* and --model 'smollm2-135m'", tmp_path)


def test_corpus_prepare_vocab_size_with_a_given_tokenizer(tmp_path, model_dir, corpus):
    refused(["corpus", "prepare", corpus.parent / "corpus.txt", "--out", tmp_path / "out", "--tokenizer", model_dir,
             "--vocab-size", "300"], "--vocab-size sizes the BPE .* drop --vocab-size", tmp_path)


def test_load_model_refuses_device_beside_device_map(model_dir):
    from inductionlab.core.models import load_model

    with pytest.raises(InductionLabError, match="device 'cuda:1' and device_map 'auto' conflict"):
        load_model(str(model_dir), device="cuda:1", device_map="auto")


# -- kind 9: the Python API's types, checked once at each entry point ------------------------------

@pytest.fixture(scope="module")
def loaded(model_dir):
    from inductionlab.core.models import load_model

    return load_model(pathlib.Path(model_dir))        # a Path is a path


def test_load_model_takes_a_path(loaded, model_dir):
    assert loaded.identity["path"] == str(pathlib.Path(model_dir)) or pathlib.Path(loaded.identity["path"]) == \
        pathlib.Path(model_dir)
    assert loaded.identity["n_layers"] == 2 and loaded.identity["n_heads"] == 4


@pytest.mark.parametrize("spec", [None, 3, b"smollm2-135m"])
def test_load_model_refuses_a_non_path(spec):
    from inductionlab.core.models import load_model

    with pytest.raises(TypeError, match="load_model: spec must be a str or a path"):
        load_model(spec)


def _small_lag():
    from inductionlab.protocols.lag_probe import LagProbeConfig

    return LagProbeConfig(n_permutations=2, list_length=20, cue_position=10, batch_size=2)


def test_run_lag_probe_types(loaded):
    from inductionlab.protocols.lag_probe import run_lag_probe

    intact = [Condition("intact", "intact")]
    with pytest.raises(TypeError, match="run_lag_probe: loaded must be a LoadedModel.*load_model"):
        run_lag_probe(None, intact, _small_lag())
    with pytest.raises(TypeError, match="bare model"):
        run_lag_probe(loaded.model, intact, _small_lag())
    with pytest.raises(TypeError, match=r"cfg must be a LagProbeConfig, got dict; build one with "
                                        r"inductionlab.config.from_dict\(LagProbeConfig, your_dict\)"):
        run_lag_probe(loaded, intact, dataclasses.asdict(_small_lag()))
    with pytest.raises(InductionLabError, match="conditions is empty"):
        run_lag_probe(loaded, [], _small_lag())
    with pytest.raises(TypeError, match="conditions must be a list of Condition"):
        run_lag_probe(loaded, intact[0], _small_lag())
    with pytest.raises(TypeError, match="each condition must be a Condition, got dict"):
        run_lag_probe(loaded, [{"name": "intact"}], _small_lag())
    res = run_lag_probe(loaded, intact, _small_lag())        # the intact condition (no heads) still runs
    assert res.probs["intact"].shape == (2, 20)


def test_run_serial_recall_types(loaded):
    from inductionlab.protocols.serial_recall import SerialRecallConfig, run_serial_recall

    with pytest.raises(TypeError, match="run_serial_recall: loaded"):
        run_serial_recall(None, [Condition("intact", "intact")])
    with pytest.raises(TypeError, match="SerialRecallConfig"):
        run_serial_recall(loaded, [Condition("intact", "intact")], {"n_trials": 2})
    with pytest.raises(InductionLabError, match="conditions is empty"):
        run_serial_recall(loaded, [], SerialRecallConfig(n_trials=2, list_length=3, n_shots=1))


def test_study_entry_points_types(tmp_path, loaded):
    from inductionlab.studies.analyze import AnalyzeConfig, analyze
    from inductionlab.studies.evaluate import EvaluateConfig, run_evaluate
    from inductionlab.studies.temporal import TemporalStudyConfig, run_temporal_study

    out = tmp_path / "out"
    for fn, cfg, name in ((analyze, AnalyzeConfig(), "AnalyzeConfig"),
                          (run_temporal_study, TemporalStudyConfig(), "TemporalStudyConfig"),
                          (run_evaluate, EvaluateConfig(), "EvaluateConfig")):
        with pytest.raises(TypeError, match="loaded must be a LoadedModel"):
            fn(None, cfg, out)
        with pytest.raises(TypeError, match=f"cfg must be a {name}, got dict"):
            fn(loaded, dataclasses.asdict(cfg), out)
    assert list(tmp_path.iterdir()) == []


def test_ablate_refuses_no_heads(loaded):
    from inductionlab.core.instrument import ablate

    ids = torch.tensor([[1, 5, 6, 7]])
    with pytest.raises(InductionLabError, match="heads is empty.*without ablate\\(\\) for the intact model"):
        with ablate(loaded.model, []):
            pass
    with pytest.raises(InductionLabError, match="heads is empty"):
        with ablate(loaded, iter(())):
            pass
    with pytest.raises(TypeError, match="expected a transformers model"):
        with ablate(None, [(0, 0)]):
            pass
    with torch.no_grad():
        plain = loaded.model(ids).logits
        with ablate(loaded.model, [(0, 0)]):     # one head: changes the output, as before
            ablated = loaded.model(ids).logits
    assert not torch.equal(plain, ablated)


def test_run_conditions_intact_and_empty(loaded):
    """The protocol runner's intact condition (no heads) does not call ablate(); an empty
    condition list is refused."""
    from inductionlab.protocols.runner import run_conditions

    ids = torch.tensor([[1, 5, 6, 7, 8], [1, 9, 10, 11, 12]])

    def last(model, batch):
        return {"logits": model(batch["ids"]).logits[:, -1].float()}

    out = run_conditions(loaded, [Condition("intact", "intact"), Condition("L0H0", "induction", 1, 0, [(0, 0)])],
                         {"ids": ids}, batch_size=2, measure_batch=last, reuse=False)
    with torch.no_grad():
        ref = loaded.model(ids).logits[:, -1].float().numpy()
    assert math.isclose(float(abs(out["intact"]["logits"] - ref).max()), 0.0, abs_tol=1e-5)
    assert float(abs(out["L0H0"]["logits"] - ref).max()) > 1e-4
    with pytest.raises(InductionLabError, match="run_conditions: conditions is empty"):
        run_conditions(loaded, [], {"ids": ids}, measure_batch=last)
    with pytest.raises(TypeError, match="run_conditions: loaded"):
        run_conditions(None, [Condition("intact", "intact")], {"ids": ids}, measure_batch=last)


def _call_with_none(name):
    import inductionlab as il
    from inductionlab.core.instrument import instrument

    intact = [Condition("intact", "intact")]
    calls = {
        "load_model": lambda: il.load_model(None),
        "instrument": lambda: instrument(None).__enter__(),   # il.instrument is the module once it is imported
        "ablate": lambda: il.ablate(None, [(0, 0)]).__enter__(),
        "compute_head_scores": lambda: il.compute_head_scores(None),
        "attention_patterns": lambda: il.attention_patterns(None, [1, 2], [(0, 0)]),
        "induction_sequence": lambda: il.induction_sequence(None),
        "ablation_conditions": lambda: il.ablation_conditions(None, [1]),
        "top_k_heads": lambda: il.top_k_heads(None, 1),
        "per_layer_top_p": lambda: il.per_layer_top_p(None, 0.5),
        "run_lag_probe": lambda: il.run_lag_probe(None, intact),
        "run_serial_recall": lambda: il.run_serial_recall(None, intact),
        "run_conditions": lambda: il.run_conditions(None, intact, {"ids": torch.zeros(1, 2, dtype=torch.long)},
                                                    measure_batch=lambda m, b: {}),
        "run_temporal_study": lambda: il.run_temporal_study(None, il.TemporalStudyConfig(), "never"),
        "mean_ci": lambda: il.mean_ci(None),
    }
    return calls[name]


@pytest.mark.parametrize("name", ["load_model", "instrument", "ablate", "compute_head_scores", "attention_patterns",
                                  "induction_sequence", "ablation_conditions",
                                  "top_k_heads", "per_layer_top_p", "run_lag_probe", "run_serial_recall",
                                  "run_conditions", "run_temporal_study", "mean_ci"])
def test_public_entry_points_refuse_none(name, tmp_path, monkeypatch):
    """Every public function of inductionlab/__init__.py that takes a model, a loaded model, scores
    or values: None gives a TypeError that names what is expected (not an AttributeError deep inside)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError) as e:
        _call_with_none(name)()
    assert "NoneType' object" not in str(e.value) and re.search(
        r"must be|expected|needs", str(e.value)), str(e.value)
    assert list(tmp_path.iterdir()) == []


def test_training_entry_points_refuse_a_dict(tmp_path, corpus):
    from inductionlab.studies.bi_induct import BiInductStudyConfig, run_bi_induct_study
    from inductionlab.train import TrainConfig, train

    with pytest.raises(TypeError, match=r"train: cfg must be a TrainConfig, got dict; build one with .*config_from_dict"):
        train(dataclasses.asdict(TrainConfig(data=str(corpus), out=str(tmp_path / "t"))))
    with pytest.raises(TypeError, match="study-bi-induct: cfg must be a BiInductStudyConfig, got dict; build one with "
                                        "inductionlab.config.from_dict"):
        run_bi_induct_study({"preset": "tiny", "shards": str(corpus)}, tmp_path / "s")
    assert list(tmp_path.iterdir()) == []
