"""Study bi-induct, its outputs: ``report.md`` (:func:`bi_induct_report`), the tables and the telemetry
figure (:func:`write_bi_induct_outputs`, called by
:func:`~inductionlab.studies.bi_induct.study.run_bi_induct_study`), and the small Markdown table
formatters only this study uses. Imports the shared :mod:`inductionlab.studies.plots`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .. import plots
from ...runtime.runs import atomic_write_text

def _num(x, d: int = 3) -> str:
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "-"
    if isinstance(x, float) and x.is_integer() and abs(x) >= 1000:
        return f"{int(x):,}"
    return f"{x:.{d}f}" if isinstance(x, float) else str(x)


def _md(df: pd.DataFrame, d: int = 3) -> str:
    """A small Markdown table of ``df`` (floats with ``d`` decimals)."""
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df.itertuples(index=False):
        lines.append("| " + " | ".join(_num(v, d) if not isinstance(v, str) else v for v in r) + " |")
    return "\n".join(lines)


def bi_induct_report(study) -> str:
    """report.md of :func:`inductionlab.studies.bi_induct.study.run_bi_induct_study`: setup and matched
    compute, telemetry figure, emergence table, perplexity, probes, ablation drops, verdicts."""
    rec, t = study.record, study.table
    p, b = rec["preset"], rec["matched_compute"]["budget"]
    thr = rec["thresholds"]["induction_threshold"]
    L = [f"# Bi-Induct matched-compute study (preset `{p['name']}`)", "",
         f"{p['description']}.", "",
         f"Variants {', '.join(rec['params']['variants'])} × {rec['params']['seeds']} seeds. Every run: "
         f"{b['n_params']:,} parameters, {b['steps']} updates × {b['tokens_per_update']} tokens = {b['tokens']:,} "
         f"tokens, {b['flops']:.3e} training FLOPs (6·N·D + attention) — **identical across runs (asserted)**. "
         f"Summed training time {rec['train_time_s_total']:.0f} s; this call {rec['timings']['total_s']:.0f} s wall.",
         *([f"", f"**Partial study**: runs not finished yet and left out: {', '.join(rec['missing_runs'])}."]
           if rec.get("missing_runs") else []),
         "", "## Verdicts", "",
         "Decision rules (stated in `inductionlab.studies.bi_induct.verdicts.RULES` before the data):", ""]
    for k, r in rec["rules"].items():
        L.append(f"* **{k}**: {r}")
    L += ["", "| claim | verdict | evidence (mean [95% CI] over seeds) |", "|---|---|---|"]
    for v in rec["verdicts"]:
        name = v["text"] + (f" ({v['variant']} vs none)" if v.get("variant") else "")
        L.append(f"| {v['claim']}. {name} | **{v['verdict']}** | {v['evidence']} |")
    L += ["", "## Telemetry over training", "", "![telemetry](plots/telemetry_variants.png)", "",
          f"Mean over seeds (line) and min–max over seeds (band). Emergence = first checkpoint with max induction "
          f"score > {thr}.", "", "## Emergence and final head scores", ""]
    law = rec.get("predicted_emergence")
    if law:
        L += [f"The emergence law of Aoyama, Wilcox & Schneider (arXiv 2511.16893), N ≈ 5·10^5·√(B·C) tokens, "
              f"predicts ≈ {law['tokens']:.3g} tokens ≈ {law['updates']:,.0f} updates at B = {law['batch_sequences']}, "
              f"C = {law['context']} (`law_emergence_*`; an order of magnitude, fitted on GPU runs).", ""]
    if rec.get("variants_table"):
        L += ["Per variant, mean [95% Student-t CI] over seeds (emergence: over the seeds that emerged; `never` "
              "counts the others):", "", _md(pd.DataFrame(rec["variants_table"])), ""]
    cols = ["run", "emergence_step", "emergence_tokens", "law_emergence_steps", "law_emergence_tokens",
            "final_max_induction", *[c for c in t.columns if c.startswith("final_max_induction_S")],
            "final_top2pct_induction",
            "peak_max_induction", "final_max_anti_induction", "peak_max_anti_induction", "final_max_copy_offset",
            "final_max_copy_offset_control", "train_time_s"]
    L += [_md(t[[c for c in cols if c in t]]), "", "## Held-out perplexity", ""]
    cols = ["run", "telemetry_heldout_ppl", "ppl"]
    L += [_md(t[[c for c in cols if c in t]], 2), "",
          "`telemetry_heldout_ppl`: the trainer's last-checkpoint telemetry; `ppl`: the evaluation's perplexity "
          "guard on the held-out split.", ""]
    if "icl_benefit" in t:
        L += ["## Probes: associative recall, copying, function-style ICL (HITS@k), ICL score", ""]
        cols = ["run", "recall_accuracy", "copy_accuracy", "hits1_1shot", "hits3_1shot", "hits1_10shot",
                "hits3_10shot", "icl_score", "icl_benefit"]
        L += [_md(t[[c for c in cols if c in t]]), "",
              "`recall_accuracy`: top-1 accuracy of a value after its repeated key (P random key-value pairs in the "
              "model's own tokens, then the same pairs shuffled); `copy_accuracy`: top-1 accuracy on the repeat of a "
              "random-token list. ",
              "Macro average over the preset's tasks, intact prompts (per-task tables and the label-permutation "
              "control in each run's `evaluate/<key>/<run>/`). ICL score = loss(late) − loss(early) in nats (Olsson et al.; "
              "negative = learns in context).", "",
              "## Load-bearing test: top-2% induction heads per layer vs matched random heads", ""]
        absc = [c for c in t.columns if c.startswith("abs_")]
        if absc:
            L += [_md(t[["run", *absc]]), "",
                  "Absolute change under zero ablation (ablated − intact; `contrast` = induction-ablated − random-"
                  "ablated, per unit, random draws pooled): ICL benefit in nats, accuracies as fractions. These "
                  "decide claim D (a relative change divides by the intact value).", ""]
        tt = t.assign(**{c: 100 * t[c] for c in ("drop_induction", "drop_random", "drop_contrast")})
        L += [_md(tt[["run", "drop_induction", "drop_random", "drop_contrast"]], 1), "",
              "Relative change (%) of the per-window ICL benefit under zero ablation; contrast = induction − random "
              "(paper, natural-only vs Bi-Induct: −22.6% vs −4.9% at 0.13B). Pre-registered: read it only where "
              "every compared intact ICL benefit exceeds the RELATIVE_FLOOR of the rules.", ""]
    else:
        L += ["## Evaluation", "", "Not run (`evaluate` off).", ""]
    return "\n".join(L) + "\n"


def write(out: Path, study) -> None:
    """The run directory's files (:func:`write_bi_induct_outputs` of the study's training pieces)."""
    write_bi_induct_outputs(out, study, study.pieces)


def summary(study) -> list[str]:
    """What ``inductionlab study bi-induct`` prints when it is done: the training time, one line per verdict."""
    from ..run import format_verdicts

    return [f"training {study.timings.get('train_s', 0):.0f} s", *format_verdicts(study.verdicts)]


def estimate(cfg) -> str:
    """``--estimate``: the budget of every run and the expected GPU hours (:func:`~.config.gpu_estimate`)."""
    from .config import gpu_estimate

    e = gpu_estimate(cfg)
    return (f"{e['runs']} runs x {e['tokens_per_run']:,} tokens, {e['flops_per_run']:.3e} FLOPs per run; "
            f"~{e['gpu_hours_per_run']:.2f} GPU-hours per run, ~{e['gpu_hours_total']:.1f} in all "
            f"(at {e['assumed_flops_per_s'] / 1e12:.0f} TFLOP/s, {e['assumed_mfu']:.0%} MFU)")


def write_bi_induct_outputs(out: Path, study, pieces: dict) -> None:
    """tables/ (runs, telemetry summary, verdicts), plots/telemetry_variants.png, report.md (results.json
    after them, by :meth:`~inductionlab.studies.run.StudyRun.finish`)."""
    tables, figs = out / "tables", out / "plots"
    frames = []
    for name, pc in pieces.items():
        v, s = name.rsplit("-s", 1)
        frames.append(pd.DataFrame(pc["summary"]).assign(variant=v, seed=int(s), run=name))
    summ = pd.concat(frames, ignore_index=True)
    atomic_write_text(tables / "runs.csv", study.table.to_csv(index=False))
    atomic_write_text(tables / "telemetry_summary.csv", summ.to_csv(index=False))
    atomic_write_text(tables / "verdicts.csv", pd.DataFrame(study.record["verdicts"]).to_csv(index=False))
    plots.variant_curves(summ, figs / "telemetry_variants.png", study.record["thresholds"]["induction_threshold"],
                         title=f"Bi-Induct study ({study.record['preset']['name']})")
    atomic_write_text(out / "report.md", bi_induct_report(study))   # results.json: StudyRun.finish
