"""The run directory of ``inductionlab study head-types``: tables, figures, report.md, and the lines the command
prints. Reads a finished :class:`~inductionlab.studies.head_types.study.HeadTypesStudy`; no model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ...runtime.runs import atomic_write_text
from .. import plots
from ..report import VIEW_LINE, fmt_ci, model_line, verdict_lines
from ..token_loss import report_lines as token_loss_lines
from .verdicts import MEASURES, y2_measure

ZS, FVEC, RVEC = "zero-shot", "function vector", "random heads' vector"     # the vectors of study._fv_check


def head_table(res) -> pd.DataFrame:
    """Per head: every attention-pattern score, the FV score (AIE over tasks and prompts, signed) and, when the
    dual-route step ran, ``concept_copying``, ``token_copying``, ``concept_attention``, ``token_attention``; with
    ``--cmr`` also ``cmr_distance`` (NaN for a flat profile) and ``cmr_like`` = 1 / (1 + distance) (0 for a flat
    profile): higher = more CMR-like, so ``--rank-by cmr_like`` ranks the most CMR-like heads first."""
    hs, aie = res.scores, res.fv.aie()
    route = {} if getattr(res, "route", None) is None else res.route.scores()
    L, H = aie.shape
    df = pd.DataFrame([{"layer": l, "head": h, **{n: float(v[l, h]) for n, v in hs.scores.items()},
                        "fv": float(aie[l, h]), **{n: float(v[l, h]) for n, v in route.items()}}
                       for l in range(L) for h in range(H)])
    if res.cmr is not None:
        d = np.asarray(res.cmr["distance"], float)
        df["cmr_distance"] = d.ravel()
        df["cmr_like"] = np.nan_to_num(1.0 / (1.0 + d), nan=0.0).ravel()
    return df


def _route_lines(res) -> list[str]:
    """The dual-route section: definitions, cost, the top heads of each score."""
    r = res.route
    if r is None:
        return []
    p, rec = r.params, res.record["dual_route"]
    c = p["cost"]
    lines = ["## Concept and token induction heads", "",
             f"Feucht et al. 2025's scores: a head's clean output at −2 patched from `[BOS] R e \\n R e₀` into "
             f"`[BOS] R′ \\n R e₀`; concept copying = ΔP(e₁ at −1) on {r.word.shape[0]} words of "
             f"{', '.join(map(str, p['lengths']))} tokens from this tokenizer, token copying = ΔP(e₀ at −2) on as many "
             f"random-token words; value-weighted attention (a·‖v‖, renormalised) from the last position of "
             f"`[BOS] R₁ e R₂ \\n R₁` to the word's first (token) and last (concept) token, {r.attention.shape[0]} "
             f"prompts. Mean P(e₁) corrupted {rec['p_corrupt']['word_p_e1']:.4f}, P(e₀) corrupted "
             f"{rec['p_corrupt']['random_p_e0']:.4f}. Cost {c['seconds']:.1f} s, {c['ratio']:.1f}× one bare forward of "
             f"each of its {c['bare_forwards']} prompts ({c['bare_forward_seconds']:.2f} s).", "",
             "| rank | " + " | ".join(rec["top"]) + " |", "|---|" + "---|" * len(rec["top"])]
    for i in range(min(10, len(next(iter(rec["top"].values()))))):
        lines.append(f"| {i + 1} | " + " | ".join(f"L{t[i]['layer']}H{t[i]['head']} {t[i]['score']:.2g}"
                                                 for t in rec["top"].values()) + " |")
    return lines + [""]


def cmr_fit_table(res) -> pd.DataFrame:
    """Per head (``--cmr``): CMR distance, fitted β_enc, β_rec, γ_ft, whether CMR-like (distance < 0.5), and the
    attention CRP's value at lags −1, 0, +1; sorted by distance."""
    c = res.cmr
    L, H, _ = c["profile"].shape
    lag = {int(v): i for i, v in enumerate(c["lags"])}
    rows = [{"layer": l, "head": h, "cmr_distance": float(c["distance"][l, h]), "beta_enc": float(c["beta_enc"][l, h]),
             "beta_rec": float(c["beta_rec"][l, h]), "gamma_ft": float(c["gamma_ft"][l, h]),
             "cmr_like": bool(c["distance"][l, h] < 0.5),
             **{f"attention_lag{d:+d}": float(c["profile"][l, h, lag[d]]) for d in (-1, 0, 1)}}
            for l in range(L) for h in range(H)]
    return pd.DataFrame(rows).sort_values("cmr_distance", kind="stable", na_position="last").reset_index(drop=True)


