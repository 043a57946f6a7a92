"""The tidy tables of a finished evaluation, pure functions of its per-unit arrays: the ablation
conditions of the load-bearing test (:func:`load_bearing_conditions`), HITS@k per condition
(:func:`hits_table`), the relative drops per measure (:func:`drops_by_measure`), the ICL and induction
benefits per condition (:func:`icl_table`), the members of each pooled random arm
(:func:`draws_by_variant`) and the lm-eval metrics per condition with their drops (:func:`lm_eval_drops`).

Imports the head selections of :mod:`inductionlab.core.ablation`, the statistics of
:mod:`inductionlab.measures` and the evaluation's config; nothing of the study's run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from ...core.ablation import (RANKED_RANDOM, Condition, default_exclude_top_n, excluded_count, matched_random_heads,
                              per_layer_top_p, ranked_conditions, top_k_heads)
from ...measures.load_bearing_eval import drops_table
from ...measures.stats import pooled, put_ci
from ...protocols.function_probes import summarize_hits
from ...errors import InductionLabError
from ..configs import check_ks
from .config import LoadBearingConfig, parse_variant


@dataclass(frozen=True)
class SequenceMeasure:
    """One per-unit measure of the token-loss phases, read intact and under every ablation.

    Attributes:
        summary: the phase summary it is read from (``"icl"``: :func:`~inductionlab.protocols.icl_score.icl_summary`
            of the held-out windows, absent without ``--shards``; ``"induction"``:
            :func:`~inductionlab.protocols.icl_score.induction_summary`; ``"recall"``:
            :func:`~inductionlab.protocols.icl_score.recall_summary`).
        key: its per-unit array in that summary's ``"per_sequence"`` (one value per sequence).
        label: the report's name for it in the drops table and ``drops.png``; None: only in
            ``tables/drops.csv``, ``icl.csv`` and results.json.
    """
    summary: str
    key: str
    label: str | None = None


#: The per-sequence measures of ``evaluate`` (name -> :class:`SequenceMeasure`), in the order of the
#: tables. A new one: its per-sequence values in its summary (``protocols/icl_score.py``) and one
#: entry here; the results, ``icl.csv``, the drops table and the report read this table.
SEQUENCE_MEASURES: dict[str, SequenceMeasure] = {
    "icl_benefit": SequenceMeasure("icl", "benefit", "ICL benefit, loss(early) − loss(late)"),
    "induction_benefit": SequenceMeasure("induction", "benefit", "induction benefit, loss(copy 1) − loss(copy 2)"),
    "copy_accuracy": SequenceMeasure("induction", "copy_accuracy"),
    "recall_accuracy": SequenceMeasure("recall", "accuracy"),
}


def per_sequence(summaries: dict) -> dict[str, np.ndarray | None]:
    """``{measure: per-sequence values}`` from one condition's phase summaries (None where the
    summary is absent: no held-out windows)."""
    return {n: None if summaries.get(m.summary) is None else summaries[m.summary]["per_sequence"][m.key]
            for n, m in SEQUENCE_MEASURES.items()}


def load_bearing_conditions(scores, cfg: LoadBearingConfig, seed: int = 0) -> list[tuple[str, Condition]]:
    """``(variant, condition)`` pairs: per variant the ranked heads, then ``cfg.n_draws`` random draws.

    * ``per-layer-<p>pct``: ``induction-<variant>`` = :func:`~inductionlab.core.ablation.per_layer_top_p`;
      ``random-<variant>-d<d>`` = :func:`~inductionlab.core.ablation.matched_random_heads` (same count
      per layer, chosen heads excluded, seeded by ``(seed, d)``).
    * ``top-<k>``: :func:`~inductionlab.core.ablation.ranked_conditions` (top-k vs k random heads
      outside the top N = min(300, heads // 2), seeded by ``(seed, k, d)``; ``random-all-<variant>-d<d>``
      from all heads under ``cfg.random == "all"``).

    The heads are ranked by ``cfg.rank_by`` (default induction); with ``cfg.exclude_by`` the top
    ``max(1, int(cfg.exclude_fraction * N))`` heads by that score are never chosen (per layer too). The ranked
    conditions' kind and name prefix are ``cfg.label`` (``induction``, ``previous_token``,
    ``fv-excl-induction``).

    Args: scores: name -> ``[n_layers, n_heads]`` (the run's head scores and the scores file's columns),
        or one ``[n_layers, n_heads]`` array of induction scores.

    Raises: InductionLabError: k larger than the heads left outside the top N, a layer too small
    for its matched draw, a score name not in ``scores``."""
    if not isinstance(scores, dict):
        scores = {"induction": np.asarray(scores)}
    for name in (cfg.rank_by, cfg.exclude_by):
        if name is not None and name not in scores:
            raise InductionLabError(f"load-bearing ranking {name!r}: no such head score; available: {', '.join(scores)}")
    rank, label = np.asarray(scores[cfg.rank_by]), cfg.label
    shape = tuple(rank.shape)
    n_total = shape[0] * shape[1]
    excluded = [] if cfg.exclude_by is None else top_k_heads(scores[cfg.exclude_by], excluded_count(n_total, cfg.exclude_fraction))
    out: list[tuple[str, Condition]] = []
    for v in cfg.ablate:
        kind, x = parse_variant(v)
        if kind == "per-layer":
            chosen = per_layer_top_p(rank, x, exclude=excluded)
            out.append((v, Condition(f"{label}-{v}", label, len(chosen), 0, chosen)))
            out += [(v, Condition(f"random-{v}-d{d}", "random", len(chosen), d,
                                  matched_random_heads(shape, chosen, seed=seed, draw=d))) for d in range(cfg.n_draws)]
        else:
            N = default_exclude_top_n(n_total) if cfg.random == "outside-top-n" else 0
            check_ks([x], n_total, N)
            cfg.check_exclusion([x], n_total)
            for c in ranked_conditions(scores, [x], rank_by=cfg.rank_by, exclude_by=cfg.exclude_by,
                                       exclude_fraction=cfg.exclude_fraction, random=cfg.random, n_draws=cfg.n_draws,
                                       exclude_top_n=N if cfg.random == "outside-top-n" else None, seed=seed,
                                       intact=False):
                c.name = f"{label}-{v}" if c.kind == label else f"{RANKED_RANDOM[cfg.random]}-{v}-d{c.draw}"
                out.append((v, c))
    return out


def hits_table(probe_rows: pd.DataFrame, conditions: Sequence[Condition], variants: dict[str, str]) -> pd.DataFrame:
    """HITS@1 / HITS@3 with CIs per condition × task × shots × control (macro rows included), plus
    each variant's random draws pooled per prompt as condition ``random-<variant>``."""
    parts = [probe_rows]
    for v, names in draws_by_variant(conditions, variants).items():
        per = {n: probe_rows[probe_rows.condition == n] for n in names}     # the same prompts in the same order
        keys = per[names[0]][["task", "shots", "control", "index"]].reset_index(drop=True)
        parts.append(keys.assign(**{h: pooled({n: g[h].to_numpy(np.float64) for n, g in per.items()}, names)
                                    for h in ("hits1", "hits3")}, condition=f"random-{v}", variant=v))
    rows = pd.concat(parts, ignore_index=True)
    return summarize_hits(rows, by=("condition", "shots", "control"))


