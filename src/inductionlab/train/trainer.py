"""Matched-compute pretraining (SPEC §7): a thin loop over components.

    config      TrainConfig, model presets              (config.py)
    data        TokenShards + Bi-Induct stream           (inductionlab.data, inductionlab.data.curriculum)
    parallel    torchrun / DDP / FSDP2                   (distributed.py)
    optimizer   AdamW + warm-up/cosine                   (schedule.py)
    checkpoint  Checkpointer: FSDP gather + atomic, verified, log-spaced checkpoints   (checkpoint.py)
    telemetry   Telemetry: should_measure(step) / measure(model, step); run_summary   (telemetry.py)
    metrics     JSONL/CSV, TensorBoard, progress bar     (metrics.py)
    budget      iso-FLOPs accounting                     (flops.py)

``_train`` reads as check → build → resume → loop → finish; nothing is written before the
config, the output path and the data have been checked.

One optimizer step consumes ``stream.batch(step)``: the global batch of ``tokens_per_update``
tokens, which rank r slices to its share and cuts into micro-batches (gradient accumulation).
The data position is therefore the step itself, and a resumed run sees exactly the batches an
uninterrupted run would have seen. With ``deterministic=True`` on CPU the final weights of a
killed-and-resumed run equal those of an uninterrupted one bit for bit.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from transformers import LlamaForCausalLM

from ..errors import InductionLabError
from ..runtime.outputs import check_no_links_out, check_output_dir
from ..runtime.run_dir import TrainRun
from ..runtime.runs import (atomic_write_json, own_entries, remove_run_dir, remove_stale_partials, run_identity, timed,
                            versions)
from . import distributed as D
from .checkpoint import Checkpointer, CheckpointManager, checkpoint_schedule, set_rng_state
from .config import TrainConfig, model_config
from .flops import budget as make_budget
from .metrics import MetricsLogger
from .schedule import build_scheduler, lr_factor
from .telemetry import Telemetry, check_telemetry, read_telemetry, run_summary, write_tables


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
    probe_pool: np.ndarray | None = None      # ids of the training split (TokenShards.token_pool): telemetry draws
                                              # its random probe tokens here (None: the whole vocabulary;
                                              # not counted when telemetry is off)


def open_data(cfg: TrainConfig) -> TrainData:
    """Open ``cfg.data`` (a prepared corpus) and build the Bi-Induct stream for this run's budget.

    Raises:
        InductionLabError: not a prepared corpus, a token id outside the vocabulary in either
            split, a curriculum that does not fit the data.
    """
    from ..data.curriculum import BiInductStream, check_token_ids
    from ..data.shards import TokenShards

    shards = TokenShards.open(cfg.data)
    c = cfg.curriculum
    ccfg = dataclasses.replace(c, seed=cfg.seed if c.seed is None else c.seed,
                               sep_id=shards.sep_id if c.sep_id is None else c.sep_id)
    special = tuple(i for i in (shards.eos_id, shards.bos_id) if i is not None)
    stream = BiInductStream.from_shards(shards, ccfg, batch_size=cfg.global_batch, seq_len=cfg.seq_len,
                                        total_tokens=cfg.steps * cfg.tokens_per_update)
    check_token_ids(shards.heldout, shards.vocab_size, str(shards.path / "heldout.bin"))
    m = shards.manifest
    identity = {"corpus": {k: m.get(k) for k in ("source", "corpus_sha256", "tokenizer") if k in m},
                "train_tokens": int(len(shards.train)), "heldout_tokens": int(len(shards.heldout))}
    return TrainData(stream=stream, heldout=shards.heldout, vocab_size=shards.vocab_size,
                     tokenizer=shards.hf_tokenizer(), bos_id=shards.bos_id, eos_id=shards.eos_id,
                     sep_id=shards.sep_id, special_ids=special, identity=identity,
                     probe_pool=shards.token_pool() if cfg.telemetry else None)


def check_data(cfg: TrainConfig, data: TrainData) -> None:
    """What depends on both the config and the data, checked before anything is written.

    Raises:
        InductionLabError: fewer batches than updates, a telemetry probe that does not fit the
            context once BOS is known, a held-out split shorter than one evaluation window.
    """
    if getattr(data.stream, "num_batches", cfg.steps) < cfg.steps:
        raise InductionLabError(f"the data stream holds {data.stream.num_batches} batches, fewer than the "
                                f"{cfg.steps} updates of this budget; lower --tokens or use a larger corpus")
    cfg.check_telemetry_fits(bos=data.bos_id is not None)
    if cfg.telemetry and cfg.eval_tokens > 0 and data.heldout is not None and len(data.heldout) < cfg.seq_len:
        raise InductionLabError(f"the held-out split has {len(data.heldout)} tokens, fewer than one window of "
                                f"--seq-len {cfg.seq_len}; pass --eval-tokens 0 or prepare the corpus with a larger "
                                "--heldout-fraction")


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

    A run directory whose run holds no published checkpoint (stopped before checkpoint 0, e.g. by
    an error) has no finished piece to protect: it is started afresh, whatever its config was.

    Raises:
        InductionLabError: the directory holds something else or a different run with checkpoints.
    """
    run = TrainRun(run_dir)
    if run.has_record and not run.checkpoints(complete=False):
        return None
    if run.has_record:
        rec = TrainRun.open(run_dir).record           # damaged or of another shape: one line naming it
        if "identity" not in rec:
            raise InductionLabError(f"{run.record_path} is unreadable; pass a new --out")
        theirs = rec["identity"]
        diff = _first_difference(json.loads(json.dumps(theirs)), json.loads(json.dumps(identity)))
        if diff:
            raise InductionLabError(f"output directory {run_dir} holds a different run ({diff}); "
                                    "pass a new --out or the same config to resume")
        return rec
    if own_entries(run_dir):              # our temporaries (a kill mid-write) do not count
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


