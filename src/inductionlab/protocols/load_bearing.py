"""Per-head load-bearing map: which single heads carry the lag +1 effect.

For the top-N heads by induction score, each head is ablated **alone** and the protocols are
rerun on the same trials as the intact model (paired design). The causal effect of a head on a
measure is ``Δ = measure(head ablated) − measure(intact)`` (e.g. the lag-probe p(lag +1), the
serial-recall lag +1 transition probability; negative = the head supports it), with a paired
95% CI over trials (normal approximation, mean ± 1.96·sd/√n).

Concentration: heads sorted by their drop (``−Δ``, largest first); the share of the total drop
of the N heads carried by the top 1, 5, 10 (cumulative sum / total; only positive drops count,
so heads that *raise* the measure do not shrink the total). A map where one head carries most
of the effect reads very differently from one where the effect is spread thinly.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..core.ablation import Condition, top_k_heads
from ..measures.stats import paired_diff


def single_head_conditions(induction: np.ndarray, top_n: int) -> list[Condition]:
    """One condition per head among the ``top_n`` by induction score (``top_n`` clipped to the head count)."""
    induction = np.asarray(induction)
    heads = top_k_heads(induction, min(int(top_n), induction.size))
    return [Condition(f"head-L{l}H{h}", "single", 1, 0, [(l, h)]) for l, h in heads]


def load_bearing_table(induction: np.ndarray, conditions: list[Condition], intact: dict[str, np.ndarray],
                       single: dict[str, dict[str, np.ndarray]]) -> pd.DataFrame:
    """Per-head causal effects.

    Args:
        induction: ``[n_layers, n_heads]`` induction scores.
        conditions: the single-head conditions (order = induction rank).
        intact: measure name -> ``[n_trials]`` per-trial value for the intact model.
        single: condition name -> measure name -> ``[n_trials]`` with that head ablated (same
            trials, same order). Measures missing for a condition are skipped.

    Returns:
        DataFrame: ``rank, layer, head, induction_score`` and per measure ``m``: ``m`` (mean
        with the head ablated), ``m_delta``, ``m_delta_ci_low``, ``m_delta_ci_high``,
        ``m_drop_share`` (max(−Δ, 0) / Σ max(−Δ, 0), 0 when no head lowers it).
    """
    rows = []
    for rank, c in enumerate(conditions, 1):
        (l, h), = c.heads
        row = {"rank": rank, "layer": l, "head": h, "induction_score": float(induction[l, h])}
        for m, base in intact.items():
            if m not in single.get(c.name, {}):
                continue
            v = np.asarray(single[c.name][m], np.float64)
            row[m] = float(v.mean())
            row[f"{m}_delta"], row[f"{m}_delta_ci_low"], row[f"{m}_delta_ci_high"] = paired_diff(v, base)
        rows.append(row)
    df = pd.DataFrame(rows)
    for m in intact:
        if f"{m}_delta" in df:
            drops = np.clip(-df[f"{m}_delta"].to_numpy(np.float64), 0, None)
            df[f"{m}_drop_share"] = drops / drops.sum() if drops.sum() > 0 else 0.0
    return df


def concentration(table: pd.DataFrame, measure: str, tops=(1, 5, 10)) -> dict:
    """Share of the total drop in ``measure`` carried by the top 1, 5, 10 heads.

    Returns: ``{"total_drop": float, "by_effect": {n: share}, "by_induction_rank": {n: share},
    "curve": [cumulative share, heads sorted by drop]}``; ``n`` only up to the number of heads
    in the table; shares in [0, 1] (all 0 when no head lowers the measure).
    """
    drops = np.clip(-table[f"{measure}_delta"].to_numpy(np.float64), 0, None)
    total = float(drops.sum())
    by_eff = np.cumsum(np.sort(drops)[::-1]) / total if total > 0 else np.zeros(len(drops))
    by_rank = np.cumsum(drops) / total if total > 0 else np.zeros(len(drops))
    pick = lambda cum: {int(n): float(cum[n - 1]) for n in tops if n <= len(cum)}  # noqa: E731
    return {"measure": measure, "total_drop": total, "by_effect": pick(by_eff), "by_induction_rank": pick(by_rank),
            "curve": by_eff.tolist()}
