"""Matched-compute pretraining (SPEC §7): a thin loop over components.

    config      TrainConfig, model presets              (config.py)
    data        TokenShards + Bi-Induct stream           (inductionlab.data, inductionlab.curriculum)
    parallel    torchrun / DDP / FSDP2                   (distributed.py)
    optimizer   AdamW + warm-up/cosine                   (schedule.py)
    checkpoint  log-spaced, atomic, verified resume      (checkpoint.py)
    telemetry   head scores + held-out perplexity        (telemetry.py)
    metrics     JSONL/CSV, TensorBoard, progress bar     (metrics.py)
    budget      iso-FLOPs accounting                     (flops.py)

One optimizer step consumes ``stream.batch(step)``: the global batch of ``tokens_per_update``
tokens, which rank r slices to its share and cuts into micro-batches (gradient accumulation).
The data position is therefore the step itself, and a resumed run sees exactly the batches an
uninterrupted run would have seen. With ``deterministic=True`` on CPU the final weights of a
killed-and-resumed run equal those of an uninterrupted one bit for bit.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from transformers import LlamaForCausalLM

from ..errors import InductionLabError
from ..runs import atomic_write_json, atomic_write_text, versions
from . import distributed as D
from .checkpoint import CheckpointManager, checkpoint_schedule, rng_state, set_rng_state
from .config import TrainConfig, model_config
from .flops import budget as make_budget
from .metrics import MetricsLogger
from .schedule import build_scheduler, lr_factor
from .telemetry import measure, read_telemetry, summarize, emergence_step


@dataclass
class TrainData:
    """What the loop needs from the data side.

    Attributes:
        stream: object with ``.batch(step) -> Batch`` (``input_ids`` LongTensor [global_batch, seq_len],
            ``synthetic_fraction`` float) and ``.num_batches``; deterministic random access.
        heldout: 1-D array of held-out token ids (natural text) for perplexity.
        tokenizer: a ``PreTrainedTokenizerBase`` saved next to every checkpoint (or None).
        identity: facts that identify the data (corpus hash, tokenizer); part of the run identity.
    """

    stream: Any
    heldout: np.ndarray | None
    vocab_size: int
    tokenizer: Any = None
    bos_id: int | None = None
    eos_id: int | None = None
    sep_id: int | None = None
    special_ids: Sequence[int] = ()
    identity: dict = field(default_factory=dict)


def open_data(cfg: TrainConfig) -> TrainData:
    """Open ``cfg.data`` (a prepared corpus) and build the Bi-Induct stream for this run's budget."""
    from ..curriculum import BiInductStream, CurriculumConfig
    from ..data.shards import TokenShards

    shards = TokenShards.open(cfg.data)
    rng = ((cfg.span_length_min, cfg.span_length_max) if cfg.span_length_min > 0 and cfg.span_length_max > 0
           else None)
    ccfg = CurriculumConfig(variant=cfg.curriculum, span_length=cfg.span_length, span_length_range=rng, m0=cfg.m0,
                            anneal_tokens=cfg.anneal_tokens or None, span_source=cfg.span_source,
                            sep_id=shards.sep_id, seed=cfg.seed)
    special = tuple(i for i in (shards.eos_id, shards.bos_id) if i is not None)
    stream = BiInductStream.from_shards(shards, ccfg, batch_size=cfg.global_batch, seq_len=cfg.seq_len,
                                        total_tokens=cfg.steps * cfg.tokens_per_update)
    m = shards.manifest
    identity = {"corpus": {k: m.get(k) for k in ("source", "corpus_sha256", "tokenizer") if k in m},
                "train_tokens": int(len(shards.train)), "heldout_tokens": int(len(shards.heldout))}
    return TrainData(stream=stream, heldout=shards.heldout, vocab_size=shards.vocab_size,
                     tokenizer=shards.hf_tokenizer(), bos_id=shards.bos_id, eos_id=shards.eos_id,
                     sep_id=shards.sep_id, special_ids=special, identity=identity)


def _autocast_dtype(cfg: TrainConfig, device: torch.device) -> torch.dtype | None:
    if cfg.precision == "bf16":
        return torch.bfloat16
    if cfg.precision == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return None


