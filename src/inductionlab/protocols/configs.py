"""The protocols' configs: :class:`LagProbeConfig` (SPEC §4), :class:`SerialRecallConfig` (SPEC §5) and
:class:`FVScoreConfig` and :class:`DualRouteConfig` (SPEC §10), :class:`TokenLossConfig` (the token-loss ICL
score under ablation, issue 34),
typed trees (:mod:`inductionlab.config`) whose leaves are the studies' command-line options.

No torch here: the command line generates its options from these before anything heavy is loaded.
Each protocol module re-exports its config (``lag_probe.LagProbeConfig``). A study that runs a
protocol sets the config's ``seed`` and ``method`` from its own (those two are not options of their own).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..checks import TOKEN_BYTES, check_ablation_positions, check_fields, check_method
from ..config import opt
from ..errors import InductionLabError
from ..names import DEFAULT_METHOD, KNOWLEDGE_TASK_NAMES, TASK_NAMES

PAIR_TOKENS = 8        # tokens of one demonstration of a function-style task (input, label, separators), at least
CMR_RUN_BYTES = 4096   # one simulated CMR recall run per start position and grid cell batch (its float64 arrays)


@dataclass
class LagProbeConfig:
    """Lag-probe parameters; defaults follow the seed protocol (SPEC §4) except where noted."""
    list_length: int = opt(500, "Words per lag-probe list.", source="seed protocol",
                           size=lambda c: TOKEN_BYTES * max(c.token_lengths()) * c.n_permutations)
    cue_position: int = opt(250, "1-based list position of the repeated word (lag k = the word at cue + k).",
                            source="seed protocol")
    n_permutations: int = opt(5000, "Lag-probe trials per condition (each a new order of the list).",
                              source="seed protocol", aliases=("--permutations",),
                              size=lambda c: TOKEN_BYTES * c.trial_tokens)
    batch_size: int | None = opt(None, "Trials per forward pass.", none="from free GPU memory; 8 on CPU",
                                 size=lambda c: TOKEN_BYTES * c.trial_tokens)
    seed: int = opt(0, "Seed of the trials' word orders.", cli=False)                 # a study sets its own
    resample_words: bool = opt(False, "Draw a new word set per trial instead of permuting a fixed set.")
    pool_size: int = opt(2000, "Words to resample from (with --resample-words).", cli=False, needs="--resample-words",
                         size=lambda c: 64)                                     # a word's text
    separator: str = opt(" ", 'Between words: " " (each word is its own leading-space token), ", " or "\\n".',
                         escapes=True)
    instruction: str = opt("", "Text after BOS, before the list.")
    bos: bool = opt(True, "Do not prepend the tokenizer's BOS (the flag sets bos false).", flag="--no-bos")
    method: str = opt(DEFAULT_METHOD, "Ablation method of the conditions' heads.", cli=False)   # a study sets its own
    positions: str = opt("all", "Where an output-edit ablation applies: all positions or the last of each forward.",
                         cli=False)                                                              # a study sets its own
    far_lag: int = opt(20, "Word-prior-corrected curve: a word's baseline is its mean probability where it sits "
                           "at |lag| > this.", source="decision")
    reuse_residual: bool = opt(True, "Skip layers below a condition's first ablated head (bit-identical; core/reuse).",
                               cli=False)
    cues: str = opt("seed", "Cued list positions: all, seed (only --cue-position, one forward per cue) or A-B "
                            "(1-based), all:S / A-B:S for every S-th position; the list runs once per trial and each "
                            "cue appends its own tokens. The headline is the seed cue's.")
    cue_chunk: int | None = opt(None, "Cues per packed forward.", none="as many as keep cue tokens <= list tokens",
                                size=lambda c: TOKEN_BYTES * 2 * (c.batch_size or 8),
                                cli=False)
    max_cue_bytes: int = opt(1 << 30, "Per condition: n_trials x n_cues x list_length x 4 bytes of cue_probs.",
                             cli=False)
    word_tokens: str = opt("1", "Tokens per list word: 1 (single-token words) or lengths such as 2-4 or 2,3 (the "
                                "most frequent words of those lengths, balanced, distinct first tokens; reads each "
                                "word's first-token probability at every lag and the whole word's log-probability "
                                "at lags -word-lags..word-lags).", source="seed protocol: 1",
                           omit_default=True)
    word_lags: int = opt(2, "With --word-tokens other than 1: the whole next word's log-probability is scored at "
                            "lags -N..N of every cue (teacher-forced, one packed copy of the word per lag).",
                         source="decision: covers the headline lags 0, +1, -1", omit_default=True)
    word_top_n: int = opt(50_000, "With --word-tokens other than 1: most frequent wordfreq words the list is "
                                  "drawn from.", source="as the dual-route scores", cli=False, omit_default=True)

    def token_lengths(self) -> tuple[int, ...]:
        """The list words' lengths in tokens from ``word_tokens`` (``"1"``, ``"2-4"``, ``"2,3"``), ascending.

        Raises:
            InductionLabError: not a length, a range or a comma list of lengths in 1..8."""
        text = self.word_tokens.strip() if isinstance(self.word_tokens, str) else ""
        usage = f"--word-tokens {self.word_tokens!r}: give 1, a range such as 2-4 or lengths such as 2,3 (1..8 tokens)"
        a, dash, b = text.partition("-")
        parts = [a, b] if dash else text.split(",")
        if not all(x.strip().isdigit() for x in parts):
            raise InductionLabError(usage)
        nums = [int(x) for x in parts]
        out = tuple(range(nums[0], nums[1] + 1)) if dash else tuple(sorted(set(nums)))
        if not out or min(out) < 1 or max(out) > 8:
            raise InductionLabError(usage)
        return out

    @property
    def multi_token(self) -> bool:
        """Whether the list words are read as token sequences (``word_tokens`` other than ``"1"``)."""
        return self.token_lengths() != (1,)

    def word_lag_list(self) -> list[int]:
        """The lags whose whole word is scored: ``-word_lags..word_lags``."""
        return list(range(-self.word_lags, self.word_lags + 1))

    @property
    def trial_tokens(self) -> int:
        """Tokens of one seed trial with a one-token separator: BOS, the list, then separator, cue,
        separator (more with a longer separator or an instruction): the size of the trial checks.
        Words of several tokens: at most their longest length each."""
        m = max(self.token_lengths())
        return self.list_length * m + 3 + m

    def cue_positions(self) -> list[int]:
        """The chosen cue positions, 1-based, ascending (``[cue_position]`` for ``"seed"``).

        ``cues`` is ``seed``, ``all`` (every list position), ``A-B`` (positions A..B inclusive), or
        either of the last two with a step: ``all:S`` / ``A-B:S`` (every S-th position from the
        first: ``all:10`` = 1, 11, …, 491).

        Raises:
            InductionLabError: ``cues`` is none of these, a range outside the list or with A > B, a step < 1."""
        c = self.cues.strip() if isinstance(self.cues, str) else self.cues
        if c == "seed":
            return [self.cue_position]
        usage = (f"cues {self.cues!r}: use all, seed or a range A-B of list positions, optionally with a step "
                 f"(all:S, A-B:S; 1-based, e.g. 1-{self.list_length} or all:10)")
        if not isinstance(c, str):
            raise InductionLabError(usage)
        span, colon, step = c.partition(":")
        if colon and not step.strip().isdigit():
            raise InductionLabError(usage)
        step = int(step) if colon else 1
        if step < 1:
            raise InductionLabError(f"cues {self.cues!r}: the step must be at least 1 (e.g. all:10)")
        span = span.strip()
        if span == "all":
            return list(range(1, self.list_length + 1, step))
        a, sep, b = span.partition("-")
        if not (sep and a.strip().isdigit() and b.strip().isdigit()):
            raise InductionLabError(usage)
        a, b = int(a), int(b)
        if a > b:
            raise InductionLabError(f"cues {self.cues!r}: the range starts after it ends; use A-B with A <= B")
        if a < 1 or b > self.list_length:
            raise InductionLabError(f"cues {self.cues!r}: outside the list of {self.list_length} words; "
                                    f"use a range within 1-{self.list_length}")
        return list(range(a, b + 1, step))

    def validate(self) -> None:
        """Check the options that need no model (called before any model is loaded).

        Raises:
            InductionLabError: cue outside the list, fewer than 2 trials (no CI), bad batch size or method,
                a NaN / infinite / beyond-64-bit number (:func:`~inductionlab.checks.check_fields`).
            TypeError: a field of the wrong type.
        """
        check_fields(self)
        if self.list_length < 2:
            raise InductionLabError(f"list length {self.list_length} is too short; use at least 2 words")
        if not 1 <= self.cue_position <= self.list_length:
            raise InductionLabError(f"cue position {self.cue_position} is outside a list of {self.list_length} words")
        if self.n_permutations < 2:
            raise InductionLabError(f"--n-permutations {self.n_permutations}: at least 2 trials are needed for a CI")
        if self.batch_size is not None and self.batch_size < 1:
            raise InductionLabError(f"batch size {self.batch_size} must be at least 1")
        if self.far_lag < 0:
            raise InductionLabError(f"far lag {self.far_lag} must be at least 0 (the default is {LagProbeConfig.far_lag})")
        check_method(self.method)
        check_ablation_positions(self.positions)
        n_cues = len(self.cue_positions())
        if self.cues.strip() != "seed" and (self.positions != "all" or self.method == "resample"):
            raise InductionLabError(f"--cues {self.cues} packs every cue into one forward, so its last position and its "
                                    f"random-token source are not a cue's: --positions {self.positions} / --method "
                                    f"{self.method} need --cues seed")
        if self.cue_chunk is not None and self.cue_chunk < 1:
            raise InductionLabError(f"cue chunk {self.cue_chunk} must be at least 1 (None: automatic)")
        if self.multi_token:
            bad = ("--resample-words" if self.resample_words else "--method resample" if self.method == "resample"
                   else f"--positions {self.positions}" if self.positions != "all" else None)
            if bad:
                raise InductionLabError(f"--word-tokens {self.word_tokens} scores every cue and word in one packed "
                                        f"forward of a fixed word set: {bad} needs --word-tokens 1")
            if self.word_lags < 0 or self.word_lags >= self.list_length:
                raise InductionLabError(f"--word-lags {self.word_lags}: give 0..{self.list_length - 1} "
                                        "(lags -N..N of the cue)")
            if self.word_top_n < 1:
                raise InductionLabError(f"word_top_n {self.word_top_n} must be >= 1")
        need = self.n_permutations * n_cues * self.list_length * 4
        if need > self.max_cue_bytes:
            raise InductionLabError(
                f"--n-permutations {self.n_permutations:,} x {n_cues} cues x {self.list_length} words: the per-cue "
                f"probabilities need {need / 2**30:.1f} GiB per condition, over the limit of "
                f"{self.max_cue_bytes / 2**30:.1f} GiB; use fewer cues (--cues A-B) or a lower --n-permutations")



@dataclass
class SerialRecallConfig:
    """Serial-recall parameters (SPEC §5)."""
    list_length: int = opt(14, "Words per serial-recall list.", source="SPEC §5, the paper's lists of 14",
                           flag="--recall-list-length",
                           size=lambda c: TOKEN_BYTES * 2 * (c.n_shots + 1) * c.n_trials)
    n_shots: int = opt(3, "Solved study/recall examples before the test list.", source="decision, SPEC §5",
                       flag="--recall-shots", size=lambda c: TOKEN_BYTES * (2 * c.list_length + 4) * c.n_trials)
    n_trials: int = opt(64, "Serial-recall prompts per condition.", source="CPU default", flag="--recall-trials",
                        size=lambda c: TOKEN_BYTES * c.trial_tokens)
    batch_size: int | None = opt(None, "Prompts per forward pass.", none="from free GPU memory; 8 on CPU",
                                 size=lambda c: TOKEN_BYTES * c.trial_tokens)
    seed: int = opt(0, "Seed of the lists.", cli=False)                                  # a study sets its own
    pool_size: int = opt(200, "Words are drawn from this many most frequent single-token words.", cli=False,
                         size=lambda c: 64)
    study_prefix: str = opt("Study:", "Template: before each study list.", cli=False)
    recall_prefix: str = opt("\nRecall:", "Template: before each recall.", cli=False)
    shot_separator: str = opt("\n\n", "Template: between solved examples.", cli=False)
    bos: bool = opt(True, "Prepend the tokenizer's BOS.", cli=False)
    generate: bool = opt(True, "Skip greedy generation (exact match, CRP of recalls).", flag="--no-generate")
    reuse_residual: bool = opt(True, "Skip layers below a condition's first ablated head (bit-identical; core/reuse).",
                               cli=False)
    method: str = opt(DEFAULT_METHOD, "Ablation method of the conditions' heads.", cli=False)   # a study sets its own
    positions: str = opt("all", "Where an output-edit ablation applies: all positions or the last of each forward.",
                         cli=False)                                                              # a study sets its own

    @property
    def trial_tokens(self) -> int:
        """Tokens of one prompt with its recall: (shots + 1) lists studied and recalled, with the template."""
        return (self.n_shots + 1) * (2 * self.list_length + 4)

    def validate(self) -> None:
        """Check the options that need no model (called before any model is loaded).

        Raises:
            InductionLabError: list shorter than 2, negative shots, fewer than 2 trials (no CI),
                bad batch size or method, a NaN / infinite / beyond-64-bit number.
            TypeError: a field of the wrong type.
        """
        check_fields(self)
        if self.list_length < 2 or self.n_shots < 0 or self.n_trials < 1:
            raise InductionLabError(f"serial recall needs list_length >= 2, n_shots >= 0 and n_trials >= 1 "
                                    f"(got {self.list_length}, {self.n_shots}, {self.n_trials})")
        if self.batch_size is not None and self.batch_size < 1:
            raise InductionLabError(f"batch size {self.batch_size} must be at least 1")
        check_method(self.method)
        check_ablation_positions(self.positions)


@dataclass
class WordCopyConfig:
    """The word-list copy probe (SPEC §10, issue 26; :mod:`inductionlab.protocols.word_copy`): a numbered list of
    ``n_items`` items shown once, then again up to the last item's number; the last item's first token is scored.
    Three item kinds per list, of the same token lengths: real words, "nonsense" words made of word pieces, random
    ids (Feucht et al. 2025's words vs random-token entities)."""
    n_lists: int = opt(24, "Lists per item kind (each list gives one trial of each kind).", flag="--copy-lists",
                       size=lambda c: TOKEN_BYTES * 3 * c.list_tokens)
    n_items: int = opt(10, "Items per numbered list; the last one is scored.", source="issue 26",
                       flag="--copy-items", size=lambda c: TOKEN_BYTES * 3 * c.n_lists * 2 * (max(c.lengths) + 3))
    lengths: tuple[int, ...] = opt((2, 3, 4, 5), "Item lengths in tokens, comma-separated (words of these lengths "
                                                 "under the model's tokenizer).", source="Feucht et al. 2025",
                                   flag="--copy-lengths")
    word_pool: int = opt(50_000, "Most frequent wordfreq words the real items are drawn from.",
                         source="as the dual-route scores; 20,000 leaves SmolLM2 one 5-token word", cli=False,
                         size=lambda c: 64)
    generate: bool = opt(True, "Skip the greedy continuation of the last item (verbatim copies and paraphrases).",
                         flag="--no-copy-generate")
    batch_size: int | None = opt(None, "Prompts per forward pass.", none="from free GPU memory; 8 on CPU",
                                 size=lambda c: TOKEN_BYTES * c.list_tokens)
    seed: int = opt(0, "Seed of the lists.", cli=False)                                  # a study sets its own
    method: str = opt(DEFAULT_METHOD, "Ablation method of the conditions' heads.", cli=False)   # a study sets its own
    positions: str = opt("all", "Where an output-edit ablation applies.", cli=False)             # a study sets its own
    reuse_residual: bool = opt(True, "Skip layers below a condition's first ablated head (bit-identical).", cli=False)

    @property
    def list_tokens(self) -> int:
        """Tokens of one prompt at most: the list twice, each item its longest length plus its number and
        separator (the size of the memory checks)."""
        return 2 * self.n_items * (max(self.lengths) + 3) + 1

    def validate(self) -> None:
        """Raises InductionLabError: fewer than 2 lists (a CI) or items, a length below 1 or repeated, a pool or
        batch size below 1; TypeError: a field of the wrong type."""
        check_fields(self)
        if self.n_lists < 2 or self.n_items < 2:
            raise InductionLabError(f"--copy-lists {self.n_lists} and --copy-items {self.n_items} must be >= 2 "
                                    "(a CI needs two lists; a copy needs an item before the scored one)")
        if not self.lengths or min(self.lengths) < 1 or len(set(self.lengths)) != len(self.lengths):
            raise InductionLabError(f"--copy-lengths {','.join(map(str, self.lengths)) or '(none)'}: give distinct "
                                    "lengths >= 1, e.g. 2,3,4,5")
        if self.word_pool < 1 or (self.batch_size is not None and self.batch_size < 1):
            raise InductionLabError(f"word pool {self.word_pool} and batch size {self.batch_size} must be >= 1")
        check_method(self.method)
        check_ablation_positions(self.positions)


@dataclass
class FVScoreConfig:
    """The FV score (AIE) of every head and the function vector's check (SPEC §10,
    :mod:`inductionlab.protocols.function_vectors`)."""
    tasks: tuple[str, ...] | None = opt(None, "Tasks the FV score averages over, comma-separated.",
                                        none="the 13 function-style tasks and country_capital, country_currency",
                                        flag="--fv-tasks")
    shots: int = opt(10, "Demonstrations per FV prompt.", source="Todd et al. 2024", flag="--fv-shots",
                     size=lambda c: TOKEN_BYTES * PAIR_TOKENS * 2 * c.n_prompts * len(c.task_names()))
    n_prompts: int = opt(25, "Clean and corrupted prompts per task.", source="Todd et al. 2024 (Yin: 100)",
                         flag="--fv-prompts",
                         size=lambda c: TOKEN_BYTES * PAIR_TOKENS * 2 * (c.shots + 1) * len(c.task_names()))
    top: int = opt(10, "Heads summed into the function vector.", source="Todd et al. 2024", flag="--fv-top")
    layer: int | None = opt(None, "Decoder layer after which the function vector is added.", none="n_layers // 3",
                            source="Todd et al. 2024 (an early-middle layer)", flag="--fv-layer")
    zero_shot_prompts: int = opt(25, "Zero-shot prompts per task for the function vector's check.",
                                 flag="--fv-zero-shot-prompts",
                                 size=lambda c: TOKEN_BYTES * PAIR_TOKENS * len(c.task_names()))
    rows: int = opt(90, "Heads patched per forward of last-token copies (speed only).", cli=False,
                    size=lambda c: 4 * 64 * PAIR_TOKENS * (c.shots + 1))     # a patched row's activations, >= 64 wide
    bos: bool = opt(True, "Prepend the tokenizer's BOS (when it has one).", cli=False)
    seed: int = opt(0, "Seed of the prompts.", cli=False)                                # a study sets its own

    def task_names(self) -> tuple[str, ...]:
        return tuple(self.tasks) if self.tasks is not None else TASK_NAMES + KNOWLEDGE_TASK_NAMES

    def validate(self) -> None:
        """Raises InductionLabError: an unknown or repeated task, fewer than 2 shots (the corrupted prompt deranges
        the labels) or prompts (a CI), top or rows below 1, a negative layer; TypeError: a field of the wrong type."""
        check_fields(self)
        known = TASK_NAMES + KNOWLEDGE_TASK_NAMES
        names = self.task_names()
        bad = [t for t in names if t not in known]
        if bad or not names or len(set(names)) != len(names):
            raise InductionLabError(f"--fv-tasks: unknown, repeated or no task(s) {', '.join(map(repr, bad)) or ''}; "
                                    f"use some of: {', '.join(known)}")
        if self.shots < 2:
            raise InductionLabError(f"--fv-shots {self.shots}: the FV score needs at least 2 (the corrupted prompt "
                                    "deranges the demonstrations' labels); use e.g. 10")
        if self.n_prompts < 2 or self.zero_shot_prompts < 2:
            raise InductionLabError(f"--fv-prompts {self.n_prompts} and --fv-zero-shot-prompts "
                                    f"{self.zero_shot_prompts} must be >= 2 (a CI needs two)")
        if self.top < 1 or self.rows < 1:
            raise InductionLabError(f"--fv-top {self.top} and rows {self.rows} must be >= 1")
        if self.layer is not None and self.layer < 0:
            raise InductionLabError(f"--fv-layer {self.layer} must be >= 0 (a decoder layer)")


@dataclass
class DualRouteConfig:
    """Concept and token induction scores per head (Feucht et al. 2025; SPEC §10,
    :mod:`inductionlab.protocols.dual_route`): causal copying on word and random-token prompts, value-weighted
    attention to a word's first and last token."""
    enabled: bool = opt(True, "Skip the concept / token induction scores (the flag sets enabled false).",
                        flag="--no-dual-route")
    n_words: int = opt(32, "Word prompts for concept copying, and as many random-token prompts for token copying "
                           "(split evenly over the word lengths).",
                       source="Feucht et al. 2025 use 1024; fewer here for a CPU run", flag="--route-prompts",
                       needs="--no-dual-route", size=lambda c: TOKEN_BYTES * 2 * c.prompt_tokens)
    n_attention: int = opt(32, "Prompts for the value-weighted attention scores.",
                           source="Feucht et al. 2025 use 2048; fewer here for a CPU run",
                           flag="--route-attention-prompts", needs="--no-dual-route",
                           size=lambda c: TOKEN_BYTES * c.prompt_tokens)
    seq_len: int = opt(30, "Random-token context length around a word.", source="Feucht et al. 2025",
                       flag="--route-seq-len", needs="--no-dual-route",
                       size=lambda c: TOKEN_BYTES * 2 * (2 * c.n_words + c.n_attention))
    lengths: tuple[int, ...] = opt((2, 3, 4, 5), "Word lengths in tokens, comma-separated.",
                                   source="Feucht et al. 2025", flag="--route-word-lengths", needs="--no-dual-route")
    word_pool: int = opt(50_000, "Most frequent wordfreq words the words are drawn from.", flag="--route-word-pool",
                         needs="--no-dual-route")
    rows: int = opt(64, "Heads patched per forward of suffix copies (speed only).", cli=False, needs="--no-dual-route",
                    size=lambda c: 4 * 64 * c.prompt_tokens)          # a patched row's activations, >= 64 wide
    seed: int = opt(0, "Seed of the words and contexts.", cli=False)                     # a study sets its own

    @property
    def prompt_tokens(self) -> int:
        """Tokens of one prompt at most: the context twice around a word of the longest length, and BOS."""
        return 2 * (self.seq_len + max(self.lengths)) + 1

    def validate(self) -> None:
        """Raises InductionLabError: fewer prompts than word lengths or than 2 (a CI), a length outside 2..seq_len/2,
        a repeated length, a pool or rows below 1; TypeError: a field of the wrong type."""
        check_fields(self)
        if not self.lengths or len(set(self.lengths)) != len(self.lengths) or \
                any(not 2 <= n <= self.seq_len // 2 for n in self.lengths):
            raise InductionLabError(f"--route-word-lengths {','.join(map(str, self.lengths)) or '(none)'}: give distinct "
                                    f"lengths in 2..{self.seq_len // 2} (--route-seq-len / 2), e.g. 2,3,4,5")
        if min(self.n_words, self.n_attention) < max(2, len(self.lengths)):
            raise InductionLabError(f"--route-prompts {self.n_words} and --route-attention-prompts {self.n_attention} "
                                    f"must be >= {max(2, len(self.lengths))} (one per word length, two for a CI)")
        if self.word_pool < 1 or self.rows < 1:
            raise InductionLabError(f"--route-word-pool {self.word_pool} and rows {self.rows} must be >= 1")


#: The ablations the token-loss score runs under (the primary ``--icl-method`` and the sensitivity arms).
TOKEN_LOSS_METHODS = ("sink", "resample", "mean", "zero")


@dataclass
class TokenLossConfig:
    """The token-loss ICL score under ablation (Olsson et al. 2022; Yin & Steinhardt 2025's "token-loss
    difference"), measured with every position's loss between the early and late tokens (issue 34,
    :mod:`inductionlab.measures.token_loss`): the log-slope benefit D (primary), log-symmetric bands B and the
    single-token benefit, per window; the number of windows from a pilot (:mod:`inductionlab.measures.power`)."""
    text: str = opt("demo", "Natural text: 'demo' (the demo corpus: make corpus) or a .txt file.", flag="--icl-text")
    late: int = opt(500, "Late token.", source="Olsson et al. 2022", flag="--icl-late",
                    size=lambda c: TOKEN_BYTES * 6 // 5 * max(c.n_sequences or 0, c.pilot))
    early: int = opt(50, "Early token.", source="Olsson et al. 2022", flag="--icl-early")
    n_sequences: int | None = opt(None, "Text windows (every condition runs the same ones).", flag="--icl-sequences",
                                  overrides=("--icl-pilot", "--icl-half-width", "--budget-minutes"),
                                  size=lambda c: TOKEN_BYTES * (c.late * 6 // 5 + 1),
                                  none="auto: n = ceil((1.96 sigma / h)^2) from a pilot, capped by --budget-minutes "
                                       "and the text")
    half_width: float = opt(0.1, "Target 95% CI half-width (nats) of the claims' paired difference of D, for the "
                                 "pilot's n.", source="ANCHORS-POWER 1.4", flag="--icl-half-width")
    pilot: int = opt(16, "Pilot windows (intact + the claim's ablation) that estimate sigma (with auto windows).",
                     flag="--icl-pilot", size=lambda c: TOKEN_BYTES * (c.late * 6 // 5 + 1))
    budget_minutes: float | None = opt(None, "Minutes the token-loss phase may take over all its conditions; caps "
                                             "the pilot's n.", none="no cap", flag="--budget-minutes")
    bands: bool = opt(True, "Windows end at the late token (the flag sets bands false; the band benefit B, which "
                            "needs 1.2 x late tokens, is then absent).", flag="--no-icl-bands")
    method: str = opt("sink", "Ablation of the heads for this measure.", choices=TOKEN_LOSS_METHODS,
                      source="Yin & Steinhardt 2025's hook, as their code runs it, writes v(BOS) at every position: "
                             "sink (ANCHORS-POWER 1.3)", flag="--icl-method")
    sensitivity: tuple[str, ...] | None = opt(("resample",), "Other ablations of the claim's conditions, "
                                                            "comma-separated (resample, sink, mean, zero): each an arm "
                                                            "reported beside the primary (study head-types).",
                                              none="no sensitivity arm", flag="--icl-sensitivity",
                                              metavar="METHOD[,METHOD...]")
    batch_size: int = opt(2, "Windows per forward pass.", cli=False, size=lambda c: TOKEN_BYTES * (c.late * 6 // 5 + 1))

    @property
    def auto(self) -> bool:
        """Whether the number of windows comes from a pilot."""
        return self.n_sequences is None

    def validate(self) -> None:
        """Raises InductionLabError: positions out of order, fewer than 2 windows (a CI needs two), a half-width
        or budget <= 0, an unknown method, a sensitivity arm equal to the primary method or given twice; the demo
        corpus not installed or a ``--icl-text`` that is no file (checked here, before a model loads)."""
        check_fields(self)
        if self.text == "demo":
            from ..data.corpus import demo_archive     # here: the CLI's options read this module

            try:
                demo_archive()          # a fresh clone without `make corpus`: the message gives the command
            except InductionLabError as e:
                raise InductionLabError(f"--icl-text demo: {e}") from None
        elif not Path(self.text).is_file():
            raise InductionLabError(f"--icl-text {self.text}: no such file; give a .txt file or 'demo' (make corpus)")
        check_method(self.method)
        if not 1 <= self.early < self.late:
            raise InductionLabError(f"--icl-early {self.early} and --icl-late {self.late}: need 1 <= early < late")
        if self.n_sequences is not None and self.n_sequences < 2 or self.batch_size < 1:
            raise InductionLabError(f"--icl-sequences {self.n_sequences} must be >= 2 (a CI needs two) or auto")
        if self.pilot < 2:
            raise InductionLabError(f"--icl-pilot {self.pilot} must be >= 2 (a pilot sigma needs two windows)")
        if not self.half_width > 0:
            raise InductionLabError(f"--icl-half-width {self.half_width} must be > 0 nats (e.g. 0.1)")
        if self.budget_minutes is not None and not self.budget_minutes > 0:
            raise InductionLabError(f"--budget-minutes {self.budget_minutes} must be > 0 (or none)")
        for m in self.arms:
            if m not in TOKEN_LOSS_METHODS:
                raise InductionLabError(f"--icl-sensitivity {m}: use {', '.join(TOKEN_LOSS_METHODS)} (or none)")
            if m == self.method:
                raise InductionLabError(f"--icl-sensitivity {m} is the primary --icl-method; give another method "
                                        "or none")
        if len(set(self.arms)) != len(self.arms):
            raise InductionLabError(f"--icl-sensitivity {','.join(self.arms)} repeats a method; give each once")

    @property
    def arms(self) -> tuple[str, ...]:
        """The sensitivity arms' ablation methods, in the order given (none: ``()``)."""
        return tuple(self.sensitivity or ())


__all__ = ["LagProbeConfig", "SerialRecallConfig", "WordCopyConfig", "FVScoreConfig", "DualRouteConfig", "HeadTypeParams",
           "TokenLossConfig"]


@dataclass
class HeadTypeParams:
    """What a head-type sweep over a training run's checkpoints measures, and its thresholds (``inductionlab
    telemetry RUN --head-types``; recorded beside every output)."""
    enabled: bool = opt(False, "Also sweep every checkpoint for head types: induction, concept / token copying and "
                               "CMR fit per head, with a transition table, CMR-like share per layer, induction "
                               "concentration and one plot per type (head_types/).", flag="--head-types")
    seq_len: int = opt(50, "Length of S in [BOS] S S for the induction score and the attention CRP.",
                       source="SPEC §3", flag="--head-types-seq-len", needs="--head-types",
                       size=lambda c: TOKEN_BYTES * 2 * c.batch_size * c.n_batches)
    batch_size: int = opt(16, "Sequences of [BOS] S S per checkpoint.", flag="--head-types-batch", needs="--head-types",
                          size=lambda c: TOKEN_BYTES * (2 * c.seq_len + 1) * c.n_batches)
    n_batches: int = opt(1, "Batches of [BOS] S S.", cli=False, needs="--head-types",
                         size=lambda c: TOKEN_BYTES * (2 * c.seq_len + 1) * c.batch_size)
    seed: int = opt(0, "Seed of every draw (the same at every checkpoint).", flag="--head-types-seed",
                    needs="--head-types")
    n_words: int = opt(8, "Dual-route word prompts (and as many random-token prompts).",
                       source="Feucht et al. 2025 use 1024; a few per checkpoint here", flag="--head-types-words",
                       needs="--head-types", size=lambda c: TOKEN_BYTES * 2 * (2 * c.route_seq_len + 11))
    n_attention: int = opt(8, "Dual-route value-weighted attention prompts.", flag="--head-types-attention-prompts",
                           needs="--head-types", size=lambda c: TOKEN_BYTES * (2 * c.route_seq_len + 11))
    route_seq_len: int = opt(30, "Random-token context around a dual-route word.", source="Feucht et al. 2025",
                             cli=False, needs="--head-types",
                             size=lambda c: TOKEN_BYTES * 2 * (2 * c.n_words + c.n_attention))
    word_pool: int = opt(50_000, "Most frequent wordfreq words the dual-route words are drawn from.",
                         flag="--head-types-word-pool", needs="--head-types")
    max_lag: int = opt(8, "Lags -m..m of the attention CRP (±5 are fitted).", source="Ji-An et al. 2024", cli=False,
                       needs="--head-types")
    n_exps: int = opt(10, "Simulated CMR runs per start position and grid cell (the grid is cached).",
                      source="Ji-An et al. 2024 used 1,000", flag="--head-types-cmr-runs", needs="--head-types",
                      size=lambda c: CMR_RUN_BYTES * c.n_starts)
    n_starts: int = opt(20, "Start positions of the CMR simulation (fewer: a faster, coarser grid).",
                        source="Ji-An et al. 2024", flag="--head-types-cmr-starts", needs="--head-types")
    induction_threshold: float = opt(0.4, "A head is an induction head from the first checkpoint where its "
                                          "induction score is at least this.", flag="--induction-threshold",
                                  needs="--head-types")
    concept_threshold: float = opt(0.05, "... a concept-copying head where concept_copying is at least this.",
                                   flag="--concept-threshold", needs="--head-types")
    token_threshold: float = opt(0.05, "... a token-copying head where token_copying is at least this.",
                                 flag="--token-threshold", needs="--head-types")
    cmr_threshold: float = opt(0.5, "CMR-like: CMR distance below this.",
                               source="Ji-An et al. 2024", cli=False, needs="--head-types")
    top_k: int = opt(5, "Concentration: the share of the positive induction total held by the top k heads.",
                     flag="--concentration-top", needs="--head-types")

    def validate(self) -> None:
        """Raises InductionLabError: a count below 1, a threshold outside its range, a lag window the sequence
        cannot hold; a leaf set without ``enabled`` (:func:`~inductionlab.checks.check_fields`)."""
        check_fields(self)
        for name in ("seq_len", "batch_size", "n_batches", "n_words", "n_attention", "route_seq_len", "word_pool",
                     "n_exps", "top_k"):
            if getattr(self, name) < 1:
                raise InductionLabError(f"head types: {name} = {getattr(self, name)} must be >= 1")
        if not 1 <= self.n_starts <= 100:
            raise InductionLabError(f"--head-types-cmr-starts {self.n_starts}: give 1..100 start positions")
        if not 5 <= self.max_lag <= self.seq_len - 1:
            raise InductionLabError(f"head types: the CRP lags -{self.max_lag}..{self.max_lag} need 5 <= max_lag <= "
                                    f"--head-types-seq-len - 1 = {self.seq_len - 1}; raise --head-types-seq-len")
        for name in ("induction_threshold", "concept_threshold", "token_threshold"):
            v = getattr(self, name)
            if not (math.isfinite(v) and -1 <= v <= 1):
                raise InductionLabError(f"--{name.replace('_', '-')} {v}: give a probability (difference) in [-1, 1]")

    def sequences(self, pool=None):
        """The ``[BOS] S S`` sequences of the induction score and the attention CRP, as
        :class:`~inductionlab.core.scores.ScoreSequences` (seeded by ``seed``; ``pool``: LongTensor of the ids random
        tokens are drawn from, None: the tokenizer's ordinary ids)."""
        from ..core.scores import ScoreSequences   # here: this module loads no torch

        return ScoreSequences(seq_len=self.seq_len, batch_size=self.batch_size, n_batches=self.n_batches,
                              seed=self.seed, pool=pool)

    def thresholds(self) -> dict[str, tuple[float, str]]:
        """``{score: (threshold, ">=" | "<")}`` of the transition table."""
        return {"induction": (self.induction_threshold, ">="), "concept_copying": (self.concept_threshold, ">="),
                "token_copying": (self.token_threshold, ">="), "cmr_distance": (self.cmr_threshold, "<")}

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "enabled"}
