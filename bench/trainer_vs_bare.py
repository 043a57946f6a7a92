"""The project's trainer against a bare PyTorch loop of the same model and batch (issue 19 §1).

Not a test: run by hand on an idle machine, one thread, e.g.

    OMP_NUM_THREADS=1 python bench/trainer_vs_bare.py --data data/synth --preset cpu-micro \\
        --seq-len 64 --tokens-per-update 256 --steps 2000 --out bench/results/trainer_vs_bare.json

Both sides train the same Llama (``model_config(preset)``, seed, sdpa attention) in fp32 on the same
windows of the same prepared corpus, one micro-batch per update: forward, backward, gradient-norm
clip, AdamW (the trainer's ``_optimizer``: the same hyperparameters and weight-decay groups).

* **bare**: a plain loop over batches cut from the corpus stream before the clock starts; no
  schedule, logging, checkpoints or telemetry. Tokens/s = updates × tokens per update / loop time.
* **trainer**: :func:`inductionlab.train.train` with the given checkpoint and telemetry settings.
  ``loop`` tokens/s is what the trainer records (time inside its updates, data included);
  ``wall`` tokens/s divides by the whole ``train()`` call (set-up, checkpoints, telemetry,
  logging). The telemetry share is the time spent in ``Telemetry.measure`` over the ``train()``
  wall time; the checkpoint share likewise for checkpoint saving and the telemetry tables.

The two are run alternately ``--repeats`` times in ABBA order (bare first in even repeats, the
trainer first in odd ones: this machine's speed drifts by up to 1.5× within a minute, and a fixed
order charges the drift to one side); the ratio is the median of the per-pair ratios. A second,
finer measure interleaves blocks of ``--block-steps`` updates of the trainer's own update function
(``_update`` on the stream's batches, data included) with blocks of the bare step, in one process
(``--blocks`` pairs): it isolates the per-update cost from drift between whole runs. The JSON
holds every repeat and block, the medians, the ratios trainer/bare, the versions and the CPU kind. The
issue's targets: trainer ≥ 90% of the bare loop's tokens/s, telemetry ≤ 10% of training time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import LlamaForCausalLM

from inductionlab.runtime.dtype_choice import cpu_flags
from inductionlab.runtime.runs import versions
from inductionlab.train import TrainConfig, open_data, train
from inductionlab.train import trainer as trainer_mod
from inductionlab.train.config import model_config
from inductionlab.train.telemetry import Telemetry
from inductionlab.train.trainer import _optimizer


def fresh_model(cfg: TrainConfig, data):
    """(model config, model in train mode, AdamW): what the trainer builds from ``cfg.seed``."""
    torch.manual_seed(cfg.seed)
    mcfg = model_config(cfg.preset, data.vocab_size, max_position_embeddings=cfg.seq_len,
                        bos_token_id=data.bos_id, eos_token_id=data.eos_id)
    mcfg._attn_implementation = cfg.attn_implementation
    model = LlamaForCausalLM(mcfg).train()
    return mcfg, model, _optimizer(model, cfg)


def bare_loop(cfg: TrainConfig, data, steps: int) -> dict:
    """Tokens/s of forward + backward + clip + AdamW over ``steps`` pre-cut batches."""
    _, model, opt = fresh_model(cfg, data)
    batches = [data.stream.batch(s).input_ids for s in range(steps)]
    t0 = time.perf_counter()
    for ids in batches:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    dt = time.perf_counter() - t0
    return {"loop_s": dt, "tokens_per_s": steps * cfg.tokens_per_update / dt, "ms_per_update": 1e3 * dt / steps,
            "final_loss": float(loss.item())}


def update_blocks(cfg: TrainConfig, data, blocks: int, block_steps: int) -> dict:
    """Per-update ms of the trainer's ``_update`` (its batch fetched from the stream inside the
    block) against the bare step (batches pre-cut), in interleaved blocks (ABBA) of one process."""
    from inductionlab.train import distributed as D
    from inductionlab.train.schedule import build_scheduler
    from inductionlab.train.trainer import _Parts, _update

    _, bare_model, bare_opt = fresh_model(cfg, data)
    mcfg, model, opt = fresh_model(cfg, data)
    sched = build_scheduler(opt, cfg.steps, cfg.warmup_frac, cfg.min_lr_ratio)
    parts, dist = _Parts(mcfg, model, model, opt, sched, None), D.init()
    n = blocks * block_steps
    batches = [data.stream.batch(s % data.stream.num_batches).input_ids for s in range(n)]

    def bare(lo):
        t = time.perf_counter()
        for ids in batches[lo:lo + block_steps]:
            bare_model(input_ids=ids, labels=ids).loss.backward()
            torch.nn.utils.clip_grad_norm_(bare_model.parameters(), cfg.grad_clip)
            bare_opt.step()
            bare_opt.zero_grad(set_to_none=True)
        return 1e3 * (time.perf_counter() - t) / block_steps

    def trainer(lo):
        t = time.perf_counter()
        for s in range(lo, lo + block_steps):
            _update(parts, data.stream.batch(s % data.stream.num_batches), cfg, dist)
        return 1e3 * (time.perf_counter() - t) / block_steps

    b, u = [], []
    for k in range(blocks):
        lo = k * block_steps
        if k % 2:
            u.append(trainer(lo))
            b.append(bare(lo))
        else:
            b.append(bare(lo))
            u.append(trainer(lo))
    ratios = [x / y for x, y in zip(b, u)]
    return {"block_steps": block_steps, "bare_ms": b, "update_ms": u, "ratio_median": statistics.median(ratios)}


class _Timer:
    """Accumulates the time spent in one method (patched for the length of a ``train()`` call)."""

    def __init__(self, owner, name: str):
        self.owner, self.name, self.seconds, self.calls = owner, name, 0.0, 0
        self.orig = getattr(owner, name)

    def __enter__(self):
        orig, timer = self.orig, self

        def timed(*a, **kw):
            t = time.perf_counter()
            try:
                return orig(*a, **kw)
            finally:
                timer.seconds += time.perf_counter() - t
                timer.calls += 1

        setattr(self.owner, self.name, timed)
        return self

    def __exit__(self, *exc):
        setattr(self.owner, self.name, self.orig)


def trainer_run(cfg: TrainConfig, out: Path) -> dict:
    """One :func:`train` call into ``out``; its loop and wall tokens/s and the telemetry share."""
    with _Timer(Telemetry, "measure") as tel, _Timer(trainer_mod.Checkpointer, "save") as save, \
            _Timer(trainer_mod, "write_tables") as tables:
        t0 = time.perf_counter()
        res = train(dataclass_replace(cfg, out=str(out)), overwrite=True)
        wall = time.perf_counter() - t0
    r = res.record["results"]
    tokens = res.tokens
    return {"wall_s": wall, "loop_s": r["train_time_s"], "tokens_per_s_loop": r["tokens_per_s"],
            "tokens_per_s_wall": tokens / wall, "ms_per_update_loop": 1e3 * r["train_time_s"] / res.steps,
            "telemetry_s": tel.seconds, "telemetry_calls": tel.calls, "telemetry_share": tel.seconds / wall,
            "checkpoint_s": save.seconds + tables.seconds, "checkpoint_share": (save.seconds + tables.seconds) / wall,
            "final_loss": r["final_loss"]}


def dataclass_replace(cfg, **kw):
    import dataclasses
    return dataclasses.replace(cfg, **kw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="a prepared corpus directory")
    ap.add_argument("--preset", default="cpu-micro")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--tokens-per-update", type=int, default=256)
    ap.add_argument("--steps", type=int, default=2000, help="updates per timed run")
    ap.add_argument("--log-checkpoints", type=int, default=12, help="the trainer's log-spaced checkpoints")
    ap.add_argument("--telemetry-seq-len", type=int, default=24)
    ap.add_argument("--telemetry-batch", type=int, default=16)
    ap.add_argument("--eval-tokens", type=int, default=65536)
    ap.add_argument("--repeats", type=int, default=3, help="alternating bare/trainer pairs")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--blocks", type=int, default=10, help="interleaved update blocks (0: skip)")
    ap.add_argument("--block-steps", type=int, default=300)
    ap.add_argument("--out", type=Path, default=None, help="JSON file (default: print only)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg = TrainConfig(data=a.data, preset=a.preset, seq_len=a.seq_len, tokens_per_update=a.tokens_per_update,
                      tokens=a.steps * a.tokens_per_update, micro_batch_size=a.tokens_per_update // a.seq_len,
                      precision="fp32", log_checkpoints=a.log_checkpoints, telemetry_seq_len=a.telemetry_seq_len,
                      telemetry_batch=a.telemetry_batch, eval_tokens=a.eval_tokens, warmup_frac=0.01,
                      min_lr_ratio=1.0, progress=False, tensorboard=False, log_every=max(1, a.steps // 100),
                      out="unused")   # each timed run gets its own directory
    cfg.validate()
    data = open_data(cfg)
    bare, trn = [], []
    with tempfile.TemporaryDirectory(prefix="trainer_vs_bare-") as tmp:
        for i in range(a.repeats):
            if i % 2 == 0:
                bare.append(bare_loop(cfg, data, a.steps))
                trn.append(trainer_run(cfg, Path(tmp) / f"run{i}"))
            else:
                trn.append(trainer_run(cfg, Path(tmp) / f"run{i}"))
                bare.append(bare_loop(cfg, data, a.steps))
            print(f"repeat {i}: bare {bare[-1]['tokens_per_s']:,.0f} tokens/s ({bare[-1]['ms_per_update']:.2f} ms/update); "
                  f"trainer loop {trn[-1]['tokens_per_s_loop']:,.0f}, wall {trn[-1]['tokens_per_s_wall']:,.0f} tokens/s; "
                  f"telemetry {100 * trn[-1]['telemetry_share']:.1f}% of the trainer's wall time", flush=True)
    med = {"bare_tokens_per_s": statistics.median(b["tokens_per_s"] for b in bare),
           "trainer_tokens_per_s_loop": statistics.median(t["tokens_per_s_loop"] for t in trn),
           "trainer_tokens_per_s_wall": statistics.median(t["tokens_per_s_wall"] for t in trn),
           "telemetry_share": statistics.median(t["telemetry_share"] for t in trn),
           "checkpoint_share": statistics.median(t["checkpoint_share"] for t in trn)}
    med["ratio_loop"] = statistics.median(t["tokens_per_s_loop"] / b["tokens_per_s"] for b, t in zip(bare, trn))
    med["ratio_wall"] = statistics.median(t["tokens_per_s_wall"] / b["tokens_per_s"] for b, t in zip(bare, trn))
    blocks = update_blocks(cfg, data, a.blocks, a.block_steps) if a.blocks > 0 else None
    if blocks:
        med["ratio_update_blocks"] = blocks["ratio_median"]
    load = None
    try:
        import os
        load = os.getloadavg()
    except OSError:
        pass
    out = {"kind": "bench-trainer-vs-bare", "params": {k: (str(v) if isinstance(v, Path) else v)
                                                       for k, v in vars(a).items()},
           "threads": torch.get_num_threads(), "cpu": cpu_flags(), "load_average_at_end": load,
           "corpus": str(a.data), "median": med, "bare": bare, "trainer": trn, "update_blocks": blocks,
           "targets": {"ratio_at_least": 0.9, "telemetry_share_at_most": 0.1}, "versions": versions()}
    print(f"median: bare {med['bare_tokens_per_s']:,.0f} tokens/s; trainer loop {med['trainer_tokens_per_s_loop']:,.0f} "
          f"({100 * med['ratio_loop']:.1f}% of bare), wall {med['trainer_tokens_per_s_wall']:,.0f} "
          f"({100 * med['ratio_wall']:.1f}%; median of per-pair ratios); "
          + (f"update blocks {100 * med['ratio_update_blocks']:.1f}% of bare; " if blocks else "")
          + f"telemetry {100 * med['telemetry_share']:.1f}%, checkpoints "
          f"{100 * med['checkpoint_share']:.1f}% of the trainer's wall time; cpu {out['cpu']['model']} "
          f"({out['cpu']['capability']}), {out['threads']} thread(s), load {load}")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