def head_crp_table(res) -> pd.DataFrame:
    """Long table (``--cmr``): layer, head, lag, attention (the attention CRP)."""
    c = res.cmr
    L, H, n = c["profile"].shape
    l, h, k = np.meshgrid(np.arange(L), np.arange(H), np.arange(n), indexing="ij")
    return pd.DataFrame({"layer": l.ravel(), "head": h.ravel(), "lag": np.asarray(c["lags"])[k.ravel()],
                         "attention": c["profile"].ravel()})


def cmr_panels(res, top: int) -> pd.DataFrame:
    """The figure's rows: the ``top`` heads by CMR distance, lags −5..5, the profile and the fitted CRP scaled as
    the distance compares them (min-shifted, matched to the profile's range, plus the profile's minimum)."""
    from ...measures.cmr import SELECT_RANGE
    c = res.cmr
    lags = np.asarray(c["lags"])
    sel = np.abs(lags) <= SELECT_RANGE
    order = cmr_fit_table(res).dropna(subset=["cmr_distance"]).head(top)
    rows = []
    for r in order.itertuples():
        x = c["profile"][r.layer, r.head][sel]
        f = c["fitted_crp"][r.layer, r.head][sel]
        f = (f - f.min()) * (x.max() - x.min()) / (f.max() - f.min()) + x.min()
        rows += [{"layer": r.layer, "head": r.head, "lag": int(g), "attention": float(a), "cmr": float(b),
                  "cmr_distance": r.cmr_distance, "beta_enc": r.beta_enc, "beta_rec": r.beta_rec,
                  "gamma_ft": r.gamma_ft} for g, a, b in zip(lags[sel], x, f)]
    return pd.DataFrame(rows)


def _cmr_lines(res) -> list[str]:
    rec = res.record["cmr"]
    g = rec["grid"]
    t = cmr_fit_table(res)
    made = "from the cache" if g["from_cache"] else f"computed in {g['seconds']:.0f} s"
    lines = ["## CMR-like heads", "",
             "Attention CRP per head: raw attention probability from each second-copy query of `[BOS] S S` to the "
             "first-copy key at each lag from the query token's earlier occurrence (induction heads peak at +1), "
             "fitted to CMR's CRP over the grid β_enc 0.05…1 × β_rec 0…1 × γ_ft 0…1 (20 × 21 × 11) by the CMR "
             "distance on lags −5..5 (Ji-An et al. 2024). CMR-like: distance < 0.5. "
             f"Grid: {g['n_exps']} simulated runs per start × {g['n_starts']} starts per cell ({made}).",
             "", f"CMR-like heads: {rec['n_cmr_like']} of {len(t)}. Share per layer: "
             + ", ".join(f"L{i} {v:.2f}" for i, v in enumerate(rec["share_per_layer"])) + ".", "",
             "| head | distance | β_enc | β_rec | γ_ft | attention at −1 / 0 / +1 |", "|---|---|---|---|---|---|"]
    for _, r in t.head(10).iterrows():
        lines.append(f"| L{r['layer']}H{r['head']} | {r['cmr_distance']:.3f} | {r['beta_enc']:.2f} | "
                     f"{r['beta_rec']:.2f} | {r['gamma_ft']:.1f} | {r['attention_lag-1']:.3f} / "
                     f"{r['attention_lag+0']:.3f} / {r['attention_lag+1']:.3f} |")
    return lines + [""]


