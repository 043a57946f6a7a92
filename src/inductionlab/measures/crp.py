"""Lag-CRP (conditional response probability by lag) in the conventions of psifr.

Free-recall analysis (Kahana 1996; psifr by Morton, ``psifr.fr.lag_crp``) counts, for every
transition between two recalls, the lag actually made and every lag that was *possible*:

* serial positions are 1-based input positions; **lag = position(current) − position(previous)**,
  from −(L−1) to L−1 (lag 0 cannot occur: a repeat is not a valid transition);
* an item leaves the pool once it has been the *previous* item of a transition, so a repeat
  (an item already recalled) and an intrusion (an item not on the list; ``None``/``NaN``/0 here)
  break the chain: the transitions into and out of them are skipped, and count neither as
  actual nor as possible;
* for each counted transition, ``actual[lag] += 1`` and ``possible[lag'] += 1`` for every item
  still in the pool (``lag'`` measured from the previous item); ``count_unique=True`` counts each
  possible lag at most once per transition (with one list per study this changes nothing, as in
  psifr); ``CRP(lag) = actual / possible`` (NaN where nothing was possible).

psifr is GPL-3.0, so this is our own implementation of its conventions, tested on hand-worked
lists (tests/test_crp.py). :func:`prob_lag_crp` is the probability-weighted generalisation for
language models (ANCHORS §6.4): ``actual[lag] +=`` the next-token probability of the item at that
lag renormalised over the items still available; it equals :func:`lag_crp` when every
distribution is one-hot. :func:`lag_probe_crp` turns the lag probe's arg-max (or sampled)
responses into the classic actual / possible table.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

from ..errors import InductionLabError


def _position(x) -> int | None:
    """A 1-based serial position, or None for an intrusion (None, NaN or a value <= 0)."""
    if x is None:
        return None
    f = float(x)
    return None if math.isnan(f) or f <= 0 else int(f)


def _table(actual: np.ndarray, possible: np.ndarray, list_length: int) -> pd.DataFrame:
    lags = np.arange(-(list_length - 1), list_length)
    with np.errstate(invalid="ignore", divide="ignore"):
        prob = np.where(possible > 0, actual / np.where(possible > 0, possible, 1), np.nan)
    return pd.DataFrame({"lag": lags, "prob": prob, "actual": actual, "possible": possible})


def lag_crp(recalls: Sequence[Sequence], list_length: int, *, count_unique: bool = False) -> pd.DataFrame:
    """Lag-CRP of recall sequences given as serial positions (psifr ``lag_crp`` conventions).

    Args:
        recalls: one sequence per list; each entry is the 1-based serial position of the recalled
            item, or ``None`` / ``NaN`` / a value ≤ 0 for an intrusion. A position recalled twice
            is a repeat.
        list_length: L, items per study list (positions must lie in 1..L).
        count_unique: count each possible lag at most once per transition.

    Returns:
        DataFrame with one row per lag −(L−1)…(L−1): ``lag``, ``prob`` (actual / possible,
        NaN where possible = 0), ``actual``, ``possible`` (counts, float).

    Raises:
        InductionLabError: a position outside 1..L, or L < 2.
    """
    if list_length < 2:
        raise InductionLabError(f"list_length={list_length}: a lag-CRP needs lists of at least 2 items")
    L = int(list_length)
    actual = np.zeros(2 * L - 1)
    possible = np.zeros(2 * L - 1)
    for seq in recalls:
        pos = [_position(x) for x in seq]
        bad = [p for p in pos if p is not None and p > L]
        if bad:
            raise InductionLabError(f"serial position {bad[0]} is outside a list of {L} items; check list_length")
        pool = np.ones(L + 1, dtype=bool)
        pool[0] = False
        for prev, curr in zip(pos[:-1], pos[1:]):
            if prev is None or not pool[prev]:
                continue
            pool[prev] = False                       # the previous item leaves the pool
            if curr is None or not pool[curr]:
                continue                             # intrusion or repeat: not a transition
            actual[curr - prev + L - 1] += 1
            avail = np.nonzero(pool)[0]
            lags = avail - prev + L - 1
            if count_unique:
                lags = np.unique(lags)
            np.add.at(possible, lags, 1)
    return _table(actual, possible, L)


def lag_crp_items(study: Sequence[Sequence], recall: Sequence[Sequence], *,
                  count_unique: bool = False) -> pd.DataFrame:
    """Lag-CRP from item identities (like psifr's ``table_from_lists`` + ``lag_crp``).

    Args:
        study: per list, the studied items in presentation order (all lists the same length,
            items unique within a list).
        recall: per list, the recalled items in output order; an item absent from its study
            list is an intrusion.

    Raises:
        InductionLabError: lists of different lengths, duplicate study items, or study/recall
            lists that do not pair up.
    """
    if len(study) != len(recall):
        raise InductionLabError(f"{len(study)} study lists but {len(recall)} recall lists; pass one recall per list")
    lengths = {len(s) for s in study}
    if len(lengths) != 1:
        raise InductionLabError(f"study lists have different lengths {sorted(lengths)}; use lists of equal length")
    positions = []
    for s, r in zip(study, recall):
        index = {item: i + 1 for i, item in enumerate(s)}
        if len(index) != len(s):
            raise InductionLabError("a study list contains a repeated item; items must be unique within a list")
        positions.append([index.get(item) for item in r])
    return lag_crp(positions, lengths.pop(), count_unique=count_unique)


def prob_lag_crp(prev: np.ndarray, probs: np.ndarray, available: np.ndarray) -> pd.DataFrame:
    """Probability-weighted lag-CRP over transition events (ANCHORS §6.4).

    Args:
        prev: ``[E]`` 1-based serial position of the previous item of each event.
        probs: ``[E, L]`` probability of each list position's item as the next response (raw or
            renormalised; it is renormalised here over the available items).
        available: ``[E, L]`` bool, items still in the pool (the previous item and items already
            recalled are not).

    Returns:
        Same table as :func:`lag_crp`; ``actual[lag]`` sums the renormalised probabilities, so the
        result equals :func:`lag_crp` when each row of ``probs`` is one-hot on an available item.

    Raises:
        InductionLabError: shapes disagree, or an event has no available item.
    """
    probs = np.asarray(probs, dtype=np.float64)
    available = np.asarray(available, dtype=bool)
    prev = np.asarray(prev, dtype=np.int64)
    if probs.ndim != 2 or probs.shape != available.shape or prev.shape != probs.shape[:1]:
        raise InductionLabError(f"shapes disagree: prev {prev.shape}, probs {probs.shape}, available {available.shape}")
    E, L = probs.shape
    if E and not available.any(1).all():
        raise InductionLabError("an event has no available item; drop events at the end of a list")
    w = np.where(available, probs, 0.0)
    tot = w.sum(1, keepdims=True)
    w = np.divide(w, tot, out=np.zeros_like(w), where=tot > 0)
    lag_idx = np.arange(L)[None, :] + 1 - prev[:, None] + L - 1          # [E, L] index into lags
    actual = np.bincount(lag_idx[available], weights=w[available], minlength=2 * L - 1)
    possible = np.bincount(lag_idx[available], minlength=2 * L - 1).astype(np.float64)
    return _table(actual, possible, L)


def lag_probe_crp(result, *, response: str = "argmax", seed: int = 0) -> pd.DataFrame:
    """psifr-style CRP of the lag probe's responses, per condition.

    Each trial is one two-recall sequence: the cue (list position ``cue_position``, which then
    leaves the pool) followed by the model's response. ``response="argmax"`` uses the arg-max
    next token; ``"sample"`` draws the response from the raw next-token distribution (a draw of a
    non-list token, probability ``1 − list mass``, is an intrusion). A response at lag 0
    (repeating the cue) is a repeat and an off-list response an intrusion: neither is a transition.

    Args:
        result: a :class:`inductionlab.protocols.lag_probe.LagProbeResult`.

    Returns:
        Tidy DataFrame: ``condition, kind, k, draw, lag, prob, actual, possible, n_trials,
        n_transitions`` (lags −(cue−1)…(L−cue), lag 0 dropped).

    Raises:
        InductionLabError: unknown ``response``.
    """
    if response not in ("argmax", "sample"):
        raise InductionLabError(f"unknown response {response!r}; use argmax or sample")
    cfg = result.config
    L, cue = cfg.list_length, cfg.cue_position
    rows = []
    for ci, c in enumerate(result.conditions):
        if response == "argmax":
            lag = np.asarray(result.argmax_lag[c.name], dtype=np.float64)
        else:
            rng = np.random.default_rng([seed, ci])
            p = np.clip(np.asarray(result.probs[c.name], dtype=np.float64), 0, None)
            other = np.clip(1.0 - p.sum(1, keepdims=True), 0, None)
            full = np.concatenate([p, other], 1)
            full /= full.sum(1, keepdims=True)
            u = rng.random((len(full), 1))
            col = (full.cumsum(1) < u).sum(1)
            lag = np.where(col < L, col + 1 - cue, np.nan).astype(np.float64)
        recalls = [[cue, (cue + int(x)) if not np.isnan(x) else None] for x in lag]
        t = lag_crp(recalls, L)
        t = t[(t.lag >= 1 - cue) & (t.lag <= L - cue) & (t.lag != 0)]
        t.insert(0, "condition", c.name)
        t.insert(1, "kind", c.kind)
        t.insert(2, "k", c.k)
        t.insert(3, "draw", c.draw)
        t["n_trials"] = len(lag)
        t["n_transitions"] = int(np.sum(~np.isnan(lag) & (lag != 0)))
        rows.append(t)
    return pd.concat(rows, ignore_index=True)
