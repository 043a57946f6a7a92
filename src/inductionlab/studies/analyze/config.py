"""The main job's config (``inductionlab analyze``): :class:`AnalyzeConfig` and its ``validate()``.

Imports the lag-probe config and the shared option checks (:mod:`inductionlab.checks`,
:mod:`inductionlab.studies.pieces`); no model and no run directory.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ...checks import check_fields, check_type
from ...errors import InductionLabError
from ...protocols.lag_probe import LagProbeConfig
from ...protocols.runner import check_method
from ..pieces import check_lag_headline, check_study_options, check_trials_fit


@dataclass
class AnalyzeConfig:
    """Parameters of the main job. Defaults are sized for ≤ 10 minutes on 2 CPU cores.

    ``seed`` and ``method`` are the job's: they replace the lag-probe config's own. The model,
    dtype and device are not here: they are how ``loaded`` was loaded, recorded in its identity
    (the run's ``params`` hold it less the device and the dtype probe's record: a resume in another
    resolved dtype is refused)."""
    seed: int = 0
    method: str = "zero"             # ablation: zero | mean | sink
    # head scores (SPEC §3)
    score_seq_len: int = 50
    score_batch_size: int = 16
    score_batches: int = 1
    top: int = 10                    # heads listed in the headline
    # ablations (SPEC §4)
    ks: tuple[int, ...] = (5, 10, 20)
    n_draws: int = 2                 # random-head draws per k
    exclude_top_n: int | None = None  # None: min(300, n_heads // 2)
    lag: LagProbeConfig = field(default_factory=lambda: LagProbeConfig(n_permutations=64, cues="all:10"))

    def protocol(self) -> LagProbeConfig:
        """The lag-probe config with the job's seed and method."""
        return replace(self.lag, seed=self.seed, method=self.method)

    def validate(self) -> None:
        """Check every option that needs no model (the CLI and the API call it before loading).

        Raises:
            InductionLabError: k < 1 or repeated, negative draws, sizes below their minimum, bad method,
                the lag probe's own checks, a NaN / infinite / beyond-64-bit number.
            TypeError: a field of the wrong type (the nested ``lag`` not a LagProbeConfig).
        """
        check_fields(self)
        check_type(self.lag, LagProbeConfig, "AnalyzeConfig.lag")
        check_method(self.method)
        check_study_options(ks=self.ks, n_draws=self.n_draws, exclude_top_n=self.exclude_top_n, seed=self.seed,
                            score_seq_len=self.score_seq_len, score_batch_size=self.score_batch_size)
        if self.top < 1:
            raise InductionLabError(f"--top {self.top} must be >= 1")
        if self.score_batches < 1:
            raise InductionLabError(f"score_batches={self.score_batches} must be >= 1")
        self.protocol().validate()
        check_lag_headline(self.lag)
        check_trials_fit(self.lag.n_permutations, self.lag.list_length + 4, "--n-permutations")
