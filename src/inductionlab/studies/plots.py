"""Every figure (PNG, matplotlib Agg), saved atomically through :func:`save`.

Computing lives elsewhere: each function takes arrays or tidy tables (the ones the protocols'
results return), labels and a path, and draws nothing it has to compute beyond selecting rows.
Analysis figures first; training figures at the end (section ``# -- training figures``).
"""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib
import matplotlib.colors
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from ..measures.stats import ranked_kind  # noqa: E402
from ..runtime.runs import atomic_write_bytes  # noqa: E402


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


def pattern_window(n_tokens: int, max_queries: int = 128) -> tuple[int, int]:
    """The query rows ``[start, stop)`` :func:`attention_patterns` shows: all of them up to ``max_queries``
    tokens, else the last ``max_queries`` (on ``[BOS] S S`` the end of the second copy, where the induction
    stripe runs ``seq_len - 1`` keys left of the diagonal)."""
    return max(0, n_tokens - max_queries), n_tokens


def attention_patterns(patterns: np.ndarray, titles, path: str | Path, *, title: str = "",
                       max_queries: int = 128) -> None:
    """Small multiples of attention patterns: one panel per head, key position across, query position down.

    ``patterns``: ``[n_heads, T, T]`` attention probabilities (:func:`inductionlab.attention_patterns`);
    ``titles``: one per head (``"L18 H6 induction 0.87"``). Up to ``max_queries`` tokens every query is shown
    (one row of square panels); beyond, the last ``max_queries`` queries (:func:`pattern_window`) against
    every key, one wide panel per head stacked, so the first-token column and the induction stripe stay
    in view (a grey margin left of key 0 keeps the first-token column off the axis). Axes are token
    positions; colour is the probability on a square-root scale (weak attention
    stays visible beside the first token's mass), drawn cell by cell (nearest), so a one-key stripe is
    never averaged away.
    """
    patterns = np.asarray(patterns, dtype=np.float32)
    n, T = patterns.shape[0], patterns.shape[-1]
    q0, q1 = pattern_window(T, max_queries)
    wide = q0 > 0
    rows, cols = (n, 1) if wide else (1, n)
    w = min(12.0, 2.6 * T / (q1 - q0)) if wide else 3.0
    fig, axes = plt.subplots(rows, cols, figsize=(w * cols + 0.8, (2.6 if wide else 3.0) * rows + 0.6),
                             squeeze=False, layout="constrained")
    norm = matplotlib.colors.PowerNorm(0.5, vmin=0, vmax=1)
    for ax, pat, name in zip(axes.flat, patterns, titles):
        im = ax.imshow(pat[q0:q1], cmap="viridis", norm=norm, interpolation="nearest",
                       aspect="auto" if wide else "equal", extent=(-0.5, T - 0.5, q1 - 0.5, q0 - 0.5))
        ax.set_xlim(-0.5 - max(1.0, 0.02 * T), T - 0.5)        # the first-token column clear of the spine
        ax.set_facecolor("0.85")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("key position")
        ax.set_ylabel("query position")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True, nbins=6))
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8, label="attention probability")
    if title:
        fig.suptitle(title + (f"\nqueries {q0}–{q1 - 1} of {T}" if wide else ""), fontsize=10)
    save(fig, path)


def _k_of(name: str) -> int | None:
    """The k of a condition name: its first all-digit part (``induction-10``, ``induction-excl-fv-10``,
    ``random-all-10-d0`` -> 10); None for ``intact``."""
    nums = [p for p in name.split("-") if p.isdigit()]
    return int(nums[0]) if nums else None


def _ks(conditions) -> list[int]:
    return sorted({k for k in map(_k_of, conditions) if k is not None})


def _style(name: str, ks: list[int]) -> dict:
    """Colour families: intact black; ranked-k (``induction-k``, ``previous_token-k``, ``induction-excl-fv-k``)
    solid, random-k (``random-k``, ``random-all-k``, their draws) dashed, one hue per k."""
    if name == "intact":
        return {"color": "black", "ls": "-", "lw": 2.0}
    parts, k = name.split("-"), _k_of(name)
    cmap = plt.get_cmap("viridis")
    color = cmap(0.15 + 0.7 * ks.index(k) / max(1, len(ks) - 1)) if k in ks else None
    return {"color": color, "ls": "--" if parts[0] == "random" else "-", "lw": 1.4}


