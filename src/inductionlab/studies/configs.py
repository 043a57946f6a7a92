"""What several studies' configs share, written once: the nested configs of head scores
(:class:`HeadScoreConfig`, SPEC §3) and of ablation conditions (:class:`AblationConfig`, SPEC §4), and
the checks that read a protocol's config or the model. Messages name the CLI flag (the config field
is the same name with underscores), so the same mistake gives the same line from every command and
from the API. No torch here: the configs' ``validate()`` runs before a model loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..checks import ABLATION_POSITIONS, check_ablation_positions, check_draws, check_fields, check_method
from ..config import opt
from ..errors import InductionLabError
from ..names import DEFAULT_METHOD, ablation_method_names


PAPER_KS = (10, 20, 50, 100)   # SPEC §4: the seed protocol's k list (models of ~1,000 heads)
FALLBACK_FRACTIONS = (0.05, 0.1, 0.2, 0.35)


def default_ks(n_total: int, exclude_top_n: int | None = None) -> list[int]:
    """The k list scaled to the model (decision, SPEC §4 "clipped to what the model has").

    The paper's k ∈ {10, 20, 50, 100} are kept while k ≤ 75% of the heads left for random draws
    (``n_total − N``, so random draws still differ); if fewer than three survive, k is instead
    5%, 10%, 20%, 35% of all heads (rounded, ≥ 1, same cap). SmolLM2 (270 heads, N = 135):
    10, 20, 50, 100. Gemma 3 270M (72 heads, N = 36): 4, 7, 14, 25 → capped at 27.
    """
    from ..core.ablation import default_exclude_top_n   # here: this module loads no torch

    N = default_exclude_top_n(n_total) if exclude_top_n is None else exclude_top_n
    cap = max(1, int(0.75 * (n_total - N)))
    ks = [k for k in PAPER_KS if k <= cap]
    if len(ks) < 3:
        ks = sorted({min(cap, max(1, round(f * n_total))) for f in FALLBACK_FRACTIONS})
    return ks


@dataclass
class HeadScoreConfig:
    """Head scores on ``[BOS] S S`` of random ordinary tokens (SPEC §3)."""
    seq_len: int = opt(50, "T, tokens per copy for head scores.", source="SPEC §3", flag="--score-seq-len")
    batch_size: int = opt(16, "Sequences for head scores.", source="SPEC §3", flag="--score-batch-size")
    n_batches: int = opt(1, "Batches of head-score sequences.", cli=False)

    def validate(self) -> None:
        """Raises InductionLabError: a sequence shorter than 2 tokens per copy, an empty batch, more
        sequences than a quarter of memory holds."""
        check_fields(self)
        if self.seq_len < 2:
            raise InductionLabError(f"--score-seq-len {self.seq_len}: a head-score sequence needs at least 2 tokens "
                                    "per copy; use e.g. 50")
        if self.batch_size < 1:
            raise InductionLabError(f"--score-batch-size {self.batch_size} must be >= 1")
        if self.n_batches < 1:
            raise InductionLabError(f"score n_batches={self.n_batches} must be >= 1")
        check_trials_fit(self.batch_size, 2 * self.seq_len + 1, "--score-batch-size")


@dataclass
class AblationConfig:
    """The ablation conditions of SPEC §4: the top-k induction heads vs k random heads outside the top N
    (several seeded draws), for each k, with one method."""
    method: str = opt(DEFAULT_METHOD, "Ablation method (zero: the paper's attention scores set to −∞; resample: "
                                      "the head's output on random tokens).", choices=ablation_method_names())
    positions: str = opt("all", "Where an output-edit ablation applies: every position, or the last of each forward "
                                "(Yin & Steinhardt 2025).", choices=ABLATION_POSITIONS)
    ks: tuple[int, ...] | None = opt(None, "Numbers of heads to ablate, comma-separated.",
                                     none="10,20,50,100 clipped or scaled to the model's heads")
    n_draws: int = opt(3, "Random-head draws per k.")
    exclude_top_n: int | None = opt(None, "Random heads come from outside the top N by induction score.",
                                    none="min(300, heads/2)", source="SPEC §4", aliases=("--exclude-top",))

    def validate(self) -> None:
        """Raises InductionLabError: unknown method, a k below 1 or repeated, draws outside 1 ..
        :data:`~inductionlab.checks.MAX_DRAWS`, a negative exclusion."""
        check_fields(self)
        check_method(self.method)
        check_ablation_positions(self.positions)
        ks = self.ks
        if ks is not None:
            if not ks or min(ks) < 1:
                raise InductionLabError(f"--ks {','.join(map(str, ks)) or '(empty)'}: give at least one k, each >= 1 "
                                        "(e.g. --ks 5,10,20)")
            if len(set(ks)) != len(ks):
                raise InductionLabError(f"--ks {','.join(map(str, ks))} repeats a k; give each k once")
        check_draws(self.n_draws, "--n-draws")
        if self.exclude_top_n is not None and self.exclude_top_n < 0:
            raise InductionLabError(f"--exclude-top-n {self.exclude_top_n} must be >= 0 (or left unset for the default)")


def check_lag_headline(lag) -> None:
    """A study's headline reads lag +1 and lag −1 of the lag probe: the cue needs a word on both
    sides (cue at the first word: lag −1 would index the list's last word; at the last: no lag +1).

    Raises:
        InductionLabError: ``cue_position`` outside 2 .. list_length − 1."""
    if lag.list_length >= 2 and 1 <= lag.cue_position <= lag.list_length and \
            not 2 <= lag.cue_position <= lag.list_length - 1:
        raise InductionLabError(f"--cue-position {lag.cue_position}: the headline reads lags -1 and +1, so the cue "
                                f"needs a word before and after it; use 2 <= --cue-position <= {lag.list_length - 1} "
                                f"(--list-length {lag.list_length})")


def check_trials_fit(n_trials: int, tokens_per_trial: int, option: str, value: int | None = None) -> None:
    """A protocol's trials (token ids and list ids, int64) must fit in a quarter of memory
    (``value``: the option's own value when ``n_trials`` is a product of it).

    Raises:
        InductionLabError: ``n_trials`` x ``tokens_per_trial`` too large, naming ``option``."""
    from ..runtime.runs import physical_memory

    need, mem = 16 * int(n_trials) * int(tokens_per_trial), physical_memory()
    if mem and need > mem // 4:
        raise InductionLabError(f"{option} {n_trials if value is None else value:,}: {n_trials:,} trials of ~{tokens_per_trial} tokens need "
                                f"{need / 2**30:.1f} GiB, more than a quarter of this machine's {mem / 2**30:.0f} GiB; "
                                f"lower {option}")


def check_trial_ids(trials, loaded, what: str) -> None:
    """The token ids of a protocol's trials are rows of the model's embedding (a tokenizer that is
    not the model's own gives ids past the vocabulary: an index error deep in the forward pass).

    Raises:
        InductionLabError: an id >= the model's vocabulary size."""
    vocab = loaded.identity.get("vocab_size")
    top = int(trials.tensors["ids"].max()) if trials.tensors["ids"].numel() else -1
    if vocab and top >= vocab:
        raise InductionLabError(f"the {what} uses token id {top} but the model's vocabulary has {vocab} ids: the "
                                "tokenizer is not the model's own; load the model with its tokenizer")


def check_ks(ks: Sequence[int], n_total: int, exclude_top_n: int) -> None:
    """Every k must leave room for random draws outside the top N.

    Raises:
        InductionLabError: a k below 1 or above ``n_total − exclude_top_n``."""
    for k in ks:
        if not 1 <= k <= n_total - exclude_top_n:
            raise InductionLabError(f"k={k}: must be between 1 and the {n_total - exclude_top_n} heads left outside "
                                    f"the top {exclude_top_n} (--exclude-top-n) of {n_total} for random draws; "
                                    "lower k or --exclude-top-n")


__all__ = ["PAPER_KS", "default_ks", "HeadScoreConfig", "AblationConfig", "check_lag_headline", "check_trials_fit", "check_trial_ids",
           "check_ks"]
