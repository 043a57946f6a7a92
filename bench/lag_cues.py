"""Benchmark: evidence per CPU-second of the lag +1 contrast, seed single-cue vs all-cue (issue 17 §4).

On the same lists (SmolLM2-135M, fp32, one thread; top-k induction heads vs k random heads
outside the top N, zero-ablated), the paired per-list contrast random − induction of p(lag +1):

* **seed**: one forward per trial, the cue at ``cue_position`` (today's protocol);
* **all-cue**: the list runs once and every list position is cued (``cues="all"``); per list
  the contrast is pooled over the cues that have a lag +1 word (all but the last), then the CI
  is taken over lists (the list is the unit: its cues are not independent).

For each: mean ± 95% CI half-width over lists, z = |mean| / (half / 1.96), the CPU-seconds of
the two conditions, ``z / cpu_s`` and ``z² / cpu_s`` (the rate that adds up: CPU-seconds to reach
a given z scale as 1 / rate), and the all-cue / seed ratio of ``z² / cpu_s``.

Memory (the batch of ``--batch-size`` lists; ``zero`` ablates k heads of the middle layers):
each of a bare forward over the same packed tokens (the model's default forward, all
logits; and with the same logits kept), one all-cue batch (intact and zero-ablated) and one
seed batch runs in a fresh process (``MALLOC_MMAP_THRESHOLD_=65536`` so freed tensors leave
the resident set) that resets its peak RSS (``/proc/self/clear_refs``) after loading; the extra
peak RSS over the resident set before the forward is reported.

    PYTHONPATH=src .venv/bin/python bench/lag_cues.py [--n-permutations 32] [--k 10] [--out FILE]
    (smoke: --n-permutations 2 --k 2 --list-length 60)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import torch


def contrast_z(x: np.ndarray) -> dict:
    from inductionlab.measures.stats import mean_ci

    m, half = mean_ci(np.asarray(x, np.float64))
    m, half = float(m), float(half)
    return {"mean": m, "half": half, "z": abs(m) / (half / 1.96) if half > 0 else float("inf"), "n_lists": int(len(x))}


def _setup(args):
    torch.set_num_threads(1)
    from inductionlab.core.ablation import ablation_conditions, default_exclude_top_n
    from inductionlab.core.models import load_model
    from inductionlab.core.scores import compute_head_scores

    lm = load_model("smollm2-135m", dtype="float32")
    hs = compute_head_scores(lm, names=("induction",), induction_loss=False)
    L, H = hs["induction"].shape
    conds = ablation_conditions(hs["induction"], [args.k], n_draws=1, exclude_top_n=default_exclude_top_n(L * H), seed=0)
    conds = [c for c in conds if c.kind in ("induction", "random")]
    return lm, conds


def _peak_child(args) -> None:
    """One memory measurement in this (fresh) process: prints the extra peak RSS in bytes."""
    from inductionlab.core.instrument import ablate
    from inductionlab.protocols.lag_probe import LagProbeConfig, build_trials, measure_batch
    from inductionlab.protocols.packed import packed_cue_batch

    from inductionlab.core.models import load_model

    torch.set_num_threads(1)
    lm = load_model("smollm2-135m", dtype="float32")
    cfg = LagProbeConfig(n_permutations=args.batch_size, list_length=args.list_length,
                         cue_position=args.list_length // 2, cues="all")
    tr = build_trials(lm, cfg).tensors
    start = int(tr["cue_start"][0])
    kw, readout = packed_cue_batch(lm.model, tr["ids"], tr["list_ids"], start, cfg.cue_positions())
    n_layers, n_heads = lm.identity["n_layers"], lm.identity["n_heads"]
    heads = [(n_layers // 2 + i // n_heads, i % n_heads) for i in range(args.k)]   # which heads: no matter here
    mode = args.memory_child

    def run():
        if mode == "bare":
            lm.model(input_ids=kw["input_ids"])
        elif mode == "bare_keep":
            lm.model(input_ids=kw["input_ids"], logits_to_keep=len(readout))
        elif mode == "all_intact":
            measure_batch(lm.model, tr, cfg)
        elif mode == "all_zero":
            with ablate(lm.model, heads, "zero"):
                measure_batch(lm.model, tr, cfg)
        elif mode == "seed_intact":
            from dataclasses import replace
            measure_batch(lm.model, tr, replace(cfg, cues="seed"))

    def rss(field):
        for line in open("/proc/self/status"):
            if line.startswith(field):
                return int(line.split()[1]) * 1024

    with torch.inference_mode():
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = rss("VmRSS:")
        run()
        print(json.dumps({"mode": mode, "extra_peak_bytes": rss("VmHWM:") - before,
                          "tokens_per_row": int(kw["input_ids"].shape[1]), "batch": args.batch_size}))


def memory(args) -> dict:
    out = {}
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"}
    for mode in ("bare", "bare_keep", "all_intact", "all_zero", "seed_intact"):
        cmd = [sys.executable, __file__, "--memory-child", mode, "--k", str(args.k), "--list-length",
               str(args.list_length), "--batch-size", str(args.batch_size)]
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if p.returncode:
            raise SystemExit(p.stderr[-3000:])
        out[mode] = json.loads(p.stdout.strip().splitlines()[-1])
    b = out["bare"]["extra_peak_bytes"]
    for mode in ("bare_keep", "all_intact", "all_zero", "seed_intact"):
        out[mode]["ratio_to_bare"] = out[mode]["extra_peak_bytes"] / b if b else None
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n-permutations", type=int, default=32)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--list-length", type=int, default=500)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--modes", default="seed,all",
                    help="comma-separated --cues values to compare; the first is the baseline of the ratios")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_child:
        return _peak_child(args)
    import transformers

    from inductionlab.runtime.dtype_choice import cpu_flags
    from inductionlab.protocols.lag_probe import LagProbeConfig, run_lag_probe
    from inductionlab.runtime.runs import versions

    lm, conds = _setup(args)
    ind = next(c.name for c in conds if c.kind == "induction")
    rnd = next(c.name for c in conds if c.kind == "random")
    base = LagProbeConfig(n_permutations=args.n_permutations, list_length=args.list_length,
                          cue_position=args.list_length // 2, batch_size=args.batch_size)
    rows = {}
    res = {}
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for mode in modes:                                          # untimed warm-up of every path (first-call costs)
        run_lag_probe(lm, conds[:1], LagProbeConfig(**{**base.__dict__, "cues": mode, "n_permutations": 2,
                                                       "batch_size": min(2, args.batch_size)}))
    for mode in modes:
        c0, w0 = time.process_time(), time.perf_counter()
        res[mode] = r = run_lag_probe(lm, conds, LagProbeConfig(**{**base.__dict__, "cues": mode}))
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        if mode == "seed":
            col = base.cue_position                             # 0-based column of lag +1
            x = r.probs[rnd][:, col].astype(np.float64) - r.probs[ind][:, col]
        else:
            i = np.flatnonzero(r.cue_positions < args.list_length)   # the last list position has no lag +1 word
            cues = r.cue_positions[i]
            d = r.cue_probs[rnd][:, i, cues].astype(np.float64) - r.cue_probs[ind][:, i, cues]   # [trials, cues]
            x = d.mean(1)                                       # pooled per list
        z = contrast_z(x)
        rows[mode] = {**z, "cpu_s": cpu, "wall_s": wall, "z_per_cpu_s": z["z"] / cpu, "z2_per_cpu_s": z["z"] ** 2 / cpu}
        print(f"{mode:5s}: contrast {z['mean']:+.3g} ± {z['half']:.2g} over {z['n_lists']} lists, z {z['z']:.2f}, "
              f"{cpu:.1f} CPU-s ({wall:.1f} s wall), z/CPU-s {z['z'] / cpu:.3g}, z²/CPU-s {z['z'] ** 2 / cpu:.3g}")
    first = modes[0]
    seed_diff = {m: max(float(np.abs(res[first].probs[c] - res[m].probs[c]).max()) for c in res[first].probs)
                 for m in modes[1:]}
    ratios = {m: rows[m]["z2_per_cpu_s"] / rows[first]["z2_per_cpu_s"] if rows[first]["z2_per_cpu_s"] else None
              for m in modes[1:]}
    for m in modes[1:]:
        print(f"{m} / {first}, z² per CPU-second: {ratios[m]:.3g}x, CPU time {rows[m]['cpu_s'] / rows[first]['cpu_s']:.2f}x; "
              f"seed cue equal within {seed_diff[m]:.2g}")
    ratio = ratios.get("all")
    record = {"bench": "lag_cues", "versions": {**versions(), "torch": torch.__version__,
                                                "transformers": transformers.__version__},
              "cpu": cpu_flags(), "threads": torch.get_num_threads(), "dtype": "float32", "model": lm.identity.get("name"),
              "n_permutations": args.n_permutations, "k": args.k, "list_length": args.list_length,
              "batch_size": args.batch_size, "conditions": [c.name for c in conds], "rows": rows,
              "ratio_z2_per_cpu_s_all_over_seed": ratio, "ratios_z2_per_cpu_s": ratios, "baseline_mode": first,
              "seed_cue_max_abs_diff": seed_diff}
    if not args.no_memory:
        record["memory"] = memory(args)
        for mode, m in record["memory"].items():
            print(f"memory {mode:11s}: +{m['extra_peak_bytes'] / 2**20:.0f} MiB ({m['tokens_per_row']} tokens x "
                  f"{m['batch']})" + (f", {m['ratio_to_bare']:.2f}x bare" if m.get("ratio_to_bare") else ""))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
