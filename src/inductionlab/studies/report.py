"""The pieces every study's report is built from: the model line, CI formatting, and the lag
probe's corrected-readout and cue sections (with their tables and figures) that ``analyze`` and
``study temporal`` both write.

Each study writes its own report in ``studies/<name>/report.py`` from these; a piece moves here
only when a second study needs it. Numbers are computed elsewhere; every file is written
atomically; figures are drawn by :mod:`inductionlab.studies.plots`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..measures import serial_position
from ..measures.stats import ranked_kind
from ..runtime.runs import atomic_write_text
from . import plots


#: A report's pointer to the interactive page (written by ``inductionlab view``, not by the run).
VIEW_LINE = ("Interactive view (attention patterns with token hover, click a head on the score maps, the lag curves): "
             "[`view.html`](view.html), written by `inductionlab view RUN_DIR` (docs/view.md).")


def ranked_arm(conditions) -> str:
    """The ranked conditions' kind of a run (``induction`` by default; a ranking's label such as
    ``previous_token`` or ``induction-excl-fv`` under ``--rank-by`` / ``--exclude-by``): the one kind that
    is not intact, random or single (:func:`~inductionlab.measures.stats.ranked_kind`). Reports, tables,
    figures and verdicts find the ranked arm through it, never by the literal ``induction``."""
    return ranked_kind(conditions)


def selection_line(conditions) -> str:
    """One report line saying which heads the ranked conditions ablate, for a ranking other than
    induction (the random arm's pool is named too)."""
    arm = ranked_arm(conditions)
    rank_by, _, other = arm.partition("-excl-")
    rnd = [c.name for c in conditions if c.kind == "random"]
    pool = "all heads" if rnd and rnd[0].startswith("random-all-") else f"heads outside the top N by {rank_by}"
    return (f"Ranked heads: the top k by the {rank_by} score"
            + (f", after removing the top heads by {other}" if other else "")
            + f" (conditions `{arm}-<k>`); random heads: k of {pool}.")


def model_line(identity: dict) -> str:
    """``Model: `spec` (architecture, L layers × H query heads, K KV heads, head_dim D, dtype X).``"""
    i = {"spec": identity.get("name", "?"), **identity}
    g = lambda k: i.get(k, "?")  # noqa: E731  (a hand-built LoadedModel may lack some fields)
    return (f"Model: `{g('spec')}` ({g('architecture')}, {g('n_layers')} layers × {g('n_heads')} query heads, "
            f"{g('n_kv_heads')} KV heads, head_dim {g('head_dim')}, dtype {g('dtype')}).")


def fmt_ci(m, lo, hi, d: int = 3) -> str:
    """``m [lo, hi]`` with ``d`` significant digits."""
    return f"{m:.{d}g} [{lo:.{d}g}, {hi:.{d}g}]"


def fmt_ci4(m, lo, hi) -> str:
    """``m [lo, hi]`` with 4 decimals (probabilities of order 1e-3 and above)."""
    return f"{m:.4f} [{lo:.4f}, {hi:.4f}]"


def pooled_headline_rows(headline):
    """Rows of a lag-probe headline table to show: per-draw random rows left out (their pooled
    ``mean`` row stands for them; per-draw rows stay in the CSV)."""
    for _, r in headline.iterrows():
        if r["kind"] == "random" and "mean" not in str(r["draw"]):
            continue
        yield r


def fmt_signed3(m, lo, hi) -> str:
    """``+m [+lo, +hi]`` with 3 decimals and signs (log-ratios, differences)."""
    return f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def row_ci(row, name: str, fmt=fmt_ci) -> str:
    """Format the ``name / name_ci_low / name_ci_high`` columns of a row (dict or namedtuple)."""
    get = row.get if isinstance(row, dict) else lambda k: getattr(row, k)
    return fmt(get(name), get(f"{name}_ci_low"), get(f"{name}_ci_high"))


ENRICH_LABEL = "log p(word at lag) − log baseline(word), nats"


def corrected_lines(lag) -> list[str]:
    """Report lines of the word-prior-corrected lag +1 (log-enrichment), per condition and as the
    paired random − induction contrast; none when the result has no word ids."""
    if not lag.has_corrected:
        return []
    far = lag.config.far_lag
    hl = lag.headline()
    lines = ["", f"Word-prior-corrected lag +1: log-enrichment = log p(word at lag +1) − log baseline(word), "
             f"baseline = the word's mean probability over the trials where it sits at |lag| > {far} "
             "(same condition); 0 = no more likely than its prior; nats, 95% CIs over trials.", "",
             "| condition | raw lag +1 | log-enrichment lag +1 | log-enrichment lag −1 |", "|---|---|---|---|"]
    for r in pooled_headline_rows(hl):
        lines.append(f"| {r['condition']} | {row_ci(r, 'lag_plus1', fmt_ci4)} | "
                     f"{row_ci(r, 'lag_plus1_log_enrichment', fmt_signed3)} | "
                     f"{row_ci(r, 'lag_minus1_log_enrichment', fmt_signed3)} |")
    con = lag.contrasts(1, corrected=True)
    arm = ranked_kind(lag.conditions)
    if len(con):
        lines += ["", f"| k | random − {arm}, log-enrichment lag +1 [95% CI] |", "|---|---|"]
        for _, r in con.iterrows():
            lines.append(f"| {int(r['k'])} | {r[f'random_minus_{arm}']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}] |")
    return lines


CUE_FILES = ("lag_cues_curve.csv", "lag_cues_curve.png", "lag_cues_curve_corrected.png", "serial_position.csv",
             "serial_position.png", "lag_crp_bands.csv", "lag_crp_bands.png", "temporal_factor.csv", "cue_contrasts.csv")


def cue_lines(lag, figs: str = "") -> list[str]:
    """Report lines of the all-cue lag probe (:mod:`inductionlab.measures.serial_position`): pooled lag +1,
    its word-prior correction, the temporal factor, p(+1) in the first / middle / last cue band,
    and the random − induction contrasts; none when the result carries no per-cue arrays.
    ``figs``: the folder of the figures, relative to report.md (``"plots/"`` or ``""``)."""
    if not serial_position.has_cues(lag):
        return []
    t = serial_position.cue_tables(lag)
    j = serial_position.cue_json(lag)
    cp = j["cue_positions"]
    curve = t["lag_cues_curve"]
    at1 = curve[curve.lag == 1].set_index(["measure", "condition"])
    tf = t["temporal_factor"].set_index("condition")
    bs = serial_position.band_summary(lag).set_index("condition")
    first = bs.iloc[0]
    head = (f"p(+1), first band (cues {first['first_band']})", f"middle band ({first['middle_band']})",
            f"last band ({first['last_band']})")
    lines = ["", "## All-cue lag probe: serial position and temporal factor", "",
             f"Cues at list positions {cp['first']}–{cp['last']} (`--cues {lag.config.cues}`: {cp['n_cues']} cues × "
             f"{j['n_lists']} lists per condition; the seed-cue tables use the cue at "
             f"{lag.config.cue_position} only). Each measure is reduced per list first (mean over its cues), then "
             "mean [95% CI] over lists — the cues of one list are not independent. Temporal factor: percentile rank "
             "of the lag +1 word's probability among the list words other than the cue (1 = most likely, "
             "0.5 = chance).", "",
             "| condition | pooled p(+1) | log-enrichment +1 | temporal factor | " + " | ".join(head) + " |",
             "|---|---|---|---|---|---|---|"]
    for name, r in tf.iterrows():
        if r["kind"] == "random" and "mean" not in str(r["draw"]):
            continue
        p1 = at1.loc[("prob", name)]
        e = at1.loc[("log_enrichment", name)] if ("log_enrichment", name) in at1.index else None
        e1 = "—" if e is None else fmt_signed3(e["mean"], e.ci_low, e.ci_high)
        cells = [fmt_ci4(p1["mean"], p1.ci_low, p1.ci_high), e1, row_ci(r, "temporal_factor", fmt_ci4)]
        b = bs.loc[name]
        cells += [fmt_ci4(b[x], b[f"{x}_ci_low"], b[f"{x}_ci_high"]) if isinstance(b.get(x), float) else "—"
                  for x in ("first", "middle", "last")]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    con = t["cue_contrasts"]
    arm = ranked_kind(lag.conditions)
    if len(con):
        lines += ["", f"Random − {arm}, paired per list (random = mean of draws):", "",
                  f"| k | measure | {arm} | random | random − {arm} [95% CI] | z |", "|---|---|---|---|---|---|"]
        for _, r in con.iterrows():
            fmt = fmt_signed3 if r["measure"] != "prob" else lambda m, lo, hi: f"{m:+.3g} [{lo:+.3g}, {hi:+.3g}]"
            lines.append(f"| {int(r['k'])} | {r['measure']}{' +1' if r['measure'] != 'temporal_factor' else ''} | "
                         f"{r[arm]:.4g} | {r['random']:.4g} | "
                         f"{fmt(r[f'random_minus_{arm}'], r['ci_low'], r['ci_high'])} | "
                         f"{'—' if pd.isna(r['z']) else format(r['z'], '.1f')} |")
    lines += ["", f"![serial position]({figs}serial_position.png)", "",
              f"![lag-CRP by cue band]({figs}lag_crp_bands.png)", ""]
    return lines


def write_cue_outputs(tables: Path, figs: Path, lag, name: str, shown: list[str], heat: list[str], sub: str = "") -> None:
    """The all-cue tables (``<stem>.csv`` in ``tables``) and figures (in ``figs``) of a lag-probe
    result that carries per-cue arrays (:func:`inductionlab.measures.serial_position.has_cues`; otherwise
    nothing is written). ``shown``: conditions of the curve figures; ``heat``: of the heat map."""
    if not serial_position.has_cues(lag):
        return
    t = serial_position.cue_tables(lag)
    for stem, df in t.items():
        atomic_write_text(tables / f"{stem}.csv", df.to_csv(index=False))
    cp = np.asarray(lag.cue_positions)
    what = f"cues {cp.min()}–{cp.max()}, {len(cp)} per list, 95% CI over lists" + (f"; {sub}" if sub else "")
    curve = t["lag_cues_curve"]
    plots.lag_curves(curve[curve.measure == "prob"], figs / "lag_cues_curve.png", conditions=shown,
                     title=f"{name}: all-cue lag probe, pooled over cues\n{what}")
    if (curve.measure == "log_enrichment").any():
        plots.lag_curves(curve[curve.measure == "log_enrichment"], figs / "lag_cues_curve_corrected.png",
                         conditions=shown, ylabel=ENRICH_LABEL, zero_line=True,
                         title=f"{name}: all-cue lag probe, word-prior corrected\n{what}")
    plots.serial_position_curve(t["serial_position"], figs / "serial_position.png", conditions=shown,
                                title=f"{name}: serial-position curve of the lag probe\n{what}")
    plots.lag_crp_heatmap(t["lag_crp_bands"], figs / "lag_crp_bands.png", heat,
                          title=f"{name}: lag-CRP by cue-position band\n{what}")


def verdict_lines(verdicts, rules: str) -> list[str]:
    """The "## Verdicts" section of a study with pre-registered claims: one table row per
    :class:`~inductionlab.studies.run.Verdict` (claim, status, evidence; caveat and power line appended); ``rules``: the module
    that fixes them (``"studies/routes/verdicts.py"``)."""
    lines = ["## Verdicts", "", f"Rules fixed in code before the first run (`{rules}`).", "",
             "| claim | status | evidence |", "|---|---|---|"]
    return lines + [f"| **{v.claim}** {v.text} | {v.status} | {v.evidence}{'; ' + v.caveat if v.caveat else ''}"
                    f"{'; power: ' + v.power_line if v.power else ''} |" for v in verdicts]
