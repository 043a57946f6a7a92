"""``inductionlab study temporal``: its config (:class:`TemporalStudyConfig`) and :data:`SPEC`.

Light (no torch): the command line generates the command's options from :class:`TemporalStudyConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...checks import check_fields, check_seed
from ...config import nested, opt, validate_tree

OWNED = {"seed": "--seed", "method": "--method", "positions": "--positions"}   # set by the study (:meth:`protocols`)
from ...errors import InductionLabError
from ...protocols.configs import LagProbeConfig, SerialRecallConfig
from ..configs import AblationConfig, HeadScoreConfig, check_lag_headline, check_trials_fit, default_ks  # noqa: F401
from ..spec import StudySpec


@dataclass
class TemporalStudyConfig:
    """Parameters of the study. Protocol defaults are the papers' (SPEC §4–§5); sizes are CPU defaults
    (the seed protocol used 5,000 permutations: ``lag.n_permutations``).

    ``seed`` and ``ablation.method`` are the study's: they replace the nested protocols' own, so every
    protocol sees the same ones. A protocol's ``batch_size`` of None is chosen by its probe (from free GPU
    memory; CPU: 8)."""
    seed: int = opt(0, "Seed of trials, random draws and head-score sequences.")
    scores: HeadScoreConfig = nested(HeadScoreConfig, "Head scores (SPEC §3).")
    ablation: AblationConfig = nested(AblationConfig, "Top-k induction vs k random heads (SPEC §4).")
    lag: LagProbeConfig = nested(lambda: LagProbeConfig(n_permutations=64, cues="all:10"), "The lag probe (SPEC §4).",
                                 owns=OWNED)
    recall: SerialRecallConfig = nested(SerialRecallConfig, "Few-shot serial recall (SPEC §5).", owns=OWNED)
    load_bearing_top: int = opt(10, "Per-head map over the top N induction heads (0 = off).")
    load_bearing_permutations: int | None = opt(None, "Trials per single-head condition.", none="--n-permutations")

    def protocols(self) -> tuple[LagProbeConfig, SerialRecallConfig]:
        """The nested configs with the study's seed and method."""
        m, p = self.ablation.method, self.ablation.positions
        return (replace(self.lag, seed=self.seed, method=m, positions=p),
                replace(self.recall, seed=self.seed, method=m, positions=p))

    @property
    def load_bearing_n(self) -> int:
        return self.load_bearing_permutations or self.lag.n_permutations

    def validate(self) -> None:
        """Check every option that needs no model (the CLI and the API call it before loading).

        Raises:
            InductionLabError: unknown method, k < 1, draws or sizes out of range, a protocol's own
                checks, more load-bearing trials than lag-probe trials, --load-bearing-permutations
                with the map off (--load-bearing-top 0), a NaN / infinite / beyond-64-bit number.
            TypeError: a field of the wrong type (a nested config that is not its dataclass).
        """
        check_fields(self)
        check_seed(self.seed, "--seed")
        if self.load_bearing_top < 0:
            raise InductionLabError(f"--load-bearing-top {self.load_bearing_top} must be >= 0 (0 = no per-head map)")
        validate_tree(self, lambda: dict(zip(("lag", "recall"), self.protocols())))
        check_lag_headline(self.lag)
        check_trials_fit(self.lag.n_permutations, self.lag.trial_tokens, "--n-permutations")
        check_trials_fit(self.recall.n_trials, self.recall.trial_tokens, "--recall-trials")
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


SPEC = StudySpec(
    "study temporal", TemporalStudyConfig,
    help="Lag probe + few-shot serial recall, intact and under top-k induction vs k random head ablation, "
         "per-head load-bearing map, and a report stating each claim of the temporal-dependencies paper. "
         "An existing study with the same options in --out is resumed. Guide: docs/study-temporal.md.",
    out="runs/{kind}-{model}-{time}")
