"""Plots (PNG, matplotlib Agg): head-score heat maps and lag curves with 95% CIs.

Computing lives elsewhere; these functions take arrays / tidy tables and a path.
"""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

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
                             squeeze=False)
    for ax, name in zip(axes[0], names):
        im = ax.imshow(np.asarray(scores[name]), aspect="auto", cmap="viridis", vmin=0, vmax=1, origin="upper")
        ax.set_title(name.replace("_", " "))
        n_heads = np.asarray(scores[name]).shape[1]
        ax.set_xticks(range(n_heads) if n_heads <= 16 else range(0, n_heads, max(1, n_heads // 8)))
        ax.set_xlabel("query head")
        ax.set_ylabel("layer")
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="attention probability")
    if title:
        fig.suptitle(title)
    save(fig, path)


def lag_curves(summary: pd.DataFrame, path: str | Path, lags=range(-10, 11), conditions=None,
               column: str = "mean", title: str = "") -> None:
    """Mean next-token probability by lag per condition, with the 95% CI as a band.

    ``summary``: tidy table from :meth:`LagProbeResult.summary` (columns condition, lag,
    mean, ci_low, ci_high, ...). ``column`` = ``mean`` (raw) or ``mean_renorm``.
    """
    lo_col, hi_col = ("ci_low", "ci_high") if column == "mean" else ("ci_low_renorm", "ci_high_renorm")
    df = summary[summary["lag"].isin(list(lags)) & (summary["lag"] != 0)]
    if conditions is None:
        conditions = list(dict.fromkeys(df["condition"]))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name in conditions:
        d = df[df["condition"] == name].sort_values("lag")
        color = None
        for s in (d[d["lag"] < 0], d[d["lag"] > 0]):   # lag 0 (the cue) is left out
            line, = ax.plot(s["lag"], s[column], marker="o", ms=3, color=color,
                            label=name if color is None else None)
            color = line.get_color()
            ax.fill_between(s["lag"], s[lo_col], s[hi_col], alpha=0.2, color=color)
    ax.set_xlabel("lag")
    ax.set_ylabel("p(next token = word at lag)" + (" (renormalised)" if column != "mean" else ""))
    ax.axvline(0, color="grey", lw=0.5)
    ax.legend(fontsize=7, ncol=2)
    if title:
        ax.set_title(title)
    save(fig, path)
