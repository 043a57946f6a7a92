"""The FV score's exact fast path against the authors' per-head loop (tests/fv_oracle.py), on a real model.

    python bench/fv_speed.py [--model smollm2-135m] [--task next_letter] [--prompts 4] [--out bench/results/fv_speed.json]

Both score every head on the same corrupted prompts with the same clean means (the fast path's, so the
comparison isolates the patched forwards), fp32, one process; the oracle also computes its own means and
the table says how far they are. Reports the CPU time of each and their ratio, the largest difference of
the CIEs, and the CPU kind. Run it alone: a job beside it doubles both times.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fv_oracle import indirect_effect, mean_head_activations  # noqa: E402
from inductionlab.core.models import load_model  # noqa: E402
from inductionlab.protocols import function_vectors as F  # noqa: E402
from inductionlab.protocols.icl_tasks import build_tasks  # noqa: E402
from inductionlab.runtime.dtype_choice import cpu_flags  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--task", default="next_letter")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--rows", type=int, default=90)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    loaded = load_model(a.model, dtype="float32")
    model = loaded.model
    bos = loaded.tokenizer.bos_token_id
    tp = F.task_prompts(build_tasks([a.task]), loaded.tokenizer, n_prompts=a.prompts, bos_id=bos)[a.task]
    means, _ = F.clean_means(model, tp.clean)
    oracle_means = mean_head_activations(model, tp.clean)
    t0 = time.process_time()
    fast = [F.indirect_effects(model, p, means, rows=a.rows) for p in tp.corrupted]
    t_fast = time.process_time() - t0
    t0 = time.process_time()
    slow = [indirect_effect(model, p, means) for p in tp.corrupted]
    t_slow = time.process_time() - t0
    diff = max(abs(c[l, h] - ie) for (_, c), (d, _) in zip(fast, slow) for (l, h), ie in d.items())
    base = max(abs(pb - b) for (pb, _), (_, b) in zip(fast, slow))
    cie = np.array([c for _, c in fast])
    out = {"model": a.model, "task": a.task, "prompts": a.prompts, "heads": int(cie[0].size), "rows": a.rows,
           "cpu": cpu_flags(), "threads": torch.get_num_threads(), "dtype": "float32",
           "fast_cpu_s": round(t_fast, 2), "oracle_cpu_s": round(t_slow, 2), "ratio": round(t_slow / t_fast, 1),
           "max_abs_cie_difference": diff, "max_abs_base_difference": base,
           "max_abs_mean_difference_vs_oracle_means": float((means - oracle_means.double()).abs().max()),
           "max_abs_cie": float(np.abs(cie).max()), "mean_aie_top": float(cie.mean(0).max())}
    print(json.dumps(out, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
