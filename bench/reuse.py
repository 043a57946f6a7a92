"""Residual reuse across conditions (issue 12, item 5): does it pay on the default analyze lag probe?

Run by hand (not a test): ``PYTHONPATH=src python bench/reuse.py [--perms 16] [--repeats 2]``.

1. The estimate: with the default ``analyze`` conditions on SmolLM2 (bf16; intact, induction-5/10/20,
   random-5/10/20 × 2 draws), the first ablated layer of each condition, the share of layer passes
   that reuse can skip (the first condition at each level computes in full and records it; intact
   runs plainly), and the memory of the recorded states (per batch and for all trials; here and
   for an 8B model with hidden 4096, 5,000 trials × 502 tokens, bf16).
2. The measurement: the lag-probe phase (``run_conditions`` over every condition) with and without
   reuse, interleaved, one thread, minimum over repeats; ``os.getloadavg()`` before each run (the
   machine is shared). The per-trial arrays must be equal with and without reuse.

Prints a table and writes ``bench/reuse.json`` (parameters, versions, numbers).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from inductionlab.protocols import lag_probe
from inductionlab.core.ablation import ablation_conditions, default_exclude_top_n
from inductionlab.studies.analyze import AnalyzeConfig
from inductionlab.core.models import load_model
from inductionlab.protocols.runner import residual_cache, run_conditions
from inductionlab.core.reuse import first_ablated_layer
from inductionlab.runtime.runs import versions
from inductionlab.core.scores import compute_head_scores


def estimate(conditions, n_layers: int) -> tuple[list[dict], float]:
    """Per condition: first ablated layer and layers skipped, as :class:`~inductionlab.core.reuse.ResidualCache`
    does it: served from the deepest level recorded by an earlier ablated condition; each ablated
    pass records the wanted levels (all conditions' first ablated layers) up to its own."""
    levels = {first_ablated_layer(c.heads, n_layers) for c in conditions if c.heads} - {0}
    rows, recorded, skipped = [], set(), 0
    for c in conditions:
        first = first_ablated_layer(c.heads, n_layers)
        b = max([v for v in recorded if v <= first], default=0) if c.heads else 0
        if c.heads:
            recorded |= {v for v in levels if b < v <= first}
        skipped += b
        rows.append({"condition": c.name, "first_ablated_layer": first if c.heads else None,
                     "ideal_skip": first / n_layers if c.heads else 0.0, "skipped_layers": b})
    return rows, skipped / (n_layers * len(conditions))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--perms", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=str(Path(__file__).with_name("reuse.json")))
    a = ap.parse_args()
    torch.set_num_threads(1)
    loaded = load_model("smollm2-135m", dtype="bfloat16")
    cfg = AnalyzeConfig()
    hs = compute_head_scores(loaded.model, tokenizer=loaded.tokenizer, seq_len=cfg.scores.seq_len,
                             batch_size=cfg.scores.batch_size, n_batches=cfg.scores.n_batches, seed=cfg.seed)
    L = loaded.identity["n_layers"]
    conds = ablation_conditions(hs["induction"], cfg.ablation.ks, n_draws=cfg.ablation.n_draws,
                                exclude_top_n=default_exclude_top_n(hs["induction"].size), seed=cfg.seed)
    rows, share = estimate(conds, L)
    ideal = sum(r["ideal_skip"] for r in rows) / len(rows)
    lag_cfg = replace(cfg.protocol(), n_permutations=a.perms)
    trials = lag_probe.build_trials(loaded, lag_cfg)
    T, hidden, bs = trials.tensors["ids"].shape[1], loaded.identity["hidden_size"], 8
    levels = residual_cache(loaded.model, conds).levels
    per_state = T * hidden * 2                                  # bf16 bytes per trial per level
    mem = {"levels": levels, "per_batch_MB": len(levels) * bs * per_state / 1e6,
           "default_64_trials_MB": len(levels) * 64 * per_state / 1e6,
           "5000_trials_MB": len(levels) * 5000 * 502 * hidden * 2 / 1e6,
           "8B_hidden4096_per_batch_per_level_MB": bs * 502 * 4096 * 2 / 1e6,
           "8B_hidden4096_5000_trials_per_level_GB": 5000 * 502 * 4096 * 2 / 1e9}
    print(f"{'condition':16s} {'first layer':>11s} {'ideal skip':>10s} {'skipped':>8s}")
    for r in rows:
        print(f"{r['condition']:16s} {str(r['first_ablated_layer']):>11s} {r['ideal_skip']:10.3f} {r['skipped_layers']:8d}")
    print(f"layer passes skippable: ideal {ideal:.3f}, with the first condition per level in full {share:.3f}")
    print("memory:", json.dumps(mem))

    def measure(reuse: bool):
        load = os.getloadavg()
        cache = residual_cache(loaded.model, conds) if reuse else False
        t = time.perf_counter()
        out = run_conditions(loaded, conds, trials, method=lag_cfg.method, batch_size=bs,
                             measure_batch=lag_probe.probe(lag_cfg).measure_batch, reuse=cache)
        dt = time.perf_counter() - t
        info = {"s": dt, "loadavg": load, "skipped": cache.skipped if cache else 0,
                "cache_MB": cache.nbytes / 1e6 if cache else 0.0}
        print(f"reuse={reuse!s:5s} {dt:8.1f} s  loadavg {load[0]:.2f} {info}")
        return out, info

    runs = {"off": [], "on": []}
    ref = None
    for _ in range(a.repeats):
        for mode in ("off", "on"):
            out, info = measure(mode == "on")
            runs[mode].append(info)
            if ref is None:
                ref = out
            same = all(np.array_equal(ref[c.name][k], out[c.name][k], equal_nan=True)
                       for c in conds for k in ref[c.name])
            assert same, "reuse changed a result"
    best = {m: min(r["s"] for r in v) for m, v in runs.items()}
    saving = 1 - best["on"] / best["off"]
    print(f"\n| lag-probe phase ({len(conds)} conditions x {a.perms} trials) | min of {a.repeats} (s) | all runs (s) |")
    print("| --- | --- | --- |")
    for m in ("off", "on"):
        each = ", ".join(f"{r['s']:.1f}" for r in runs[m])
        print(f"| reuse {m} | {best[m]:.1f} | {each} |")
    print(f"saving: {saving:.1%} (estimate {share:.1%} of layer passes); results identical: True")
    Path(a.out).write_text(json.dumps({
        "params": {"model": "smollm2-135m", "dtype": "bfloat16", "threads": 1, "n_permutations": a.perms,
                   "batch_size": bs, "repeats": a.repeats, "T": T, "conditions": [c.to_dict() for c in conds]},
        "versions": versions(), "estimate": {"rows": rows, "ideal_share": ideal, "share": share, "memory": mem},
        "runs": runs, "min_s": best, "saving": saving, "identical": True}, indent=1))


if __name__ == "__main__":
    main()