def attribution_table(res) -> pd.DataFrame:
    """Per head (unless ``--no-attribution``): the exact AIE, AtP's estimate of it, the mean DLA (``dla``: the
    roles' direction, answer logit minus the mean logit; ``dla_logit``: the answer's logit) and the role
    (``writer``, ``canceller``, ``indirect`` or empty;
    :func:`~inductionlab.studies.head_types.study.attribution_roles`)."""
    rec = res.record["attribution"]
    aie, atp = res.fv.aie(), np.asarray(rec["atp"], float)
    dla, logit = np.asarray(rec["dla"]["mean"], float), np.asarray(rec["dla"]["logit"], float)
    role = {(h["layer"], h["head"]): name.removesuffix("s") for name in ("writers", "cancellers", "indirect")
            for h in rec["roles"][name]}
    L, H = aie.shape
    return pd.DataFrame([{"layer": l, "head": h, "aie": float(aie[l, h]), "atp": float(atp[l, h]),
                          "dla": float(dla[l, h]), "dla_logit": float(logit[l, h]), "role": role.get((l, h), "")}
                         for l in range(L) for h in range(H)])


def _attribution_lines(res) -> list[str]:
    """The attribution section: AtP's agreement with the exact AIE, its cost, and the DLA-vs-AIE table of the heads
    given a role."""
    rec = res.record.get("attribution")
    if rec is None:
        return []
    a, c, rule = rec["agreement"], rec["cost"], rec["roles"]["rule"]
    recall = ", ".join(f"top-{r['label']} recall {r['recall']:.2f}" for r in a["recall"])
    misses = "; ".join(f"L{m['layer']}H{m['head']} (exact rank {m['exact_rank']}, AtP {m['estimate_rank']})"
                       for m in a["misses"]) or "none"
    cost = (f"AtP {c['atp_seconds']:.1f} s against {c['fv_cie_seconds']:.1f} s for the exact CIEs "
            f"({c['atp_vs_fv_cie']:.2f}×)" if c["atp_vs_fv_cie"] is not None else
            f"AtP {c['atp_seconds']:.1f} s (the FV pieces predate their timing)")
    lines = ["## Attribution", "",
             "Attribution patching (AtP, Kramár et al. 2024) estimates each head's CIE from one forward and one "
             "backward pass of each corrupted prompt (same prompts, task means and metric P(answer) as the FV "
             "score); direct logit attribution (DLA) reads each head's last-position output on the clean prompts "
             "through the final norm (scale frozen) onto the answer's logit minus the mean logit. "
             "Guide: docs/attribution.md.", "",
             f"**AtP vs exact AIE** over {res.fv.aie().size} heads: Spearman ρ {a['spearman']:+.3f}, {recall}; "
             f"largest misses: {misses}. Cost: {cost}; DLA {c['dla_seconds']:.1f} s.", "",
             f"Roles: large AIE = the top {rule['top_aie']} by signed AIE, AIE > 0; small DLA = |DLA| below the median "
             f"({rule['small_dla_below']:.3g}). Writers: large AIE, DLA > 0, not small; indirect: large AIE, small "
             f"DLA; cancellers: the most negative DLA, not small.", "",
             "| head | role | AIE | AtP | DLA |", "|---|---|---|---|---|"]
    t = attribution_table(res)
    named = t[t.role != ""].copy()
    named["order"] = named.role.map({"writer": 0, "indirect": 1, "canceller": 2})
    for r in named.sort_values(["order", "aie"], ascending=[True, False]).itertuples():
        lines.append(f"| L{r.layer}H{r.head} | {r.role} | {r.aie:+.3g} | {r.atp:+.3g} | {r.dla:+.3g} |")
    if named.empty:
        lines.append("| (none) | | | | |")
    return lines + ["", "Per head: `attribution.csv`; figure: `dla_vs_aie.png`.", ""]


