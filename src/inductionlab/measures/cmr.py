"""CMR reference CRPs and the CMR distance of an attention-by-lag profile (Ji-An, Zhou, Benna & Mattar 2024,
"Linking in-context learning in transformers to human episodic memory", arXiv 2405.14992; code corxyz/icl-cmr,
``src/est_cmr_crp.py`` and ``src/fit_attn_score.py``). numpy only; our own implementation of their definitions.

**CMR** (the context maintenance and retrieval model) as the authors set it up: ``n = 100`` one-hot items studied
in order, plus one absorbing state (index ``n``: reaching it ends recall). The context transition ``T`` shifts by
one (``T[i, i+1] = 1``) and encoding with drift ``β_enc`` gives the context-to-item matrix
``M = (I − (1 − β_enc) T)⁻¹ T``, i.e. ``M[i, j] = (1 − β_enc)^(j−i−1)`` for ``j > i``, else 0
(:func:`encode`). Recall starts with context ``t = e_{s0}``; each step draws an item with probability
``∝ (Mᵀ t)``, then moves the context towards ``t_IN = (1 − γ_ft) f + γ_ft M f`` (``f`` the recalled item,
normalised): ``t ← (1 − β_rec) t + β_rec t_IN``, normalised (:func:`simulate_recall`). At most ``max_samps = 100``
draws per run.

**CRP** (:func:`cmr_crp`): per run, the share of its transitions at each lag ``−8..+8`` (the first from ``s0``,
the rest between consecutive draws); the mean over runs, normalised to sum 1; the mean over start positions
``s0 = 0..19``. Two cases have closed forms (the authors'): ``β_rec = 0, γ_ft = 0`` (the context never moves, so
draws are independent with ``P₁ = M[s0] / ΣM[s0]`` and ``CRP(d) ∝ Σ_s P₁(s) P₁(s + d)``) and ``β_rec = 1,
γ_ft = 0`` (``CRP(d) ∝ Σ_s P_d(s) M[s, s+d] / ΣM[s]`` with ``P_d = M^d[s0] / ΣM^d[s0]``, forward lags only).
The closed forms ignore the first transition from ``s0`` and the simulation does not (a 1/100 share of a run's
transitions); tests/test_cmr.py bounds the difference.

**Grid** (:func:`compute_grid`): ``β_enc`` 0.05…1 (20 values), ``β_rec`` 0…1 step 0.05 (21), ``γ_ft`` 0…1 step 0.1
(11), the authors' ``np.mgrid`` values, shape ``[20, 21, 11, 17]``. The simulation is vectorised over runs, start
positions and (β_rec, γ_ft); its Monte-Carlo size (runs per start position) is a parameter (the authors used
1,000, which took them days); :func:`inductionlab.protocols.cmr_fit.cmr_grid` caches it in the user cache dir
(this module reads and writes no file).

**CMR distance** (:func:`cmr_distance`, the authors' ``get_head_mse``): on lags ``−5..+5`` (``select_range``),
shift the head's profile ``x`` to minimum 0 (``a = x − min x``), shift the CRP ``c`` to minimum 0 and scale it to
``a``'s maximum (``ĉ = (c − min c)·max a / max(c − min c)``); distance = ``mean((ĉ − a)²) / var(a)`` (population
variance). It is invariant under ``x → p·x + q`` (``p > 0``). :func:`fit_cmr` minimises it over the grid (the
first minimum in C order, as ``np.argmin``); a head is **CMR-like** iff its distance is below 0.5
(``mse_thres``). A flat profile has no distance (NaN, fitted parameters NaN).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from ..errors import InductionLabError

N_ITEMS = 100            # distinct items (est_cmr_crp.py: n)
MAX_LAG = 8              # CRP lags -8..+8 (max_lag)
MAX_SAMPS = 100          # draws per recall run (max_samps)
N_S0 = 20                # start positions 0..19 (n_s0)
N_EXPS_PAPER = 1000      # runs per start position in the authors' grid (n_exps)
SELECT_RANGE = 5         # lags -5..+5 enter the distance (fit_attn_score.py: select_range)
CMR_LIKE_THRESHOLD = 0.5  # CMR-like iff distance < 0.5 (fit_attn_score.py: mse_thres)
LAGS = np.arange(-MAX_LAG, MAX_LAG + 1)


def grid_axes() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(β_enc [20], β_rec [21], γ_ft [11])``: the authors' ``np.mgrid`` values, bit for bit."""
    b = 1 / 20
    g = 1 / 10
    B = np.mgrid[b:1 + b:b, 0:1 + b:b, 0:1 + g:g]
    return B[0, :, 0, 0].copy(), B[1, 0, :, 0].copy(), B[2, 0, 0, :].copy()


