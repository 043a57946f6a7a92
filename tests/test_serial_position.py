"""All-cue lag-probe statistics (serial_position.py) on synthetic arrays with hand-worked values.

Layout: ``cue_probs[n, c, j]`` = probability of list position j + 1's word after cue
``cue_positions[c]`` in list n; lag = (j + 1) − cue position.
"""

from __future__ import annotations

import types

import numpy as np
import pandas as pd
import pytest

from inductionlab.measures import serial_position as sp
from inductionlab.core.ablation import Condition
from inductionlab.protocols.lag_probe import LagProbeConfig, LagProbeResult, log_enrichment
from inductionlab.measures.stats import mean_ci

L = 6


def fake(cue_probs: dict, cue_positions, list_ids=None, conditions=None, far_lag=2, list_length=None):
    """A LagProbeResult-like object with the all-cue attributes (the contract with the engine)."""
    any_p = next(iter(cue_probs.values()))
    n, c, length = any_p.shape
    conditions = conditions or [Condition(name, "intact") for name in cue_probs]
    return types.SimpleNamespace(
        cue_positions=np.asarray(cue_positions), cue_probs=cue_probs,
        cue_list_mass={k: v.sum(2) for k, v in cue_probs.items()},
        cue_argmax_lag={k: np.zeros((n, c)) for k in cue_probs}, list_ids=list_ids, conditions=conditions,
        config=LagProbeConfig(list_length=list_length or length, cue_position=min(250, length), far_lag=far_lag))


def forward_recall(n: int, cues, length: int = L) -> np.ndarray:
    """All mass on the lag +1 word (nothing where the cue is the last word)."""
    p = np.zeros((n, len(cues), length), np.float32)
    for c, i in enumerate(cues):
        if i < length:
            p[:, c, i] = 1.0             # column i = list position i + 1 = lag +1
    return p


def test_perfect_forward_recall():
    cues = np.arange(1, L + 1)
    res = fake({"intact": forward_recall(4, cues)}, cues)
    curve = sp.lag_cues_curve(res).set_index("lag")
    assert curve.loc[1, "mean"] == 1.0 and curve.loc[1, "ci_low"] == 1.0
    assert (curve.drop(index=1)["mean"] == 0).all()
    assert curve.loc[1, "n_cues"] == L - 1 and curve.loc[-(L - 1), "n_cues"] == 1 and curve.loc[0, "n_cues"] == L
    serial = sp.serial_position(res)
    p1 = serial[serial.measure == "lag_plus1"]
    assert list(p1.cue_position) == list(range(1, L)) and (p1["mean"] == 1.0).all()   # no lag +1 after the last
    assert (serial[serial.measure == "lag0"]["mean"] == 0).all()
    tf = sp.temporal_factor(res).iloc[0]
    assert tf.temporal_factor == 1.0 and tf.n_cues == L - 1
    assert np.isnan(sp.lag_rank(res.cue_probs["intact"], cues)[:, -1]).all()     # the last cue has no lag +1


def test_uniform_array():
    cues = np.arange(1, L + 1)
    p = np.full((3, L, L), 1 / L, np.float32)
    res = fake({"intact": p}, cues)
    curve = sp.lag_cues_curve(res)
    assert np.allclose(curve["mean"], 1 / L)
    serial = sp.serial_position(res)
    assert np.allclose(serial[serial.measure == "lag_plus1"]["mean"], 1 / L)
    assert np.allclose(serial[serial.measure == "list_mass"]["mean"], 1.0)
    bands = sp.lag_crp_bands(res, n_bands=2)
    assert np.allclose(bands["mean_renorm"], 1 / L)               # flat renormalised lag-CRP
    # all L − 1 candidates tied: average rank L/2, percentile (L/2 − 1)/(L − 2) = 1/2 exactly
    assert np.all(sp.lag_rank(p, cues)[:, :-1] == 0.5)
    assert sp.temporal_factor(res).iloc[0].temporal_factor == 0.5


