"""The temporal-dependencies study's config (``inductionlab study temporal``): :class:`TemporalStudyConfig`
with its ``validate()``, and :func:`default_ks`, the k list scaled to the model.

Imports the protocol configs (lag probe, serial recall) and the shared option checks
(:mod:`inductionlab.checks`, :mod:`inductionlab.studies.pieces`); no model and no run directory.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ...checks import check_fields, check_type
from ...core.ablation import default_exclude_top_n
from ...errors import InductionLabError
from ...protocols.lag_probe import LagProbeConfig
from ...protocols.runner import check_method
from ...protocols.serial_recall import SerialRecallConfig
from ..pieces import check_lag_headline, check_study_options, check_trials_fit

PAPER_KS = (10, 20, 50, 100)   # SPEC §4: the seed protocol's k list (models of ~1,000 heads)
FALLBACK_FRACTIONS = (0.05, 0.1, 0.2, 0.35)


def default_ks(n_total: int, exclude_top_n: int | None = None) -> list[int]:
    """The k list scaled to the model (decision, SPEC §4 "clipped to what the model has").

    The paper's k ∈ {10, 20, 50, 100} are kept while k ≤ 75% of the heads left for random draws
    (``n_total − N``, so random draws still differ); if fewer than three survive, k is instead
    5%, 10%, 20%, 35% of all heads (rounded, ≥ 1, same cap). SmolLM2 (270 heads, N = 135):
    10, 20, 50, 100. Gemma 3 270M (72 heads, N = 36): 4, 7, 14, 25 → capped at 27.
    """
    N = default_exclude_top_n(n_total) if exclude_top_n is None else exclude_top_n
    cap = max(1, int(0.75 * (n_total - N)))
    ks = [k for k in PAPER_KS if k <= cap]
    if len(ks) < 3:
        ks = sorted({min(cap, max(1, round(f * n_total))) for f in FALLBACK_FRACTIONS})
    return ks


@dataclass
class TemporalStudyConfig:
    """Parameters of the study. Protocol defaults are the papers' (SPEC §4–§5); sizes are CPU
    defaults (the seed protocol used 5,000 permutations; see README for GPU settings).

    ``seed`` and ``method`` are the study's: they replace the nested configs' own ``seed`` and
    ``method``, so every protocol sees the same ones. A protocol's ``batch_size`` of None is
    chosen from free GPU memory (CPU: 8)."""
    method: str = "zero"                    # ablation: zero (paper: attention scores −∞) | mean | sink
    ks: list[int] | None = None             # None: default_ks(n_heads_total)
    n_draws: int = 3                        # random-head draws per k
    exclude_top_n: int | None = None        # None: min(300, n_heads_total // 2) (SPEC §4)
    seed: int = 0
    lag: LagProbeConfig = field(default_factory=lambda: LagProbeConfig(n_permutations=64, cues="all:10"))  # seed: 5,000
    recall: SerialRecallConfig = field(default_factory=SerialRecallConfig)
    # per-head load-bearing map
    load_bearing_top: int = 10              # 0 disables
    load_bearing_permutations: int | None = None   # None: lag.n_permutations (first trials of the probe)
    # head scores (SPEC §3)
    score_seq_len: int = 50
    score_batch_size: int = 16

    def protocols(self) -> tuple[LagProbeConfig, SerialRecallConfig]:
        """The nested configs with the study's seed and method."""
        return (replace(self.lag, seed=self.seed, method=self.method),
                replace(self.recall, seed=self.seed, method=self.method))

    @property
    def load_bearing_n(self) -> int:
        return self.load_bearing_permutations or self.lag.n_permutations

    def validate(self) -> None:
        """Check every option that needs no model (the CLI and the API call it before loading).

        Raises:
            InductionLabError: unknown method, k < 1, negative draws or sizes, a protocol's own
                checks, more load-bearing trials than lag-probe trials, --load-bearing-permutations
                with the map off (--load-bearing-top 0), a NaN / infinite / beyond-64-bit number.
            TypeError: a field of the wrong type (``lag`` / ``recall`` not their configs).
        """
        check_fields(self)
        check_type(self.lag, LagProbeConfig, "TemporalStudyConfig.lag")
        check_type(self.recall, SerialRecallConfig, "TemporalStudyConfig.recall")
        check_method(self.method)
        check_study_options(ks=self.ks, n_draws=self.n_draws, exclude_top_n=self.exclude_top_n, seed=self.seed,
                            score_seq_len=self.score_seq_len, score_batch_size=self.score_batch_size)
        if self.load_bearing_top < 0:
            raise InductionLabError(f"--load-bearing-top {self.load_bearing_top} must be >= 0 (0 = no per-head map)")
        for c in self.protocols():
            c.validate()
        check_lag_headline(self.lag)
        check_trials_fit(self.lag.n_permutations, self.lag.list_length + 4, "--n-permutations")
        r = self.recall
        check_trials_fit(r.n_trials, (r.n_shots + 1) * (2 * r.list_length + 4), "--recall-trials")
        if self.load_bearing_permutations is not None and self.load_bearing_permutations < 2:
            raise InductionLabError(f"--load-bearing-permutations {self.load_bearing_permutations}: at least 2 "
                                    "trials are needed for a CI")
        if self.load_bearing_permutations is not None and self.load_bearing_top == 0:
            raise InductionLabError(f"--load-bearing-permutations {self.load_bearing_permutations} has no effect with "
                                    "--load-bearing-top 0 (no per-head map); drop one of them")
        if self.load_bearing_n > self.lag.n_permutations:
            raise InductionLabError(f"--load-bearing-permutations {self.load_bearing_n} exceeds --n-permutations "
                                    f"{self.lag.n_permutations}; the per-head map reuses the first trials of the lag "
                                    "probe: lower it or raise --n-permutations")
