"""``inductionlab evaluate``: its config (:class:`EvaluateConfig` and the nested config of each measure:
:class:`ProbeConfig`, :class:`ICLScoreConfig`, :class:`InductionLossConfig`, :class:`RecallConfig`,
:class:`PerplexityConfig`, :class:`LoadBearingConfig`, :class:`LmEvalConfig`), :func:`parse_variant` (the
ablation variant names) and :data:`SPEC`.

Light (no torch): the command line generates ``evaluate``'s options from :class:`EvaluateConfig`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ...checks import (ABLATION_POSITIONS, TOKEN_BYTES, check_ablation_positions, check_draws, check_fields,
                       check_method,
                       check_seed)
from ...config import nested, opt, validate_tree
from ...errors import InductionLabError
from ...names import ABLATION_METHOD_NEEDS, DEFAULT_METHOD, TASK_NAMES, ablation_method_names
from ..configs import HeadScoreConfig, RankingConfig, check_trials_fit
from ..spec import StudySpec

TOKEN_POOLS = ("vocab", "shards")
_VARIANT = re.compile(r"^(?:per-layer-(?P<pct>\d+(?:\.\d+)?)pct|top-(?P<k>\d+))$")


@dataclass
class ProbeConfig:
    """Function-style ICL probes (:mod:`inductionlab.protocols.icl_tasks`): which tasks, shots and prompts."""
    tasks: tuple[str, ...] | None = opt(None, "ICL probe tasks, comma-separated.", none="all 13")
    shots: tuple[int, ...] = opt((0, 1, 10), "Numbers of demonstrations, comma-separated.", source="SPEC §8")
    n_prompts: int = opt(32, "Prompts per task and number of shots.", flag="--prompts")
    permutation_control: bool = opt(True, "Skip the label-permuted prompts (the flag sets permutation_control false).",
                                    flag="--no-permutation-control")
    bos: bool = opt(True, "Prepend the tokenizer's BOS (when it has one).", cli=False)
    batch_size: int = opt(16, "Prompts per forward pass.", size=lambda c: TOKEN_BYTES * (4 * (max(c.shots) + 1) + 2))

    def validate(self) -> None:
        """Raises InductionLabError: unknown task, no shots or shots < 0 or repeated, sizes < 1, more
        prompts than memory holds; TypeError: a field of the wrong type."""
        check_fields(self)
        if self.tasks is not None:
            bad = [t for t in self.tasks if t not in TASK_NAMES]
            if bad or not self.tasks:
                raise InductionLabError(f"unknown ICL task(s) {', '.join(map(repr, bad)) or '(none given)'}; use "
                                        f"some of: {', '.join(TASK_NAMES)}")
        if not self.shots or min(self.shots) < 0 or len(set(self.shots)) != len(self.shots):
            raise InductionLabError(f"shots {list(self.shots)}: give distinct numbers of demonstrations >= 0, "
                                    "e.g. 0,1,10")
        if self.n_prompts < 2 or self.batch_size < 1:
            raise InductionLabError(f"prompts per task {self.n_prompts} must be >= 2 (a CI needs two) and batch size "
                                    f"{self.batch_size} >= 1")
        n_tasks = len(self.tasks) if self.tasks is not None else len(TASK_NAMES)
        check_trials_fit(self.n_prompts * n_tasks * len(self.shots) * (2 if self.permutation_control else 1),
                         4 * (max(self.shots) + 1) + 2, "--prompts", self.n_prompts)


@dataclass
class ICLScoreConfig:
    """ICL score (Olsson et al. 2022): loss at token ``late`` minus at token ``early`` of natural text
    (scaled to the model's context, :func:`inductionlab.protocols.icl_score.icl_positions`)."""
    late: int = opt(500, "Late token.", source="Olsson et al. 2022", flag="--icl-late")
    early: int = opt(50, "Early token.", source="Olsson et al. 2022", flag="--icl-early")
    window: int = opt(1, "Tokens averaged at each position (more = less noise per window).",
                      source="Olsson et al. 2022", flag="--icl-window")
    n_sequences: int = opt(16, "Held-out windows for the ICL score.", flag="--icl-sequences")
    batch_size: int = opt(2, "Windows per forward pass.", cli=False,
                          size=lambda c: TOKEN_BYTES * min(c.late + 1, 1 << 17))

    def validate(self) -> None:
        check_fields(self)
        if not 1 <= self.early < self.late:
            raise InductionLabError(f"ICL score positions need 1 <= early < late, got {self.early}, {self.late}")
        if self.window < 1 or self.n_sequences < 2 or self.batch_size < 1:
            raise InductionLabError(f"ICL score: window {self.window} >= 1, sequences {self.n_sequences} >= 2, "
                                    f"batch size {self.batch_size} >= 1")
        # windows are late + 1 tokens, capped at the model's context (a later late is scaled down to it)
        check_trials_fit(self.n_sequences, min(self.late + 1, 1 << 17), "--icl-sequences")


@dataclass
class InductionLossConfig:
    """Induction loss on ``[BOS] S S`` (SPEC §3), first vs second copy."""
    seq_len: int = opt(50, "T of the induction-loss sequences [BOS] S S.", flag="--induction-seq-len",
                       size=lambda c: TOKEN_BYTES * 2 * c.n_sequences)
    n_sequences: int = opt(16, "Induction-loss sequences.", cli=False, size=lambda c: TOKEN_BYTES * (2 * c.seq_len + 1))
    batch_size: int = opt(16, "Sequences per forward pass.", cli=False,
                          size=lambda c: TOKEN_BYTES * (2 * c.seq_len + 1))

    def validate(self) -> None:
        check_fields(self)
        if self.seq_len < 2 or self.n_sequences < 2 or self.batch_size < 1:
            raise InductionLabError(f"induction loss: seq_len {self.seq_len} >= 2, sequences {self.n_sequences} >= 2, "
                                    f"batch size {self.batch_size} >= 1")
        check_trials_fit(self.n_sequences, 2 * self.seq_len + 1, "--induction-seq-len", self.seq_len)


@dataclass
class RecallConfig:
    """Associative recall in the model's own tokens (:func:`inductionlab.protocols.icl_score.associative_recall`):
    ``n_pairs`` random key-value pairs, then the same pairs shuffled; top-1 accuracy of each value."""
    n_pairs: int = opt(8, "Key-value pairs per associative-recall sequence (then the same pairs shuffled).",
                       flag="--recall-pairs", size=lambda c: TOKEN_BYTES * 4 * c.n_sequences)
    n_sequences: int = opt(32, "Associative-recall sequences.", cli=False,
                           size=lambda c: TOKEN_BYTES * (4 * c.n_pairs + 1))
    batch_size: int = opt(16, "Sequences per forward pass.", cli=False,
                          size=lambda c: TOKEN_BYTES * (4 * c.n_pairs + 1))

    def validate(self) -> None:
        check_fields(self)
        if self.n_pairs < 2 or self.n_sequences < 2 or self.batch_size < 1:
            raise InductionLabError(f"associative recall: pairs {self.n_pairs} >= 2, sequences {self.n_sequences} "
                                    f">= 2, batch size {self.batch_size} >= 1")
        check_trials_fit(self.n_sequences, 4 * self.n_pairs + 1, "--recall-pairs", self.n_pairs)


@dataclass
class PerplexityConfig:
    """Perplexity guard on the shards' held-out split (only with shards)."""
    max_tokens: int | None = opt(32768, "Held-out tokens for the perplexity guard (0 = the whole split).",
                                 flag="--perplexity-tokens")
    context: int | None = opt(None, "Tokens per window.", none="min(model context, 1024)", cli=False,
                              size=lambda c: TOKEN_BYTES * c.batch_size)
    batch_size: int = opt(4, "Windows per forward pass.", cli=False, size=lambda c: TOKEN_BYTES * (c.context or 1024))

    @property
    def tokens(self) -> int | None:
        """Held-out tokens to score; None: the whole split (``max_tokens`` None or 0)."""
        return self.max_tokens or None

    def validate(self) -> None:
        check_fields(self)
        if (self.max_tokens is not None and self.max_tokens != 0 and self.max_tokens < 2) \
                or (self.context is not None and self.context < 2) or self.batch_size < 1:
            raise InductionLabError(f"perplexity: max_tokens {self.max_tokens} and context {self.context} must be "
                                    f">= 2 (max_tokens 0: the whole split), batch size {self.batch_size} >= 1")


@dataclass
class LoadBearingConfig(RankingConfig):
    """Ablation variants (``per-layer-<p>pct`` | ``top-<k>``), random draws, method, probe shots; the heads
    ranked by ``rank_by`` (default induction), optionally without ``exclude_by``'s top heads
    (:class:`~inductionlab.studies.configs.RankingConfig`). ``random`` applies to the ``top-<k>`` variants;
    a per-layer variant's random heads are always matched per layer outside the chosen ones."""
    ablate: tuple[str, ...] = opt(("per-layer-2pct", "top-10"),
                                  "Ablation variants: per-layer-<p>pct (top p% heads per layer, ceil, >= 1) and/or "
                                  "top-<k>.", source="SPEC §8")
    n_draws: int = opt(3, "Seeded matched random-head draws per variant.", flag="--draws", aliases=("--n-draws",))
    method: str = opt(DEFAULT_METHOD, "Ablation method.", choices=ablation_method_names())
    positions: str = opt("all", "Where an output-edit ablation applies: every position, or the last of each forward "
                                "(Yin & Steinhardt 2025).", choices=ABLATION_POSITIONS)
    shots: int = opt(10, "Probe shots under ablation (must be among --shots).", flag="--ablation-shots")

    def validate(self) -> None:
        check_fields(self)
        check_method(self.method)
        check_ablation_positions(self.positions)
        for v in self.ablate:
            parse_variant(v)
        if len(set(self.ablate)) != len(self.ablate):
            raise InductionLabError(f"--ablate {','.join(self.ablate)} repeats a variant; give each once")
        check_draws(self.n_draws, "--draws")
        self._validate_selection()


@dataclass
class LmEvalConfig:
    """lm-evaluation-harness tasks (ours: ``inductionlab_icl`` / ``inductionlab_icl_<task>``, or installed names)."""
    tasks: tuple[str, ...] = opt((), "lm-eval tasks, comma-separated: inductionlab_icl (our probes, exported "
                                     "offline), inductionlab_icl_<task>, or installed lm-eval task names.",
                                 flag="--lm-eval-tasks")
    num_fewshot: int | None = opt(None, "lm-eval few-shot.", none="each task's (ours: 0)", flag="--lm-eval-fewshot",
                                  size=lambda c: TOKEN_BYTES * 64 * (c.limit or 1),       # a shot of >= 64 tokens
                                  needs="--lm-eval-tasks")
    limit: int | None = opt(50, "lm-eval test documents per task.", flag="--lm-eval-limit", needs="--lm-eval-tasks")
    batch_size: int = opt(8, "lm-eval batch size.", cli=False,
                          size=lambda c: TOKEN_BYTES * 64)                      # a request of >= 64 tokens
    ablated: bool = opt(True, "Run the lm-eval tasks intact only (the flag sets ablated false), not also under every "
                              "ablation condition of the load-bearing test.", flag="--no-lm-eval-ablated",
                        omit_default=True)

    def validate(self) -> None:
        check_fields(self)
        if (self.num_fewshot is not None and self.num_fewshot < 0) or (self.limit is not None and self.limit < 1) \
                or self.batch_size < 1:
            raise InductionLabError(f"lm-eval: few-shot {self.num_fewshot} >= 0, limit {self.limit} >= 1, batch size "
                                    f"{self.batch_size} >= 1")


@dataclass
class EvaluateConfig:
    """Parameters of the evaluation study; each measure's config nested as it is. ``seed`` seeds prompts,
    held-out windows, random sequences and random head draws.

    ``shards``: a prepared corpus (``inductionlab corpus prepare``) tokenised with the model's tokenizer: the
    ICL score's natural text and the perplexity guard (None: both skipped).

    ``token_pool``: where the random tokens of head scores, induction loss, associative recall and the
    mean-ablation reference come from: ``"vocab"`` (every ordinary id of the tokenizer, as TransformerLens
    does) or ``"shards"`` (the ids that occur in the shards' training split,
    :meth:`~inductionlab.data.shards.TokenShards.token_pool`: for a model trained on that corpus, whose other
    ids have untrained embeddings)."""
    shards: str | None = opt(None, "Prepared corpus (inductionlab corpus prepare) tokenised with the model's "
                                   "tokenizer: natural held-out text for the ICL score and the perplexity guard.",
                             none="both skipped", metavar="DIR")
    seed: int = opt(0, "Seed of prompts, held-out windows, random sequences and random head draws.")
    token_pool: str = opt("vocab", "Random probe tokens from the whole vocabulary, or from the ids of --shards' "
                                   "training split (for a model trained on that corpus).", choices=TOKEN_POOLS)
    scores: HeadScoreConfig = nested(HeadScoreConfig, "Head scores (SPEC §3).")
    probes: ProbeConfig = nested(ProbeConfig, "Function-style ICL probes (SPEC §8).")
    icl: ICLScoreConfig = nested(ICLScoreConfig, "ICL score on held-out text (Olsson et al. 2022).")
    induction: InductionLossConfig = nested(InductionLossConfig, "Induction loss (SPEC §3).")
    recall: RecallConfig = nested(RecallConfig, "Associative recall.")
    perplexity: PerplexityConfig = nested(PerplexityConfig, "Perplexity guard (SPEC §8).")
    load_bearing: LoadBearingConfig = nested(LoadBearingConfig, "The load-bearing test (SPEC §8).")
    lm_eval: LmEvalConfig = nested(LmEvalConfig, "lm-evaluation-harness tasks.")

    def validate(self) -> None:
        """Check every option that needs no model (the CLI and the API call it before loading).

        Raises:
            InductionLabError: unknown task, shots < 0, unknown ablation variant or method, draws < 1,
                ablation shots not among the probe shots, sizes below their minimum, a seed outside
                0 .. 2**63 - 1, a NaN / infinite / beyond-64-bit number, ``shards`` that is not a prepared
                corpus, the token pool ``shards`` without shards.
            TypeError: a field of the wrong type (a nested config that is not its dataclass)."""
        check_fields(self)
        check_seed(self.seed, "--seed")
        validate_tree(self)
        if self.token_pool not in TOKEN_POOLS:
            raise InductionLabError(f"token pool {self.token_pool!r}: use one of {', '.join(TOKEN_POOLS)}")
        if self.load_bearing.ablate and self.load_bearing.shots not in self.probes.shots:
            raise InductionLabError(f"ablation shots {self.load_bearing.shots} is not among --shots "
                                    f"{','.join(map(str, self.probes.shots))}; add it")
        lb = self.load_bearing
        if self.lm_eval.tasks and self.lm_eval.ablated and lb.ablate and ABLATION_METHOD_NEEDS.get(lb.method) not in (
                None, "value"):
            raise InductionLabError(f"--method {lb.method} needs a source run per prompt, which lm-eval's requests do not "
                                    "carry; with --lm-eval-tasks use zero, mean or sink, or add --no-lm-eval-ablated")
        if self.token_pool == "shards" and self.shards is None:
            raise InductionLabError("--token-pool shards draws probe tokens from a corpus; add --shards DIR")
        if self.shards is not None and not (Path(self.shards) / "manifest.json").is_file():
            raise InductionLabError(f"--shards {self.shards} is not a prepared corpus (no manifest.json); run: "
                                    "inductionlab corpus prepare SOURCE --tokenizer MODEL --out DIR")


def parse_variant(name: str) -> tuple[str, float | int]:
    """``"per-layer-2pct"`` → ``("per-layer", 0.02)``; ``"top-10"`` → ``("top", 10)``.

    Raises: InductionLabError for anything else, a percentage outside (0, 100] or k < 1."""
    m = _VARIANT.match(name)
    if not m:
        raise InductionLabError(f"unknown ablation variant {name!r}; use per-layer-<p>pct (e.g. per-layer-2pct) "
                                "or top-<k> (e.g. top-10)")
    if m["pct"] is not None:
        p = float(m["pct"]) / 100
        if not 0 < p <= 1:
            raise InductionLabError(f"ablation variant {name!r}: the percentage must be in (0, 100]")
        return "per-layer", p
    if int(m["k"]) < 1:
        raise InductionLabError(f"ablation variant {name!r}: k must be >= 1")
    return "top", int(m["k"])


SPEC = StudySpec(
    "evaluate", EvaluateConfig,
    help="Evaluate MODEL (an embedded name, a model directory, a .gguf file, a checkpoint of our trainer or a "
         "training run directory): function-style ICL probes (HITS@1/@3 at each number of shots, label-permutation "
         "control), ICL score and perplexity on --shards, induction loss, and the load-bearing test — top induction "
         "heads (per layer and global top-k) vs matched random heads. An existing run with the same options in "
         "--out is resumed. Guide: docs/evaluate.md.",
    model="argument", out="runs/{kind}-{model}-{time}", inputs=("shards",))


__all__ = ["EvaluateConfig", "ProbeConfig", "ICLScoreConfig", "InductionLossConfig", "RecallConfig",
           "PerplexityConfig", "LoadBearingConfig", "LmEvalConfig", "TOKEN_POOLS", "parse_variant", "SPEC"]
