"""The evaluation study's parameters: :class:`EvaluateConfig` and the nested config of each protocol
(:class:`ProbeConfig`, :class:`ICLScoreConfig`, :class:`InductionLossConfig`, :class:`RecallConfig`,
:class:`PerplexityConfig`, :class:`LoadBearingConfig`, :class:`LmEvalConfig`), each with its
``validate()`` (no model needed), and :func:`parse_variant` (the ablation variant names).

Imports the checks, the probe task names and the runner's method check; nothing of the study.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ...checks import check_draws, check_fields, check_seed, check_type
from ...errors import InductionLabError
from ...protocols.icl_tasks import TASK_NAMES
from ...protocols.runner import check_method
from ..pieces import check_trials_fit

TOKEN_POOLS = ("vocab", "shards")
_VARIANT = re.compile(r"^(?:per-layer-(?P<pct>\d+(?:\.\d+)?)pct|top-(?P<k>\d+))$")


@dataclass
class ProbeConfig:
    """Function-style ICL probes (:mod:`inductionlab.protocols.icl_tasks`): which tasks, shots and prompts."""
    tasks: tuple[str, ...] | None = None      # None: all of icl_tasks.TASK_NAMES
    shots: tuple[int, ...] = (0, 1, 10)
    n_prompts: int = 32                       # prompts per task and number of shots
    permutation_control: bool = True          # label-permuted twin of every prompt with k >= 2 shots
    bos: bool = True                          # prepend the tokenizer's BOS (when it has one)
    batch_size: int = 16

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
    late: int = 500
    early: int = 50
    window: int = 1                           # tokens averaged at each position (1 = Olsson et al.)
    n_sequences: int = 16                     # held-out windows
    batch_size: int = 2

    def validate(self) -> None:
        check_fields(self, "icl-")
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
    seq_len: int = 50
    n_sequences: int = 16
    batch_size: int = 16

    def validate(self) -> None:
        check_fields(self, "induction-")
        if self.seq_len < 2 or self.n_sequences < 2 or self.batch_size < 1:
            raise InductionLabError(f"induction loss: seq_len {self.seq_len} >= 2, sequences {self.n_sequences} >= 2, "
                                    f"batch size {self.batch_size} >= 1")
        check_trials_fit(self.n_sequences, 2 * self.seq_len + 1, "--induction-seq-len", self.seq_len)


@dataclass
class RecallConfig:
    """Associative recall in the model's own tokens (:func:`inductionlab.protocols.icl_score.associative_recall`):
    ``n_pairs`` random key-value pairs, then the same pairs shuffled; top-1 accuracy of each value."""
    n_pairs: int = 8
    n_sequences: int = 32
    batch_size: int = 16

    def validate(self) -> None:
        check_fields(self, "recall-")
        if self.n_pairs < 2 or self.n_sequences < 2 or self.batch_size < 1:
            raise InductionLabError(f"associative recall: pairs {self.n_pairs} >= 2, sequences {self.n_sequences} "
                                    f">= 2, batch size {self.batch_size} >= 1")
        check_trials_fit(self.n_sequences, 4 * self.n_pairs + 1, "--recall-pairs", self.n_pairs)


@dataclass
class PerplexityConfig:
    """Perplexity guard on the shards' held-out split (only with shards)."""
    max_tokens: int | None = 32768            # None: the whole split
    context: int | None = None                # None: min(model context, 1024)
    batch_size: int = 4

    def validate(self) -> None:
        check_fields(self, "perplexity-")
        if (self.max_tokens is not None and self.max_tokens < 2) or (self.context is not None and self.context < 2) \
                or self.batch_size < 1:
            raise InductionLabError(f"perplexity: max_tokens {self.max_tokens} and context {self.context} must be "
                                    f">= 2, batch size {self.batch_size} >= 1")


@dataclass
class LoadBearingConfig:
    """Ablation variants (``per-layer-<p>pct`` | ``top-<k>``), random draws, method, probe shots."""
    ablate: tuple[str, ...] = ("per-layer-2pct", "top-10")
    n_draws: int = 3
    method: str = "zero"
    shots: int = 10                           # probes under ablation at this number of shots

    def validate(self) -> None:
        check_fields(self)
        check_method(self.method)
        for v in self.ablate:
            parse_variant(v)
        if len(set(self.ablate)) != len(self.ablate):
            raise InductionLabError(f"--ablate {','.join(self.ablate)} repeats a variant; give each once")
        check_draws(self.n_draws, "--draws")