def _optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW (SPEC §7); weight decay on matrices (≥ 2-D: projections, embeddings), not on norm gains
    (nanoGPT / Llama convention)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)


def _identity(cfg: TrainConfig, data: TrainData) -> dict:
    return {"config": cfg.run_identity(), "data": data.identity}


def _first_difference(a: Any, b: Any, prefix: str = "") -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            d = _first_difference(a.get(k), b.get(k), f"{prefix}{k}.")
            if d:
                return d
        return None
    return None if a == b else f"{prefix.rstrip('.')} is {a!r} there vs {b!r} now"


def _prepare_run_dir(run_dir: Path, identity: dict) -> dict | None:
    """Return the existing run record when ``run_dir`` holds this same run (resume), None when new.

    Raises:
        InductionLabError: the directory holds something else or a different run.
    """
    rec_path = run_dir / "run.json"
    if rec_path.is_file():
        try:
            rec = json.loads(rec_path.read_text())
            theirs = rec["identity"]
        except (ValueError, KeyError):
            raise InductionLabError(f"{rec_path} is unreadable; pass a new --out") from None
        diff = _first_difference(json.loads(json.dumps(theirs)), json.loads(json.dumps(identity)))
        if diff:
            raise InductionLabError(f"output directory {run_dir} holds a different run ({diff}); "
                                    "pass a new --out or the same config to resume")
        return rec
    if run_dir.exists() and any(run_dir.iterdir()):
        raise InductionLabError(f"output directory {run_dir} is not empty and holds no training run; "
                                "pass a new --out")
    return None


@dataclass
class TrainResult:
    run_dir: Path
    steps: int
    tokens: int
    final_loss: float | None
    tokens_per_s: float | None
    record: dict


def train(cfg: TrainConfig, *, data: TrainData | None = None) -> TrainResult:
    """Train one run to completion, resuming from ``cfg.out`` when it holds the same run.

    Args:
        cfg: the run (validated here).
        data: data components; default :func:`open_data` (``cfg.data``).

    Returns: :class:`TrainResult` (also written to ``cfg.out/run.json``).

    Raises:
        InductionLabError: invalid config, budget below one update, output directory holding a
            different run, corrupt checkpoint, data errors.
    """
    dist = D.init()
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        return _train(cfg, data, dist)
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
        D.shutdown()


