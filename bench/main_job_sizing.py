"""Benchmark: how to size the main job's lag probe — lists per condition × cue step — for evidence per second.

The headline of ``inductionlab analyze`` is the random − induction contrast of the all-cue temporal factor
(per list: mean over its cues; then mean, 95% CI and z over lists, paired). Its z grows with the lists and,
less than independent cues would give, with the cues per list (the cues of one list share its order), while
a list costs its 501 list tokens plus one token per cue. Two measurements, one script:

* ``--time``: seconds per list of the intact forward (SmolLM2-135M, the chosen dtype, 2 threads, batch 8)
  for each cue step (``all:10`` = 50 cues … ``all`` = 500), on this CPU;
* ``--from-run DIR``: from a finished ``analyze`` run made with dense cues (``--cues all`` or ``all:2``), the
  z of the temporal-factor contrast at every k for the first N lists and every S-th of its cues (averaged
  over the S offsets), i.e. what a run with ``--n-permutations N --cues all:S`` would have measured on
  the same lists.

With both, ``z² / seconds`` per (N, S) says which sizing buys the most evidence per second; the run's own
``timing.json`` gives the lag-probe seconds of its conditions (ablated conditions are cheaper than the
intact one: they skip the layers below their first ablated head).

    PYTHONPATH=src .venv/bin/python bench/main_job_sizing.py --time [--dtype float32] [--out FILE]
    PYTHONPATH=src .venv/bin/python bench/main_job_sizing.py --from-run runs/analyze-... [--out FILE]

To imitate a CPU without AVX-512 on one that has it: ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
MKL_ENABLE_INSTRUCTIONS=AVX2`` (torch's and its libraries' kernels limited to AVX2; the clock and caches stay
this CPU's). Benchmark alone: another job on the same two cores doubles the times.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

STEPS = (1, 2, 3, 5, 10)


def cpu_line() -> str:
    import torch

    name = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
                platform.processor()) if os.path.exists("/proc/cpuinfo") else platform.processor()
    return f"{name}; torch CPU capability {torch.backends.cpu.get_cpu_capability()}"


def time_steps(dtype: str, steps=STEPS, n: int = 8) -> list[dict]:
    """Seconds per list of one intact all-cue batch of ``n`` lists at each cue step (after a warm-up)."""
    import torch

    from inductionlab import load_model
    from inductionlab.protocols import lag_probe
    from inductionlab.protocols.configs import LagProbeConfig

    torch.set_num_threads(2)
    lm = load_model("smollm2-135m", dtype=dtype)
    rows = []
    with torch.inference_mode():
        for s in steps:
            cfg = LagProbeConfig(n_permutations=n, cues="all" if s == 1 else f"all:{s}", seed=0)
            t = lag_probe.build_trials(lm, cfg).tensors
            lag_probe.measure_batch(lm.model, {k: v[:1] for k, v in t.items()}, cfg)          # warm-up
            t0 = time.perf_counter()
            lag_probe.measure_batch(lm.model, t, cfg)
            sec = (time.perf_counter() - t0) / n
            rows.append({"step": s, "cues": len(cfg.cue_positions()), "s_per_list": sec})
            print(f"all:{s:<3d} {len(cfg.cue_positions()):4d} cues  {sec:.3f} s per list", flush=True)
    return rows


def z_table(run: str, steps=STEPS) -> list[dict]:
    """z of the random (mean of draws) − induction temporal-factor contrast per k, for the first N lists and
    every S-th cue of the run's (the mean over the S offsets)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
    from inductionlab.measures.serial_position import lag_rank

    z = np.load(os.path.join(run, "lag_trials.npz"))
    cp = z["cue_positions"]
    step0 = int(np.diff(cp[:2])[0]) if len(cp) > 1 else 1
    names = [k.split("/", 1)[1] for k in z.files if k.startswith("cue_probs/")]
    ks = sorted({int(n.split("-")[1]) for n in names if n.startswith("induction-")})
    n_lists = z[f"cue_probs/{names[0]}"].shape[0]
    tf = {n: lag_rank(z[f"cue_probs/{n}"], cp) for n in names}              # [lists, cues]
    rows = []
    for k in ks:
        draws = [n for n in names if n.startswith(f"random-{k}-d")]
        d = np.mean([tf[n] for n in draws], 0) - tf[f"induction-{k}"]
        for s in steps:
            if s % step0:
                continue
            stride = s // step0
            for n in sorted({max(4, n_lists // 2), n_lists}):
                zs = []
                for off in range(stride):
                    lm = np.nanmean(d[:n, off::stride], 1)
                    zs.append(lm.mean() / (lm.std(ddof=1) / np.sqrt(n)))
                rows.append({"k": k, "step": s, "lists": n, "z": float(np.mean(zs)), "offsets": stride})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--from-run")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--out")
    a = ap.parse_args()
    rec = {"cpu": cpu_line(), "env": {k: os.environ.get(k) for k in
                                      ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")},
           "loadavg_start": os.getloadavg()}
    if a.time:
        rec["dtype"], rec["timing"] = a.dtype, time_steps(a.dtype)
    if a.from_run:
        rec["run"], rec["z"] = a.from_run, z_table(a.from_run)
        for r in rec["z"]:
            print(f"k={r['k']:<3d} lists {r['lists']:3d}  all:{r['step']:<3d} z {r['z']:.1f}")
    rec["loadavg_end"] = os.getloadavg()
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rec, f, indent=1)


if __name__ == "__main__":
    main()
