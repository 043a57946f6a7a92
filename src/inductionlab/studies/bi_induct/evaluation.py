"""Study bi-induct, phase 3 ``evaluate``: the bridge to :mod:`inductionlab.studies.evaluate`: a preset's
evaluation recipe as an :class:`~inductionlab.studies.evaluate.EvaluateConfig`
(:func:`evaluation_config`) and one final checkpoint evaluated and condensed (:func:`evaluate_checkpoint`).
The evaluation study (and torch) is imported inside the functions, on first use."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

# ---- phase 3: evaluation (`inductionlab evaluate` on every final checkpoint) -----------------------

def evaluation_config(ev: dict, seed: int = 0):
    """The :class:`~inductionlab.studies.evaluate.EvaluateConfig` of a preset's evaluation recipe ``ev``:
    probes at ``ev["shots"]`` (with the label-permutation control), ICL score, induction loss and
    head scores at ``score_seq_len`` (inside the trained copy distances), perplexity guard, and the
    load-bearing test ``per-layer-2pct`` (top 2% induction heads per layer, at least one) vs
    matched random heads, probes under ablation at 10 shots."""
    from ..evaluate import (EvaluateConfig, ICLScoreConfig, InductionLossConfig, LoadBearingConfig, PerplexityConfig,
                            ProbeConfig, RecallConfig)
    pct = f"per-layer-{100 * ev['ablation_top_frac']:g}pct"
    return EvaluateConfig(
        probes=ProbeConfig(tasks=tuple(ev["tasks"]), shots=tuple(ev["shots"]), n_prompts=ev["n_prompts"],
                           batch_size=ev["batch_size"]),
        icl=ICLScoreConfig(late=ev["icl_late"], early=ev["icl_early"], n_sequences=ev["icl_windows"],
                           batch_size=ev["batch_size"]),
        induction=InductionLossConfig(seq_len=ev.get("induction_seq_len", ev["score_seq_len"]),
                                      n_sequences=ev.get("induction_sequences", 16), batch_size=ev["batch_size"]),
        recall=RecallConfig(n_pairs=ev.get("recall_pairs", 8), n_sequences=ev.get("recall_sequences", 32),
                            batch_size=ev["batch_size"]),
        perplexity=PerplexityConfig(max_tokens=ev["ppl_tokens"], batch_size=ev["batch_size"]),
        load_bearing=LoadBearingConfig(ablate=(pct,), n_draws=ev["ablation_draws"], method=ev["ablation_method"],
                                       shots=max(ev["shots"])),
        seed=seed, score_seq_len=ev["score_seq_len"], score_batch_size=16, token_pool=ev.get("token_pool", "vocab"))


def evaluate_checkpoint(ckpt: Path, shards: str, ev: dict, out: Path, *, seed: int = 0) -> dict:
    """``inductionlab evaluate`` (:func:`inductionlab.studies.evaluate.run_evaluate`) of one trained
    checkpoint into ``out`` (resumable there), condensed to what the study compares: macro
    HITS@1/@3 per shots of the intact model, the ICL score, the perplexity guard, and the relative
    changes of the ICL benefit (and of HITS@1, the induction benefit) under the top-2%-per-layer
    ablation vs matched random heads. Returns a JSON-able dict."""
    from ..evaluate import SEQUENCE_MEASURES, run_evaluate
    from ...core.models import load_model

    ecfg = evaluation_config(ev, seed)
    loaded = load_model(str(ckpt), dtype="float32")    # the study's numbers, the same on every CPU
    res = run_evaluate(loaded, ecfg, out, shards=shards, progress=False)
    calibration = {}
    if ev.get("calibration_lengths"):                  # max induction at several |S| (issue 19: not only one)
        from ...core.scores import compute_head_scores

        for T in ev["calibration_lengths"]:        # the evaluation's own token pool (the shards' ids)
            hs = compute_head_scores(loaded.model, tokenizer=loaded.tokenizer, seq_len=int(T), batch_size=32,
                                     seed=seed + 1, names=("induction",), pool=res.pool, induction_loss=False)
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
