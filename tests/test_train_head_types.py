"""Head types over training (`inductionlab telemetry --head-types`, the study `telemetry`): a sweep equals
per-checkpoint measures bit for bit, a sweep killed midway resumes to the same results, a too-small word pool is
recorded rather than fatal, and the transition table, CMR-like share and induction concentration on hand-made
tables."""

from __future__ import annotations

import contextlib
import json
import math

import pandas as pd
import pytest
from click.testing import CliRunner

from inductionlab.cli import main
from inductionlab.protocols.training_head_types import (HeadTypeParams, cmr_share, compare_runs, concentration,
                                                        measure_checkpoint, transition_table)
from inductionlab.studies.telemetry.study import RunProbe, sweep_rows, training_pool
from test_train_helpers import tiny_trained_run

FAST = dict(seq_len=12, batch_size=2, n_words=4, n_attention=4, word_pool=2000, n_exps=1, n_starts=2)
FLAGS = ["--head-types", "--head-types-seq-len", "12", "--head-types-batch", "2", "--head-types-words", "4",
         "--head-types-attention-prompts", "4", "--head-types-word-pool", "2000", "--head-types-cmr-runs", "1",
         "--head-types-cmr-starts", "2"]                 # FAST as options
SWEPT = [*FLAGS, "--concept-threshold", "0.1"]        # the module's sweep (the `swept` fixture)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return tiny_trained_run(tmp_path_factory.mktemp("ht"))[1]


def _cache_dir(tmp_path_factory) -> str:               # the CMR grid is cached here, not in the user's cache
    return str(tmp_path_factory.getbasetemp() / "cache")


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", _cache_dir(tmp_path_factory))


@contextlib.contextmanager
def one_thread():
    """One torch thread, as a process under OMP_NUM_THREADS=1: float sums in the same order in this process and
    in a subprocess, so their scores are bit-equal."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def swept(run, tmp_path_factory):
    """``telemetry RUN --out OUT SWEPT`` on one torch thread, uninterrupted: OUT."""
    out = tmp_path_factory.mktemp("swept") / "tel"
    with pytest.MonkeyPatch.context() as mp, one_thread():
        mp.setenv("XDG_CACHE_HOME", _cache_dir(tmp_path_factory))
        r = CliRunner().invoke(main, ["telemetry", str(run), "--out", str(out), *SWEPT])
    assert r.exit_code == 0, r.output
    return out


def _measured(run, p: HeadTypeParams, step: int) -> pd.DataFrame:
    """One checkpoint measured on its own: loaded here, random tokens from the run's training split."""
    from inductionlab.core.models import load_model
    from inductionlab.runtime.run_dir import TrainRun

    loaded = load_model(next(c.path for c in TrainRun(run).checkpoints() if c.step == step), dtype="float32")
    return measure_checkpoint(loaded.model, loaded.tokenizer, p, step=step,
                              pool=training_pool(run, loaded.tokenizer)[0])[0]


def test_sweep_over_two_checkpoints_equals_two_single_runs(run, swept):
    out = swept
    folder = out / "head_types"
    both = pd.read_csv(folder / "run_scores.csv")
    p = HeadTypeParams(**{**FAST, "concept_threshold": 0.1})
    with one_thread():
        single = pd.concat([_measured(run, p, s) for s in (0, 2)], ignore_index=True)
    assert sorted(set(both["step"])) == [0, 2]
    assert {"induction", "concept_copying", "token_copying", "cmr_distance", "crp_range"} <= set(both["score"])
    pd.testing.assert_frame_equal(both, single, check_exact=True)
    rec = json.loads((folder / "run_head_types.json").read_text())
    assert rec["params"]["concept_threshold"] == 0.1 and rec["params"]["n_words"] == 4
    assert rec["not_computed"] == {} and rec["steps"] == [0, 2]
    assert rec["thresholds"]["cmr_distance"] == {"value": 0.5, "crossed_when": "score < value"}
    for f in ("run_transitions.csv", "run_cmr_share.csv", "run_concentration.csv", "run_induction.png",
              "run_cmr_distance.png", "run_concept_copying.png", "run_token_copying.png"):
        assert (folder / f).is_file(), f
    conc = pd.read_csv(folder / "run_concentration.csv")
    assert conc["n_heads"].tolist() == [8, 8] and (conc["effective_heads"] <= 8 + 1e-9).all()
    rec = json.loads((out / "results.json").read_text())
    assert rec["kind"] == "telemetry" and "head_types" in rec["results"]["run"]
    assert sorted(p.name for p in (out / "checkpoints" / "head_types" / "run").iterdir()) == ["0.npz", "2.npz"]


