"""Model presets and the run configuration of matched-compute pretraining (SPEC §7).

A run is defined by one :class:`TrainConfig`: a dataclass (the curriculum nested) whose defaults are the paper's
recipe, read from a YAML or TOML file (:func:`load_config`) and overridable field by field from
the command line (``--field-name value``). Unknown keys are errors, never silently ignored.

Model sizes are :class:`transformers.LlamaConfig` presets (:data:`PRESETS`, :func:`model_config`):
RoPE θ = 10000, pre-norm RMSNorm, SwiGLU MLP, grouped-query attention, untied embeddings — so
every checkpoint opens in transformers, in :func:`inductionlab.core.models.load_model` and in
lm-evaluation-harness.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import LlamaConfig

from .. import config as C
from ..checks import TOKEN_BYTES, check_fields
from ..config import nested, opt
from ..data.curriculum import CurriculumConfig
from ..errors import InductionLabError

#: Attention kernels the trainer accepts (transformers' names): eager, sdpa, flex_attention run on any device;
#: the flash kernels need CUDA and their package (:func:`check_attn_implementation`).
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3")

# name -> (layers, hidden, MLP, query heads, KV heads). Paper sizes from the Bi-Induct paper
# (0.13B and 1B); 0.5B is our interpolation (decision); cpu-* train in minutes on 2 CPU cores.
PRESETS: dict[str, tuple[int, int, int, int, int]] = {
    "cpu-micro": (2, 64, 128, 4, 4),   # CPU positive control: forms an induction head in minutes (docs/positive_control.md)
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
        vocab_size: rows of the embedding and of the LM head: the tokenizer's largest id + 1
            (:attr:`inductionlab.data.tokenizer.TokenizerInfo.vocab_size`), not its entry count.
        max_position_embeddings: context length in tokens (1024 at paper scale).

    Raises:
        InductionLabError: unknown preset or non-positive vocabulary.
    """
    if preset not in PRESETS:
        raise InductionLabError(f"unknown model preset {preset!r}; use one of {', '.join(PRESETS)}")
    if not isinstance(vocab_size, int) or vocab_size < 2:
        raise InductionLabError(f"vocab_size must be at least 2 (got {vocab_size}); check the tokenizer")
    from transformers import LlamaConfig   # lazy: the CLI's options read this module

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
    updates (one update = ``tokens_per_update`` tokens, reached by gradient accumulation). The
    Bi-Induct settings are a nested :class:`inductionlab.data.curriculum.CurriculumConfig`
    (``cfg.curriculum.variant``, ``cfg.curriculum.span_length``, ...).
    """

    data: str = opt("", "Directory written by `inductionlab corpus prepare` (token shards).")
    out: str = opt("", "Run directory (resumed when it holds the same run).", cli=False)   # the command's --out
    preset: str = opt("0.13b", "Model size (PRESETS).", choices=tuple(PRESETS))
    seq_len: int = opt(1024, "Context length in tokens (paper: 1024).")
    tokens: int = opt(0, "Token budget; steps = tokens // tokens_per_update.")
    tokens_per_update: int = opt(65536, "Tokens per optimizer update (paper: 2^16).")
    micro_batch_size: int = opt(8, "Sequences per forward pass per process (memory knob only).",
                                size=lambda c: TOKEN_BYTES * c.seq_len)
    # AdamW and schedule (paper): beta 0.9/0.999, wd 0.1, peak 1e-3, 3% warm-up then cosine.
    lr: float = opt(1e-3, "Peak learning rate (paper: 1e-3).")
    min_lr_ratio: float = opt(0.1, "Cosine ends at this fraction of the peak (decision: 0.1, Chinchilla).")
    warmup_frac: float = opt(0.03, "Linear warm-up over this fraction of the steps (paper: 0.03).")
    beta1: float = opt(0.9, "AdamW beta1.")
    beta2: float = opt(0.999, "AdamW beta2.")
    eps: float = opt(1e-8, "AdamW epsilon.")
    weight_decay: float = opt(0.1, "AdamW weight decay on matrices (paper: 0.1).")
    grad_clip: float = opt(1.0, "Global L2 gradient-norm clip; 0 = off (decision: 1.0).")
    precision: str = opt("auto", "auto (bf16 autocast on CUDA with bf16, else fp32) | fp32 | bf16.",
                          choices=("auto", "fp32", "bf16"))
    seed: int = opt(0, "Seed of model init, data stream and telemetry probes.")
    deterministic: bool = opt(False, "torch.use_deterministic_algorithms (bit-identical resume on CPU).",
                              flag="--deterministic/--no-deterministic")
    attn_implementation: str = opt("sdpa", "Training attention kernel (telemetry uses its own): "
                                           + ", ".join(ATTN_IMPLEMENTATIONS) + ".")
    # Bi-Induct curriculum (SPEC §6), nested: the same fields as `inductionlab curriculum preview`
    curriculum: CurriculumConfig = nested(CurriculumConfig, "Bi-Induct curriculum (SPEC §6).", shorthand="variant")
    # Checkpoints (SPEC §7): log-spaced plus an optional dense window, plus rolling resume points.
    log_checkpoints: int = opt(12, "Number of log-spaced checkpoints; step 0 and the last are added (decision).",
                               size=lambda c: 72)        # the schedule's float64 point and its entry in a set
    dense_start: int = opt(0, "Dense checkpoint window start (steps).")
    dense_end: int = opt(0, "Dense checkpoint window end (steps).")
    dense_every: int = opt(0, "Checkpoint every N steps inside the dense window (0 = no window).")
    save_every: int = opt(0, "Rolling resume checkpoint every N steps (0 = off); only the last is kept.")
    keep_resumable: int = opt(2, "Optimizer state is kept in the newest N checkpoints only.")
    # Telemetry (SPEC §8)
    telemetry: bool = opt(True, "Head scores and held-out perplexity at every checkpoint.",
                          flag="--telemetry/--no-telemetry")
    telemetry_seq_len: int = opt(50, "Half length in tokens of the repeated random sequence of the induction "
                                      "score (the probe is 2x this + BOS; must fit --seq-len).")
    telemetry_batch: int = opt(16, "Sequences per telemetry probe.",
                               size=lambda c: TOKEN_BYTES * (2 * c.telemetry_seq_len + 1))
    induction_threshold: float = opt(0.4, "An induction head scores above this (emergence step; decision).")
    eval_tokens: int = opt(65536, "Held-out tokens for perplexity; 0 = no perplexity (decision: 65536).")
    # Distributed (torchrun) and logging
    parallel: str = opt("ddp", "ddp | fsdp (only under torchrun with WORLD_SIZE > 1).", choices=("ddp", "fsdp"))
    log_every: int = opt(1, "Metrics row every N updates.")
    progress: bool = opt(True, "Progress bar with tokens/s and loss.", flag="--progress/--no-progress")
    tensorboard: bool = opt(True, "TensorBoard logs (when the tensorboard package is installed).",
                            flag="--tensorboard/--no-tensorboard")

    def __post_init__(self) -> None:
        if isinstance(self.curriculum, str):            # shorthand: curriculum="induction"
            self.curriculum = CurriculumConfig(variant=self.curriculum)
        elif isinstance(self.curriculum, dict):
            self.curriculum = C.from_dict(CurriculumConfig, self.curriculum, where="curriculum.")

    # ---- derived quantities -----------------------------------------------------------------
    @property
    def global_batch(self) -> int:
        """Sequences per optimizer update (all processes, all accumulation steps)."""
        return self.tokens_per_update // self.seq_len

    @property
    def steps(self) -> int:
        return self.tokens // self.tokens_per_update

    def validate(self, world_size: int = 1) -> None:
        """Check every field and the fields that depend on each other; raise
        :class:`InductionLabError` naming the problem and the fix (``--flag`` spelling).

        Checks that need the data (vocabulary, BOS, held-out length) are in the trainer."""
        if not self.data:
            raise InductionLabError("no training data; pass --data DIR (written by `inductionlab corpus prepare`)")
        if not self.out:
            raise InductionLabError("no output directory; pass --out DIR")
        if self.preset not in PRESETS:
            raise InductionLabError(f"unknown model preset {self.preset!r}; use one of {', '.join(PRESETS)}")
        check_fields(self)               # numbers that fit; every count within memory (opt(size=...))
        for f in fields(self):
            v = getattr(self, f.name)
            if f.type == "float" and not math.isfinite(v):
                raise InductionLabError(f"--{_flag(f.name)} must be a finite number, got {v}")
        positive = ("seq_len", "tokens_per_update", "micro_batch_size", "log_every", "keep_resumable",
                    "telemetry_seq_len", "telemetry_batch")
        for name in positive:
            if getattr(self, name) < 1:
                raise InductionLabError(f"--{_flag(name)} must be >= 1, got {getattr(self, name)}")
        for name in ("tokens", "log_checkpoints", "dense_start", "dense_end", "dense_every", "save_every",
                     "eval_tokens", "seed", "grad_clip", "weight_decay", "min_lr_ratio", "warmup_frac"):
            if getattr(self, name) < 0:
                raise InductionLabError(f"--{_flag(name)} must be >= 0, got {getattr(self, name)}")
        for f in fields(self):
            v = getattr(self, f.name)
            if f.type == "int" and isinstance(v, int) and v >= 2 ** 63:
                raise InductionLabError(f"--{_flag(f.name)} {v} does not fit a 64-bit integer; pass a smaller value")
        if self.seq_len < 2:
            raise InductionLabError(f"--seq-len must be at least 2 (got {self.seq_len})")
        if self.lr <= 0 or self.eps <= 0:
            raise InductionLabError(f"--lr and --eps must be > 0, got {self.lr} and {self.eps}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise InductionLabError(f"--beta1 and --beta2 must be in [0, 1), got {self.beta1} and {self.beta2}")
        if not 0 <= self.warmup_frac < 1 or not 0 <= self.min_lr_ratio <= 1:
            raise InductionLabError("need 0 <= --warmup-frac < 1 and 0 <= --min-lr-ratio <= 1")
        if not 0 <= self.induction_threshold <= 1:
            raise InductionLabError(f"--induction-threshold is an attention probability in [0, 1], got "
                                    f"{self.induction_threshold}")
        if self.precision not in ("auto", "fp32", "bf16"):
            raise InductionLabError(f"unknown precision {self.precision!r}; use auto, fp32 or bf16")
        check_attn_implementation(self.attn_implementation)
        if self.parallel not in ("ddp", "fsdp"):
            raise InductionLabError(f"unknown parallel mode {self.parallel!r}; use ddp or fsdp")
        if not isinstance(self.curriculum, CurriculumConfig):
            raise InductionLabError("curriculum must be a CurriculumConfig (or a variant name)")
        self.curriculum.validate()
        # fields that depend on each other
        if self.tokens_per_update % self.seq_len:
            raise InductionLabError(f"--tokens-per-update ({self.tokens_per_update}) must be a multiple of "
                                    f"--seq-len ({self.seq_len})")
        per_rank = self.global_batch // max(world_size, 1)
        if self.global_batch < 1 or self.global_batch % world_size or per_rank % self.micro_batch_size:
            raise InductionLabError(
                f"global batch of {self.global_batch} sequences does not split into {world_size} process(es) "
                f"x micro-batches of {self.micro_batch_size}; change --tokens-per-update or --micro-batch-size")
        if self.steps < 1:
            raise InductionLabError(f"token budget {self.tokens} is smaller than one update of "
                                    f"{self.tokens_per_update} tokens; raise --tokens")
        lo, hi = self.curriculum.length_bounds()
        if self.curriculum.variant != "none" and 2 * hi + 1 > self.seq_len:
            raise InductionLabError(f"a Bi-Induct snippet of 2*{hi}+1 = {2 * hi + 1} tokens does not fit "
                                    f"--seq-len {self.seq_len}; use --span-length <= {(self.seq_len - 1) // 2}")
        self.check_telemetry_fits(bos=False)
        if self.telemetry and 0 < self.eval_tokens < self.seq_len:
            raise InductionLabError(f"--eval-tokens {self.eval_tokens} is less than one window of --seq-len "
                                    f"{self.seq_len}; pass --eval-tokens 0 (no perplexity) or >= {self.seq_len}")
        if self.dense_every > 0 and self.dense_end < self.dense_start:
            raise InductionLabError(f"--dense-end ({self.dense_end}) is before --dense-start ({self.dense_start})")

    def check_telemetry_fits(self, bos: bool) -> None:
        """The telemetry probes fit the model's context (``seq_len``): the induction probe is
        ``[BOS] R R`` (2 x telemetry_seq_len + BOS tokens), the copy-offset probe ``[BOS] S SEP S``
        (2 x span_length + 1 + BOS). ``bos``: whether the data has a BOS token (the trainer
        checks again once it knows).

        Raises:
            InductionLabError: a probe longer than ``seq_len``, naming the option to change.
        """
        if not self.telemetry:
            return
        T, L, b = self.telemetry_seq_len, self.curriculum.span_length, int(bos)
        if 2 * T + b > self.seq_len:
            raise InductionLabError(
                f"the telemetry probe of {'1+' if b else ''}2*{T} = {2 * T + b} tokens does not fit --seq-len "
                f"{self.seq_len}; pass --telemetry-seq-len <= {(self.seq_len - b) // 2} (or --no-telemetry)")
        if 2 * L + 1 + b > self.seq_len:
            raise InductionLabError(
                f"the copy-offset telemetry probe of {2 * L + 1 + b} tokens ([BOS] S SEP S, L = {L}) does not fit "
                f"--seq-len {self.seq_len}; pass --span-length <= {(self.seq_len - 1 - b) // 2} (or --no-telemetry)")

    def accum_steps(self, world_size: int) -> int:
        """Micro-batches per update on each of ``world_size`` processes (gradient accumulation)."""
        return self.global_batch // world_size // self.micro_batch_size

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def run_identity(self) -> dict[str, Any]:
        """The fields that define *which* run this is (everything except logging and paths)."""
        skip = {"out", "progress", "tensorboard", "log_every", "micro_batch_size", "parallel"}
        return {k: v for k, v in self.to_dict().items() if k not in skip}


def check_attn_implementation(name: str) -> None:
    """``name`` is an attention kernel transformers runs for a Llama model here: one of
    :data:`ATTN_IMPLEMENTATIONS`; a flash-attention kernel also needs CUDA and its package (checked up front:
    transformers' own error comes only when the model is built, after the run directory is opened).

    Raises:
        InductionLabError: an unknown name, or a flash kernel without CUDA or its package."""
    if name not in ATTN_IMPLEMENTATIONS:
        raise InductionLabError(f"--attn-implementation {name!r}: use one of {', '.join(ATTN_IMPLEMENTATIONS)}")
    if name.startswith("flash_attention"):
        import importlib.util

        import torch

        package = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface"}[name]
        if not torch.cuda.is_available() or importlib.util.find_spec(package) is None:
            raise InductionLabError(f"--attn-implementation {name} needs a CUDA GPU and the {package} package; use "
                                    "sdpa (the default) or eager")


def _flag(name: str) -> str:
    return name.replace("_", "-")


def config_from_dict(d: dict[str, Any], base: TrainConfig | None = None) -> TrainConfig:
    """A run config from a mapping (:func:`inductionlab.config.from_dict` over ``base`` or the defaults):
    ``curriculum`` a nested table of :class:`~inductionlab.data.curriculum.CurriculumConfig` fields
    (``curriculum: {variant: induction, span_length: 20}``), a variant name as shorthand
    (``curriculum: induction``) or dotted keys (``curriculum.m0: 0.3``); a table under a key that is no
    field groups keys (``schedule: {lr: 1e-3}`` reads as ``lr``).

    Raises:
        InductionLabError: an unknown key (with the closest known name) or a value of the wrong type."""
    return C.from_dict(TrainConfig if base is None else base, d)


def load_config(path: str | Path, base: TrainConfig | None = None) -> TrainConfig:
    """Read a YAML (``.yaml``/``.yml``), JSON or TOML (``.toml``) run config (:func:`inductionlab.config.read_mapping`).

    Raises:
        InductionLabError: missing or unparsable file, unknown key, wrong value type.
    """
    return config_from_dict(C.read_mapping(path), base)
