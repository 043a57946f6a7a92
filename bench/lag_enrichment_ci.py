"""Benchmark: evidence per CPU-second of the lag +1 contrast, raw vs word-prior corrected (issue 12 §3).

Runs the lag probe on SmolLM2-135M (fp32, one thread) under intact, top-k induction heads
zero-ablated and k random heads (outside the top N) zero-ablated, on the same trials, and
reports for the lag +1 measures, raw probability vs log-enrichment (:func:`log_enrichment`):
the mean, the 95% CI half-width, the z-value mean/half, and the CPU-seconds needed for the CI
to exclude 0 at this effect size (``cpu_s × (half / |mean|)²``: the CI shrinks as 1/√trials).
The corrected curve is post-processing of the same forwards: both columns share one CPU cost.

    PYTHONPATH=src .venv/bin/python bench/lag_enrichment_ci.py [--trials 32] [--k 10] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np
import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=32)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--far-lag", type=int, default=None, help="default: LagProbeConfig.far_lag")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    import transformers

    from inductionlab.core.ablation import ablation_conditions, default_exclude_top_n
    from inductionlab.protocols.lag_probe import LagProbeConfig, run_lag_probe
    from inductionlab.core.models import load_model
    from inductionlab.core.scores import compute_head_scores
    from inductionlab.measures.stats import mean_ci

    lm = load_model("smollm2-135m", dtype="float32")
    hs = compute_head_scores(lm, names=("induction",), induction_loss=False)
    L, H = hs["induction"].shape
    conds = ablation_conditions(hs["induction"], [args.k], n_draws=1, exclude_top_n=default_exclude_top_n(L * H), seed=0)
    cfg = LagProbeConfig(n_permutations=args.trials, batch_size=8,
                         **({} if args.far_lag is None else {"far_lag": args.far_lag}))
    c0, w0 = time.process_time(), time.perf_counter()
    res = run_lag_probe(lm, conds, cfg)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    cpu_per_cond = cpu / len(conds)
    col = cfg.cue_position                               # lag +1 column (0-based: cue_position - 1 + 1)
    e = res.enrichment()
    ind = next(c.name for c in conds if c.kind == "induction")
    rnd = next(c.name for c in conds if c.kind == "random")
    chance = res.list_mass["intact"].mean() / cfg.list_length
    measures = {
        "intact lag +1 (raw − even spread | log-enrichment)": (res.probs["intact"][:, col] - chance, e["intact"][:, col], 1),
        f"random-{args.k} − induction-{args.k}, lag +1 (paired)": (
            res.probs[rnd][:, col].astype(np.float64) - res.probs[ind][:, col], e[rnd][:, col] - e[ind][:, col], 2),
        f"induction-{args.k} lag +1 (vs even spread | vs 0)": (
            res.probs[ind][:, col] - res.list_mass[ind].mean() / cfg.list_length, e[ind][:, col], 1),
    }
    rows = []
    print(f"\n{args.trials} trials per condition, {len(conds)} conditions, {cpu:.0f} CPU-s ({wall:.0f} s wall), "
          f"{cpu_per_cond:.1f} CPU-s per condition\n")
    print("| measure | raw mean ± half | raw z | raw CPU-s to exclude 0 | corrected mean ± half (nats) | corrected z | corrected CPU-s to exclude 0 |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, (raw, cor, n_cond) in measures.items():
        out = {"measure": name}
        cells = []
        for tag, x in (("raw", raw), ("corrected", cor)):
            m, half = mean_ci(np.asarray(x, np.float64))
            z = abs(m) / half if half > 0 else float("inf")
            need = n_cond * cpu_per_cond * (half / abs(m)) ** 2 if m != 0 else float("inf")
            out[tag] = {"mean": float(m), "half": float(half), "z": float(z), "cpu_s_to_exclude_0": float(need),
                        "half_per_sqrt_cpu_s": float(half * np.sqrt(n_cond * cpu_per_cond))}
            cells += [f"{m:+.4g} ± {half:.2g}", f"{z:.2f}", f"{need:.0f}"]
        out["z_ratio_corrected_over_raw"] = out["corrected"]["z"] / out["raw"]["z"] if out["raw"]["z"] else None
        rows.append(out)
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("\nz ratio (corrected / raw): " + ", ".join(f"{r['measure']}: {r['z_ratio_corrected_over_raw']:.2f}" for r in rows))
    record = {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
              "model": lm.identity.get("name"), "trials": args.trials, "k": args.k, "far_lag": cfg.far_lag,
              "conditions": [c.name for c in conds], "cpu_s": cpu, "wall_s": wall, "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
