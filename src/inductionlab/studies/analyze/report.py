"""The run directory of the main job (``inductionlab analyze``): :func:`analyze_report` (report.md)
and :func:`write_analyze_outputs` (tables, figures, per-trial arrays).

Imports the shared report pieces (:mod:`inductionlab.studies.report`: model line, CI formatting,
the word-prior-corrected and all-cue lines and files) and the figures of :mod:`inductionlab.studies.plots`.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd

from .. import plots

from ...measures import serial_position
from ...runtime.runs import atomic_write_bytes, atomic_write_text
from ...measures.serial_position import cue_tables
from ..report import (CUE_FILES, ENRICH_LABEL, VIEW_LINE, corrected_lines, cue_lines, fmt_ci4, model_line,
                      pooled_headline_rows, ranked_arm, row_ci, selection_line, write_cue_outputs)


def analyze_report(res) -> str:
    """A short Markdown report of the main job (:func:`inductionlab.studies.analyze.study.analyze`)."""
    idn, lc = res.record["model"], res.lag.config
    hl = res.lag.headline()
    intact = hl[hl["condition"] == "intact"].iloc[0]
    summary = res.lag.summary()
    cur = summary[(summary["condition"] == "intact") & (summary["lag"] != 0)]
    peak = int(cur.loc[cur["mean"].idxmax(), "lag"])
    near = cur[cur["lag"].abs() <= 10]
    peak_near = int(near.loc[near["mean"].idxmax(), "lag"])
    chance = intact["list_mass"] / lc.list_length
    arm = ranked_arm(res.lag.conditions)
    lines = [f"# inductionlab analyze — {idn['name']}", "",
             model_line(idn), "",
             "## Top induction heads", "", "| rank | layer | head | induction score |", "|---|---|---|---|"]
    for i, h in enumerate(res.record["top_induction_heads"], 1):
        lines.append(f"| {i} | {h['layer']} | {h['head']} | {h['score']:.3f} |")
    il = res.scores.induction_loss
    cues = cue_lines(res.lag)          # the headline when every list is cued: evidence comes from the cues
    lines += ["", f"Induction loss: first copy {il['first_copy']:.2f} nats, second copy {il['second_copy']:.2f} nats."]
    lines += _pattern_lines(res)
    lines += cues
    lines += ["", "## Lag probe, seed cue only" if cues else "## Lag probe", "",
              f"{lc.n_permutations} trials per condition, list of {lc.list_length} words, cue at "
              f"position {lc.cue_position}, {lc.method} ablation. "
              "Probabilities are raw next-token probabilities; 95% CIs over trials"
              + (" (one cue per trial: with few trials these CIs are wide; the seed protocol is "
                 "`--cues seed --n-permutations 5000`)." if cues else "."), "",
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
              f"{arm[:1].upper() + arm[1:]} vs random ablation at lag +1 (paired over the same trials; random = mean "
              "of draws):", "",
              f"| k | {arm}-k | random-k | random − {arm} [95% CI] |", "|---|---|---|---|"]
    lines[-4:-4] = [selection_line(res.lag.conditions), ""] if arm != "induction" else []
    for _, r in res.lag.contrasts(1).iterrows():
        lines.append(f"| {int(r['k'])} | {r[arm]:.4f} | {r['random']:.4f} | "
                     f"{r[f'random_minus_{arm}']:+.4f} [{r['ci_low']:+.4f}, {r['ci_high']:+.4f}] |")
    lines += corrected_lines(res.lag)
    lines += ["",
              "Random rows pool the draws (per-trial mean over draws); per-draw rows are in `lag_headline.csv`."]
    lines += ["", "## Timings", ""]
    lines += [f"- {k.removesuffix('_s')}: {v:.1f} s" for k, v in res.timings.items()]
    lines += ["", "Files: `results.json` (everything, incl. parameters and versions), `head_scores.csv`, "
              "`lag_curves.csv`, `lag_headline.csv`, `lag_trials.npz`, `head_scores.png`, `lag_curve.png`, "
              "`lag_curve_renorm.png`" + (", `attention_patterns.png`, `attention_patterns.npz`"
                                          if getattr(res, "patterns", None) is not None else "")
              + (", `lag_curves_corrected.csv`, `lag_curve_corrected.png`"
                                          if res.lag.has_corrected else "")
              + ("".join(f", `{f}`" for f in CUE_FILES) if serial_position.has_cues(res.lag) else "") + ".", "",
              VIEW_LINE, ""]
    return "\n".join(lines)


def _pattern_titles(p: dict) -> list[str]:
    """``"L18 H6 induction 0.87"`` per induction head, ``"L3 H2 random (induction 0.01)"`` for the random one."""
    return [f"L{l} H{h} induction {s:.2f}" if k == "induction" else f"L{l} H{h} {k} (induction {s:.2f})"
            for (l, h), k, s in zip(p["heads"], p["kind"], p["induction"])]


def _pattern_lines(res) -> list[str]:
    p = getattr(res, "patterns", None)
    if p is None:
        return []
    T, n, bos = int(p["seq_len"]), len(p["input_ids"]), bool(int(p["bos"]))
    return ["", "## Attention patterns", "",
            f"The top induction heads and one random head (seed {int(p['seed'])}) on one "
            f"{'[BOS] S S' if bos else 'S S'} sequence ({n} tokens, S = {T} random ordinary tokens): an induction "
            f"head's queries in the second copy attend {T - 1} keys left of the diagonal (the token after the "
            f"earlier occurrence), the rest of its mass mostly on the first token. Colour: square-root scale.", "",
            "![attention patterns](attention_patterns.png)", "",
            "Heads: " + "; ".join(_pattern_titles(p)) + ". Arrays (patterns, heads, input ids): "
            "`attention_patterns.npz`."]


def write_pattern_outputs(d: Path, res) -> None:
    """``attention_patterns.npz`` (the piece's arrays, so the figure can be redrawn) and
    ``attention_patterns.png``; nothing when the result holds no patterns."""
    p = getattr(res, "patterns", None)
    if p is None:
        return
    buf = io.BytesIO()
    np.savez_compressed(buf, **{k: np.asarray(v) for k, v in p.items()})
    atomic_write_bytes(d / "attention_patterns.npz", buf.getvalue())
    n, T = len(p["input_ids"]), int(p["seq_len"])
    plots.attention_patterns(p["patterns"], _pattern_titles(p), d / "attention_patterns.png",
                             title=f"{res.loaded.identity['name']}: attention on "
                                   f"{'[BOS] S S' if int(p['bos']) else 'S S'} ({n} tokens, |S| = {T})")


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
    cue = {f"{m}/{k}": v for m in ("cue_probs", "cue_list_mass", "cue_argmax_lag", "word_logp")
           for k, v in getattr(lag, m).items()}
    if lag.cue_positions is not None:
        cue["cue_positions"] = lag.cue_positions
    if lag.word_lengths is not None:                          # --word-tokens other than 1
        cue["word_lengths"] = lag.word_lengths
    np.savez_compressed(buf, **{f"probs/{k}": v for k, v in res.lag.probs.items()}, **cue)
    atomic_write_bytes(d / "lag_trials.npz", buf.getvalue())
    name = res.loaded.identity["name"]
    plots.head_heatmaps(hs.scores, d / "head_scores.png", title=name)
    write_pattern_outputs(d, res)
    arm = ranked_arm(res.lag.conditions)
    shown = ["intact"] + [c for c in summary["condition"].unique()
                          if c.startswith(f"{arm}-") or (c.startswith("random-") and "-d" not in c)]
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
    kmax = max((c.k for c in res.lag.conditions if c.kind == arm), default=None)
    write_cue_outputs(d, d, res.lag, name, shown, ["intact", f"{arm}-{kmax}", f"random-{kmax}"], sub)


def write(out: Path, res) -> None:
    """The run directory's files (the engine writes results.json and timing.json after them)."""
    write_analyze_outputs(out, res)
    atomic_write_text(out / "report.md", analyze_report(res))


def summary(res) -> list[str]:
    """What ``inductionlab analyze`` prints when it is done: the top heads, lag +1 per condition, the
    temporal factor of all cues."""
    lines = [f"Top {len(res.record['top_induction_heads'])} induction heads ({res.loaded.identity['name']}):"]
    lines += [f"  {i:2d}. L{h['layer']:<2d} H{h['head']:<2d}  {h['score']:.3f}"
              for i, h in enumerate(res.record["top_induction_heads"], 1)]
    seed = [f"  {r['condition']:<14s} {r['lag_plus1']:.4f} [{r['lag_plus1_ci_low']:.4f}, "
            f"{r['lag_plus1_ci_high']:.4f}]   lag -1 {r['lag_minus1']:.4f}   list mass {r['list_mass']:.3f}"
            for r in pooled_headline_rows(res.lag.headline())]
    lc = res.lag.config
    if serial_position.has_cues(res.lag):
        t = cue_tables(res.lag)
        curve = t["lag_cues_curve"]
        p1 = curve[(curve.lag == 1) & (curve.measure == "prob")].set_index("condition")
        arm = ranked_arm(res.lag.conditions)
        lines += ["", f"Lag probe, all cues (--cues {lc.cues}: {len(res.lag.cue_positions)} per list, "
                      f"{lc.n_permutations} lists per condition): pooled p(lag +1) and temporal factor (0.5 = chance), "
                      "[95% CI over lists]:"]
        lines += [f"  {r['condition']:<14s} p(+1) {p1.loc[r['condition'], 'mean']:.4f} "
                  f"[{p1.loc[r['condition'], 'ci_low']:.4f}, {p1.loc[r['condition'], 'ci_high']:.4f}]   "
                  f"temporal factor {r['temporal_factor']:.3f} [{r['temporal_factor_ci_low']:.3f}, "
                  f"{r['temporal_factor_ci_high']:.3f}]" for r in pooled_headline_rows(t["temporal_factor"])]
        con = t["cue_contrasts"]
        con = con[con.measure == "temporal_factor"]
        if len(con):
            lines += ["", f"Random − {arm}, temporal factor, paired per list:"]
            lines += [f"  k={int(r['k']):<3d} {r[f'random_minus_{arm}']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]"
                      f"   z {r['z']:.1f}" for _, r in con.iterrows()]
        lines += ["", f"Seed cue only (position {lc.cue_position}; {lc.n_permutations} trials, so wide CIs), "
                      "lag +1 probability [95% CI]:"] + seed
    else:
        lines += ["", "Lag probe, lag +1 probability [95% CI] per condition:"] + seed
    t = res.timings
    lines += ["", f"Scores {t['head_scores_s']:.0f} s, lag probe {t['lag_probe_s']:.0f} s."]
    return lines