def test_lag_rank_by_hand():
    # list of 5, cue 2: candidates exclude position 2 (the cue); the +1 word (position 3) has 0.2
    # among {0.1, 0.2, 0.3, 0.2} → average rank 2.5 of 4 → (2.5 − 1)/(4 − 1) = 0.5;
    # cue 1: +1 word 0.05 among {0.05, 0.02, 0.02, 0.01} (the cue's 0.9 excluded) → rank 4 → 1.0;
    # cue 4: +1 word (position 5) 0.0 among {0.4, 0.3, 0.2, 0.0} → rank 1 → 0.0
    p = np.array([[[0.9, 0.05, 0.02, 0.02, 0.01],
                   [0.1, 0.5, 0.2, 0.3, 0.2],
                   [0.4, 0.3, 0.2, 0.1, 0.0]]])
    r = sp.lag_rank(p, [1, 2, 4])
    assert r.tolist() == [[1.0, 0.5, 0.0]]
    res = fake({"intact": p}, [1, 2, 4])
    assert sp.temporal_factor(res).iloc[0].temporal_factor == pytest.approx(0.5)


def test_serial_position_by_hand():
    rng = np.random.default_rng(0)
    p = rng.random((5, 3, L))
    res = fake({"intact": p}, [1, 3, 6])
    s = sp.serial_position(res).set_index(["measure", "cue_position"])
    assert s.loc[("lag_plus1", 3), "mean"] == pytest.approx(p[:, 1, 3].mean())
    assert s.loc[("lag_minus1", 3), "mean"] == pytest.approx(p[:, 1, 1].mean())
    assert s.loc[("lag0", 6), "mean"] == pytest.approx(p[:, 2, 5].mean())
    assert s.loc[("list_mass", 1), "mean"] == pytest.approx(p[:, 0].sum(1).mean())
    assert ("lag_plus1", 6) not in s.index and ("lag_minus1", 1) not in s.index
    m, h = mean_ci(p[:, 1, 3])
    assert s.loc[("lag_plus1", 3), "ci_high"] == pytest.approx(m + h)


def test_pooled_curve_averages_cues_per_list_then_lists():
    # 2 lists, cues 2 and 3 of a list of 3: lag +1 exists for both cues, lag −2 only for cue 3
    p = np.array([[[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]],
                  [[0.7, 0.8, 0.9], [0.2, 0.4, 0.6]]])
    lags, per_list, n = sp.by_lag(p, [2, 3])
    assert lags.tolist() == [-2, -1, 0, 1, 2]
    assert n.tolist() == [1, 2, 2, 1, 0]
    assert per_list[:, 3].tolist() == [0.3, 0.9]                       # lag +1: cue 2 only (cue 3 is last)
    assert per_list[:, 1] == pytest.approx([(0.1 + 0.5) / 2, (0.7 + 0.4) / 2])   # lag −1: both cues
    assert np.isnan(per_list[:, 4]).all()
    curve = sp.lag_cues_curve(fake({"intact": p}, [2, 3])).set_index("lag")
    assert 2 not in curve.index and curve.loc[-1, "mean"] == pytest.approx((0.3 + 0.55) / 2)


def test_clustered_ci_duplicated_cues_do_not_shrink_it():
    rng = np.random.default_rng(1)
    p = rng.random((8, 4, L)).astype(np.float32)
    cues = np.array([1, 2, 4, 5])
    conds = [Condition("intact", "intact"), Condition("induction-2", "induction", 2),
             Condition("random-2-d0", "random", 2, 0), Condition("random-2-d1", "random", 2, 1)]
    arrays = {c.name: rng.random((8, 4, L)).astype(np.float32) for c in conds}
    ids = np.array([rng.permutation(L) + 10 for _ in range(8)])
    once = fake(arrays, cues, ids, conds)
    twice = fake({k: np.repeat(v, 3, axis=1) for k, v in arrays.items()}, np.repeat(cues, 3), ids, conds)
    for f in (sp.lag_cues_curve, sp.serial_position, sp.temporal_factor, sp.cue_contrasts,
              lambda r: sp.lag_crp_bands(r, n_bands=2)):
        a, b = f(once), f(twice)
        if "cue_position" in b:                   # one row per cue: the triplicated rows are equal
            b = b.drop_duplicates(["condition", "measure", "cue_position"]).reset_index(drop=True)
        num = [c for c in a.columns if c != "n_cues" and a[c].dtype.kind == "f"]
        assert len(num) >= 3
        pd.testing.assert_frame_equal(a[num], b[num])
    # whereas treating the (list, cue) pairs as independent would shrink the CI
    m, h_list = mean_ci(p[:, :, :].mean(1))
    _, h_pairs = mean_ci(np.repeat(p, 3, axis=1).reshape(-1, L))
    assert (h_pairs < h_list).all()


