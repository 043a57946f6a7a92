"""``inductionlab study head-types``: its config (:class:`HeadTypesConfig`) and :data:`SPEC`.

Light (no torch): the command line generates the command's options from :class:`HeadTypesConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...checks import TOKEN_BYTES, check_draws, check_fields, check_method, check_seed
from ...config import nested, opt, validate_tree
from ...errors import InductionLabError
from ...protocols.configs import (CMR_RUN_BYTES, PAIR_TOKENS, DualRouteConfig, FVScoreConfig, LagProbeConfig,
                                  TokenLossConfig)
from ...names import RANDOM_CONTROLS, ablation_method_names
from ..configs import HeadScoreConfig, check_lag_headline, check_trials_fit
from ..spec import StudySpec

FV_RANKINGS = ("signed", "absolute")
N_PROBE_TASKS = 15     # the few-shot probes run every FV task (13 function-style, 2 knowledge) at most


@dataclass
class SelectionConfig:
    """Which heads are ablated (Yin & Steinhardt 2025's selection, SPEC §10): for each fraction f of all N heads,
    the top ``max(1, int(f·N))`` by induction score and by FV score, each also after excluding the other ranking's
    top ``max(1, int(exclude_fraction·N))`` (at least one head, so an exclusive arm never equals the plain one),
    against random draws of the same count."""
    fractions: tuple[float, ...] = opt((0.01, 0.02, 0.05, 0.1), "Fractions of all heads ablated, comma-separated "
                                       "(a fraction giving the count of a smaller one is dropped).",
                                       source="Yin & Steinhardt 2025 (1–20%)")
    exclude_fraction: float = opt(0.02, "The other ranking's top fraction removed before an exclusive selection "
                                        "(max(1, int(f x heads)) heads).",
                                  source="Yin & Steinhardt 2025")
    n_draws: int = opt(2, "Random draws per head count.")
    random: str = opt("all", "Random heads from all heads (Yin; may hold top heads) or from outside the top N by "
                             "induction score (the temporal study's control).", choices=RANDOM_CONTROLS,
                      flag="--random-heads")
    fv_ranking: str = opt("signed", "Rank FV heads by AIE (heads that raise the answer first) or by |AIE|.",
                          choices=FV_RANKINGS, source="arXiv 2606.07560: report both; the selection uses one")

    def validate(self) -> None:
        check_fields(self)
        if not self.fractions or any(not 0 < f <= 1 for f in self.fractions) or \
                len(set(self.fractions)) != len(self.fractions):
            raise InductionLabError(f"--fractions {','.join(map(str, self.fractions)) or '(none)'}: give distinct "
                                    "fractions in (0, 1], e.g. 0.01,0.02,0.05,0.1")
        if not 0 < self.exclude_fraction < 1:
            raise InductionLabError(f"--exclude-fraction {self.exclude_fraction} must be in (0, 1) (e.g. 0.02; it "
                                    "excludes max(1, int(f x heads)) heads: 0 would make every exclusive arm the plain "
                                    "one)")
        check_draws(self.n_draws, "--n-draws")


@dataclass
class ProbesConfig:
    """10-shot HITS@1 of the function-style probes under each selection, with the heads' output at the last
    position of each forward set to its mean there over the FV scoring prompts of all tasks (Yin's accuracy
    ablation) and to zero. Prompts are drawn with another seed than the FV scoring prompts."""
    n_prompts: int = opt(20, "10-shot prompts per task under each condition.", flag="--probe-prompts",
                         size=lambda c: TOKEN_BYTES * PAIR_TOKENS * 11 * N_PROBE_TASKS)
    batch_size: int = opt(16, "Prompts per forward pass.", flag="--probe-batch-size",
                          size=lambda c: TOKEN_BYTES * PAIR_TOKENS * 11)
    zero: bool = opt(True, "Skip the zero-ablation run of the probes (the flag sets zero false).",
                     flag="--no-probe-zero")

    def validate(self) -> None:
        check_fields(self)
        if self.n_prompts < 2 or self.batch_size < 1:
            raise InductionLabError(f"--probe-prompts {self.n_prompts} must be >= 2 and --probe-batch-size "
                                    f"{self.batch_size} >= 1")


@dataclass
class CMRConfig:
    """Per-head attention CRP on the head scores' ``[BOS] S S`` sequences and its CMR fit (Ji-An, Zhou, Benna &
    Mattar 2024; SPEC §10): ``cmr_distance`` and ``cmr_like`` (= 1 / (1 + distance), higher = more CMR-like) join
    head_scores.csv, so ``--rank-by cmr_like --scores-file .../head_scores.csv`` ranks by it."""
    enabled: bool = opt(False, "Also compute every head's attention CRP and its CMR fit (cmr_fit.csv, head_crp.csv, "
                               "cmr_fits.png; cmr_distance and cmr_like columns in head_scores.csv).", flag="--cmr")
    n_exps: int = opt(10, "Simulated CMR recall runs per start position and grid cell (the grid is computed once "
                          "and cached in the user cache dir; cost grows with it).",
                      source="Ji-An et al. 2024 used 1,000", flag="--cmr-runs", needs="--cmr",
                      size=lambda c: CMR_RUN_BYTES * c.n_starts)
    n_starts: int = opt(20, "Start positions of the CMR simulation (n_s0).", source="Ji-An et al. 2024", cli=False,
                        needs="--cmr", size=lambda c: CMR_RUN_BYTES * c.n_exps)
    max_lag: int = opt(8, "Lags -m..m of the attention CRP kept (±5 are fitted).", source="Ji-An et al. 2024",
                       flag="--crp-max-lag", needs="--cmr")
    top: int = opt(12, "Heads (lowest CMR distance) in the small-multiples figure.", flag="--cmr-top", needs="--cmr")

    def validate(self) -> None:
        check_fields(self)
        if self.n_exps < 1 or not 1 <= self.n_starts <= 100:
            raise InductionLabError(f"--cmr-runs {self.n_exps} must be >= 1 (and n_starts {self.n_starts} in 1..100)")
        if self.max_lag < 5:
            raise InductionLabError(f"--crp-max-lag {self.max_lag}: the CMR fit compares lags -5..5; give at least 5")
        if self.top < 1:
            raise InductionLabError(f"--cmr-top {self.top} must be >= 1")


@dataclass
class HeadTypesConfig:
    """Parameters of the study (SPEC §10). Defaults size the SmolLM2 run for about 30 min on 2 CPU cores."""
    seed: int = opt(0, "Seed of prompts, trials, random draws and head-score sequences.")
    scores: HeadScoreConfig = nested(HeadScoreConfig, "Attention-pattern head scores (SPEC §3).")
    fv: FVScoreConfig = nested(FVScoreConfig, "FV score (AIE) per head (Todd et al. 2024).", owns={"seed": "--seed"})
    route: DualRouteConfig = nested(DualRouteConfig, "Concept / token induction scores per head (Feucht et al. "
                                                     "2025): columns of head_scores.csv, rankings for ablation.",
                                    owns={"seed": "--seed"})
    selection: SelectionConfig = nested(SelectionConfig, "Exclusive ablation (Yin & Steinhardt 2025).")
    probes: ProbesConfig = nested(ProbesConfig, "Few-shot HITS@1 under ablation.")
    icl: TokenLossConfig = nested(TokenLossConfig, "Token-loss ICL score under ablation (claim Y2): D, B and the "
                                                   "single-token benefit; windows sized by a pilot.")
    icl_conditions: str = opt("claim", "Conditions the token-loss ICL score runs under: 'claim' (intact and Y2's "
                                       "exclusive arms: every window of the budget goes to the verdict) or 'all' (also "
                                       "the plain top-by-score and random arms, for the drop table).",
                              choices=("claim", "all"), source="decision (issue 34: Y2's power at a fixed budget)",
                              flag="--icl-conditions")
    lag: LagProbeConfig = nested(lambda: LagProbeConfig(n_permutations=16, cues="all:10"),
                                 "The lag probe under ablation (seed T's p(+1) and temporal factor).",
                                 owns={"seed": "--seed", "method": "--lag-method"})
    lag_method: str = opt("zero", "Ablation of the heads for the lag probe.", source="seed protocol",
                          choices=ablation_method_names())
    cmr: CMRConfig = nested(CMRConfig, "Attention CRP and CMR fit per head (Ji-An et al. 2024).")
    attribution: bool = opt(True, "Skip the attribution-patching estimate of every head's FV score and the direct "
                                  "logit attribution (the flag sets attribution false).",
                            source="Kramár et al. 2024 (AtP*); Elhage et al. 2021 (DLA)", flag="--no-attribution")

    def protocols(self) -> tuple[FVScoreConfig, LagProbeConfig]:
        """The nested protocol configs with the study's seed (and the lag probe's method)."""
        return replace(self.fv, seed=self.seed), replace(self.lag, seed=self.seed, method=self.lag_method)

    def route_config(self) -> DualRouteConfig:
        """The dual-route config with the study's seed."""
        return replace(self.route, seed=self.seed)

    def validate(self) -> None:
        """Check every option that needs no model.

        Raises:
            InductionLabError: what a nested config refuses; TypeError: a field of the wrong type."""
        check_fields(self)
        check_seed(self.seed, "--seed")
        check_method(self.lag_method)
        validate_tree(self, lambda: {"lag": self.protocols()[1]})
        lag = self.protocols()[1]
        check_lag_headline(lag)
        check_trials_fit(lag.n_permutations, lag.trial_tokens, "--n-permutations")
        check_trials_fit(self.icl.n_sequences or self.icl.pilot, self.icl.late * 6 // 5 + 1, "--icl-sequences")
        if self.cmr.enabled and self.cmr.max_lag > self.scores.seq_len - 1:
            raise InductionLabError(f"--crp-max-lag {self.cmr.max_lag} does not fit --score-seq-len "
                                    f"{self.scores.seq_len}; give at most {self.scores.seq_len - 1}")


SPEC = StudySpec(
    "study head-types", HeadTypesConfig,
    help="Which heads carry in-context learning: FV scores (AIE) and concept / token induction scores beside the "
         "attention-pattern scores, their "
         "overlap, and induction- vs FV-head ablation with and without excluding the other's top heads, against "
         "random heads, on few-shot HITS@1, the token-loss ICL score and the lag probe, with verdicts Y1-Y4. "
         "Guide: docs/study-head-types.md.",
    model="argument", out="runs/{kind}-{model}-{time}")
