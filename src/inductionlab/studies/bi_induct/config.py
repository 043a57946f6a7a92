"""``inductionlab study bi-induct``: its config (:class:`BiInductStudyConfig`), the presets (functions that
return typed configs: :data:`PRESETS`), the training config of one run (:func:`train_config`), phase 1
``plan`` (:func:`plan_budgets`, iso-FLOPs), the GPU-hours estimate and :data:`SPEC`.

Light (no torch): the command line generates the command's options from :class:`BiInductStudyConfig`. A
study is a preset's config with some leaves changed: ``--budget`` / ``--seeds`` on the command line,
any leaf (``train.lr``, ``evaluation.probes.n_prompts``) in a ``--config`` file or through the API
(``dataclasses.replace(cpu_control(), budget=...)``).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, ClassVar

from ...checks import INT64_MAX, check_fields
from ...config import nested, opt, to_dict, validate_tree
from ...data.curriculum import VARIANTS, CurriculumConfig
from ...errors import InductionLabError
from ...train.config import TrainConfig
from ..evaluate import (EvaluateConfig, ICLScoreConfig, InductionLossConfig, LoadBearingConfig, PerplexityConfig,
                        ProbeConfig, RecallConfig)
from ..configs import HeadScoreConfig
from ..spec import StudySpec

BI_INDUCT = VARIANTS[1:]                    # the rewritten variants (VARIANTS[0] is "none", the baseline)
PRESET_NAMES = ("cpu-control", "cpu-natural", "tiny", "0.13b")
MAX_SEEDS = 1000                            # seeds per variant: each is a full training run


@dataclass
class BiInductStudyConfig:
    """One study: a recipe (the trainer's config shared by every run, the curriculum apart from its
    variant, the evaluation) and how much of it to run. Build one with a preset (:data:`PRESETS`).

    Attributes:
        train: the :class:`~inductionlab.train.TrainConfig` every run shares; each run sets its data, out,
            tokens, seed and the curriculum's variant and anneal (:func:`train_config`): iso-FLOPs by
            construction.
        evaluation: the :class:`~inductionlab.studies.evaluate.EvaluateConfig` of every final checkpoint
            (its seed and shards set per run).
        anneal_frac: T_a as a multiple of the budget (1.0 = the paper's anneal over the whole budget; 1000.0 =
            m held at m0 for the whole run).
        calibration_lengths: copy lengths |S| at which the final checkpoints' max induction score is also read.
        data_hint: how to prepare the corpus the preset expects (shown when it is missing).
    """
    PRESETS: ClassVar[dict[str, Callable[[], "BiInductStudyConfig"]]] = {}   # filled below: name -> preset

    train: TrainConfig = nested(None, "The trainer's config every run shares.", cli=False)
    evaluation: EvaluateConfig = nested(None, "The evaluation of every final checkpoint.", cli=False)
    preset: str = opt("cpu-control", "Study recipe: cpu-control (the CPU positive control, ~5 min per run on one "
                                     "thread), cpu-natural (the CPU study), tiny (CI), 0.13b (paper size, GPUs).",
                      choices=PRESET_NAMES)
    shards: str = opt("", "Prepared corpus (`inductionlab corpus prepare`).", metavar="DIR")
    budget: int = opt(0, "Training tokens per run (rounded down to whole updates).")
    seeds: int = opt(2, "Seeds per variant.")
    jobs: int = opt(1, "Training runs at a time (subprocesses with --job-threads torch threads each).")
    nproc: int = opt(1, "Processes per run: > 1 runs each training under torchrun --nproc_per_node=N (GPUs).")
    job_threads: int = opt(1, "Torch threads of each training run.")
    variants: tuple[str, ...] = opt(VARIANTS, "Curriculum variants (none is the baseline and required).")
    evaluate: bool = opt(True, "Train and aggregate telemetry only (the flag sets evaluate false).",
                         flag="--no-evaluate")
    partial: bool = opt(False, "Train nothing: aggregate, evaluate and report the runs finished so far (missing "
                               "runs listed).")
    anneal_frac: float = opt(1.0, "T_a as a multiple of the budget.", cli=False)
    calibration_lengths: tuple[int, ...] = opt((), "Copy lengths of extra max-induction readings.", cli=False)
    data_hint: str = opt("any prepared corpus", "How to prepare the corpus.", cli=False)

    @property
    def tokens(self) -> int:
        """Training tokens per run: the budget in whole updates."""
        tpu = self.train.tokens_per_update
        return (int(self.budget) // tpu) * tpu

    def runs(self) -> list[tuple[str, str, int]]:
        """(name, variant, seed) of every run in training order: every seed of the primary comparison
        (none, induction) first, then the other variants seed by seed — so a study stopped part-way
        already holds the main contrast with its seed CI (decision)."""
        first = [v for v in self.variants if v in ("none", "induction")]
        rest = [v for v in self.variants if v not in first]
        return ([(f"{v}-s{s}", v, s) for s in range(self.seeds) for v in first]
                + [(f"{v}-s{s}", v, s) for s in range(self.seeds) for v in rest])

    def validate(self) -> None:
        """Cheap checks before anything is written.

        Raises: InductionLabError naming the option and the fix; TypeError: a nested config of the wrong type."""
        if self.preset not in PRESETS:
            raise InductionLabError(f"unknown study preset {self.preset!r}; use one of {', '.join(PRESETS)}")
        if not self.shards:
            raise InductionLabError(f"no corpus; pass --shards DIR (prepare one: {self.data_hint})")
        if not (Path(self.shards) / "manifest.json").is_file():
            raise InductionLabError(f"--shards {self.shards} is not a prepared corpus (no manifest.json); "
                                    f"prepare one: {self.data_hint}")
        check_fields(self)
        validate_tree(self, validate=False)          # each run's train config is validated per run, below
        if self.seeds < 1:
            raise InductionLabError(f"--seeds must be >= 1, got {self.seeds}")
        if self.seeds > MAX_SEEDS:
            raise InductionLabError(f"--seeds {self.seeds:,}: at most {MAX_SEEDS} seeds per variant (each is a full "
                                    "training run)")
        if self.jobs < 1 or self.nproc < 1 or self.job_threads < 1:
            raise InductionLabError(f"--jobs, --nproc and --job-threads must be >= 1, got {self.jobs}, {self.nproc} "
                                    f"and {self.job_threads}")
        cpus = os.cpu_count() or 1
        if self.jobs > cpus or self.nproc > cpus:
            raise InductionLabError(f"--jobs {self.jobs} / --nproc {self.nproc}: this machine has {cpus} CPUs (each "
                                    f"process takes one); use at most {cpus}")
        if self.job_threads > cpus:
            raise InductionLabError(f"--job-threads {self.job_threads:,}: this machine has {cpus} CPUs; use at most "
                                    f"{cpus} torch threads per run")
        if not 0 < self.budget <= INT64_MAX:
            raise InductionLabError(f"--budget {self.budget:g} must be a positive number of tokens below 2**63")
        bad = [v for v in self.variants if v not in VARIANTS]
        if bad or "none" not in self.variants or len(set(self.variants)) != len(self.variants):
            raise InductionLabError(f"variants must be distinct names from {', '.join(VARIANTS)} and include none "
                                    f"(the natural-only baseline); got {', '.join(self.variants)}")
        tpu = self.train.tokens_per_update
        if self.budget < tpu:
            raise InductionLabError(f"--budget {self.budget} is less than one update of {tpu} tokens; raise --budget")
        for v in self.variants:
            train_config(self, v, 0, "run").validate(self.nproc)
        evaluation_config(self, 0).validate()       # the evaluation runs after hours of training: checked now

    def params(self, corpus_sha256: str | None) -> dict:
        """What defines the results (everything but jobs, nproc, job threads and partial)."""
        return {"preset": self.preset, "shards": str(Path(self.shards).resolve()), "corpus_sha256": corpus_sha256,
                "tokens": self.tokens, "seeds": self.seeds, "variants": list(self.variants),
                "train_config": {k: v for k, v in train_config(self, "none", 0, "run").run_identity().items()
                                 if k not in ("seed", "data")}}

    def eval_key(self) -> str:
        """Piece folder of the evaluations: ``eval-<hash of the evaluation config>``, so a changed evaluation
        recipe re-evaluates the finished checkpoints without retraining them."""
        recipe = {"evaluation": to_dict(self.evaluation), "calibration_lengths": list(self.calibration_lengths)}
        return "eval-" + hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:10]


def train_config(cfg: BiInductStudyConfig, variant: str, seed: int, out: str) -> TrainConfig:
    """The :class:`~inductionlab.train.TrainConfig` of run (variant, seed) into ``out``: ``cfg.train`` with the
    study's data, budget and seed, and the curriculum's variant and anneal; the same for every variant but
    ``curriculum.variant`` (iso-FLOPs by construction)."""
    tokens = cfg.tokens
    cur = replace(cfg.train.curriculum, variant=variant, anneal_tokens=max(1, int(round(cfg.anneal_frac * tokens))))
    return replace(cfg.train, data=str(cfg.shards), out=out, tokens=tokens, seed=seed, curriculum=cur,
                   progress=False, tensorboard=False)


def evaluation_config(cfg: BiInductStudyConfig, seed: int) -> EvaluateConfig:
    """The evaluation of run seed ``seed``'s final checkpoint: ``cfg.evaluation`` on the study's shards."""
    return replace(cfg.evaluation, shards=str(cfg.shards), seed=seed)


# ---- presets: functions returning typed configs --------------------------------------------------

_CPU_TASKS = ("copy", "capitalize", "uppercase", "first_letter", "next_letter", "next_number", "list_first",
              "list_last")


def _evaluation(*, tasks=_CPU_TASKS, shots=(1, 10), n_prompts=32, icl_windows=32, icl_late=500, icl_early=50,
                ppl_tokens=65536, draws=3, batch_size=16, score_seq_len=50, induction_seq_len=None,
                induction_sequences=16, recall_pairs=8, recall_sequences=32, token_pool="vocab") -> EvaluateConfig:
    """The study's evaluation recipe at a preset's sizes: probes at ``shots`` (with the label-permutation
    control), ICL score, induction loss and head scores at ``score_seq_len`` (inside the trained copy
    distances), perplexity guard, and the load-bearing test ``per-layer-2pct`` (top 2% induction heads per
    layer, at least one) vs matched random heads, probes under ablation at the largest shots."""
    return EvaluateConfig(
        probes=ProbeConfig(tasks=tuple(tasks), shots=tuple(shots), n_prompts=n_prompts, batch_size=batch_size),
        icl=ICLScoreConfig(late=icl_late, early=icl_early, n_sequences=icl_windows, batch_size=batch_size),
        induction=InductionLossConfig(seq_len=induction_seq_len or score_seq_len, n_sequences=induction_sequences,
                                      batch_size=batch_size),
        recall=RecallConfig(n_pairs=recall_pairs, n_sequences=recall_sequences, batch_size=batch_size),
        perplexity=PerplexityConfig(max_tokens=ppl_tokens, batch_size=batch_size),
        load_bearing=LoadBearingConfig(ablate=("per-layer-2pct",), n_draws=draws, shots=max(shots)),
        scores=HeadScoreConfig(seq_len=score_seq_len, batch_size=16), token_pool=token_pool)


def _cpu_train(**kw) -> TrainConfig:
    """The CPU recipe the CPU presets share (docs/positive_control.md): cpu-micro, constant lr 3e-3 after a 1%
    warm-up, no weight decay, 8 log-spaced checkpoints, telemetry on 16 sequences of |S| = 16, a head at
    induction score 0.3; ``kw``: the preset's own fields."""
    base = dict(preset="cpu-micro", lr=3e-3, warmup_frac=0.01, min_lr_ratio=1.0, weight_decay=0.0, log_checkpoints=8,
                telemetry_seq_len=16, telemetry_batch=16, induction_threshold=0.3, eval_tokens=16384)
    return TrainConfig(**{**base, **kw})


