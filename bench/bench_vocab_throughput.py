"""Training throughput of a tiny Llama against vocabulary size (run by hand, CPU).

    python bench/bench_vocab_throughput.py [--threads 1] [--steps 10]

Measured here (torch 2.13 CPU, --threads 1, best of 2): vocab 4096 9.2 k tokens/s, 8192 4.9 k,
49152 1.0 k. With --threads 2 on the shared 2-core machine the numbers collapse to ~0.3 k for
every size (threads wait on each other while other jobs hold the cores), so compare sizes
with one thread unless the machine is idle.

A 2-layer, width-128 LlamaForCausalLM (4 heads, SwiGLU MLP 512, untied embeddings) takes
forward + backward + AdamW steps on random ids, batch 8 x 128 tokens; prints the best of
``--repeats`` tokens/s for each vocabulary size (the machine is shared), in wall time and per
CPU-second of this process (less sensitive to other jobs; compare sizes with ``--threads 1``). The LM head and embedding grow with the vocabulary while the transformer
blocks stay fixed, which is why a 4-8 k BPE suits CPU-scale training and SmolLM2's 49 152-token
vocabulary does not.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tokens_per_second(vocab: int, *, batch: int, seq: int, steps: int, warmup: int = 3) -> tuple[float, float, int]:
    """(tokens per wall second, tokens per CPU second of this process, parameter count)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=128, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=seq,
                      rope_theta=10000.0, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    x = torch.randint(0, vocab, (batch, seq))
    for i in range(warmup + steps):
        if i == warmup:
            t0, c0 = time.perf_counter(), time.process_time()
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    n = steps * batch * seq
    return n / dt, n / dc, sum(p.numel() for p in model.parameters())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--vocab", default="4096,8192,16384,49152")
    ap.add_argument("--repeats", type=int, default=3, help="best of N (the machine is shared)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, {a.threads} threads, batch {a.batch}x{a.seq}")
    vocabs = [int(s) for s in a.vocab.split(",")]
    best: dict[int, float] = {}
    best_cpu: dict[int, float] = {}
    n_params: dict[int, int] = {}
    for _ in range(a.repeats):           # interleaved, so a busy spell hits every size alike
        for v in vocabs:
            tps, tpc, n_params[v] = tokens_per_second(v, batch=a.batch, seq=a.seq, steps=a.steps)
            best[v] = max(best.get(v, 0.0), tps)
            best_cpu[v] = max(best_cpu.get(v, 0.0), tpc)
    for v in vocabs:
        print(f"vocab {v:>6}: {n_params[v] / 1e6:6.2f} M params  {best[v]:8.0f} tokens/s wall  "
              f"{best_cpu[v]:8.0f} tokens per CPU-second (fwd+bwd+AdamW, best of {a.repeats})")


if __name__ == "__main__":
    main()
