"""Study bi-induct, phase 3 ``evaluate``: the bridge to :mod:`inductionlab.studies.evaluate`: one final
checkpoint evaluated (the evaluation study, run by the engine like any study) and condensed to what the
study compares (:func:`evaluate_checkpoint`). The evaluation study (and torch) is imported on first use."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

# ---- phase 3: evaluation (`inductionlab evaluate` on every final checkpoint) -----------------------

def evaluate_checkpoint(ckpt: Path, ecfg, out: Path, calibration_lengths=()) -> dict:
    """``inductionlab evaluate`` (:func:`inductionlab.studies.evaluate.run_evaluate`) of one trained
    checkpoint with the config ``ecfg`` into ``out`` (resumable there), condensed to what the study
    compares: macro HITS@1/@3 per shots of the intact model, the ICL score, the perplexity guard, the max
    induction score at each of ``calibration_lengths``, and the relative changes of the ICL benefit (and of
    HITS@1, the induction benefit) under the top-2%-per-layer ablation vs matched random heads. Returns a
    JSON-able dict."""
    from ..evaluate import SEQUENCE_MEASURES, run_evaluate
    from ...core.models import load_model
    from ..spec import RunOptions

    loaded = load_model(str(ckpt), dtype="float32")    # the study's numbers, the same on every CPU
    res = run_evaluate(loaded, ecfg, out, RunOptions(progress=False))
    calibration = {}
    if calibration_lengths:                            # max induction at several |S| (issue 19: not only one)
        from ...core.scores import compute_head_scores

        for T in calibration_lengths:              # the evaluation's own token pool (the shards' ids)
            hs = compute_head_scores(loaded.model, tokenizer=loaded.tokenizer, seq_len=int(T), batch_size=32,
                                     seed=ecfg.seed + 1, names=("induction",), pool=res.pool, induction_loss=False)
            calibration[str(int(T))] = float(np.max(hs.scores["induction"]))
    h = res.hits
    macro = h[(h["condition"] == "intact") & (h["task"] == "macro")]
    icl = res.icl_summary.set_index("condition").loc["intact"]
    pct = ecfg.load_bearing.ablate[0]
    d = res.drops[res.drops["variant"] == pct] if len(res.drops) else res.drops

    def drop(measure: str, kind: str) -> dict:
        r = d[(d["measure"] == measure) & (d["kind"] == kind) & (d["draw"].astype(str).isin(["0", "pooled"]))]
        if kind == "random":
            r = r[r["draw"].astype(str) == "pooled"]
        keys = ["intact", "relative", "ci_low", "ci_high", "absolute", "absolute_ci_low", "absolute_ci_high"]
        return {k: (None if k not in r or pd.isna(r.iloc[0][k]) else float(r.iloc[0][k])) for k in keys} \
            if len(r) else dict.fromkeys(keys)

    ablation = {"variant": pct, "method": ecfg.load_bearing.method,
                "heads": [c.heads for c in res.conditions if c.kind == "induction"][0],
                **{m: {"induction": drop(m, "induction"), "random": drop(m, "random"),
                       "contrast": drop(m, "induction-random")}
                   for m in (f"hits1_{ecfg.load_bearing.shots}shot", *SEQUENCE_MEASURES)}}
    return {"checkpoint": str(ckpt), "evaluate_dir": str(out),
            "probes": macro[["shots", "control", "n", "hits1", "hits1_ci_low", "hits1_ci_high", "hits3",
                             "hits3_ci_low", "hits3_ci_high"]].to_dict(orient="records"),
            "icl": {"score": float(icl["icl_score"]), "ci_low": float(icl["icl_score_ci_low"]),
                    "ci_high": float(icl["icl_score_ci_high"]), "benefit": float(icl["icl_benefit"]),
                    "late": int(icl["late"]), "early": int(icl["early"]),
                    "induction_benefit": float(icl["induction_benefit"]),
                    "copy_accuracy": float(icl["copy_accuracy"]), "recall_accuracy": float(icl["recall_accuracy"])},
            "calibration_max_induction": calibration,
            "perplexity": {k: res.perplexity[k] for k in ("perplexity", "nll_per_token", "n_scored", "context")},
            "ablation": ablation, "notes": res.notes}