def cpu_control() -> BiInductStudyConfig:
    """CPU positive control: cpu-micro, BPE 512, random-token spans 8-24, m0 = 1 held, constant lr 3e-3,
    2048 tokens/update, 4000 updates (docs/positive_control.md: the one CPU recipe measured to form an
    induction head)."""
    return BiInductStudyConfig(
        preset="cpu-control", shards="data/demo-512", budget=8_192_000, seeds=2, anneal_frac=1000.0,
        train=_cpu_train(seq_len=128, tokens_per_update=2048, micro_batch_size=16, dense_end=4000, dense_every=250,
                         log_every=10, curriculum=CurriculumConfig(span_source="random", span_length=16,
                                                                   span_length_range=(8, 24), m0=1.0)),
        # tasks whose 10-shot prompts fit 128 tokens of the BPE-512 tokenizer (longer ones are skipped)
        evaluation=_evaluation(tasks=("first_letter", "last_letter", "next_letter", "prev_letter"), icl_windows=64,
                               ppl_tokens=32768, score_seq_len=16),
        data_hint="inductionlab corpus prepare demo --out data/demo-512 --vocab-size 512")


def cpu_natural() -> BiInductStudyConfig:
    """CPU study: cpu-micro, synth-bigram text (repetition 0.9, reliability 0.9, BPE 512), B = 4 x C = 64,
    constant lr 3e-3, 46,875 updates (12e6 tokens), m0 = 0.5 annealed, natural spans 6-14.

    Issue 19: natural-only forms an induction head mid-budget (the law of Aoyama et al. predicts 8e6 tokens
    at B = 4, C = 64, measured ~8e6 in docs/bi_induct_calibration_pilots.md), with the paper's mix annealed
    to 0 over the budget, natural spans of 6-14 tokens (2L + 1 <= C/2: the snippet cap never binds), probes in
    the model's own tokens."""
    return BiInductStudyConfig(
        preset="cpu-natural", shards="data/synth90", budget=12_000_000, seeds=3, anneal_frac=1.0,
        train=_cpu_train(seq_len=64, tokens_per_update=256, micro_batch_size=4, dense_end=46_875, dense_every=1250,
                         log_every=500, curriculum=CurriculumConfig(span_source="natural", span_length=10,
                                                                    span_length_range=(6, 14), m0=0.5)),
        # synth documents are 63 tokens + EOS: the ICL score compares token 62 with token 6 (50 · 62 / 500)
        evaluation=_evaluation(tasks=("first_letter", "next_letter"), shots=(0, 1), n_prompts=16, icl_late=62,
                               icl_early=6, icl_windows=128, ppl_tokens=32768, score_seq_len=16, induction_seq_len=24,
                               induction_sequences=64, recall_pairs=8, recall_sequences=64, token_pool="shards"),
        calibration_lengths=(16, 31),
        data_hint="inductionlab corpus prepare demo --out data/demo-512 --vocab-size 512 && inductionlab corpus "
                  "prepare synth-bigram --from data/demo-512 --repetition 0.9 --reliability 0.9 --tokens 16000000 "
                  "--seq-len 64 --out data/synth90")