def test_band_edges():
    assert sp.band_edges(np.arange(1, 501)) == [(1 + 50 * b, 50 * (b + 1)) for b in range(10)]
    # 25 positions in 10 bands: cuts at floor(b·25/10) = 0, 2, 5, 7, 10, 12, 15, 17, 20, 22, 25
    assert sp.band_edges(np.arange(1, 26)) == [(1, 2), (3, 5), (6, 7), (8, 10), (11, 12), (13, 15), (16, 17),
                                               (18, 20), (21, 22), (23, 25)]
    assert sp.band_edges([101, 102, 103], 10) == [(101, 101), (102, 102), (103, 103)]   # fewer positions than bands
    assert sp.band_edges([1, 2, 100], 4) == [(1, 25), (76, 100)]                        # empty bands dropped
    with pytest.raises(ValueError):
        sp.band_edges([], 10)


def test_lag_crp_bands_pool_their_own_cues():
    cues = np.arange(1, L + 1)
    p = forward_recall(2, cues) + 0.0
    p[:, :3] *= 2                                     # cues 1-3: mass 2 on +1 (renormalised: still 1)
    res = fake({"intact": p}, cues)
    b = sp.lag_crp_bands(res, n_bands=2)
    assert sorted(set(zip(b.band_first, b.band_last))) == [(1, 3), (4, 6)]
    plus1 = b[b.lag == 1].set_index("band")
    assert plus1.loc[0, "mean"] == 2.0 and plus1.loc[1, "mean"] == 1.0   # band 2: cues 4, 5 (6 has no +1)
    assert (plus1["mean_renorm"] == 1.0).all() and plus1.loc[1, "n_cues"] == 2
    assert sp.lag_crp_bands(res, n_bands=2, max_lag=1).lag.abs().max() == 1


def test_word_prior_only_array_corrected_curve_is_zero():
    rng = np.random.default_rng(2)
    n, length = 12, 8
    prior = rng.random(50) ** 4 * 0.1              # skewed word priors
    ids = np.array([rng.choice(50, length, replace=False) for _ in range(n)])
    cues = np.arange(1, length + 1)
    p = np.broadcast_to(prior[ids][:, None, :], (n, length, length)).astype(np.float64)
    res = fake({"intact": p}, cues, ids, far_lag=2)
    curve = sp.lag_cues_curve(res)
    raw, corr = curve[curve.measure == "prob"], curve[curve.measure == "log_enrichment"]
    assert raw["mean"].std() > 1e-3                # the raw curve carries the word priors' noise
    assert np.abs(corr["mean"]).max() < 1e-12
    con = sp.cue_contrasts(fake({c: p for c in ("intact", "induction-1", "random-1-d0")}, cues, ids, [
        Condition("intact", "intact"), Condition("induction-1", "induction", 1), Condition("random-1-d0", "random", 1)]))
    assert np.allclose(con.random_minus_induction, 0)


def test_single_cue_matches_seed_enrichment_and_curve():
    rng = np.random.default_rng(3)
    n, length, cue = 10, 9, 4
    p = rng.random((n, length)) * 0.01
    ids = np.array([rng.permutation(length) for _ in range(n)])
    seed = LagProbeResult({"intact": p}, {"intact": p.sum(1)}, {"intact": np.zeros(n)}, [Condition("intact", "intact")],
                          LagProbeConfig(list_length=length, cue_position=cue, far_lag=2), list_ids=ids)
    transform = sp.cue_log_enrichment(p[:, None, :], ids, [cue], far_lag=2)
    assert np.allclose(transform(0, p), log_enrichment(p, ids, seed.lags, far_lag=2))
    res = fake({"intact": p[:, None, :]}, [cue], ids, far_lag=2)
    mine = sp.lag_cues_curve(res)
    for measure, theirs in (("prob", seed.summary()), ("log_enrichment", seed.corrected_summary())):
        m = mine[mine.measure == measure].set_index("lag")
        t = theirs.set_index("lag")
        assert np.allclose(m["mean"], t.loc[m.index, "mean"]) and np.allclose(m["ci_high"], t.loc[m.index, "ci_high"])