def drops_by_measure(probe_rows: pd.DataFrame, icl: dict, conditions: Sequence[Condition], variants: dict[str, str],
                     shots: int) -> pd.DataFrame:
    """Relative drop per ablation of HITS@1 at ``shots`` shots (prompts of all tasks as units), of
    the ICL benefit (held-out windows) and of the induction benefit (random sequences):
    :func:`~inductionlab.measures.load_bearing_eval.drops_table` rows with a ``measure`` column."""
    if not conditions:
        return pd.DataFrame()
    measures: dict[str, dict[str, np.ndarray]] = {f"hits1_{shots}shot": {}, **{n: {} for n in SEQUENCE_MEASURES}}
    sel = probe_rows[(probe_rows.shots == shots) & (probe_rows.control == "intact")]
    for name, g in sel.groupby("condition", sort=False):
        measures[f"hits1_{shots}shot"][name] = g.sort_values(["task", "index"])["hits1"].to_numpy(np.float64)
    for n, values in per_sequence(icl["intact"]).items():
        if values is not None:
            measures[n]["intact"] = np.asarray(values, np.float64)
    for c in conditions:
        for n in SEQUENCE_MEASURES:
            if icl[c.name].get(n) is not None and "intact" in measures[n]:
                measures[n][c.name] = np.asarray(icl[c.name][n], np.float64)
    kinds = {c.name: c for c in conditions}
    out = []
    for measure, per in measures.items():
        if "intact" not in per:
            continue
        tidy = []
        for name, values in per.items():
            c = kinds.get(name)
            tidy.append(pd.DataFrame({"variant": variants.get(name, "intact"), "kind": c.kind if c else "intact",
                                      "draw": c.draw if c else 0, "unit": np.arange(len(values)), "value": values}))
        d = drops_table(pd.concat(tidy, ignore_index=True))
        out.append(d.assign(measure=measure))
    res = pd.concat(out, ignore_index=True)
    return res[["measure", *[c for c in res.columns if c != "measure"]]]


