"""``inductionlab study bi-induct``: the Bi-Induct matched-compute experiment end to end (SPEC §6–§8).

Four curriculum variants (``none`` = natural-only, ``induction``, ``anti``, ``balanced``) are
trained at identical tokens, steps and FLOPs (asserted with :func:`inductionlab.train.flops.check_iso_flops`
and recorded), ``seeds`` seeds each; telemetry over checkpoints is aggregated; every final
checkpoint is evaluated (HITS@1/@3 probes at 1 and 10 shots, ICL score, held-out perplexity,
top-2%-per-layer induction vs random head ablation); a verdict per claim of the paper is decided
by the rules in :data:`RULES` (stated here, in code, before any data is seen).

Phases (the machinery is shared: :class:`inductionlab.studies.run.StudyRun`, the trainer, the
evaluation pieces; this module holds config, phases and verdicts):

1. ``plan``: the budget of every run (:class:`~inductionlab.train.flops.Budget`), asserted equal,
   written as the first piece — a later call with another budget on the same ``--out`` is refused.
2. ``train``: one ``inductionlab train`` subprocess per (variant, seed) under
   ``<out>/runs/<variant>-s<seed>`` (``jobs`` at a time, one torch thread each; under a GPU
   launcher ``torchrun --nproc_per_node=N``). A finished run is reused; an interrupted one is
   resumed by the trainer itself from its last checkpoint. Piece ``train/<run>`` = its summary.
3. ``evaluate``: piece ``eval/<run>`` per final checkpoint (:func:`evaluate_checkpoint`).
4. tables, figure, verdicts, ``report.md``, ``results.json``.

Presets (:data:`STUDY_PRESETS`): ``cpu-control`` (the CPU positive control of
docs/positive_control.md: forms an induction head on one CPU thread in ~5 min), ``tiny`` (CI), ``0.13b``
(the paper's smallest size, for GPUs).
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from ...checks import INT64_MAX, check_fields
from ...errors import InductionLabError
from ...runtime.run_dir import TrainRun, final_checkpoint  # noqa: F401 (study_bi_induct.final_checkpoint: the one reader)
from ...runtime.runs import atomic_write_json, atomic_write_text, own_entries, versions
from ..run import StudyRun, Verdict

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


# ---- decision rules (written before any data; issue 10) ----------------------------------------

MIN_SEEDS_FOR_CI = 2          # a 95% CI over seeds needs at least 2 seeds
INDUCTION_EFFECT = 0.10       # A: final max induction score (attention prob.) higher by >= this ...
ANTI_NEAR_ZERO = 0.20         # B: peak max anti-induction score stays below this (uniform at T=16 ~0.05)
PROBE_FLOOR = 0.05            # C: natural-only's intact accuracy on the deciding probe must exceed this
PROBE_MARGIN = 0.02           # C: Bi-Induct may beat natural-only by at most this (accuracy) to call it neutral
ICL_FLOOR = 0.05              # D: intact ICL benefit (nats) of natural-only must exceed this to be testable
# Issue 19, written before the cpu-natural data: a relative change is reported only where every compared
# run's intact value is above these (below them it divides by ~0); the verdict itself uses absolute changes.
RELATIVE_FLOOR = {"icl_benefit": 0.10, "recall_accuracy": 0.20, "copy_accuracy": 0.20}
D_MEASURE = "icl_benefit"     # D decides on the absolute induction − random contrast of this (nats)
C_MEASURE = "recall_accuracy" # C decides on this intact probe (associative recall in the model's own tokens)

RULES: dict[str, str] = {
    "A": (f"Testable iff every compared variant has >= {MIN_SEEDS_FOR_CI} seeds and at least one run of the study "
          f"reached the emergence threshold (a head formed at this scale). Reproduced iff, over seeds paired by "
          f"seed index, the final max induction score of the Bi-Induct variant minus natural-only has mean >= "
          f"{INDUCTION_EFFECT} and 95% CI low > 0, OR the variant emerged in every seed and earlier than "
          f"natural-only in every seed (never = infinitely late). Else not reproduced."),
    "B": (f"Testable iff the anti and balanced variants have >= {MIN_SEEDS_FOR_CI} seeds. Reproduced iff for both, "
          f"the peak (over checkpoints) max anti-induction score has 95% CI high < {ANTI_NEAR_ZERO}. "
          f"Not reproduced iff either mean >= {ANTI_NEAR_ZERO}; otherwise (CI straddles) not testable."),
    "C": (f"Benchmarks via lm-evaluation-harness are not run (datasets offline); probes only, in the model's own "
          f"tokens. Deciding probe: {C_MEASURE} (associative recall: top-1 accuracy of a value after its repeated "
          f"key). Testable iff >= {MIN_SEEDS_FOR_CI} seeds and natural-only's intact accuracy > {PROBE_FLOOR} in "
          f"every seed (off the floor; else the probe is uninformative). Reproduced iff for every Bi-Induct variant "
          f"the paired (by seed) difference variant − natural-only is not (mean > +{PROBE_MARGIN} with 95% CI low > "
          f"0) (no variant clearly better than natural-only). Else not reproduced. The function-style probes "
          f"(HITS@1) and copy accuracy are reported beside it."),
    "D": (f"Testable iff >= {MIN_SEEDS_FOR_CI} seeds and natural-only's intact ICL benefit (loss early − late, "
          f"held-out text) > {ICL_FLOOR} nats in every seed. Measure per run: the ABSOLUTE change (nats) of the "
          f"{D_MEASURE} under top-2%-per-layer induction-head ablation minus under matched random heads (per "
          f"window, random draws pooled). Reproduced iff the paired (by seed) difference natural-only − induction "
          f"variant has 95% CI high < 0 (natural-only loses more nats). Else not reproduced. Relative changes are "
          f"reported only where every compared run's intact value exceeds RELATIVE_FLOOR ({RELATIVE_FLOOR}); the "
          f"same absolute contrasts of recall and copy accuracy (points) are reported beside it. Paper (relative): "
          f"−22.6% vs −4.9% at 0.13B, −19.5% vs −14.5% at 1B."),
    "E": (f"Testable iff >= {MIN_SEEDS_FOR_CI} seeds. Measure: log held-out perplexity of the induction variant "
          f"minus natural-only, paired by seed. Reproduced iff 95% CI low > 0 (a penalty); else not reproduced."),
    "CI": "95% CIs over seeds are Student-t (n − 1 degrees of freedom); over units (windows, sequences) normal.",
}

CLAIMS: dict[str, str] = {
    "A": "Bi-Induct raises induction activity / speeds emergence",
    "B": "anti-induction stays near zero even with backward (anti) data",
    "C": "benchmarks and probes neutral or better for natural-only",
    "D": "natural-only loses more under top-2% induction-head ablation",
    "E": "Bi-Induct pays a perplexity penalty",
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


# ---- phase 2: training (subprocesses) ----------------------------------------------------------------

def _die_with_parent() -> None:           # preexec_fn: a SIGKILLed study takes its trainers with it
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except OSError:
        pass


def train_command(cfg: BiInductStudyConfig, config_file: Path) -> list[str]:
    """The command line of one training run: ``python -m inductionlab.cli train --config FILE``,
    or under ``torchrun --standalone --nproc_per_node=N`` when ``cfg.nproc > 1``."""
    if cfg.nproc > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={cfg.nproc}",
                "-m", "inductionlab.cli", "train", "--config", str(config_file)]
    return [sys.executable, "-m", "inductionlab.cli", "train", "--config", str(config_file)]


def _write_train_config(tc, path: Path) -> None:
    import yaml
    d = tc.to_dict()
    d["curriculum"] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in d["curriculum"].items()}
    atomic_write_text(path, yaml.safe_dump(d, sort_keys=True))


def run_finished(run_dir: Path) -> bool:
    return TrainRun(run_dir).is_complete


def train_runs(cfg: BiInductStudyConfig, out: Path, *, progress: bool = True,
               log: Callable[[str], None] = print) -> dict[str, float]:
    """Train every (variant, seed) run not finished yet, ``cfg.jobs`` at a time. Returns run name ->
    wall seconds of this call's subprocess (0 for a run already finished).

    Raises: InductionLabError naming the failed run and its log file."""
    todo = [(n, v, s) for n, v, s in cfg.runs() if not run_finished(out / "runs" / n)]
    walls = {n: 0.0 for n, _, _ in cfg.runs()}
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("STUDY_THREADS", "1"),
           "MKL_NUM_THREADS": os.environ.get("STUDY_THREADS", "1"),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                          *filter(None, [os.environ.get("PYTHONPATH")])])}
    running: dict[str, tuple[subprocess.Popen, float, Any]] = {}
    failed = []
    try:
        while todo or running:
            while todo and len(running) < cfg.jobs:
                name, v, s = todo.pop(0)
                rd = out / "runs" / name
                tc = cfg.train_config(v, s, str(rd))
                cfile = out / "runs" / f"{name}.yaml"
                _write_train_config(tc, cfile)
                logf = open(out / "runs" / f"{name}.log", "a")
                if progress:
                    log(f"train {name}: {tc.steps} updates x {tc.tokens_per_update} tokens")
                p = subprocess.Popen(train_command(cfg, cfile), stdout=logf, stderr=subprocess.STDOUT, env=env,
                                     preexec_fn=_die_with_parent if os.name == "posix" else None)
                running[name] = (p, time.perf_counter(), logf)
            time.sleep(0.2)
            for name in list(running):
                p, t0, logf = running[name]
                if p.poll() is None:
                    continue
                logf.close()
                del running[name]
                walls[name] = time.perf_counter() - t0
                if p.returncode != 0 or not run_finished(out / "runs" / name):
                    failed.append(name)
                elif progress:
                    log(f"done  {name}: {walls[name]:.0f} s")
            if failed:
                break
    finally:
        for name, (p, _, logf) in running.items():
            p.kill()
            p.wait()
            logf.close()
    if failed:
        tail = (out / "runs" / f"{failed[0]}.log").read_text().strip().splitlines()[-3:]
        raise InductionLabError(f"training run {failed[0]} failed (log: {out / 'runs' / failed[0]}.log): "
                                + " | ".join(tail))
    return walls


def run_piece(run_dir: Path) -> dict:
    """Summary of one finished run: its budget, results (run_summary) and telemetry summary rows."""
    from ...train.telemetry import read_telemetry, summarize

    rec = TrainRun.open(run_dir).record
    heads, evals = read_telemetry(run_dir)
    s = summarize(heads)
    s = s[s["score"].isin(["induction", "anti_induction", "copy_offset", "copy_offset_control"])]
    ev = evals.sort_values("step")
    return {"budget": rec["budget"], "results": rec["results"], "config": rec["config"],
            "train_time_s": rec["results"].get("train_time_s"),
            "summary": s[["step", "tokens", "score", "max", "top2pct_mean", "max_layer", "max_head"]]
            .to_dict(orient="list"),
            "evals": ev[["step", "tokens", "heldout_loss", "heldout_ppl"]].to_dict(orient="list"),
            "final_scores": _final_scores(run_dir)}


def _final_scores(run_dir: Path) -> dict:
    return json.loads(TrainRun(run_dir).telemetry_files()[-1].read_text())["scores"]


# ---- phase 3: evaluation (`inductionlab evaluate` on every final checkpoint) -----------------------

def evaluation_config(ev: dict, seed: int = 0):
    """The :class:`~inductionlab.studies.evaluate.study.EvaluateConfig` of a preset's evaluation recipe ``ev``:
    probes at ``ev["shots"]`` (with the label-permutation control), ICL score, induction loss and
    head scores at ``score_seq_len`` (inside the trained copy distances), perplexity guard, and the
    load-bearing test ``per-layer-2pct`` (top 2% induction heads per layer, at least one) vs
    matched random heads, probes under ablation at 10 shots."""
    from ..evaluate import (EvaluateConfig, ICLScoreConfig, InductionLossConfig, LoadBearingConfig, PerplexityConfig,
                           ProbeConfig, RecallConfig)
    pct = f"per-layer-{100 * ev['ablation_top_frac']:g}pct"
    return EvaluateConfig(
        probes=ProbeConfig(tasks=tuple(ev["tasks"]), shots=tuple(ev["shots"]), n_prompts=ev["n_prompts"],
                           batch_size=ev["batch_size"]),
        icl=ICLScoreConfig(late=ev["icl_late"], early=ev["icl_early"], n_sequences=ev["icl_windows"],
                           batch_size=ev["batch_size"]),
        induction=InductionLossConfig(seq_len=ev.get("induction_seq_len", ev["score_seq_len"]),
                                      n_sequences=ev.get("induction_sequences", 16), batch_size=ev["batch_size"]),
        recall=RecallConfig(n_pairs=ev.get("recall_pairs", 8), n_sequences=ev.get("recall_sequences", 32),
                            batch_size=ev["batch_size"]),
        perplexity=PerplexityConfig(max_tokens=ev["ppl_tokens"], batch_size=ev["batch_size"]),
        load_bearing=LoadBearingConfig(ablate=(pct,), n_draws=ev["ablation_draws"], method=ev["ablation_method"],
                                       shots=max(ev["shots"])),
        seed=seed, score_seq_len=ev["score_seq_len"], score_batch_size=16, token_pool=ev.get("token_pool", "vocab"))


def evaluate_checkpoint(ckpt: Path, shards: str, ev: dict, out: Path, *, seed: int = 0) -> dict:
    """``inductionlab evaluate`` (:func:`inductionlab.studies.evaluate.study.run_evaluate`) of one trained
    checkpoint into ``out`` (resumable there), condensed to what the study compares: macro
    HITS@1/@3 per shots of the intact model, the ICL score, the perplexity guard, and the relative
    changes of the ICL benefit (and of HITS@1, the induction benefit) under the top-2%-per-layer
    ablation vs matched random heads. Returns a JSON-able dict."""
    from ..evaluate.study import run_evaluate
    from ...core.models import load_model

    ecfg = evaluation_config(ev, seed)
    loaded = load_model(str(ckpt), dtype="float32")    # the study's numbers, the same on every CPU
    res = run_evaluate(loaded, ecfg, out, shards=shards, progress=False)
    calibration = {}
    if ev.get("calibration_lengths"):                  # max induction at several |S| (issue 19: not only one)
        from ...core.scores import compute_head_scores

        for T in ev["calibration_lengths"]:        # the evaluation's own token pool (the shards' ids)
            hs = compute_head_scores(loaded.model, tokenizer=loaded.tokenizer, seq_len=int(T), batch_size=32,
                                     seed=seed + 1, names=("induction",), pool=res.pool, induction_loss=False)
            calibration[str(int(T))] = float(np.max(hs.scores["induction"]))
    h = res.hits
    macro = h[(h["condition"] == "intact") & (h["task"] == "macro")]
    icl = res.icl_summary.set_index("condition").loc["intact"]
    pct = ecfg.load_bearing.ablate[0]
    d = res.drops[res.drops["variant"] == pct] if len(res.drops) else res.drops

    def drop(measure: str, kind: str) -> dict:
        r = d[(d["measure"] == measure) & (d["kind"] == kind) & (d["draw"].astype(str).isin(["0", "pooled"]))]
        if kind == "random":
            r = r[r["draw"].astype(str) == "pooled"]
        keys = ["intact", "relative", "ci_low", "ci_high", "absolute", "absolute_ci_low", "absolute_ci_high"]
        return {k: (None if k not in r or pd.isna(r.iloc[0][k]) else float(r.iloc[0][k])) for k in keys} \
            if len(r) else dict.fromkeys(keys)

    ablation = {"variant": pct, "method": ecfg.load_bearing.method,
                "heads": [c.heads for c in res.conditions if c.kind == "induction"][0],
                **{m: {"induction": drop(m, "induction"), "random": drop(m, "random"),
                       "contrast": drop(m, "induction-random")}
                   for m in ("icl_benefit", f"hits1_{ecfg.load_bearing.shots}shot", "induction_benefit",
                             "copy_accuracy", "recall_accuracy")}}
    return {"checkpoint": str(ckpt), "evaluate_dir": str(out),
            "probes": macro[["shots", "control", "n", "hits1", "hits1_ci_low", "hits1_ci_high", "hits3",
                             "hits3_ci_low", "hits3_ci_high"]].to_dict(orient="records"),
            "icl": {"score": float(icl["icl_score"]), "ci_low": float(icl["icl_score_ci_low"]),
                    "ci_high": float(icl["icl_score_ci_high"]), "benefit": float(icl["icl_benefit"]),
                    "late": int(icl["late"]), "early": int(icl["early"]),
                    "induction_benefit": float(icl["induction_benefit"]),
                    "copy_accuracy": float(icl["copy_accuracy"]), "recall_accuracy": float(icl["recall_accuracy"])},
            "calibration_max_induction": calibration,
            "perplexity": {k: res.perplexity[k] for k in ("perplexity", "nll_per_token", "n_scored", "context")},
            "ablation": ablation, "notes": res.notes}


# ---- tables and verdicts (pure functions over the pieces) ---------------------------------------

def _f(x) -> float:
    return float("nan") if x is None else float(x)


def runs_table(pieces: dict[str, dict], evals: dict[str, dict]) -> pd.DataFrame:
    """One row per run: variant, seed, emergence, final and peak scores, perplexities, probes, drops."""
    from ...train.telemetry import predicted_emergence
    rows = []
    for name, p in pieces.items():
        v, s = name.rsplit("-s", 1)
        r = p["results"]
        law = predicted_emergence(p["budget"]["global_batch"], p["budget"]["seq_len"])
        summ = pd.DataFrame(p["summary"])
        peak = summ.groupby("score")["max"].max()
        row = {"run": name, "variant": v, "seed": int(s), "tokens": p["budget"]["tokens"],
               "steps": p["budget"]["steps"], "flops": p["budget"]["flops"], "train_time_s": p["train_time_s"],
               "emergence_step": r.get("emergence_step"), "emergence_tokens": r.get("emergence_tokens"),
               "law_emergence_tokens": law["tokens"], "law_emergence_steps": law["updates"],
               "final_max_induction": r["final"]["induction"]["max"],
               "final_top2pct_induction": r["final"]["induction"]["top2pct_mean"],
               "peak_max_induction": float(peak.get("induction", np.nan)),
               "final_max_anti_induction": r["final"]["anti_induction"]["max"],
               "peak_max_anti_induction": float(peak.get("anti_induction", np.nan)),
               "final_max_copy_offset": r["final"]["copy_offset"]["max"],
               "final_max_copy_offset_control": r["final"]["copy_offset_control"]["max"],
               "telemetry_heldout_ppl": r.get("final_heldout_ppl")}
        e = evals.get(name)
        if e:
            macro = {(int(m["shots"]), m["control"]): m for m in e["probes"]}
            for k in (1, 10):
                m = macro.get((k, "intact"), {})
                row[f"hits1_{k}shot"] = m.get("hits1", np.nan)
                row[f"hits3_{k}shot"] = m.get("hits3", np.nan)
            for T, v in (e.get("calibration_max_induction") or {}).items():
                row[f"final_max_induction_S{T}"] = v
            row.update(copy_accuracy=e["icl"].get("copy_accuracy", np.nan),
                       recall_accuracy=e["icl"].get("recall_accuracy", np.nan))
            for m in ("icl_benefit", "copy_accuracy", "recall_accuracy"):
                ab = e["ablation"].get(m)
                if ab is None:
                    continue
                for kind in ("induction", "random", "contrast"):
                    row[f"abs_{m}_{kind}"] = _f(ab[kind].get("absolute"))
                    row[f"rel_{m}_{kind}"] = _f(ab[kind].get("relative"))
            row.update(icl_score=e["icl"]["score"], icl_benefit=e["icl"]["benefit"],
                       ppl=e["perplexity"]["perplexity"],
                       drop_induction=_f(e["ablation"]["icl_benefit"]["induction"]["relative"]),
                       drop_random=_f(e["ablation"]["icl_benefit"]["random"]["relative"]),
                       drop_contrast=_f(e["ablation"]["icl_benefit"]["contrast"]["relative"]),
                       drop_contrast_ci_low=_f(e["ablation"]["icl_benefit"]["contrast"]["ci_low"]),
                       drop_contrast_ci_high=_f(e["ablation"]["icl_benefit"]["contrast"]["ci_high"]))
        rows.append(row)
    return pd.DataFrame(rows).sort_values(["variant", "seed"], key=lambda c: c.map(
        {v: i for i, v in enumerate(VARIANTS)}) if c.name == "variant" else c).reset_index(drop=True)


def _by_seed(t: pd.DataFrame, variant: str, col: str) -> pd.Series:
    g = t[t["variant"] == variant].set_index("seed")[col] if col in t else pd.Series(dtype=float)
    return g.astype(float)


def seed_ci(values) -> tuple[float, float, float]:
    """``(mean, ci_low, ci_high)``: 95% Student-t CI over seeds (n − 1 degrees of freedom; NaN
    bounds for one seed). A study has 2–5 seeds, where the normal approximation is too narrow
    (t quantile 4.30 at n = 3 against 1.96)."""
    from scipy.stats import t as student_t

    x = np.asarray(values, np.float64)
    m = float(x.mean())
    if len(x) < 2:
        return m, float("nan"), float("nan")
    half = float(student_t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return m, m - half, m + half


def _paired(t: pd.DataFrame, a: str, b: str, col: str) -> tuple[np.ndarray, tuple[float, float, float] | None]:
    """Per-seed ``a − b`` of ``col`` over seeds both have, and its (mean, ci_low, ci_high) (None: no seed)."""
    x, y = _by_seed(t, a, col), _by_seed(t, b, col)
    d = (x - y).dropna().to_numpy()
    return d, (seed_ci(d) if len(d) else None)


def _fmt(m: tuple | None, d: int = 3) -> str:
    if m is None:
        return "n/a"
    mean, lo, hi = m
    if not np.isfinite(lo):
        return f"{mean:+.{d}f} [CI n/a]"
    return f"{mean:+.{d}f} [{lo:+.{d}f}, {hi:+.{d}f}]"


def _verdict(claim: str, status: str, evidence: str) -> Verdict:
    return Verdict(claim, status, RULES[claim] + " " + RULES["CI"], evidence, text=CLAIMS[claim])


def _n_seeds(t: pd.DataFrame, variants: Sequence[str]) -> int:
    return min((int((t["variant"] == v).sum()) for v in variants), default=0)


def verdict_a(t: pd.DataFrame, threshold: float) -> list[Verdict]:
    """Claim A per forward-copy variant (induction, balanced), by :data:`RULES` ["A"]."""
    out = []
    formed = bool((t["peak_max_induction"] >= threshold).any())
    for v in ("induction", "balanced"):
        if v not in set(t["variant"]):
            continue
        d, m = _paired(t, v, "none", "final_max_induction")
        em_v, em_n = _by_seed(t, v, "emergence_tokens"), _by_seed(t, "none", "emergence_tokens")
        seeds = sorted(set(em_v.index) & set(em_n.index))
        inf = lambda x: math.inf if x is None or pd.isna(x) else float(x)  # noqa: E731
        earlier = bool(seeds) and all(np.isfinite(inf(em_v[s])) and inf(em_v[s]) < inf(em_n[s]) for s in seeds)
        ev = (f"{v}: final max induction − none = {_fmt(m)} (seeds {len(d)}); emergence tokens {v} "
              f"{[None if pd.isna(x) else int(x) for x in em_v]} vs none {[None if pd.isna(x) else int(x) for x in em_n]}"
              f" (threshold {threshold})")
        if _n_seeds(t, (v, "none")) < MIN_SEEDS_FOR_CI or not formed:
            why = "fewer than 2 seeds" if _n_seeds(t, (v, "none")) < MIN_SEEDS_FOR_CI else "no run formed a head"
            out.append(_verdict("A", "not testable", f"{why}; {ev}") | {"variant": v})
            continue
        ok = (m is not None and m[0] >= INDUCTION_EFFECT and m[1] > 0) or earlier
        out.append(_verdict("A", "reproduced" if ok else "not reproduced", ev) | {"variant": v})
    return out


def verdict_b(t: pd.DataFrame) -> Verdict:
    vs = [v for v in ("anti", "balanced") if v in set(t["variant"])]
    parts, cis = [], []
    for v in vs:
        x = _by_seed(t, v, "peak_max_anti_induction").dropna().to_numpy()
        c = seed_ci(x) if len(x) else None
        cis.append(c)
        parts.append(f"{v}: peak max anti-induction {_fmt(c)} (seeds {len(x)})")
    ev = "; ".join(parts) + f" (bound {ANTI_NEAR_ZERO})"
    if not vs or _n_seeds(t, vs) < MIN_SEEDS_FOR_CI:
        return _verdict("B", "not testable", "fewer than 2 seeds of anti/balanced; " + ev)
    if any(c[0] >= ANTI_NEAR_ZERO for c in cis):
        return _verdict("B", "not reproduced", ev)
    if all(c[2] < ANTI_NEAR_ZERO for c in cis):
        return _verdict("B", "reproduced", ev)
    return _verdict("B", "not testable", "CI straddles the bound; " + ev)


def verdict_c(t: pd.DataFrame) -> Verdict:
    """Claim C by :data:`RULES` ["C"]: the deciding probe :data:`C_MEASURE`, function probes beside it."""
    col = C_MEASURE
    if col not in t or t[col].isna().all():
        return _verdict("C", "not testable", f"no {col} results (evaluation not run)")
    vs = [v for v in BI_INDUCT if v in set(t["variant"])]
    diffs = {v: _paired(t, v, "none", col)[1] for v in vs}
    nat = _by_seed(t, "none", col)
    side = []
    for c in ("copy_accuracy", "hits1_1shot", "hits1_10shot"):
        if c in t and not t[c].isna().all():
            side.append(f"{c} " + ", ".join(f"{v} {t.loc[t.variant == v, c].mean():.3f}" for v in VARIANTS
                                           if v in set(t["variant"])))
    ev = "; ".join(f"{v} − none {col} = {_fmt(m)}" for v, m in diffs.items()) + \
        f"; natural-only intact {col} per seed {[round(float(x), 3) for x in nat]} (floor {PROBE_FLOOR}); " + \
        "; ".join(side)
    if _n_seeds(t, ("none", *vs)) < MIN_SEEDS_FOR_CI:
        return _verdict("C", "not testable", f"fewer than 2 seeds; {ev}")
    if not (nat > PROBE_FLOOR).all():
        return _verdict("C", "not testable", f"natural-only is at the floor on {col} (the probe is "
                                                            f"uninformative); {ev}")
    better = [v for v, m in diffs.items() if m is not None and m[0] > PROBE_MARGIN and m[1] > 0]
    return _verdict("C", "not reproduced" if better else "reproduced", ev)


def _relative_allowed(t: pd.DataFrame, variants: Sequence[str], measure: str) -> bool:
    """Pre-registered: a relative change is reported only when every compared run's intact value
    exceeds :data:`RELATIVE_FLOOR` [measure]."""
    g = t[t.variant.isin(variants)][measure].astype(float)
    return bool(len(g)) and bool((g > RELATIVE_FLOOR[measure]).all())


def verdict_d(t: pd.DataFrame) -> Verdict:
    """Claim D by :data:`RULES` ["D"]: absolute induction − random contrasts, natural-only vs induction."""
    col = f"abs_{D_MEASURE}_contrast"
    if col not in t or t[col].isna().all():
        return _verdict("D", "not testable", "no ablation results (evaluation not run)")
    parts = []
    for m, unit in (("icl_benefit", "nats"), ("recall_accuracy", "acc"), ("copy_accuracy", "acc")):
        if f"abs_{m}_contrast" not in t:
            continue
        d, c = _paired(t, "none", "induction", f"abs_{m}_contrast")
        per = ", ".join(f"{v} {t.loc[t.variant == v, f'abs_{m}_induction'].mean():+.3f} / "
                        f"{t.loc[t.variant == v, f'abs_{m}_random'].mean():+.3f} (intact "
                        f"{t.loc[t.variant == v, m].mean():.3f})" for v in VARIANTS if v in set(t.variant))
        if _relative_allowed(t, ("none", "induction"), m):
            _, rc = _paired(t, "none", "induction", f"rel_{m}_contrast")
            rel = f"; relative contrast none − induction {_fmt(rc)} (intact above {RELATIVE_FLOOR[m]})"
        else:
            rel = f"; relative not reported (some intact value <= {RELATIVE_FLOOR[m]})"
        parts.append(f"{m} [{unit}]: absolute contrast (induction − random) none − induction = {_fmt(c)}; "
                     f"absolute change induction / random heads per variant: {per}{rel}")
    ev = " ◆ ".join(parts)      # not "|": the evidence sits in a markdown table cell
    ben = _by_seed(t, "none", "icl_benefit")
    if _n_seeds(t, ("none", "induction")) < MIN_SEEDS_FOR_CI or not (ben > ICL_FLOOR).all():
        why = "fewer than 2 seeds" if _n_seeds(t, ("none", "induction")) < MIN_SEEDS_FOR_CI else \
            f"natural-only has no ICL benefit to lose (<= {ICL_FLOOR} nats)"
        return _verdict("D", "not testable", f"{why}; {ev}")
    _, m = _paired(t, "none", "induction", col)
    return _verdict("D", "reproduced" if m is not None and m[2] < 0 else "not reproduced", ev)


def verdict_e(t: pd.DataFrame) -> Verdict:
    col = "ppl" if "ppl" in t and not t["ppl"].isna().all() else "telemetry_heldout_ppl"
    t = t.assign(log_ppl=np.log(t[col].astype(float)))
    parts = {v: _paired(t, v, "none", "log_ppl")[1] for v in BI_INDUCT if v in set(t["variant"])}
    ev = "; ".join(f"{v} − none log ppl = {_fmt(m)}" for v, m in parts.items()) + \
        "; ppl " + ", ".join(f"{v} {t.loc[t.variant == v, col].mean():.2f}" for v in VARIANTS if v in set(t.variant)) \
        + f" (source {col})"
    if _n_seeds(t, ("none", "induction")) < MIN_SEEDS_FOR_CI:
        return _verdict("E", "not testable", "fewer than 2 seeds; " + ev)
    m = parts.get("induction")
    return _verdict("E", "reproduced" if m is not None and m[1] > 0 else "not reproduced", ev)


def variants_table(t: pd.DataFrame) -> list[dict]:
    """Per variant: emergence tokens (seeds that emerged; ``never`` the others), final and peak
    scores, perplexity, probes: each ``mean [95% t-CI]`` over seeds (:func:`seed_ci`)."""
    cols = ["final_max_induction", *[c for c in t.columns if c.startswith("final_max_induction_S")],
            "peak_max_anti_induction", "ppl", "telemetry_heldout_ppl", "recall_accuracy", "copy_accuracy",
            "icl_benefit"]
    rows = []
    for v in VARIANTS:
        g = t[t.variant == v]
        if not len(g):
            continue
        em = g["emergence_tokens"].astype(float)
        r = {"variant": v, "seeds": int(len(g)), "never": int(em.isna().sum()),
             "emergence_tokens": _fmt(seed_ci(em.dropna().to_numpy()), 0).replace("+", "") if em.notna().any()
             else "never"}
        for c in cols:
            if c in g and g[c].notna().any():
                r[c] = _fmt(seed_ci(g[c].dropna().astype(float).to_numpy()), 3).replace("+", "")
        rows.append(r)
    return rows


def verdicts(t: pd.DataFrame, threshold: float) -> list[Verdict]:
    """Every claim's verdict (A per forward variant, then B–E) by :data:`RULES`."""
    return [*verdict_a(t, threshold), verdict_b(t), verdict_c(t), verdict_d(t), verdict_e(t)]


