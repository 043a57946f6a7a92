"""The run directory of ``inductionlab study routes``: tables, the figure, report.md, and the lines the command
prints. Reads a finished :class:`~inductionlab.studies.routes.study.RoutesStudy`; no model."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ...runtime.runs import atomic_write_text
from .. import plots
from ..report import VIEW_LINE, fmt_ci, model_line, verdict_lines
from ..token_loss import report_lines as token_loss_lines
from .verdicts import MEASURES

#: the measures of the figure and of the report's main table
SHOWN = ("lag_plus1", "lag_enrichment", "temporal_factor", "recall_accuracy", "copy_p_first_word",
         "copy_p_first_nonsense", "copy_p_first_random", "icl_benefit")


def condition_table(res) -> pd.DataFrame:
    """One row per condition: name, kind, k, draw, the ablated heads (``L<l>H<h>`` separated by spaces)."""
    return pd.DataFrame([{"condition": c.name, "kind": c.kind, "k": c.k, "draw": c.draw,
                          "heads": " ".join(f"L{l}H{h}" for l, h in c.heads)} for c in res.conditions])


def _arm_order(drops: pd.DataFrame) -> list[str]:
    arms = list(dict.fromkeys(drops.arm))
    return [a for a in arms if not a.startswith("random")] + [a for a in arms if a.startswith("random")]


def report(res) -> str:
    idn, cfg = res.record["model"], res.config
    p = res.record["params"]
    sel = cfg.selection
    lines = [f"# inductionlab study routes — {idn['name']}", "", model_line(idn), "",
             "Which route carries the seed's effects: the top heads of each ranking ablated, against random heads, "
             "on the all-cue lag probe, serial recall, a word-list copy probe and the token-loss ICL score. "
             "Guide: docs/study-routes.md.", "", VIEW_LINE, ""]
    lines += verdict_lines(res.verdicts, "studies/routes/verdicts.py")
    if "token_loss" in res.record:
        lines += [""] + token_loss_lines(res.record["token_loss"])
    lines += ["", "## Rankings", "",
              f"Rankings: {', '.join(sel.rankings)} (scores file: {sel.scores_file or 'none'}); claim roles: token = "
              f"{sel.token_ranking}, concept = {sel.concept_ranking}, CMR-like = {sel.cmr_ranking}. Top 5 heads:", ""]
    for r, info in res.record["rankings"].items():
        lines.append(f"- **{r}** ({'computed' if info['source'] == 'computed' else 'from file'}): " +
                     ", ".join(f"L{h['layer']}H{h['head']} {h['score']:.3g}" for h in info["top"][:5]))
    lines += ["", "## Drops under ablation", "",
              f"Heads ablated: {', '.join(map(str, p['sizes']))}; {sel.method} ablation ({cfg.icl.method} for the ICL "
              f"score); {sel.n_draws} random draws of k heads of all heads per k (pooled per trial). Trials: "
              f"{cfg.lag.n_permutations} lag lists (cues {cfg.lag.cues}), {cfg.recall.n_trials} recall prompts, "
              f"{cfg.copy.n_lists} copy lists per item kind, {res.record['token_loss']['n_windows']} text windows. "
              "Drop = intact − ablated, paired over the same trials, 95% CI.", ""]
    d = res.drops
    arms = _arm_order(d)
    lines += ["| measure | intact | " + " | ".join(arms) + " |", "|---|---|" + "---|" * len(arms)]
    for m in MEASURES:
        g = d[d.measure == m]
        if g.empty:
            continue
        cells = {r.arm: fmt_ci(r.drop, r.drop_ci_low, r.drop_ci_high) for r in g.itertuples()}
        lines.append(f"| {MEASURES[m]} | {g.intact.iloc[0]:.3f} | " + " | ".join(cells.get(a, "") for a in arms) + " |")
    c = res.cost
    lines += ["", "## Cost", "", f"Ratio of each phase's time per condition to one bare forward over the same trials "
              f"({c['definition']}):", ""]
    for k, v in c["ratio_per_condition"].items():
        lines.append(f"- {k}: bare forward {c['bare_forward_s'][k]:.2f} s; ratio "
                     + (f"{v:.2f}" if v is not None else "— (loaded from a checkpoint)"))
    lines += ["", "## Timings", ""] + [f"- {k.removesuffix('_s')}: {v:.1f} s" for k, v in res.timings.items()]
    lines += ["", "Paraphrase: " + res.record["paraphrase_definition"] + ".", "",
              "Files: `results.json`, `drops.csv`, `conditions.csv`, `copy_outputs.csv`, `drops_by_ranking.png`.", ""]
    return "\n".join(lines)


def write(out: Path, res) -> None:
    """The run directory's files (the engine writes results.json and timing.json after them)."""
    for df, f in ((res.drops, "drops.csv"), (condition_table(res), "conditions.csv"),
                  (res.copy_outputs, "copy_outputs.csv")):
        atomic_write_text(out / f, df.to_csv(index=False))
    shown = {m: MEASURES[m] for m in SHOWN if m in set(res.drops.measure)}
    plots.drops_by_ranking(res.drops, shown, out / "drops_by_ranking.png",
                           title=f"{res.loaded.identity['name']}: drop under ablation by ranking")
    atomic_write_text(out / "report.md", report(res))


def summary(res) -> list[str]:
    """What the command prints when it is done: the verdicts."""
    return [f"{v.claim} {v.status}: {v.evidence}" + (f" ({v.caveat})" if v.caveat else "")
            + (f" [power: {v.power_line}]" if v.power else "") for v in res.verdicts]
