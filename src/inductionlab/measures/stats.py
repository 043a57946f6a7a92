"""Statistics shared by every protocol and study: 95% CIs over trials, the column convention
for them, pooling of random draws, paired contrasts, the drop of every measure under every ablation arm
(:func:`drop_table`).

Convention (SPEC §4): a CI is the normal approximation over trials, mean ± 1.96·sd/√n (sd with
ddof = 1). Every condition of a protocol sees the same trials in the same order, so a
difference between two conditions is computed trial by trial (paired) before its CI. Random
draws of one k are pooled the same way: the per-trial mean over the draws, then the CI.

A measure ``x`` with its CI is written as three columns ``x``, ``x_ci_low``, ``x_ci_high``
(:func:`put_ci`), in tidy tables and in results.json alike.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping, MutableMapping

import numpy as np

Z95 = 1.959963984540054   # two-sided 95% quantile of the standard normal


def mean_ci(arr) -> tuple[np.ndarray, np.ndarray]:
    """Mean over axis 0 and the half-width of its normal-approximation 95% CI.

    Args:
        arr: ``[n_trials, ...]`` per-trial values (any numeric dtype; computed in float64).

    Returns:
        ``(mean, half)``, each of shape ``arr.shape[1:]`` (numpy scalars for 1-D input);
        ``half`` is NaN when there is a single trial.
    """
    if arr is None or isinstance(arr, (str, bytes, dict)):
        raise TypeError(f"mean_ci needs [n_trials, ...] numbers, got {type(arr).__name__}")
    arr = np.asarray(arr, dtype=np.float64)
    if arr.ndim == 0:
        raise TypeError(f"mean_ci needs [n_trials, ...] values (one per trial), got a scalar {float(arr)}")
    n = arr.shape[0]
    m = arr.mean(0)
    half = Z95 * arr.std(0, ddof=1) / np.sqrt(n) if n > 1 else np.full_like(m, np.nan)[()]   # a scalar for 1-D
    return m, half


def ci(values) -> tuple[float, float, float]:
    """``(mean, ci_low, ci_high)`` of 1-D per-trial values, as Python floats."""
    m, half = mean_ci(values)
    return float(m), float(m - half), float(m + half)


def put_ci(row: MutableMapping, name: str, values) -> MutableMapping:
    """Write ``name``, ``name_ci_low``, ``name_ci_high`` (mean and 95% CI of ``values`` over
    axis 0) into ``row`` and return it. ``values``: ``[n_trials]`` or ``[n_trials, ...]``."""
    m, half = mean_ci(values)
    row[name], row[f"{name}_ci_low"], row[f"{name}_ci_high"] = m, m - half, m + half
    return row


def paired_diff(a, b) -> tuple[float, float, float]:
    """Paired contrast ``a − b`` over the same trials: ``(mean, ci_low, ci_high)``.
    ``a``, ``b``: ``[n_trials]``, trial ``i`` of both seen under the two conditions."""
    return ci(np.asarray(a, np.float64) - np.asarray(b, np.float64))


def draws_by_k(conditions: Iterable, kind: str = "random") -> dict[int, list[str]]:
    """``k -> names`` of the conditions of one kind (e.g. the random draws of each k), sorted by
    k, in run order within a k. ``conditions``: objects with ``.name``, ``.kind``, ``.k``."""
    out: dict[int, list[str]] = {}
    for c in sorted((c for c in conditions if c.kind == kind), key=lambda c: c.k):
        out.setdefault(c.k, []).append(c.name)
    return out


def pooled(table: Mapping[str, np.ndarray], names: list[str]) -> np.ndarray:
    """Per-trial mean over conditions (paired trials), e.g. over the random draws of one k.
    ``table``: name -> ``[n_trials, ...]``; returns ``[n_trials, ...]``."""
    return np.mean([table[n] for n in names], axis=0)


def pooled_arms(conditions: Iterable, kind: str = "random",
                draw: str | None = None) -> list[tuple[str, str, int, str, list[str]]]:
    """Every condition as its own arm, then one pooled arm per k of ``kind``:
    ``(name, kind, k, draw, member names)``; the pooled arm is named ``<kind>-<k>`` with
    draw ``"mean of <n>"`` (``draw``: another label for it)."""
    conditions = list(conditions)
    rows = [(c.name, c.kind, c.k, str(c.draw), [c.name]) for c in conditions]
    for k, names in draws_by_k(conditions, kind).items():
        rows.append((f"{kind}-{k}", kind, k, f"mean of {len(names)}" if draw is None else draw, names))
    return rows


def _getter(values) -> Callable[[str], np.ndarray]:
    """``values`` (name -> array, a mapping or a callable) as a callable that computes each name once."""
    get = values if callable(values) else values.__getitem__
    cache: dict[str, np.ndarray] = {}

    def once(name: str) -> np.ndarray:
        if name not in cache:
            cache[name] = get(name)
        return cache[name]
    return once


def arm_values(conditions: Iterable, values, kind: str = "random",
               draw: str | None = None) -> list[tuple[tuple[str, str, int, str], np.ndarray]]:
    """The arms of :func:`pooled_arms` with their per-trial values: ``[((name, kind, k, draw), values), …]``.

    ``values``: condition name -> ``[n_trials, ...]``, a mapping or a callable (called once per
    condition). An arm of one member holds that member's array (the same object); a pooled arm the
    per-trial mean over its members (:func:`pooled`)."""
    get = _getter(values)
    out = []
    for name, knd, k, d, members in pooled_arms(conditions, kind, draw):
        v = get(members[0]) if len(members) == 1 else pooled({m: get(m) for m in members}, members)
        out.append(((name, knd, k, d), v))
    return out


#: Condition kinds that are not a ranked selection (the rest are: ``induction``, ``previous_token``, ...).
UNRANKED_KINDS = ("intact", "random", "single")


def ranked_kind(conditions: Iterable, default: str = "induction") -> str:
    """The kind of the ranked arm among ``conditions`` (objects with ``.kind``, or kind strings): the one
    kind that is not ``intact``, ``random`` or ``single`` — ``induction`` by default, a ranking's label
    (``previous_token``, ``induction-excl-fv``) when the heads were ranked by another score. ``default``
    when there is none or several (``study head-types``' selections: the tables of one ranked arm per k
    then read the ``induction`` arm, as they always did)."""
    kinds = list(dict.fromkeys(k for k in (getattr(c, "kind", c) for c in conditions) if k not in UNRANKED_KINDS))
    return kinds[0] if len(kinds) == 1 else default


def paired_by_k(conditions: Iterable, values, kind: str | None = None) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """``[(k, ranked-k values, random-k values), …]`` for every k that has both a ranked condition
    (``kind``, default :func:`ranked_kind`: ``induction-k``) and random draws, by k: the ranked arm's
    ``[n_trials, ...]`` array and the random draws' per-trial mean (:func:`pooled`), for a paired
    random − induction contrast.
    ``values``: condition name -> ``[n_trials, ...]``, a mapping or a callable (called once per condition)."""
    get = _getter(values)
    conditions = list(conditions)
    random = draws_by_k(conditions)
    kind = ranked_kind(conditions) if kind is None else kind
    return [(k, get(ind[0]), pooled({n: get(n) for n in random[k]}, random[k]))
            for k, ind in draws_by_k(conditions, kind).items() if k in random]


def pooled_label(names: list[str]) -> str:
    """The arm of random draws pooled: their condition name without the draw (``random-all-5-d0``,
    ``random-all-5-d1`` -> ``random-all-5``; ``random-5-d0`` -> ``random-5``), so the label says which random
    control the draws come from."""
    return names[0].rsplit("-d", 1)[0]


def drop_table(conditions: Iterable, values: Callable[[str], Mapping[str, np.ndarray]],
               fractions: Mapping[int, float] | None = None) -> "pd.DataFrame":
    """Every measure under every ablation arm against intact, paired over the same trials: one row per (arm,
    measure), arms in run order (each ablated condition, then each k's random draws pooled per trial as the mean
    over draws, labelled by :func:`pooled_label`), measures in the order ``values`` gives them; a measure whose
    values are all NaN under an arm (not measured) is left out.

    Args:
        conditions: objects with ``name``, ``kind``, ``k`` (``intact`` among them; random draws of kind
            ``random``).
        values: condition name -> measure -> ``[n_trials]`` (the same trials in every condition).
        fractions: head count -> the fraction of all heads that gave it; given, a ``fraction`` column follows ``k``.

    Returns:
        columns arm, kind, k, (fraction,) measure, value, ci_low, ci_high (the arm's mean and 95% CI over trials),
        intact (the intact mean), drop, drop_ci_low, drop_ci_high (``intact − arm``, paired CI), relative_drop
        (drop / intact; NaN where intact is 0)."""
    import pandas as pd

    conditions = list(conditions)
    intact = values("intact")
    arms = [(c.name, c.kind, c.k, [c.name]) for c in conditions if c.kind not in ("random", "intact")]
    arms += [(pooled_label(names), "random", k, names) for k, names in draws_by_k(conditions).items()]
    rows = []
    for arm, kind, k, names in arms:
        vals = [values(n) for n in names]
        for m, base_v in intact.items():
            v = np.mean([x[m] for x in vals], axis=0)
            if np.isnan(v).all():
                continue
            mean, lo, hi = ci(v)
            d, dlo, dhi = ci(base_v - v)
            base = float(np.mean(base_v))
            rows.append({"arm": arm, "kind": kind, "k": k, **({} if fractions is None else {"fraction": fractions.get(k)}),
                         "measure": m, "value": mean, "ci_low": lo, "ci_high": hi, "intact": base, "drop": d,
                         "drop_ci_low": dlo, "drop_ci_high": dhi, "relative_drop": d / base if base else np.nan})
    return pd.DataFrame(rows)