KILLED_AFTER_FIRST_PIECE = """
import os, signal, sys
from inductionlab.protocols.configs import HeadTypeParams
from inductionlab.studies.spec import RunOptions
from inductionlab.studies.telemetry import TelemetryConfig, run_telemetry

cfg = TelemetryConfig(runs=(sys.argv[1],), head_types=HeadTypeParams(enabled=True, concept_threshold=0.1, **%r))
run_telemetry(cfg, sys.argv[2], RunOptions(progress=False, on_checkpoint=lambda key: os.kill(os.getpid(), signal.SIGKILL)))
"""


def _leaves(obj, path=()):
    """Every leaf of a JSON document as (path, value)."""
    if isinstance(obj, dict):
        return [x for k, v in obj.items() for x in _leaves(v, path + (k,))]
    if isinstance(obj, list):
        return [x for i, v in enumerate(obj) for x in _leaves(v, path + (i,))]
    return [(path, obj)]


def test_a_sweep_killed_midway_resumes_to_the_results_of_an_uninterrupted_one(run, swept, tmp_path):
    """SIGKILL right after the first checkpoint's piece is written (a subprocess); the same command again
    loads that piece, computes the second, and every leaf of results.json but the timings and ``resumed``
    equals an uninterrupted sweep's, as does every table. One torch thread everywhere, as in the killed process."""
    import os
    import subprocess
    import sys

    from inductionlab.studies.engine import HEADER

    killed = tmp_path / "killed"
    p = subprocess.run([sys.executable, "-c", KILLED_AFTER_FIRST_PIECE % FAST, str(run), str(killed)],
                       capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == -9, p.stderr
    first = killed / "checkpoints" / "head_types" / "run" / "0.npz"
    assert first.is_file() and not (killed / "checkpoints" / "head_types" / "run" / "2.npz").exists()
    assert not (killed / "results.json").exists()
    before = (first.read_bytes(), first.stat().st_mtime_ns)
    with one_thread():
        r = CliRunner().invoke(main, ["telemetry", str(run), "--out", str(killed), *SWEPT])
    assert r.exit_code == 0, r.output
    full = swept
    assert (first.read_bytes(), first.stat().st_mtime_ns) == before          # loaded, not computed again
    a, b = (json.loads((d / "results.json").read_text()) for d in (full, killed))
    assert list(a)[:len(HEADER)] == list(HEADER) and a["kind"] == "telemetry"
    assert (a["resumed"], b["resumed"]) == (False, True)
    same = lambda rec: [x for x in _leaves(rec) if x[0][0] not in ("timings", "resumed")]   # noqa: E731
    assert same(a) == same(b) and len(same(a)) > 100
    assert a["results"]["run"]["head_types"]["files"] == b["results"]["run"]["head_types"]["files"]
    for f in sorted((full / "head_types").glob("*.csv")) + sorted((full / "head_types").glob("*.json")):
        assert f.read_bytes() == (killed / "head_types" / f.name).read_bytes(), f.name
    scores = pd.read_csv(killed / "head_types" / "run_scores.csv")
    assert sorted(set(scores["step"])) == [0, 2] and len(scores) == 2 * len(scores[scores["step"] == 0])


def test_too_small_word_pool_is_recorded_not_fatal(run):
    from inductionlab.runtime.run_dir import TrainRun

    ckpt = TrainRun(run).checkpoints()[0]
    tidy, notes = sweep_rows({ckpt.step: RunProbe(run, HeadTypeParams(**{**FAST, "word_pool": 3})).measure(ckpt)})
    assert notes[ckpt.step]["dual_route"].startswith("not computed: only ")
    assert "concept_copying" not in set(tidy["score"])
    assert {"induction", "cmr_distance"} <= set(tidy["score"]) and len(tidy[tidy["score"] == "induction"]) == 8
    assert notes[ckpt.step]["pool"].startswith("training split")


def test_random_tokens_come_from_the_training_split(run, tmp_path):
    """The sweep draws its random tokens from the ids the run's shards use (as the training telemetry does):
    its scores equal a checkpoint measured with that pool given, and differ from whole-vocabulary draws."""
    import shutil

    from inductionlab.core.models import load_model
    from inductionlab.data.shards import TokenShards
    from inductionlab.runtime.run_dir import TrainRun

    p = HeadTypeParams(**FAST)
    ckpt = TrainRun(run).checkpoints()[-1]
    loaded = load_model(ckpt.path, dtype="float32")
    pool, note = training_pool(run, loaded.tokenizer)
    data = TrainRun(run).record["config"]["data"]
    want = TokenShards.open(data).token_pool(exclude_ids=loaded.tokenizer.all_special_ids)
    assert note == f"training split ({data})" and pool.tolist() == want.tolist()
    assert len(pool) < loaded.model.config.vocab_size
    swept = sweep_rows({ckpt.step: RunProbe(run, p).measure(ckpt)})[0]
    given = measure_checkpoint(loaded.model, loaded.tokenizer, p, step=ckpt.step, pool=pool)[0]
    whole = measure_checkpoint(loaded.model, loaded.tokenizer, p, step=ckpt.step)[0]
    pd.testing.assert_frame_equal(swept, given, check_exact=True)
    ind = lambda t: t[t["score"] == "induction"]["value"].to_numpy()   # noqa: E731
    assert not (ind(swept) == ind(whole)).all()
    moved = tmp_path / "moved"                                         # shards not here: the whole vocabulary
    shutil.copytree(run, moved)
    rec = TrainRun(moved).record_path
    r = json.loads(rec.read_text())
    r["config"]["data"] = str(tmp_path / "gone")
    rec.write_text(json.dumps(r))
    assert training_pool(moved, loaded.tokenizer)[0] is None
    moved_ckpt = TrainRun(moved).checkpoints()[-1]
    assert "not here" in str(RunProbe(moved, p).measure(moved_ckpt)["pool"])


def _tidy(values: dict[str, dict[tuple[int, int], list[float]]], steps=(0, 10, 20)) -> pd.DataFrame:
    return pd.DataFrame([{"step": s, "layer": lh[0], "head": lh[1], "score": score, "value": v}
                         for score, heads in values.items() for lh, vals in heads.items()
                         for s, v in zip(steps, vals)])


def test_transition_table_hand_worked():
    nan = math.nan
    t = _tidy({"induction": {(0, 0): [0.1, 0.4, 0.9], (0, 1): [0.5, 0.2, 0.6], (1, 0): [0.1, 0.2, 0.3]},
               "cmr_distance": {(0, 0): [nan, 0.6, 0.49], (0, 1): [0.5, 0.3, 0.2], (1, 0): [0.4, 0.9, 0.9]},
               "concept_copying": {(0, 0): [0.0, 0.2, 0.2], (0, 1): [0.0, 0.3, 0.0], (1, 0): [0.0, 0.0, 0.1]}})
    tab = transition_table(t, HeadTypeParams(concept_threshold=0.1).thresholds()).set_index(["score", "layer", "head"])
    first = tab["first_step"]
    # induction >= 0.4 (equal counts); cmr_distance < 0.5 (0.5 does not; NaN never); concept_copying >= 0.1
    assert first[("induction", 0, 0)] == 10 and first[("induction", 0, 1)] == 0
    assert math.isnan(first[("induction", 1, 0)]) and math.isnan(tab.loc[("induction", 1, 0), "order"])
    assert [first[("cmr_distance", 0, h)] for h in (0, 1)] == [20, 10] and first[("cmr_distance", 1, 0)] == 0
    assert tab.loc[("induction", 0, 1), "order"] == 1 and tab.loc[("induction", 0, 0), "order"] == 2
    assert [tab.loc[("cmr_distance", l, h), "order"] for l, h in ((1, 0), (0, 1), (0, 0))] == [1, 2, 3]
    # ties share the lower rank: two heads at step 10, the third at 20
    assert [tab.loc[("concept_copying", l, h), "order"] for l, h in ((0, 0), (0, 1), (1, 0))] == [1, 1, 3]
    assert "token_copying" not in set(tab.index.get_level_values(0))       # no scores, no rows


def test_concentration_hand_worked():
    t = _tidy({"induction": {(0, 0): [0.5, 0.25, 0.0], (0, 1): [0.5, 0.25, 0.0],
                             (1, 0): [0.0, 0.25, -0.2], (1, 1): [-0.3, 0.25, 0.0]}})
    c = concentration(t, top_k=1).set_index("step")
    assert c.loc[0, "top_k_share"] == 0.5 and c.loc[0, "effective_heads"] == pytest.approx(2.0)   # two equal heads
    assert c.loc[10, "top_k_share"] == 0.25 and c.loc[10, "effective_heads"] == pytest.approx(4.0)
    assert math.isnan(c.loc[20, "top_k_share"]) and math.isnan(c.loc[20, "effective_heads"])     # nothing positive
    t2 = _tidy({"induction": {(0, 0): [0.6], (0, 1): [0.2], (1, 0): [0.2], (1, 1): [-0.1]}}, steps=(0,))
    c2 = concentration(t2, top_k=2).iloc[0]
    assert c2["top_k_share"] == pytest.approx(0.8)
    assert c2["effective_heads"] == pytest.approx(math.exp(-(0.6 * math.log(0.6) + 2 * 0.2 * math.log(0.2))))


def test_cmr_share_hand_worked():
    t = _tidy({"cmr_distance": {(0, 0): [0.2, 0.6], (0, 1): [math.nan, 0.1], (1, 0): [0.6, 0.4], (1, 1): [0.7, 0.3]}},
              steps=(0, 5))
    s = cmr_share(t).set_index(["step", "layer"])["share"]
    assert s.to_dict() == {(0, 0): 0.5, (0, 1): 0.0, (5, 0): 0.5, (5, 1): 1.0}


def test_compare_runs_hand_worked():
    nan = math.nan
    a = _tidy({"induction": {(0, 0): [0.0, 0.9], (0, 1): [0.0, 0.1], (1, 0): [0.0, 0.0], (1, 1): [0.0, -0.2]},
               "cmr_distance": {(0, 0): [0.9, 0.2], (0, 1): [0.9, 0.6], (1, 0): [0.9, 0.3], (1, 1): [0.9, nan]},
               "crp_range": {(0, 0): [0.0, 0.8], (0, 1): [0.0, 0.1], (1, 0): [0.0, 0.02], (1, 1): [0.0, 0.0]}},
              steps=(0, 10))
    b = _tidy({"induction": {(0, 0): [0.5, 0.5], (0, 1): [0.5, 0.5], (1, 0): [0.0, 0.5], (1, 1): [0.0, 0.5]},
               "cmr_distance": {(0, 0): [0.1, 0.1], (0, 1): [0.1, 0.1], (1, 0): [0.1, 0.1], (1, 1): [0.1, 0.1]},
               "crp_range": {(0, 0): [0.4, 0.4], (0, 1): [0.4, 0.4], (1, 0): [0.2, 0.2], (1, 1): [0.2, 0.2]}},
              steps=(0, 10))
    per_run, by_group = compare_runs({"a": ("none", a), "b": ("induction", b), "c": ("induction", a)}, top_k=2)
    r = per_run.set_index("run")
    assert r.loc["a", "step"] == 10 and r.loc["a", "max_induction"] == 0.9 and r.loc["a", "n_induction_heads"] == 1
    assert r.loc["a", "top1_share"] == pytest.approx(0.9) and r.loc["a", "top2_share"] == pytest.approx(1.0)
    assert r.loc["a", "effective_heads"] == pytest.approx(math.exp(-(0.9 * math.log(0.9) + 0.1 * math.log(0.1))))
    # CMR-like (< 0.5): L0H0 and L1H0 of 4 heads (NaN is not); per layer 1/2 and 1/2; their mean crp_range
    assert r.loc["a", "cmr_like_share"] == 0.5
    assert (r.loc["a", "cmr_like_share_L0"], r.loc["a", "cmr_like_share_L1"]) == (0.5, 0.5)
    assert r.loc["a", "crp_range_cmr_like"] == pytest.approx(0.41)
    assert r.loc["a", "crp_range_all"] == pytest.approx(0.23)
    assert r.loc["b", "top1_share"] == 0.25 and r.loc["b", "effective_heads"] == pytest.approx(4.0)
    assert r.loc["b", "n_induction_heads"] == 4 and r.loc["b", "cmr_like_share"] == 1.0
    g = by_group.set_index(["group", "measure"])
    assert g.loc[("induction", "top1_share"), "n_runs"] == 2
    assert g.loc[("induction", "top1_share"), "mean"] == pytest.approx((0.25 + 0.9) / 2)
    assert (g.loc[("induction", "max_induction"), "min"], g.loc[("induction", "max_induction"), "max"]) == (0.5, 0.9)
    assert g.loc[("none", "cmr_like_share"), "mean"] == 0.5 and g.loc[("none", "cmr_like_share"), "n_runs"] == 1
    with pytest.raises(Exception, match="lack the induction score or the CMR fit"):
        compare_runs({"x": ("none", a[a["score"] != "crp_range"])})


def test_telemetry_of_two_runs_compares_their_head_types(run, tmp_path):
    import shutil

    twin = tmp_path / "twin"
    shutil.copytree(run, twin)
    out = tmp_path / "tel2"
    r = CliRunner().invoke(main, ["telemetry", str(run), str(twin), "--out", str(out), *FLAGS])
    assert r.exit_code == 0, r.output
    folder = out / "head_types"
    per_run = pd.read_csv(folder / "comparison.csv")
    assert per_run["run"].tolist() == [run.name, "twin"] and (folder / "comparison.png").is_file()
    same = per_run.drop(columns=["run"])
    pd.testing.assert_series_equal(same.iloc[0], same.iloc[1], check_names=False)   # a copy: the same values
    tidy = pd.read_csv(folder / "twin_scores.csv")
    last = tidy[(tidy["step"] == tidy["step"].max()) & (tidy["score"] == "induction")]["value"]
    assert per_run.loc[1, "max_induction"] == pytest.approx(last.max())
    rec = json.loads((out / "results.json").read_text())["head_types_comparison"]
    assert len(rec["per_run"]) == 2 and rec["files"] == ["comparison.csv", "comparison_by_group.csv", "comparison.png"]


@pytest.mark.parametrize("flags, words", [(["--head-types-seq-len", "4"], "--head-types-seq-len"),
                                          (["--head-types-cmr-starts", "0"], "--head-types-cmr-starts"),
                                          (["--concept-threshold", "2"], "--concept-threshold")])
def test_bad_head_type_options_are_one_line(tmp_path, flags, words):
    r = CliRunner().invoke(main, ["telemetry", str(tmp_path / "none"), "--head-types", *flags])
    assert r.exit_code != 0 and words in r.output and "Traceback" not in r.output, r.output
    assert not (tmp_path / "none").exists()
