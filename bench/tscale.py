"""T-scaling of head scoring (issue 12): time and extra peak RSS of the induction reduction
(``instrument(reductions=)`` + ``logits_to_keep=1``) and of ``compute_head_scores(induction)``
against the bare SDPA forward, at 1 × T for T = 2n + 1 tokens ([BOS] + S + S), fp32, one
thread, one process (model loaded once), contenders interleaved per T, min of ``--repeats``.
(The eager kernel is left out: it keeps L × [1, H, T, T], 18 GB at T = 4097; see
bench/contenders.py for it at small T.)

    PYTHONPATH=src .venv/bin/python bench/tscale.py [--ns 128,256,512,1024,2048] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from contenders import PeakRSS  # noqa: E402


def main() -> None:
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        os.execve(sys.executable, [sys.executable] + sys.argv, {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"})
    ap = argparse.ArgumentParser()
    ap.add_argument("--ns", default="128,256,512,1024,2048")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import torch
    import transformers
    torch.set_num_threads(1)
    from inductionlab.core.instrument import instrument
    from inductionlab.core.models import load_model
    from inductionlab.core.scores import compute_head_scores, induction_targets
    from inductionlab.core.stimuli import ordinary_token_ids, random_sequences
    lm = load_model("smollm2-135m", dtype="float32")
    model = lm.model
    pool = ordinary_token_ids(model.config.vocab_size, tokenizer=lm.tokenizer)
    rows = []
    print("| T | contender | time (min) | × bare | extra peak | × bare |\n| --- | --- | --- | --- | --- | --- |")
    for n in [int(x) for x in args.ns.split(",")]:
        S = random_sequences(pool, 1, n, 0)
        ids = torch.cat([torch.full((1, 1), lm.tokenizer.bos_token_id), S, S], 1)
        t = induction_targets(n, True)

        def bare():
            with torch.inference_mode():
                model(input_ids=ids, logits_to_keep=1)

        def reduction():
            with torch.inference_mode(), instrument(model, reductions={"i": t}):
                model(input_ids=ids, logits_to_keep=1)

        def scores():
            compute_head_scores(lm, sequences=S, batch_size=1, names=("induction",))

        fns = {"bare": bare, "reduction path": reduction, "compute_head_scores(induction)": scores}
        res = {k: ([], []) for k in fns}
        bare()
        for _ in range(args.repeats):
            for k, f in fns.items():
                with PeakRSS() as p:
                    t0 = time.perf_counter()
                    f()
                    res[k][0].append(time.perf_counter() - t0)
                res[k][1].append(p.extra / 1e9)
        bt, bm = min(res["bare"][0]), min(res["bare"][1])
        for k, (ts, ms) in res.items():
            r = {"T": 2 * n + 1, "contender": k, "time_s_min": min(ts), "x_bare_time": min(ts) / bt,
                 "spread": max(ts) / min(ts), "extra_peak_gb_min": min(ms), "x_bare_mem": min(ms) / bm if bm > 0 else None,
                 "time_s": ts, "extra_peak_gb": ms}
            rows.append(r)
            print(f"| {2 * n + 1} | {k} | {min(ts):.2f} s | {min(ts) / bt:.2f} | {min(ms):.3f} GB | "
                  f"{min(ms) / bm if bm > 0 else float('nan'):.2f} |", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"torch": torch.__version__, "transformers": transformers.__version__,
                       "python": platform.python_version(), "threads": 1, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
