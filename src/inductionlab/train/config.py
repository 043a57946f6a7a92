"""Model presets and the run configuration of matched-compute pretraining (SPEC §7).

A run is defined by one :class:`TrainConfig`: a flat dataclass whose defaults are the paper's
recipe, read from a YAML or TOML file (:func:`load_config`) and overridable field by field from
the command line (``--field-name value``). Unknown keys are errors, never silently ignored.

Model sizes are :class:`transformers.LlamaConfig` presets (:data:`PRESETS`, :func:`model_config`):
RoPE θ = 10000, pre-norm RMSNorm, SwiGLU MLP, grouped-query attention, untied embeddings — so
every checkpoint opens in transformers, in :func:`inductionlab.models.load_model` and in
lm-evaluation-harness.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml
from transformers import LlamaConfig

from ..errors import InductionLabError

# name -> (layers, hidden, MLP, query heads, KV heads). Paper sizes from the Bi-Induct paper
# (0.13B and 1B); 0.5B is our interpolation (decision); cpu-* train in minutes on 2 CPU cores.
PRESETS: dict[str, tuple[int, int, int, int, int]] = {
    "cpu-micro": (2, 64, 128, 4, 4),   # CPU positive control (docs/positive_control.md)
    "cpu-tiny": (2, 128, 512, 4, 2),
    "cpu-small": (4, 256, 1024, 8, 2),
    "0.13b": (12, 768, 3072, 12, 3),
    "0.5b": (24, 1024, 4096, 16, 4),
    "1b": (30, 1536, 6144, 24, 6),
}


def model_config(preset: str, vocab_size: int, *, max_position_embeddings: int = 1024,
                 bos_token_id: int | None = None, eos_token_id: int | None = None,
                 pad_token_id: int | None = None) -> LlamaConfig:
    """A :class:`LlamaConfig` for a named size.

    Args:
        preset: a key of :data:`PRESETS`.
        vocab_size: tokenizer vocabulary size (rows of the embedding and of the LM head).
        max_position_embeddings: context length in tokens (1024 at paper scale).

    Raises:
        InductionLabError: unknown preset or non-positive vocabulary.
    """
    if preset not in PRESETS:
        raise InductionLabError(f"unknown model preset {preset!r}; use one of {', '.join(PRESETS)}")
    if vocab_size < 2:
        raise InductionLabError(f"vocab_size must be at least 2 (got {vocab_size}); check the tokenizer")
    layers, hidden, mlp, heads, kv = PRESETS[preset]
    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, head_dim=hidden // heads,
        hidden_act="silu",                                   # SwiGLU (Llama)
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},  # SPEC §7
        rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
        attention_dropout=0.0, initializer_range=0.02, max_position_embeddings=max_position_embeddings,
        bos_token_id=bos_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
        use_cache=False, architectures=["LlamaForCausalLM"],
    )


@dataclass
class TrainConfig:
    """One pretraining run. Defaults are the paper recipe (SPEC §7) unless marked "decision".

    Token counts are in tokens; learning rates in units of the AdamW step; steps are optimizer
    updates (one update = ``tokens_per_update`` tokens, reached by gradient accumulation).
    """

    data: str = ""                       # directory written by `inductionlab corpus prepare` (TokenShards)
    out: str = ""                        # run directory (resumed when it holds the same run)
    preset: str = "0.13b"                # cpu-micro | cpu-tiny | cpu-small | 0.13b | 0.5b | 1b (PRESETS)
    seq_len: int = 1024                  # context length (paper: 1024)
    tokens: int = 0                      # token budget; steps = tokens // tokens_per_update
    tokens_per_update: int = 65536       # 2^16 tokens per optimizer update (paper)
    micro_batch_size: int = 8            # sequences per forward pass per process (memory knob only)
    # AdamW and schedule (paper): beta 0.9/0.999, wd 0.1, peak 1e-3, 3% warm-up then cosine.
    lr: float = 1e-3                     # peak learning rate (paper)
    min_lr_ratio: float = 0.1            # decision: cosine ends at 10% of peak (Chinchilla convention)
    warmup_frac: float = 0.03            # linear warm-up over this fraction of the steps (paper)
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.1            # AdamW weight decay (paper)
    grad_clip: float = 1.0               # decision: global L2 norm clip at 1.0 (common Llama setting)
    precision: str = "auto"              # auto (bf16 autocast on CUDA with bf16, else fp32) | fp32 | bf16
    seed: int = 0                        # model init, data stream and telemetry probes
    deterministic: bool = False          # torch.use_deterministic_algorithms (bit-identical resume on CPU)
    attn_implementation: str = "sdpa"    # training attention kernel (telemetry uses its own)
    # Bi-Induct curriculum (SPEC §6): passed to inductionlab.curriculum.CurriculumConfig
    curriculum: str = "none"             # none | induction | anti | balanced
    span_length: int = 20                # L, snippet span length in tokens (SPEC §6)
    span_length_min: int = 0             # >0 together with span_length_max: length drawn per snippet
    span_length_max: int = 0
    m0: float = 0.5                      # initial synthetic fraction; m(t) = m0 * max(0, 1 - t/T_a)
    anneal_tokens: int = 0               # 0 = the whole budget (SPEC §6)
    span_source: str = "natural"         # natural | random
    # Checkpoints (SPEC §7): log-spaced plus an optional dense window, plus rolling resume points.
    log_checkpoints: int = 12            # decision: number of log-spaced checkpoints (step 0 and last added)
    dense_start: int = 0                 # dense window [dense_start, dense_end] in steps, every dense_every
    dense_end: int = 0
    dense_every: int = 0
    save_every: int = 0                  # rolling resume checkpoint every N steps (0 = off); only the last kept
    keep_resumable: int = 2              # optimizer state is kept in the newest N checkpoints only
    # Telemetry (SPEC §8)
    telemetry: bool = True               # head scores and held-out perplexity at every checkpoint
    telemetry_seq_len: int = 50          # repeated random-token half length for the induction score
    telemetry_batch: int = 16
    induction_threshold: float = 0.4     # decision: "induction head" = induction score above this
    eval_tokens: int = 65536             # held-out tokens for perplexity (decision)
    # Distributed (torchrun) and logging
    parallel: str = "ddp"                # ddp | fsdp (used only under torchrun with WORLD_SIZE > 1)
    log_every: int = 1                   # metrics row every N updates
    progress: bool = True                # progress bar with tokens/s and loss
    tensorboard: bool = True             # only when the tensorboard package is installed

    # ---- derived quantities -----------------------------------------------------------------
    @property
    def global_batch(self) -> int:
        """Sequences per optimizer update (all processes, all accumulation steps)."""
        return self.tokens_per_update // self.seq_len

    @property
    def steps(self) -> int:
        return self.tokens // self.tokens_per_update

    def validate(self, world_size: int = 1) -> None:
        """Check every field; raise :class:`InductionLabError` naming the problem and the fix."""
        if not self.data:
            raise InductionLabError("no training data; pass --data DIR (written by `inductionlab corpus prepare`)")
        if not self.out:
            raise InductionLabError("no output directory; pass --out DIR")
        if self.preset not in PRESETS:
            raise InductionLabError(f"unknown model preset {self.preset!r}; use one of {', '.join(PRESETS)}")
        if self.seq_len < 2:
            raise InductionLabError(f"seq_len must be at least 2 (got {self.seq_len})")
        if self.tokens_per_update % self.seq_len:
            raise InductionLabError(f"tokens_per_update ({self.tokens_per_update}) must be a multiple of "
                                    f"seq_len ({self.seq_len})")
        per_rank = self.global_batch // max(world_size, 1)
        if self.global_batch < 1 or self.global_batch % world_size or per_rank % self.micro_batch_size:
            raise InductionLabError(
                f"global batch of {self.global_batch} sequences does not split into {world_size} process(es) "
                f"x micro-batches of {self.micro_batch_size}; change --tokens-per-update or --micro-batch-size")
        if self.steps < 1:
            raise InductionLabError(f"token budget {self.tokens} is smaller than one update of "
                                    f"{self.tokens_per_update} tokens; raise --tokens")
        if not 0 <= self.warmup_frac < 1 or not 0 <= self.min_lr_ratio <= 1 or self.lr <= 0:
            raise InductionLabError("need lr > 0, 0 <= warmup_frac < 1 and 0 <= min_lr_ratio <= 1")
        if self.precision not in ("auto", "fp32", "bf16"):
            raise InductionLabError(f"unknown precision {self.precision!r}; use auto, fp32 or bf16")
        if self.parallel not in ("ddp", "fsdp"):
            raise InductionLabError(f"unknown parallel mode {self.parallel!r}; use ddp or fsdp")
        if self.curriculum not in ("none", "induction", "anti", "balanced"):
            raise InductionLabError(f"unknown curriculum {self.curriculum!r}; use none, induction, anti or balanced")
        if self.dense_every < 0 or self.save_every < 0 or self.log_checkpoints < 0 or self.keep_resumable < 1:
            raise InductionLabError("checkpoint counts must be non-negative and keep_resumable >= 1")

    def accum_steps(self, world_size: int) -> int:
        """Micro-batches per update on each of ``world_size`` processes (gradient accumulation)."""
        return self.global_batch // world_size // self.micro_batch_size

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def run_identity(self) -> dict[str, Any]:
        """The fields that define *which* run this is (everything except logging and paths)."""
        skip = {"out", "progress", "tensorboard", "log_every", "micro_batch_size", "parallel"}
        return {k: v for k, v in self.to_dict().items() if k not in skip}


FIELD_NAMES = tuple(f.name for f in fields(TrainConfig))


def config_from_dict(d: dict[str, Any], base: TrainConfig | None = None) -> TrainConfig:
    """Build a config from a mapping (nested tables are flattened one level: ``{"model": {"preset":
    ...}}`` reads as ``preset``).

    Raises:
        InductionLabError: an unknown key (with the closest known name) or a value of the wrong type.
    """
    flat: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            flat.update({kk.replace("-", "_"): vv for kk, vv in v.items()})
        else:
            flat[k.replace("-", "_")] = v
    cfg = dataclasses.replace(base) if base is not None else TrainConfig()
    types = {f.name: f.type for f in fields(TrainConfig)}
    for k, v in flat.items():
        if k not in types:
            import difflib
            close = difflib.get_close_matches(k, FIELD_NAMES, n=1)
            hint = f"did you mean {close[0]!r}?" if close else "see `inductionlab train --help`"
            raise InductionLabError(f"unknown config key {k!r}; {hint}")
        want = types[k]
        try:
            if want == "bool":
                if isinstance(v, str):
                    if v.lower() not in ("true", "false", "1", "0", "yes", "no"):
                        raise ValueError(v)
                    v = v.lower() in ("true", "1", "yes")
                v = bool(v)
            elif want == "int":
                if isinstance(v, float) and not v.is_integer():
                    raise ValueError(v)
                v = int(float(v)) if isinstance(v, str) and ("e" in v.lower()) else int(v)
            elif want == "float":
                v = float(v)
            else:
                v = str(v)
        except (TypeError, ValueError):
            raise InductionLabError(f"config key {k!r} needs a {want} value (got {v!r})") from None
        setattr(cfg, k, v)
    return cfg


def load_config(path: str | Path, base: TrainConfig | None = None) -> TrainConfig:
    """Read a YAML (``.yaml``/``.yml``) or TOML (``.toml``) run config.

    Raises:
        InductionLabError: missing or unparsable file, unknown key, wrong value type.
    """
    p = Path(path)
    if not p.is_file():
        raise InductionLabError(f"config file {p} does not exist; check the path")
    text = p.read_text()
    try:
        if p.suffix == ".toml":
            d = tomllib.loads(text)
        elif p.suffix in (".yaml", ".yml", ".json"):
            d = yaml.safe_load(text) or {}
        else:
            raise InductionLabError(f"config file {p} must end in .yaml, .yml or .toml")
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as e:
        raise InductionLabError(f"cannot parse {p}: {str(e).splitlines()[0]}; fix the file") from None
    if not isinstance(d, dict):
        raise InductionLabError(f"config file {p} must hold a mapping of key: value")
    return config_from_dict(d, base)


def dumps_config(cfg: TrainConfig) -> str:
    return json.dumps(cfg.to_dict(), indent=2, sort_keys=True)