def tiny() -> BiInductStudyConfig:
    """CI smoke test: cpu-micro, 64-token context, 8 updates of 512 tokens.

    The whole study in about a minute on one thread."""
    return BiInductStudyConfig(
        preset="tiny", shards="", budget=4096, seeds=2, anneal_frac=1000.0,
        train=_cpu_train(seq_len=64, tokens_per_update=512, micro_batch_size=8, warmup_frac=0.0, log_checkpoints=2,
                         telemetry_seq_len=8, telemetry_batch=4, eval_tokens=512, deterministic=True,
                         curriculum=CurriculumConfig(span_source="random", span_length=8, span_length_range=(4, 12),
                                                     m0=1.0)),
        evaluation=_evaluation(tasks=("copy", "first_letter"), n_prompts=4, icl_windows=8, ppl_tokens=2048, draws=2,
                               batch_size=8, score_seq_len=8),
        data_hint="any prepared corpus (tests build one)")


def paper_013b() -> BiInductStudyConfig:
    """Paper scale: 12 x 768, GQA 12/3, context 1024, 2^16 tokens/update, m0 = 0.5 annealed, natural spans
    L = 20 (SPEC §7); budget = 20 tokens per parameter (decision, Chinchilla)."""
    return BiInductStudyConfig(
        preset="0.13b", shards="", budget=65536 * 40_000, seeds=3, anneal_frac=1.0,
        train=TrainConfig(preset="0.13b", seq_len=1024, tokens_per_update=65536, micro_batch_size=16,
                          log_checkpoints=12, telemetry_seq_len=50, telemetry_batch=16, induction_threshold=0.4,
                          eval_tokens=65536, save_every=1000, log_every=10,
                          curriculum=CurriculumConfig(span_source="natural", span_length=20, m0=0.5)),
        evaluation=_evaluation(n_prompts=64, icl_windows=256, ppl_tokens=1 << 20, draws=5),
        data_hint="inductionlab corpus prepare PATH --out data/corpus --vocab-size ... (any large corpus)")


