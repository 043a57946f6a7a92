"""Training throughput of a CPU preset against a torch matmul peak measured in the same run.

Not a test: run by hand, e.g.  python bench/train_throughput.py --preset cpu-tiny --seq-len 128

For each precision (fp32, bf16 autocast) it reports
  * peak: FLOP/s of a square torch.matmul (2·n³ FLOPs per product), best of several repeats;
  * train: tokens/s of full optimizer steps (forward + backward + AdamW) of the preset on random
    tokens, and achieved FLOP/s = tokens/s × FLOPs per token (6·N + attention, inductionlab.train.flops);
  * the ratio achieved / peak (model FLOPs utilisation against the measured, not the nominal, peak).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import LlamaForCausalLM

from inductionlab.train.config import TrainConfig, model_config
from inductionlab.train.flops import flops_per_token
from inductionlab.train.trainer import _optimizer


def matmul_peak(dtype: torch.dtype, n: int = 1024, reps: int = 10) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best


def train_rate(preset: str, seq_len: int, batch: int, steps: int, bf16: bool, vocab: int) -> dict:
    torch.manual_seed(0)
    cfg = model_config(preset, vocab, max_position_embeddings=seq_len)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).train()
    opt = _optimizer(model, TrainConfig())
    ids = torch.randint(0, vocab, (batch, seq_len))
    times = []
    for i in range(steps + 2):
        t = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= 2:                                   # two warm-up steps
            times.append(time.perf_counter() - t)
    dense, attn = flops_per_token(cfg, seq_len)
    tok_s = batch * seq_len / (sum(times) / len(times))
    return {"tokens_per_s": tok_s, "flops_per_token": dense + attn, "achieved_flops_per_s": tok_s * (dense + attn)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="cpu-tiny")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    out = {"preset": a.preset, "seq_len": a.seq_len, "batch": a.batch, "threads": torch.get_num_threads()}
    for name, dt, bf16 in (("fp32", torch.float32, False), ("bf16", torch.bfloat16, True)):
        peak = matmul_peak(dt)
        r = train_rate(a.preset, a.seq_len, a.batch, a.steps, bf16, a.vocab)
        out[name] = {"matmul_peak_flops_per_s": peak, **r, "fraction_of_peak": r["achieved_flops_per_s"] / peak}
        print(f"{name}: {r['tokens_per_s']:,.0f} tokens/s, {r['achieved_flops_per_s'] / 1e9:.2f} GFLOP/s achieved, "
              f"matmul peak {peak / 1e9:.2f} GFLOP/s -> {100 * out[name]['fraction_of_peak']:.1f}% of peak")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
