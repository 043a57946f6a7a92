"""The run directory of the evaluation study besides checkpoints and results.json: the tables
(``tables/*.csv``), the figures (``plots/*.png``, drawn by :mod:`inductionlab.studies.plots`) and
``report.md`` (:func:`evaluate_report`), written by :func:`write_evaluate_outputs`.

Imports the shared formatting pieces of :mod:`inductionlab.studies.report`; takes a finished
:class:`~inductionlab.studies.evaluate.study.EvaluateResult` (its numbers are computed elsewhere).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .. import plots
from ...runtime.runs import atomic_write_text
from ..report import model_line, ranked_arm, row_ci, selection_line
from .tables import SEQUENCE_MEASURES

EVAL_MEASURES = {n: m.label for n, m in SEQUENCE_MEASURES.items() if m.label}   # the report's drops table


def _eval_labels(shots: int) -> dict[str, str]:
    return {f"hits1_{shots}shot": f"probe HITS@1 at {shots} shots", **EVAL_MEASURES}


def _pct_ci(r) -> str:
    return f"{r['headline']} [{100 * r['ci_low']:+.1f}%, {100 * r['ci_high']:+.1f}%]"


def evaluate_report(res) -> str:
    """The Markdown report of :func:`inductionlab.studies.evaluate.study.run_evaluate`, section by section."""
    lines = (_header_lines(res) + _probe_lines(res) + _loss_lines(res) + _load_bearing_lines(res)
             + _lm_eval_lines(res))
    lines += ["## Timings", ""] + [f"- {k.removesuffix('_s')}: {v:.1f} s" for k, v in res.timings.items()]
    lines += ["", "All numbers: `results.json`; tables: `tables/` (probe_rows, hits, icl, drops, head_scores, "
              "lm_eval, lm_eval_drops).", ""]
    return "\n".join(lines)


def _header_lines(res) -> list[str]:
    """Title, model line, trainer checkpoint, setup and notes."""
    cfg, ident = res.config, res.loaded.identity
    lb = cfg.load_bearing
    hits = res.hits
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
    return lines


def _probe_lines(res) -> list[str]:
    """The function-style ICL probes (intact): HITS@1 / HITS@3 per task and number of shots."""
    cfg, hits = res.config, res.hits
    shots = list(cfg.probes.shots)
    lines = ["## Function-style ICL probes (intact)", "",
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
    return lines


def _loss_lines(res) -> list[str]:
    """ICL score, induction loss and the perplexity guard."""
    cfg = res.config
    lines = ["## ICL score, induction loss, perplexity", ""]
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
    return lines


def _load_bearing_lines(res) -> list[str]:
    """The load-bearing test: score concentration, the heads of each variant, the relative drops."""
    lb = res.config.load_bearing
    conc = res.concentration
    lines = ["## Load-bearing test", "",
              f"Induction-score concentration over {conc['n_heads']} heads: the top {conc['top_n']} "
              f"({100 * conc['top_n'] / conc['n_heads']:.1f}%) hold {100 * conc['top_share']:.1f}% of the total; "
              f"Gini {conc['gini']:.3f}; max {conc['max']:.3f} at L{conc['strongest'][0]}H{conc['strongest'][1]}; "
              "heads above " + ", ".join(f"{t:g}: {n}" for t, n in conc["above"].items()) + ".", ""]
    arm = ranked_arm(res.conditions)
    if arm != "induction":
        lines += [selection_line(res.conditions) + " Per-layer variants: random heads matched per layer.", ""]
    for v in dict.fromkeys(res.variants.values()):
        ind = next(c for c in res.conditions if res.variants[c.name] == v and c.kind == arm)
        lines.append(f"- `{v}`: {len(ind.heads)} {arm} heads ablated "
                     f"({', '.join(f'L{l}H{h}' for l, h in ind.heads[:12])}{', …' if len(ind.heads) > 12 else ''}).")
    lines += ["", "Relative change vs intact (ablated mean / intact mean − 1), paired 95% CI; random = pooled matched "
              f"draws; *{arm} − random* in units of the intact mean.", "",
              f"| measure | variant | intact | {arm} heads ablated | random heads ablated | {arm} − random |",
              "| --- | --- | --- | --- | --- | --- |"]
    d = res.drops
    labels = _eval_labels(lb.shots)
    if len(d):
        for m in labels:
            for v in dict.fromkeys(d[d.measure == m].variant):
                g = d[(d.measure == m) & (d.variant == v)]
                ind = g[g.kind == arm].to_dict("records")
                rnd = g[(g.kind == "random") & (g.draw == "pooled")].to_dict("records")
                con = g[g.kind == f"{arm}-random"].to_dict("records")
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
    return lines


def _lm_eval_lines(res) -> list[str]:
    """The lm-evaluation-harness results (none without lm-eval tasks)."""
    lines: list[str] = []
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
    d = res.lm_eval_drops
    if len(d) and (d.condition != "intact").any():
        method = res.config.load_bearing.method
        lines += [f"### lm-eval under each ablation ({method} ablation, model type `inductionlab`)", "",
                  "Drop = intact − ablated (positive: the ablation lowered the metric); random draws also pooled "
                  "(mean). Per condition: `tables/lm_eval_drops.csv`.", "",
                  "| task | metric | condition | heads | value | drop | relative |", "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in d.itertuples():
            rel = "—" if r.condition == "intact" or r.relative_change != r.relative_change else f"{r.relative_change:+.1%}"
            lines.append(f"| {r.task} | {r.metric} | {r.condition} | {r.n_heads} | {r.value:.3f} | "
                         f"{'—' if r.condition == 'intact' else f'{r.drop:+.3f}'} | {rel} |")
        lines.append("")
    return lines


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
        csv(res.lm_eval_drops, "lm_eval_drops.csv")
    arms = [(f"intact, {k} shots", {"condition": "intact", "shots": k, "control": "intact"})
            for k in res.config.probes.shots]
    arms += [(f"permuted labels, {lb.shots} shots", {"condition": "intact", "shots": lb.shots, "control": "permuted"})]
    arm = ranked_arm(res.conditions)
    for v in dict.fromkeys(res.variants.values()):
        arms += [(f"{arm} {v} ablated, {lb.shots} shots", {"condition": f"{arm}-{v}", "shots": lb.shots}),
                 (f"random {v} ablated (pooled), {lb.shots} shots", {"condition": f"random-{v}", "shots": lb.shots})]
    plots.hits_by_task(res.hits, arms, figs / "hits_by_task.png", title=f"{name}: function-style ICL probes, HITS@1 "
                       "(95% CI)")
    plots.head_heatmaps(hs.scores, figs / "head_scores.png", title=name)
    positive = set(res.drops[(res.drops.kind == arm) & (res.drops.intact > 0)].measure) if len(res.drops) else ()
    labels = {m: lab for m, lab in _eval_labels(lb.shots).items() if m in positive}   # relative to ≤ 0 means nothing
    if labels:
        plots.drop_bars(res.drops, labels, figs / "drops.png",
                        title=f"{name}: relative change under ablation ({lb.method}), 95% CI")
    atomic_write_text(out / "report.md", evaluate_report(res))   # results.json: StudyRun.finish


write = write_evaluate_outputs


def summary(res) -> list[str]:
    """What ``inductionlab evaluate`` prints when it is done: macro HITS@1, the ICL score, the induction
    benefit, perplexity, the relative changes under ablation, the notes."""
    h = res.hits
    macro = h[(h.task == "macro") & (h.condition == "intact")]
    lines = [f"{res.loaded.identity.get('name')}: macro HITS@1 [95% CI]"]
    lines += [f"  {r['shots']:>2}-shot {r['control']:<8s} {row_ci(r, 'hits1')}" for r in macro.to_dict("records")]
    i0 = res.icl_summary.iloc[0].to_dict()
    if i0.get("icl_score") is not None and i0.get("icl_score") == i0.get("icl_score"):
        lines.append(f"ICL score (token {int(i0['late'])} − {int(i0['early'])}): {row_ci(i0, 'icl_score')} nats")
    lines.append(f"induction benefit: {row_ci(i0, 'induction_benefit')} nats")
    if res.perplexity:
        lines.append(f"held-out perplexity: {res.perplexity['perplexity']:.3f} ({res.perplexity['n_scored']:,} tokens)")
    d, arm = res.drops, ranked_arm(res.conditions)
    if len(d):
        lines.append(f"relative change under ablation ({arm} heads | matched random, pooled):")
        for (m, v), g in d.groupby(["measure", "variant"], sort=False):
            ind = g[g.kind == arm].iloc[0]
            rnd = g[(g.kind == "random") & (g.draw == "pooled")]
            lines.append(f"  {m:<18s} {v:<15s} {ind['headline']:>8s} | "
                         f"{rnd['headline'].iloc[0] if len(rnd) else '—':>8s}")
    lines += [f"note: {n}" for n in res.notes]
    return lines


__all__ = ["evaluate_report", "write_evaluate_outputs", "write", "summary"]
