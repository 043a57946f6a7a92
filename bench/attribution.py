"""Attribution patching (AtP) against exact patching: CPU time per prompt and agreement on the FV AIE.

    python bench/attribution.py [--model smollm2-135m] [--tasks next_letter,capitalize] [--prompts 3]
                                [--loop-prompts 1] [--graddrop-prompts 1] [--llama8b] [--out bench/results/attribution.json]

Part 1 (a real model, fp32): the FV score's indirect effects (a head's last-position output on a corrupted prompt
set to its clean task mean; :func:`inductionlab.protocols.function_vectors.indirect_effects`) by
* the exact fast path (``F.indirect_effects``: one prefix forward, batched copies of the last token),
* AtP (:func:`inductionlab.core.attribution.attribution_patching`: one forward + one backward per prompt),
* AtP*'s GradDrop (one more backward per layer; on ``--graddrop-prompts`` prompts),
* the authors' per-head loop (``tests/fv_oracle.py``: one full forward per head; on ``--loop-prompts`` prompts),
each as CPU seconds per prompt and as a ratio to a bare forward + backward (the metric's gradient down to the
input embeddings, parameters' gradients off) measured in the same run; then the agreement of AtP's mean estimate
with the exact AIE (Spearman ρ, top-k recall for k = 10 and 5 % of the heads, the largest misses).

Part 2 (``--llama8b``): a random-weight Llama shaped like Llama-3-8B (hidden 4096, 32 query heads on 8 KV heads,
head_dim 128, MLP 14336, vocabulary 128256) with 2 layers, bf16, one random prompt of ``--length`` tokens: the same
timings (the per-head loop a full forward per head under a last-position mean patch, timed on
``--loop-heads`` heads and scaled to all), so the per-layer cost can
be extrapolated (the unembedding's share is in every number: say so when extrapolating).

CPU time (``time.process_time``) of one process with ``--threads`` torch threads; run it alone.
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

from fv_oracle import indirect_effect  # noqa: E402
from inductionlab.core.attribution import attribution_patching  # noqa: E402
from inductionlab.core.instrument import HeadIntervention, instrument  # noqa: E402
from inductionlab.core.models import attention_shape, load_model  # noqa: E402
from inductionlab.core.patching import patched_last_logits  # noqa: E402
from inductionlab.measures.overlap import estimate_agreement  # noqa: E402
from inductionlab.protocols import function_vectors as F  # noqa: E402
from inductionlab.protocols.icl_tasks import build_tasks  # noqa: E402
from inductionlab.runtime.dtype_choice import cpu_flags  # noqa: E402


def _cpu(f):
    t0 = time.process_time()
    out = f()
    return out, time.process_time() - t0


def bare_forward_backward(model, ids, target) -> float:
    """CPU seconds of one forward with gradients and one backward of P(target) at the last position down to the
    input embeddings (parameters' gradients off, as AtP needs none)."""
    flags = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        emb = model.get_input_embeddings()(torch.tensor([ids])).detach().requires_grad_()

        def run():
            logits = model(inputs_embeds=emb, logits_to_keep=1).logits[0, -1]
            torch.softmax(logits.double(), -1)[target].backward()
        run()                                                  # warm-up
        return min(_cpu(run)[1] for _ in range(3))
    finally:
        for p, f in zip(model.parameters(), flags):
            p.requires_grad_(f)


def bare_forward(model, ids) -> float:
    with torch.inference_mode():
        model(input_ids=torch.tensor([ids]), logits_to_keep=1)
        return min(_cpu(lambda: model(input_ids=torch.tensor([ids]), logits_to_keep=1))[1] for _ in range(3))


def real_model(a) -> dict:
    loaded = load_model(a.model, dtype="float32")
    model = loaded.model
    s = attention_shape(model.config)
    L, H = s["n_layers"], s["n_heads"]
    tasks = a.tasks.split(",")
    tps = F.task_prompts(build_tasks(tasks), loaded.tokenizer, n_prompts=a.prompts, bos_id=loaded.tokenizer.bos_token_id)
    first = tps[tasks[0]].corrupted[0]
    t_fb = bare_forward_backward(model, first.input_ids, first.target_id)
    t_f = bare_forward(model, first.input_ids)
    cie, atp, times = [], [], {"exact": 0.0, "atp": 0.0, "graddrop": 0.0, "loop": 0.0}
    n, n_gd, n_loop = 0, 0, 0
    gd_rows, gd_exact = [], []
    for task in tasks:
        tp = tps[task]
        means, _ = F.clean_means(model, tp.clean)
        for i, p in enumerate(tp.corrupted):
            (_, c), t = _cpu(lambda: F.indirect_effects(model, p, means, rows=a.rows))
            times["exact"] += t
            r, t = _cpu(lambda: attribution_patching(model, [p.input_ids], p.target_id, means))
            times["atp"] += t
            cie.append(c)
            atp.append(r.atp[0])
            n += 1
            if n_gd < a.graddrop_prompts:
                r, t = _cpu(lambda: attribution_patching(model, [p.input_ids], p.target_id, means, graddrop=True))
                times["graddrop"] += t
                gd_rows.append(r.graddrop[0])
                gd_exact.append(c)
                n_gd += 1
            if n_loop < a.loop_prompts:
                _, t = _cpu(lambda: indirect_effect(model, p, means))
                times["loop"] += t
                n_loop += 1
            print(f"{task} prompt {i}: exact and AtP done", file=sys.stderr, flush=True)
    per = {"exact_fast_path": times["exact"] / n, "atp": times["atp"] / n,
           "atp_graddrop": times["graddrop"] / max(n_gd, 1), "per_head_loop": times["loop"] / max(n_loop, 1)}
    aie, est = np.mean(cie, 0), np.mean(atp, 0)
    agree = estimate_agreement(est, aie)
    agree_abs = estimate_agreement(np.abs(est), np.abs(aie))
    out = {"model": a.model, "dtype": "float32", "heads": L * H, "tasks": tasks, "prompts_per_task": a.prompts,
           "prompt_tokens": [len(tps[t].corrupted[0].input_ids) for t in tasks],
           "bare_forward_s": t_f, "bare_forward_backward_s": t_fb,
           "cpu_s_per_prompt": per,
           "ratio_to_forward_backward": {k: v / t_fb for k, v in per.items()},
           "agreement_signed": agree, "agreement_abs": agree_abs,
           "prompts_timed": {"exact": n, "atp": n, "graddrop": n_gd, "loop": n_loop}}
    if gd_rows:
        out["agreement_graddrop_vs_abs_exact"] = estimate_agreement(np.mean(gd_rows, 0), np.abs(np.mean(gd_exact, 0)))
        out["agreement_abs_atp_vs_abs_exact_same_prompts"] = estimate_agreement(
            np.abs(np.mean(atp[:len(gd_rows)], 0)), np.abs(np.mean(gd_exact, 0)))
    return out


def llama8b(a) -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                      head_dim=128, num_hidden_layers=2, vocab_size=128256, max_position_embeddings=8192,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    s = attention_shape(model.config)
    L, H, D = s["n_layers"], s["n_heads"], s["head_dim"]
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (a.length,), generator=g).tolist()
    target = 17
    means = torch.randn(L, H, D, generator=g).to(torch.bfloat16)
    t_fb = bare_forward_backward(model, ids, target)
    t_f = bare_forward(model, ids)
    sets = [[(l, h, means[l, h])] for l in range(L) for h in range(H)]
    _, t_exact = _cpu(lambda: patched_last_logits(model, ids, sets, rows=a.rows))
    _, t_atp = _cpu(lambda: attribution_patching(model, [ids], target, means))
    _, t_gd = _cpu(lambda: attribution_patching(model, [ids], target, means, graddrop=True))

    some = [(l, h) for l in range(L) for h in range(H)][::max(1, (L * H) // a.loop_heads)][:a.loop_heads]

    def loop():
        with torch.inference_mode():
            for l, h in some:
                if True:
                    with instrument(model, [HeadIntervention(l, h, "mean", value=means[l, h], positions="last")],
                                    strict=False):
                        model(input_ids=torch.tensor([ids]), logits_to_keep=1)
    _, t_loop = _cpu(loop)
    t_loop *= L * H / len(some)                    # timed on len(some) heads, scaled to all
    per = {"exact_fast_path": t_exact, "atp": t_atp, "atp_graddrop": t_gd, "per_head_loop": t_loop}
    return {"shape": "Llama-3-8B widths, 2 layers, random weights", "dtype": "bfloat16", "heads": L * H,
            "prompt_tokens": a.length, "loop_heads_timed": a.loop_heads, "bare_forward_s": t_f, "bare_forward_backward_s": t_fb,
            "cpu_s_per_prompt": per, "ratio_to_forward_backward": {k: v / t_fb for k, v in per.items()}}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tasks", default="next_letter,capitalize")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--rows", type=int, default=90)
    ap.add_argument("--loop-prompts", type=int, default=1)
    ap.add_argument("--graddrop-prompts", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--llama8b", action="store_true")
    ap.add_argument("--no-real", action="store_true", help="skip part 1")
    ap.add_argument("--length", type=int, default=96, help="prompt tokens of part 2")
    ap.add_argument("--loop-heads", type=int, default=8, help="heads the part-2 per-head loop times (scaled to all)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    out = {"cpu": cpu_flags(), "threads": a.threads}
    if not a.no_real:
        out["real"] = real_model(a)
    if a.llama8b:
        out["llama8b_2_layers"] = llama8b(a)
    print(json.dumps(out, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