def train(cfg: TrainConfig, *, data: TrainData | None = None, overwrite: bool = False) -> TrainResult:
    """Train one run to completion, resuming from ``cfg.out`` when it holds the same run.

    Args:
        cfg: the run (validated here, before anything is loaded or written).
        data: data components; default :func:`open_data` (``cfg.data``).
        overwrite: delete ``cfg.out`` first and start afresh (``--overwrite``).

    Returns: :class:`TrainResult` (also written to ``cfg.out/run.json``).

    Raises:
        InductionLabError: invalid config, budget below one update, an output path that cannot be
            written, output directory holding a different run, corrupt checkpoint, data errors.
        TypeError: ``cfg`` not a TrainConfig (a dict: ``config_from_dict(d)``).
    """
    from ..checks import check_type

    check_type(cfg, TrainConfig, "train: cfg", "; build one with inductionlab.train.config_from_dict(your_dict)")
    dist = D.init()
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        return _train(cfg, data, dist, overwrite)
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
        D.shutdown()


@dataclass
class _Parts:
    """What the loop trains: the model (plain), its wrapped form, optimizer, schedule."""
    mcfg: Any
    model: torch.nn.Module
    wrapped: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    amp: torch.dtype | None


def _build(cfg: TrainConfig, data: TrainData, dist: D.Dist, resume_dir: Path | None) -> _Parts:
    """Model (fresh from ``cfg.seed``, or the weights of ``resume_dir``), parallel wrapper, AdamW, schedule."""
    mcfg = model_config(cfg.preset, data.vocab_size, max_position_embeddings=cfg.seq_len,
                        bos_token_id=data.bos_id, eos_token_id=data.eos_id)
    torch.manual_seed(cfg.seed)
    if resume_dir is not None:
        from ..documents import check_model_folder

        check_model_folder(resume_dir)                # its config.json bounded before transformers parses it
        model = LlamaForCausalLM.from_pretrained(resume_dir, dtype=torch.float32, trust_remote_code=False,
                                                 attn_implementation=cfg.attn_implementation)
    else:
        mcfg._attn_implementation = cfg.attn_implementation
        model = LlamaForCausalLM(mcfg)
    model.to(dist.device).train()
    amp = _autocast_dtype(cfg, dist.device)
    wrapped = D.wrap(model, cfg.parallel, dist, bf16=amp is not None)
    optimizer = _optimizer(wrapped, cfg)
    scheduler = build_scheduler(optimizer, cfg.steps, cfg.warmup_frac, cfg.min_lr_ratio)
    return _Parts(mcfg, model, wrapped, optimizer, scheduler, amp)


