"""Issue 34: the per-window reductions of the token-loss score (D, B, single token) on hand-worked loss curves, the
pilot's sample size on synthetic data of known σ, and the power line of an undecided verdict."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from inductionlab.core.ablation import Condition
from inductionlab.errors import InductionLabError
from inductionlab.measures.power import n_to_decide, power_line, power_record, sample_size
from inductionlab.measures.token_loss import (band, band_benefit, benefits, measured_range, single_benefit,
                                              slope_benefit)
from inductionlab.studies.run import Verdict, format_verdicts

EARLY, LATE = 50, 500
POS = np.arange(40, 601)                        # ⌈0.8·50⌉ .. ⌊1.2·500⌋


def test_bands_and_measured_range_by_hand():
    assert band(50) == (40, 60) and band(500) == (400, 600) and band(7) == (6, 8)     # 5.6 -> 6, 8.4 -> 8
    assert measured_range(50, 500, 601) == (40, 600)
    assert measured_range(50, 500, 501) == (40, 500)          # too short for the late band: stop at late
    assert measured_range(1, 4, 6) == (1, 4)                  # ⌈0.8⌉ = 1; ⌊4.8⌋ = 4
    with pytest.raises(InductionLabError, match="early < late"):
        measured_range(50, 500, 400)


def test_log_linear_curve_gives_d_equal_to_k_ln10_exactly():
    c, k = 6.0, 0.37
    nll = np.stack([c - k * np.log(POS), 2 * c - 2 * k * np.log(POS)])
    d = slope_benefit(nll, POS, EARLY, LATE)
    assert d == pytest.approx([k * math.log(10), 2 * k * math.log(10)], abs=1e-12)
    # at late = 10·early the single-token benefit is k·ln 10 too, and so is B: each band's mean of ln t differs
    assert single_benefit(nll, POS, EARLY, LATE)[0] == pytest.approx(k * math.log(10), abs=1e-12)
    want_b = k * (np.log(np.arange(400, 601)).mean() - np.log(np.arange(40, 61)).mean())
    assert band_benefit(nll, POS, EARLY, LATE)[0] == pytest.approx(want_b, abs=1e-12)


def test_flat_curve_gives_zero():
    got = benefits(np.full((3, len(POS)), 4.2), POS, EARLY, LATE)
    for m in ("slope", "band", "single"):
        assert np.allclose(got[m], 0.0, atol=1e-12), m


def test_curvature_shows_as_d_different_from_single_token():
    """ℓ_t = 5 − 0.05·(ln t)²: D is the least-squares slope over 50..500 (numpy's polyfit, independently), the
    single-token benefit 0.05·((ln 500)² − (ln 50)²); the two differ."""
    t = np.arange(EARLY, LATE + 1)
    curve = lambda x: 5 - 0.05 * np.log(x) ** 2     # noqa: E731
    nll = curve(POS)[None]
    want_d = -np.polyfit(np.log(t), curve(t), 1)[0] * math.log(10)
    want_single = 0.05 * (math.log(500) ** 2 - math.log(50) ** 2)
    got = benefits(nll, POS, EARLY, LATE)
    assert got["slope"][0] == pytest.approx(want_d, rel=1e-10)
    assert got["single"][0] == pytest.approx(want_single, rel=1e-12)
    assert abs(got["slope"][0] - got["single"][0]) > 0.03      # 1.206 vs 1.166: the curvature, not noise
    assert got["loss_early"][0] == pytest.approx(curve(50)) and got["loss_late"][0] == pytest.approx(curve(500))


def test_band_is_absent_when_the_window_stops_at_late():
    pos = np.arange(40, 501)
    assert np.isnan(band_benefit(np.zeros((2, len(pos))), pos, EARLY, LATE)).all()


def test_sample_size_recovers_the_analytic_n_from_a_pilot_of_known_sigma():
    sigma, h = 2.0, 0.1
    analytic = math.ceil((1.959963984540054 * sigma / h) ** 2)              # 1537
    rng = np.random.default_rng(7)
    ns = []
    for _ in range(20):
        pilot = rng.normal(0.3, sigma, 200)
        ns.append(sample_size(float(pilot.std(ddof=1)), h).n)
    # n ∝ σ̂²; SD(σ̂²)/σ² ≈ √(2/199) = 0.10, so the mean of 20 pilots sits within ±0.07 of the analytic n (3 SE)
    assert abs(np.mean(ns) / analytic - 1) < 0.07
    assert sample_size(sigma, h).n == analytic and sample_size(sigma, h).reason == "half-width"


def test_sample_size_caps_and_says_which_bound():
    s = sample_size(2.0, 0.1, budget_minutes=10, seconds_per_trial_condition=0.5, conditions=12)
    assert s.n == 100 and s.reason == "budget" and s.capped and s.needed == 1537      # 600 s / (0.5 s × 12)
    assert s.minutes == pytest.approx(10.0)
    s = sample_size(2.0, 0.1, budget_minutes=10, seconds_per_trial_condition=0.5, conditions=12, available=64)
    assert s.n == 64 and s.reason == "text"
    assert sample_size(0.01, 0.1).n == 2 and sample_size(0.01, 0.1).reason == "half-width"
    g = sample_size(0.5, 0.1, gate_n=300)                     # the gate needs more than the half-width's 97
    assert (g.n, g.needed, g.reason) == (300, 300, "gate") and sample_size(0.5, 0.1, gate_n=50).n == 97
    assert "budget caps it" in sample_size(2.0, 0.1, budget_minutes=1, seconds_per_trial_condition=1).sentence()
    with pytest.raises(InductionLabError, match="half-width"):
        sample_size(1.0, 0.0)


def test_a_verdict_with_too_few_windows_prints_its_power_line():
    """Y2 on D with 12 windows whose paired difference has mean 0.1 and SD 1: the CI straddles 0, so the verdict
    carries n = ⌈((1.96 + 0.84)·σ/mean)²⌉ and the time at the measured cost."""
    from inductionlab.measures.stats import drop_table
    from inductionlab.studies.head_types.verdicts import decide, per_trial
    n = 12
    rng = np.random.default_rng(3)
    noise = rng.normal(0, 1, n)
    d = noise - noise.mean() + 0.1                              # mean exactly 0.1
    slope = {"intact": np.full(n, 2.0) + rng.normal(0, 0.05, n),
             "induction-excl-fv-10pct": np.full(n, 1.0), "fv-excl-induction-10pct": 1.0 + d}
    probes, icl = [], []
    lag = SimpleNamespace(probs={}, cue_probs={}, cue_positions=None, config=SimpleNamespace(cue_position=0))
    for name, v in slope.items():
        probes.append(pd.DataFrame({"condition": name, "method": "mean", "task": "t", "index": range(n),
                                    "hits1": np.ones(n)}))
        icl.append(pd.DataFrame({"condition": name, "sequence": range(n), "benefit": v, "slope": v}))
        lag.probs[name] = np.full((n, 1), 0.5)
    probes, icl = pd.concat(probes), pd.concat(icl)
    conds = [Condition("intact", "intact"), Condition("induction-excl-fv-10pct", "induction-excl-fv", 3, 0, [(0, 1)]),
             Condition("fv-excl-induction-10pct", "fv-excl-induction", 3, 0, [(0, 2)])]
    overlap = pd.DataFrame([{"a": "induction", "b": "fv", "n_top": 5, "overlap": 1, "expected": 0.1,
                             "p_value": 0.5, "spearman": 0.0}])
    cost = {"seconds_per_trial_condition": 0.5, "conditions": 3}
    verd = {v.claim: v for v in decide(drop_table(conds, lambda c: per_trial(c, probes, icl, lag)), probes, icl, lag, conds, overlap,
                                       {3: 0.1}, icl_cost=cost)}
    y2 = verd["Y2"]
    assert y2.status == "not reproduced" and "D" in y2.rule
    want = math.ceil(((1.959963984540054 + 0.8416212335729143) * d.std(ddof=1) / 0.1) ** 2)
    assert y2.power["n_needed"] == want and y2.power["n"] == n
    assert y2.power["minutes"] == pytest.approx(want * 0.5 * 3 / 60)
    line = format_verdicts([y2])[0]
    assert f"n = {want} windows would decide it at σ = {d.std(ddof=1):.3g}" in line
    assert "s per window-condition" in line and y2.to_dict()["power"]["line"] in line
    assert "no n decides it" in verd["Y1"].power_line           # every difference 0: the CI [0, 0] decides nothing
    assert verd["Y4"].power is None


def test_power_record_without_cost_or_effect():
    p = power_record([1.0, -1.0, 1.0, -1.0], unit="seeds")
    assert p["n_needed"] is None and "no n decides it" in power_line(p)
    p = power_record([0.1, 0.3, 0.2], unit="seeds")
    assert p["minutes"] is None and "min on this machine" not in power_line(p)
    assert p["n_needed"] == n_to_decide(0.1, 0.2)
    v = Verdict("D", "not reproduced", "r", "e", power=p)
    assert "[power: n = " in format_verdicts([v])[0]


def test_a_capped_n_is_said_in_the_claims_verdict():
    from inductionlab.studies.token_loss import with_cap_note
    size = sample_size(2.0, 0.1, budget_minutes=10, seconds_per_trial_condition=0.5, conditions=12).to_dict()
    run = SimpleNamespace(sizing={"sample_size": size})
    vs = [Verdict("Y1", "reproduced", "r", "e"), Verdict("Y2", "not testable", "r", "e", caveat="gate")]
    got = {v.claim: v for v in with_cap_note(vs, "Y2", run)}
    assert got["Y1"].caveat is None
    assert got["Y2"].caveat == "gate; n = 100 windows, capped by the budget: the target half-width 0.1 nats needs 1537 " \
                               "at pilot σ = 2"
    by_gate = sample_size(0.2, 0.1, gate_n=55, budget_minutes=1.0, seconds_per_trial_condition=1.0, conditions=2)
    got = with_cap_note(vs, "Y2", SimpleNamespace(sizing={"sample_size": by_gate.to_dict()}))[1]
    assert got.caveat == "gate; n = 30 windows, capped by the budget: the gate (intact D's CI above 0) needs 55"
    uncapped = SimpleNamespace(sizing={"sample_size": sample_size(2.0, 0.1).to_dict()})
    assert with_cap_note(vs, "Y2", uncapped) == vs and with_cap_note(vs, "Y2", SimpleNamespace(sizing=None)) == vs


def test_planning_sigma_is_the_80pct_upper_confidence_limit():
    """Browne (1995): σ·√((n−1)/χ²_{0.2, n−1}); for n = 16, χ²_{0.2, 15} = 10.307 (tables), factor 1.2064. Over many
    pilots of 10 draws from N(0, 1), the planned σ covers the true σ = 1 in 80% of them."""
    from inductionlab.measures.power import planning_effect, planning_sigma
    assert planning_sigma(1.0, 16) == pytest.approx(math.sqrt(15 / 10.307), rel=1e-4)
    rng = np.random.default_rng(0)
    pilots = rng.normal(0, 1, (4000, 10))
    covered = np.mean([planning_sigma(x.std(ddof=1), 10) >= 1.0 for x in pilots])
    assert covered == pytest.approx(0.8, abs=0.02)
    assert planning_effect(2.0, 0.816, 4) == pytest.approx(2.0 - 0.8416212335729143 * 0.816 / 2)
    assert planning_effect(0.2, 2.0, 4) == 0.1 and planning_effect(-0.3, 1.0, 9) == -0.3   # at least half; no gain


def test_choose_n_reads_the_paired_sd_and_the_gate():
    """A pilot of 4 windows: intact D 1, 2, 3, 2 (mean 2, SD 0.816), ablated − intact 0.1, −0.1, 0.3, −0.3 (SD 0.258);
    8 s for 2 × 4 window-conditions. Planned conservatively (3 degrees of freedom: χ²_{0.2, 3} = 1.0052, σ × 1.7276):
    n = ⌈(1.96·0.446/0.1)²⌉ = 77 > the gate's ⌈(2.80·1.410/1.657)²⌉ = 6."""
    from inductionlab.protocols.configs import TokenLossConfig
    from inductionlab.protocols.token_loss import choose_n
    intact = np.array([1.0, 2.0, 3.0, 2.0])
    diff = np.array([0.1, -0.1, 0.3, -0.3])
    nan = np.full(4, np.nan)
    pilot = {"0_slope": intact, "1_slope": intact + diff, "0_band": nan, "1_band": nan, "0_single": intact,
             "1_single": intact, "seconds": np.array([8.0])}
    got = choose_n(pilot, TokenLossConfig(), conditions=10, available=1000)
    sd = diff.std(ddof=1)
    assert got["pilot"]["seconds_per_window_condition"] == 1.0 and got["pilot"]["sigma"]["paired_slope"] == pytest.approx(sd)
    assert got["pilot"]["sigma"]["intact_band"] is None and got["pilot"]["mean"]["intact_slope"] == 2.0
    size = got["sample_size"]
    up = math.sqrt(3 / 1.0052)                                   # χ²_{0.2, 3} from tables
    assert size["n"] == math.ceil((1.959963984540054 * sd * up / 0.1) ** 2) == 77 and size["reason"] == "half-width"
    gate = math.ceil((2.8016 * intact.std(ddof=1) * up / (2 - 0.8416 * intact.std(ddof=1) / 2)) ** 2)
    assert size["gate_n"] == gate == 6 and size["minutes"] == pytest.approx(77 * 1.0 * 10 / 60)
    capped = choose_n(pilot, TokenLossConfig(budget_minutes=2.0), conditions=10, available=1000)["sample_size"]
    assert (capped["n"], capped["reason"], capped["capped"]) == (12, "budget", True)     # 120 s / (1 s × 10)


def test_demo_windows_skip_works_too_short_for_a_window(monkeypatch):
    """The demo corpus holds short poems: a draw of more windows than works (with replacement) must never pick a
    work that cannot fill a window (it raised 'demo work N is shorter than one window' mid-run before)."""
    from types import SimpleNamespace as NS

    import inductionlab.data.corpus as corpus
    from inductionlab.protocols import token_loss as TLP
    from inductionlab.protocols.configs import TokenLossConfig

    length = 20
    works = [("long-a", "x" * 30 * length), ("short", "y" * 5 * length), ("long-b", "z" * 25 * length)]
    monkeypatch.setattr(corpus, "demo_texts", lambda: works)
    tok = NS(bos_token_id=1, encode=lambda t, add_special_tokens=False: [ord(c) for c in t])  # one token a character
    w = TLP.text_windows(NS(tokenizer=tok), TokenLossConfig(text="demo"), length, n=12, seed=0)
    assert w.shape == (12, length) and (w[:, 0] == 1).all()
    assert set(w[:, 1:].unique().tolist()) <= {ord("x"), ord("z")}          # never the short work's 'y'
    monkeypatch.setattr(corpus, "demo_texts", lambda: works[1:2])
    with pytest.raises(InductionLabError, match="no work of the demo corpus is long enough"):
        TLP.text_windows(NS(tokenizer=tok), TokenLossConfig(text="demo"), length, n=2, seed=0)


def test_a_capped_size_names_what_needed_more():
    """A budget below the gate's n names the gate, not the half-width, as what asked for more."""
    by_gate = sample_size(0.2, 0.1, gate_n=55, budget_minutes=1.0, seconds_per_trial_condition=1.0, conditions=2)
    assert (by_gate.n, by_gate.needed, by_gate.reason) == (30, 55, "budget")
    assert "the budget caps it (the gate needs 55)" in by_gate.sentence()
    by_h = sample_size(0.5, 0.1, budget_minutes=1.0, seconds_per_trial_condition=1.0, conditions=2)
    assert "the budget caps it (the half-width 0.1 needs 97)" in by_h.sentence()