def test_contrasts_pool_draws_per_list():
    rng = np.random.default_rng(4)
    cues = np.array([2, 3])
    conds = [Condition("intact", "intact"), Condition("induction-1", "induction", 1),
             Condition("random-1-d0", "random", 1, 0), Condition("random-1-d1", "random", 1, 1)]
    arrays = {c.name: rng.random((6, 2, 4)) for c in conds}
    con = sp.cue_contrasts(fake(arrays, cues, conditions=conds)).set_index("measure")
    assert set(con.index) == {"prob", "temporal_factor"}               # no list_ids: no corrected row
    per_list = lambda a: (a[:, 0, 2] + a[:, 1, 3]) / 2                  # noqa: E731  lag +1 of cues 2 and 3
    d = (per_list(arrays["random-1-d0"]) + per_list(arrays["random-1-d1"])) / 2 - per_list(arrays["induction-1"])
    m, h = mean_ci(d)
    assert con.loc["prob", "random_minus_induction"] == pytest.approx(m)
    assert con.loc["prob", "ci_low"] == pytest.approx(m - h)
    assert con.loc["prob", "z"] == pytest.approx(m / (d.std(ddof=1) / np.sqrt(6)))
    tf = sp.temporal_factor(fake(arrays, cues, conditions=conds)).set_index("condition")
    assert tf.loc["random-1", "draw"] == "mean of 2"
    assert con.loc["temporal_factor", "random"] == pytest.approx(tf.loc["random-1", "temporal_factor"])


def test_has_cues():
    p = np.zeros((2, 2, 3))
    assert sp.has_cues(fake({"intact": p}, [1, 2]))
    assert not sp.has_cues(fake({"intact": p[:, :1]}, [1]))
    assert not sp.has_cues(types.SimpleNamespace(probs={}))
    with pytest.raises(ValueError):
        sp.by_lag(p, [1, 4])                       # cue outside the list


@pytest.mark.parametrize("far", [1, 3, 9])          # 9 > list: no word is ever far, all positions count
def test_cue_log_enrichment_against_a_brute_force_baseline(far):
    rng = np.random.default_rng(5)
    n, length = 4, 7
    cues = np.array([1, 3, 4, 7])
    p = rng.random((n, len(cues), length))
    ids = np.array([rng.choice(9, length, replace=False) for _ in range(n)])
    got = sp.cue_log_enrichment(p, ids, cues, far_lag=far)
    for w in np.unique(ids):
        far_vals = [p[t, c, j] for t in range(n) for c in range(len(cues)) for j in range(length)
                    if ids[t, j] == w and abs(j + 1 - cues[c]) > far]
        all_vals = [p[t, c, j] for t in range(n) for c in range(len(cues)) for j in range(length) if ids[t, j] == w]
        base = np.mean(far_vals) if far_vals else np.mean(all_vals)
        for c in range(len(cues)):
            e = got(c, p[:, c, :])
            assert np.allclose(e[ids == w], np.log(p[:, c, :][ids == w]) - np.log(base))


# -- wiring: analyze's run directory and report with a result that carries per-cue arrays ----------
def _analyze_like(with_cues: bool, n=6, length=30, cue=15):
    import json

    from inductionlab.core.scores import HeadScores
    rng = np.random.default_rng(6)
    conds = [Condition("intact", "intact"), Condition("induction-2", "induction", 2, 0, [(0, 0), (0, 1)]),
             Condition("random-2-d0", "random", 2, 0, [(1, 0), (1, 1)]), Condition("random-2-d1", "random", 2, 1, [(1, 1), (0, 1)])]
    cues = np.arange(1, length + 1)
    cue_probs = {}
    for c in conds:
        p = rng.random((n, length, length)) * 1e-3
        p[:, np.arange(length - 1), np.arange(1, length)] += 0.05 if c.kind != "induction" else 0.01   # lag +1
        cue_probs[c.name] = p.astype(np.float32)
    ids = np.array([rng.permutation(length) + 100 for _ in range(n)])
    cfg = LagProbeConfig(list_length=length, cue_position=cue, n_permutations=n, far_lag=3)
    probs = {k: v[:, cue - 1, :].copy() for k, v in cue_probs.items()}       # the seed trial = cue 15
    lag = LagProbeResult(probs, {k: v.sum(1).astype(np.float64) for k, v in probs.items()},
                         {k: np.full(n, 1.0) for k in probs}, conds, cfg, list_ids=ids)
    if with_cues:
        lag.cue_positions, lag.cue_probs = cues, cue_probs
        lag.cue_list_mass = {k: v.sum(2) for k, v in cue_probs.items()}
        lag.cue_argmax_lag = {k: np.ones((n, length)) for k in cue_probs}
    hs = HeadScores({"induction": rng.random((2, 2))}, {"first_copy": 5.0, "second_copy": 1.0})
    record = {"model": {"name": "fake"}, "params": {"lag": {"n_permutations": n, "list_length": length,
                                                            "cue_position": cue, "method": "zero"}},
              "top_induction_heads": [{"layer": 0, "head": 0, "score": 0.9}]}
    if with_cues:
        record["lag_cues"] = sp.cue_json(lag)
        json.loads(json.dumps(__import__("inductionlab.runtime.runs", fromlist=["_jsonable"])._jsonable(record),
                              allow_nan=False))               # results.json stays strict JSON
    return types.SimpleNamespace(loaded=types.SimpleNamespace(identity={"name": "fake"}), scores=hs, lag=lag,
                                 timings={"lag_probe_s": 1.0}, record=record)