def lag_curves(summary: pd.DataFrame, path: str | Path, lags=range(-10, 11), conditions=None,
               column: str = "mean", title: str = "", chance: float | None = None,
               ylabel: str | None = None, zero_line: bool = False) -> None:
    """Mean next-token probability by lag per condition, with the 95% CI as a band.

    ``summary``: tidy table from :meth:`LagProbeResult.summary` (columns condition, lag,
    mean, ci_low, ci_high, ...). ``column`` = ``mean`` (raw) or ``mean_renorm``. Lag 0 (the
    cue repeated) is drawn as its own point. ``chance``: a horizontal reference line (e.g. the
    list mass spread evenly over the list). The word-prior-corrected curve:
    :meth:`LagProbeResult.corrected_summary` with ``ylabel`` set and ``zero_line=True`` (0 nats
    = as likely as the word's own baseline).
    """
    lo_col, hi_col = ("ci_low", "ci_high") if column == "mean" else ("ci_low_renorm", "ci_high_renorm")
    df = summary[summary["lag"].isin(list(lags))]
    if conditions is None:
        conditions = list(dict.fromkeys(df["condition"]))
    ks = _ks(conditions)
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
    if zero_line:
        ax.axhline(0.0, color="grey", lw=0.8, ls=":", label="word's own baseline")
    ax.set_xticks(list(lags) if len(lags) <= 25 else None)
    ax.set_xlabel("lag (0 = the cue repeated, marked x)")
    ax.set_ylabel(ylabel or ("p(next token = word at lag)" + (" (renormalised)" if column != "mean" else "")))
    ax.legend(fontsize=7, ncol=2)
    if title:
        ax.set_title(title)
    save(fig, path)


def serial_position_curve(table: pd.DataFrame, path: str | Path, conditions=None, title: str = "",
                          measures=(("lag_plus1", "p(lag +1)"), ("lag0", "p(lag 0): the cue repeated"),
                                    ("list_mass", "list mass"))) -> None:
    """One panel per measure: mean by cue position per condition, 95% CI (over lists) as a band.

    ``table``: :func:`inductionlab.measures.serial_position.serial_position` (columns condition, measure,
    cue_position, mean, ci_low, ci_high)."""
    if conditions is None:
        conditions = list(dict.fromkeys(table["condition"]))
    ks = _ks(conditions)
    fig, axes = plt.subplots(1, len(measures), figsize=(5.2 * len(measures), 3.9), squeeze=False)
    for ax, (m, label) in zip(axes[0], measures):
        for name in conditions:
            d = table[(table.condition == name) & (table.measure == m)].sort_values("cue_position")
            if d.empty:
                continue
            st = _style(name, ks)
            line, = ax.plot(d.cue_position, d["mean"], label=name, marker="o" if len(d) <= 30 else None, ms=3,
                            **{**st, "lw": 1.0})
            ax.fill_between(d.cue_position, d.ci_low, d.ci_high, alpha=0.15, color=line.get_color(), lw=0)
        ax.set_xlabel("cue position in the list")
        ax.set_title(label, fontsize=9)
        ax.set_ylim(bottom=0)
    axes[0][0].set_ylabel("next-token probability")
    axes[0][0].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save(fig, path)


def lag_crp_heatmap(bands: pd.DataFrame, path: str | Path, conditions, lags=range(-10, 11),
                    column: str = "mean_renorm", title: str = "") -> None:
    """One heat map per condition: cue-position band (rows) × lag (columns), colour = ``column``
    (default the lag-CRP renormalised over the list), one square-root colour scale for all panels
    (so lags far below the peak stay visible); lag 0
    (the cue repeated) is left blank so it does not set the scale.

    ``bands``: :func:`inductionlab.measures.serial_position.lag_crp_bands`."""
    lags = [l for l in lags if l != 0]
    cols = list(range(min(lags), max(lags) + 1))
    shown = [c for c in conditions if (bands.condition == c).any()]
    grids = []
    for name in shown:
        d = bands[bands.condition == name]
        g = d.pivot_table(index=["band", "band_first", "band_last"], columns="lag", values=column).reindex(columns=cols)
        g.loc[:, 0] = np.nan
        grids.append(g)
    vals = np.concatenate([g.to_numpy().ravel() for g in grids])
    vmax = float(np.nanmax(vals)) if np.isfinite(vals).any() else 1.0
    fig, axes = plt.subplots(1, len(shown), figsize=(4.4 * len(shown), 0.28 * len(grids[0]) + 2.4), squeeze=False,
                             layout="constrained")
    for ax, name, g in zip(axes[0], shown, grids):
        im = ax.imshow(g.to_numpy(), aspect="auto", cmap="viridis", interpolation="nearest",
                       norm=matplotlib.colors.PowerNorm(0.5, vmin=0, vmax=vmax))
        ax.set_xticks(range(len(cols)), [str(c) if c % 2 == 0 or len(cols) <= 11 else "" for c in cols], fontsize=7)
        ax.set_yticks(range(len(g)), [f"{a}–{b}" for _, a, b in g.index], fontsize=7)
        ax.set_xlabel("lag (0 left blank)")
        ax.set_title(name, fontsize=9)
    axes[0][0].set_ylabel("cue positions (band)")
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8,
                 label=("p(word at lag), renormalised over the list" if column == "mean_renorm" else column)
                 + " (square-root colour scale)")
    if title:
        fig.suptitle(title, fontsize=10)
    save(fig, path)


