"""The study engine: one results header for every study, batch sizes decided by the probe alone, studies
found by their spec, and a study written as a spec and one Study value (a toy, defined in this module), resumable
pieces from the engine (Context.pieces)."""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, replace

import numpy as np
import pytest

from conftest import make_tiny
from inductionlab.config import opt
from inductionlab.core.ablation import Condition, ablation_conditions
from inductionlab.core.models import LoadedModel, attention_shape
from inductionlab.protocols import lag_probe
from inductionlab.protocols.lag_probe import LagProbeConfig
from inductionlab.protocols.serial_recall import SerialRecallConfig
from inductionlab.studies.configs import AblationConfig, HeadScoreConfig
from inductionlab.studies.engine import HEADER, Phase, StudyResult, run_study
from inductionlab.studies.run import Verdict
from inductionlab.studies.spec import RunOptions, Study, StudyPlan, StudySpec, specs

QUIET = RunOptions(progress=False)
LAG = LagProbeConfig(n_permutations=3, list_length=24, cue_position=12, cues="all:6")


@pytest.fixture
def tiny(word_tokenizer):
    model = make_tiny("llama", ctx=64)
    return LoadedModel(model, word_tokenizer, {"name": "tiny", "dtype": "float32", **attention_shape(model.config)})


def test_every_study_is_found_by_its_spec():
    found = {s.command: s for s in specs()}
    assert {"analyze", "evaluate", "study temporal", "study bi-induct", "study head-types"} <= set(found)
    assert {s.kind for s in found.values()} >= {"analyze", "evaluate", "study-temporal", "study-bi-induct",
                                               "study-head-types"}       # and any study added since
    for s in found.values():                       # the folder is the command's last word, snake case
        assert s.config.__module__ == f"inductionlab.studies.{s.command.split()[-1].replace('-', '_')}.config"


def test_every_spec_names_a_study_with_its_functions():
    """Each spec's Study loads (its study.py's STUDY), holds the four functions the engine calls, and has an
    ``estimate`` exactly when the spec gives the command ``--estimate``; a name that holds no Study is refused."""
    import inspect

    for s in specs():
        study = s.load()
        assert isinstance(study, Study), s.kind
        assert study is importlib.import_module(s.config.__module__.rpartition(".")[0] + ".study").STUDY
        for name, n_args in (("prepare", 2), ("phases", 2), ("result", 2), ("write", 2)):
            f = getattr(study, name)
            assert callable(f) and len(inspect.signature(f).parameters) >= n_args, (s.kind, name)
        assert (study.estimate is not None) == s.estimate, s.kind
        assert study.summary is None or callable(study.summary)
    with pytest.raises(TypeError, match="not a Study"):
        replace(TOY, study=f"{__name__}:ToyConfig").load()


