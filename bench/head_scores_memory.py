"""Benchmark: time and extra peak memory of ``compute_head_scores`` on SmolLM2-135M (run by hand).

The job of issue 12: the induction score of every head on 8 × ``[BOS] + S + S`` with |S| = 256
(513 tokens), fp32, one batch. Measured per variant (minimum over ``--repeats``, each variant in
the same process, interleaved): wall time and extra peak resident memory over the RSS before the
call (a thread samples ``/proc/self/statm`` every 2 ms), next to the floor (a bare forward with
``logits_to_keep=1``). Prints a table and writes JSON with versions. The script re-runs itself
with ``MALLOC_MMAP_THRESHOLD_=65536`` so that freed tensors go back to the system and the RSS
before each call is a fair baseline.

    PYTHONPATH=src .venv/bin/python bench/head_scores_memory.py [--repeats 3] [--out bench.json]

To compare with another checkout, run the same script with ``PYTHONPATH=<other>/src``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time

import torch

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class PeakRSS:
    """Peak RSS while the block runs, sampled every ``interval`` s, minus the RSS at entry."""

    def __init__(self, interval: float = 0.002):
        self.interval = interval

    def __enter__(self):
        self.base = self.peak = rss()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss())
            time.sleep(self.interval)

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, rss())
        self.extra = self.peak - self.base


def main() -> None:
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        os.execve(sys.executable, [sys.executable] + sys.argv, {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"})
    import inspect

    import transformers

    from inductionlab.core.models import load_model
    from inductionlab.core.scores import compute_head_scores
    from inductionlab.core.stimuli import ordinary_token_ids, random_sequences

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--all-scores", action="store_true", help="also time all five scores (two forwards)")
    args = ap.parse_args()
    lm = load_model(args.model, dtype="float32")
    model, tok = lm.model, lm.tokenizer
    pool = ordinary_token_ids(model.config.vocab_size, tokenizer=tok)
    S = random_sequences(pool, args.batch, args.seq_len, 0)
    ids = torch.cat([torch.full((args.batch, 1), tok.bos_token_id), S, S], 1)
    has_loss_flag = "induction_loss" in inspect.signature(compute_head_scores).parameters

    def floor():
        with torch.inference_mode():
            model(input_ids=ids, logits_to_keep=1)

    variants = {"bare forward, logits_to_keep=1 (floor)": floor}
    ap_names = [("induction",)] + ([None] if args.all_scores else [])
    for names in ap_names:
        label = "all five scores" if names is None else "induction"
        kw = {} if names is None else {"names": names}
        variants[f"compute_head_scores({label}) + induction loss"] = \
            lambda kw=kw: compute_head_scores(model, tokenizer=tok, sequences=S, batch_size=args.batch, **kw)
        if has_loss_flag:
            variants[f"compute_head_scores({label}), no loss"] = \
                lambda kw=kw: compute_head_scores(model, tokenizer=tok, sequences=S, batch_size=args.batch,
                                                  induction_loss=False, **kw)
    results = {k: {"time_s": [], "extra_peak_gb": []} for k in variants}
    outputs = {}
    floor()  # warm-up
    for _ in range(args.repeats):
        for name, fn in variants.items():
            with PeakRSS() as p:
                t = time.perf_counter()
                out = fn()
                dt = time.perf_counter() - t
            results[name]["time_s"].append(dt)
            results[name]["extra_peak_gb"].append(p.extra / 1e9)
            if out is not None:
                outputs[name] = out
    rows = [(n, min(r["time_s"]), min(r["extra_peak_gb"])) for n, r in results.items()]
    t0, m0 = rows[0][1], rows[0][2]
    print(f"{'variant':58s} {'time (min)':>10s} {'x floor':>8s} {'extra peak':>11s} {'x floor':>8s}")
    for n, t, m in rows:
        print(f"{n:58s} {t:9.2f}s {t / t0:8.2f} {m:9.2f}GB {m / m0 if m0 > 0 else float('nan'):8.2f}")
    first = next(v for v in outputs.values())
    record = {"model": args.model, "shape": [args.batch, 2 * args.seq_len + 1], "dtype": "float32",
              "threads": torch.get_num_threads(), "torch": torch.__version__,
              "transformers": transformers.__version__, "python": platform.python_version(),
              "results": {n: {"time_s_min": t, "extra_peak_gb_min": m, **results[n]} for n, t, m in rows},
              "induction_loss": first.induction_loss,
              "scores_sha": {k: float(v.sum()) for k, v in first.scores.items()}}
    print(json.dumps({"induction_loss": first.induction_loss}))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
