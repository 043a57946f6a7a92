"""CMR reference CRPs, the CMR distance and the per-head attention CRP (Ji-An et al. 2024; measures/cmr.py,
core/scores.attention_crp).

Closed forms vs simulation. Under β_rec = 0 the context never moves, so each run draws its items independently
from ``P₁ = M[s0] / ΣM[s0]``. The closed form counts only transitions between draws; the simulation also counts
the first one, from ``s0`` (lag k ≥ 1 with probability ``P₁(s0 + k)``). At β_enc = 0.5 and s0 = 0 a run never
reaches the absorbing state (P₁ of it is 2⁻⁹⁹), so every run has exactly 100 draws, and the simulation's
expectation is, before normalisation, ``(99·C(d) + P₁(s0 + d)) / 100`` with ``C`` the closed form's unnormalised
CRP; the test checks the simulation against that within 4 standard errors of the mean over 2,000 runs, and the
closed form itself against it within 0.01 (the first transition's 1% share).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import make_tiny
from inductionlab.core.instrument import instrument
from inductionlab.core.scores import attention_crp, crp_from_pattern, lag_targets
from inductionlab.errors import InductionLabError
from inductionlab.measures import cmr


def _expected_beta_rec0(beta_enc, s0, max_lag=8):
    M = cmr.encode(beta_enc)
    p = M[s0] / M[s0].sum()
    c = np.zeros(2 * max_lag + 1)
    for k, d in enumerate(range(-max_lag, max_lag + 1)):
        c[k] = sum(p[s] * p[s + d] for s in range(len(p)) if 0 <= s + d < len(p))
    first = np.array([p[s0 + d] if d >= 1 else 0.0 for d in range(-max_lag, max_lag + 1)])
    return c / c.sum(), (99 * c + first) / 100


@pytest.mark.parametrize("gamma_ft", [0.0, 0.5])
def test_closed_form_matches_simulation_beta_rec_0(gamma_ft):
    """β_rec = 0: hand-written closed form = the module's; simulation = its exact expectation within 4 SE
    (γ_ft does not matter when the context never moves)."""
    closed_hand, expect = _expected_beta_rec0(0.5, 0)
    np.testing.assert_allclose(cmr.closed_form_crp(0.5, 0, 0), closed_hand, atol=1e-12)
    n = 2000
    rng = np.random.default_rng(3)
    samps = cmr.simulate_recall(cmr.encode(0.5), np.zeros(n), np.full(n, gamma_ft), np.zeros(n, int), rng)
    assert (samps >= 0).all()                              # 100 draws in every run
    y = cmr.run_crps(samps, np.zeros(n, int))
    mean, se = y.mean(0), y.std(0, ddof=1) / np.sqrt(n)
    assert np.all(np.abs(mean - expect) <= 4 * se + 1e-12)
    assert np.abs(closed_hand - expect / expect.sum()).max() < 0.01


def test_closed_form_matches_simulation_beta_rec_1():
    """β_rec = 1, γ_ft = 0: each draw's context is the last item, so lags are i.i.d. geometric,
    P(d) ∝ (1 − β_enc)^(d−1), d ≥ 1; the closed form equals that away from the list's end, and the simulation
    agrees within 4 SE over 400 runs."""
    b = 0.5
    geo = np.array([(1 - b) ** (d - 1) if d >= 1 else 0.0 for d in range(-8, 9)])
    geo /= geo.sum()
    np.testing.assert_allclose(cmr.closed_form_crp(b, 1, 0), geo, atol=1e-12)
    n = 400
    s0 = np.zeros(n, int)
    y = cmr.run_crps(cmr.simulate_recall(cmr.encode(b), np.ones(n), np.zeros(n), s0, np.random.default_rng(0)), s0)
    mean, se = np.nanmean(y, 0), np.nanstd(y, 0, ddof=1) / np.sqrt(n)
    assert np.all(np.abs(mean / mean.sum() - geo) <= 4 * se + 2e-3)


@pytest.fixture(scope="module")
def small_grid():
    """A 3 × 3 × 2 sub-grid of the published one (β_enc 0.3, 0.6, 1; β_rec 0, 0.5, 1; γ_ft 0, 0.5): closed forms
    where they exist, else simulated with 20 runs × 2 starts (cheap; the fit tests need distinct CRPs)."""
    be, br, gf = np.array([0.3, 0.6, 1.0]), np.array([0.0, 0.5, 1.0]), np.array([0.0, 0.5])
    crp = np.array([[[cmr.cmr_crp(x, y, z, n_exps=20, n_s0=2) for z in gf] for y in br] for x in be])
    return cmr.CMRGrid(crp, be, br, gf, {})


def test_grid_axes_are_the_published_ones():
    be, br, gf = cmr.grid_axes()
    np.testing.assert_allclose(be, np.arange(1, 21) / 20, atol=1e-12)
    np.testing.assert_allclose(br, np.arange(21) / 20, atol=1e-12)
    np.testing.assert_allclose(gf, np.arange(11) / 10, atol=1e-12)
    assert br[0] == 0 and br[-1] == 1 and gf[0] == 0       # the closed-form cells are hit exactly


@pytest.mark.parametrize("cell", [(0, 1, 1), (1, 2, 0), (2, 0, 0), (1, 0, 1)])
def test_grid_crp_fits_itself(small_grid, cell):
    f = cmr.fit_cmr(small_grid.crp[cell], small_grid)
    assert f.distance == pytest.approx(0.0, abs=1e-12)
    assert tuple(f.index) == cell
    assert (f.beta_enc, f.beta_rec, f.gamma_ft) == (small_grid.beta_enc[cell[0]], small_grid.beta_rec[cell[1]],
                                                     small_grid.gamma_ft[cell[2]])


def test_distance_invariant_under_affine_maps(small_grid):
    rng = np.random.default_rng(0)
    x = rng.random(17)
    d = cmr.cmr_distance(x, small_grid.crp)
    for a, b in ((3.0, -1.0), (0.01, 5.0), (250.0, 0.0)):
        np.testing.assert_allclose(cmr.cmr_distance(a * x + b, small_grid.crp), d, rtol=1e-9, atol=1e-12)
    # and by hand on one CRP: min-shift, max-match, mean squared difference over the variance
    c = small_grid.crp[1, 1, 1][3:14]
    a_ = x[3:14] - x[3:14].min()
    c_ = (c - c.min()) * a_.max() / (c - c.min()).max()
    assert d[1, 1, 1] == pytest.approx(np.mean((c_ - a_) ** 2) / np.var(a_), rel=1e-12)


def test_one_hot_plus_one_fits_like_an_induction_head(small_grid):
    """A profile that is 1 at lag +1 and 0 elsewhere fits β_enc = 1, β_rec = 1, γ_ft = 0 at distance 0: the one
    CMR whose CRP is a pure +1 step (encoding drift 1, so each item's context is its predecessor; retrieval drift
    1, so recall follows the chain forward; no reinstatement) — the 'induction-like' fit: forward-only (no CRP mass
    at negative lags), peak at +1, fully drifting retrieval. On the published grid every other cell has mass at
    other lags in −5..5, so the same cell wins there."""
    prof = np.zeros(17)
    prof[9] = 1.0
    f = cmr.fit_cmr(prof, small_grid)
    assert f.distance == pytest.approx(0.0, abs=1e-12) and f.distance < cmr.CMR_LIKE_THRESHOLD
    assert (f.beta_enc, f.beta_rec, f.gamma_ft) == (1.0, 1.0, 0.0)
    assert int(np.argmax(f.crp)) == 9 and f.crp[:8].sum() == 0.0
    # the backward mirror image (lag −1) is not CMR-like: CMR cannot make a purely backward CRP
    back = np.zeros(17)
    back[7] = 1.0
    assert cmr.fit_cmr(back, small_grid).distance >= cmr.CMR_LIKE_THRESHOLD


def test_flat_profile_has_no_distance(small_grid):
    f = cmr.fit_cmr(np.full((1, 2, 17), 0.3), small_grid)
    assert np.isnan(f.distance).all() and not f.cmr_like.any() and (f.score() == 0).all()


def test_lag_window_errors_are_one_line():
    with pytest.raises(InductionLabError, match="lag window") as e:
        crp_from_pattern(torch.zeros(1, 1, 11, 11), seq_len=5, max_lag=5)
    assert "\n" not in str(e.value)
    with pytest.raises(InductionLabError, match="no window"):
        cmr.cmr_distance(np.zeros(7), np.zeros((2, 17)))


def test_lag_targets_by_hand():
    # [BOS] a b c a b c: queries 4, 5, 6 hold a, b, c; earlier occurrences at 1, 2, 3
    assert lag_targets(3, True, 1).tolist() == [-1, -1, -1, -1, 2, 3, -1]
    assert lag_targets(3, True, -2).tolist() == [-1, -1, -1, -1, -1, -1, 1]
    assert lag_targets(3, False, 0).tolist() == [-1, -1, -1, 0, 1, 2]


def test_fused_lag_profile_equals_pattern_on_tiny_gqa_model():
    """The fused reduction (17 lags inside the attention call) equals the profile read by hand from the full
    eager attention pattern of the tiny GQA Llama (2 KV heads for 4 query heads)."""
    model = make_tiny("llama")
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    T, max_lag = 10, 8
    S = torch.stack([torch.randperm(600, generator=torch.Generator().manual_seed(i))[:T] + 10 for i in range(3)])
    got = attention_crp(model, sequences=S, bos_id=1, batch_size=2, max_lag=max_lag)
    assert got.profile.shape == (model.config.num_hidden_layers, model.config.num_attention_heads, 17)
    ids = torch.cat([torch.ones(3, 1, dtype=torch.long), S, S], 1)
    with torch.no_grad(), instrument(model, keep_patterns=True) as inst:
        model(input_ids=ids)
    pat = torch.stack(inst.patterns)                      # [L, B, H, Q, K]
    p0 = 1
    ref = np.zeros_like(got.profile)
    for k, d in enumerate(range(-max_lag, max_lag + 1)):
        js = [j for j in range(T) if 0 <= j + d < T]
        vals = torch.stack([pat[:, :, :, p0 + T + j, p0 + j + d] for j in js], -1)   # [L, B, H, n]
        ref[..., k] = vals.double().mean(-1).mean(1).numpy()
    np.testing.assert_allclose(got.profile, ref, atol=1e-6, rtol=0)
    for l in range(pat.shape[0]):
        np.testing.assert_allclose(crp_from_pattern(pat[l], T, bos=True, max_lag=max_lag), ref[l], atol=1e-6)


def test_the_grid_is_computed_once_then_read_from_the_user_cache(tmp_path, monkeypatch):
    """``protocols.cmr_fit.cmr_grid``: the first call computes the grid and writes it under
    ``$XDG_CACHE_HOME/inductionlab/cmr``; the second reads the same array back without computing; ``cache=False``
    computes and writes nothing; bad sizes are refused before any file is touched."""
    from inductionlab.protocols import cmr_fit

    made = []

    def fake_grid(n_exps, seed, n_s0, progress=None):
        made.append((n_exps, seed, n_s0))
        x = np.random.default_rng([seed, n_exps, n_s0]).random((20, 21, 11, 17))
        return x / x.sum(-1, keepdims=True)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(cmr, "compute_grid", fake_grid)
    path = cmr_fit.grid_cache_path(3, 0, 2)
    assert path.parent == tmp_path / "inductionlab" / "cmr" and not path.exists()
    first = cmr_fit.cmr_grid(n_exps=3, n_s0=2)
    assert made == [(3, 0, 2)] and path.is_file() and not first.params["from_cache"]
    assert first.params["cache"] == str(path) and first.params["n_exps"] == 3 and first.params["n_s0"] == 2
    again = cmr_fit.cmr_grid(n_exps=3, n_s0=2)
    assert made == [(3, 0, 2)] and again.params["from_cache"] and np.array_equal(again.crp, first.crp)
    assert again.params["seconds"] == first.params["seconds"]
    assert np.array_equal(again.beta_enc, cmr.grid_axes()[0])
    files = sorted(tmp_path.rglob("*"))
    other = cmr_fit.cmr_grid(n_exps=4, n_s0=2, cache=False)
    assert made[-1] == (4, 0, 2) and other.params["cache"] is None and sorted(tmp_path.rglob("*")) == files
    with pytest.raises(InductionLabError, match="n_exps=0"):
        cmr_fit.cmr_grid(n_exps=0)
    assert sorted(tmp_path.rglob("*")) == files


def test_measures_read_and_write_no_file():
    """``measures/`` is numbers in, numbers out (the CMR grid's cache lives in ``protocols/cmr_fit.py``): no module
    there imports a file or path library or calls a reader or writer."""
    import ast
    from pathlib import Path

    import inductionlab.measures as M

    io_modules = {"os", "pathlib", "io", "shutil", "tempfile", "pickle", "json", "hashlib", "glob", "h5py"}
    io_calls = {"open", "save", "savez", "savez_compressed", "load", "loadtxt", "savetxt", "to_csv", "read_csv",
                "to_parquet", "read_parquet", "to_json", "read_json", "write_text", "read_text"}
    found = []
    for f in sorted(Path(M.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                found += [(f.name, a.name) for a in node.names if a.name.split(".")[0] in io_modules]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in io_modules:
                found.append((f.name, node.module))
            elif isinstance(node, ast.Call):
                name = getattr(node.func, "attr", getattr(node.func, "id", None))
                if name in io_calls:
                    found.append((f.name, name))
    assert found == []