def _train(cfg: TrainConfig, data: TrainData | None, dist: D.Dist, overwrite: bool) -> TrainResult:
    # ---- check: config, output path, data; nothing written yet --------------------------------
    cfg.validate(dist.world_size)
    run_dir = check_output_dir(cfg.out, inputs=[cfg.data])
    data = data or open_data(cfg)
    check_data(cfg, data)
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True)
    if overwrite and dist.is_main and run_dir.exists():
        remove_run_dir(run_dir)           # never through a link
    D.barrier(dist)
    check_no_links_out(run_dir)           # resume, pruning and logs never write through a link out of the run
    steps = cfg.steps
    identity = _identity(cfg, data)
    existing = _prepare_run_dir(run_dir, identity)
    ckpts = CheckpointManager(run_dir, cfg.keep_resumable, run=run_identity("train", identity))
    if existing is not None and existing.get("status") == "complete":
        r = existing.get("results") if isinstance(existing.get("results"), dict) else {}
        return TrainResult(run_dir, steps, existing["budget"].get("tokens"), r.get("final_loss"), r.get("tokens_per_s"),
                           existing)
    if existing is not None and cfg.telemetry:
        check_telemetry(run_dir)        # a damaged checkpoint telemetry.json: refused before any work

    # ---- build, resume --------------------------------------------------------------------------
    resume = ckpts.latest_resumable() if existing is not None else None
    parts = _build(cfg, data, dist, resume[1] if resume is not None else None)
    fsdp = dist.distributed and cfg.parallel == "fsdp"
    start, elapsed0 = (_resume(parts, resume[1], cfg, dist, fsdp) if resume is not None else (0, 0.0))
    bud = make_budget(parts.mcfg, seq_len=cfg.seq_len, tokens_per_update=cfg.tokens_per_update, steps=steps)
    schedule = set(checkpoint_schedule(steps, cfg.log_checkpoints, cfg.dense_start, cfg.dense_end, cfg.dense_every))
    telemetry = Telemetry(cfg, data, schedule, parts.amp)
    checkpointer = Checkpointer(ckpts, parts.wrapped, parts.model, parts.optimizer, parts.scheduler, parts.mcfg,
                                parallel=cfg.parallel, dist=dist, tokenizer=data.tokenizer,
                                tokens_per_update=cfg.tokens_per_update)
    record = _record(cfg, data, dist, parts, bud, identity, schedule, existing, start if resume is not None else None)
    if dist.is_main:
        ckpts.clean_partials()
        remove_stale_partials(run_dir)    # temporary files of a killed process's atomic writes
        created = not run_dir.exists()
        try:
            atomic_write_json(run_dir / "run.json", record)
        except BaseException:
            if created:                   # a full disk before the first file: leave nothing
                shutil.rmtree(run_dir, ignore_errors=True)
            raise
    logger = MetricsLogger(run_dir, start_step=start, total_steps=steps, enabled=dist.is_main,
                           progress=cfg.progress, tensorboard=cfg.tensorboard)
    clock = {"train_s": 0.0, "telemetry_s": 0.0, "checkpoint_s": 0.0}

    def checkpoint(step: int, kind: str) -> None:
        """Collective: gather the full model, then rank 0 measures telemetry and publishes atomically."""
        with timed(clock, "checkpoint"):
            host = checkpointer.gather(step)
            if dist.is_main:
                with timed(clock, "telemetry"):
                    tel = telemetry.measure(host, step) if kind == "schedule" and telemetry.should_measure(step) else None
                if tel is not None:
                    logger.log_eval(step, {"eval/heldout_loss": tel["heldout_loss"],
                                           "eval/max_induction": float(np.max(tel["scores"]["induction"]))})
                checkpointer.save(step, kind, host, elapsed_s=elapsed0 + clock["train_s"],
                                  extra_json={"telemetry.json": tel} if tel is not None else None)
                logger.write_csv()
                if tel is not None:
                    write_tables(run_dir)
            D.barrier(dist)

    # ---- loop -----------------------------------------------------------------------------------
    if start == 0 and 0 in schedule and resume is None:
        checkpoint(0, "schedule")
    last_loss = None
    for step in range(start, steps):
        t0 = time.perf_counter()
        batch = data.stream.batch(step)
        last_loss, gnorm, lr = _update(parts, batch, cfg, dist)
        dt = time.perf_counter() - t0
        clock["train_s"] += dt
        if not math.isfinite(last_loss):
            raise InductionLabError(f"loss became {last_loss} at step {step + 1}; lower --lr or check the data")
        done = step + 1
        if done % cfg.log_every == 0 or done == steps:
            logger.log({"step": done, "tokens": done * cfg.tokens_per_update, "loss": last_loss, "lr": lr,
                        "grad_norm": gnorm, "synthetic_fraction": float(getattr(batch, "synthetic_fraction", 0.0)),
                        "tokens_per_s": cfg.tokens_per_update / dt, "step_time_s": dt})
        if done in schedule:
            checkpoint(done, "schedule")
        elif cfg.save_every and done % cfg.save_every == 0:
            checkpoint(done, "rolling")
    logger.close()

    # ---- finish ---------------------------------------------------------------------------------
    train_time = clock["train_s"]
    results: dict[str, Any] = {"final_loss": last_loss, "steps": steps, "tokens": bud.tokens,
                               "train_time_s": elapsed0 + train_time,
                               # this session only, outside train_time_s: telemetry, and checkpoints with it
                               "telemetry_time_s": clock["telemetry_s"], "checkpoint_time_s": clock["checkpoint_s"],
                               "tokens_per_s": (steps - start) * cfg.tokens_per_update / train_time if train_time else None,
                               "achieved_flops_per_s": ((steps - start) * cfg.tokens_per_update * bud.flops / bud.tokens
                                                        / train_time) if train_time else None}
    if dist.is_main and cfg.telemetry:
        heads, evals = read_telemetry(run_dir)
        results.update(run_summary(heads, evals, cfg.induction_threshold, batch_sequences=cfg.global_batch,
                                   context=cfg.seq_len))
    record.update(status="complete", results=results, finished=time.time())
    if dist.is_main:
        atomic_write_json(run_dir / "run.json", record)
    D.barrier(dist)
    return TrainResult(run_dir, steps, bud.tokens, last_loss, results["tokens_per_s"], record)


