"""What several studies' configs share, written once: the nested configs of head scores
(:class:`HeadScoreConfig`, SPEC §3) and of ablation conditions (:class:`AblationConfig`, SPEC §4), and
the checks that read a protocol's config or the model. Messages name the CLI flag (the config field
is the same name with underscores), so the same mistake gives the same line from every command and
from the API. No torch here: the configs' ``validate()`` runs before a model loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..checks import (ABLATION_POSITIONS, TOKEN_BYTES, check_ablation_positions, check_draws, check_fields,
                      check_method)
from ..config import opt
from ..errors import InductionLabError
from ..names import DEFAULT_METHOD, RANDOM_CONTROLS, SCORE_NAMES, ablation_method_names


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
    seq_len: int = opt(50, "T, tokens per copy for head scores.", source="SPEC §3", flag="--score-seq-len",
                       size=lambda c: TOKEN_BYTES * 2 * c.batch_size * c.n_batches)
    batch_size: int = opt(16, "Sequences for head scores.", source="SPEC §3", flag="--score-batch-size",
                          size=lambda c: TOKEN_BYTES * (2 * c.seq_len + 1) * c.n_batches)
    n_batches: int = opt(1, "Batches of head-score sequences.", cli=False,
                         size=lambda c: TOKEN_BYTES * (2 * c.seq_len + 1) * c.batch_size)

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

    def check_model_fit(self, loaded) -> None:
        """The sequences ``[BOS] S S`` fit the model's context (the engine calls this before the run opens).

        Raises:
            InductionLabError: ``1 + 2 x seq_len`` tokens beyond the context, naming the largest ``--score-seq-len``."""
        from ..core.models import attention_shape   # here: this module loads no torch

        ctx = attention_shape(loaded.model.config)["max_position_embeddings"]
        bos = int(getattr(loaded.tokenizer, "bos_token_id", None) is not None)
        n = bos + 2 * self.seq_len
        if ctx and n > ctx:
            raise InductionLabError(f"--score-seq-len {self.seq_len}: a head-score sequence [BOS] S S of {n} tokens "
                                    f"exceeds the model's context of {ctx}; use --score-seq-len <= {(ctx - bos) // 2}")

    def sequences(self, seed: int, pool=None):
        """These sequences as :func:`~inductionlab.core.scores.compute_head_scores` takes them: a
        :class:`~inductionlab.core.scores.ScoreSequences` with the study's ``seed`` and the ids ``pool`` random
        tokens are drawn from (None: the tokenizer's ordinary ids)."""
        from ..core.scores import ScoreSequences   # here: this module loads no torch

        return ScoreSequences(seq_len=self.seq_len, batch_size=self.batch_size, n_batches=self.n_batches, seed=seed,
                              pool=pool)


@dataclass
class RankingConfig:
    """How the ablated heads are chosen (SPEC §4 with §10's selection, Yin & Steinhardt 2025): the ranking
    (``rank_by``, any head score the command computes or a column of ``scores_file``), another score whose
    top heads are excluded from it (``exclude_by``, ``exclude_fraction``) and the random control (``random``).
    Shared by :class:`AblationConfig` (``analyze``, ``study temporal``) and ``evaluate``'s load-bearing
    config. The defaults are SPEC §4's (top-k by induction score, random heads outside the top N) and stay
    out of a run's params (``omit_default``), so runs recorded before these options resume unchanged."""
    rank_by: str = opt("induction", "Head score whose top-k heads are ablated: one the command computes ("
                                    + ", ".join(SCORE_NAMES) + ") or a column of --scores-file (e.g. fv).",
                       source="SPEC §4; any ranking: SPEC §10", omit_default=True)
    exclude_by: str | None = opt(None, "Another score whose top --exclude-fraction of all heads never enter the ranked "
                                       "selection (e.g. --rank-by fv --exclude-by induction).",
                                 none="no exclusion", source="Yin & Steinhardt 2025", omit_default=True)
    exclude_fraction: float = opt(0.02, "Fraction of all heads excluded by --exclude-by: the top max(1, int(f x "
                                        "heads)).", source="Yin & Steinhardt 2025",
                                  needs="--exclude-by", omit_default=True)
    random: str = opt("outside-top-n", "Random control: k heads outside the top N of the ranking (--exclude-top-n; "
                                       "evaluate: per-layer variants draw matched per layer), or k heads of all.",
                      choices=RANDOM_CONTROLS, source="SPEC §4; 'all': SPEC §10", omit_default=True)
    scores_file: str | None = opt(None, "CSV of per-head scores (columns layer, head and one per score, one row per "
                                        "head of the model), e.g. a study head-types run's head_scores.csv; its "
                                        "columns can be named by --rank-by / --exclude-by.", none="none",
                                  metavar="CSV", omit_default=True)

    def _validate_selection(self) -> None:
        """The selection options: known random control, a fraction in [0, 1), score names the command computes
        or the scores file holds (its header is read here; its rows are checked against the model in
        :meth:`score_tables`)."""
        if self.random not in RANDOM_CONTROLS:
            raise InductionLabError(f"--random {self.random!r}: use one of {', '.join(RANDOM_CONTROLS)}")
        if self.random == "all" and getattr(self, "exclude_top_n", None) is not None:
            raise InductionLabError("--exclude-top-n is for --random outside-top-n; drop it or use that control")
        f = self.exclude_fraction
        if not 0 < f < 1:
            raise InductionLabError(f"--exclude-fraction {f} must be in (0, 1) (a fraction of all heads, e.g. 0.02; "
                                    "it excludes at least one head)")
        for flag, v in (("--rank-by", self.rank_by), ("--exclude-by", self.exclude_by)):
            if v is not None and (not isinstance(v, str) or not v.strip()):
                raise InductionLabError(f"{flag} {v!r}: give a score name, e.g. {', '.join(SCORE_NAMES[:3])}")
        if self.exclude_by is not None and self.exclude_by == self.rank_by:
            raise InductionLabError(f"--exclude-by {self.exclude_by} is the ranking itself (--rank-by); exclude another "
                                    "score's top heads")
        wanted = [(fl, v) for fl, v in (("--rank-by", self.rank_by), ("--exclude-by", self.exclude_by))
                  if v is not None and v not in SCORE_NAMES]
        if self.scores_file is None:
            for fl, v in wanted:
                raise InductionLabError(f"{fl} {v}: not a head score this command computes ({', '.join(SCORE_NAMES)}); "
                                        f"give --scores-file with a {v} column to rank by a score from another run")
            return
        if not wanted:
            raise InductionLabError(f"--scores-file {self.scores_file}: no --rank-by / --exclude-by names one of its "
                                    f"columns (the computed scores {', '.join(SCORE_NAMES)} are the run's own); "
                                    "name a column or drop the file")
        columns = score_file_columns(self.scores_file)
        for fl, v in wanted:
            if v not in columns:
                raise InductionLabError(f"{fl} {v}: --scores-file {self.scores_file} has no column {v!r}; its score "
                                        f"columns: {', '.join(columns) or '(none)'}")

    @property
    def label(self) -> str:
        """The ranked conditions' kind (``induction``, ``previous_token``, ``fv-excl-induction``):
        :func:`~inductionlab.core.ablation.ranked_label`."""
        return self.rank_by if self.exclude_by is None else f"{self.rank_by}-excl-{self.exclude_by}"

    def check_exclusion(self, ks: Sequence[int], n_total: int) -> None:
        """Every selection size leaves enough heads after ``--exclude-by``'s top heads are removed.

        Raises:
            InductionLabError: a size larger than the heads left."""
        if self.exclude_by is None:
            return
        from ..core.ablation import excluded_count   # here: this module loads no torch

        gone = excluded_count(n_total, self.exclude_fraction)
        for k in ks:
            if k > n_total - gone:
                raise InductionLabError(f"k={k}: only {n_total - gone} of {n_total} heads remain after excluding the "
                                        f"top {gone} by {self.exclude_by} (--exclude-fraction {self.exclude_fraction}); "
                                        "lower k or --exclude-fraction")

    def score_tables(self, shape: tuple[int, int]) -> dict:
        """The scores file's columns named by ``--rank-by`` / ``--exclude-by`` as ``[n_layers, n_heads]``
        arrays (empty without a file; a name the command computes is the run's own, never the file's).

        Raises:
            InductionLabError: a file that does not hold one finite number per head of the model."""
        if self.scores_file is None:
            return {}
        names = [v for v in (self.rank_by, self.exclude_by) if v is not None and v not in SCORE_NAMES]
        return read_score_file(self.scores_file, shape, names)

    def params(self) -> dict:
        """What the run's params add for this config beyond its fields: the scores file's SHA-256, so a
        resume against a changed file is refused like any other change of options."""
        if self.scores_file is None:
            return {}
        import hashlib

        return {"scores_file_sha256": hashlib.sha256(_read_bytes(self.scores_file)).hexdigest()}


@dataclass
class AblationConfig(RankingConfig):
    """The ablation conditions of SPEC §4: the top-k induction heads vs k random heads outside the top N
    (several seeded draws), for each k, with one method. The ranking is any head score (``rank_by``, also a
    column of ``scores_file``), optionally without another score's top heads (``exclude_by``,
    ``exclude_fraction``), and the random control may draw from all heads (``random="all"``): SPEC §10's
    selection (Yin & Steinhardt 2025). The defaults are SPEC §4's conditions, unchanged."""
    method: str = opt(DEFAULT_METHOD, "Ablation method (zero: the paper's attention scores set to −∞; resample: "
                                      "the head's output on random tokens).", choices=ablation_method_names())
    positions: str = opt("all", "Where an output-edit ablation applies: every position, or the last of each forward "
                                "(Yin & Steinhardt 2025).", choices=ABLATION_POSITIONS)
    ks: tuple[int, ...] | None = opt(None, "Numbers of heads to ablate, comma-separated.",
                                     none="10,20,50,100 clipped or scaled to the model's heads")
    n_draws: int = opt(3, "Random-head draws per k.")
    exclude_top_n: int | None = opt(None, "Random heads come from outside the top N of the ranking (--rank-by).",
                                    none="min(300, heads/2)", source="SPEC §4", aliases=("--exclude-top",))

    def validate(self) -> None:
        """Raises InductionLabError: unknown method, a k below 1 or repeated, draws outside 1 ..
        :data:`~inductionlab.checks.MAX_DRAWS`, a negative exclusion, a bad selection option
        (:meth:`RankingConfig._validate_selection`)."""
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
        self._validate_selection()

    def top_n(self, n_total: int) -> int:
        """N, the ranking's top heads the random draws avoid: ``--exclude-top-n`` or min(300, heads // 2)
        (SPEC §4); 0 under ``--random all``."""
        from ..core.ablation import default_exclude_top_n   # here: this module loads no torch

        if self.random == "all":
            return 0
        return default_exclude_top_n(n_total) if self.exclude_top_n is None else int(self.exclude_top_n)

    def check_model(self, ks: Sequence[int], n_total: int) -> None:
        """The checks that need the model's head count, before anything runs: every k leaves room for the
        random draws (:func:`check_ks`) and for the ranked selection after the exclusion.

        Raises:
            InductionLabError: a k too large for either."""
        check_ks(ks, n_total, self.top_n(n_total))
        self.check_exclusion(ks, n_total)

    def conditions(self, scores, ks, *, seed: int = 0, intact: bool = True, exclude_top_n: int | None = None):
        """The conditions of this config (:func:`~inductionlab.core.ablation.ranked_conditions`): ``scores``,
        name -> ``[n_layers, n_heads]`` (the run's head scores with :meth:`score_tables`); ``exclude_top_n``:
        N as the run settled it (:meth:`top_n`), ignored under ``--random all``."""
        from ..core.ablation import ranked_conditions

        return ranked_conditions(scores, ks, rank_by=self.rank_by, exclude_by=self.exclude_by,
                                 exclude_fraction=self.exclude_fraction, random=self.random, n_draws=self.n_draws,
                                 exclude_top_n=None if self.random == "all" else exclude_top_n, seed=seed,
                                 intact=intact)


def _read_bytes(path) -> bytes:
    from ..documents import read_bytes

    try:
        return read_bytes(path, "--scores-file")
    except OSError as e:
        raise InductionLabError(f"--scores-file {path}: cannot read it ({e.strerror or e}); give a CSV of per-head "
                                "scores, e.g. RUN/head_scores.csv") from None


def _read_score_csv(path):
    import io

    import pandas as pd

    raw = _read_bytes(path)
    try:
        df = pd.read_csv(io.BytesIO(raw))
    except Exception as e:   # noqa: BLE001  (pandas raises several kinds for a file that is not a CSV)
        raise InductionLabError(f"--scores-file {path}: not a CSV table ({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
                                "give columns layer, head and one per score") from None
    missing = [c for c in ("layer", "head") if c not in df.columns]
    if missing:
        raise InductionLabError(f"--scores-file {path}: no {' or '.join(missing)} column; a scores file has columns "
                                f"layer, head and one per score (it has: {', '.join(map(str, df.columns)) or 'none'})")
    return df


def score_file_columns(path) -> list[str]:
    """The score columns of a scores file (every column but ``layer`` and ``head``).

    Raises:
        InductionLabError: the file cannot be read, is not a CSV, or has no ``layer`` / ``head`` column."""
    return [str(c) for c in _read_score_csv(path).columns if c not in ("layer", "head")]


def read_score_file(path, shape: tuple[int, int], names) -> dict:
    """``{name: [n_layers, n_heads] float64}`` of the columns ``names`` of a scores file with one row per
    head (``layer``, ``head``, score columns; e.g. the ``head_scores.csv`` of any run).

    Raises:
        InductionLabError: a missing column (the message lists the file's score columns), a row count other
            than the model's heads, a head out of range or listed twice, a value that is not a finite number."""
    import numpy as np

    df = _read_score_csv(path)
    L, H = shape
    cols = [str(c) for c in df.columns if c not in ("layer", "head")]
    for n in names:
        if n not in df.columns:
            raise InductionLabError(f"--scores-file {path} has no column {n!r}; its score columns: {', '.join(cols) or '(none)'}")
    if len(df) != L * H:
        raise InductionLabError(f"--scores-file {path} has {len(df)} rows but the model has {L} layers x {H} heads = "
                                f"{L * H}; give the scores of this model (one row per head)")
    idx = {}
    for c in ("layer", "head"):
        v = pd_numeric(df[c])
        if not np.isfinite(v).all() or (v != np.round(v)).any():
            raise InductionLabError(f"--scores-file {path}: column {c} holds a value that is not an integer")
        idx[c] = v.astype(np.int64)
    if (idx["layer"] < 0).any() or (idx["layer"] >= L).any() or (idx["head"] < 0).any() or (idx["head"] >= H).any():
        raise InductionLabError(f"--scores-file {path}: a (layer, head) outside the model's {L} layers (0-{L - 1}) x "
                                f"{H} heads (0-{H - 1}); give the scores of this model")
    flat = idx["layer"] * H + idx["head"]
    if len(set(flat.tolist())) != L * H:
        raise InductionLabError(f"--scores-file {path}: a head is listed twice (and another not at all); give one "
                                "row per head")
    out = {}
    for n in names:
        v = pd_numeric(df[n])
        bad = ~np.isfinite(v)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InductionLabError(f"--scores-file {path}: column {n} at layer {idx['layer'][i]}, head {idx['head'][i]} "
                                    f"is {str(df[n].iloc[i]) or 'empty'}, not a finite number")
        t = np.empty(L * H)
        t[flat] = v
        out[n] = t.reshape(L, H)
    return out


def pd_numeric(column):
    """A column as float64, NaN where a value is not a number."""
    import numpy as np
    import pandas as pd

    return pd.to_numeric(column, errors="coerce").to_numpy(np.float64)


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
    from ..checks import TOKEN_BYTES, check_fits

    check_fits(TOKEN_BYTES * int(n_trials) * int(tokens_per_trial), option, n_trials if value is None else value,
               f"{n_trials:,} trials of ~{tokens_per_trial} tokens")


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


__all__ = ["PAPER_KS", "default_ks", "HeadScoreConfig", "RankingConfig", "AblationConfig", "RANDOM_CONTROLS", "read_score_file",
           "score_file_columns", "check_lag_headline", "check_trials_fit", "check_trial_ids",
           "check_ks"]