def fv_check_table(res) -> pd.DataFrame:
    return pd.DataFrame([{k: v for k, v in r.items() if k != "hits1_per_prompt"} for r in res.fv_check["rows"]])


def _fv_check_lines(res) -> list[str]:
    t = fv_check_table(res)
    lines = [f"Zero-shot HITS@1 with a vector added to the residual stream after layer {res.fv_check['layer']} at the "
             f"last position (Todd et al.'s check that the top heads carry the task): the function vector of the top "
             f"{len(res.fv_check['top_heads'])} heads by AIE, and the same built from as many random heads.", "",
             "| task | zero-shot | + function vector | + random heads' vector |", "|---|---|---|---|"]
    for task, g in t.groupby("task", sort=False):
        v = dict(zip(g.vector, g.hits1))
        lines.append(f"| {task} | {v[ZS]:.2f} | {v[FVEC]:.2f} | {v[RVEC]:.2f} |")
    m = t.groupby("vector", sort=False).hits1.mean()
    lines.append(f"| **mean** | {m[ZS]:.3f} | {m[FVEC]:.3f} | {m[RVEC]:.3f} |")
    return lines


def report(res) -> str:
    idn, cfg = res.record["model"], res.config
    p = res.record["params"]
    fv = res.fv
    lines = [f"# inductionlab study head-types — {idn['name']}", "", model_line(idn), "",
             "Which heads carry in-context learning: function-vector (FV) heads and induction heads, scored, compared "
             "and ablated with and without excluding the other ranking's top heads (Yin & Steinhardt 2025). "
             "Guide: docs/study-head-types.md.", "", VIEW_LINE, ""]
    lines += verdict_lines(res.verdicts, "studies/head_types/verdicts.py")
    if "token_loss" in res.record:
        lines += [""] + token_loss_lines(res.record["token_loss"])
    lines += ["", "## FV heads", "",
              f"AIE = mean over {len(fv.tasks)} tasks × {fv.cie.shape[1]} prompts ({cfg.fv.shots} shots, labels "
              "deranged) of P(answer's first token) after setting the head's last-position output to its mean over "
              "the task's clean prompts, minus before (Todd et al. 2024). 95% CIs over prompts (tasks independent). "
              f"Tasks: {', '.join(fv.tasks)}. Mean P(answer) clean {np.mean(fv.p_clean):.3f}, corrupted "
              f"{np.mean(fv.p_base):.3f}.", "",
              "| rank | head | AIE [95% CI] | induction score |", "|---|---|---|---|"]
    for i, h in enumerate(res.record["top_fv_heads"], 1):
        lines.append(f"| {i} | L{h['layer']}H{h['head']} | {fmt_ci(h['aie'], h['ci_low'], h['ci_high'], 4)} | "
                     f"{h['induction']:.3f} |")
    low = res.record["bottom_fv_heads"][:3]
    lines += ["", "Heads that lower the answer most (signed AIE; arXiv 2606.07560's cancellers): " +
              ", ".join(f"L{h['layer']}H{h['head']} {h['aie']:+.4f}" for h in low) + ". By |AIE| the top 10 are: " +
              ", ".join(f"L{h['layer']}H{h['head']}" for h in res.record["top_fv_heads_absolute"]) + ".", ""]
    lines += _fv_check_lines(res)
    lines += [""] + _attribution_lines(res)
    lines += _route_lines(res)
    lines += ["## Overlap of the rankings", "",
              "| A | B | top-5% heads | shared | expected | P(X ≥ shared) | A's top 2% percentile in B | "
              "B's top 2% percentile in A | Spearman |", "|---|---|---|---|---|---|---|---|---|"]
    for r in res.overlap.itertuples():
        lines.append(f"| {r.a} | {r.b} | {r.n_top} | {r.overlap} | {r.expected:.2f} | {r.p_value:.3g} | "
                     f"{r.a_top_pct_in_b:.0f} | {r.b_top_pct_in_a:.0f} | {r.spearman:+.2f} |")
    lines += ["", "## Ablation", "",
              f"Fractions of all heads {', '.join(f'{100 * f:g}%' for f in p['fractions'])} (counts "
              f"{', '.join(str(v) for v in p['counts'].values())}"
              + (f"; dropped as duplicate counts: {', '.join(f'{100 * f:g}%' for f in p['fractions_dropped'])}"
                 if p["fractions_dropped"] else "") +
              f"); exclusion of the other ranking's top {100 * cfg.selection.exclude_fraction:g}% "
              f"({_excluded(res.record)}); "
              f"{cfg.selection.n_draws} random draws per count over "
              f"{'all heads' if cfg.selection.random == 'all' else 'heads outside the top N by induction score'}. "
              f"HITS@1: {cfg.probes.n_prompts} 10-shot prompts per task; ICL benefit: "
              f"{res.record['token_loss']['n_windows']} windows, "
              f"{cfg.icl.method} ablation; lag probe: {res.lag.config.n_permutations} lists, {res.lag.config.method} "
              "ablation. Drop = intact − ablated, paired over the same trials, 95% CI.", ""]
    for m, label in MEASURES.items():
        d = res.drops[res.drops.measure == m]
        if d.empty:
            continue
        lines += [f"**{label}** (intact {d.intact.iloc[0]:.3f})", "",
                  "| heads | " + " | ".join(sorted(d.kind.unique(), key=_kind_order)) + " |",
                  "|---|" + "---|" * d.kind.nunique()]
        for k, g in d.groupby("k"):
            cells = {r.kind: fmt_ci(r.drop, r.drop_ci_low, r.drop_ci_high) for r in g.itertuples()}
            lines.append(f"| {k} | " + " | ".join(cells.get(kd, "") for kd in sorted(d.kind.unique(), key=_kind_order))
                         + " |")
        lines.append("")
    if res.cmr is not None:
        lines += _cmr_lines(res)
    lines += ["## Timings", ""] + [f"- {k.removesuffix('_s')}: {v:.1f} s" for k, v in res.timings.items()]
    lines += ["", "Files: `results.json`, `fv_scores.csv` (per head and task), `head_scores.csv` (with the `fv` "
              "column and, unless --no-dual-route, the four dual-route columns), `route_scores.csv` (with CIs), "
              "`route_scatter.png`, `drops.csv`, `overlap.csv`, `fv_check.csv`, `probe_rows.csv`, `icl_rows.csv`, "
              "`fv_heatmap.png`, `scores_scatter.png`, `drop_vs_fraction.png`, `head_scores.png`"
              + (", `attribution.csv`, `dla_vs_aie.png`" if res.record.get("attribution") is not None else "")
              + ("; with --cmr: `cmr_fit.csv`, `head_crp.csv`, `cmr_fits.png` and the `cmr_distance`, `cmr_like` "
                 "columns of `head_scores.csv`" if res.cmr is not None else "") + ".", ""]
    return "\n".join(lines)


