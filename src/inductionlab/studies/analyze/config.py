"""``inductionlab analyze``, the main job: its config (:class:`AnalyzeConfig`) and :data:`SPEC`.

Light (no torch): the command line generates ``analyze``'s options from :class:`AnalyzeConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...checks import check_fields, check_seed
from ...config import nested, opt, renamed_keywords, validate_tree

OWNED = {"seed": "--seed", "method": "--method", "positions": "--positions"}   # set by the study (:meth:`protocol`)
from ...errors import InductionLabError
from ...protocols.configs import LagProbeConfig
from ..configs import AblationConfig, HeadScoreConfig, check_lag_headline, check_trials_fit
from ..spec import DEPRECATED_UNTIL, StudySpec


@renamed_keywords({"method": ("ablation", "method"), "ks": ("ablation", "ks"), "n_draws": ("ablation", "n_draws"),
                   "exclude_top_n": ("ablation", "exclude_top_n"), "score_seq_len": ("scores", "seq_len"),
                   "score_batch_size": ("scores", "batch_size"), "score_batches": ("scores", "n_batches")},
                  until=DEPRECATED_UNTIL)
@dataclass
class AnalyzeConfig:
    """Parameters of the main job; defaults sized for ≤ 10 minutes of analysis on 2 CPU cores without fast bf16
    (AVX2 only, fp32), with the random − induction contrast of the all-cue temporal factor at z ≥ 20 for every k
    (docs/cost.md#the-main-job).

    ``seed``, ``ablation.method`` and ``ablation.positions`` are the job's: they replace the lag-probe
    config's own. The model,
    dtype and device are not here: they are how ``loaded`` was loaded, recorded in its identity (a
    resume in another resolved dtype is refused)."""
    seed: int = opt(0, "Seed of trials, random draws and head-score sequences.")
    top: int = opt(10, "Induction heads listed in the headline.")
    scores: HeadScoreConfig = nested(HeadScoreConfig, "Head scores (SPEC §3).")
    ablation: AblationConfig = nested(lambda: AblationConfig(ks=(5, 10, 20), n_draws=2),
                                      "Top-k induction vs k random heads (SPEC §4).")
    lag: LagProbeConfig = nested(lambda: LagProbeConfig(n_permutations=11, cues="all"),
                                 "The lag probe (SPEC §4): 11 lists per condition, every position cued (500 cues per "
                                 "list, the evidence of the headline; sized by bench/main_job_sizing.py); the seed "
                                 "protocol is --cues seed --n-permutations 5000.", owns=OWNED)

    def protocol(self) -> LagProbeConfig:
        """The lag-probe config with the job's seed and method."""
        from dataclasses import replace

        return replace(self.lag, seed=self.seed, method=self.ablation.method, positions=self.ablation.positions)

    def validate(self) -> None:
        """Check every option that needs no model (the CLI and the API call it before loading).

        Raises:
            InductionLabError: k < 1 or repeated, draws out of range, sizes below their minimum, bad method,
                the lag probe's own checks, a NaN / infinite / beyond-64-bit number.
            TypeError: a field of the wrong type (a nested config that is not its dataclass).
        """
        check_fields(self)
        check_seed(self.seed, "--seed")
        if self.top < 1:
            raise InductionLabError(f"--top {self.top} must be >= 1")
        validate_tree(self, lambda: {"lag": self.protocol()})
        check_lag_headline(self.lag)
        check_trials_fit(self.lag.n_permutations, self.lag.trial_tokens, "--n-permutations")


SPEC = StudySpec(
    "analyze", AnalyzeConfig,
    help="The main job: score every head, list the top induction heads, and run the lag probe intact and with "
         "k induction heads vs k random heads ablated. Writes one run directory (resumable: the same command "
         "continues an interrupted run). Under torchrun the trials are sharded over the processes. "
         "Guide: docs/analyze.md.")
