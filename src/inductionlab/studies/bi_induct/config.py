"""Study bi-induct, its setup: the curriculum variants, the presets (:data:`STUDY_PRESETS`), the
config (:class:`BiInductStudyConfig` and its ``validate()``), phase 1 ``plan`` (:func:`plan_budgets`,
iso-FLOPs) and the GPU-hours estimate. Imports only the layers below ``studies`` (``train``, ``data``)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ...checks import INT64_MAX, check_fields
from ...errors import InductionLabError

VARIANTS = ("none", "induction", "anti", "balanced")
BI_INDUCT = ("induction", "anti", "balanced")


# ---- presets --------------------------------------------------------------------------------------

MAX_SEEDS = 1000   # seeds per variant: each is a full training run

@dataclass(frozen=True)
class StudyPreset:
    """A study recipe: the trainer fields shared by every run, the curriculum apart from its
    variant, the default budget and seeds, and the evaluation sizes.

    ``anneal_frac``: T_a as a multiple of the budget (1.0 = the paper's anneal over the whole
    budget; 1000.0 = m held at m0 for the whole run)."""
    name: str
    description: str
    train: dict
    curriculum: dict
    anneal_frac: float
    tokens: int
    seeds: int
    data_hint: str
    eval: dict = field(default_factory=dict)


_EVAL_DEFAULT = dict(tasks=("copy", "capitalize", "uppercase", "first_letter", "next_letter", "next_number",
                            "list_first", "list_last"),
                     shots=(1, 10), n_prompts=32, n_words=400, icl_windows=32, icl_late=500, icl_early=50,
                     ppl_tokens=65536, ablation_top_frac=0.02, ablation_draws=3, ablation_method="zero",
                     batch_size=16, score_seq_len=50)

STUDY_PRESETS: dict[str, StudyPreset] = {
    # docs/positive_control.md (issue 10, item 1): the one CPU recipe measured to form an induction head.
    "cpu-control": StudyPreset(
        "cpu-control", "CPU positive control: cpu-micro, BPE 512, random-token spans 8-24, m0 = 1 held, "
                       "constant lr 3e-3, 2048 tokens/update, 4000 updates",
        train=dict(preset="cpu-micro", seq_len=128, tokens_per_update=2048, micro_batch_size=16, lr=3e-3,
                   warmup_frac=0.01, min_lr_ratio=1.0, weight_decay=0.0, log_checkpoints=8, dense_start=0,
                   dense_end=4000, dense_every=250, telemetry_seq_len=16, telemetry_batch=16,
                   induction_threshold=0.3, eval_tokens=16384, log_every=10),
        curriculum=dict(span_source="random", span_length=16, span_length_range=(8, 24), m0=1.0),
        anneal_frac=1000.0, tokens=8_192_000, seeds=2,
        data_hint="inductionlab corpus prepare demo --out data/demo-512 --vocab-size 512",
        # tasks whose 10-shot prompts fit 128 tokens of the BPE-512 tokenizer (longer ones are skipped)
        eval=dict(_EVAL_DEFAULT, tasks=("first_letter", "last_letter", "next_letter", "prev_letter"),
                  n_prompts=32, icl_windows=64, ppl_tokens=32768, score_seq_len=16)),
    # Issue 19: natural-only forms an induction head mid-budget (synth-bigram text, 0.9 / 0.9; the law of
    # Aoyama et al. predicts 8e6 tokens at B = 4, C = 64, measured ~8e6 in docs/bi_induct_calibration_pilots.md),
    # with the paper's mix m0 = 0.5 annealed to 0 over the budget, natural spans of 6-14 tokens (2L + 1 <= C/2:
    # the snippet cap never binds), probes in the model's own tokens.
    "cpu-natural": StudyPreset(
        "cpu-natural", "CPU study: cpu-micro, synth-bigram text (repetition 0.9, reliability 0.9, BPE 512), "
                       "B = 4 x C = 64, constant lr 3e-3, 46,875 updates (12e6 tokens), m0 = 0.5 annealed, "
                       "natural spans 6-14",
        train=dict(preset="cpu-micro", seq_len=64, tokens_per_update=256, micro_batch_size=4, lr=3e-3,
                   warmup_frac=0.01, min_lr_ratio=1.0, weight_decay=0.0, log_checkpoints=8, dense_start=0,
                   dense_end=46_875, dense_every=1250, telemetry_seq_len=16, telemetry_batch=16,
                   induction_threshold=0.3, eval_tokens=16384, log_every=500),
        curriculum=dict(span_source="natural", span_length=10, span_length_range=(6, 14), m0=0.5),
        anneal_frac=1.0, tokens=12_000_000, seeds=3,
        data_hint="inductionlab corpus prepare demo --out data/demo-512 --vocab-size 512 && inductionlab corpus "
                  "prepare synth-bigram --from data/demo-512 --repetition 0.9 --reliability 0.9 --tokens 16000000 "
                  "--seq-len 64 --out data/synth90",
        # synth documents are 63 tokens + EOS: the ICL score compares token 62 with token 6 (50 · 62 / 500)
        eval=dict(_EVAL_DEFAULT, tasks=("first_letter", "next_letter"), shots=(0, 1), n_prompts=16,
                  icl_late=62, icl_early=6, icl_windows=128, ppl_tokens=32768, score_seq_len=16, induction_seq_len=24, induction_sequences=64,
                  recall_pairs=8, recall_sequences=64, token_pool="shards", calibration_lengths=(16, 31))),
    # CI: the whole study in about a minute on one thread.
    "tiny": StudyPreset(
        "tiny", "CI smoke test: cpu-micro, 64-token context, 8 updates of 512 tokens",
        train=dict(preset="cpu-micro", seq_len=64, tokens_per_update=512, micro_batch_size=8, lr=3e-3,
                   warmup_frac=0.0, min_lr_ratio=1.0, weight_decay=0.0, log_checkpoints=2, telemetry_seq_len=8,
                   telemetry_batch=4, induction_threshold=0.3, eval_tokens=512, deterministic=True),
        curriculum=dict(span_source="random", span_length=8, span_length_range=(4, 12), m0=1.0),
        anneal_frac=1000.0, tokens=4096, seeds=2, data_hint="any prepared corpus (tests build one)",
        eval=dict(_EVAL_DEFAULT, tasks=("copy", "first_letter"), shots=(1, 10), n_prompts=4, n_words=200,
                  icl_windows=8, ppl_tokens=2048, ablation_draws=2, batch_size=8, score_seq_len=8)),
    # The paper's smallest size and recipe (SPEC §7): budget = 20 tokens per parameter (decision, Chinchilla).
    "0.13b": StudyPreset(
        "0.13b", "paper scale: 12 x 768, GQA 12/3, context 1024, 2^16 tokens/update, m0 = 0.5 annealed, natural "
                 "spans L = 20",
        train=dict(preset="0.13b", seq_len=1024, tokens_per_update=65536, micro_batch_size=16, log_checkpoints=12,
                   telemetry_seq_len=50, telemetry_batch=16, induction_threshold=0.4, eval_tokens=65536,
                   save_every=1000, log_every=10),
        curriculum=dict(span_source="natural", span_length=20, m0=0.5),
        anneal_frac=1.0, tokens=65536 * 40_000, seeds=3,
        data_hint="inductionlab corpus prepare PATH --out data/corpus --vocab-size ... (any large corpus)",
        eval=dict(_EVAL_DEFAULT, n_prompts=64, icl_windows=256, ppl_tokens=1 << 20, ablation_draws=5)),
}


# ---- config ---------------------------------------------------------------------------------------

@dataclass
class BiInductStudyConfig:
    """One study. ``budget`` (tokens per run) and ``seeds`` default to the preset's.

    Args:
        preset: a key of :data:`STUDY_PRESETS`.
        shards: prepared corpus (``inductionlab corpus prepare``).
        budget: training tokens per run (rounded down to whole updates).
        seeds: seeds per variant (seeds 0 .. seeds − 1).
        jobs: training runs at a time (subprocesses, one torch thread each).
        nproc: processes per run (> 1: each run under ``torchrun --nproc_per_node=N``; GPUs).
        variants: the curriculum variants (default all four; ``none`` is required as the baseline).
        evaluate: run the evaluation phase.
        train_overrides: extra TrainConfig fields (``{"precision": "bf16"}``), recorded.
    """
    preset: str = "cpu-control"
    shards: str = ""
    budget: int | None = None
    seeds: int | None = None
    jobs: int = 1
    nproc: int = 1
    variants: tuple[str, ...] = VARIANTS
    evaluate: bool = True
    train_overrides: dict = field(default_factory=dict)

    @property
    def recipe(self) -> StudyPreset:
        return STUDY_PRESETS[self.preset]

    @property
    def n_seeds(self) -> int:
        return self.seeds if self.seeds is not None else self.recipe.seeds

    @property
    def tokens(self) -> int:
        b = self.budget if self.budget is not None else self.recipe.tokens
        tpu = self.train_config("none", 0, "x").tokens_per_update
        return (int(b) // tpu) * tpu

    def validate(self) -> None:
        """Cheap checks before anything is written.

        Raises: InductionLabError naming the option and the fix."""
        if self.preset not in STUDY_PRESETS:
            raise InductionLabError(f"unknown study preset {self.preset!r}; use one of {', '.join(STUDY_PRESETS)}")
        if not self.shards:
            raise InductionLabError(f"no corpus; pass --shards DIR (prepare one: {self.recipe.data_hint})")
        if not (Path(self.shards) / "manifest.json").is_file():
            raise InductionLabError(f"--shards {self.shards} is not a prepared corpus (no manifest.json); "
                                    f"prepare one: {self.recipe.data_hint}")
        check_fields(self)
        if self.seeds is not None and self.seeds < 1:
            raise InductionLabError(f"--seeds must be >= 1, got {self.seeds}")
        if self.seeds is not None and self.seeds > MAX_SEEDS:
            raise InductionLabError(f"--seeds {self.seeds:,}: at most {MAX_SEEDS} seeds per variant (each is a full "
                                    "training run)")
        if self.jobs < 1 or self.nproc < 1:
            raise InductionLabError(f"--jobs and --nproc must be >= 1, got {self.jobs} and {self.nproc}")
        cpus = os.cpu_count() or 1
        if self.jobs > cpus or self.nproc > cpus:
            raise InductionLabError(f"--jobs {self.jobs} / --nproc {self.nproc}: this machine has {cpus} CPUs (each "
                                    f"process takes one); use at most {cpus}")
        if self.budget is not None and not 0 < self.budget <= INT64_MAX:
            raise InductionLabError(f"--budget {self.budget:g} must be a positive number of tokens below 2**63")
        bad = [v for v in self.variants if v not in VARIANTS]
        if bad or "none" not in self.variants or len(set(self.variants)) != len(self.variants):
            raise InductionLabError(f"variants must be distinct names from {', '.join(VARIANTS)} and include none "
                                    f"(the natural-only baseline); got {', '.join(self.variants)}")
        tpu = self.train_config("none", 0, "x").tokens_per_update
        b = self.budget if self.budget is not None else self.recipe.tokens
        if b < tpu:
            raise InductionLabError(f"--budget {b} is less than one update of {tpu} tokens; raise --budget")
        for v in self.variants:
            self.train_config(v, 0, "x").validate(self.nproc)

    def train_config(self, variant: str, seed: int, out: str):
        """The :class:`~inductionlab.train.TrainConfig` of run (variant, seed): identical for
        every variant except ``curriculum.variant`` (iso-FLOPs by construction)."""
        from ...data.curriculum import CurriculumConfig
        from ...train.config import TrainConfig

        r = self.recipe
        budget = self.budget if self.budget is not None else r.tokens
        tpu = {**r.train, **self.train_overrides}.get("tokens_per_update", 65536)
        tokens = (int(budget) // tpu) * tpu
        cur = CurriculumConfig(variant=variant, **r.curriculum,
                               anneal_tokens=max(1, int(round(r.anneal_frac * tokens))))
        kw = {**r.train, **self.train_overrides}
        return TrainConfig(data=str(self.shards), out=out, tokens=tokens, seed=seed, curriculum=cur,
                           progress=False, tensorboard=False, **kw)

    def runs(self) -> list[tuple[str, str, int]]:
        """(name, variant, seed) of every run in training order: every seed of the primary
        comparison (none, induction) first, then the other variants seed by seed — so a study
        stopped part-way already holds the main contrast with its seed CI (decision)."""
        first = [v for v in self.variants if v in ("none", "induction")]
        rest = [v for v in self.variants if v not in first]
        return ([(f"{v}-s{s}", v, s) for s in range(self.n_seeds) for v in first]
                + [(f"{v}-s{s}", v, s) for s in range(self.n_seeds) for v in rest])

    def params(self) -> dict:
        """What defines the results (everything but jobs / nproc)."""
        from ...data.shards import TokenShards
        sh = TokenShards.open(self.shards)
        return {"preset": self.preset, "shards": str(Path(self.shards).resolve()),
                "corpus_sha256": sh.manifest.get("corpus_sha256"), "tokens": self.tokens, "seeds": self.n_seeds,
                "variants": list(self.variants),
                "train_overrides": self.train_overrides,
                "train_config": {k: v for k, v in self.train_config("none", 0, "x").run_identity().items()
                                 if k not in ("seed", "data")}}

    def eval_config(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.recipe.eval.items()}

    def eval_key(self) -> str:
        """Piece folder of the evaluations: ``eval-<hash of the evaluation config>``, so a changed
        evaluation recipe re-evaluates the finished checkpoints without retraining them."""
        import hashlib
        return "eval-" + hashlib.sha256(json.dumps(self.eval_config(), sort_keys=True).encode()).hexdigest()[:10]


# ---- phase 1: plan (iso-FLOPs) ----------------------------------------------------------------------

def plan_budgets(cfg: BiInductStudyConfig) -> dict[str, dict]:
    """The :class:`~inductionlab.train.flops.Budget` of every run, from the configs (no training),
    asserted matched-compute. Returns run name -> budget dict.

    Raises: InductionLabError when two runs differ (cannot happen by construction; asserted)."""
    from ...data.shards import TokenShards
    from ...train.config import model_config
    from ...train.flops import budget, check_iso_flops

    sh = TokenShards.open(cfg.shards)
    out = {}
    for name, v, s in cfg.runs():
        tc = cfg.train_config(v, s, "x")
        mc = model_config(tc.preset, sh.vocab_size, max_position_embeddings=tc.seq_len)
        out[name] = budget(mc, seq_len=tc.seq_len, tokens_per_update=tc.tokens_per_update, steps=tc.steps).to_dict()
    check_iso_flops(out)
    return out


def gpu_estimate(cfg: BiInductStudyConfig, flops_per_s: float = 400e12, mfu: float = 0.4) -> dict:
    """Expected GPU hours of the study from the FLOPs helper: per run FLOPs / (peak · MFU).
    Defaults: an H100/H200 at ~400 TFLOP/s dense bf16 (decision, rounded), 40% MFU (decision)."""
    b = next(iter(plan_budgets(cfg).values()))
    hours = b["flops"] / (flops_per_s * mfu) / 3600
    return {"flops_per_run": b["flops"], "tokens_per_run": b["tokens"], "runs": len(cfg.runs()),
            "gpu_hours_per_run": hours, "gpu_hours_total": hours * len(cfg.runs()),
            "assumed_flops_per_s": flops_per_s, "assumed_mfu": mfu}
