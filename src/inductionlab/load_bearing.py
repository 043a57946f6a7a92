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

from .ablation import Condition, top_k_heads
from .lag_probe import _mean_ci


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
            mean, half = _mean_ci(v - np.asarray(base, np.float64))
            row[m] = float(v.mean())
            row[f"{m}_delta"], row[f"{m}_delta_ci_low"], row[f"{m}_delta_ci_high"] = \
                float(mean), float(mean - half), float(mean + half)
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


def plot_load_bearing(table: pd.DataFrame, measures: dict[str, str], path, title: str = "") -> None:
    """Scatter per measure: induction score (x) vs Δ when the head alone is ablated (y), 95% CIs.

    ``measures``: measure name -> axis label."""
    from .plots import plt, save

    measures = {m: lab for m, lab in measures.items() if f"{m}_delta" in table}
    fig, axes = plt.subplots(1, len(measures), figsize=(5.2 * len(measures), 4), squeeze=False)
    for ax, (m, label) in zip(axes[0], measures.items()):
        y = table[f"{m}_delta"]
        err = np.vstack([y - table[f"{m}_delta_ci_low"], table[f"{m}_delta_ci_high"] - y])
        ax.errorbar(table["induction_score"], y, yerr=err, fmt="o", ms=4, capsize=2)
        for _, r in table.head(5).iterrows():
            ax.annotate(f"L{int(r.layer)}H{int(r['head'])}", (r.induction_score, r[f"{m}_delta"]), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_xlabel("induction score")
        ax.set_ylabel("Δ when the head alone is ablated")
        ax.set_title(label, fontsize=9)
    fig.suptitle(title or "Per-head load-bearing map")
    fig.tight_layout()
    save(fig, path)


def plot_concentration(concs: dict[str, dict], path, title: str = "") -> None:
    """Cumulative share of the total single-head drop vs number of heads (sorted by drop), one line per measure."""
    from .plots import plt, save

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, conc in concs.items():
        cum = conc["curve"]
        ax.plot(np.arange(1, len(cum) + 1), cum, marker="o", ms=3, label=f"{label} (total drop {conc['total_drop']:.3g})")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("number of heads (sorted by drop)")
    ax.set_ylabel("share of the total single-head drop")
    ax.set_title(title or "Concentration of the lag +1 effect")
    ax.legend(fontsize=7)
    save(fig, path)