def _kind_order(kind: str) -> int:
    order = ["induction", "induction-excl-fv", "fv", "fv-excl-induction", "random"]
    return order.index(kind) if kind in order else len(order)


def write(out: Path, res) -> None:
    """The run directory's files (the engine writes results.json and timing.json after them)."""
    name = res.loaded.identity["name"]
    heads = head_table(res)
    for df, f in ((res.fv.table(), "fv_scores.csv"), (heads, "head_scores.csv"), (res.drops, "drops.csv"),
                  (res.overlap, "overlap.csv"), (fv_check_table(res), "fv_check.csv"), (res.probes, "probe_rows.csv"),
                  (res.icl, "icl_rows.csv")):
        atomic_write_text(out / f, df.to_csv(index=False))
    plots.signed_heatmap(res.fv.aie(), out / "fv_heatmap.png", title=f"{name}: FV score (AIE) per head")
    plots.head_heatmaps(res.scores.scores, out / "head_scores.png", title=name)
    plots.score_scatter(res.scores["induction"], res.fv.aie(), out / "scores_scatter.png", "induction score",
                        "FV score (AIE)")
    if res.record.get("attribution") is not None:
        atomic_write_text(out / "attribution.csv", attribution_table(res).to_csv(index=False))
        plots.score_scatter(np.asarray(res.record["attribution"]["dla"]["mean"]), res.fv.aie(), out / "dla_vs_aie.png",
                            "DLA (answer logit − mean logit)", "FV score (AIE)")
    if getattr(res, "route", None) is not None:
        atomic_write_text(out / "route_scores.csv", res.route.table().to_csv(index=False))
        plots.route_scatter(res.route.score("token_copying"), res.route.score("concept_copying"),
                            out / "route_scatter.png", title=f"{name}: concept vs token induction")
    plots.drop_vs_fraction(res.drops, plotted_measures(res.drops, res.icl), out / "drop_vs_fraction.png",
                           title=f"{name}: drop under ablation")
    if res.cmr is not None:
        atomic_write_text(out / "cmr_fit.csv", cmr_fit_table(res).to_csv(index=False))
        atomic_write_text(out / "head_crp.csv", head_crp_table(res).to_csv(index=False))
        panels = cmr_panels(res, res.config.cmr.top)
        if len(panels):
            plots.cmr_fits(panels, out / "cmr_fits.png", title=f"{name}: attention CRPs and CMR fits (lowest distance)")
    atomic_write_text(out / "report.md", report(res))