def test_analyze_outputs_with_cue_arrays(tmp_path):
    from inductionlab.studies import report
    from inductionlab.studies.analyze import analyze_report, write_analyze_outputs
    seed, full = _analyze_like(False), _analyze_like(True)
    write_analyze_outputs(tmp_path / "seed", seed)
    write_analyze_outputs(tmp_path / "full", full)
    for f in report.CUE_FILES:
        assert (tmp_path / "full" / f).stat().st_size > 0 and not (tmp_path / "seed" / f).exists()
    for f in ("lag_headline.csv", "lag_curves.csv", "lag_curves_corrected.csv"):      # the seed numbers: unchanged
        assert (tmp_path / "full" / f).read_bytes() == (tmp_path / "seed" / f).read_bytes()
    serial = pd.read_csv(tmp_path / "full" / "serial_position.csv")
    r = serial[(serial.condition == "random-2") & (serial.measure == "lag_plus1") & (serial.cue_position == 4)]
    want = (full.lag.cue_probs["random-2-d0"][:, 3, 4].astype(np.float64) + full.lag.cue_probs["random-2-d1"][:, 3, 4]) / 2
    assert r["mean"].iloc[0] == pytest.approx(want.mean())
    bands = pd.read_csv(tmp_path / "full" / "lag_crp_bands.csv")
    assert sorted(set(zip(bands.band_first, bands.band_last))) == [(1 + 3 * b, 3 * b + 3) for b in range(10)]
    bs = sp.band_summary(full.lag).set_index("condition").loc["intact"]        # cues 1–3, 13–15, 28–30
    p = full.lag.cue_probs["intact"].astype(np.float64)
    assert (bs.first_band, bs.middle_band, bs.last_band) == ("1–3", "13–15", "28–30")
    assert bs["first"] == pytest.approx(np.mean([p[:, i - 1, i] for i in (1, 2, 3)]))
    assert bs["last"] == pytest.approx(np.mean([p[:, i - 1, i] for i in (28, 29)]))      # cue 30 has no +1
    text = analyze_report(full)
    assert "## All-cue lag probe" in text and "serial_position.png" in text and "| random-2 |" in text
    assert "All-cue" not in analyze_report(seed)
    con = pd.read_csv(tmp_path / "full" / "cue_contrasts.csv").set_index("measure")
    assert con.loc["prob", "random_minus_induction"] == pytest.approx(0.04, abs=2e-3)   # 0.05 − 0.01 injected at +1
    assert con.loc["prob", "ci_low"] > 0
    tf = pd.read_csv(tmp_path / "full" / "temporal_factor.csv").set_index("condition")
    assert tf.loc["intact", "temporal_factor"] == 1.0            # +0.05 on the +1 word beats every 1e-3 word
    assert 0.5 < tf.loc["induction-2", "temporal_factor"] <= 1.0


def test_cue_outputs_in_tables_and_plots_folders(tmp_path):
    from inductionlab.studies import report
    full = _analyze_like(True)
    report.write_cue_outputs(tmp_path / "tables", tmp_path / "plots", full.lag, "fake", ["intact", "induction-2",
                             "random-2"], ["intact", "induction-2", "random-2"])
    assert sorted(p.name for p in (tmp_path / "tables").iterdir()) == sorted(
        f for f in report.CUE_FILES if f.endswith(".csv"))
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == sorted(
        f for f in report.CUE_FILES if f.endswith(".png"))
    assert "![serial position](plots/serial_position.png)" in report.cue_lines(full.lag, "plots/")