def ablation_vs_k(head: pd.DataFrame, labels: dict[str, str], path, title: str = "", ranked: str = "induction") -> None:
    """One panel per measure: mean vs k for ranked (induction) vs random ablation, intact as a band; 95% CIs.

    ``head``: tidy table with columns ``measure, k`` and ``intact / <ranked> / random`` each with
    ``_ci_low`` / ``_ci_high`` (:func:`inductionlab.studies.temporal.verdicts.headline_table`); ``ranked``:
    the ranked arm's kind (``induction``, ``previous_token``, ...).
    ``labels``: measure -> panel title; measures missing from ``head`` are skipped, in ``labels`` order.
    """
    measures = [m for m in labels if m in set(head.measure)]
    fig, axes = plt.subplots(1, len(measures), figsize=(4.6 * len(measures), 3.8), squeeze=False)
    for ax, m in zip(axes[0], measures):
        d = head[head.measure == m].sort_values("k")
        for arm, mk in ((ranked, "o"), ("random", "s")):
            err = np.vstack([d[arm] - d[arm + "_ci_low"], d[arm + "_ci_high"] - d[arm]])
            ax.errorbar(d.k, d[arm], yerr=err, marker=mk, capsize=3, label=f"{arm} heads ablated")
        ax.axhline(d.intact.iloc[0], color="k", lw=1, label="intact")
        ax.axhspan(d.intact_ci_low.iloc[0], d.intact_ci_high.iloc[0], color="k", alpha=0.1)
        ax.set_xlabel("k (heads ablated)")
        ax.set_title(labels[m], fontsize=9)
        ax.set_ylim(bottom=0)
    axes[0][0].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    save(fig, path)


