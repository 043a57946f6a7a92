"""Function-style ICL probes on a real model (by hand): HITS@1/@3 per task at 0/1/10 shots and
the label-permutation control. Usage: python bench/icl_probes_real.py [MODEL] [N_PROMPTS] [OUT_CSV]"""
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402

from inductionlab.protocols.function_probes import run_probes, summarize_hits  # noqa: E402
from inductionlab.protocols.icl_tasks import build_tasks, make_all_prompts  # noqa: E402
from inductionlab.core.models import load_model  # noqa: E402

torch.set_num_threads(1)
spec = sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m"
n = int(sys.argv[2]) if len(sys.argv) > 2 else 32
out = sys.argv[3] if len(sys.argv) > 3 else None
t0 = time.time()
lm = load_model(spec, dtype="bfloat16")
prompts = make_all_prompts(build_tasks(), lm.tokenizer, shots=(0, 1, 10), n_prompts=n, seed=0)
print(f"loaded + {len(prompts)} prompts in {time.time() - t0:.0f}s", flush=True)
t0 = time.time()
rows = run_probes(lm.model, prompts, tokenizer=lm.tokenizer, batch_size=32)
print(f"forwards in {time.time() - t0:.0f}s", flush=True)
s = summarize_hits(rows)
if out:
    rows.to_csv(out.replace(".csv", "_rows.csv"), index=False)
    s.to_csv(out, index=False)
import pandas as pd  # noqa: E402
pd.set_option("display.width", 200)
wide = s.pivot_table(index="task", columns=["control", "shots"], values=["hits1", "hits3"], sort=False)
print(wide.round(3).to_string())
