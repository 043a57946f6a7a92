"""Measures of the lag probe (SPEC §4) over its per-trial arrays: the lag curve, the headline, the
paired random − induction contrasts and the word-prior correction (log-enrichment).

Inputs are what a lag-probe run stores per condition
(:class:`~inductionlab.protocols.lag_probe.LagProbeResult`): ``probs`` float ``[n_trials, L]``, the
probability of the word at each list position after the cue at 1-based list position ``cue``
(column ``j`` ↔ **lag** ``j + 1 − cue``; lag 0 = repeating the cue), ``list_mass`` ``[n_trials]``
(total probability on list tokens), ``list_ids`` ``[n_trials, L]`` (the word at each list
position). Every condition sees the same trials, so random draws of one k pool per trial and
contrasts are paired (:mod:`inductionlab.measures.stats`; 95% CI = mean ± 1.96·sd/√n over trials).

* :func:`curve_table` — mean probability per lag with its CI, raw and **renormalised** over the list
  tokens (each trial's ``probs`` divided by its sum).
* :func:`headline_table` — p(lag +1), p(lag −1), p(lag 0), the list mass and, given the
  log-enrichment, its lag ±1 values, one row per condition and pooled ``random-k`` arm.
* :func:`contrast_table` — random-k (per-trial mean of the draws) − induction-k at one lag.
* :func:`log_enrichment` — the **word-prior-corrected** curve: a frequent word is likely anywhere, so
  one word per lag and trial makes the raw curve noisy. Within a condition, each word's baseline is
  its mean probability over the (trial, cue, position) triples where it sits far from the cue
  (``|lag| > far_lag``; :attr:`~inductionlab.protocols.configs.LagProbeConfig.far_lag`); the
  log-enrichment at lag k is ``log p(word at lag k) − log baseline(word)`` (nats; 0 = no more likely
  than its prior), reported next to the raw curve, never instead of it. One implementation
  (:func:`log_baseline`) for the seed cue and for every cue of the all-cue probe
  (:func:`inductionlab.measures.serial_position.cue_log_enrichment`).

Pooled arms: :func:`inductionlab.measures.stats.arm_values`. Their draw label is ``"mean of <n>"``
in the headline and :data:`CURVE_POOLED_DRAW` in the curve tables (the labels the CSVs have always had).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .stats import arm_values, mean_ci, paired_by_k, put_ci, ranked_kind

FLOOR = 1e-30                  # probabilities are clamped below at this before a log
CURVE_POOLED_DRAW = "pooled"   # draw label of a pooled random-k arm in the curve tables (lag_curves*.csv)
HEADLINE_LAGS = {"lag_plus1": 1, "lag_minus1": -1, "lag0": 0}                        # headline column -> lag
ENRICHMENT_LAGS = {"lag_plus1_log_enrichment": 1, "lag_minus1_log_enrichment": -1}   # the same, log-enrichment


def lags_of(list_length: int, cue_position: int) -> np.ndarray:
    """``[L]`` int: the lag of each list position after the cue at 1-based ``cue_position``."""
    return np.arange(1, list_length + 1) - cue_position


def column(lag: int, cue_position: int) -> int:
    """The 0-based list column of ``lag`` after the cue at 1-based ``cue_position``."""
    return lag + cue_position - 1


def log_baseline(probs, list_ids, lags, far_lag: int, floor: float = FLOOR) -> np.ndarray:
    """Log of each list word's baseline probability, the word-prior correction of the lag probe.

    A word's baseline is its mean probability over the (trial, cue, list position) triples where it
    sits at ``|lag| > far_lag`` from the cue; a word never that far uses all its triples. Far sums
    are taken directly, cue by cue (memory ``[n_trials, L]``).

    Args:
        probs: ``[n_trials, n_cues, L]`` probability of each list position's word after each cue
            (one condition).
        list_ids: ``[n_trials, L]`` the word (token id) at each list position (the same for every cue).
        lags: ``[n_cues, L]`` lag of each list position after each cue.
        far_lag: the distance, in list positions, beyond which a word is far from the cue.
        floor: the baseline is clamped below at ``floor`` before the log.

    Returns:
        float64 ``[n_trials, L]``: ``log max(baseline(word at that position), floor)`` (nats).
    """
    p = np.asarray(probs)
    ids = np.asarray(list_ids)
    lags = np.asarray(lags)
    if p.ndim != 3 or ids.shape != (p.shape[0], p.shape[2]) or lags.shape != p.shape[1:]:
        raise ValueError(f"probs {p.shape}, list_ids {ids.shape} and lags {lags.shape} do not match "
                         "([n_trials, n_cues, L], [n_trials, L], [n_cues, L])")
    uniq, inv = np.unique(ids, return_inverse=True)
    inv = inv.reshape(ids.shape)
    n = len(uniq)
    s_all = np.bincount(inv.ravel(), weights=p.sum(1, dtype=np.float64).ravel(), minlength=n)
    c_all = np.bincount(inv.ravel(), minlength=n) * p.shape[1]
    s_far, c_far = np.zeros(n), np.zeros(n, dtype=np.int64)
    for c in range(p.shape[1]):
        cols = np.flatnonzero(np.abs(lags[c]) > far_lag)
        where = inv[:, cols].ravel()
        s_far += np.bincount(where, weights=p[:, c, cols].astype(np.float64).ravel(), minlength=n)
        c_far += np.bincount(where, minlength=n)
    base = np.where(c_far > 0, s_far / np.maximum(c_far, 1), s_all / np.maximum(c_all, 1))
    return np.log(np.maximum(base[inv], floor))


def log_enrichment(probs, list_ids, lags, far_lag: int, floor: float = FLOOR) -> np.ndarray:
    """Word-prior-corrected lag probe of one cue: per trial and list position, ``log p − log baseline(word)``.

    Args:
        probs: ``[n_trials, L]`` probability of each list position's word (one condition).
        list_ids: ``[n_trials, L]`` the word (token id) at each list position.
        lags: ``[L]`` lag of each list position.
        far_lag: a word's baseline is its mean probability over the (trial, position) pairs where
            it sits at ``|lag| > far_lag``; a word never that far uses all its positions (:func:`log_baseline`).
        floor: probabilities are clamped below at ``floor`` before the log.

    Returns:
        float64 ``[n_trials, L]`` log-enrichment in nats.
    """
    p = np.asarray(probs, dtype=np.float64)
    ids = np.asarray(list_ids)
    if p.shape != ids.shape or p.shape[1] != len(lags):
        raise ValueError(f"probs {p.shape}, list_ids {ids.shape} and lags ({len(lags)}) do not match")
    return np.log(np.maximum(p, floor)) - log_baseline(p[:, None], ids, np.asarray(lags)[None], far_lag, floor)


def curve_arms(conditions, values) -> list[tuple[str, str, int, str, np.ndarray]]:
    """``(name, kind, k, draw, values [n_trials, L])`` per condition, then per pooled ``random-k`` arm
    (per-trial mean over the draws, draw :data:`CURVE_POOLED_DRAW`). ``values``: condition name -> ``[n_trials, L]``."""
    return [(*key, v) for key, v in arm_values(conditions, values, draw=CURVE_POOLED_DRAW)]


def _curve_frame(name, kind, k, draw, lags, values, **extra) -> pd.DataFrame:
    m, half = mean_ci(values)
    return pd.DataFrame({"condition": name, "kind": kind, "k": k, "draw": draw, **extra,
                         "lag": lags, "mean": m, "ci_low": m - half, "ci_high": m + half})


def curve_table(arms, lags) -> pd.DataFrame:
    """The lag curve: one row per (arm, lag) with the mean probability and its 95% CI over trials
    (``mean``, ``ci_low``, ``ci_high``) and the same renormalised over the list tokens (``mean_renorm``,
    ``ci_low_renorm``, ``ci_high_renorm``). ``arms``: :func:`curve_arms` of the probabilities; ``lags``: ``[L]``."""
    rows = []
    for name, kind, k, draw, probs in arms:
        p = probs.astype(np.float64)
        base = _curve_frame(name, kind, k, draw, lags, p)
        m, half = mean_ci(p / p.sum(1, keepdims=True))
        base["mean_renorm"], base["ci_low_renorm"], base["ci_high_renorm"] = m, m - half, m + half
        rows.append(base)
    return pd.concat(rows, ignore_index=True)


def enrichment_table(arms, lags) -> pd.DataFrame:
    """The word-prior-corrected curve: one row per (arm, lag), ``measure == "log_enrichment"``, ``mean``
    log-enrichment (nats) and its 95% CI over trials. ``arms``: :func:`curve_arms` of :func:`log_enrichment`."""
    return pd.concat([_curve_frame(name, kind, k, draw, lags, e, measure="log_enrichment")
                      for name, kind, k, draw, e in arms], ignore_index=True)


def headline_row(key: tuple, probs, list_mass, cue_position: int, enrichment=None) -> dict:
    """One arm's headline: ``condition, kind, k, draw`` (``key``), then p(lag +1 / −1 / 0) and the list
    mass (probabilities), and with ``enrichment`` (``[n_trials, L]``, nats) its lag ±1, each as
    ``x, x_ci_low, x_ci_high`` (:data:`HEADLINE_LAGS`, :data:`ENRICHMENT_LAGS`).
    ``probs``: ``[n_trials, L]``; ``list_mass``: ``[n_trials]``."""
    p = probs.astype(np.float64)
    out = dict(zip(("condition", "kind", "k", "draw"), key))
    for name, lag in HEADLINE_LAGS.items():
        put_ci(out, name, p[:, column(lag, cue_position)])
    put_ci(out, "list_mass", list_mass)
    if enrichment is not None:
        for name, lag in ENRICHMENT_LAGS.items():
            put_ci(out, name, enrichment[:, column(lag, cue_position)])
    return out


def headline_table(conditions, probs, list_mass, cue_position: int, enrichment=None) -> pd.DataFrame:
    """:func:`headline_row` per condition, then per pooled ``random-k`` arm (per-trial mean over the
    draws, draw ``"mean of <n>"``). ``probs``, ``list_mass``, ``enrichment``: condition name -> array."""
    corrected = [e for _, e in arm_values(conditions, enrichment)] if enrichment is not None else None
    return pd.DataFrame([headline_row(key, p, mass, cue_position, None if corrected is None else corrected[i])
                         for i, ((key, p), (_, mass)) in enumerate(zip(arm_values(conditions, probs),
                                                                        arm_values(conditions, list_mass)))])


def contrast_table(conditions, values, lag: int, cue_position: int) -> pd.DataFrame:
    """Paired per-trial contrast at one lag for each k: random-k (per-trial mean of the draws) −
    induction-k, with its 95% CI over trials. ``values``: condition name -> ``[n_trials, L]``
    (probabilities, or log-enrichment in nats). Columns k, lag, induction, random (means),
    random_minus_induction, ci_low, ci_high."""
    col = column(lag, cue_position)
    conditions = list(conditions)
    arm = ranked_kind(conditions)
    rows = []
    for k, ind, rnd in paired_by_k(conditions, values, arm):
        pi, pr = ind[:, col].astype(np.float64), rnd[:, col].astype(np.float64)
        m, half = mean_ci(pr - pi)
        rows.append({"k": k, "lag": lag, arm: pi.mean(), "random": pr.mean(),
                     f"random_minus_{arm}": float(m), "ci_low": float(m - half), "ci_high": float(m + half)})
    return pd.DataFrame(rows)


def lag_json(values, lags) -> dict:
    """``{"lags": {lag: mean}, "ci95": {lag: [low, high]}}`` of ``values`` ``[n_trials, L]`` (results.json)."""
    m, half = mean_ci(values)
    return {"lags": {int(l): float(v) for l, v in zip(lags, m)},
            "ci95": {int(l): [float(v - h), float(v + h)] for l, v, h in zip(lags, m, half)}}


def condition_json(record: dict, probs, list_mass, argmax_lag, cue_position: int, enrichment=None) -> dict:
    """One condition's block of results.json: ``record`` (its name, kind, …), then ``n_trials``, the
    headline lags and list mass (means), the curve (:func:`lag_json`), ``argmax_in_list`` (fraction of
    trials whose arg-max is a list word: ``argmax_lag`` ``[n_trials]`` not NaN) and, given
    ``enrichment``, its curve as ``log_enrichment``."""
    p = probs.astype(np.float64)
    lags = lags_of(p.shape[1], cue_position)
    h = headline_row((), p, list_mass, cue_position)
    out = {**record, "n_trials": int(p.shape[0]), **{name: h[name] for name in (*HEADLINE_LAGS, "list_mass")},
           **lag_json(p, lags), "argmax_in_list": float(np.mean(~np.isnan(argmax_lag)))}
    if enrichment is not None:
        out["log_enrichment"] = lag_json(enrichment, lags)
    return out
