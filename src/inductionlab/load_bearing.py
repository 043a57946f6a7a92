"""Per-head load-bearing map: which single heads carry the lag +1 effect.

For the top-N heads by induction score, each head is ablated **alone** and the lag probe is
rerun on the same trials as the intact model (paired design). The causal effect of a head is
the change in the lag +1 probability, ``Δ = p_ablated(+1) − p_intact(+1)`` (probability; negative
= the head supports the +1 transition), with a paired 95% CI over trials (normal approximation).

Concentration: heads sorted by their drop (``−Δ``, largest first); the share of the total drop of
the N heads carried by the top 1, 5, 10 (cumulative sum / total, only positive drops counted in
the total so that heads that *raise* +1 do not shrink it). A map where one head carries most of
the effect reads very differently from one where the effect is spread thinly.
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


def load_bearing_table(induction: np.ndarray, intact_lag1: np.ndarray, single_lag1: dict[str, np.ndarray],
                       conditions: list[Condition]) -> pd.DataFrame:
    """Per-head causal effect on lag +1.

    Args:
        induction: ``[n_layers, n_heads]`` induction scores.
        intact_lag1: ``[n_trials]`` intact lag +1 probability per trial.
        single_lag1: condition name -> ``[n_trials]`` lag +1 probability with that head ablated
            (same trials, same order).
        conditions: the single-head conditions (order = induction rank).

    Returns:
        DataFrame: ``rank, layer, head, induction_score, lag_plus1, delta, delta_ci_low,
        delta_ci_high, drop_share`` (``drop_share`` = max(−Δ, 0) / Σ max(−Δ, 0)).
    """
    rows = []
    for rank, c in enumerate(conditions, 1):
        (l, h), = c.heads
        d = np.asarray(single_lag1[c.name], np.float64) - np.asarray(intact_lag1, np.float64)
        m, half = _mean_ci(d)
        rows.append({"rank": rank, "layer": l, "head": h, "induction_score": float(induction[l, h]),
                     "lag_plus1": float(np.mean(single_lag1[c.name])), "delta": float(m),
                     "delta_ci_low": float(m - half), "delta_ci_high": float(m + half)})
    df = pd.DataFrame(rows)
    drops = np.clip(-df["delta"].to_numpy(), 0, None) if len(df) else np.zeros(0)
    total = drops.sum()
    df["drop_share"] = drops / total if total > 0 else 0.0
    return df


def concentration(table: pd.DataFrame, tops=(1, 5, 10)) -> dict:
    """Share of the total lag +1 drop carried by the top 1, 5, 10 heads (sorted by drop).

    Returns: ``{"total_drop": float, "by_effect": {n: share}, "by_induction_rank": {n: share},
    "curve": [cumulative share for 1…N heads sorted by drop]}``; shares in [0, 1] (NaN-free:
    0 when no head lowers lag +1).
    """
    drops = np.clip(-table["delta"].to_numpy(np.float64), 0, None)
    total = float(drops.sum())
    by_eff = np.cumsum(np.sort(drops)[::-1]) / total if total > 0 else np.zeros(len(drops))
    by_rank = np.cumsum(drops) / total if total > 0 else np.zeros(len(drops))
    pick = lambda cum: {int(n): float(cum[min(n, len(cum)) - 1]) for n in tops if len(cum)}  # noqa: E731
    return {"total_drop": total, "by_effect": pick(by_eff), "by_induction_rank": pick(by_rank),
            "curve": by_eff.tolist()}


def plot_load_bearing(table: pd.DataFrame, path, title: str = "") -> None:
    """Scatter: induction score (x) vs Δ lag +1 probability when the head alone is ablated (y), 95% CIs."""
    from .plots import plt, save

    fig, ax = plt.subplots(figsize=(6, 4.2))
    y = table["delta"]
    err = np.vstack([y - table["delta_ci_low"], table["delta_ci_high"] - y])
    ax.errorbar(table["induction_score"], y, yerr=err, fmt="o", ms=4, capsize=2)
    for _, r in table.head(5).iterrows():
        ax.annotate(f"L{r.layer}H{r.head}", (r.induction_score, r.delta), fontsize=7, xytext=(3, 3),
                    textcoords="offset points")
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xlabel("induction score")
    ax.set_ylabel("Δ p(lag +1) when this head alone is ablated")
    ax.set_title(title or "Per-head load-bearing map")
    save(fig, path)


def plot_concentration(conc: dict, path, title: str = "") -> None:
    """Cumulative share of the total single-head lag +1 drop vs number of heads (sorted by drop)."""
    from .plots import plt, save

    cum = conc["curve"]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(np.arange(1, len(cum) + 1), cum, marker="o", ms=3, label="heads sorted by drop")
    for n, share in conc["by_effect"].items():
        ax.annotate(f"top {n}: {share:.0%}", (n, share), fontsize=7, xytext=(4, -10), textcoords="offset points")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("number of heads")
    ax.set_ylabel("share of total single-head drop in p(lag +1)")
    ax.set_title(title or f"Concentration (total drop {conc['total_drop']:.3g})")
    ax.legend(fontsize=7)
    save(fig, path)