def icl_table(icl: dict, conditions: Sequence[Condition], variants: dict[str, str]) -> pd.DataFrame:
    """Per condition (and each variant's pooled random draws): ICL benefit and induction benefit
    (nats) with 95% CIs over sequences; the intact row also the ICL score, late/early losses and positions."""
    intact = icl["intact"]
    r, shown = {"condition": "intact", "variant": "intact"}, set()
    for n, m in SEQUENCE_MEASURES.items():
        s = intact.get(m.summary)
        if s is None:
            continue
        if m.summary not in shown:                       # a summary's own numbers before its first measure
            shown.add(m.summary)
            r.update(_INTACT_EXTRAS.get(m.summary, lambda s: {})(s))
        put_ci(r, n, s["per_sequence"][m.key])
    rows = [r]
    arms = [(c.name, variants[c.name], [c.name]) for c in conditions]
    arms += [(f"random-{v}", v, names) for v, names in draws_by_variant(conditions, variants).items()]
    for name, v, members in arms:
        r = {"condition": name, "variant": v}
        for k in SEQUENCE_MEASURES:
            if icl[members[0]].get(k) is not None:
                put_ci(r, k, pooled({m: np.asarray(icl[m][k], np.float64) for m in members}, members))
        rows.append(r)
    return pd.DataFrame(rows)


#: The intact row's numbers of a summary beyond its per-sequence measures: the ICL score with its
#: losses and positions; the induction loss on each copy.
_INTACT_EXTRAS = {
    "icl": lambda s: dict(icl_score=s["score"], icl_score_ci_low=s["ci_low"], icl_score_ci_high=s["ci_high"],
                          loss_late=s["loss_late"], loss_early=s["loss_early"], late=s["late"], early=s["early"],
                          window=s["window"]),
    "induction": lambda s: dict(first_copy=s["first_copy"], second_copy=s["second_copy"]),
}


def lm_eval_metrics(results: dict) -> dict[tuple[str, str], float]:
    """``(task, metric) -> value`` of one lm-eval run's ``results``: its ``metric,filter`` entries (``acc,none``),
    stderr, alias and sample counts left out."""
    return {(t, k): float(v) for t, m in results.items() for k, v in m.items()
            if "," in k and "_stderr" not in k and isinstance(v, (int, float)) and not isinstance(v, bool)}


def lm_eval_drops(intact: dict | None, ablated: dict[str, dict | None], conditions: Sequence[Condition],
                  variants: dict[str, str]) -> pd.DataFrame:
    """The lm-eval tasks' metrics intact and under each ablation condition, with their drop vs intact.

    One row per task × metric × condition, in the order intact, then the conditions, then each variant's
    random draws pooled (``random-<variant>``, kind ``random-pooled``: the mean of the draws' values):
    ``task, metric, condition, variant, kind, draw, n_heads, value, intact, drop`` (``intact − value``: positive
    when the ablation lowered the metric) and ``relative_change`` (``value / intact − 1``; NaN when intact is 0).
    Per-document values are not kept by lm-eval's aggregate, so no CI here (the probes' drop table has them).

    Args:
        intact: :func:`~inductionlab.protocols.lm_eval_tasks.run_lm_eval` of the intact model (None: no tasks).
        ablated: condition name -> its run (the model type ``inductionlab``); conditions without one are skipped."""
    cols = ["task", "metric", "condition", "variant", "kind", "draw", "n_heads", "value", "intact", "drop",
            "relative_change"]
    if not intact:
        return pd.DataFrame(columns=cols)
    base = lm_eval_metrics(intact["results"])
    runs = {c.name: lm_eval_metrics(ablated[c.name]["results"]) for c in conditions if ablated.get(c.name)}
    arms = [("intact", "intact", "intact", 0, 0, base)]
    arms += [(c.name, variants[c.name], c.kind, c.draw, len(c.heads), runs[c.name]) for c in conditions if c.name in runs]
    for v, names in draws_by_variant(conditions, variants).items():
        members = [n for n in names if n in runs]
        if members:
            n_heads = next(len(c.heads) for c in conditions if c.name == members[0])
            arms.append((f"random-{v}", v, "random-pooled", None, n_heads,
                         {key: float(np.mean([runs[n][key] for n in members])) for key in base}))
    rows = []
    for (task, metric), ref in base.items():
        for name, v, kind, draw, n_heads, values in arms:
            if (task, metric) in values:
                x = values[(task, metric)]
                rows.append({"task": task, "metric": metric, "condition": name, "variant": v, "kind": kind,
                             "draw": draw, "n_heads": n_heads, "value": x, "intact": ref, "drop": ref - x,
                             "relative_change": x / ref - 1 if ref else float("nan")})
    return pd.DataFrame(rows, columns=cols)


def draws_by_variant(conditions: Sequence[Condition], variants: dict[str, str]) -> dict[str, list[str]]:
    """``variant -> names`` of its random draws (variants and draws in run order), the members of
    each pooled ``random-<variant>`` arm."""
    out: dict[str, list[str]] = {}
    for c in conditions:
        if c.kind == "random":
            out.setdefault(variants[c.name], []).append(c.name)
    return out


__all__ = ["SEQUENCE_MEASURES", "SequenceMeasure", "per_sequence", "load_bearing_conditions", "hits_table", "drops_by_measure", "icl_table", "draws_by_variant",
           "lm_eval_metrics", "lm_eval_drops"]
