"""The temporal-dependencies study: k lists, random draws, verdict rules, resumability, CLI end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from _tiny import tiny_llama_dir
from inductionlab.core.ablation import Condition, ablation_conditions, top_k_heads
from inductionlab.errors import InductionLabError
from inductionlab.protocols.lag_probe import LagProbeConfig, LagProbeResult
from inductionlab.protocols.serial_recall import SerialRecallConfig, SerialRecallResult
from inductionlab.studies.configs import AblationConfig, HeadScoreConfig
from inductionlab.studies.spec import RunOptions
from inductionlab.studies.temporal import TemporalStudyConfig, default_ks, headline_table, run_temporal_study, decide

SMALL = dict(lag=LagProbeConfig(n_permutations=6, list_length=30, cue_position=15),
             recall=SerialRecallConfig(n_trials=4, list_length=6, n_shots=2),
             ablation=AblationConfig(ks=(1, 2), n_draws=2), load_bearing_top=2, load_bearing_permutations=4,
             scores=HeadScoreConfig(seq_len=20, batch_size=4))
QUIET = RunOptions(progress=False)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_llama_dir(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    from inductionlab.core.models import load_model
    return load_model(str(tiny_dir), dtype="float32")


def test_default_ks_scale_with_head_count():
    assert default_ks(270) == [10, 20, 50, 100]             # SmolLM2: 30 × 9, N = 135, cap 101
    assert default_ks(72) == [4, 7, 14, 25]                 # Gemma 3 270M: 5/10/20/35% of 72, cap 27
    assert default_ks(16) == [1, 2, 3, 6]                   # 4 × 4: cap int(0.75 × 8) = 6
    assert default_ks(1024) == [10, 20, 50, 100]            # Llama-3.1-8B: the paper's list


def test_random_draws_exclude_top_n_are_seeded_and_differ():
    rng = np.random.default_rng(3)
    scores = rng.random((6, 5))
    excluded = set(top_k_heads(scores, 10))
    conds = ablation_conditions(scores, [4, 8], n_draws=4, exclude_top_n=10, seed=11)
    again = ablation_conditions(scores, [4, 8], n_draws=4, exclude_top_n=10, seed=11)
    other = ablation_conditions(scores, [4, 8], n_draws=4, exclude_top_n=10, seed=12)
    rand = [c for c in conds if c.kind == "random"]
    assert len(rand) == 8
    for c in rand:
        assert len(set(c.heads)) == c.k and not set(c.heads) & excluded
    assert [c.heads for c in conds] == [c.heads for c in again]
    assert [c.heads for c in conds] != [c.heads for c in other]
    for k in (4, 8):
        draws = [tuple(c.heads) for c in rand if c.k == k]
        assert len(set(draws)) == len(draws)                   # every draw differs
    with pytest.raises(InductionLabError, match="remain outside"):
        ablation_conditions(scores, [21], n_draws=1, exclude_top_n=10)


def _synthetic(collapse: bool):
    """Lag probe (L=5, cue 3: column 3 is lag +1) and recall results with known effects.

    Intact: p(+1) ≈ 0.8. ``collapse``: induction-k ablation → 0.1, random → 0.8 (paper-like);
    otherwise induction → 0.8 and random → 0.1. Recall accuracy follows the same pattern.
    """
    rng = np.random.default_rng(0)
    n, ks = 40, [2]
    conds = [Condition("intact", "intact"), Condition("induction-2", "induction", 2, 0, [(0, 0), (0, 1)]),
             Condition("random-2-d0", "random", 2, 0, [(1, 0), (1, 1)]),
             Condition("random-2-d1", "random", 2, 1, [(1, 2), (1, 3)])]
    hi, lo = 0.8, 0.1
    level = {"intact": hi, "induction-2": lo if collapse else hi,
             "random-2-d0": hi if collapse else lo, "random-2-d1": hi if collapse else lo}
    probs, recall = {}, {}
    for c in conds:
        p = np.full((n, 5), 0.02) + rng.uniform(0, 0.01, (n, 5))
        p[:, 3] = level[c.name] + rng.uniform(-0.02, 0.02, n)
        probs[c.name] = p
        acc = rng.random((n, 6)) < level[c.name]
        trans = np.full((n, 5, 6), 0.1)
        recall[c.name] = {"correct": acc, "trans": trans / trans.sum(-1, keepdims=True),
                          "list_mass": np.ones((n, 6))}
    lag = LagProbeResult(probs, {k: v.sum(1) for k, v in probs.items()}, {k: np.full(n, 1.0) for k in probs},
                         conds, LagProbeConfig(list_length=5, cue_position=3, n_permutations=n))
    rec = SerialRecallResult(recall, conds, SerialRecallConfig(list_length=6, n_trials=n, generate=False))
    return lag, rec, ks


def test_verdicts_on_known_effects():
    lag, rec, ks = _synthetic(collapse=True)
    head = headline_table(lag, rec, ks)
    row = head[(head.measure == "lag_plus1")].iloc[0]
    assert row.intact == pytest.approx(0.8, abs=0.01) and row.induction == pytest.approx(0.1, abs=0.01)
    assert row.random_minus_induction == pytest.approx(0.7, abs=0.02)
    v = {d.claim: d.status == "reproduced" for d in decide(lag, rec, head, ks)}
    assert v == {"A": True, "B": True, "C": True, "D": True}
    lag, rec, ks = _synthetic(collapse=False)
    head = headline_table(lag, rec, ks)
    v = {d.claim: d.status == "reproduced" for d in decide(lag, rec, head, ks)}
    assert v == {"A": True, "B": False, "C": False, "D": False}


def _row(measure, k, intact, ind, rnd, diff_ci):
    """A headline row with the given means and the CI of random − induction (other CIs tight)."""
    r = {"measure": measure, "k": k}
    for arm, v in (("intact", intact), ("induction", ind), ("random", rnd), ("induction_minus_intact", ind - intact),
                   ("random_minus_intact", rnd - intact), ("random_minus_induction", rnd - ind)):
        r[arm], r[arm + "_ci_low"], r[arm + "_ci_high"] = v, v - 0.01, v + 0.01
    r["random_minus_induction_ci_low"], r["random_minus_induction_ci_high"] = diff_ci
    return r


def test_majority_rule_ignores_floor_but_not_reversal():
    import pandas as pd

    lag, rec, _ = _synthetic(collapse=True)
    ks = [1, 2, 3]
    # k = 1, 2: induction collapses, random keeps; k = 3: both at the floor (no evidence either way)
    rows = [_row("lag_plus1", 1, 0.8, 0.1, 0.8, (0.6, 0.8)), _row("lag_plus1", 2, 0.8, 0.05, 0.75, (0.6, 0.8)),
            _row("lag_plus1", 3, 0.8, 0.0, 0.0, (-0.01, 0.01))]
    rows += [_row("recall_accuracy", r["k"], r["intact"], r["induction"], r["random"],
                  (r["random_minus_induction_ci_low"], r["random_minus_induction_ci_high"])) for r in rows]
    v = {d.claim: d for d in decide(lag, rec, pd.DataFrame(rows), ks)}
    assert v["B"].status == v["D"].status == "reproduced"
    assert [v["B"].per_k[k]["holds"] for k in ks] == [True, True, False]
    assert v["C"].status == "not reproduced"                # at k = 3 random ablation removed p(+1)
    # a significant reversal at any k (random lower than induction) refutes (b) and (d)
    rows[2] = _row("lag_plus1", 3, 0.8, 0.6, 0.2, (-0.5, -0.3))
    rows[5] = _row("recall_accuracy", 3, 0.8, 0.6, 0.2, (-0.5, -0.3))
    v = {d.claim: d.status == "reproduced" for d in decide(lag, rec, pd.DataFrame(rows), ks)}
    assert not v["B"] and not v["D"]


def test_load_bearing_table_and_concentration_hand_worked():
    from inductionlab.protocols.load_bearing import concentration, load_bearing_table, single_head_conditions

    induction = np.array([[0.1, 0.9], [0.5, 0.2]])
    conds = single_head_conditions(induction, 3)
    assert [c.heads for c in conds] == [[(0, 1)], [(1, 0)], [(1, 1)]]
    intact = {"p": np.array([0.5, 0.7])}
    # per-trial deltas: head (0,1): −0.3, −0.3; head (1,0): +0.1, −0.1 (mean 0); head (1,1): −0.1, −0.1
    single = {"head-L0H1": {"p": np.array([0.2, 0.4])}, "head-L1H0": {"p": np.array([0.6, 0.6])},
              "head-L1H1": {"p": np.array([0.4, 0.6])}}
    t = load_bearing_table(induction, conds, intact, single)
    assert list(t.p_delta) == pytest.approx([-0.3, 0.0, -0.1])
    assert t.p_delta_ci_low[0] == pytest.approx(-0.3) and t.p_delta_ci_high[0] == pytest.approx(-0.3)
    # head (1,0): deltas ±0.1, sd 0.1414, half-width 1.96·0.1414/√2 = 0.196
    assert t.p_delta_ci_high[1] == pytest.approx(1.959964 * 0.1, rel=1e-5)
    assert list(t.p_drop_share) == pytest.approx([0.75, 0.0, 0.25])
    c = concentration(t, "p", tops=(1, 2, 5))
    assert c["total_drop"] == pytest.approx(0.4)
    assert c["by_effect"] == pytest.approx({1: 0.75, 2: 1.0})                   # 5 > 3 heads: left out
    assert c["by_induction_rank"] == pytest.approx({1: 0.75, 2: 0.75})


def test_interrupt_and_resume_equals_uninterrupted(tiny, tmp_path):
    cfg = TemporalStudyConfig(**SMALL)
    full = run_temporal_study(tiny, cfg, tmp_path / "full", QUIET)

    seen = []

    def stop(key):
        seen.append(key)
        if len(seen) == 5:
            raise KeyboardInterrupt

    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        run_temporal_study(tiny, cfg, out, RunOptions(progress=False, on_checkpoint=stop))
    assert not (out / "results.json").exists()
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]   # nothing half-written
    done = sorted(p.relative_to(out / "checkpoints").as_posix() for p in (out / "checkpoints").rglob("*.*"))
    assert len(done) == 5
    again = []
    run_temporal_study(tiny, cfg, out, RunOptions(progress=False, on_checkpoint=again.append))
    assert not set(again) & set(seen)                                  # finished pieces are not recomputed
    n_conditions = 1 + len(SMALL["ablation"].ks) * (1 + SMALL["ablation"].n_draws)
    assert len(seen) + len(again) == 1 + 2 * n_conditions + 2 * SMALL["load_bearing_top"]
    rec, first = (json.loads((d / "results.json").read_text()) for d in (out, tmp_path / "full"))
    assert (rec.pop("resumed"), first.pop("resumed")) == (True, False)
    rec.pop("timings"), first.pop("timings")
    assert rec == first
    assert [v["claim"] for v in rec["verdicts"]] == ["A", "B", "C", "D"]
    assert all(v["verdict"] in ("reproduced", "not reproduced") for v in rec["verdicts"])
    assert ["per_k" in v for v in rec["verdicts"]] == [False, True, True, True]
    assert full.lag.probs["intact"].shape == (6, 30)
    # a different configuration in the same directory is refused
    with pytest.raises(InductionLabError, match="different parameters"):
        run_temporal_study(tiny, TemporalStudyConfig(**{**SMALL, "ablation": AblationConfig(ks=(1, 2), n_draws=3)}), out,
                           QUIET)


def test_cli_end_to_end(tiny_dir, tmp_path):
    from inductionlab.cli import main

    out = tmp_path / "run"
    args = ["study", "temporal", "--model", str(tiny_dir), "--out", str(out), "--permutations", "6",
            "--list-length", "30", "--cue-position", "15", "--recall-trials", "4", "--recall-list-length", "6",
            "--recall-shots", "2", "--n-draws", "2", "--load-bearing-top", "3", "--dtype", "float32", "--no-progress",
            "--method", "mean"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    for f in ["results.json", "report.md", "tables/headline.csv", "tables/load_bearing.csv", "tables/recall_crp.csv",
              "tables/lag_crp_argmax.csv", "plots/ablation_vs_k.png", "plots/head_scores.png",
              "plots/load_bearing.png", "plots/concentration.png", "plots/lag_curves_k6.png"]:
        assert (out / f).stat().st_size > 0, f
    rec = json.loads((out / "results.json").read_text())
    assert rec["params"]["ks"] == [1, 2, 3, 6]               # 16 heads: default_ks(16)
    assert rec["params"]["config"]["ablation"]["method"] == "mean"
    lb = rec["load_bearing"]
    assert len(lb["table"]) == 3 and set(lb["concentration"]) == {"lag_plus1", "recall_lag_plus1", "recall_accuracy"}
    assert {"lag_plus1_delta", "recall_lag_plus1_delta", "recall_accuracy_delta"} <= set(lb["table"][0])
    report = (out / "report.md").read_text()
    assert report.count("reproduced") >= 4 and "(D) serial recall" in report
    assert "[`view.html`](view.html), written by `inductionlab view RUN_DIR`" in report
    lines = [x for x in r.output.splitlines() if x.startswith("(")]      # the verdict lines (format_verdicts)
    assert [x[:4] for x in lines] == ["(A) ", "(B) ", "(C) ", "(D) "]
    assert lines[0].startswith(f"(A) {rec['verdicts'][0]['verdict']}: the intact lag curve peaks at lag +1 — p(+1) = ")
    # a second invocation resumes: nothing left to compute, same results
    before = json.loads((out / "results.json").read_text())
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    after = json.loads((out / "results.json").read_text())
    assert (before.pop("resumed"), after.pop("resumed")) == (False, True)
    before.pop("timings"), after.pop("timings")
    assert after == before
    # user mistakes: one line, exit code 2
    r = CliRunner().invoke(main, args[:-2] + ["--ks", "9"])
    assert r.exit_code == 2 and "error:" in r.output and "k=9" in r.output
    r = CliRunner().invoke(main, ["study", "temporal", "--model", str(tmp_path / "nope"), "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "does not exist" in r.output


@pytest.mark.parametrize("extra,message", [
    (["--cue-position", "600"], "outside a list of 30 words"),
    (["--recall-list-length", "3000"], "word pool too small"),
    (["--ks", "1,1"], "repeats a k"),
    (["--n-draws", "0"], "--n-draws 0"),
    (["--batch-size", "0"], "batch size 0"),
    (["--score-seq-len", "0"], "--score-seq-len 0"),
    (["--load-bearing-permutations", "99"], "exceeds --n-permutations 6"),
])
def test_cli_bad_input_one_line_nothing_written(tiny_dir, tmp_path, extra, message):
    from inductionlab.cli import main

    out = tmp_path / "run"
    args = ["study", "temporal", "--model", str(tiny_dir), "--out", str(out), "--permutations", "6",
            "--list-length", "30", "--cue-position", "15", "--recall-trials", "4", "--recall-list-length", "6",
            "--recall-shots", "2", "--dtype", "float32", "--no-progress"]
    r = CliRunner().invoke(main, args + extra)
    assert r.exit_code == 2, r.output
    err = r.stderr.strip()
    assert err.startswith("error:") and message in err and "\n" not in err
    assert not out.exists() and not list(tmp_path.iterdir())


def test_an_undecided_b_or_d_carries_its_power_line():
    """B not reproduced with random − induction 0.02 [−0.03, 0.07] over the 40 lists at the largest k: σ = 0.1 /
    (2·1.96) · √40, and n = ⌈((1.96 + 0.84)·σ / 0.02)²⌉ lists would decide it; a decided verdict carries none."""
    import math

    import pandas as pd

    from inductionlab.studies.run import format_verdicts
    lag, rec, _ = _synthetic(collapse=True)
    rows = [_row("lag_plus1", 2, 0.8, 0.78, 0.8, (-0.03, 0.07)), _row("recall_accuracy", 2, 0.8, 0.1, 0.8, (0.6, 0.8))]
    v = {d.claim: d for d in decide(lag, rec, pd.DataFrame(rows), [2])}
    sigma = 0.1 / (2 * 1.959963984540054) * math.sqrt(40)
    want = math.ceil(((1.959963984540054 + 0.8416212335729143) * sigma / 0.02) ** 2)
    assert v["B"].status == "not reproduced" and v["B"].power["n_needed"] == want and v["B"].power["n"] == 40
    assert f"n = {want} lists would decide it" in format_verdicts([v["B"]])[0]
    assert v["D"].status == "reproduced" and v["D"].power is None
