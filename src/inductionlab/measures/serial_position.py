"""Statistics of the all-cue lag probe: every list position cued in turn (issue 17, item 3).

The all-cue probe reads, for one list (trial ``n``) and every cue position ``i`` in
``cue_positions`` (1-based list positions), the next-token probability of each list position's
word: ``cue_probs[n, c, j]`` for cue ``c`` (at position ``i = cue_positions[c]``) and list
position ``j + 1``; its **lag** is ``j + 1 − i`` (0 = repeating the cue). This module turns
those arrays into psifr-style measures, one small function each, and tidy tables.

**Clustered over lists.** A list is one random permutation; its cues share it and are not
independent. Every measure is therefore reduced to one value per list first (the mean over the
list's cues that the measure applies to) and the 95% CI is taken over lists with
:func:`inductionlab.measures.stats.mean_ci` (mean ± 1.96·sd/√n_lists). Random draws of one k are pooled
per list (mean over the draws), as for the seed curves; random − induction contrasts are paired
per list. Duplicating the cues of every list changes no per-list value, so no CI.

Measures (per condition):

* :func:`by_lag` — the **pooled lag curve**: per list and lag, the mean over the cues at which
  that lag exists (lag k exists for cue i when 1 ≤ i + k ≤ L), then mean and CI over lists;
  lags −(L−1)…(L−1). Raw probability, and the **word-prior-corrected** curve on
  :func:`cue_log_enrichment` (``log p − log baseline(word)``, nats; a word's baseline is its mean
  probability over the (list, cue) pairs where it sits at ``|lag| > far_lag``, same condition —
  :func:`inductionlab.measures.lag.log_baseline`, the seed cue's correction with the cue as a second trial axis).
* :func:`serial_position_measures` — the **serial-position curve**: p(lag +1), p(lag −1),
  p(lag 0) and the list mass at each cue position (primacy / recency), CI over lists.
* :func:`band_edges` + :func:`lag_crp_bands` — the **lag-CRP by cue-position band**: the
  distribution renormalised over the list words (as the seed ``mean_renorm`` curve), pooled by
  lag over the cues of each band. Default: 10 equal-width bands over the cued range
  (:data:`N_BANDS`; list of 500 fully cued → 1–50, 51–100, …, 451–500).
* :func:`lag_rank` — the **temporal factor** (psifr ``lag_rank``, quail ``temporal``): for each
  (list, cue) with a lag +1 word, the percentile rank of that word's probability among the list
  words **other than the cue word itself** (the only item already "recalled"; L − 1
  candidates, the +1 word included), ties at their average rank, percentile = (rank − 1) /
  (L − 2): 1 = the +1 word is the most likely list word, 0 = the least, 0.5 = chance (exactly
  0.5 for a flat distribution). Averaged over the list's cues, CI over lists.

The result object only needs ``cue_positions``, ``cue_probs``, ``cue_list_mass``, ``list_ids``,
``conditions`` and ``config`` (``list_length``, ``far_lag``) — see :func:`has_cues`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .lag import FLOOR, log_baseline
from .stats import Z95, arm_values, mean_ci, paired_by_k, put_ci, ranked_kind

N_BANDS = 10            # decision: cue-position bands of the lag-CRP heat map (10 = deciles of a full list)
BAND_MAX_LAG = 50       # decision: lags kept in lag_crp_bands.csv (|lag| ≤ 50; the figure shows ±10)
SERIAL_MEASURES = {"lag_plus1": 1, "lag_minus1": -1, "lag0": 0}   # serial-position measure -> lag


def has_cues(res) -> bool:
    """True when a lag-probe result carries per-cue arrays for at least two cue positions
    (``cue_positions`` and a non-empty ``cue_probs``); one cue is the seed protocol, whose
    tables already say everything."""
    cp = getattr(res, "cue_positions", None)
    return cp is not None and len(cp) >= 2 and bool(getattr(res, "cue_probs", None))


def _check(cue_probs, cue_positions) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(cue_probs)
    cp = np.asarray(cue_positions, dtype=np.int64)
    if p.ndim != 3 or p.shape[1] != len(cp):
        raise ValueError(f"cue_probs {p.shape} must be [n_trials, n_cues, list_length] with n_cues = "
                         f"len(cue_positions) = {len(cp)}")
    L = p.shape[2]
    if len(cp) and (cp.min() < 1 or cp.max() > L):
        raise ValueError(f"cue positions must lie in 1..{L} (the list), got {cp.min()}..{cp.max()}")
    return p, cp


def lags_of(list_length: int) -> np.ndarray:
    """All lags of a list of L words: ``[2L − 1]`` int, −(L−1)…(L−1)."""
    return np.arange(-(list_length - 1), list_length)


def by_lag(cue_probs, cue_positions, *, cues=None, transform=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per list, the mean over cues of each lag's value (the cues at which that lag exists).

    Args:
        cue_probs: ``[n_trials, n_cues, L]`` values per (list, cue, list position).
        cue_positions: ``[n_cues]`` 1-based cue positions.
        cues: optional indices into the cue axis to pool over (e.g. one band); default all.
        transform: optional ``f(c, values [n_trials, L] float64) -> [n_trials, L]`` applied per cue
            ``c`` before pooling (e.g. renormalisation, log-enrichment).

    Returns:
        ``(lags [2L−1], per_list float64 [n_trials, 2L−1], n_cues int [2L−1])``; ``per_list`` is
        NaN at lags that no pooled cue has (``n_cues == 0``).
    """
    p, cp = _check(cue_probs, cue_positions)
    N, _, L = p.shape
    sums = np.zeros((N, 2 * L - 1))
    counts = np.zeros(2 * L - 1, dtype=np.int64)
    for c in (range(len(cp)) if cues is None else cues):
        v = p[:, c, :].astype(np.float64)
        if transform is not None:
            v = transform(c, v)
        s = L - cp[c]                      # column j ↔ lag j + 1 − i ↔ index j + L − i
        sums[:, s:s + L] += v
        counts[s:s + L] += 1
    with np.errstate(invalid="ignore", divide="ignore"):
        per_list = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return lags_of(L), per_list, counts