def test_the_four_results_headers_have_one_shape(tiny, tmp_path):
    from inductionlab.studies.analyze import AnalyzeConfig, analyze
    from inductionlab.studies.bi_induct import run_bi_induct_study, tiny as tiny_preset
    from inductionlab.studies.evaluate import EvaluateConfig, InductionLossConfig, LoadBearingConfig, ProbeConfig, \
        run_evaluate
    from inductionlab.studies.temporal import TemporalStudyConfig, run_temporal_study
    from inductionlab.core.models import load_model
    from inductionlab.runtime.run_dir import final_checkpoint
    from test_train_helpers import make_corpus

    scores, ablation = HeadScoreConfig(seq_len=8, batch_size=2), AblationConfig(ks=(1,), n_draws=1)
    recs = {}
    analyze(tiny, AnalyzeConfig(top=2, scores=scores, ablation=ablation, lag=LAG), tmp_path / "a", QUIET)
    run_temporal_study(tiny, TemporalStudyConfig(scores=scores, ablation=ablation, lag=LAG, load_bearing_top=0,
                                                 recall=SerialRecallConfig(n_trials=2, list_length=4, n_shots=1)),
                       tmp_path / "t", QUIET)
    (tmp_path / "c").mkdir()
    shards = make_corpus(tmp_path / "c")
    run_bi_induct_study(replace(tiny_preset(), shards=str(shards), variants=("none",), seeds=1, evaluate=False),
                        tmp_path / "b", QUIET)
    trained = load_model(str(final_checkpoint(tmp_path / "b" / "runs" / "none-s0")), dtype="float32")  # BPE tokens
    run_evaluate(trained, EvaluateConfig(scores=scores, probes=ProbeConfig(tasks=("copy",), shots=(1,), n_prompts=2),
                                         induction=InductionLossConfig(seq_len=8, n_sequences=2),
                                         load_bearing=LoadBearingConfig(ablate=("top-1",), n_draws=1, shots=1)),
                 tmp_path / "e", QUIET)
    for k in "ateb":
        recs[k] = json.loads((tmp_path / k / "results.json").read_text())
    shapes = {k: [(key, type(r[key]).__name__) for key in list(r)[:len(HEADER)]] for k, r in recs.items()}
    assert shapes["a"] == shapes["t"] == shapes["e"] == shapes["b"]
    assert [key for key, _ in shapes["a"]] == list(HEADER)
    assert [r["kind"] for r in recs.values()] == ["analyze", "study-temporal", "evaluate", "study-bi-induct"]
    assert recs["a"]["model"]["name"] == recs["t"]["model"]["name"] == "tiny"
    assert recs["b"]["model"]["name"] == "cpu-micro" and recs["e"]["model"]["source"] == "checkpoint"


def test_analyze_and_temporal_size_an_all_cue_lag_batch_the_same_way(tiny, tmp_path, monkeypatch):
    """The probe alone decides its batch size: both studies ask the same question of free memory."""
    from inductionlab.studies.analyze import AnalyzeConfig, analyze
    from inductionlab.studies.temporal import TemporalStudyConfig, run_temporal_study

    asked = []

    def fake_auto(loaded, seq_len, logit_positions=1, cap=64):
        asked.append((seq_len, logit_positions))
        return 2
    monkeypatch.setattr(lag_probe, "auto_batch_size", fake_auto)
    scores, ablation = HeadScoreConfig(seq_len=8, batch_size=2), AblationConfig(ks=(1,), n_draws=1)
    analyze(tiny, AnalyzeConfig(top=2, scores=scores, ablation=ablation, lag=LAG), tmp_path / "a", QUIET)
    from_analyze, asked[:] = list(asked), []
    run_temporal_study(tiny, TemporalStudyConfig(scores=scores, ablation=ablation, lag=LAG, load_bearing_top=0,
                                                 recall=SerialRecallConfig(n_trials=2, list_length=4, n_shots=1)),
                       tmp_path / "t", QUIET)
    # word tokenizer: BOS + 24 one-token words, each cue one token; cues 1, 7, 13, 19 and the seed cue 12 in one chunk:
    # the packed forward holds 25 + 5 tokens and reads 5 logit rows (the seed trial would be 26 tokens, 1 row)
    assert from_analyze and set(from_analyze) == set(asked) == {(25 + 5, 5)}


# ---- a toy study: a spec and a Study value (no command-line code) ----------------------------------

@dataclass
class ToyConfig:
    seed: int = opt(0, "Seed of trials and scores.")
    k: int = opt(2, "Induction heads ablated.")

    def validate(self) -> None:
        pass


TOY = StudySpec("study toy", ToyConfig, "A toy: lag +1 intact and with the top-k induction heads ablated.",
                study=f"{__name__}:STUDY")


@dataclass(kw_only=True)
class ToyResult(StudyResult):
    drop: float


@dataclass(kw_only=True)
class ToyPlan(StudyPlan):
    cfg: ToyConfig


def prepare(loaded, cfg: ToyConfig) -> ToyPlan:
    return ToyPlan(cfg=cfg, params={"k": cfg.k, "seed": cfg.seed})