def encode(beta_enc: float, n: int = N_ITEMS) -> np.ndarray:
    """Context-to-item matrix ``M = (I − (1 − β_enc) T)⁻¹ T`` ``[n + 1, n + 1]`` (the last state absorbing)."""
    T = np.eye(n + 1, k=1)
    return np.linalg.inv(np.eye(n + 1) - (1 - beta_enc) * T) @ T


def closed_form_crp(beta_enc: float, beta_rec: float, s0: int, max_lag: int = MAX_LAG, n: int = N_ITEMS) -> np.ndarray:
    """The authors' closed-form CRP ``[2·max_lag + 1]`` (lags −max_lag..max_lag, sums to 1) for one start
    position, for ``γ_ft = 0`` and ``β_rec`` 0 or 1 (``est_cmr_crp.getCRP``).

    Raises:
        InductionLabError: ``β_rec`` not 0 or 1."""
    M = encode(beta_enc, n)
    crp = np.zeros(2 * max_lag + 1)
    if beta_rec == 0:
        p1 = M[s0] / M[s0].sum()
        crp[max_lag] = np.square(p1).sum()
        for d in range(1, min(n, max_lag + 1)):
            crp[max_lag + d] = (p1[:-d] * p1[d:]).sum()
            crp[max_lag - d] = (p1[d:] * p1[:-d]).sum()
    elif beta_rec == 1:
        rows = M.sum(axis=1)
        Mp = np.eye(M.shape[0])
        with np.errstate(invalid="ignore", divide="ignore"):
            for d in range(1, max_lag + 1):
                Mp = Mp @ M
                p1 = Mp[s0] / Mp[s0].sum()
                p2 = np.append(np.diagonal(M, offset=d), np.zeros(d)) / rows
                crp[max_lag + d] = np.nansum(p1 * p2)
    else:
        raise InductionLabError(f"beta_rec={beta_rec}: the closed form exists for beta_rec 0 or 1 (with gamma_ft 0)")
    return crp / crp.sum()


def simulate_recall(M: np.ndarray, beta_rec, gamma_ft, s0, rng: np.random.Generator,
                    max_samps: int = MAX_SAMPS) -> np.ndarray:
    """CMR recall runs, vectorised: ``beta_rec``, ``gamma_ft``, ``s0`` are arrays ``[R]`` (one run each).

    Returns: int ``[R, max_samps]`` recalled item per step, ``-1`` after the run ended (absorbing state).
    Each step is the authors' ``recall`` loop body (``est_cmr_crp.recall``): draw the first item whose
    cumulative probability reaches a uniform number (``rand() <= cumsum(P)``), then update the context.
    The cumulative sums are read as ``cumsum(M, axis=1)ᵀ t``; the context is held state-major
    (``[states, runs]``) in float32 (the draws' probabilities to ~1e-7, far below the Monte-Carlo error);
    runs that ended are dropped."""
    S = M.shape[0]
    absorbing = S - 1
    McT = np.ascontiguousarray(np.cumsum(M, axis=1).T, dtype=np.float32)
    M32 = M.astype(np.float32)
    b = np.asarray(beta_rec, np.float32)
    g = np.asarray(gamma_ft, np.float32)
    s0 = np.asarray(s0, int)
    R = len(s0)
    run = np.arange(R)                                     # the runs still recalling
    t = np.zeros((S, R), np.float32)
    t[s0, run] = 1.0
    samps = np.full((R, max_samps), -1, dtype=int)
    for i in range(max_samps):
        if not len(run):
            break
        C = McT @ t                                        # [S, runs]: cumsum of Mᵀ t
        u = rng.random(len(run), dtype=np.float32) * C[-1]
        item = (C < u).sum(axis=0)
        go = item < absorbing
        if not go.all():
            run, t, b, g, item = run[go], t[:, go], b[go], g[go], item[go]
        samps[run, i] = item
        t_in = M32[:, item] * g                            # γ_ft · M f
        t_in[item, np.arange(len(run))] += 1 - g
        t_in /= np.linalg.norm(t_in, axis=0)
        t = (1 - b) * t + b * t_in
        t /= np.linalg.norm(t, axis=0)
    return samps


