"""Plots (PNG, matplotlib Agg): head-score heat maps and lag curves with 95% CIs.

Computing lives elsewhere; these functions take arrays / tidy tables and a path.
"""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from .runs import atomic_write_bytes  # noqa: E402


def save(fig, path: str | Path) -> None:
    """Save a figure atomically as PNG and close it."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def head_heatmaps(scores: dict[str, np.ndarray], path: str | Path, title: str = "") -> None:
    """One heat map per score (layers × query heads, colour = score in [0, 1])."""
    names = list(scores)
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 0.16 * scores[names[0]].shape[0] + 2.2),
                             squeeze=False, layout="constrained")
    for ax, name in zip(axes[0], names):
        im = ax.imshow(np.asarray(scores[name]), aspect="auto", cmap="viridis", vmin=0, vmax=1, origin="upper")
        ax.set_title(name.replace("_", " "))
        n_heads = np.asarray(scores[name]).shape[1]
        ax.set_xticks(range(n_heads) if n_heads <= 16 else range(0, n_heads, max(1, n_heads // 8)))
        ax.set_xlabel("query head")
        ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        if ax is axes[0][0]:
            ax.set_ylabel("layer")
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="attention probability")
    if title:
        fig.suptitle(title)
    save(fig, path)


def _style(name: str, ks: list[int]) -> dict:
    """Colour families: intact black; induction-k solid, random-k dashed, one hue per k."""
    if name == "intact":
        return {"color": "black", "ls": "-", "lw": 2.0}
    kind, _, rest = name.partition("-")
    k = int(rest.split("-")[0]) if rest.split("-")[0].isdigit() else None
    cmap = plt.get_cmap("viridis")
    color = cmap(0.15 + 0.7 * ks.index(k) / max(1, len(ks) - 1)) if k in ks else None
    return {"color": color, "ls": "-" if kind == "induction" else "--", "lw": 1.4}


def lag_curves(summary: pd.DataFrame, path: str | Path, lags=range(-10, 11), conditions=None,
               column: str = "mean", title: str = "", chance: float | None = None) -> None:
    """Mean next-token probability by lag per condition, with the 95% CI as a band.

    ``summary``: tidy table from :meth:`LagProbeResult.summary` (columns condition, lag,
    mean, ci_low, ci_high, ...). ``column`` = ``mean`` (raw) or ``mean_renorm``. Lag 0 (the
    cue repeated) is drawn as its own point. ``chance``: a horizontal reference line (e.g. the
    list mass spread evenly over the list).
    """
    lo_col, hi_col = ("ci_low", "ci_high") if column == "mean" else ("ci_low_renorm", "ci_high_renorm")
    df = summary[summary["lag"].isin(list(lags))]
    if conditions is None:
        conditions = list(dict.fromkeys(df["condition"]))
    ks = sorted({int(c.split("-")[1]) for c in conditions if c.count("-") >= 1 and c.split("-")[1].isdigit()})
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    for name in conditions:
        d = df[df["condition"] == name].sort_values("lag")
        st = _style(name, ks)
        for i, s in enumerate((d[d["lag"] < 0], d[d["lag"] > 0])):
            line, = ax.plot(s["lag"], s[column], marker="o", ms=3, label=name if i == 0 else None, **st)
            st["color"] = line.get_color()
            ax.fill_between(s["lag"], s[lo_col], s[hi_col], alpha=0.12, color=st["color"], lw=0)
        z = d[d["lag"] == 0]
        ax.plot(z["lag"], z[column], marker="x", ms=5, color=st["color"], ls="none")
    if chance is not None:
        ax.axhline(chance, color="grey", lw=0.8, ls=":", label="list mass / list length")
    ax.set_xticks(list(lags) if len(lags) <= 25 else None)
    ax.set_xlabel("lag (0 = the cue repeated, marked x)")
    ax.set_ylabel("p(next token = word at lag)" + (" (renormalised)" if column != "mean" else ""))
    ax.legend(fontsize=7, ncol=2)
    if title:
        ax.set_title(title)
    save(fig, path)