#: preset name -> the function returning its config (``--preset``; a file's ``preset:`` key).
PRESETS = BiInductStudyConfig.PRESETS
PRESETS.update({"cpu-control": cpu_control, "cpu-natural": cpu_natural, "tiny": tiny, "0.13b": paper_013b})
assert tuple(PRESETS) == PRESET_NAMES


# ---- phase 1: plan (iso-FLOPs) ----------------------------------------------------------------------

def plan_budgets(cfg: BiInductStudyConfig, vocab_size: int) -> dict[str, dict]:
    """The :class:`~inductionlab.train.flops.Budget` of every run, from the configs (no training),
    asserted matched-compute. Returns run name -> budget dict.

    Raises: InductionLabError when two runs differ (cannot happen by construction; asserted)."""
    from ...train.config import model_config
    from ...train.flops import budget, check_iso_flops

    out = {}
    for name, v, s in cfg.runs():
        tc = train_config(cfg, v, s, "run")
        mc = model_config(tc.preset, vocab_size, max_position_embeddings=tc.seq_len)
        out[name] = budget(mc, seq_len=tc.seq_len, tokens_per_update=tc.tokens_per_update, steps=tc.steps).to_dict()
    check_iso_flops(out)
    return out


def gpu_estimate(cfg: BiInductStudyConfig, flops_per_s: float = 400e12, mfu: float = 0.4) -> dict:
    """Expected GPU hours of the study from the FLOPs helper: per run FLOPs / (peak · MFU).
    Defaults: an H100/H200 at ~400 TFLOP/s dense bf16 (decision, rounded), 40% MFU (decision)."""
    from ...data.shards import TokenShards

    b = next(iter(plan_budgets(cfg, TokenShards.open(cfg.shards).vocab_size).values()))
    hours = b["flops"] / (flops_per_s * mfu) / 3600
    return {"flops_per_run": b["flops"], "tokens_per_run": b["tokens"], "runs": len(cfg.runs()),
            "gpu_hours_per_run": hours, "gpu_hours_total": hours * len(cfg.runs()),
            "assumed_flops_per_s": flops_per_s, "assumed_mfu": mfu}


SPEC = StudySpec(
    "study bi-induct", BiInductStudyConfig,
    help="Bi-Induct at matched compute: train none / induction / anti / balanced at identical tokens, steps and "
         "FLOPs (seeds each), aggregate telemetry, evaluate every final checkpoint (probes, ICL score, perplexity, "
         "top-2% vs random ablation) and decide each claim of the paper by rules stated before the data. Each run "
         "is resumable; an existing study with the same options in --out is resumed (finished runs reused). "
         "Guide: docs/study-bi-induct.md.",
    model=None, out="runs/{kind}-{cfg.preset}-{time}", inputs=("shards",), estimate=True, reads_out="partial")


__all__ = ["VARIANTS", "BI_INDUCT", "PRESETS", "PRESET_NAMES", "MAX_SEEDS", "BiInductStudyConfig", "train_config",
           "evaluation_config", "cpu_control", "cpu_natural", "tiny", "paper_013b", "plan_budgets", "gpu_estimate",
           "SPEC"]