def renormalise(c, v: np.ndarray) -> np.ndarray:
    """``transform`` for :func:`by_lag`: each (list, cue) distribution renormalised over the list
    words (NaN where a cue put no mass on the list)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return v / v.sum(1, keepdims=True)


def cue_log_enrichment(cue_probs, list_ids, cue_positions, far_lag: int, floor: float = FLOOR):
    """Word-prior correction of the all-cue probe, as a ``transform`` for :func:`by_lag`.

    A word's baseline is its mean probability over the (list, cue, position) triples where it
    sits at ``|lag| > far_lag`` from the cue (a word never that far: all its triples), within
    the condition (:func:`inductionlab.measures.lag.log_baseline`, the seed cue's correction with the
    cue as a second trial axis); the transform returns ``log max(p, floor) − log max(baseline(word), floor)``
    (nats). Memory stays at ``[n_trials, L]`` float64.

    Args:
        cue_probs: ``[n_trials, n_cues, L]`` one condition; list_ids: ``[n_trials, L]`` word ids.

    Returns: ``f(c, values) -> [n_trials, L]`` log-enrichment for cue index ``c``.
    """
    p, cp = _check(cue_probs, cue_positions)
    ids = np.asarray(list_ids)
    if ids.shape != (p.shape[0], p.shape[2]):
        raise ValueError(f"list_ids {ids.shape} do not match cue_probs {p.shape} ([n_trials, list_length])")
    lags = np.arange(1, p.shape[2] + 1)[None, :] - cp[:, None]             # [n_cues, L]
    log_base = log_baseline(p, ids, lags, far_lag, floor)

    def transform(c, v):
        return np.log(np.maximum(v, floor)) - log_base
    return transform


def serial_position_measures(cue_probs, cue_list_mass, cue_positions) -> dict[str, np.ndarray]:
    """p(lag +1), p(lag −1), p(lag 0) and list mass at each cue: measure -> float64 ``[n_trials, n_cues]``
    (NaN where the lag falls outside the list: lag +1 of the last position, lag −1 of the first)."""
    p, cp = _check(cue_probs, cue_positions)
    N, C, L = p.shape
    out = {}
    for name, lag in SERIAL_MEASURES.items():
        col = cp - 1 + lag                       # 0-based column of the word at that lag
        ok = (col >= 0) & (col < L)
        v = np.full((N, C), np.nan)
        v[:, ok] = p[:, np.flatnonzero(ok), col[ok]]
        out[name] = v
    out["list_mass"] = np.asarray(cue_list_mass, dtype=np.float64).reshape(N, C)
    return out


def lag_rank(cue_probs, cue_positions) -> np.ndarray:
    """Temporal factor per (list, cue): percentile rank of the lag +1 word's probability.

    Candidates: the L − 1 list words other than the cue word (position ``i``); ties at their
    average rank (psifr ``percentile_rank``); percentile = (rank − 1) / (L − 2).

    Returns: float64 ``[n_trials, n_cues]``, NaN for a cue at the last position (no lag +1) and
    for lists of fewer than 3 words (one candidate: no rank).
    """
    p, cp = _check(cue_probs, cue_positions)
    N, C, L = p.shape
    out = np.full((N, C), np.nan)
    if L < 3:
        return out
    for c, i in enumerate(cp):
        if i >= L:
            continue
        v = p[:, c, :]
        t = v[:, i:i + 1]                                   # the lag +1 word (position i + 1)
        cue = v[:, i - 1:i]
        less = (v < t).sum(1) - (cue < t)[:, 0]
        equal = (v == t).sum(1) - (cue == t)[:, 0]          # includes the +1 word itself
        out[:, c] = (less + (equal - 1) / 2) / (L - 2)
    return out


def band_edges(cue_positions, n_bands: int = N_BANDS) -> list[tuple[int, int]]:
    """Equal-width bands of cue positions: ``[(first, last), …]`` inclusive, 1-based.

    The cued range ``min … max`` of ``cue_positions`` (span S positions) is cut at
    ``min + floor(b·S / B)`` for b = 0…B, B = min(n_bands, S); bands that hold no cue (sparse
    cue sets) are dropped. Full list of 500, B = 10: (1, 50), (51, 100), …, (451, 500).

    Raises: ValueError for an empty cue set or ``n_bands < 1``.
    """
    cp = np.asarray(cue_positions, dtype=np.int64)
    if len(cp) == 0 or n_bands < 1:
        raise ValueError(f"band_edges needs at least one cue and n_bands >= 1 (got {len(cp)} cues, {n_bands})")
    lo, hi = int(cp.min()), int(cp.max())
    span = hi - lo + 1
    B = min(n_bands, span)
    cuts = lo + (np.arange(B + 1) * span) // B
    bands = [(int(a), int(b) - 1) for a, b in zip(cuts[:-1], cuts[1:])]
    return [(a, b) for a, b in bands if ((cp >= a) & (cp <= b)).any()]


# -- tidy tables over a lag-probe result -----------------------------------------------------------
def _frame(key, **cols) -> pd.DataFrame:
    name, kind, k, draw = key
    return pd.DataFrame({"condition": name, "kind": kind, "k": k, "draw": draw, **cols})


def lag_counts(cue_positions, list_length: int, cues=None) -> np.ndarray:
    """``[2L − 1]`` int: how many of the (selected) cues have each lag of :func:`lags_of`."""
    cp = np.asarray(cue_positions, dtype=np.int64)
    counts = np.zeros(2 * list_length - 1, dtype=np.int64)
    for i in (cp if cues is None else cp[np.asarray(cues, dtype=np.int64)]):
        counts[list_length - i:2 * list_length - i] += 1
    return counts


def _curve_measures(res) -> dict:
    """measure -> ``f(condition name) -> [n_trials, 2L − 1]`` per-list pooled lag curve."""
    cp = np.asarray(res.cue_positions)
    out = {"prob": lambda n: by_lag(res.cue_probs[n], cp)[1]}
    if getattr(res, "list_ids", None) is not None:
        out["log_enrichment"] = lambda n: by_lag(
            res.cue_probs[n], cp, transform=cue_log_enrichment(res.cue_probs[n], res.list_ids, cp, res.config.far_lag))[1]
    return out


def lag_cues_curve(res) -> pd.DataFrame:
    """The all-cue pooled lag curve, raw (``measure == "prob"``) and word-prior corrected
    (``"log_enrichment"``, nats; when ``list_ids`` is present).

    Columns: condition, kind, k, draw, measure, lag, mean, ci_low, ci_high (95% CI over lists),
    n_lists, n_cues (cues at which the lag exists). Lags that no cue has are left out.
    """
    L = res.config.list_length
    lags, counts = lags_of(L), lag_counts(res.cue_positions, L)
    ok = counts > 0
    rows = []
    for measure, f in _curve_measures(res).items():
        for key, v in arm_values(res.conditions, f):
            m, half = mean_ci(v)
            rows.append(_frame(key, measure=measure, lag=lags[ok], mean=m[ok], ci_low=(m - half)[ok],
                               ci_high=(m + half)[ok], n_lists=v.shape[0], n_cues=counts[ok]))
    return pd.concat(rows, ignore_index=True)


def serial_position(res) -> pd.DataFrame:
    """The serial-position curve: one row per (condition, measure, cue position).

    Measures ``lag_plus1``, ``lag_minus1``, ``lag0`` (raw probabilities) and ``list_mass``;
    columns condition, kind, k, draw, measure, cue_position, mean, ci_low, ci_high (over lists),
    n_lists. Rows where the lag falls outside the list are left out.
    """
    cp = np.asarray(res.cue_positions)
    sp = {}

    mass = getattr(res, "cue_list_mass", None) or {}

    def measures(n):
        if n not in sp:
            sp[n] = serial_position_measures(res.cue_probs[n], mass[n] if n in mass else
                                             np.asarray(res.cue_probs[n]).sum(2, dtype=np.float64), cp)
        return sp[n]
    rows = []
    for measure in (*SERIAL_MEASURES, "list_mass"):
        for key, v in arm_values(res.conditions, lambda n: measures(n)[measure]):
            m, half = mean_ci(v)
            ok = ~np.isnan(m)
            rows.append(_frame(key, measure=measure, cue_position=cp[ok], mean=m[ok], ci_low=(m - half)[ok],
                               ci_high=(m + half)[ok], n_lists=v.shape[0]))
    return pd.concat(rows, ignore_index=True)


def lag_crp_bands(res, n_bands: int = N_BANDS, max_lag: int | None = BAND_MAX_LAG) -> pd.DataFrame:
    """The lag curve by cue-position band (:func:`band_edges`): raw (``mean``) and renormalised
    over the list words (``mean_renorm``, the lag-CRP of the heat map), each pooled by lag over
    the band's cues per list, 95% CI over lists.

    Columns: condition, kind, k, draw, band (0-based), band_first, band_last (cue positions,
    inclusive), lag, mean, ci_low, ci_high, mean_renorm, ci_low_renorm, ci_high_renorm, n_lists,
    n_cues (cues of the band at which the lag exists). ``max_lag``: keep |lag| ≤ max_lag (None: all).
    """
    cp = np.asarray(res.cue_positions)
    L = res.config.list_length
    lags = lags_of(L)
    rows = []
    for b, (first, last) in enumerate(band_edges(cp, n_bands)):
        sel = np.flatnonzero((cp >= first) & (cp <= last))
        counts = lag_counts(cp, L, sel)
        ok = (counts > 0) & (np.abs(lags) <= (max_lag if max_lag is not None else L))
        raw = arm_values(res.conditions, lambda n: by_lag(res.cue_probs[n], cp, cues=sel)[1])
        ren = arm_values(res.conditions, lambda n: by_lag(res.cue_probs[n], cp, cues=sel, transform=renormalise)[1])
        for (key, v), (_, vr) in zip(raw, ren):
            (m, h), (mr, hr) = mean_ci(v), mean_ci(vr)
            rows.append(_frame(key, band=b, band_first=first, band_last=last, lag=lags[ok], mean=m[ok],
                               ci_low=(m - h)[ok], ci_high=(m + h)[ok], mean_renorm=mr[ok],
                               ci_low_renorm=(mr - hr)[ok], ci_high_renorm=(mr + hr)[ok], n_lists=v.shape[0],
                               n_cues=counts[ok]))
    return pd.concat(rows, ignore_index=True)


def _tf_per_list(res, name: str) -> np.ndarray:
    return np.nanmean(lag_rank(res.cue_probs[name], res.cue_positions), axis=1)


def temporal_factor(res) -> pd.DataFrame:
    """The temporal factor (:func:`lag_rank`) per condition: per-list mean over the cues with a
    lag +1 word, then mean and 95% CI over lists (``temporal_factor``, ``_ci_low``, ``_ci_high``),
    with ``n_lists`` and ``n_cues`` (cues that have a lag +1). Pooled random-k rows included."""
    n_cues = int(np.sum(np.asarray(res.cue_positions) < res.config.list_length))
    rows = []
    for (name, kind, k, draw), v in arm_values(res.conditions, lambda n: _tf_per_list(res, n)):
        rows.append(put_ci({"condition": name, "kind": kind, "k": k, "draw": draw, "n_lists": len(v),
                            "n_cues": n_cues}, "temporal_factor", v))
    return pd.DataFrame(rows)


def cue_contrasts(res, lag: int = 1) -> pd.DataFrame:
    """Paired per-list contrasts random-k (mean of draws) − induction-k, one row per (k, measure):
    ``prob`` (all-cue pooled p(lag)), ``log_enrichment`` (its word-prior-corrected value, when
    ``list_ids`` is present) and ``temporal_factor``. Columns k, measure, lag, induction, random,
    random_minus_induction, ci_low, ci_high (95% CI over lists), z (mean / standard error)."""
    col = lag + res.config.list_length - 1
    measures = {m: (lambda n, f=f: f(n)[:, col]) for m, f in _curve_measures(res).items()}
    measures["temporal_factor"] = lambda n: _tf_per_list(res, n)
    arm = ranked_kind(res.conditions)
    rows = []
    for measure, f in measures.items():
        for k, pi, pr in paired_by_k(res.conditions, f, arm):
            m, half = mean_ci(pr - pi)
            rows.append({"k": k, "measure": measure, "lag": lag if measure != "temporal_factor" else np.nan,
                         arm: float(pi.mean()), "random": float(pr.mean()),
                         f"random_minus_{arm}": float(m), "ci_low": float(m - half), "ci_high": float(m + half),
                         "z": float(m / (half / Z95)) if half > 0 else np.nan})
    return pd.DataFrame(rows, columns=["k", "measure", "lag", arm, "random", f"random_minus_{arm}",
                                       "ci_low", "ci_high", "z"])


# -- every table of a run, once ------------------------------------------------------------------
def cue_tables(res, n_bands: int = N_BANDS) -> dict[str, pd.DataFrame]:
    """The run's tables by file stem: ``lag_cues_curve``, ``serial_position``, ``lag_crp_bands``,
    ``temporal_factor``, ``cue_contrasts`` (computed once per result and kept on it)."""
    cached = getattr(res, "_cue_tables", None)
    if cached is not None and cached[0] == n_bands:
        return cached[1]
    tables = {"lag_cues_curve": lag_cues_curve(res), "serial_position": serial_position(res),
              "lag_crp_bands": lag_crp_bands(res, n_bands), "temporal_factor": temporal_factor(res),
              "cue_contrasts": cue_contrasts(res)}
    try:
        res._cue_tables = (n_bands, tables)
    except AttributeError:             # a result that takes no new attributes: recompute next time
        pass
    return tables


def band_summary(res, lag: int = 1, n_bands: int = N_BANDS) -> pd.DataFrame:
    """Raw p(lag) in the first, middle (band ``(B − 1) // 2``) and last cue-position band per
    condition: columns condition, kind, k, draw, then ``first``, ``middle``, ``last`` each with
    ``_ci_low`` / ``_ci_high`` and ``_band`` (``"a–b"``, the band's cue positions)."""
    b = cue_tables(res, n_bands)["lag_crp_bands"]
    b = b[b.lag == lag]
    ids = sorted(set(b.band))
    which = {"first": ids[0], "middle": ids[(len(ids) - 1) // 2], "last": ids[-1]}
    rows = []
    for (name, kind, k, draw), d in b.groupby(["condition", "kind", "k", "draw"], sort=False):
        row = {"condition": name, "kind": kind, "k": k, "draw": draw}
        for tag, band in which.items():
            r = d[d.band == band]
            if r.empty:
                continue
            r = r.iloc[0]
            row.update({tag: r["mean"], f"{tag}_ci_low": r.ci_low, f"{tag}_ci_high": r.ci_high,
                        f"{tag}_band": f"{r.band_first}–{r.band_last}"})
        rows.append(row)
    return pd.DataFrame(rows)


def cue_json(res, n_bands: int = N_BANDS) -> dict:
    """The ``lag_cues`` block of results.json: the cues, the bands, definitions, the temporal
    factor and the random − induction contrasts per condition / k, p(+1) in the first / middle /
    last band (full tables in the CSVs)."""
    t = cue_tables(res, n_bands)
    cp = np.asarray(res.cue_positions)
    return {"cue_positions": {"first": int(cp.min()), "last": int(cp.max()), "n_cues": int(len(cp))},
            "n_lists": int(next(iter(res.cue_probs.values())).shape[0]),
            "bands": [list(b) for b in band_edges(cp, n_bands)],
            "definitions": {
                "clustering": "every measure is reduced per list (mean over its cues) first; mean and 95% CI over lists",
                "pooled_lag_curve": "per list and lag, mean over the cues at which the lag exists",
                "log_enrichment": f"log p − log baseline(word), nats; baseline = the word's mean probability over the "
                                  f"(list, cue) pairs where it sits at |lag| > {res.config.far_lag}, "
                                  "within the condition",
                "lag_crp_bands": "distribution renormalised over the list words, pooled by lag over a band's cues",
                "temporal_factor": "percentile rank of the lag +1 word's probability among the list words other than "
                                   "the cue word (ties at their average rank; 1 = most likely, 0.5 = chance)"},
            "temporal_factor": t["temporal_factor"].to_dict(orient="records"),
            "contrasts": t["cue_contrasts"].to_dict(orient="records"),
            "lag_plus1_by_band": band_summary(res, 1, n_bands).to_dict(orient="records")}