def _resume(parts: _Parts, path: Path, cfg: TrainConfig, dist: D.Dist, fsdp: bool) -> tuple[int, float]:
    """Load optimizer, schedule and RNG state of checkpoint ``path``; return (step, elapsed seconds)."""
    state = CheckpointManager.load_trainer_state(path)
    fmt = "fqn" if fsdp else "plain"
    if state.get("optimizer_format") != fmt:
        raise InductionLabError(f"checkpoint {path} was written in {state.get('optimizer_format')} "
                                f"optimizer format; resume it with the same --parallel mode")
    try:                                     # a state of another shape (another model, a hand edit): one line
        if state["optimizer"] is not None:
            D.load_optimizer_state(parts.wrapped, parts.optimizer, state["optimizer"], cfg.parallel, dist)
        parts.scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
        return int(state["step"]), float(state.get("elapsed_s", 0.0))
    except (KeyError, ValueError, TypeError, IndexError, AttributeError, RuntimeError) as e:
        raise InductionLabError(f"checkpoint {path} is corrupt (its trainer state does not fit this run: "
                                f"{type(e).__name__}: {' '.join(str(e).split())[:160]}); delete {path} to resume "
                                "from the previous checkpoint") from None


def _update(parts: _Parts, batch, cfg: TrainConfig, dist: D.Dist) -> tuple[float, float, float]:
    """One optimizer update on this rank's share of ``batch`` (gradient accumulation over
    micro-batches); returns (mean loss across ranks in nats/token, gradient norm, learning rate used)."""
    accum = cfg.accum_steps(dist.world_size)
    per_rank = cfg.global_batch // dist.world_size
    ids = batch.input_ids[dist.rank * per_rank:(dist.rank + 1) * per_rank].to(dist.device)
    amp, wrapped = parts.amp, parts.wrapped
    loss_sum = 0.0
    for i in range(accum):
        mb = ids[i * cfg.micro_batch_size:(i + 1) * cfg.micro_batch_size]
        with D.gradient_sync(wrapped, cfg.parallel, dist, sync=i == accum - 1), \
                torch.autocast(dist.device.type, dtype=amp or torch.float32, enabled=amp is not None):
            loss = wrapped(input_ids=mb, labels=mb).loss
        (loss / accum).backward()
        loss_sum += loss.item()
    gnorm = D.clip_grad_norm(wrapped, cfg.grad_clip) if cfg.grad_clip > 0 else float("nan")
    lr = parts.scheduler.get_last_lr()[0]
    parts.optimizer.step()
    parts.scheduler.step()
    parts.optimizer.zero_grad(set_to_none=True)
    return D.mean_across(loss_sum / accum, dist), gnorm, lr


def _record(cfg, data, dist, parts, bud, identity, schedule, existing, resumed_from) -> dict:
    """The run record (``run.json``) of a run in progress."""
    return {
        "kind": "train", "status": "running", "identity": identity, "config": cfg.to_dict(),
        "model_config": parts.mcfg.to_dict(), "budget": bud.to_dict(), "checkpoint_steps": sorted(schedule),
        "world_size": dist.world_size, "parallel": cfg.parallel if dist.distributed else "none",
        "device": str(dist.device), "autocast": str(parts.amp) if parts.amp else "fp32",
        "accumulation_steps": cfg.accum_steps(dist.world_size),
        "seeds": {"init": cfg.seed, "curriculum": cfg.seed if cfg.curriculum.seed is None else cfg.curriculum.seed,
                  "telemetry": cfg.seed}, "versions": versions(),
        "started": existing.get("started", time.time()) if existing else time.time(),
        "resumed_from_step": resumed_from,
        "stream": data.stream.describe() if hasattr(data.stream, "describe") else None,
    }


__all__ = ["TrainData", "TrainResult", "open_data", "check_data", "train", "lr_factor"]
