"""Study bi-induct, its tables: one row per run (:func:`runs_table`, from the pieces ``train/<run>``
and ``eval/<run>``) and one per variant (:func:`variants_table`, mean [95% t-CI] over seeds by
:func:`~inductionlab.studies.bi_induct.verdicts.seed_ci`)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .config import VARIANTS
from .verdicts import _fmt, seed_ci

def _f(x) -> float:
    return float("nan") if x is None else float(x)


def runs_table(pieces: dict[str, dict], evals: dict[str, dict]) -> pd.DataFrame:
    """One row per run: variant, seed, emergence, final and peak scores, perplexities, probes, drops."""
    from ...train.telemetry import predicted_emergence
    rows = []
    for name, p in pieces.items():
        v, s = name.rsplit("-s", 1)
        r = p["results"]
        law = predicted_emergence(p["budget"]["global_batch"], p["budget"]["seq_len"])
        summ = pd.DataFrame(p["summary"])
        peak = summ.groupby("score")["max"].max()
        row = {"run": name, "variant": v, "seed": int(s), "tokens": p["budget"]["tokens"],
               "steps": p["budget"]["steps"], "flops": p["budget"]["flops"], "train_time_s": p["train_time_s"],
               "emergence_step": r.get("emergence_step"), "emergence_tokens": r.get("emergence_tokens"),
               "law_emergence_tokens": law["tokens"], "law_emergence_steps": law["updates"],
               "final_max_induction": r["final"]["induction"]["max"],
               "final_top2pct_induction": r["final"]["induction"]["top2pct_mean"],
               "peak_max_induction": float(peak.get("induction", np.nan)),
               "final_max_anti_induction": r["final"]["anti_induction"]["max"],
               "peak_max_anti_induction": float(peak.get("anti_induction", np.nan)),
               "final_max_copy_offset": r["final"]["copy_offset"]["max"],
               "final_max_copy_offset_control": r["final"]["copy_offset_control"]["max"],
               "telemetry_heldout_ppl": r.get("final_heldout_ppl")}
        e = evals.get(name)
        if e:
            macro = {(int(m["shots"]), m["control"]): m for m in e["probes"]}
            for k in (1, 10):
                m = macro.get((k, "intact"), {})
                row[f"hits1_{k}shot"] = m.get("hits1", np.nan)
                row[f"hits3_{k}shot"] = m.get("hits3", np.nan)
            for T, v in (e.get("calibration_max_induction") or {}).items():
                row[f"final_max_induction_S{T}"] = v
            row.update(copy_accuracy=e["icl"].get("copy_accuracy", np.nan),
                       recall_accuracy=e["icl"].get("recall_accuracy", np.nan))
            for m in ("icl_benefit", "copy_accuracy", "recall_accuracy"):
                ab = e["ablation"].get(m)
                if ab is None:
                    continue
                for kind in ("induction", "random", "contrast"):
                    row[f"abs_{m}_{kind}"] = _f(ab[kind].get("absolute"))
                    row[f"rel_{m}_{kind}"] = _f(ab[kind].get("relative"))
            row.update(icl_score=e["icl"]["score"], icl_benefit=e["icl"]["benefit"],
                       ppl=e["perplexity"]["perplexity"],
                       drop_induction=_f(e["ablation"]["icl_benefit"]["induction"]["relative"]),
                       drop_random=_f(e["ablation"]["icl_benefit"]["random"]["relative"]),
                       drop_contrast=_f(e["ablation"]["icl_benefit"]["contrast"]["relative"]),
                       drop_contrast_ci_low=_f(e["ablation"]["icl_benefit"]["contrast"]["ci_low"]),
                       drop_contrast_ci_high=_f(e["ablation"]["icl_benefit"]["contrast"]["ci_high"]))
        rows.append(row)
    return pd.DataFrame(rows).sort_values(["variant", "seed"], key=lambda c: c.map(
        {v: i for i, v in enumerate(VARIANTS)}) if c.name == "variant" else c).reset_index(drop=True)


def variants_table(t: pd.DataFrame) -> list[dict]:
    """Per variant: emergence tokens (seeds that emerged; ``never`` the others), final and peak
    scores, perplexity, probes: each ``mean [95% t-CI]`` over seeds (:func:`seed_ci`)."""
    cols = ["final_max_induction", *[c for c in t.columns if c.startswith("final_max_induction_S")],
            "peak_max_anti_induction", "ppl", "telemetry_heldout_ppl", "recall_accuracy", "copy_accuracy",
            "icl_benefit"]
    rows = []
    for v in VARIANTS:
        g = t[t.variant == v]
        if not len(g):
            continue
        em = g["emergence_tokens"].astype(float)
        r = {"variant": v, "seeds": int(len(g)), "never": int(em.isna().sum()),
             "emergence_tokens": _fmt(seed_ci(em.dropna().to_numpy()), 0).replace("+", "") if em.notna().any()
             else "never"}
        for c in cols:
            if c in g and g[c].notna().any():
                r[c] = _fmt(seed_ci(g[c].dropna().astype(float).to_numpy()), 3).replace("+", "")
        rows.append(r)
    return rows