def tidy_curves(df: pd.DataFrame, path, conditions, xlabel: str, ylabel: str, title: str = "",
                value: str = "mean") -> None:
    """Generic tidy-curve plot (columns condition, lag, ``value``, optional ci_low, ci_high), lag 0 dropped."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name in conditions:
        d = df[(df.condition == name) & (df.lag != 0)].sort_values("lag")
        if d.empty:
            continue
        line, = ax.plot(d.lag, d[value], marker="o", ms=3, label=name)
        if "ci_low" in d:
            ax.fill_between(d.lag, d.ci_low, d.ci_high, alpha=0.2, color=line.get_color())
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.axvline(0, color="grey", lw=0.5)
    ax.legend(fontsize=7)
    if title:
        ax.set_title(title)
    save(fig, path)


def load_bearing_scatter(table: pd.DataFrame, measures: dict[str, str], path, title: str = "") -> None:
    """Scatter per measure: induction score (x) vs Δ when the head alone is ablated (y), 95% CIs.

    ``measures``: measure name -> axis label."""
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


def concentration_curve(concs: dict[str, dict], path, title: str = "") -> None:
    """Cumulative share of the total single-head drop vs number of heads (sorted by drop), one line per measure."""
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


def hits_by_task(hits: pd.DataFrame, arms: list[tuple[str, dict]], path, title: str = "", metric: str = "hits1") -> None:
    """Grouped bars: ``metric`` (HITS@1) per task (and the macro average) for each arm, 95% CI whiskers.

    Args:
        hits: tidy table with ``task``, the selection columns of ``arms``, ``metric`` and
            ``<metric>_ci_low`` / ``_ci_high`` (:func:`inductionlab.studies.evaluate.tables.hits_table`).
        arms: ``(label, {column: value})`` per bar colour, e.g. ``("intact, 10 shots",
            {"condition": "intact", "shots": 10, "control": "intact"})``; arms without rows are skipped.
    """
    tasks = [t for t in dict.fromkeys(hits.task) if t != "macro"] + ["macro"]
    sel = []
    for label, where in arms:
        d = hits
        for col, val in where.items():
            d = d[d[col] == val]
        if len(d):
            sel.append((label, d.set_index("task").reindex(tasks)))
    width = 0.8 / max(1, len(sel))
    fig, ax = plt.subplots(figsize=(max(8.0, 0.95 * len(tasks) + 2), 4.6))
    cmap = plt.get_cmap("tab10")
    x = np.arange(len(tasks))
    for i, (label, d) in enumerate(sel):
        y = d[metric].to_numpy(float)
        err = np.vstack([y - d[f"{metric}_ci_low"].to_numpy(float), d[f"{metric}_ci_high"].to_numpy(float) - y])
        ax.bar(x + (i - (len(sel) - 1) / 2) * width, y, width, yerr=np.nan_to_num(err), capsize=1.5,
               color=cmap(i % 10), label=label, error_kw={"lw": 0.7})
    ax.set_xticks(x)
    ax.set_xticklabels([t.replace("_", " ") for t in tasks], rotation=45, ha="right", fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel(metric.replace("hits", "HITS@"))
    ax.legend(fontsize=7, ncol=2)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    save(fig, path)


def drop_bars(drops: pd.DataFrame, labels: dict[str, str], path, title: str = "") -> None:
    """One panel per measure: relative change (%) under each ablation variant, induction heads vs
    pooled matched random draws, 95% CI whiskers (:func:`inductionlab.studies.evaluate.tables.drops_by_measure`)."""
    measures = [m for m in labels if m in set(drops.get("measure", []))]
    if not measures:
        return
    arm = ranked_kind(k for k in drops.kind.unique() if not str(k).endswith("-random"))
    fig, axes = plt.subplots(1, len(measures), figsize=(4.2 * len(measures), 3.8), squeeze=False)
    for ax, m in zip(axes[0], measures):
        shown = (drops.kind == arm) | ((drops.kind == "random") & (drops.draw == "pooled"))
        d = drops[(drops.measure == m) & shown]
        variants = list(dict.fromkeys(d.variant))
        x = np.arange(len(variants))
        for i, (kind, color) in enumerate(((arm, "tab:red"), ("random", "tab:grey"))):
            r = d[d.kind == kind].set_index("variant").reindex(variants)
            y = 100 * r["relative"].to_numpy(float)
            err = 100 * np.vstack([r["relative"] - r["ci_low"], r["ci_high"] - r["relative"]]).astype(float)
            ax.bar(x + (i - 0.5) * 0.38, y, 0.38, yerr=np.nan_to_num(err), capsize=3, color=color,
                   label=f"{kind} heads ablated" + (" (pooled draws)" if kind == "random" else ""))
        ax.axhline(0, color="k", lw=0.6)
        ax.set_xticks(x)
        ax.set_xticklabels(variants, fontsize=8)
        ax.set_ylabel("relative change vs intact (%)")
        ax.set_title(labels[m], fontsize=9)
    axes[0][0].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save(fig, path)


def drops_by_ranking(drops: pd.DataFrame, measures: dict[str, str], path, title: str = "") -> None:
    """One panel per measure: the drop (intact − ablated, 95% CI whiskers) under each arm — every ranking's top k,
    the exclusive selections, the random draws pooled — grouped by head count k (``study routes``' drop table:
    columns arm, kind, k, measure, drop, drop_ci_low, drop_ci_high)."""
    measures = {m: t for m, t in measures.items() if m in set(drops.get("measure", []))}
    if not measures:
        return
    kinds = list(dict.fromkeys(drops.kind))
    kinds = [k for k in kinds if k != "random"] + (["random"] if "random" in kinds else [])
    colors = {k: ("tab:gray" if k == "random" else plt.cm.tab10(i % 10)) for i, k in enumerate(kinds)}
    import textwrap

    cols = min(4, len(measures))
    rows = -(-len(measures) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.2 * rows), squeeze=False, layout="constrained")
    for ax in axes.flat[len(measures):]:
        ax.set_visible(False)
    ks = sorted(drops.k.unique())
    w = 0.8 / max(1, len(kinds))
    for ax, (m, label) in zip(axes.flat, measures.items()):
        d = drops[drops.measure == m]
        for i, kind in enumerate(kinds):
            r = d[d.kind == kind].set_index("k").reindex(ks)
            y = r["drop"].to_numpy(float)
            err = np.vstack([y - r.drop_ci_low.to_numpy(float), r.drop_ci_high.to_numpy(float) - y])
            ax.bar(np.arange(len(ks)) + (i - (len(kinds) - 1) / 2) * w, y, w, yerr=np.nan_to_num(err), capsize=2,
                   color=colors[kind], label=kind + (" (pooled draws)" if kind == "random" else ""))
        ax.axhline(0, color="black", lw=0.5)
        ax.set_xticks(np.arange(len(ks)))
        ax.set_xticklabels([f"k={k}" for k in ks], fontsize=8)
        ax.set_ylabel("drop (intact − ablated)", fontsize=8)
        ax.set_title(textwrap.fill(label, 40), fontsize=8)
    axes[0][0].legend(fontsize=6)
    if title:
        fig.suptitle(title, fontsize=10)
    save(fig, path)


# -- training figures --------------------------------------------------------------------------
# Head telemetry over training (inductionlab telemetry) and the Bi-Induct schedule
# (inductionlab curriculum preview --plot). Tidy tables in, an atomic PNG out.

TRAINING_SCORES = ("induction", "anti_induction", "copy_offset", "copy_offset_control")


def training_heatmaps(heads: pd.DataFrame, path: str | Path, title: str,
                      scores=TRAINING_SCORES) -> None:
    """One panel per score: heads (layer-major, y) × checkpoints (x), colour = score.

    ``heads``: tidy rows (step, tokens, score, layer, head, value) of
    :func:`inductionlab.train.telemetry.read_telemetry`."""
    scores = [s for s in scores if s in set(heads["score"])]
    fig, axes = plt.subplots(1, len(scores), figsize=(4.2 * len(scores), 4.5), squeeze=False)
    for ax, name in zip(axes[0], scores):
        g = heads[heads["score"] == name]
        m = g.pivot_table(index=["layer", "head"], columns="step", values="value")
        im = ax.imshow(m.to_numpy(), aspect="auto", cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
        ax.set_xticks(range(m.shape[1]), [str(c) for c in m.columns], rotation=90, fontsize=6)
        n_heads = int(g["head"].max()) + 1
        ax.set_yticks(range(0, m.shape[0], n_heads), [f"L{l}" for l in range(0, m.shape[0] // n_heads)], fontsize=7)
        ax.set_xlabel("checkpoint (optimizer step)")
        ax.set_title(name)
    fig.colorbar(im, ax=axes[0].tolist(), label="attention probability on target")
    fig.suptitle(title)
    save(fig, path)


def training_curves(summaries: dict[str, pd.DataFrame], evals: dict[str, pd.DataFrame],
                    emergence_tokens: dict[str, int | None], path: str | Path, threshold: float) -> None:
    """Max, top-2% mean and heads-above-threshold over tokens for induction and anti-induction,
    held-out perplexity, copy_offset vs its control, and each run's emergence (dashed line).

    ``summaries``: per run, :func:`~inductionlab.train.telemetry.summarize` tables (with the
    column ``n_above_<threshold>``); ``evals``: per run, (step, tokens, heldout_ppl) rows;
    ``emergence_tokens``: per run, the training tokens at the emergence step (None: never)."""
    fig, axes = plt.subplots(2, 4, figsize=(17, 7.5))
    thr_col = f"n_above_{threshold:g}"
    for r, score in enumerate(("induction", "anti_induction")):
        for c, (col, label) in enumerate((("max", "max score"), ("top2pct_mean", "top-2% mean"),
                                          (thr_col, f"heads above {threshold:g}"))):
            ax = axes[r, c]
            for i, (name, s) in enumerate(summaries.items()):
                g = s[s["score"] == score].sort_values("tokens")
                ax.plot(g["tokens"].clip(lower=1), g[col], marker=".", label=name, color=f"C{i}")
                em = emergence_tokens.get(name) if score == "induction" else None
                if em is not None:
                    ax.axvline(max(1, em), color=f"C{i}", ls="--", lw=0.8)
            ax.set_xscale("log")
            ax.set_title(f"{score}: {label}")
            ax.set_xlabel("training tokens")
    ax = axes[0, 3]
    for i, (name, e) in enumerate(evals.items()):
        e = e.dropna(subset=["heldout_ppl"]).sort_values("tokens")
        ax.plot(e["tokens"].clip(lower=1), e["heldout_ppl"], marker=".", color=f"C{i}", label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_title("held-out perplexity")
    ax.set_xlabel("training tokens")
    ax = axes[1, 3]
    for i, (name, s) in enumerate(summaries.items()):
        for ls, score in (("-", "copy_offset"), (":", "copy_offset_control")):
            g = s[s["score"] == score].sort_values("tokens")
            ax.plot(g["tokens"].clip(lower=1), g["max"], ls=ls, color=f"C{i}", label=f"{name} {score}")
    ax.set_xscale("log")
    ax.set_title("copy_offset max (solid) vs control (dotted)")
    ax.set_xlabel("training tokens")
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    save(fig, path)


def curriculum_fraction(realised: np.ndarray, tokens_per_batch: int, schedule_tokens: np.ndarray,
                        schedule: np.ndarray, path: str | Path, title: str, m0: float) -> None:
    """Realised snippet-token fraction per batch (float [num_batches]) against the schedule
    m(t) sampled at ``schedule_tokens``; a moving mean over ~1/50 of the run."""
    n = len(realised)
    t0 = np.arange(n) * tokens_per_batch
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(t0 + tokens_per_batch / 2, realised, ".", ms=3, alpha=0.5, label="realised (per batch)")
    w = max(1, n // 50)
    if n >= w and w > 1:
        sm = np.convolve(realised, np.ones(w) / w, mode="valid")
        ax.plot(t0[w - 1:] + tokens_per_batch / 2 - (w - 1) * tokens_per_batch / 2,
                sm, "-", lw=1.5, label=f"realised ({w}-batch mean)")
    ax.plot(schedule_tokens, schedule, "k--", lw=1, label="m(t) schedule")
    ax.set_xlabel("training tokens t")
    ax.set_ylabel("synthetic fraction")
    ax.set_title(title)
    ax.set_ylim(-0.02, max(0.05, float(np.max(realised, initial=0)) * 1.15, m0 * 1.15))
    ax.legend(fontsize=8)
    fig.tight_layout()
    save(fig, path)


def variant_curves(summary: pd.DataFrame, path: str | Path, threshold: float, title: str = "") -> None:
    """Telemetry of a multi-run study on one figure: max and top-2% induction, max anti-induction,
    max copy-offset score vs training tokens, one colour per variant, mean over seeds (line) and
    the min–max band over seeds (shaded).

    ``summary``: tidy rows (variant, seed, tokens, score, max, top2pct_mean) — the
    :func:`~inductionlab.train.telemetry.summarize` tables of every run stacked."""
    panels = (("induction", "max", "max induction score"), ("induction", "top2pct_mean", "top-2% mean induction"),
              ("anti_induction", "max", "max anti-induction score"), ("copy_offset", "max", "max copy-offset score"))
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.2))
    variants = list(dict.fromkeys(summary["variant"]))
    for ax, (score, col, label) in zip(axes, panels):
        for i, v in enumerate(variants):
            g = summary[(summary["variant"] == v) & (summary["score"] == score)]
            agg = g.groupby("tokens")[col].agg(["mean", "min", "max", "count"]).reset_index()
            x = agg["tokens"].clip(lower=1)
            ax.plot(x, agg["mean"], marker=".", color=f"C{i}", label=f"{v} (n={int(agg['count'].max())})")
            ax.fill_between(x, agg["min"], agg["max"], color=f"C{i}", alpha=0.2, lw=0)
        if score == "induction" and col == "max":
            ax.axhline(threshold, color="grey", ls="--", lw=0.8)
        ax.set_xscale("log")
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(label)
        ax.set_xlabel("training tokens")
    axes[0].set_ylabel("attention probability on target")
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    save(fig, path)


def signed_heatmap(table: np.ndarray, path: str | Path, title: str = "", label: str = "AIE (probability)") -> None:
    """One heat map of a signed per-head score (layers × query heads; diverging colours centred on 0)."""
    t = np.asarray(table, dtype=float)
    lim = float(np.nanmax(np.abs(t))) or 1.0
    fig, ax = plt.subplots(figsize=(0.25 * t.shape[1] + 3, 0.16 * t.shape[0] + 2.2), layout="constrained")
    im = ax.imshow(t, aspect="auto", cmap="RdBu_r", vmin=-lim, vmax=lim, origin="upper")
    ax.set_xlabel("query head")
    ax.set_ylabel("layer")
    ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    fig.colorbar(im, ax=ax, shrink=0.8, label=label)
    if title:
        ax.set_title(title)
    save(fig, path)


def score_scatter(x: np.ndarray, y: np.ndarray, path: str | Path, xlabel: str, ylabel: str, title: str = "",
                  top: float = 0.05) -> None:
    """Per-head scatter of two scores; heads in both top ``top`` fractions in red, in one of them in orange."""
    x, y = np.asarray(x, float).reshape(-1), np.asarray(y, float).reshape(-1)
    n = max(1, int(top * x.size))
    tx, ty = set(np.argsort(-x, kind="stable")[:n]), set(np.argsort(-y, kind="stable")[:n])
    colour = ["tab:red" if i in tx and i in ty else "tab:orange" if i in tx or i in ty else "tab:gray"
              for i in range(x.size)]
    fig, ax = plt.subplots(figsize=(5, 4), layout="constrained")
    ax.scatter(x, y, c=colour, s=14, alpha=0.8)
    ax.axhline(0, color="black", lw=0.5)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title or f"{n} top heads per score: orange in one top set, red in both", fontsize=9)
    save(fig, path)


def route_scatter(token: np.ndarray, concept: np.ndarray, path: str | Path, title: str = "", label_top: int = 5,
                  xlabel: str = "token copying (ΔP(e₀))", ylabel: str = "concept copying (ΔP(e₁))") -> None:
    """Concept vs token induction score per head (Feucht et al. 2025, Fig. 2's layout): ``token``, ``concept``
    ``[n_layers, n_heads]``; points coloured by layer, the top ``label_top`` heads of each score labelled
    ``L<layer>H<head>``."""
    token, concept = np.asarray(token, float), np.asarray(concept, float)
    L, H = token.shape
    layer = np.repeat(np.arange(L), H)
    fig, ax = plt.subplots(figsize=(5.2, 4.2), layout="constrained")
    sc = ax.scatter(token.reshape(-1), concept.reshape(-1), c=layer, cmap="viridis", s=16, alpha=0.85)
    fig.colorbar(sc, ax=ax, label="layer")
    shown = set(np.argsort(-token.reshape(-1), kind="stable")[:label_top]) | \
        set(np.argsort(-concept.reshape(-1), kind="stable")[:label_top])
    for i in sorted(shown):
        ax.annotate(f"L{i // H}H{i % H}", (token.flat[i], concept.flat[i]), fontsize=7, xytext=(3, 3),
                    textcoords="offset points")
    ax.axhline(0, color="black", lw=0.5)
    ax.axvline(0, color="black", lw=0.5)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title or "concept vs token induction per head", fontsize=9)
    save(fig, path)


def drop_vs_fraction(drops: pd.DataFrame, measures: dict[str, str], path: str | Path, title: str = "") -> None:
    """One panel per measure: the drop (intact − ablated, with its 95% CI) against the fraction of heads ablated,
    one line per selection kind (random: the draws pooled)."""
    fig, axes = plt.subplots(1, len(measures), figsize=(4.2 * len(measures), 3.6), squeeze=False, layout="constrained")
    styles = {"induction": ("tab:blue", "-"), "induction-excl-fv": ("tab:blue", "--"), "fv": ("tab:red", "-"),
              "fv-excl-induction": ("tab:red", "--"), "random": ("tab:gray", ":")}
    for ax, (m, label) in zip(axes[0], measures.items()):
        d = drops[drops.measure == m]
        for kind, (c, ls) in styles.items():
            r = d[d.kind == kind].sort_values("fraction")
            if r.empty:
                continue
            f = 100 * r.fraction.to_numpy(float)
            ax.errorbar(f, r["drop"], yerr=[r["drop"] - r.drop_ci_low, r.drop_ci_high - r["drop"]], color=c, ls=ls,
                        marker="o", ms=3, capsize=2, label=kind)
        ax.axhline(0, color="black", lw=0.5)
        ax.set_xlabel("heads ablated (% of all)")
        ax.set_ylabel("drop (intact − ablated)")
        ax.set_title(label, fontsize=9)
    axes[0][0].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    save(fig, path)


def cmr_fits(fits: pd.DataFrame, path: str | Path, title: str = "", columns: int = 4) -> None:
    """Small multiples of heads' attention CRPs with their fitted CMR CRPs (Ji-An et al. 2024, Fig. 5).

    Args:
        fits: one row per (head, lag), in panel order: ``layer``, ``head``, ``lag``, ``attention`` (the profile)
            and ``cmr`` (the fitted CRP min-shifted and scaled to the profile's range, as the distance compares
            them), plus per head ``cmr_distance``, ``beta_enc``, ``beta_rec``, ``gamma_ft``."""
    heads = list(dict.fromkeys(zip(fits["layer"], fits["head"])))
    n = len(heads)
    cols = max(1, min(columns, n))
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols, 2.1 * rows), squeeze=False, layout="constrained",
                             sharex=True)
    for ax, (l, h) in zip(axes.flat, heads):
        g = fits[(fits["layer"] == l) & (fits["head"] == h)]
        ax.plot(g.lag, g.attention, "o-", color="k", ms=3, lw=1, label="head")
        ax.plot(g.lag, g.cmr, "x--", color="tab:red", ms=3, lw=1, label="CMR fit")
        ax.axvline(0, color="grey", lw=0.5, ls=":")
        r = g.iloc[0]
        ax.set_title(f"L{l}H{h}  d={r.cmr_distance:.2f}\nβenc={r.beta_enc:.2f} βrec={r.beta_rec:.2f} "
                     f"γft={r.gamma_ft:.1f}", fontsize=7)
        ax.tick_params(labelsize=6)
    for ax in axes.flat[n:]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("lag", fontsize=7)
    axes.flat[0].legend(fontsize=6)
    if title:
        fig.suptitle(title)
    save(fig, path)


def head_type_plot(tidy: pd.DataFrame, score: str, threshold: float, direction: str, path: str | Path,
                   title: str) -> None:
    """One head type over training: left, heads past ``threshold`` per layer over checkpoints (``direction``
    ``">="`` or ``"<"``); right, the score as a heat map, heads (layer-major, y) × checkpoints (x).

    ``tidy``: rows (step, layer, head, score, value) of a run's checkpoints
    (:func:`inductionlab.studies.telemetry.study.sweep_rows`)."""
    g = tidy[tidy["score"] == score].copy()
    g["past"] = (g["value"] < threshold) if direction == "<" else (g["value"] >= threshold)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    n = g.groupby(["step", "layer"])["past"].sum().unstack("layer")
    for layer in n.columns:
        a.plot(n.index, n[layer], marker=".", label=f"L{layer}")
    a.set_xlabel("checkpoint (optimizer step)")
    a.set_ylabel(f"heads with {score} {direction} {threshold:g}")
    a.legend(fontsize=7)
    m = g.pivot_table(index=["layer", "head"], columns="step", values="value", dropna=False)
    im = b.imshow(m.to_numpy(float), aspect="auto", cmap="viridis" if direction != "<" else "viridis_r",
                  interpolation="nearest")
    b.set_xticks(range(m.shape[1]), [str(c) for c in m.columns], rotation=90, fontsize=6)
    n_heads = int(g["head"].max()) + 1
    b.set_yticks(range(0, m.shape[0], n_heads), [f"L{l}" for l in range(0, m.shape[0] // n_heads)], fontsize=7)
    b.set_xlabel("checkpoint (optimizer step)")
    fig.colorbar(im, ax=b, label=score)
    fig.suptitle(title)
    save(fig, path)


def head_type_comparison(curves: dict[str, tuple[str, pd.DataFrame, pd.DataFrame]], path: str | Path,
                         title: str = "") -> None:
    """Head types of several training runs over checkpoints, a line per run coloured by its group: the effective
    number of induction heads, the top head's share of the positive induction total, and the CMR-like share of
    all heads.

    ``curves``: ``{run: (group, concentration rows, cmr-share rows)}`` of
    :func:`inductionlab.protocols.training_head_types.concentration` (top 1) and ``cmr_share``."""
    groups = list(dict.fromkeys(g for g, _, _ in curves.values()))
    colour = {g: f"C{i}" for i, g in enumerate(groups)}
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    seen = set()
    for run, (group, conc, share) in curves.items():
        kw = dict(color=colour[group], marker=".", label=group if group not in seen else None)
        seen.add(group)
        axes[0].plot(conc["step"], conc["effective_heads"], **kw)
        axes[1].plot(conc["step"], conc["top_k_share"], **kw)
        s = share.groupby("step")[["n_cmr_like", "n_heads"]].sum()
        axes[2].plot(s.index, s["n_cmr_like"] / s["n_heads"], **kw)
    for a, label in zip(axes, ("effective induction heads exp(H)", "top head's share of induction",
                               "CMR-like share of heads")):
        a.set_xscale("symlog", linthresh=1)
        a.set_xlabel("checkpoint (optimizer step)")
        a.set_ylabel(label)
    axes[0].legend(fontsize=7)
    fig.suptitle(title or "Head types over training, by run")
    save(fig, path)
