"""`inductionlab study bi-induct`: the whole study on the tiny preset (end to end, matched compute,
budget mismatch refused, SIGKILL then resume), and the decision rules on hand-built tables."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dataclasses import replace

from inductionlab.errors import InductionLabError
from inductionlab.studies.bi_induct import ANTI_NEAR_ZERO, INDUCTION_EFFECT, seed_ci, run_bi_induct_study, decide, tiny
from inductionlab.studies.run import format_verdicts
from inductionlab.studies.spec import RunOptions
from test_train_helpers import make_corpus

ROOT = Path(__file__).resolve().parents[1]
TIMING = ("train_time_s",)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"))


QUIET = RunOptions(progress=False)


@pytest.fixture(scope="module")
def study(shards, tmp_path_factory):
    """The uninterrupted reference: tiny preset, 4 variants x 2 seeds, 2 jobs."""
    out = tmp_path_factory.mktemp("study") / "s"
    res = run_bi_induct_study(replace(tiny(), shards=str(shards), jobs=2), out, QUIET)
    res.out = out                        # where the tests below look
    return res


def _comparable(out: Path) -> dict:
    """results.json less timings, with the run directory written as ``<out>`` (two studies, two places)."""
    r = json.loads((out / "results.json").read_text().replace(str(out), "<out>"))
    runs = [{k: v for k, v in row.items() if k not in TIMING} for row in r["runs"]]
    return {"runs": runs, "verdicts": r["verdicts"], "evaluations": r["evaluations"],
            "summary": pd.read_csv(out / "tables" / "telemetry_summary.csv").to_dict(orient="list")}


def test_end_to_end_report_has_every_section_and_claim(study):
    out = study.out
    report = (out / "report.md").read_text()
    for section in ("## Verdicts", "## Telemetry over training", "## Emergence and final head scores",
                    "## Held-out perplexity", "## Probes: associative recall", "## Load-bearing test"):
        assert section in report
    assert (out / "plots" / "telemetry_variants.png").stat().st_size > 10_000
    claims = {v.claim for v in study.verdicts}
    assert claims == {"A", "B", "C", "D", "E"}
    assert all(v.status in ("reproduced", "not reproduced", "not testable") for v in study.verdicts)
    for v in study.verdicts:                         # each verdict row in the report, with its rule stated
        assert f"| {v.claim}. {v.text}" in report and f"**{v.status}**" in report and v.rule[:40] in report
    t = study.table
    assert sorted(t["run"]) == sorted(f"{v}-s{s}" for v in ("none", "induction", "anti", "balanced") for s in (0, 1))
    # the evaluation ran on every final checkpoint: HITS@1 in [0, 1], a finite perplexity and ablation drop
    assert t["hits1_1shot"].between(0, 1).all() and np.isfinite(t["ppl"]).all() and (t["ppl"] > 1).all()
    assert np.isfinite(t["drop_induction"]).all()
    # the evaluation's perplexity guard and the trainer's last telemetry measure the same held-out text
    assert np.allclose(np.log(t["ppl"]), np.log(t["telemetry_heldout_ppl"]), atol=0.2)


def test_matched_compute_tokens_steps_flops_equal(study):
    from inductionlab.train.flops import read_budgets
    b = read_budgets(sorted((study.out / "runs").glob("*-s*[0-9]")))
    assert len(b) == 8
    for key in ("tokens", "steps", "flops", "n_params", "tokens_per_update"):
        assert len({x[key] for x in b.values()}) == 1, key
    one = next(iter(b.values()))
    assert one["tokens"] == 4096 and one["steps"] == 8 and one["tokens"] == one["steps"] * one["tokens_per_update"]
    rec = json.loads((study.out / "results.json").read_text())
    assert rec["matched_compute"]["checked"] and rec["matched_compute"]["budget"] == one
    # the emergence law beside every measured emergence: N = 5e5 * sqrt(B * C) tokens, N / (B * C) updates
    law = 5e5 * one["tokens_per_update"] ** 0.5
    assert rec["predicted_emergence"]["tokens"] == pytest.approx(law)
    assert all(r["law_emergence_tokens"] == pytest.approx(law) and
               r["law_emergence_steps"] == pytest.approx(law / one["tokens_per_update"]) for r in rec["runs"])
    report = (study.out / "report.md").read_text()
    assert f"predicts ≈ {law:.3g} tokens" in report and "law_emergence_steps" in report
    # the curriculum really differed: natural-only saw no synthetic tokens, the others did
    for run in ("none-s0", "induction-s0"):
        rows = [json.loads(x) for x in (study.out / "runs" / run / "metrics.jsonl").read_text().splitlines()]
        frac = np.mean([r["synthetic_fraction"] for r in rows])
        assert (frac == 0) if run.startswith("none") else (frac > 0.5)


def test_budget_mismatch_on_resume_is_refused(study, shards):
    before = (study.out / "study.json").read_text()
    with pytest.raises(InductionLabError, match="different parameters.*tokens"):
        run_bi_induct_study(replace(tiny(), shards=str(shards), budget=8192), study.out, QUIET)
    assert (study.out / "study.json").read_text() == before


def test_rerun_reuses_every_finished_run(study, shards):
    stamps = {p: p.stat().st_mtime_ns for p in (study.out / "runs").glob("*/run.json")}
    res = run_bi_induct_study(replace(tiny(), shards=str(shards), jobs=2), study.out, QUIET)
    assert res.record["resumed"] and all(w == 0 for w in res.record["train_wall_s_this_call"].values())
    assert stamps == {p: p.stat().st_mtime_ns for p in (study.out / "runs").glob("*/run.json")}


def test_bad_options_fail_before_writing(tmp_path, shards):
    for kw, msg in ((dict(shards=str(tmp_path / "nope")), "not a prepared corpus"),
                    (dict(shards=str(shards), variants=("induction", "anti")), "include none"),
                    (dict(shards=str(shards), budget=100), "less than one update"),
                    (dict(shards=str(shards), preset="huge"), "unknown study preset")):
        with pytest.raises(InductionLabError, match=msg):
            run_bi_induct_study(replace(tiny(), **kw), tmp_path / "o", QUIET)
    assert not (tmp_path / "o").exists()


def test_trainers_run_this_checkouts_code():
    """The folder put first on the trainers' PYTHONPATH is the one holding the imported ``inductionlab``
    (the move into studies/bi_induct/ once pointed it at studies/, where ``evaluate/`` would shadow a package)."""
    import inductionlab
    from inductionlab.studies.bi_induct.jobs import _package_root

    root = _package_root()
    assert root == Path(inductionlab.__file__).resolve().parents[1]
    assert (root / "inductionlab" / "studies" / "bi_induct" / "jobs.py").is_file()


@pytest.mark.slow
def test_sigkill_mid_study_then_rerun_equals_uninterrupted(study, shards, tmp_path):
    out = tmp_path / "k"
    cmd = [sys.executable, "-m", "inductionlab.cli", "study", "bi-induct", "--preset", "tiny", "--shards", str(shards),
           "--jobs", "1", "--out", str(out), "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first, second = out / "runs" / "none-s0", out / "runs" / "induction-s0"
    deadline = time.time() + 300
    while time.time() < deadline:        # kill once the first run is finished and the second has a checkpoint
        if (first / "run.json").is_file() and json.loads((first / "run.json").read_text()).get("status") == "complete" \
                and any((second / "checkpoints").glob("step_*/config.json")):
            break
        time.sleep(0.05)
    else:
        p.kill()
        pytest.fail("the study never reached the second run")
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    time.sleep(1.0)                      # the trainer child dies with its parent (PR_SET_PDEATHSIG)
    assert json.loads((second / "run.json").read_text())["status"] == "running"
    finished = (first / "run.json").read_text()
    res = run_bi_induct_study(replace(tiny(), shards=str(shards), jobs=2), out, QUIET)
    assert (first / "run.json").read_text() == finished                        # reused, not retrained
    assert res.record["train_wall_s_this_call"]["none-s0"] == 0
    assert json.loads((second / "run.json").read_text())["resumed_from_step"] is not None
    assert _comparable(out) == _comparable(study.out)


# ---- decision rules on hand-built tables -------------------------------------------------------------

def _table(**cols) -> pd.DataFrame:
    rows = []
    for v in ("none", "induction", "anti", "balanced"):
        for s in (0, 1):
            r = {"run": f"{v}-s{s}", "variant": v, "seed": s, "emergence_tokens": None, "final_max_induction": 0.05,
                 "peak_max_induction": 0.05, "peak_max_anti_induction": 0.05, "ppl": 10.0,
                 "hits1_10shot": 0.0, "icl_score": -0.1, "icl_benefit": 0.1, "recall_accuracy": 0.0,
                 "copy_accuracy": 0.0, "abs_icl_benefit_induction": -0.02, "abs_icl_benefit_random": -0.01,
                 "abs_icl_benefit_contrast": -0.01, "rel_icl_benefit_contrast": -0.1}
            for k, f in cols.items():
                r[k] = f(v, s)
            rows.append(r)
    return pd.DataFrame(rows)


def _by(vs):
    return {v.claim + (v.variant or ""): v.status for v in vs}


def test_rules_nothing_formed_is_not_testable():
    v = _by(decide(_table(), threshold=0.3))
    assert v["Ainduction"] == v["Abalanced"] == "not testable"
    assert v["C"] == "not testable"          # recall probe at the floor (accuracy 0)
    assert v["B"] == "reproduced"                          # 0.05 in every seed: CI [0.05, 0.05] < 0.2
    assert v["E"] == "not reproduced"                      # equal perplexities: no penalty


def test_rules_head_forms_with_induction_data_only():
    t = _table(final_max_induction=lambda v, s: 0.9 + 0.01 * s if v == "induction" else 0.05,
               peak_max_induction=lambda v, s: 0.95 if v == "induction" else 0.05,
               emergence_tokens=lambda v, s: 1000 if v == "induction" else None,
               ppl=lambda v, s: 10.0 if v == "none" else 20.0 + s,
               peak_max_anti_induction=lambda v, s: ANTI_NEAR_ZERO + 0.1 if v == "anti" else 0.05)
    v = _by(decide(t, threshold=0.3))
    assert v["Ainduction"] == "reproduced" and v["Abalanced"] == "not reproduced"
    assert v["E"] == "reproduced" and v["B"] == "not reproduced"


def test_rule_a_effect_size_threshold():
    # +0.09 in both seeds: below INDUCTION_EFFECT, no earlier emergence -> not reproduced
    t = _table(final_max_induction=lambda v, s: 0.5 + (INDUCTION_EFFECT - 0.01 if v == "induction" else 0),
               peak_max_induction=lambda v, s: 0.5)
    assert _by(decide(t, 0.3))["Ainduction"] == "not reproduced"
    t = _table(final_max_induction=lambda v, s: 0.5 + (INDUCTION_EFFECT + 0.01 + 0.001 * s if v == "induction" else 0),
               peak_max_induction=lambda v, s: 0.5)
    assert _by(decide(t, 0.3))["Ainduction"] == "reproduced"


def test_rule_d_natural_only_loses_more_nats():
    # absolute contrasts (nats): none -0.050, -0.051; induction -0.010, -0.009 -> paired d = -0.040, -0.042,
    # t(1) CI = -0.041 +- 12.706 * 0.001414 / sqrt(2) = [-0.0537, -0.0283]: high < 0 -> reproduced
    t = _table(abs_icl_benefit_contrast=lambda v, s: -0.05 - 0.001 * s if v == "none" else -0.01 + 0.001 * s)
    d = next(x for x in decide(t, 0.3) if x.claim == "D")
    assert d.status == "reproduced"
    assert "none − induction = -0.041 [-0.054, -0.028]" in d.evidence
    assert "relative not reported" in d.evidence          # intact 0.1 is not above RELATIVE_FLOOR 0.10
    t2 = _table(abs_icl_benefit_contrast=lambda v, s: -0.05 - 0.001 * s if v == "none" else -0.01 + 0.001 * s,
                icl_benefit=lambda v, s: 0.3)
    assert "relative contrast none − induction" in next(x for x in decide(t2, 0.3) if x.claim == "D").evidence
    # the induction variant loses as much: not reproduced
    t = _table(abs_icl_benefit_contrast=lambda v, s: -0.05 - 0.001 * s)
    assert _by(decide(t, 0.3))["D"] == "not reproduced"
    t = _table(abs_icl_benefit_contrast=lambda v, s: -0.05 - 0.01 * s, icl_benefit=lambda v, s: 0.0)
    assert _by(decide(t, 0.3))["D"] == "not testable"   # no ICL benefit to lose


def test_seed_ci_is_student_t():
    m, lo, hi = seed_ci([1.0, 2.0, 3.0])          # sd 1, t(2, 0.975) = 4.302653
    assert m == 2.0 and hi - m == pytest.approx(4.302653 / np.sqrt(3), rel=1e-6) and lo == pytest.approx(4 - hi)
    assert np.isnan(seed_ci([1.0])[1])


def test_rule_c_bi_induct_better_on_probes():
    t = _table(recall_accuracy=lambda v, s: 0.5 + 0.01 * s if v == "induction" else 0.2 + 0.01 * s)
    assert _by(decide(t, 0.3))["C"] == "not reproduced"
    t = _table(recall_accuracy=lambda v, s: 0.3 + 0.01 * s)
    assert _by(decide(t, 0.3))["C"] == "reproduced"
    t = _table(recall_accuracy=lambda v, s: 0.5 if v == "induction" else 0.04)     # natural-only at the floor
    assert _by(decide(t, 0.3))["C"] == "not testable"


def test_rule_d_undecided_carries_a_power_line_in_seeds():
    """Paired contrasts −0.01 and −0.04 (seeds 0, 1): mean −0.025, SD 0.0212, the t CI straddles 0 -> not reproduced
    with the seeds that would decide it, ⌈((1.96 + 0.84)·SD/0.025)²⌉ = 6."""
    t = _table(abs_icl_benefit_contrast=lambda v, s: (-0.05 - 0.03 * s) if v == "none" else -0.04)
    d = next(x for x in decide(t, 0.3) if x.claim == "D")
    sd = np.std([-0.01, -0.04], ddof=1)
    want = int(np.ceil(((1.959963984540054 + 0.8416212335729143) * sd / 0.025) ** 2))
    assert d.status == "not reproduced" and want == 6 and d.power["n_needed"] == want
    assert d.power["unit"] == "seeds" and d.power["minutes"] is None
    assert f"n = {want} seeds would decide it" in format_verdicts([d])[0]
    t = _table(abs_icl_benefit_contrast=lambda v, s: -0.05 - 0.001 * s if v == "none" else -0.01 + 0.001 * s)
    assert next(x for x in decide(t, 0.3) if x.claim == "D").power is None      # decided: no power line