def phases(plan, ctx):
    scores = ctx.head_scores(HeadScoreConfig(seq_len=8, batch_size=2), seed=plan.cfg.seed)
    conditions = ablation_conditions(scores["induction"], [plan.cfg.k], n_draws=0)     # intact, induction-k
    probe = lag_probe.probe(replace(LAG, seed=plan.cfg.seed))
    return ctx.measure(Phase("lag", probe, conditions, LAG.n_permutations))["lag"]


def result(plan, lag) -> ToyResult:
    col = LAG.cue_position                               # lag +1
    p = {name: float(np.mean(a["probs"][:, col])) for name, a in lag.arrays.items()}
    drop = p["intact"] - p[f"induction-{plan.cfg.k}"]
    verdict = Verdict("A", "reproduced" if drop > 0 else "not reproduced", "drop > 0", f"drop {drop:+.4f}")
    return ToyResult(drop=drop, verdicts=[verdict], record={"lag_plus1": p})


def write(out, res) -> None:
    (out / "report.md").write_text(f"drop {res.drop:+.4f}\n")


STUDY = Study(prepare, phases, result, write)


def test_a_toy_study_is_a_spec_and_a_study_value(tiny, tmp_path):
    res = run_study(TOY, tiny, ToyConfig(), tmp_path / "toy", QUIET)
    rec = json.loads((tmp_path / "toy" / "results.json").read_text())
    assert list(rec)[:len(HEADER)] == list(HEADER) and rec["kind"] == "study-toy"
    assert rec["params"]["k"] == 2 and rec["lag_plus1"]["intact"] - rec["lag_plus1"]["induction-2"] == res.drop
    assert res.drop != 0                                   # the ablation reached the model
    assert (tmp_path / "toy" / "report.md").read_text().startswith("drop ")
    again = run_study(TOY, tiny, ToyConfig(), tmp_path / "toy", QUIET)          # resumed: pieces loaded
    assert again.record["resumed"] and again.drop == res.drop


def test_a_condition_without_heads_is_refused_before_any_forward(tiny, tmp_path):
    """The trap of a positional head list: Condition(name, kind, k, heads) puts the heads in ``draw``."""
    with pytest.raises(TypeError, match="draw must be an integer.*heads by keyword"):
        Condition("induction-1", "induction", 1, [(0, 1)])
    from inductionlab.errors import InductionLabError

    with pytest.raises(InductionLabError, match="'induction-1' .induction. ablates no head"):
        lag_probe.probe(LAG).run(tiny, [Condition("intact", "intact"), Condition("induction-1", "induction", 1)])


def test_a_phase_logs_its_estimated_time_after_the_first_batch(tiny, tmp_path):
    """One line, after the first batch: that batch's trials and seconds, and the estimate for every pending trial
    (here 2 conditions x 3 trials in batches of 2); a resumed run (nothing pending) logs none."""
    import re

    lines: list[str] = []
    cfg = ToyConfig()
    spec = StudySpec("study toy", ToyConfig, "toy", study=f"{__name__}:STUDY")
    global LAG
    saved, LAG = LAG, replace(LAG, batch_size=2)
    try:
        run_study(spec, tiny, cfg, tmp_path / "toy", RunOptions(progress=False, log=lines.append))
        est = [ln for ln in lines if "estimated" in ln]
        assert len(est) == 1, lines
        m = re.fullmatch(r"lag probe: first batch of (\d+) trials in ([\d.]+) s; estimated (\d+) trials ≈ .*", est[0])
        assert m and int(m[1]) == 2 and int(m[3]) == 2 * 3, est[0]
        lines.clear()
        run_study(spec, tiny, cfg, tmp_path / "toy", RunOptions(progress=False, log=lines.append))
        assert not [ln for ln in lines if "estimated" in ln]
    finally:
        LAG = saved


# ---- Context.pieces: one resumable piece per item, one bar, one timing --------------------------------

@dataclass
class CountConfig:
    n: int = opt(4, "Items.")

    def validate(self) -> None:
        pass


CALLS: list[str] = []