def _train(cfg: TrainConfig, data: TrainData | None, dist: D.Dist) -> TrainResult:
    cfg.validate(dist.world_size)
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True)
    data = data or open_data(cfg)
    run_dir = Path(cfg.out)
    steps, accum = cfg.steps, cfg.accum_steps(dist.world_size)
    if getattr(data.stream, "num_batches", steps) < steps:
        raise InductionLabError(f"the data stream holds {data.stream.num_batches} batches, fewer than the "
                                f"{steps} updates of this budget; lower --tokens or use a larger corpus")
    mcfg = model_config(cfg.preset, data.vocab_size, max_position_embeddings=cfg.seq_len,
                        bos_token_id=data.bos_id, eos_token_id=data.eos_id)
    bud = make_budget(mcfg, seq_len=cfg.seq_len, tokens_per_update=cfg.tokens_per_update, steps=steps)
    identity = _identity(cfg, data)
    existing = _prepare_run_dir(run_dir, identity)
    ckpts = CheckpointManager(run_dir, cfg.keep_resumable)
    if existing is not None and existing.get("status") == "complete":
        return TrainResult(run_dir, steps, bud.tokens, existing.get("results", {}).get("final_loss"),
                           existing.get("results", {}).get("tokens_per_s"), existing)
    resume = ckpts.latest_resumable() if existing is not None else None

    # ---- model, parallelism, optimizer -------------------------------------------------------
    torch.manual_seed(cfg.seed)
    if resume is not None:
        model = LlamaForCausalLM.from_pretrained(resume[1], dtype=torch.float32,
                                                 attn_implementation=cfg.attn_implementation)
    else:
        mcfg._attn_implementation = cfg.attn_implementation
        model = LlamaForCausalLM(mcfg)
    model.to(dist.device).train()
    amp = _autocast_dtype(cfg, dist.device)
    fsdp = dist.distributed and cfg.parallel == "fsdp"
    wrapped = D.wrap(model, cfg.parallel, dist, bf16=amp is not None)
    optimizer = _optimizer(wrapped, cfg)
    scheduler = build_scheduler(optimizer, steps, cfg.warmup_frac, cfg.min_lr_ratio)
    start = 0
    elapsed0 = 0.0
    if resume is not None:
        state = CheckpointManager.load_trainer_state(resume[1])
        fmt = "fqn" if fsdp else "plain"
        if state.get("optimizer_format") != fmt:
            raise InductionLabError(f"checkpoint {resume[1]} was written in {state.get('optimizer_format')} "
                                    f"optimizer format; resume it with the same --parallel mode")
        if state["optimizer"] is not None:
            D.load_optimizer_state(wrapped, optimizer, state["optimizer"], cfg.parallel, dist)
        scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
        start = int(state["step"])
        elapsed0 = float(state.get("elapsed_s", 0.0))

    schedule = set(checkpoint_schedule(steps, cfg.log_checkpoints, cfg.dense_start, cfg.dense_end, cfg.dense_every))
    record = {
        "kind": "train", "status": "running", "identity": identity, "config": cfg.to_dict(),
        "model_config": mcfg.to_dict(), "budget": bud.to_dict(), "checkpoint_steps": sorted(schedule),
        "world_size": dist.world_size, "parallel": cfg.parallel if dist.distributed else "none",
        "device": str(dist.device), "autocast": str(amp) if amp else "fp32", "accumulation_steps": accum,
        "seeds": {"init": cfg.seed, "curriculum": cfg.seed, "telemetry": cfg.seed}, "versions": versions(),
        "started": existing.get("started", time.time()) if existing else time.time(),
        "resumed_from_step": start if resume is not None else None,
        "stream": data.stream.describe() if hasattr(data.stream, "describe") else None,
    }
    if dist.is_main:
        ckpts.clean_partials()
        atomic_write_json(run_dir / "run.json", record)
    logger = MetricsLogger(run_dir, start_step=start, total_steps=steps, enabled=dist.is_main,
                           progress=cfg.progress, tensorboard=cfg.tensorboard)

    def checkpoint(step: int, kind: str) -> None:
        """Collective: gather full state, then rank 0 measures telemetry and publishes atomically."""
        sd = D.full_model_state(wrapped, cfg.parallel, dist) if fsdp else None
        # no optimizer state before the first update (the FSDP state-dict API would otherwise
        # initialise it with a zero-lr step, advancing AdamW's step count)
        osd = D.optimizer_state(wrapped, optimizer, cfg.parallel, dist) if step > 0 else None
        if dist.is_main:
            host = model
            if fsdp:                                        # a plain copy to save and to probe
                host = LlamaForCausalLM(mcfg)
                host.load_state_dict(sd)
                host.to(dist.device)
            tel = None
            if cfg.telemetry and kind == "schedule":
                tel = measure(host, vocab_size=data.vocab_size, special_ids=data.special_ids, bos_id=data.bos_id,
                              sep_id=data.sep_id, span_length=cfg.span_length, seq_len=cfg.telemetry_seq_len,
                              batch_size=cfg.telemetry_batch, heldout=data.heldout, eval_seq_len=cfg.seq_len,
                              eval_tokens=cfg.eval_tokens, autocast_dtype=amp, seed=cfg.seed)
                tel.update(step=step, tokens=step * cfg.tokens_per_update)
                logger.log_eval(step, {"eval/heldout_loss": tel["heldout_loss"],
                                       "eval/max_induction": float(np.max(tel["scores"]["induction"]))})
            trainer_state = {"step": step, "stream_step": step, "tokens": step * cfg.tokens_per_update,
                             "optimizer": osd, "optimizer_format": "fqn" if fsdp else "plain",
                             "scheduler": scheduler.state_dict(), "rng": rng_state(),
                             "world_size": dist.world_size, "elapsed_s": elapsed0 + train_time}
            meta = {"tokens": step * cfg.tokens_per_update, "kind": kind, "lr_next": scheduler.get_last_lr()[0]}
            ckpts.save(step, model=host, state_dict=None, tokenizer=data.tokenizer, trainer_state=trainer_state,
                       meta=meta, extra_json={"telemetry.json": tel} if tel is not None else None)
            logger.write_csv()
            if tel is not None:
                _write_tables(run_dir)
        D.barrier(dist)

    train_time = 0.0
    if start == 0 and 0 in schedule and resume is None:
        checkpoint(0, "schedule")

    # ---- the loop ----------------------------------------------------------------------------
    last_loss = None
    tok_s = None
    per_rank = cfg.global_batch // dist.world_size
    for step in range(start, steps):
        t0 = time.perf_counter()
        batch = data.stream.batch(step)
        ids = batch.input_ids[dist.rank * per_rank:(dist.rank + 1) * per_rank].to(dist.device)
        loss_sum = 0.0
        for i in range(accum):
            mb = ids[i * cfg.micro_batch_size:(i + 1) * cfg.micro_batch_size]
            with D.gradient_sync(wrapped, cfg.parallel, dist, sync=i == accum - 1), \
                    torch.autocast(dist.device.type, dtype=amp or torch.float32, enabled=amp is not None):
                loss = wrapped(input_ids=mb, labels=mb).loss
            (loss / accum).backward()
            loss_sum += loss.item()
        gnorm = D.clip_grad_norm(wrapped, cfg.grad_clip) if cfg.grad_clip > 0 else float("nan")
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        last_loss = D.mean_across(loss_sum / accum, dist)
        dt = time.perf_counter() - t0
        train_time += dt
        tok_s = cfg.tokens_per_update / dt
        if not math.isfinite(last_loss):
            raise InductionLabError(f"loss became {last_loss} at step {step + 1}; lower --lr or check the data")
        done = step + 1
        if done % cfg.log_every == 0 or done == steps:
            logger.log({"step": done, "tokens": done * cfg.tokens_per_update, "loss": last_loss, "lr": lr,
                        "grad_norm": gnorm, "synthetic_fraction": float(getattr(batch, "synthetic_fraction", 0.0)),
                        "tokens_per_s": tok_s, "step_time_s": dt})
        if done in schedule:
            checkpoint(done, "schedule")
        elif cfg.save_every and done % cfg.save_every == 0:
            checkpoint(done, "rolling")
    logger.close()

    # ---- record ------------------------------------------------------------------------------
    results: dict[str, Any] = {"final_loss": last_loss, "steps": steps, "tokens": bud.tokens,
                               "train_time_s": elapsed0 + train_time,
                               "tokens_per_s": (steps - start) * cfg.tokens_per_update / train_time if train_time else None,
                               "achieved_flops_per_s": ((steps - start) * cfg.tokens_per_update * bud.flops / bud.tokens
                                                        / train_time) if train_time else None}
    if dist.is_main and cfg.telemetry:
        heads, evals = read_telemetry(run_dir)
        summ = summarize(heads)
        final = summ[summ["step"] == summ["step"].max()].set_index("score")
        results.update({"emergence_step": emergence_step(summ, cfg.induction_threshold),
                        "induction_threshold": cfg.induction_threshold,
                        "final_max_induction": float(final.loc["induction", "max"]),
                        "final_max_anti_induction": float(final.loc["anti_induction", "max"]),
                        "final_heldout_ppl": _float_or_none(evals.sort_values("step")["heldout_ppl"].iloc[-1])})
    record.update(status="complete", results=results, finished=time.time())
    if dist.is_main:
        atomic_write_json(run_dir / "run.json", record)
    D.barrier(dist)
    return TrainResult(run_dir, steps, bud.tokens, last_loss, results["tokens_per_s"], record)


def _float_or_none(x) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def _write_tables(run_dir: Path) -> None:
    """Rebuild the run-level telemetry tables from the checkpoints' telemetry.json (atomic)."""
    heads, evals = read_telemetry(run_dir)
    atomic_write_text(run_dir / "telemetry_heads.csv", heads.to_csv(index=False))
    atomic_write_text(run_dir / "telemetry_eval.csv", evals.to_csv(index=False))
    atomic_write_text(run_dir / "telemetry_summary.csv", summarize(heads).to_csv(index=False))


__all__ = ["TrainData", "TrainResult", "open_data", "train", "lr_factor"]
