"""``inductionlab study routes``: its config (:class:`RoutesConfig`) and :data:`SPEC`.

Light (no torch): the command line generates the command's options from :class:`RoutesConfig`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace

from ...checks import check_draws, check_fields, check_method, check_seed
from ... import config as C
from ...config import nested, opt, validate_tree
from ...errors import InductionLabError
from ...names import SCORE_NAMES, ablation_method_names
from ...protocols.configs import LagProbeConfig, SerialRecallConfig, TokenLossConfig, WordCopyConfig
from ..configs import HeadScoreConfig, check_lag_headline, check_trials_fit, score_file_columns
from ..spec import StudySpec

DEFAULT_RANKINGS = ("induction", "concept_copying", "cmr_like", "fv")
OWNED = {"seed": "--seed", "method": "--method"}   # the protocols' leaves the study sets (:meth:`RoutesConfig.protocols`)


@dataclass
class RoutesSelectionConfig:
    """Which heads are ablated: for each ranking its top k, the same with another ranking's top k removed where a
    claim compares the two, and seeded random draws of k heads of all heads (Yin & Steinhardt 2025's control)."""
    rankings: tuple[str, ...] = opt(DEFAULT_RANKINGS, "Head rankings whose top k heads are ablated, comma-separated: "
                                    "scores this command computes (" + ", ".join(SCORE_NAMES) + ") or columns of "
                                    "--scores-file (higher = more of the mechanism; negate a distance).",
                                    source="issue 26")
    scores_file: str | None = opt(None, "CSV of per-head scores (columns layer, head and one per score), e.g. a study "
                                        "head-types run's head_scores.csv; --rankings names its columns.",
                                  none="none", metavar="CSV")
    fractions: tuple[float, ...] = opt((0.05,), "Fractions of all heads ablated, comma-separated (k = max(1, "
                                       "int(f x heads))).", source="Yin & Steinhardt 2025 (1-20%)")
    ks: tuple[int, ...] | None = opt(None, "Numbers of heads ablated, comma-separated (instead of --fractions).",
                                     none="from --fractions", overrides="--fractions")
    n_draws: int = opt(3, "Random draws of k heads per k.")
    method: str = opt("zero", "Ablation of the heads for the lag probe, serial recall and the copy probe.",
                      source="seed protocol", choices=ablation_method_names())
    token_ranking: str = opt("induction", "The token-induction ranking of claims R1 and R2.",
                             source="Feucht et al. 2025: token heads = induction heads")
    concept_ranking: str = opt("concept_copying", "The concept-induction ranking of claim R2.",
                               source="Feucht et al. 2025")
    cmr_ranking: str = opt("cmr_like", "The CMR-likeness ranking of claim R3.", source="Ji-An et al. 2024")

    def validate(self) -> None:
        """Raises InductionLabError: no or repeated rankings, a ranking neither computed nor a column of the scores
        file (one line naming the file and its columns), a scores file no ranking reads, a claim's ranking
        (``--token-ranking``, ``--concept-ranking``, ``--cmr-ranking``) given but not among the rankings or equal to
        another claim's, bad fractions, ks or draws."""
        check_fields(self)
        r = self.rankings
        if not r or len(set(r)) != len(r) or any(not isinstance(x, str) or not x.strip() for x in r):
            raise InductionLabError(f"--rankings {','.join(map(str, r)) or '(none)'}: give distinct score names, e.g. "
                                    "induction,concept_copying")
        wanted = [x for x in r if x not in SCORE_NAMES]
        if wanted and self.scores_file is None:
            raise InductionLabError(f"--rankings {', '.join(wanted)}: not head scores this command computes "
                                    f"({', '.join(SCORE_NAMES)}); give --scores-file with those columns (e.g. a study "
                                    "head-types run's head_scores.csv) or drop them from --rankings")
        if self.scores_file is not None and not wanted:
            raise InductionLabError(f"--scores-file {self.scores_file}: no --rankings names one of its columns (the "
                                    f"computed scores {', '.join(SCORE_NAMES)} are the run's own); name a column or "
                                    "drop the file")
        if wanted:
            columns = score_file_columns(self.scores_file)
            missing = [x for x in wanted if x not in columns]
            if missing:
                raise InductionLabError(f"--rankings {', '.join(missing)}: --scores-file {self.scores_file} has no "
                                        f"such column; its score columns: {', '.join(columns) or '(none)'}")
        self._check_roles()
        if self.ks is None:
            if not self.fractions or any(not 0 < f <= 1 for f in self.fractions) or \
                    len(set(self.fractions)) != len(self.fractions):
                raise InductionLabError(f"--fractions {','.join(map(str, self.fractions)) or '(none)'}: give distinct "
                                        "fractions in (0, 1], e.g. 0.05")
        elif not self.ks or min(self.ks) < 1 or len(set(self.ks)) != len(self.ks):
            raise InductionLabError(f"--ks {','.join(map(str, self.ks)) or '(empty)'}: give distinct ks >= 1, e.g. 5,10")
        check_draws(self.n_draws, "--n-draws")
        if self.n_draws < 1:
            raise InductionLabError("--n-draws 0: the claims compare against random heads; give at least 1")
        check_method(self.method)

    def roles(self) -> dict[str, str]:
        """Flag -> ranking of each claim's role (token: R1, R2; concept: R2; CMR-like: R3)."""
        return {"--token-ranking": self.token_ranking, "--concept-ranking": self.concept_ranking,
                "--cmr-ranking": self.cmr_ranking}

    def _check_roles(self) -> None:
        """A role's ranking given (away from its default) must be one of ``rankings`` (a misspelt or dropped one
        would leave its claims undecided without a word), and no two roles name the same ranking (claim R2 would
        compare a ranking with itself)."""
        defaults = {C.flag_of(f): f.default for f in dataclasses.fields(self)}
        seen: dict[str, str] = {}
        for flag, name in self.roles().items():
            if name not in self.rankings and name != defaults[flag]:
                raise InductionLabError(f"{flag} {name}: not one of --rankings ({', '.join(self.rankings)}); give one "
                                        "of them (or add it to --rankings)")
            if name in seen:
                raise InductionLabError(f"{seen[name]} and {flag} are both {name}: the claims would compare a ranking "
                                        "with itself; give each role its own ranking")
            seen[name] = flag

    def sizes(self, n_total: int) -> list[int]:
        """The head counts ablated: ``ks``, or ``max(1, int(f·N))`` per fraction, ascending.

        Raises:
            InductionLabError: two fractions that give the same count (one of them would do nothing)."""
        if self.ks is not None:
            return sorted(self.ks)
        counts: dict[int, float] = {}
        for f in self.fractions:
            k = max(1, int(f * n_total))
            if k in counts:
                raise InductionLabError(f"--fractions {counts[k]:g} and {f:g} both ablate {k} of the model's {n_total} "
                                        "heads (max(1, int(f x heads))); give fractions of distinct counts or --ks")
            counts[k] = f
        return sorted(counts)


@dataclass
class RoutesConfig:
    """Parameters of the study (SPEC §10, issue 26). Sizes are CPU defaults; the protocols' seeds and ablation
    method are the study's."""
    seed: int = opt(0, "Seed of trials, random draws and head-score sequences.")
    scores: HeadScoreConfig = nested(HeadScoreConfig, "Attention-pattern head scores (SPEC §3).")
    selection: RoutesSelectionConfig = nested(RoutesSelectionConfig, "Which heads are ablated.")
    lag: LagProbeConfig = nested(lambda: LagProbeConfig(n_permutations=11, cues="all:10"),
                                 "The all-cue lag probe (p(+1), log-enrichment, temporal factor).", owns=OWNED)
    recall: SerialRecallConfig = nested(lambda: SerialRecallConfig(n_trials=32, generate=False),
                                        "Few-shot serial recall (SPEC §5).", owns=OWNED)
    copy: WordCopyConfig = nested(WordCopyConfig, "The word-list copy probe.", owns=OWNED)
    icl: TokenLossConfig = nested(lambda: TokenLossConfig(sensitivity=None), "Token-loss ICL score under ablation "
                                  "(claim R3): D, B and the single-token benefit; windows sized by a pilot.")
    r2_word_tokens: str = opt("none", "Claim R2's multi-token arm (R2w): the lag probe again, same lists and cues, on "
                                      "words of these many tokens (e.g. 2-4; whole next word's p(+1) and its first "
                                      "token's) under every condition; none skips it.", source="issue 34",
                              omit_default=True)

    def word_lag(self) -> LagProbeConfig | None:
        """The lag probe of claim R2's multi-token arm (the study's lag probe with ``word_tokens =
        r2_word_tokens``, its seed and method), or None when ``r2_word_tokens`` is ``none``."""
        if self.r2_word_tokens.strip() == "none":
            return None
        return replace(self.lag, seed=self.seed, method=self.selection.method, word_tokens=self.r2_word_tokens)

    def protocols(self) -> tuple[LagProbeConfig, SerialRecallConfig, WordCopyConfig]:
        """The nested protocol configs with the study's seed and ablation method."""
        m = self.selection.method
        return (replace(self.lag, seed=self.seed, method=m), replace(self.recall, seed=self.seed, method=m),
                replace(self.copy, seed=self.seed, method=m))

    def validate(self) -> None:
        """Check every option that needs no model (the scores file's header is read here).

        Raises:
            InductionLabError: what a nested config refuses; TypeError: a field of the wrong type."""
        check_fields(self)
        check_seed(self.seed, "--seed")
        validate_tree(self, lambda: dict(zip(("lag", "recall", "copy"), self.protocols())))
        lag, recall, copy = self.protocols()
        check_lag_headline(lag)
        check_trials_fit(lag.n_permutations, lag.trial_tokens, "--n-permutations")
        check_trials_fit(recall.n_trials, recall.trial_tokens, "--recall-trials")
        words = self.word_lag()
        if words is not None:
            words.validate()
            if not words.multi_token:
                raise InductionLabError(f"--r2-word-tokens {self.r2_word_tokens}: the multi-token arm needs words of "
                                        "2 or more tokens (e.g. 2-4); none skips it")
            check_trials_fit(words.n_permutations, words.trial_tokens, "--n-permutations")
        check_trials_fit(self.icl.n_sequences or self.icl.pilot, self.icl.late * 6 // 5 + 1, "--icl-sequences")
        if self.icl.arms:
            raise InductionLabError(f"--icl-sensitivity {','.join(self.icl.arms)}: study routes runs no sensitivity "
                                    "arm; give none (study head-types runs them for Y2)")


SPEC = StudySpec(
    "study routes", RoutesConfig,
    help="Which route carries the seed's effects: the top heads of each ranking (token induction, concept "
         "induction, CMR-like, FV: computed or read from --scores-file) ablated, with exclusions where a claim "
         "compares two rankings, against random heads, on the all-cue lag probe, serial recall, a word-list copy "
         "probe (words, nonsense, random ids) and the token-loss ICL score, with claims R1-R3. "
         "Guide: docs/study-routes.md.",
    model="argument", out="runs/{kind}-{model}-{time}")