def _count_phases(plan, ctx):
    """Item ``i<j>`` is ``x = [0, 0.5, ..., j / 2]`` (j + 1 units on the bar) and the JSON ``{"item", "square": j²}``."""
    items = [f"i{j}" for j in range(plan.params["n"])]

    def compute(item, progress):
        CALLS.append(item)
        j = int(item[1:])
        progress(j + 1)
        return {"x": np.arange(j + 1, dtype=np.float64) / 2}
    arrays = ctx.pieces("items", items, compute, desc="items", unit="unit", total=lambda i: int(i[1:]) + 1)
    docs = ctx.pieces("docs", items, lambda item, _: {"item": item, "square": int(item[1:]) ** 2}, json=True)
    return arrays, docs


def _count_result(plan, pieces) -> StudyResult:
    arrays, docs = pieces
    return StudyResult(record={"sums": {k: float(v["x"].sum()) for k, v in arrays.items()}, "docs": docs})


COUNT_STUDY = Study(lambda loaded, cfg: StudyPlan(params={"n": cfg.n}), _count_phases, _count_result,
                    lambda out, res: None)
COUNT = StudySpec("study count", CountConfig, "count", model=None, study=f"{__name__}:COUNT_STUDY")


def test_pieces_resume_after_an_interruption_computing_only_the_rest(tmp_path, monkeypatch):
    """Killed after the second item's piece: the rerun loads items 0-1 (never computed again), computes 2-3, its
    bar counts only their units (3 + 4), and each step has one timing; the values are those of the definition."""
    from inductionlab.studies import engine

    bars = []

    class Bar:                                       # tqdm's part the engine uses, recording total and updates
        def __init__(self, total, desc, unit, disable):
            self.total, self.desc, self.done = total, desc, 0
            bars.append(self)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, n):
            self.done += n
    monkeypatch.setattr(engine, "tqdm", Bar)

    class Killed(Exception):
        pass

    def kill(key):
        if key == "items/i1":
            raise Killed
    CALLS.clear()
    with pytest.raises(Killed):
        run_study(COUNT, None, CountConfig(), tmp_path / "c", RunOptions(progress=False, on_checkpoint=kill))
    assert CALLS == ["i0", "i1"]
    assert sorted(p.name for p in (tmp_path / "c" / "checkpoints" / "items").iterdir()) == ["i0.npz", "i1.npz"]
    assert bars[0].desc == "items" and bars[0].total == 1 + 2 + 3 + 4
    CALLS.clear()
    bars.clear()
    res = run_study(COUNT, None, CountConfig(), tmp_path / "c", QUIET)
    assert CALLS == ["i2", "i3"] and res.record["resumed"]
    assert res.record["sums"] == {"i0": 0.0, "i1": 0.5, "i2": 1.5, "i3": 3.0}
    assert res.record["docs"] == {f"i{j}": {"item": f"i{j}", "square": j * j} for j in range(4)}
    items_bar = next(b for b in bars if b.desc == "items")
    assert items_bar.total == items_bar.done == 3 + 4
    assert next(b for b in bars if b.desc == "").total == 4          # JSON pieces: one unit per item, no label
    assert [k for k in res.timings if k not in ("write_s", "total_s")] == ["items_s", "docs_s"]
    CALLS.clear()
    again = run_study(COUNT, None, CountConfig(), tmp_path / "c", QUIET)      # everything loaded
    assert CALLS == [] and again.record["sums"] == res.record["sums"] and again.record["docs"] == res.record["docs"]


def test_studies_go_through_the_context():
    """No study module imports tqdm or reads the run directory (``ctx.run``, the engine's caches): every loop,
    bar, timing and piece goes through Context; no study.py re-exports for the engine (``# noqa: F401``)."""
    from pathlib import Path

    import inductionlab.studies as S

    root = Path(S.__file__).parent
    folders = [p for p in root.iterdir() if (p / "config.py").is_file()]
    assert len(folders) >= 6
    for f in folders:
        for py in f.glob("*.py"):
            text = py.read_text()
            assert "tqdm" not in text and "ctx.run" not in text and "ctx._" not in text, py
        assert "noqa: F401" not in (f / "study.py").read_text(), f