def plotted_measures(drops: pd.DataFrame, icl: pd.DataFrame) -> dict[str, str]:
    """The panels of ``drop_vs_fraction.png`` (measure -> title): HITS@1 (mean ablation), the ICL score Y2 decides
    on (:func:`verdicts.y2_measure` of the ICL rows ``icl``) and the temporal factor."""
    have = set(drops.measure)
    return {m: MEASURES[m] for m in ("hits1_mean", y2_measure(icl), "temporal_factor") if m in have}


def summary(res) -> list[str]:
    """What the command prints when it is done: the FV top 5, the overlap, the verdicts."""
    lines = [f"Top FV heads ({res.loaded.identity['name']}), AIE [95% CI]:"]
    lines += [f"  L{h['layer']:<2d} H{h['head']:<2d} {fmt_ci(h['aie'], h['ci_low'], h['ci_high'], 4)}"
              for h in res.record["top_fv_heads"][:5]]
    r = res.overlap.iloc[0]
    lines += ["", f"Top-5% induction ∩ FV: {r.overlap} of {r.n_top} (chance {r.expected:.2f}, P = {r.p_value:.3g})", ""]
    for r in res.overlap[res.overlap.a.isin(["induction", "concept_copying"]) &
                         res.overlap.b.isin(["token_copying", "token_attention"])].itertuples():
        lines.insert(-1, f"Spearman {r.a} vs {r.b}: {r.spearman:+.2f} (P = {r.spearman_p:.3g})")
    att = res.record.get("attribution")
    if att is not None:
        a = att["agreement"]
        lines.insert(-1, f"AtP vs exact AIE: Spearman {a['spearman']:+.3f}, "
                     + ", ".join(f"top-{r['label']} recall {r['recall']:.2f}" for r in a["recall"]))
    lines += [f"{v.claim} {v.status}: {v.evidence}" + (f" [power: {v.power_line}]" if v.power else "")
              for v in res.verdicts]
    return lines


def _excluded(record: dict) -> str:
    """How many heads the exclusion removed (records before issue 36 have no count: the rule then was int(f·N))."""
    e = record.get("exclusion")
    if not e:
        return "count not recorded"
    n = e["heads_excluded"]
    return f"{n} of {e['of_heads']} head{'s' if n != 1 else ''}"
