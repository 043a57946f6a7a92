"""What a run directory holds besides checkpoints: tables, figures and the Markdown report,
built from shared pieces (the model line, CI formatting).

Each writer takes a finished result (its numbers are computed elsewhere) and writes every file
atomically; figures are drawn by :mod:`inductionlab.studies.plots`.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd

from . import plots

from ..measures import serial_position
from ..measures.crp import lag_probe_crp
from ..runtime.runs import atomic_write_bytes, atomic_write_text


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
    far = getattr(lag.config, "far_lag", 20)
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
    if len(con):
        lines += ["", "| k | random − induction, log-enrichment lag +1 [95% CI] |", "|---|---|"]
        for _, r in con.iterrows():
            lines.append(f"| {int(r['k'])} | {r['random_minus_induction']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}] |")
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
             f"{j['n_lists']} lists per condition; the seed numbers above use the cue at "
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
    if len(con):
        lines += ["", "Random − induction, paired per list (random = mean of draws):", "",
                  "| k | measure | induction | random | random − induction [95% CI] | z |", "|---|---|---|---|---|---|"]
        for _, r in con.iterrows():
            fmt = fmt_signed3 if r["measure"] != "prob" else lambda m, lo, hi: f"{m:+.3g} [{lo:+.3g}, {hi:+.3g}]"
            lines.append(f"| {int(r['k'])} | {r['measure']}{' +1' if r['measure'] != 'temporal_factor' else ''} | "
                         f"{r['induction']:.4g} | {r['random']:.4g} | "
                         f"{fmt(r['random_minus_induction'], r['ci_low'], r['ci_high'])} | "
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


def analyze_report(res) -> str:
    """A short Markdown report of the main job (:func:`inductionlab.studies.analyze.study.analyze`)."""
    idn, cfg = res.record["model"], res.record["params"]
    hl = res.lag.headline()
    intact = hl[hl["condition"] == "intact"].iloc[0]
    summary = res.lag.summary()
    cur = summary[(summary["condition"] == "intact") & (summary["lag"] != 0)]
    peak = int(cur.loc[cur["mean"].idxmax(), "lag"])
    near = cur[cur["lag"].abs() <= 10]
    peak_near = int(near.loc[near["mean"].idxmax(), "lag"])
    chance = intact["list_mass"] / cfg["lag"]["list_length"]
    lines = [f"# inductionlab analyze — {idn['name']}", "",
             model_line(idn), "",
             "## Top induction heads", "", "| rank | layer | head | induction score |", "|---|---|---|---|"]
    for i, h in enumerate(res.record["top_induction_heads"], 1):
        lines.append(f"| {i} | {h['layer']} | {h['head']} | {h['score']:.3f} |")
    il = res.scores.induction_loss
    lines += ["", f"Induction loss: first copy {il['first_copy']:.2f} nats, second copy {il['second_copy']:.2f} nats.",
              "", "## Lag probe", "",
              f"{cfg['lag']['n_permutations']} trials per condition, list of {cfg['lag']['list_length']} words, cue at "
              f"position {cfg['lag']['cue_position']}, {cfg['lag']['method']} ablation. "
              "Probabilities are raw next-token probabilities; 95% CIs over trials.", "",
              "| condition | lag +1 | lag -1 | lag 0 | list mass |", "|---|---|---|---|---|"]
    for r in pooled_headline_rows(hl):
        lines.append(f"| {r['condition']} | {row_ci(r, 'lag_plus1', fmt_ci4)} | "
                     f"{row_ci(r, 'lag_minus1', fmt_ci4)} | "
                     f"{r['lag0']:.4f} | {r['list_mass']:.3f} |")
    above = intact["lag_plus1_ci_low"] > chance
    if peak_near == 1 and above:
        verdict = "Intact model shows a lag +1 peak"
    elif peak_near == 1:
        verdict = ("Intact model: lag +1 is the highest lag within ±10, but its CI includes the even-spread "
                   "value, so this is **no** clear lag +1 peak")
    else:
        verdict = f"Intact model shows **no** lag +1 peak: the highest lag within ±10 is {peak_near:+d}"
    lines += ["", f"{verdict}. Lag +1 = {intact['lag_plus1']:.4f} [{intact['lag_plus1_ci_low']:.4f}, "
              f"{intact['lag_plus1_ci_high']:.4f}] vs {chance:.4f} if the list mass were spread evenly over the list; "
              f"the highest lag over all lags is {peak:+d} (one word per lag and trial, so single lags are noisy).", "",
              "Induction vs random ablation at lag +1 (paired over the same trials; random = mean of draws):", "",
              "| k | induction-k | random-k | random − induction [95% CI] |", "|---|---|---|---|"]
    for _, r in res.lag.contrasts(1).iterrows():
        lines.append(f"| {int(r['k'])} | {r['induction']:.4f} | {r['random']:.4f} | "
                     f"{r['random_minus_induction']:+.4f} [{r['ci_low']:+.4f}, {r['ci_high']:+.4f}] |")
    lines += corrected_lines(res.lag)
    lines += ["",
              "Random rows pool the draws (per-trial mean over draws); per-draw rows are in `lag_headline.csv`."]
    lines += cue_lines(res.lag)
    lines += ["", "## Timings", ""]
    lines += [f"- {k.removesuffix('_s')}: {v:.1f} s" for k, v in res.timings.items()]
    lines += ["", "Files: `results.json` (everything, incl. parameters and versions), `head_scores.csv`, "
              "`lag_curves.csv`, `lag_headline.csv`, `lag_trials.npz`, `head_scores.png`, `lag_curve.png`, "
              "`lag_curve_renorm.png`" + (", `lag_curves_corrected.csv`, `lag_curve_corrected.png`"
                                          if res.lag.has_corrected else "")
              + ("".join(f", `{f}`" for f in CUE_FILES) if serial_position.has_cues(res.lag) else "") + ".", ""]
    return "\n".join(lines)


def temporal_report(study, measures: dict[str, str]) -> str:
    """The Markdown report of :func:`inductionlab.studies.temporal.study.run_temporal_study`: verdicts with
    numbers and CIs, headline table, figures. ``measures``: measure -> label."""
    lag, recall, lb_table, conc, head, verd, record, ks = (study.lag, study.recall, study.load_bearing,
                                                           study.concentration, study.headline,
                                                           study.record["verdicts"], study.record, study.ks)
    ident = study.loaded.identity
    p = record["params"]
    lines = [f"# Temporal-dependencies study: {ident['name']}", "", model_line(ident) + " "
             f"Ablation: **{lag.config.method}**; k ∈ {ks}; random heads drawn outside the top "
             f"{p['exclude_top_n']} by induction score, {p['config']['n_draws']} seeded draws per k. "
             f"Lag probe: {lag.config.n_permutations} permutations of {lag.config.list_length} words, cue at "
             f"{lag.config.cue_position} (seed protocol: 5,000). Serial recall: {recall.config.n_trials} prompts, "
             f"{recall.config.n_shots} shots, lists of {recall.config.list_length}. 95% CIs over trials "
             "(normal approximation); differences are paired.", "",
             "## Claims", "", "| claim | verdict | evidence |", "| --- | --- | --- |"]
    for v in verd:
        lines.append(f"| ({v['claim']}) {v['text']} | **{v['verdict']}** | {v['evidence']} |")
    lines += ["", "Decision rules: " + "; ".join(f"({v['claim']}) {v['rule']}" for v in verd) + ".", ""]
    if verd[0]["verdict"] != "reproduced":
        lines += ["Claim (A) is not reproduced: p(lag +1) is not a peak of the intact lag curve on this model, so (B) and "
                  "(C) compare ablations on a probability the model does not single out.", ""]
    tc = recall.transition_curve()
    tc = tc[(tc.condition == "intact") & (tc.lag != 0)].sort_values("mean", ascending=False)
    if len(tc):
        top = tc.iloc[0]
        lines += [f"For comparison, the intact serial-recall transition curve (renormalised over the "
                  f"{recall.config.list_length} list items) peaks at lag {int(top.lag):+d}: "
                  f"{fmt_ci(top['mean'], top.ci_low, top.ci_high)}.", ""]
    intact = lag.headline().set_index("condition").loc["intact"]
    lines += [f"Intact list mass (probability on the {lag.config.list_length} list words): "
              f"{row_ci(intact, 'list_mass')}; p(lag 0, repeating the cue): "
              f"{fmt_ci(intact.lag0, intact.lag0_ci_low, intact.lag0_ci_high, 4)}. A small list mass means the model does not "
              "treat the list as something to recall; the lag curve is then reported as it is, not tuned.", ""]
    lines += ["## Headline", "", "| measure | k | intact | induction-k ablated | random-k ablated (pooled draws) "
              "| random − induction (paired) |", "| --- | --- | --- | --- | --- | --- |"]
    for r in head.itertuples():
        lines.append(f"| {measures[r.measure]} | {r.k} | {row_ci(r, 'intact')} | "
                     f"{row_ci(r, 'induction')} | "
                     f"{row_ci(r, 'random')} | "
                     f"{row_ci(r, 'random_minus_induction')} |")
    lines += ["", "![ablation vs k](plots/ablation_vs_k.png)", ""]
    lines += [f"![lag curves k={k}](plots/lag_curves_k{k}.png)" for k in ks]
    if lag.has_corrected:
        lines += ["", "## Word-prior-corrected lag curve"] + corrected_lines(lag) + [""]
        lines += [f"![corrected lag curves k={k}](plots/lag_curves_corrected_k{k}.png)" for k in ks]
    lines += cue_lines(lag, "plots/")
    lines += ["", "## Serial recall", "",
              "Teacher-forced accuracy per position, the renormalised transition lag curve and the psifr-style CRP of the "
              "greedy recalls are in `tables/recall_positions.csv`, `tables/recall_transition_curve.csv` and "
              "`tables/recall_crp.csv`.", "", "![serial recall transitions](plots/recall_transition_curve.png)", ""]
    crp = record["lag_crp_argmax"]
    if "intact" in crp:
        c = crp["intact"]
        lines += ["## psifr-style lag-CRP of the arg-max response", "",
                  f"Intact: {c['n_transitions']} of {lag.config.n_permutations} arg-max responses were list words other "
                  f"than the cue (transitions); CRP(+1) = {c['crp'].get(1)}, CRP(−1) = {c['crp'].get(-1)}. "
                  "Full tables: `tables/lag_crp_argmax.csv`.", "", "![lag-CRP](plots/lag_crp_argmax.png)", ""]
    if lb_table is not None:
        lines += ["## Per-head load-bearing map", "",
                  f"Each of the top {len(lb_table)} heads by induction score ablated alone ({lag.config.method}): lag probe "
                  f"on {record['load_bearing']['n_trials']} trials and serial recall on {recall.config.n_trials} prompts; "
                  "Δ = ablated − intact, paired 95% CI.", "",
                  "| rank | head | induction score | Δ lag probe p(+1) | Δ serial recall p(+1) | Δ serial recall accuracy |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for r in lb_table.to_dict(orient="records"):
            cells = [row_ci(r, f'{m}_delta')
                     for m in ("lag_plus1", "recall_lag_plus1", "recall_accuracy")]
            lines.append(f"| {r['rank']} | L{r['layer']}H{r['head']} | {r['induction_score']:.3f} | " + " | ".join(cells) + " |")
        lines.append("")
        for m, c in conc.items():
            if m == "recall_accuracy":
                continue
            lines.append(f"Concentration of {measures[m]}: total single-head drop {c['total_drop']:.3g}; the largest "
                         + " / ".join(str(n) for n in c["by_effect"]) + " heads carry "
                         + " / ".join(f"{v:.0%}" for v in c["by_effect"].values()) + " of it (the top "
                         + " / ".join(str(n) for n in c["by_induction_rank"]) + " by induction score: "
                         + " / ".join(f"{v:.0%}" for v in c["by_induction_rank"].values()) + ").")
        lines += ["", "![load-bearing](plots/load_bearing.png)", "", "![concentration](plots/concentration.png)", ""]
    lines += ["## Head scores", "", "![head scores](plots/head_scores.png)", "",
              "All numbers: `results.json`; tables: `tables/`.", ""]
    return "\n".join(lines)


def write_analyze_outputs(d: Path, res) -> None:
    """The tables, figures and per-trial arrays of :func:`inductionlab.studies.analyze.study.analyze` (each file
    written atomically; report.md and results.json are written last, by the job)."""
    hs = res.scores
    L, H = hs["induction"].shape
    heads = pd.DataFrame([{"layer": l, "head": h, **{n: float(v[l, h]) for n, v in hs.scores.items()}}
                          for l in range(L) for h in range(H)])
    summary, headline = res.lag.summary(), res.lag.headline()
    for df, name in ((heads, "head_scores.csv"), (summary, "lag_curves.csv"), (headline, "lag_headline.csv")):
        atomic_write_text(d / name, df.to_csv(index=False))
    buf = io.BytesIO()
    lag = res.lag
    cue = {f"{m}/{k}": v for m in ("cue_probs", "cue_list_mass", "cue_argmax_lag") for k, v in getattr(lag, m).items()}
    if lag.cue_positions is not None:
        cue["cue_positions"] = lag.cue_positions
    np.savez_compressed(buf, **{f"probs/{k}": v for k, v in res.lag.probs.items()}, **cue)
    atomic_write_bytes(d / "lag_trials.npz", buf.getvalue())
    name = res.loaded.identity["name"]
    plots.head_heatmaps(hs.scores, d / "head_scores.png", title=name)
    shown = ["intact"] + [c for c in summary["condition"].unique()
                          if c.startswith("induction-") or (c.startswith("random-") and "-d" not in c)]
    lc = res.lag.config
    sub = f"{lc.n_permutations} trials/condition, {lc.method} ablation, random = mean of draws"
    intact = headline[headline["condition"] == "intact"].iloc[0]
    plots.lag_curves(summary, d / "lag_curve.png", conditions=shown, title=f"{name}: lag probe\n{sub}",
                     chance=float(intact["list_mass"]) / lc.list_length)
    plots.lag_curves(summary, d / "lag_curve_renorm.png", conditions=shown, column="mean_renorm",
                     title=f"{name}: lag probe, renormalised over the list\n{sub}", chance=1 / lc.list_length)
    if res.lag.has_corrected:
        corrected = res.lag.corrected_summary()
        atomic_write_text(d / "lag_curves_corrected.csv", corrected.to_csv(index=False))
        plots.lag_curves(corrected, d / "lag_curve_corrected.png", conditions=shown, ylabel=ENRICH_LABEL, zero_line=True,
                         title=f"{name}: lag probe, word-prior corrected\n{sub}")
    kmax = max((c.k for c in res.lag.conditions if c.kind == "induction"), default=None)
    write_cue_outputs(d, d, res.lag, name, shown, ["intact", f"induction-{kmax}", f"random-{kmax}"], sub)


def write_temporal_outputs(out: Path, study, measures: dict[str, str]) -> None:
    """The run directory of :func:`inductionlab.studies.temporal.study.run_temporal_study`: tables/, plots/
    and report.md (each file written atomically; results.json after them, by
    :meth:`~inductionlab.studies.run.StudyRun.finish`). ``measures``: measure -> label."""
    name, ks, method = study.loaded.identity["name"], study.ks, study.lag.config.method
    lag, recall, lb_table, conc, head, hs = (study.lag, study.recall, study.load_bearing, study.concentration,
                                             study.headline, study.scores)
    tables, figs = out / "tables", out / "plots"
    L, H = hs["induction"].shape

    def csv(df, fname):
        atomic_write_text(tables / fname, df.to_csv(index=False))

    csv(pd.DataFrame([{"layer": l, "head": h, **{n: float(v[l, h]) for n, v in hs.scores.items()}}
                      for l in range(L) for h in range(H)]), "head_scores.csv")
    summary = lag.summary()
    csv(summary, "lag_curves.csv")
    if lag.has_corrected:
        corrected = lag.corrected_summary()
        csv(corrected, "lag_curves_corrected.csv")
    csv(lag.headline(), "lag_headline.csv")
    crp = lag_probe_crp(lag)
    csv(crp, "lag_crp_argmax.csv")
    csv(recall.headline(), "recall_headline.csv")
    csv(recall.positions(), "recall_positions.csv")
    trans = recall.transition_curve()
    csv(trans, "recall_transition_curve.csv")
    csv(recall.crp(), "recall_crp.csv")
    csv(head, "headline.csv")
    csv(pd.DataFrame([{k: v for k, v in d.items() if k != "per_k"} for d in study.record["verdicts"]]), "verdicts.csv")
    if lb_table is not None:
        csv(lb_table, "load_bearing.csv")

    plots.head_heatmaps(hs.scores, figs / "head_scores.png", title=name)
    for k in ks:
        plots.lag_curves(summary, figs / f"lag_curves_k{k}.png", conditions=["intact", f"induction-{k}", f"random-{k}"],
                         title=f"{name}: lag probe, k = {k} heads ablated ({method})")
        if lag.has_corrected:
            plots.lag_curves(corrected, figs / f"lag_curves_corrected_k{k}.png",
                             conditions=["intact", f"induction-{k}", f"random-{k}"], ylabel=ENRICH_LABEL, zero_line=True,
                             title=f"{name}: lag probe, word-prior corrected, k = {k} ({method})")
    kmax = ks[-1]
    plots.ablation_vs_k(head, {m: measures[m] for m in ("lag_plus1", "recall_accuracy", "recall_lag_plus1")},
                        figs / "ablation_vs_k.png", title=f"{name}: induction vs random ablation ({method})")
    plots.tidy_curves(trans, figs / "recall_transition_curve.png", ["intact", f"induction-{kmax}", f"random-{kmax}"],
                      "lag (item position − previous item's position)", "p(next = item at lag), renormalised over list",
                      f"{name}: serial recall transitions")
    shown = ["intact", f"induction-{kmax}"] + [c.name for c in lag.conditions if c.kind == "random" and c.k == kmax][:1]
    plots.tidy_curves(crp[crp.lag.abs() <= 10], figs / "lag_crp_argmax.png", shown, "lag", "CRP (arg-max response)",
                      f"{name}: psifr-style lag-CRP of the arg-max response", value="prob")
    write_cue_outputs(tables, figs, lag, name, ["intact", f"induction-{kmax}", f"random-{kmax}"],
                      ["intact", f"induction-{kmax}", f"random-{kmax}"], f"{method} ablation")
    if lb_table is not None:
        plots.load_bearing_scatter(lb_table, {m: measures[m] for m in conc}, figs / "load_bearing.png",
                                   title=f"{name}: per-head effect of ablating one induction head ({method})")
        plots.concentration_curve({measures[m]: conc[m] for m in ("lag_plus1", "recall_lag_plus1")},
                                  figs / "concentration.png", title=f"{name}: concentration of the lag +1 effect")
    atomic_write_text(out / "report.md", temporal_report(study, measures))   # results.json: StudyRun.finish


# -- evaluate ---------------------------------------------------------------------------------
EVAL_MEASURES = {"icl_benefit": "ICL benefit, loss(early) − loss(late)",
                 "induction_benefit": "induction benefit, loss(copy 1) − loss(copy 2)"}


def _eval_labels(shots: int) -> dict[str, str]:
    return {f"hits1_{shots}shot": f"probe HITS@1 at {shots} shots", **EVAL_MEASURES}


def _pct_ci(r) -> str:
    return f"{r['headline']} [{100 * r['ci_low']:+.1f}%, {100 * r['ci_high']:+.1f}%]"


def evaluate_report(res) -> str:
    """The Markdown report of :func:`inductionlab.studies.evaluate.study.run_evaluate`."""
    cfg, rec, ident = res.config, res.record, res.loaded.identity
    lb = cfg.load_bearing
    hits = res.hits
    shots = list(cfg.probes.shots)
    lines = [f"# Evaluation: {ident.get('name', '?')}", "", model_line(ident), ""]
    if "checkpoint" in ident:
        c = ident["checkpoint"]
        lines += [f"Trainer checkpoint: step {c.get('step')}, {c.get('tokens')} tokens, run `{c.get('run')}` "
                  f"(tokenizer from {c.get('tokenizer')}).", ""]
    lines += [f"{cfg.probes.n_prompts} prompts per task and number of shots ({len(set(hits.task)) - 1} tasks), "
              f"seed {cfg.seed}; ablation: **{lb.method}**, probes under ablation at {lb.shots} shots, "
              f"{lb.n_draws} matched random draws per variant. 95% CIs over prompts / sequences (normal "
              "approximation); relative drops are paired (delta method).", ""]
    for n in res.notes:
        lines += [f"*Note: {n}.*", ""]
    # probes
    lines += ["## Function-style ICL probes (intact)", "",
              "HITS@1 / HITS@3 on the first answer token; *permuted* = the demonstrations' labels deranged.", ""]
    cols = [(k, "intact") for k in shots] + [(k, "permuted") for k in shots if k >= 2 and cfg.probes.permutation_control]
    lines += ["| task | " + " | ".join(f"{k}-shot{' permuted' if c == 'permuted' else ''}" for k, c in cols) + " |",
              "| --- |" + " --- |" * len(cols)]
    intact = hits[hits.condition == "intact"]
    for task in dict.fromkeys(intact.task):
        cells = []
        for k, c in cols:
            r = intact[(intact.task == task) & (intact.shots == k) & (intact.control == c)]
            cells.append("—" if r.empty else f"{r.hits1.iloc[0]:.2f} / {r.hits3.iloc[0]:.2f}")
        name = f"**{task}**" if task == "macro" else task
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Macro HITS@1 with 95% CIs: " + "; ".join(
        f"{k}-shot {c} {row_ci(r, 'hits1')}" for k, c in cols
        for r in intact[(intact.task == 'macro') & (intact.shots == k) & (intact.control == c)].to_dict("records")),
        "", "![HITS@1 by task](plots/hits_by_task.png)", ""]
    # ICL score, induction loss, perplexity
    lines += ["## ICL score, induction loss, perplexity", ""]
    i0 = res.icl_summary.iloc[0]
    if "icl_score" in res.icl_summary and not pd.isna(i0.get("icl_score")):
        w = int(i0.get("window", 1))
        avg = f", each averaged over the {w} tokens ending there" if w > 1 else ""
        lines.append(f"ICL score (loss at token {int(i0.late)} − loss at token {int(i0.early)}{avg}, natural held-out text, "
                     f"{cfg.icl.n_sequences} windows): {row_ci(i0, 'icl_score')} nats (late {i0.loss_late:.3f}, early "
                     f"{i0.loss_early:.3f}); negative = later tokens predicted better thanks to the context.")
    else:
        lines.append("ICL score: skipped (no `--shards`: no natural held-out text).")
    lines += ["", f"Induction loss on `[BOS] S S` ({cfg.induction.n_sequences} sequences, T = {cfg.induction.seq_len}): "
              f"first copy {i0.first_copy:.3f}, second copy {i0.second_copy:.3f} nats; benefit "
              f"{row_ci(i0, 'induction_benefit')}.", ""]
    if res.perplexity:
        p = res.perplexity
        lines += [f"Perplexity guard: {p['perplexity']:.3f} on {p['n_scored']:,} scored tokens of the held-out split "
                  f"({p['n_windows']} windows of ≤ {p['context']} tokens; tokenizer {p['tokenizer']}).", ""]
    else:
        lines += ["Perplexity guard: skipped (no `--shards`).", ""]
    # load-bearing test
    conc = res.concentration
    lines += ["## Load-bearing test", "",
              f"Induction-score concentration over {conc['n_heads']} heads: the top {conc['top_n']} "
              f"({100 * conc['top_n'] / conc['n_heads']:.1f}%) hold {100 * conc['top_share']:.1f}% of the total; "
              f"Gini {conc['gini']:.3f}; max {conc['max']:.3f} at L{conc['strongest'][0]}H{conc['strongest'][1]}; "
              "heads above " + ", ".join(f"{t:g}: {n}" for t, n in conc["above"].items()) + ".", ""]
    for v in dict.fromkeys(res.variants.values()):
        ind = next(c for c in res.conditions if res.variants[c.name] == v and c.kind == "induction")
        lines.append(f"- `{v}`: {len(ind.heads)} induction heads ablated "
                     f"({', '.join(f'L{l}H{h}' for l, h in ind.heads[:12])}{', …' if len(ind.heads) > 12 else ''}).")
    lines += ["", "Relative change vs intact (ablated mean / intact mean − 1), paired 95% CI; random = pooled matched "
              "draws; *induction − random* in units of the intact mean.", "",
              "| measure | variant | intact | induction heads ablated | random heads ablated | induction − random |",
              "| --- | --- | --- | --- | --- | --- |"]
    d = res.drops
    labels = _eval_labels(lb.shots)
    if len(d):
        for m in labels:
            for v in dict.fromkeys(d[d.measure == m].variant):
                g = d[(d.measure == m) & (d.variant == v)]
                ind = g[g.kind == "induction"].to_dict("records")
                rnd = g[(g.kind == "random") & (g.draw == "pooled")].to_dict("records")
                con = g[g.kind == "induction-random"].to_dict("records")
                if not ind:
                    continue
                if not ind[0]["intact"] > 0:     # a relative change of a non-positive benefit means nothing
                    lines.append(f"| {labels[m]} | {v} | {ind[0]['intact']:.3f} | n/a (intact mean ≤ 0) | — | — |")
                    continue
                lines.append(f"| {labels[m]} | {v} | {ind[0]['intact']:.3f} | {_pct_ci(ind[0])} | "
                             f"{_pct_ci(rnd[0]) if rnd else '—'} | {_pct_ci(con[0]) if con else '—'} |")
    lines += ["", "Papers' reference (Bi-Induct): natural-only models lose −22.6% (0.13B) / −19.5% (1B) of their ICL "
              "score under top-2%-per-layer induction ablation, Bi-Induct models −4.9% / −14.5%.", "",
              "![drops](plots/drops.png)", ""]
    if res.lm_eval:
        lm = res.lm_eval
        lines += ["## lm-evaluation-harness", "", f"lm-eval {lm['lm_eval_version']}, batch size {lm['batch_size']}, "
                  f"few-shot {lm['num_fewshot'] if lm['num_fewshot'] is not None else 'task default'}, limit "
                  f"{lm['limit']}, seed {lm['seed']}.", "", "| task | metric | value |", "| --- | --- | --- |"]
        for task, metrics in lm["results"].items():
            for k, val in metrics.items():
                if isinstance(val, (int, float)) and k != "alias" and "stderr" not in k:
                    lines.append(f"| {task} | {k} | {val:.3f} |")
        lines.append("")
    lines += ["## Timings", ""] + [f"- {k.removesuffix('_s')}: {v:.1f} s" for k, v in res.timings.items()]
    lines += ["", "All numbers: `results.json`; tables: `tables/` (probe_rows, hits, icl, drops, head_scores, "
              "lm_eval).", ""]
    return "\n".join(lines)


def write_evaluate_outputs(out: Path, res) -> None:
    """The run directory of :func:`inductionlab.studies.evaluate.study.run_evaluate`: tables/, plots/, report.md
    (each file written atomically; report.md last; results.json after them, by
    :meth:`~inductionlab.studies.run.StudyRun.finish`)."""
    tables, figs = out / "tables", out / "plots"
    name, lb = res.loaded.identity.get("name", "?"), res.config.load_bearing

    def csv(df, fname):
        atomic_write_text(tables / fname, df.to_csv(index=False))

    hs = res.scores
    L, H = hs["induction"].shape
    csv(pd.DataFrame([{"layer": l, "head": h, **{n: float(v[l, h]) for n, v in hs.scores.items()}}
                      for l in range(L) for h in range(H)]), "head_scores.csv")
    csv(res.probe_rows, "probe_rows.csv")
    csv(res.hits, "hits.csv")
    csv(res.icl_summary, "icl.csv")
    csv(res.drops, "drops.csv")
    csv(pd.DataFrame([{"condition": c.name, "variant": res.variants[c.name], "kind": c.kind, "draw": c.draw,
                       "n_heads": len(c.heads), "heads": " ".join(f"L{l}H{h}" for l, h in c.heads)}
                      for c in res.conditions]), "conditions.csv")
    if res.lm_eval:
        csv(pd.DataFrame([{"task": t, "metric": k, "value": v} for t, m in res.lm_eval["results"].items()
                          for k, v in m.items() if isinstance(v, (int, float))]), "lm_eval.csv")
    arms = [(f"intact, {k} shots", {"condition": "intact", "shots": k, "control": "intact"})
            for k in res.config.probes.shots]
    arms += [(f"permuted labels, {lb.shots} shots", {"condition": "intact", "shots": lb.shots, "control": "permuted"})]
    for v in dict.fromkeys(res.variants.values()):
        arms += [(f"induction {v} ablated, {lb.shots} shots", {"condition": f"induction-{v}", "shots": lb.shots}),
                 (f"random {v} ablated (pooled), {lb.shots} shots", {"condition": f"random-{v}", "shots": lb.shots})]
    plots.hits_by_task(res.hits, arms, figs / "hits_by_task.png", title=f"{name}: function-style ICL probes, HITS@1 "
                       "(95% CI)")
    plots.head_heatmaps(hs.scores, figs / "head_scores.png", title=name)
    positive = set(res.drops[(res.drops.kind == "induction") & (res.drops.intact > 0)].measure) if len(res.drops) else ()
    labels = {m: lab for m, lab in _eval_labels(lb.shots).items() if m in positive}   # relative to ≤ 0 means nothing
    if labels:
        plots.drop_bars(res.drops, labels, figs / "drops.png",
                        title=f"{name}: relative change under ablation ({lb.method}), 95% CI")
    atomic_write_text(out / "report.md", evaluate_report(res))   # results.json: StudyRun.finish
