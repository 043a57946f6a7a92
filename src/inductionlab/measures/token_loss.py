"""Per-window reductions of the token-loss ICL score (issue 34; ``../shared/ANCHORS-POWER.md`` §1.4): every
position's next-token loss ``ℓ_t`` of a natural-text window, reduced three ways.

* **single-token benefit** (Olsson et al. 2022; Yin & Steinhardt 2025): ``ℓ_early − ℓ_late`` — one token at
  each end; per-window SD ≈ 3.4–4.8 nats on real models (ANCHORS-POWER §1.2), so thousands of windows.
* **log-slope benefit D**: the least-squares fit ``ℓ_t = a + b·ln t`` over ``t ∈ [early, late]`` (every token
  between), ``D = −b·ln 10`` — nats gained per tenfold more context (Olsson et al.'s derivative of loss with
  respect to log token index, their robustness view). When ``E[ℓ_t]`` is linear in ``ln t`` on the range,
  ``E[D]`` equals the single-token benefit at ``late = 10·early``; curvature shows as a difference.
* **log-symmetric bands B**: mean ``ℓ`` over ``[⌈0.8·early⌉, ⌊1.2·early⌋]`` minus mean over
  ``[⌈0.8·late⌉, ⌊1.2·late⌋]``; needs losses up to ``⌊1.2·late⌋`` (a window of that many tokens + 1), else NaN.

``t`` is the 0-based index of the predicted token in the window (``ℓ_t = −log p(x_t | x_<t)``, nats). Pure numpy.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import InductionLabError


def band(t: int) -> tuple[int, int]:
    """The log-symmetric band around token index ``t``: ``(⌈0.8·t⌉, ⌊1.2·t⌋)`` (inclusive, exact integers)."""
    t = int(t)
    return -(-4 * t // 5), 6 * t // 5


def measured_range(early: int, late: int, length: int) -> tuple[int, int]:
    """``(first, last)`` token indices whose losses the probe keeps for a window of ``length`` tokens: from
    ``⌈0.8·early⌉`` (at least 1) to ``⌊1.2·late⌋`` where the window holds it, else ``late``.

    Raises:
        InductionLabError: ``1 <= early < late <= length − 1`` fails."""
    if not 1 <= early < late <= length - 1:
        raise InductionLabError(f"token-loss positions need 1 <= early < late <= window length − 1, got early={early}, "
                                f"late={late}, length={length}")
    hi = band(late)[1]
    return max(1, band(early)[0]), hi if hi <= length - 1 else late


def _columns(positions: np.ndarray, lo: int, hi: int) -> np.ndarray:
    idx = np.flatnonzero((positions >= lo) & (positions <= hi))
    if len(idx) != hi - lo + 1:
        raise InductionLabError(f"the losses cover token indices {positions.min()}–{positions.max()}, not all of "
                                f"{lo}–{hi}")
    return idx


def slope_benefit(nll: np.ndarray, positions, early: int, late: int) -> np.ndarray:
    """The log-slope benefit ``D = −b·ln 10`` per window (module docstring).

    Args:
        nll: ``[n, P]`` losses (nats); column j is token index ``positions[j]``.
        positions: ``[P]`` token indices, covering ``early..late``.

    Returns: float64 ``[n]`` (nats per decade of context)."""
    positions = np.asarray(positions)
    idx = _columns(positions, early, late)
    x = np.log(positions[idx].astype(np.float64))
    y = np.asarray(nll, np.float64)[:, idx]
    xc = x - x.mean()
    b = (y - y.mean(1, keepdims=True)) @ xc / (xc @ xc)
    return -b * math.log(10)


def band_benefit(nll: np.ndarray, positions, early: int, late: int) -> np.ndarray:
    """The band benefit ``B`` per window: mean loss over :func:`band` (early) minus over :func:`band` (late);
    float64 ``[n]``, all NaN when the losses stop before ``⌊1.2·late⌋``."""
    positions = np.asarray(positions)
    nll = np.asarray(nll, np.float64)
    (el, eh), (ll, lh) = band(early), band(late)
    if positions.max() < lh or positions.min() > el:
        return np.full(len(nll), np.nan)
    return nll[:, _columns(positions, el, eh)].mean(1) - nll[:, _columns(positions, ll, lh)].mean(1)


def single_benefit(nll: np.ndarray, positions, early: int, late: int) -> np.ndarray:
    """Olsson's single-token benefit ``ℓ_early − ℓ_late`` per window, float64 ``[n]``."""
    positions = list(np.asarray(positions))
    nll = np.asarray(nll, np.float64)
    return nll[:, positions.index(early)] - nll[:, positions.index(late)]


def benefits(nll: np.ndarray, positions, early: int, late: int) -> dict[str, np.ndarray]:
    """``{"slope": D, "band": B, "single": ℓ_early − ℓ_late, "loss_early", "loss_late"}``, each float64 ``[n]``."""
    positions = list(np.asarray(positions))
    nll = np.asarray(nll, np.float64)
    return {"slope": slope_benefit(nll, positions, early, late), "band": band_benefit(nll, positions, early, late),
            "single": single_benefit(nll, positions, early, late),
            "loss_early": nll[:, positions.index(early)], "loss_late": nll[:, positions.index(late)]}


__all__ = ["band", "measured_range", "slope_benefit", "band_benefit", "single_benefit", "benefits"]
