"""The run directory of the temporal-dependencies study (``inductionlab study temporal``):
:func:`temporal_report` (report.md) and :func:`write_temporal_outputs` (tables/, plots/, report.md).

Imports the shared report pieces (:mod:`inductionlab.studies.report`: model line, CI formatting,
the word-prior-corrected and all-cue lines and files) and the figures of :mod:`inductionlab.studies.plots`.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .. import plots

from ...measures.crp import lag_probe_crp
from ...runtime.runs import atomic_write_text
from ..report import (ENRICH_LABEL, VIEW_LINE, corrected_lines, cue_lines, fmt_ci, model_line, ranked_arm, row_ci,
                      selection_line, write_cue_outputs)


def temporal_report(study, measures: dict[str, str]) -> str:
    """The Markdown report of :func:`inductionlab.studies.temporal.study.run_temporal_study`: verdicts with
    numbers and CIs, headline table, figures. ``measures``: measure -> label."""
    lag, recall, lb_table, conc, head, verd, record, ks = (study.lag, study.recall, study.load_bearing,
                                                           study.concentration, study.headline,
                                                           study.record["verdicts"], study.record, study.ks)
    ident = study.loaded.identity
    arm, ab = ranked_arm(lag.conditions), study.config.ablation
    pool = "from all heads" if ab.random == "all" else f"outside the top {study.exclude_top_n} by {ab.rank_by} score"
    lines = [f"# Temporal-dependencies study: {ident['name']}", "", model_line(ident) + " "
             f"Ablation: **{lag.config.method}**; k ∈ {ks}; random heads drawn {pool}, {ab.n_draws} seeded draws "
             "per k. " + (selection_line(lag.conditions) + " " if arm != "induction" else "") +
             f"Lag probe: {lag.config.n_permutations} permutations of {lag.config.list_length} words, cue at "
             f"{lag.config.cue_position} (seed protocol: 5,000). Serial recall: {recall.config.n_trials} prompts, "
             f"{recall.config.n_shots} shots, lists of {recall.config.list_length}. 95% CIs over trials "
             "(normal approximation); differences are paired.", "", VIEW_LINE, "",
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
    lines += ["## Headline", "", f"| measure | k | intact | {arm}-k ablated | random-k ablated (pooled draws) "
              f"| random − {arm} (paired) |", "| --- | --- | --- | --- | --- | --- |"]
    for r in head.to_dict(orient="records"):
        lines.append(f"| {measures[r['measure']]} | {r['k']} | {row_ci(r, 'intact')} | "
                     f"{row_ci(r, arm)} | "
                     f"{row_ci(r, 'random')} | "
                     f"{row_ci(r, f'random_minus_{arm}')} |")
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


def write_temporal_outputs(out: Path, study, measures: dict[str, str]) -> None:
    """The run directory of :func:`inductionlab.studies.temporal.study.run_temporal_study`: tables/, plots/
    and report.md (each file written atomically; results.json after them, by
    :meth:`~inductionlab.studies.run.StudyRun.finish`). ``measures``: measure -> label."""
    name, ks, method = study.loaded.identity["name"], study.ks, study.lag.config.method
    lag, recall, lb_table, conc, head, hs = (study.lag, study.recall, study.load_bearing, study.concentration,
                                             study.headline, study.scores)
    tables, figs = out / "tables", out / "plots"
    L, H = hs["induction"].shape
    arm = ranked_arm(lag.conditions)

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
        plots.lag_curves(summary, figs / f"lag_curves_k{k}.png", conditions=["intact", f"{arm}-{k}", f"random-{k}"],
                         title=f"{name}: lag probe, k = {k} heads ablated ({method})")
        if lag.has_corrected:
            plots.lag_curves(corrected, figs / f"lag_curves_corrected_k{k}.png",
                             conditions=["intact", f"{arm}-{k}", f"random-{k}"], ylabel=ENRICH_LABEL, zero_line=True,
                             title=f"{name}: lag probe, word-prior corrected, k = {k} ({method})")
    kmax = ks[-1]
    plots.ablation_vs_k(head, {m: measures[m] for m in ("lag_plus1", "recall_accuracy", "recall_lag_plus1")},
                        figs / "ablation_vs_k.png", title=f"{name}: {arm} vs random ablation ({method})", ranked=arm)
    plots.tidy_curves(trans, figs / "recall_transition_curve.png", ["intact", f"{arm}-{kmax}", f"random-{kmax}"],
                      "lag (item position − previous item's position)", "p(next = item at lag), renormalised over list",
                      f"{name}: serial recall transitions")
    shown = ["intact", f"{arm}-{kmax}"] + [c.name for c in lag.conditions if c.kind == "random" and c.k == kmax][:1]
    plots.tidy_curves(crp[crp.lag.abs() <= 10], figs / "lag_crp_argmax.png", shown, "lag", "CRP (arg-max response)",
                      f"{name}: psifr-style lag-CRP of the arg-max response", value="prob")
    write_cue_outputs(tables, figs, lag, name, ["intact", f"{arm}-{kmax}", f"random-{kmax}"],
                      ["intact", f"{arm}-{kmax}", f"random-{kmax}"], f"{method} ablation")
    if lb_table is not None:
        plots.load_bearing_scatter(lb_table, {m: measures[m] for m in conc}, figs / "load_bearing.png",
                                   title=f"{name}: per-head effect of ablating one induction head ({method})")
        plots.concentration_curve({measures[m]: conc[m] for m in ("lag_plus1", "recall_lag_plus1")},
                                  figs / "concentration.png", title=f"{name}: concentration of the lag +1 effect")
    atomic_write_text(out / "report.md", temporal_report(study, measures))   # results.json: StudyRun.finish


def write(out: Path, study) -> None:
    """The run directory's files (:func:`write_temporal_outputs` with the headline's measure labels)."""
    from .verdicts import MEASURES

    write_temporal_outputs(out, study, MEASURES)


def summary(study) -> list[str]:
    """What ``inductionlab study temporal`` prints when it is done: one line per verdict."""
    from ..run import format_verdicts

    return format_verdicts(study.verdicts)