def run_crps(samps: np.ndarray, s0, max_lag: int = MAX_LAG) -> np.ndarray:
    """Per run, the share of its transitions at each lag ``−max_lag..max_lag`` (``est_cmr_crp.estimateCRP``
    before the mean): float ``[R, 2·max_lag + 1]``, NaN rows for runs without a draw."""
    s0 = np.asarray(s0, int)
    prev = np.concatenate([s0[:, None], samps[:, :-1]], axis=1)
    ok = samps >= 0
    lag = samps - prev
    keep = ok & (np.abs(lag) <= max_lag)
    R = len(s0)
    count = np.zeros((R, 2 * max_lag + 1))
    rows = np.broadcast_to(np.arange(R)[:, None], lag.shape)
    np.add.at(count, (rows[keep], lag[keep] + max_lag), 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return count / ok.sum(axis=1, keepdims=True)


def _normalised_mean(y: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        m = np.nanmean(y, axis=0)
    return m / m.sum()


def simulated_crp(beta_enc: float, beta_rec: float, gamma_ft: float, s0: int, n_exps: int, seed: int = 0,
                  max_samps: int = MAX_SAMPS) -> np.ndarray:
    """The simulated CRP ``[17]`` (sums to 1) of one start position from ``n_exps`` runs."""
    rng = np.random.default_rng(seed)
    s = np.full(n_exps, s0)
    samps = simulate_recall(encode(beta_enc), np.full(n_exps, beta_rec), np.full(n_exps, gamma_ft), s, rng, max_samps)
    return _normalised_mean(run_crps(samps, s))


def cmr_crp(beta_enc: float, beta_rec: float, gamma_ft: float, n_exps: int = 100, seed: int = 0,
            n_s0: int = N_S0) -> np.ndarray:
    """CMR's CRP ``[17]`` at one parameter triple: the mean over start positions ``0..n_s0−1`` of each start's
    normalised CRP, closed form where one exists (:func:`closed_form_crp`), else simulated with ``n_exps`` runs
    per start."""
    if gamma_ft == 0 and beta_rec in (0, 1):
        return np.mean([closed_form_crp(beta_enc, beta_rec, s) for s in range(n_s0)], axis=0)
    return np.mean([simulated_crp(beta_enc, beta_rec, gamma_ft, s, n_exps, seed=seed * 1000 + s)
                    for s in range(n_s0)], axis=0)


def _grid_block(beta_enc: float, b_rec: np.ndarray, g_ft: np.ndarray, n_exps: int, n_s0: int,
                rng: np.random.Generator) -> np.ndarray:
    """The simulated CRPs of every (β_rec, γ_ft) pair at one β_enc: ``[len(pairs), 17]``."""
    M = encode(beta_enc)
    P = len(b_rec)
    s0 = np.tile(np.repeat(np.arange(n_s0), n_exps), P)
    br = np.repeat(b_rec, n_s0 * n_exps)
    gf = np.repeat(g_ft, n_s0 * n_exps)
    y = run_crps(simulate_recall(M, br, gf, s0, rng), s0).reshape(P, n_s0, n_exps, -1)
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)    # a start without any run within ±8: NaN, as the authors'
        m = np.nanmean(y, axis=2)                          # [P, n_s0, 17]
        return np.nanmean(m / m.sum(-1, keepdims=True), axis=1)


def compute_grid(n_exps: int = 100, seed: int = 0, n_s0: int = N_S0, progress=None) -> np.ndarray:
    """CMR's CRP on the whole grid, float64 ``[20, 21, 11, 17]`` (axes :func:`grid_axes`, lags −8..+8).

    Closed forms at (β_rec, γ_ft) = (0, 0) and (1, 0); the rest simulated, ``n_exps`` runs per start position
    and ``n_s0`` start positions, vectorised per β_enc; runs drawn from ``np.random.default_rng([seed, i])``
    for the i-th β_enc. Cost ∝ ``n_exps``: about 10 CPU seconds per β_enc at ``n_exps = 10`` (so about 3–4
    CPU minutes for the grid; docs/study-head-types.md).
    """
    be, br, gf = grid_axes()
    out = np.zeros((len(be), len(br), len(gf), 2 * MAX_LAG + 1))
    J, K = np.meshgrid(np.arange(len(br)), np.arange(len(gf)), indexing="ij")
    J, K = J.ravel(), K.ravel()
    closed = (gf[K] == 0) & ((br[J] == 0) | (br[J] == 1))
    for i, b in enumerate(be):
        for j, k in zip(J[closed], K[closed]):
            out[i, j, k] = np.mean([closed_form_crp(b, br[j], s) for s in range(n_s0)], axis=0)
        sim = ~closed
        out[i, J[sim], K[sim]] = _grid_block(b, br[J[sim]], gf[K[sim]], n_exps, n_s0,
                                             np.random.default_rng([seed, i]))
        if progress is not None:
            progress(1)
    return out


@dataclass(frozen=True)
class CMRGrid:
    """CMR's CRPs on the grid. ``crp``: float64 ``[20, 21, 11, 17]``; ``beta_enc``, ``beta_rec``, ``gamma_ft``:
    the axes; ``params``: how it was made (:func:`grid_params`, and its maker's seconds and cache path)."""
    crp: np.ndarray
    beta_enc: np.ndarray
    beta_rec: np.ndarray
    gamma_ft: np.ndarray
    params: dict


def grid_params(n_exps: int = 100, seed: int = 0, n_s0: int = N_S0) -> dict:
    """The record of a grid's making (n_exps, n_s0, seed, n_items, max_samps, source), its sizes checked.

    Raises:
        InductionLabError: ``n_exps`` or ``n_s0`` below 1 or ``n_s0`` above 100."""
    if isinstance(n_exps, bool) or not isinstance(n_exps, (int, np.integer)) or n_exps < 1:
        raise InductionLabError(f"CMR grid n_exps={n_exps!r}: give the number of simulated runs per start, >= 1")
    if not 1 <= n_s0 <= N_ITEMS:
        raise InductionLabError(f"CMR grid n_s0={n_s0!r}: start positions must be 1..{N_ITEMS}")
    return {"n_exps": int(n_exps), "n_s0": int(n_s0), "seed": int(seed), "n_items": N_ITEMS,
            "max_samps": MAX_SAMPS, "source": "Ji-An et al. 2024, corxyz/icl-cmr src/est_cmr_crp.py"}


# ---- the distance and the fit --------------------------------------------------------------------------

def _window(x: np.ndarray, select_range: int) -> np.ndarray:
    """Lags ``−select_range..select_range`` of ``[..., 2m + 1]`` profiles centred on lag 0."""
    m = x.shape[-1] // 2
    if x.shape[-1] % 2 != 1 or not 1 <= select_range <= m:
        raise InductionLabError(f"a lag profile of {x.shape[-1]} entries (lags -{m}..{m}) has no window of lags "
                                f"-{select_range}..{select_range}; give an odd length 2m+1 with m >= select_range")
    return x[..., m - select_range:m + select_range + 1]


def cmr_distance(profile, crps, select_range: int = SELECT_RANGE) -> np.ndarray:
    """CMR distance of one profile to each CRP (``fit_attn_score.get_head_mse``).

    Args:
        profile: ``[2m + 1]`` attention by lag ``−m..m``.
        crps: ``[..., 2m' + 1]`` CRPs by lag ``−m'..m'`` (any leading shape).
        select_range: lags ``−r..r`` compared (the authors' 5).

    Returns: float64 ``[...]``; NaN for a flat profile (zero variance) or a flat CRP.

    Raises:
        InductionLabError: a window wider than a profile."""
    a = _window(np.asarray(profile, float), select_range)
    c = _window(np.asarray(crps, float), select_range)
    a = a - a.min()
    c = c - c.min(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        c = c * (a.max() / c.max(-1, keepdims=True))
        return np.mean((c - a) ** 2, axis=-1) / np.var(a)


@dataclass(frozen=True)
class CMRFit:
    """Best fits of profiles ``[n_layers, n_heads, 17]``: ``distance`` ``[L, H]``; ``beta_enc``, ``beta_rec``,
    ``gamma_ft`` ``[L, H]`` fitted parameters; ``index`` int ``[L, H, 3]`` grid indices; ``crp`` ``[L, H, 17]``
    the fitted CRPs (NaN everywhere for a flat profile)."""
    distance: np.ndarray
    beta_enc: np.ndarray
    beta_rec: np.ndarray
    gamma_ft: np.ndarray
    index: np.ndarray
    crp: np.ndarray

    @property
    def cmr_like(self) -> np.ndarray:
        """bool ``[L, H]``: distance < 0.5 (Ji-An et al.'s CMR-like heads)."""
        return np.nan_to_num(self.distance, nan=np.inf) < CMR_LIKE_THRESHOLD

    def score(self) -> np.ndarray:
        """A ranking where higher = more CMR-like: ``1 / (1 + distance)`` in (0, 1], 0 for a flat profile."""
        return np.nan_to_num(1.0 / (1.0 + self.distance), nan=0.0)

    def share_per_layer(self) -> np.ndarray:
        """``[L]`` share of each layer's heads that are CMR-like (Ji-An et al.'s Fig. 6)."""
        return self.cmr_like.mean(axis=1)


def fit_cmr(profiles, grid: CMRGrid, select_range: int = SELECT_RANGE) -> CMRFit:
    """Fit every head's profile to the grid (``fit_attn_score.fit_head_cmr``: the minimum distance; ties and
    order as ``np.argmin`` in C order over (β_enc, β_rec, γ_ft)).

    Args:
        profiles: ``[L, H, 2m + 1]`` attention by lag (or ``[2m + 1]`` for one head).
        grid: the grid's CRPs (:func:`compute_grid`; cached: :func:`inductionlab.protocols.cmr_fit.cmr_grid`).

    Raises:
        InductionLabError: a profile without the lag window."""
    x = np.asarray(profiles, float)
    one = x.ndim == 1
    x = x.reshape((1, 1, -1)) if one else x
    L, H, _ = x.shape
    shape = grid.crp.shape[:3]
    dist = np.full((L, H), np.nan)
    idx = np.full((L, H, 3), -1, dtype=int)
    for l in range(L):
        for h in range(H):
            d = cmr_distance(x[l, h], grid.crp, select_range)
            if np.isnan(d).all():
                continue
            k = int(np.nanargmin(d))
            dist[l, h] = d.flat[k]
            idx[l, h] = np.unravel_index(k, shape)
    ok = idx[..., 0] >= 0
    pick = lambda axis, v: np.where(ok, v[np.clip(idx[..., axis], 0, None)], np.nan)  # noqa: E731
    crp = np.where(ok[..., None], grid.crp[idx[..., 0], idx[..., 1], idx[..., 2]], np.nan)
    fit = CMRFit(dist, pick(0, grid.beta_enc), pick(1, grid.beta_rec), pick(2, grid.gamma_ft), idx, crp)
    if one:
        return CMRFit(*(getattr(fit, f)[0, 0] for f in ("distance", "beta_enc", "beta_rec", "gamma_ft", "index",
                                                         "crp")))
    return fit