@dataclass
class LmEvalConfig:
    """lm-evaluation-harness tasks (ours: ``inductionlab_icl`` / ``inductionlab_icl_<task>``, or installed names)."""
    tasks: tuple[str, ...] = ()
    num_fewshot: int | None = None            # None: each task's default (ours: 0)
    limit: int | None = 50                    # test documents per task
    batch_size: int = 8

    def validate(self) -> None:
        check_fields(self, "lm-eval-")
        if (self.num_fewshot is not None and self.num_fewshot < 0) or (self.limit is not None and self.limit < 1) \
                or self.batch_size < 1:
            raise InductionLabError(f"lm-eval: few-shot {self.num_fewshot} >= 0, limit {self.limit} >= 1, batch size "
                                    f"{self.batch_size} >= 1")


@dataclass
class EvaluateConfig:
    """Parameters of the evaluation study; each protocol's config nested as it is. ``seed`` seeds
    prompts, held-out windows, random sequences and random head draws.

    ``token_pool``: where the random tokens of head scores, induction loss, associative recall
    and the mean-ablation reference come from: ``"vocab"`` (every ordinary id of the tokenizer,
    as TransformerLens does) or ``"shards"`` (the ids that occur in the shards' training split,
    :meth:`~inductionlab.data.shards.TokenShards.token_pool`: for a model trained on that corpus,
    whose other ids have untrained embeddings)."""
    probes: ProbeConfig = field(default_factory=ProbeConfig)
    icl: ICLScoreConfig = field(default_factory=ICLScoreConfig)
    induction: InductionLossConfig = field(default_factory=InductionLossConfig)
    recall: RecallConfig = field(default_factory=RecallConfig)
    perplexity: PerplexityConfig = field(default_factory=PerplexityConfig)
    load_bearing: LoadBearingConfig = field(default_factory=LoadBearingConfig)
    lm_eval: LmEvalConfig = field(default_factory=LmEvalConfig)
    seed: int = 0
    score_seq_len: int = 50
    score_batch_size: int = 16
    token_pool: str = "vocab"

    def validate(self) -> None:
        """Check every option that needs no model (the CLI and the API call it before loading).

        Raises:
            InductionLabError: unknown task, shots < 0, unknown ablation variant or method, draws < 1,
                ablation shots not among the probe shots, sizes below their minimum, a seed outside
                0 .. 2**63 - 1, a NaN / infinite / beyond-64-bit number.
            TypeError: a field of the wrong type (a nested config that is not its dataclass)."""
        check_fields(self)
        check_seed(self.seed, "--seed")
        for name, kind in (("probes", ProbeConfig), ("icl", ICLScoreConfig), ("induction", InductionLossConfig),
                           ("recall", RecallConfig), ("perplexity", PerplexityConfig),
                           ("load_bearing", LoadBearingConfig), ("lm_eval", LmEvalConfig)):
            check_type(getattr(self, name), kind, f"EvaluateConfig.{name}")
        for c in (self.probes, self.icl, self.induction, self.recall, self.perplexity, self.load_bearing,
                  self.lm_eval):
            c.validate()
        if self.token_pool not in TOKEN_POOLS:
            raise InductionLabError(f"token pool {self.token_pool!r}: use one of {', '.join(TOKEN_POOLS)}")
        if self.load_bearing.ablate and self.load_bearing.shots not in self.probes.shots:
            raise InductionLabError(f"ablation shots {self.load_bearing.shots} is not among --shots "
                                    f"{','.join(map(str, self.probes.shots))}; add it")
        if self.score_seq_len < 2 or self.score_batch_size < 1:
            raise InductionLabError(f"head scores need score_seq_len >= 2 and score_batch_size >= 1 "
                                    f"(got {self.score_seq_len}, {self.score_batch_size})")
        check_trials_fit(self.score_batch_size, 2 * self.score_seq_len + 1, "--score-batch-size")


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


__all__ = ["EvaluateConfig", "ProbeConfig", "ICLScoreConfig", "InductionLossConfig", "RecallConfig",
           "PerplexityConfig", "LoadBearingConfig", "LmEvalConfig", "TOKEN_POOLS", "parse_variant"]
