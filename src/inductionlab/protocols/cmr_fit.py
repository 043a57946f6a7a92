"""Each head's attention CRP and its CMR fit (Ji-An, Zhou, Benna & Mattar 2024, "Linking in-context learning in
transformers to human episodic memory", arXiv 2405.14992; code corxyz/icl-cmr): the attention by lag of
:func:`~inductionlab.core.scores.attention_crp` fitted on CMR's reference grid (:mod:`inductionlab.measures.cmr`,
numpy only), and that grid kept in the user cache.

The grid is the costly part (about 3–4 CPU minutes at 10 runs per start position; docs/study-head-types.md) and the
same for every model, so :func:`cmr_grid` keeps it as ``.npz`` in ``$XDG_CACHE_HOME/inductionlab/cmr``
(default ``~/.cache/inductionlab/cmr``), keyed by every parameter that changes it.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import numpy as np

from ..core.scores import CRP_MAX_LAG, ScoreSequences, attention_crp
from ..measures import cmr as C


def grid_cache_path(n_exps: int, seed: int, n_s0: int) -> Path:
    """Where :func:`cmr_grid` keeps the grid of these parameters:
    ``$XDG_CACHE_HOME/inductionlab/cmr/cmr_crp_<n_exps>x<n_s0>_seed<seed>_<key>.npz``, the key a hash of every
    parameter (the model's constants included, so a change of them is a new file)."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    root = Path(xdg) if xdg else Path.home() / ".cache"
    key = hashlib.sha256(repr(("cmr-grid-v1", C.N_ITEMS, C.MAX_LAG, C.MAX_SAMPS, n_exps, seed, n_s0)).encode()
                         ).hexdigest()
    return root / "inductionlab" / "cmr" / f"cmr_crp_{n_exps}x{n_s0}_seed{seed}_{key[:12]}.npz"


def cmr_grid(n_exps: int = 100, seed: int = 0, n_s0: int = C.N_S0, cache: bool = True, progress=None) -> C.CMRGrid:
    """The grid (:func:`~inductionlab.measures.cmr.compute_grid`), read from the user cache when it is there,
    else computed and written there (``cache=False``: computed, not written; an interrupted write leaves no
    partial file).

    Returns: :class:`~inductionlab.measures.cmr.CMRGrid`; its ``params`` add ``seconds`` and ``cpu_seconds`` (the
    computation's, read back with a cached grid), ``cache`` (the path, None uncached) and ``from_cache``.

    Raises:
        InductionLabError: ``n_exps`` or ``n_s0`` below 1 or ``n_s0`` above 100."""
    path = grid_cache_path(n_exps, seed, n_s0)
    params = C.grid_params(n_exps, seed, n_s0)
    be, br, gf = C.grid_axes()
    if cache and path.is_file():
        with np.load(path) as z:
            crp = z["crp"]
            params["seconds"], params["cpu_seconds"] = float(z["seconds"]), float(z["cpu_seconds"])
        if crp.shape == (len(be), len(br), len(gf), 2 * C.MAX_LAG + 1):
            return C.CMRGrid(crp, be, br, gf, {**params, "cache": str(path), "from_cache": True})
    t0, c0 = time.perf_counter(), time.process_time()
    crp = C.compute_grid(n_exps, seed, n_s0, progress)
    params["seconds"], params["cpu_seconds"] = time.perf_counter() - t0, time.process_time() - c0
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp.npz")
        np.savez(tmp, crp=crp, seconds=params["seconds"], cpu_seconds=params["cpu_seconds"])
        os.replace(tmp, path)
    return C.CMRGrid(crp, be, br, gf, {**params, "cache": str(path) if cache else None, "from_cache": False})


def attention_crp_cmr_fit(model, seqs: ScoreSequences | None = None, *, tokenizer=None, max_lag: int = CRP_MAX_LAG,
                          n_exps: int = 10, n_starts: int = 20, dist=None, **fields) -> dict[str, np.ndarray]:
    """Every head's attention CRP (:func:`~inductionlab.core.scores.attention_crp` on ``seqs``, the head scores'
    ``[BOS] S S``) and its best CMR fit (:func:`~inductionlab.measures.cmr.fit_cmr`) on the reference grid of
    ``n_exps`` runs per start position and ``n_starts`` start positions (:func:`cmr_grid`, cached).

    Args: ``model``, ``seqs``, ``tokenizer``, ``dist`` and ``fields`` (fields of
        :class:`~inductionlab.core.scores.ScoreSequences`) as :func:`~inductionlab.core.scores.attention_crp`;
        max_lag: lags kept (±5 are fitted).

    Returns: ``profile`` float64 ``[L, H, 2·max_lag + 1]``, ``lags`` ``[2·max_lag + 1]``, ``distance``, ``beta_enc``,
    ``beta_rec``, ``gamma_ft`` ``[L, H]`` (NaN for a flat profile), ``fitted_crp`` ``[L, H, 2·max_lag + 1]``,
    ``grid_seconds``, ``grid_cpu_seconds``, ``grid_from_cache`` (0-d arrays: the grid's cost).

    Raises:
        InductionLabError: what :func:`~inductionlab.core.scores.attention_crp` and :func:`cmr_grid` refuse."""
    crp = attention_crp(model, ScoreSequences.of(seqs, fields, "attention_crp_cmr_fit"), tokenizer=tokenizer,
                        max_lag=max_lag, dist=dist)
    grid = cmr_grid(n_exps=n_exps, n_s0=n_starts)
    fit = C.fit_cmr(crp.profile, grid)
    return {"profile": crp.profile, "lags": crp.lags, "distance": fit.distance, "beta_enc": fit.beta_enc,
            "beta_rec": fit.beta_rec, "gamma_ft": fit.gamma_ft, "fitted_crp": fit.crp,
            "grid_seconds": np.asarray(grid.params["seconds"]),
            "grid_cpu_seconds": np.asarray(grid.params.get("cpu_seconds", np.nan)),
            "grid_from_cache": np.asarray(grid.params["from_cache"])}


__all__ = ["grid_cache_path", "cmr_grid", "attention_crp_cmr_fit"]
