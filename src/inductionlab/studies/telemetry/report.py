"""The run directory of ``inductionlab telemetry`` (:func:`write`): per run NAME ``NAME_summary.csv``,
``NAME_eval.csv``, ``NAME_heatmaps.png``; ``curves.png``; with ``--head-types`` the folder ``head_types/``
(per run ``NAME_scores.csv``, ``_transitions.csv``, ``_cmr_share.csv``, ``_concentration.csv``, one
``NAME_<score>.png`` per type, ``NAME_head_types.json``; for several runs ``comparison.csv``,
``comparison_by_group.csv``, ``comparison.png``); report.md. results.json and timing.json follow (the engine).

The figures are the shared :mod:`inductionlab.studies.plots`.
"""

from __future__ import annotations

from pathlib import Path

from .. import plots
from ...runtime.runs import atomic_write_json, atomic_write_text


def write(out: Path, res) -> None:
    """The run directory's files (the engine writes results.json and timing.json after them)."""
    rep = res.record["results"]
    for name, heads in res.heads.items():
        atomic_write_text(out / f"{name}_summary.csv", res.summaries[name].to_csv(index=False))
        atomic_write_text(out / f"{name}_eval.csv", res.evals[name].to_csv(index=False))
        plots.training_heatmaps(heads, out / f"{name}_heatmaps.png", f"{name}: head scores over training")
    folder = out / "head_types"
    for name, sweep in res.head_types.items():
        _write_head_types(folder, name, sweep, res.config.head_types)
    if res.comparison is not None:
        per_run, by_group = res.comparison
        atomic_write_text(folder / "comparison.csv", per_run.to_csv(index=False))
        atomic_write_text(folder / "comparison_by_group.csv", by_group.to_csv(index=False))
        groups = {n: str(rep[n]["curriculum"]) for n in res.head_types}
        from ...protocols import training_head_types as T

        thr = res.config.head_types.cmr_threshold
        plots.head_type_comparison({n: (groups[n], T.concentration(s.tidy, 1), T.cmr_share(s.tidy, thr))
                                    for n, s in res.head_types.items()}, folder / "comparison.png",
                                   "Head types over training: " + " vs ".join(dict.fromkeys(groups.values())))
    plots.training_curves(res.summaries, res.evals, {n: r["emergence_tokens"] for n, r in rep.items()},
                          out / "curves.png", res.threshold)
    atomic_write_text(out / "report.md", report(res))


def _write_head_types(folder: Path, name: str, sweep, params) -> None:
    """One run's head-type files (the names its record lists)."""
    for key, df in {"scores": sweep.tidy, **sweep.tables}.items():
        atomic_write_text(folder / f"{name}_{key}.csv", df.to_csv(index=False))
    present = set(sweep.tidy["score"])
    for score, (thr, direction) in params.thresholds().items():
        if score in present:
            plots.head_type_plot(sweep.tidy, score, thr, direction, folder / f"{name}_{score}.png",
                                 f"{name}: {score} over training")
    atomic_write_json(folder / f"{name}_head_types.json", sweep.record)


def summary(res) -> list[str]:
    """What ``inductionlab telemetry`` prints when it is done: per run, the emergence (measured and predicted),
    the final max induction and anti-induction scores and the held-out perplexity."""
    from ...train.telemetry import format_emergence

    lines = []
    for name, rep in res.record["results"].items():
        ind, ppl = rep["final"]["induction"], rep["final_heldout_ppl"]
        ppl = f"{ppl:.1f}" if isinstance(ppl, float) else "-"
        em = format_emergence(rep["emergence_tokens"], rep["emergence_step"], rep.get("predicted_emergence"))
        lines.append(f"{name}: {em} (induction > {res.threshold:g}); final max induction {ind['max']:.3f} at "
                     f"L{ind['max_layer_head'][0]}H{ind['max_layer_head'][1]}, max anti-induction "
                     f"{rep['final']['anti_induction']['max']:.3f}, held-out ppl {ppl}")
    return lines


def report(res) -> str:
    """report.md: the runs, what each line of the summary means, the head types swept and the files."""
    rec = res.record
    lines = ["# inductionlab telemetry", "", "Runs: " + ", ".join(f"`{r}`" for r in rec["runs"]) + ".", "",
             f"Emergence: the first checkpoint whose max induction score exceeds {res.threshold:g}; the law of "
             "Aoyama et al. beside it (docs/train.md).", "", *[f"* {line}" for line in summary(res)], "",
             "![curves](curves.png)", ""]
    if res.head_types:
        lines += ["## Head types over training", ""]
        for name, sweep in res.head_types.items():
            r = sweep.record
            skipped = f"; not computed: {', '.join(r['not_computed'])}" if r["not_computed"] else ""
            lines.append(f"* {name}: {len(r['steps'])} checkpoints (steps {r['steps'][0]}–{r['steps'][-1]}){skipped}; "
                         f"files in `head_types/`: " + ", ".join(f"`{f}`" for f in r["files"]))
        if res.comparison is not None:
            lines += ["", "Several runs side by side: `head_types/comparison.csv`, `comparison_by_group.csv`, "
                          "`comparison.png`."]
        lines.append("")
    lines += ["Files: `results.json` (everything: parameters, versions, per-run summaries), per run "
              "`NAME_summary.csv`, `NAME_eval.csv`, `NAME_heatmaps.png`; `curves.png`.", ""]
    return "\n".join(lines)