# ---- the study ------------------------------------------------------------------------------------

@dataclass
class BiInductStudy:
    out: Path
    config: BiInductStudyConfig
    table: pd.DataFrame
    verdicts: list[Verdict]
    record: dict
    timings: dict


def run_bi_induct_study(cfg: BiInductStudyConfig, out: str | Path, *, overwrite: bool = False, progress: bool = True,
                        partial: bool = False, on_checkpoint: Callable[[str], None] | None = None,
                        log: Callable[[str], None] = print) -> BiInductStudy:
    """Run (or resume) the whole study into ``out``; see the module docstring for the phases.

    ``partial``: train nothing; aggregate, evaluate and report the runs finished so far (e.g.
    while the study is still training in another process); the missing runs are listed in the
    record and the report, and claims without 2 seeds per compared variant are "not testable".

    Raises:
        InductionLabError: invalid config (before anything is written); ``out`` holding a study
            with other parameters (e.g. another budget); a training run that fails.
        TypeError: ``cfg`` not a BiInductStudyConfig (a dict included).
    """
    t_start = time.perf_counter()
    from ...checks import check_type

    check_type(cfg, BiInductStudyConfig, "run_bi_induct_study: cfg")
    cfg.validate()
    out = Path(out)
    inputs = [cfg.shards]                # the prepared corpus: never under --out (--overwrite would delete it)
    StudyRun.check_out(out, overwrite, inputs=inputs)
    params = cfg.params()
    run = StudyRun(out, "study-bi-induct", params, overwrite=overwrite, on_checkpoint=on_checkpoint,
                   inputs=inputs, started=t_start)
    if not overwrite and (out / "study.json").is_file() and own_entries(out / "runs"):
        old = json.loads((out / "study.json").read_text()).get("params", {})
        if old != run.params:
            diff = sorted(k for k in set(old) | set(run.params) if old.get(k) != run.params.get(k))
            raise InductionLabError(f"{out} holds a bi-induct study with different parameters ({', '.join(diff)}); "
                                    "use a new --out, the same options (budget, seeds, preset), or --overwrite")
    run.open()
    budgets = run.json("plan", lambda: {"budgets": plan_budgets(cfg), "versions": versions()})["budgets"]
    (out / "runs").mkdir(parents=True, exist_ok=True)
    with run.timed("train"):
        if partial:
            walls = {}
            runs = [r for r in cfg.runs() if run_finished(out / "runs" / r[0])]
            if not any(v == "none" for _, v, _ in runs):
                raise InductionLabError(f"{out} holds no finished natural-only run yet; wait, or run without --partial")
        else:
            walls = train_runs(cfg, out, progress=progress, log=log)
            runs = cfg.runs()
    missing = [n for n, _, _ in cfg.runs() if n not in {r[0] for r in runs}]
    from ...train.flops import check_iso_flops, read_budgets
    actual = read_budgets([out / "runs" / n for n, _, _ in runs])
    check_iso_flops(actual)
    for n in actual:
        if actual[n] != budgets[n]:
            raise InductionLabError(f"run {n} was trained with budget {actual[n]} but the study planned {budgets[n]}; "
                                    "use a new --out")
    pieces = {n: run.json(f"train/{n}", lambda n=n: run_piece(out / "runs" / n)) for n, _, _ in runs}
    evals: dict[str, dict] = {}
    if cfg.evaluate:
        for n, _, s in runs:
            def compute(n=n, s=s):
                if progress:
                    log(f"evaluate {n}")
                return evaluate_checkpoint(final_checkpoint(out / "runs" / n), cfg.shards, cfg.eval_config(),
                                           out / "evaluate" / cfg.eval_key() / n, seed=s)
            evals[n] = run.piece(f"{cfg.eval_key()}/{n}", compute, timing="evaluate")
    threshold = float(cfg.train_config("none", 0, "x").induction_threshold)
    table = runs_table(pieces, evals)
    vs = verdicts(table, threshold)
    b0 = next(iter(budgets.values()))
    from ...train.telemetry import predicted_emergence
    record = {"kind": "study-bi-induct", "params": params, "preset": dataclasses.asdict(cfg.recipe),
              "matched_compute": {"checked": True, "keys": ["n_params", "seq_len", "global_batch",
                                                             "tokens_per_update", "steps", "tokens", "flops"],
                                  "budget": b0, "budgets": actual},
              "predicted_emergence": predicted_emergence(b0["global_batch"], b0["seq_len"]),
              "rules": RULES, "thresholds": {"MIN_SEEDS_FOR_CI": MIN_SEEDS_FOR_CI, "INDUCTION_EFFECT": INDUCTION_EFFECT,
                                             "ANTI_NEAR_ZERO": ANTI_NEAR_ZERO, "PROBE_FLOOR": PROBE_FLOOR,
                                             "PROBE_MARGIN": PROBE_MARGIN, "ICL_FLOOR": ICL_FLOOR,
                                             "RELATIVE_FLOOR": RELATIVE_FLOOR, "D_MEASURE": D_MEASURE,
                                             "C_MEASURE": C_MEASURE,
                                             "induction_threshold": threshold},
              "runs": table.to_dict(orient="records"), "variants_table": variants_table(table),
              "verdicts": [v.to_dict() for v in vs],
              "evaluations": evals,
              "train_wall_s_this_call": walls,
              "train_time_s_total": float(sum(p["train_time_s"] or 0 for p in pieces.values())),
              "timings": run.timings, "versions": versions(), "resumed": run.resumed, "missing_runs": missing}
    study = BiInductStudy(out, cfg, table, vs, record, run.timings)
    from ..report import write_bi_induct_outputs
    run.finish(record, lambda: write_bi_induct_outputs(out, study, pieces))
    return study


def gpu_estimate(cfg: BiInductStudyConfig, flops_per_s: float = 400e12, mfu: float = 0.4) -> dict:
    """Expected GPU hours of the study from the FLOPs helper: per run FLOPs / (peak · MFU).
    Defaults: an H100/H200 at ~400 TFLOP/s dense bf16 (decision, rounded), 40% MFU (decision)."""
    b = next(iter(plan_budgets(cfg).values()))
    hours = b["flops"] / (flops_per_s * mfu) / 3600
    return {"flops_per_run": b["flops"], "tokens_per_run": b["tokens"], "runs": len(cfg.runs()),
            "gpu_hours_per_run": hours, "gpu_hours_total": hours * len(cfg.runs()),
            "assumed_flops_per_s": flops_per_s, "assumed_mfu": mfu}


__all__ = ["VARIANTS", "STUDY_PRESETS", "StudyPreset", "BiInductStudyConfig", "BiInductStudy", "RULES", "CLAIMS",
           "run_bi_induct_study", "plan_budgets", "evaluate_checkpoint", "evaluation_config", "verdicts", "runs_table", "gpu_estimate",
           "train_command"]
