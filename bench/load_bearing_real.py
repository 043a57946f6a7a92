"""Load-bearing test on a real model (by hand; `inductionlab evaluate` runs the full study): ablate the
top-2%-per-layer induction heads vs
matched random heads (same count per layer, excluding the chosen ones, seeded draws) and report
the relative drop of 10-shot probe HITS@1 and of the induction-loss benefit, with paired CIs.
Usage: python bench/load_bearing_real.py [MODEL] [N_PROMPTS_PER_TASK] [N_DRAWS]"""
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np  # noqa: E402
import torch  # noqa: E402

from functools import partial  # noqa: E402

from inductionlab.protocols import function_probes, icl_score  # noqa: E402
from inductionlab.core.ablation import Condition, matched_random_heads, per_layer_top_p  # noqa: E402
from inductionlab.protocols.runner import Trials, run_conditions  # noqa: E402
from inductionlab.protocols.icl_tasks import build_tasks, make_all_prompts  # noqa: E402
from inductionlab.measures.load_bearing_eval import relative_change, relative_contrast, score_concentration  # noqa: E402
from inductionlab.core.models import load_model  # noqa: E402
from inductionlab.core.scores import compute_head_scores  # noqa: E402

torch.set_num_threads(1)
spec = sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m"
n = int(sys.argv[2]) if len(sys.argv) > 2 else 8
n_draws = int(sys.argv[3]) if len(sys.argv) > 3 else 2
t0 = time.time()
lm = load_model(spec, dtype="bfloat16")
L, H = lm.n_layers, lm.n_heads
ind = compute_head_scores(lm.model, tokenizer=lm.tokenizer, batch_size=8, names=("induction",))["induction"]
print("concentration", score_concentration(ind), flush=True)
chosen = per_layer_top_p(ind, 0.02)


conds = {"intact": [], "induction": chosen,
         **{f"random-d{d}": matched_random_heads((L, H), chosen, seed=0, draw=d) for d in range(n_draws)}}
conditions = [Condition(name, "intact" if not heads else "ablated", heads=heads) for name, heads in conds.items()]
prompts = make_all_prompts(build_tasks(), lm.tokenizer, shots=(10,), n_prompts=n, seed=0, permuted=False)
probes = run_conditions(lm, conditions, function_probes.build_trials(prompts, function_probes.default_pad_id(lm.tokenizer)),
                        batch_size=32, measure_batch=function_probes.measure_batch)
ids, T, bos = icl_score.induction_ids(lm.model, tokenizer=lm.tokenizer, n=16, seed=0)
losses = run_conditions(lm, conditions, Trials({"ids": ids}), batch_size=16,
                        measure_batch=partial(icl_score.measure_batch, hits=True))
hits, ben = {}, {}
for name in conds:
    hits[name] = function_probes.probe_rows(prompts, probes[name])["hits1"].to_numpy()
    ben[name] = icl_score.induction_summary(losses[name]["nll"], losses[name]["hits"], T, bos)["per_sequence"]["benefit"]
    print(f"{name}: HITS@1(10-shot) {hits[name].mean():.3f}  induction benefit {ben[name].mean():.2f} nats "
          f"({time.time() - t0:.0f}s)", flush=True)
rnd = [k for k in conds if k.startswith("random")]
for label, m in (("probe HITS@1 @10 shots", hits), ("induction-loss benefit", ben)):
    r_i = relative_change(m["intact"], m["induction"])
    r_r = relative_change(m["intact"], np.stack([m[k] for k in rnd]))
    c = relative_contrast(m["intact"], m["induction"], np.stack([m[k] for k in rnd]))
    print(f"{label}: induction {r_i['headline']} [{100 * r_i['ci_low']:.1f}, {100 * r_i['ci_high']:.1f}]  "
          f"random ({len(rnd)} draws) {r_r['headline']} [{100 * r_r['ci_low']:.1f}, {100 * r_r['ci_high']:.1f}]  "
          f"induction−random {100 * c['contrast']:.1f}% [{100 * c['ci_low']:.1f}, {100 * c['ci_high']:.1f}]")
