"""Benchmark: bf16 vs fp32 for the main job's two heavy phases on SmolLM2-135M (run by hand).

Reports, measured in the same run: head-score time and lag-probe time per trial in each
dtype (as a ratio fp32 / bf16), and how much bf16 moves the scores and the lag probabilities.

    .venv/bin/python bench/analyze_dtype.py [--trials 16]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from inductionlab.core.ablation import Condition, top_k_heads
from inductionlab.protocols.lag_probe import LagProbeConfig, run_lag_probe
from inductionlab.core.models import load_model
from inductionlab.core.scores import compute_head_scores


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--model", default="smollm2-135m")
    args = ap.parse_args()
    out = {}
    for dtype in ("float32", "bfloat16"):
        lm = load_model(args.model, dtype=dtype)
        t = time.perf_counter()
        hs = compute_head_scores(lm.model, tokenizer=lm.tokenizer)
        t_scores = time.perf_counter() - t
        top = top_k_heads(hs["induction"], 10)
        conds = [Condition("intact", "intact"), Condition("induction-10", "induction", 10, 0, top)]
        t = time.perf_counter()
        res = run_lag_probe(lm, conds, LagProbeConfig(n_permutations=args.trials, batch_size=8))
        t_lag = (time.perf_counter() - t) / (2 * args.trials)
        out[dtype] = {"scores": hs.scores, "probs": res.probs, "t_scores": t_scores, "t_trial": t_lag, "top": top}
        print(f"{dtype}: head scores {t_scores:.1f} s, lag probe {t_lag:.3f} s/trial, top-3 {top[:3]}")
    a, b = out["float32"], out["bfloat16"]
    report = {
        "speedup_scores_fp32_over_bf16": a["t_scores"] / b["t_scores"],
        "speedup_trial_fp32_over_bf16": a["t_trial"] / b["t_trial"],
        "max_abs_score_diff": {k: float(np.abs(a["scores"][k] - b["scores"][k]).max()) for k in a["scores"]},
        "top10_same_set": set(a["top"]) == set(b["top"]),
        "max_abs_prob_diff": {k: float(np.abs(a["probs"][k] - b["probs"][k]).max()) for k in a["probs"]},
        "lag_plus1": {d: {k: float(out[d]["probs"][k][:, 250].mean()) for k in a["probs"]} for d in out},
        "threads": torch.get_num_threads(),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
