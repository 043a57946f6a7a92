"""Head scores (SPEC §3): induction, anti-induction, previous-token, duplicate-token, sink, and
the fixed-offset copy scores of the training telemetry (SPEC §8).

Each score is the raw attention probability a head puts on one target key, averaged over the
queries that have a defined target and over the batch (never renormalised after dropping BOS,
so a head resting 99% on BOS scores ≈ 0 — unlike TransformerLens' ``exclude_bos``).

Every score is one entry of :data:`SCORES` (name -> :class:`ScoreSpec`): a **sequence builder**
(random rows -> token ids) and a **target rule** (query position -> key position). Scores whose
builders are the same function share one forward pass. Adding a score is one function (or a
reused builder) and one entry; :func:`compute_head_scores`, validation and the CLI read the table
(:func:`score_names`).

Sequences (p0 = 1 with BOS, else 0; S, R = T distinct random ordinary tokens each):

===================  =====================  ===================================================
score                sequence               query i → target key
===================  =====================  ===================================================
induction            [BOS] S S              i ∈ second copy → i − T + 1 (token after the earlier occurrence)
duplicate_token      [BOS] S S              i ∈ second copy → i − T (the earlier occurrence)
previous_token       [BOS] S S              every i ≥ 1 → i − 1
sink                 [BOS] S S              every i ≥ 1 → 0
anti_induction       [BOS] S reverse(S)     i ∈ reversed copy → the key just before the token's
                                            earlier occurrence (when that key is inside S)
copy_offset          [BOS] S SEP S          i = p0+T+1+j (j = 0..T−2) → i − T: the token that followed
                                            the earlier occurrence, T + 1 positions before the
                                            predicted one (the fixed offset of Bi-Induct snippets)
copy_offset_control  [BOS] S SEP R          same keys; R is fresh, so only a positional copier scores
===================  =====================  ===================================================

Also the induction loss: mean next-token loss (nats) on the first copy vs the second copy of
``[BOS] S S``, and the attention CRP (:func:`attention_crp`, Ji-An et al. 2024): per head the attention from
second-copy queries to first-copy keys by lag from the earlier occurrence, one reduction per lag.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np
import torch

from ..errors import InductionLabError
from ..names import SCORE_NAMES as _SCORE_NAMES
from ..runtime import distributed as D
from .attention import gather_targets
from .instrument import instrument, unwrap_model
from .models import attention_shape, forward
from .placement import execution_device
from .stimuli import ordinary_token_ids, random_sequences


@dataclass(frozen=True)
class Stimulus:
    """The random rows one batch of a score is built from.

    Attributes:
        S: LongTensor ``[B, T]`` distinct random ordinary tokens per row.
        R: LongTensor ``[B, T]`` independent rows (for control scores), or None.
        bos_id, sep_id: BOS prepended to every sequence (None: none); separator token.
    """
    S: torch.Tensor
    R: torch.Tensor | None = None
    bos_id: int | None = None
    sep_id: int | None = None

    def join(self, *parts) -> torch.Tensor:
        """``[BOS] part part ...`` as ``[B, n]``; an int part is one column of that token."""
        B = self.S.shape[0]
        col = lambda t: torch.full((B, 1), int(t), dtype=self.S.dtype)  # noqa: E731
        cols = [col(self.bos_id)] if self.bos_id is not None else []
        cols += [col(p) if isinstance(p, int) else p for p in parts]
        return torch.cat(cols, dim=1)


@dataclass(frozen=True)
class ScoreSpec:
    """One entry of :data:`SCORES`.

    Attributes:
        name: the score's name (``compute_head_scores(names=)``, CLI choice, results key).
        description: one line for help texts.
        build: ``build(stimulus) -> LongTensor [B, n]``, the sequences the score is read on.
            Scores with the same ``build`` function share one forward pass.
        targets: ``targets(T, bos) -> LongTensor [n]``: target key per query position, ``-1``
            where a query has none (``T`` = tokens per row of S, ``bos`` = BOS prepended).
        needs_control: ``build`` reads ``stimulus.R`` (a second set of random rows).
        needs_sep: ``build`` reads ``stimulus.sep_id``.
    """
    name: str
    description: str
    build: Callable[[Stimulus], torch.Tensor]
    targets: Callable[[int, bool], torch.Tensor]
    needs_control: bool = False
    needs_sep: bool = False


# -- sequence builders ---------------------------------------------------------------------

def repeated(st: Stimulus) -> torch.Tensor:
    """``[BOS] S S``."""
    return st.join(st.S, st.S)


def reversed_repeat(st: Stimulus) -> torch.Tensor:
    """``[BOS] S reverse(S)``."""
    return st.join(st.S, st.S.flip(1))


def copy_offset_snippet(st: Stimulus) -> torch.Tensor:
    """``[BOS] S SEP S``."""
    return st.join(st.S, st.sep_id, st.S)


def copy_offset_control_snippet(st: Stimulus) -> torch.Tensor:
    """``[BOS] S SEP R``."""
    return st.join(st.S, st.sep_id, st.R)


# -- target rules --------------------------------------------------------------------------

def _blank(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.arange(n), torch.full((n,), -1, dtype=torch.long)


def induction_targets(T: int, bos: bool) -> torch.Tensor:
    p0 = int(bos)
    i, t = _blank(p0 + 2 * T)
    second = i >= p0 + T
    t[second] = i[second] - T + 1
    return t


def duplicate_token_targets(T: int, bos: bool) -> torch.Tensor:
    p0 = int(bos)
    i, t = _blank(p0 + 2 * T)
    second = i >= p0 + T
    t[second] = i[second] - T
    return t


def previous_token_targets(T: int, bos: bool) -> torch.Tensor:
    i, t = _blank(int(bos) + 2 * T)
    t[1:] = i[1:] - 1
    return t


def sink_targets(T: int, bos: bool) -> torch.Tensor:
    _, t = _blank(int(bos) + 2 * T)
    t[1:] = 0
    return t


def anti_induction_targets(T: int, bos: bool) -> torch.Tensor:
    p0 = int(bos)
    i, t = _blank(p0 + 2 * T)
    second = i >= p0 + T
    j = i - (p0 + T)                   # 0..T-1 inside the reversed copy
    earlier = p0 + T - 1 - j           # earlier occurrence of the same token
    ok = second & (earlier - 1 >= p0)
    t[ok] = earlier[ok] - 1
    return t


def copy_offset_targets(span_length: int, bos: bool) -> torch.Tensor:
    """Target key per query for ``[BOS] S SEP X`` with ``|S| = |X| = L``: LongTensor [2L + 1 + bos].

    Query q = p0 + L + 1 + j (holding X[j], j = 0..L-2) → key q − L = p0 + 1 + j; other queries −1.
    """
    L, p0 = span_length, int(bos)
    _, t = _blank(p0 + 2 * L + 1)
    q = torch.arange(p0 + L + 1, p0 + 2 * L)
    t[q] = q - L
    return t


#: The head scores: name -> :class:`ScoreSpec`. Add a score with one function and one entry.
SCORES: dict[str, ScoreSpec] = {s.name: s for s in (
    ScoreSpec("induction", "attention to the token after the earlier occurrence (Olsson et al. 2022)",
              repeated, induction_targets),
    ScoreSpec("anti_induction", "attention to the token before the earlier occurrence, on a reversed copy",
              reversed_repeat, anti_induction_targets),
    ScoreSpec("previous_token", "attention to the previous position", repeated, previous_token_targets),
    ScoreSpec("duplicate_token", "attention to the earlier occurrence of the same token", repeated,
              duplicate_token_targets),
    ScoreSpec("sink", "attention to the first position (BOS)", repeated, sink_targets),
    ScoreSpec("copy_offset", "attention to the key T positions back on [BOS] S SEP S (Bi-Induct offset)",
              copy_offset_snippet, copy_offset_targets, needs_sep=True),
    ScoreSpec("copy_offset_control", "the copy_offset keys on [BOS] S SEP R (fresh R: positional copying only)",
              copy_offset_control_snippet, copy_offset_targets, needs_control=True, needs_sep=True),
)}

#: The scores `analyze` and `compute_head_scores` compute by default (SPEC §3).
SCORE_NAMES = _SCORE_NAMES   # declared in names.py (no torch: the CLI reads it)
assert set(SCORE_NAMES) <= set(SCORES), "names.SCORE_NAMES names a score missing from SCORES"


def score_names() -> tuple[str, ...]:
    """Names of every registered head score (CLI choices, validation)."""
    return tuple(SCORES)


def score_spec(name: str) -> ScoreSpec:
    """The registry entry of ``name``. Raises InductionLabError listing the known scores."""
    try:
        return SCORES[name]
    except (KeyError, TypeError):
        raise InductionLabError(f"unknown head score {name!r}; use one of {', '.join(score_names())}") from None


def score_targets(name: str, seq_len: int, bos: bool = True) -> torch.Tensor:
    """Target key index per query position for a score; ``-1`` where a query has no target.

    Args:
        name: a name in :data:`SCORES`.
        seq_len: T, the length of S.

    Returns: LongTensor ``[n]`` (``p0 + 2T`` for the repeat scores, ``p0 + 2T + 1`` for copy offset).
    """
    return score_spec(name).targets(seq_len, bos)


def build_sequences(S: torch.Tensor, name: str, bos_id: int | None, *, R: torch.Tensor | None = None,
                    sep_id: int | None = None) -> torch.Tensor:
    """The sequences of score ``name`` from ``S`` ``[B, T]`` (e.g. ``[BOS] S S``)."""
    return score_spec(name).build(Stimulus(S, R, bos_id, sep_id))


def induction_sequence(model, seqs: "ScoreSequences | None" = None, *, tokenizer=None, **fields) -> torch.Tensor:
    """One ``[BOS] S S`` sequence of the induction score (S: ``seq_len`` distinct random ordinary tokens):
    the first sequence :func:`compute_head_scores` draws with the same :class:`ScoreSequences` and tokenizer
    (the sequence to look at a head's pattern on, :func:`~inductionlab.core.instrument.attention_patterns`).

    Args: as :func:`compute_head_scores` (``model`` a transformers causal LM or a LoadedModel bundle, whose
        tokenizer is then used when ``tokenizer`` is None; its BOS when ``seqs.bos_id`` is None; explicit
        ``sequences``: their first row).

    Returns: LongTensor ``[p0 + 2 * seq_len]`` (p0 = 1 with a BOS, else 0); the induction target of query
    ``i`` in the second copy is key ``i - seq_len + 1`` (:func:`induction_targets`).

    Raises:
        InductionLabError: seq_len below 2 or beyond the ordinary tokens, a sequence longer than the context.
        TypeError: a keyword that is no field of :class:`ScoreSequences`.
    """
    model, tokenizer, sq = ScoreSequences.of(seqs, fields, "induction_sequence").resolved(model, tokenizer)
    shape = attention_shape(model.config)
    n, ctx = int(sq.bos_id is not None) + 2 * sq.seq_len, shape["max_position_embeddings"]
    if ctx and n > ctx:
        raise InductionLabError(f"sequence of {n} tokens exceeds the model's context of {ctx}; use a smaller seq_len")
    S = sq.sequences
    if S is None:
        S = random_sequences(sq.token_pool(shape["vocab_size"], tokenizer), 1, sq.seq_len, sq.seed)
    return build_sequences(S[:1], "induction", sq.bos_id)[0]


def score_from_pattern(pattern: torch.Tensor, name: str, seq_len: int, bos: bool = True) -> np.ndarray:
    """Score heads from full attention patterns (for hand-built patterns and cross-checks).

    Args:
        pattern: ``[B, H, Q, K]`` attention probabilities on the score's sequence.

    Returns: ``[H]`` float64 scores (mean over batch and target-bearing queries).
    """
    t = score_targets(name, seq_len, bos)
    mass = gather_targets(pattern, t)                       # [B, H, Q]
    valid = (t >= 0).float()
    return (mass * valid).sum(-1).mean(0).double().div(valid.sum()).numpy()


@dataclass
class HeadScores:
    """Per-head scores of one model.

    Attributes:
        scores: name -> float64 ``[n_layers, n_heads]`` in [0, 1] (attention probability).
        induction_loss: ``{"first_copy": nats, "second_copy": nats}`` mean next-token loss
            (empty when not computed).
        params: the parameters used (seq_len, batch_size, n_batches, seed, bos_id, pool size).
    """
    scores: dict[str, np.ndarray]
    induction_loss: dict[str, float]
    params: dict = field(default_factory=dict)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.scores[name]

    def to_dict(self) -> dict:
        return {**{k: v.tolist() for k, v in self.scores.items()}, "induction_loss": self.induction_loss}


def _mean_over_queries(reduced: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``reduced`` [L, B, H, Q] -> sum over batch of per-sequence query means, [L, H] float64."""
    valid = (t >= 0).double()
    return (reduced.double() * valid).sum(-1).div(valid.sum()).sum(1)


def _count(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise InductionLabError(f"{name}={value!r} must be an integer >= {minimum}")
    return int(value)


@dataclass(frozen=True, eq=False)
class ScoreSequences:
    """The sequences S (and R) that :func:`compute_head_scores` and :func:`attention_crp` read, as one value: random
    rows of distinct ordinary tokens, or explicit ones (SPEC §3: ``[BOS] S S``, T = 50, 16 sequences).

    Attributes:
        seq_len: T, tokens per row of S, at least 2 (explicit ``sequences``: their length).
        batch_size, n_batches: sequences per forward pass and number of passes (default 16 × 1).
        seed: seed of the random rows (:func:`~inductionlab.core.stimuli.random_sequences`).
        bos_id: BOS token prepended to each sequence (None: the tokenizer's BOS; none without one).
        vocab_size: size of the id range sampled (None: the model's vocabulary).
        exclude_ids: more ids never sampled (besides the tokenizer's special and added ids, which never are).
        pool: explicit LongTensor of ids to sample S (and R) from, instead of the vocabulary minus special tokens
            and ``exclude_ids``.
        sequences: explicit S, ``[N, T]`` ids, instead of random rows (batched by ``batch_size``).
        control_sequences: explicit R ``[N, T]`` for control scores when ``sequences`` is given (random rows
            otherwise: S and R are the first and second N rows of one seeded draw, so S does not depend on
            whether a control score is asked).
        sep_id: separator of the copy-offset snippets (None: the pool's first id).
    """
    seq_len: int = 50
    batch_size: int = 16
    n_batches: int = 1
    seed: int = 0
    bos_id: int | None = None
    vocab_size: int | None = None
    exclude_ids: tuple = ()
    pool: torch.Tensor | None = None
    sequences: torch.Tensor | None = None
    control_sequences: torch.Tensor | None = None
    sep_id: int | None = None

    @classmethod
    def of(cls, seqs: "ScoreSequences | None", fields: dict, who: str) -> "ScoreSequences":
        """``seqs`` (None: the defaults) with ``fields`` (keyword arguments of ``who``) replacing its own.

        Raises: TypeError for a keyword that is no field (named with ``who``)."""
        base = cls() if seqs is None else seqs
        if not isinstance(base, cls):
            raise TypeError(f"{who}(): the sequences must be a ScoreSequences, got {type(base).__name__}; pass "
                            "ScoreSequences(seq_len=..., ...) or its fields as keywords (a tokenizer as tokenizer=)")
        bad = sorted(set(fields) - set(cls.__dataclass_fields__))
        if bad:
            raise TypeError(f"{who}() got unexpected keyword argument(s) {', '.join(bad)}; the sequence fields are "
                            f"{', '.join(cls.__dataclass_fields__)}")
        return replace(base, **fields) if fields else base

    def resolved(self, model, tokenizer=None) -> tuple[torch.nn.Module, object, "ScoreSequences"]:
        """What every ``[BOS] S S`` reduction normalises the same way: the bare model (a LoadedModel's tokenizer
        taken when none is given), ``bos_id`` from the tokenizer, explicit ``sequences`` as a LongTensor ``[N, T]``
        (then ``seq_len`` = T), and the counts checked.

        Returns: ``(model, tokenizer, sequences)``.

        Raises: InductionLabError for a count below range or sequences that are not a non-empty ``[N, T]``."""
        if tokenizer is None and not isinstance(model, torch.nn.Module):
            tokenizer = getattr(model, "tokenizer", None)
        model = unwrap_model(model)
        kw = {"batch_size": _count("batch_size", self.batch_size), "n_batches": _count("n_batches", self.n_batches)}
        if self.bos_id is None and tokenizer is not None:
            kw["bos_id"] = tokenizer.bos_token_id
        if self.sequences is None:
            kw["seq_len"] = _count("seq_len", self.seq_len, 2)
        else:
            S = torch.as_tensor(self.sequences, dtype=torch.long)
            if S.dim() != 2 or S.shape[0] < 1:
                raise InductionLabError(f"sequences must be a non-empty [N, T] id tensor, got shape {tuple(S.shape)}")
            kw["sequences"] = S
            kw["seq_len"] = _count("sequence length (sequences.shape[1])", S.shape[1], 2)
        return model, tokenizer, replace(self, **kw)

    def token_pool(self, vocab_size: int, tokenizer=None) -> torch.Tensor:
        """The ids random rows are drawn from: ``pool``, else ``0..V-1`` (``V``: ``self.vocab_size`` or the
        model's ``vocab_size``) minus the tokenizer's special ids and ``exclude_ids``. LongTensor ``[V']``."""
        if self.pool is not None:
            return self.pool
        return ordinary_token_ids(self.vocab_size or vocab_size, self.exclude_ids, tokenizer)


def check_score_names(names) -> tuple[str, ...]:
    """``names`` (one name or an iterable) as a tuple of known, distinct names.

    Raises:
        InductionLabError: empty, or a name not in :data:`SCORES` (the message lists them).
    """
    names = (names,) if isinstance(names, str) else tuple(names)
    if not names:
        raise InductionLabError(f"no head score named; use some of {', '.join(score_names())}")
    for n in names:
        score_spec(n)
    return tuple(dict.fromkeys(names))


def compute_head_scores(model, seqs: ScoreSequences | None = None, *, tokenizer=None, names=SCORE_NAMES,
                        induction_loss: bool = True, progress=None, dist=None, **fields) -> HeadScores:
    """Score every head of ``model`` on random repeated sequences.

    Args:
        model: a transformers causal LM, or a LoadedModel bundle (its tokenizer is then used
            when ``tokenizer`` is None).
        seqs: the sequences (:class:`ScoreSequences`: T, batches, seed, BOS, the id pool or explicit rows);
            None: its defaults.
        tokenizer: optional; its special / added tokens are excluded from the random pool and
            its BOS is used when ``seqs.bos_id`` is None.
        names: which scores to compute (names in :data:`SCORES`).
        induction_loss: also compute the induction loss (full-vocabulary logits, one sequence at a
            time); without it the forward keeps only the last position's logits.
        progress: optional callable(n) with the sequences done.
        dist: a :class:`~inductionlab.runtime.distributed.Dist` to shard the batches over (every rank calls
            with the same arguments and gets the same scores): batch ``b`` runs on rank
            ``b % world_size``; the per-batch sums are gathered and added in batch order, so the
            scores are those of one process. None: one process.
        fields: fields of :class:`ScoreSequences` replacing those of ``seqs`` (``seq_len=12, seed=3``).

    Returns: :class:`HeadScores`. Scoring in batches equals scoring one sequence at a time
    (each sequence weighs equally; within float tolerance).

    Raises:
        InductionLabError: unknown score name, seq_len / batch_size / n_batches below range,
            sequences longer than the model's context, a pool smaller than seq_len.
        TypeError: a keyword that is no field of :class:`ScoreSequences`.
    """
    model, tokenizer, sq = ScoreSequences.of(seqs, fields, "compute_head_scores").resolved(model, tokenizer)
    seq_len, batch_size, bos_id = sq.seq_len, sq.batch_size, sq.bos_id
    names = check_score_names(names)
    specs = [SCORES[n] for n in names]
    shape = attention_shape(model.config)
    device = execution_device(model)
    need_R = any(s.needs_control for s in specs)
    R = None
    bos = bos_id is not None
    targets = {s.name: s.targets(seq_len, bos) for s in specs}
    ctx = shape["max_position_embeddings"]
    longest = max(len(t) for t in targets.values())
    if ctx and longest > ctx:
        raise InductionLabError(f"sequence of {longest} tokens exceeds the model's context of {ctx}; "
                                "use a smaller seq_len")
    sequences, sep_id = sq.sequences, sq.sep_id
    if sequences is None:
        N = batch_size * sq.n_batches
        pool = sq.token_pool(shape["vocab_size"], tokenizer)
        rows = random_sequences(pool, 2 * N if need_R else N, seq_len, sq.seed)
        sequences, R = rows[:N], (rows[N:] if need_R else None)
    elif need_R:
        if sq.control_sequences is None:
            raise InductionLabError("a control score with explicit sequences needs control_sequences ([N, T])")
        R = torch.as_tensor(sq.control_sequences, dtype=torch.long)
        if R.shape != sequences.shape:
            raise InductionLabError(f"control_sequences shape {tuple(R.shape)} must equal sequences' "
                                    f"{tuple(sequences.shape)}")
    if sep_id is None and any(s.needs_sep for s in specs):
        sep_id = int(sq.token_pool(shape["vocab_size"], tokenizer)[0])
    groups: dict[Callable, list[ScoreSpec]] = {}       # one forward per sequence builder
    for s in specs:
        groups.setdefault(s.build, []).append(s)
    if induction_loss:
        groups.setdefault(repeated, [])
    L, H = shape["n_layers"], shape["n_heads"]
    N = sequences.shape[0]
    p0 = int(bos)
    parts = []                          # per batch: ({score: [L, H] float64 sum}, {copy: loss sum})
    with torch.inference_mode():
        for start in D.local_batches(N, batch_size, dist):     # all of them on one process
            st = Stimulus(sequences[start:start + batch_size], None if R is None else R[start:start + batch_size],
                          bos_id, sep_id)
            part: tuple[dict, dict] = ({}, {})
            for build, members in groups.items():
                ids = build(st).to(device)
                red = {s.name: targets[s.name] for s in members}
                with instrument(model, reductions=red) as inst:
                    nll = _forward(model, ids, with_loss=induction_loss and build is repeated)
                for n in red:
                    part[0][n] = _mean_over_queries(inst.reduced[n], targets[n]).cpu()
                if nll is not None:                                   # predicts token at position 1..n-1
                    part[1]["first_copy"] = nll[:, p0:p0 + seq_len - 1].mean(1).sum().item()
                    part[1]["second_copy"] = nll[:, p0 + seq_len - 1:].mean(1).sum().item()
            parts.append(part)
            if progress is not None and (dist is None or dist.is_main):
                progress(D.round_size(start, N, batch_size, dist))
    sums = {n: torch.zeros(L, H, dtype=torch.float64) for n in names}
    loss_sum = {"first_copy": 0.0, "second_copy": 0.0}
    for part_sums, part_loss in D.gather_batches(parts, -(-N // batch_size), dist):   # in batch order
        for n, v in part_sums.items():
            sums[n] += v
        for k, v in part_loss.items():
            loss_sum[k] += v
    scores = {n: (sums[n] / N).numpy() for n in names}
    params = {"seq_len": seq_len, "batch_size": batch_size, "n_sequences": N, "seed": sq.seed, "bos_id": bos_id,
              "definition": "raw attention probability on the target key (SPEC §3), mean over target-bearing queries"}
    if any(s.needs_sep for s in specs):
        params["sep_id"] = sep_id
    loss = {k: v / N for k, v in loss_sum.items()} if induction_loss else {}
    return HeadScores(scores, loss, params)


#: Lags of the attention CRP: −8..+8 (Ji-An et al. 2024 keep ±8 and fit ±5).
CRP_MAX_LAG = 8


def lag_targets(T: int, bos: bool, lag: int) -> torch.Tensor:
    """Target key per query of ``[BOS] S S`` for one lag of the attention CRP: LongTensor ``[p0 + 2T]``.

    Query ``p0 + T + j`` (second copy, holding ``S[j]``) → key ``p0 + j + lag`` (``lag`` positions after
    the query token's earlier occurrence) when that key is in the first copy (``0 ≤ j + lag ≤ T − 1``);
    other queries −1. ``lag = +1`` is the induction target, ``lag = 0`` the duplicate-token one."""
    p0 = int(bos)
    _, t = _blank(p0 + 2 * T)
    j = torch.arange(T)
    ok = (j + lag >= 0) & (j + lag <= T - 1)
    t[p0 + T + j[ok]] = p0 + j[ok] + lag
    return t


def check_lag_window(max_lag, seq_len: int) -> int:
    """``max_lag`` as an int, checked against T = ``seq_len``.

    Raises:
        InductionLabError: ``max_lag`` not an integer in ``1..seq_len − 1`` (lag ±max_lag needs a first-copy key)."""
    if isinstance(max_lag, bool) or not isinstance(max_lag, (int, np.integer)) or not 1 <= max_lag <= seq_len - 1:
        raise InductionLabError(f"attention-CRP lag window ±{max_lag!r} does not fit copies of {seq_len} tokens; "
                                f"give a max lag in 1..{seq_len - 1} or a longer seq_len")
    return int(max_lag)


def crp_from_pattern(pattern: torch.Tensor, seq_len: int, bos: bool = True, max_lag: int = CRP_MAX_LAG) -> np.ndarray:
    """Attention CRP from full attention patterns (hand-built patterns and cross-checks of :func:`attention_crp`).

    Args:
        pattern: ``[B, H, Q, K]`` attention probabilities on ``[BOS] S S``.

    Returns: float64 ``[H, 2·max_lag + 1]``, lags −max_lag..max_lag: per lag, the mean over sequences of the
    mean over the second-copy queries whose key at that lag is in the first copy."""
    check_lag_window(max_lag, seq_len)
    out = []
    for lag in range(-max_lag, max_lag + 1):
        t = lag_targets(seq_len, bos, lag)
        mass = gather_targets(pattern, t).double()          # [B, H, Q]
        valid = (t >= 0).double()
        out.append(((mass * valid).sum(-1) / valid.sum()).mean(0))
    return torch.stack(out, -1).numpy()


@dataclass
class AttentionCRP:
    """Per-head attention CRP (Ji-An et al. 2024). ``profile``: float64 ``[n_layers, n_heads, 2·max_lag + 1]``
    (lags ``lags``); ``params``: seq_len, n_sequences, seed, bos_id, max_lag, definition."""
    profile: np.ndarray
    lags: np.ndarray
    params: dict


def attention_crp(model, seqs: ScoreSequences | None = None, *, tokenizer=None, max_lag: int = CRP_MAX_LAG,
                  progress=None, dist=None, **fields) -> AttentionCRP:
    """Every head's attention CRP on ``[BOS] S S``: the attention probability from each second-copy query to the
    first-copy key ``lag`` positions after the query token's earlier occurrence, for lags −max_lag..max_lag (an
    induction head peaks at +1, a duplicate-token head at 0) — Ji-An, Zhou, Benna & Mattar 2024 (arXiv
    2405.14992), on the sequences of the induction score (same ``seed`` and pool: the same S).

    Raw probability (never renormalised over the first copy), averaged as the head scores are: per sequence over
    the queries that have a first-copy key at that lag (T − |lag| of them), then over sequences. Each lag is one
    target reduction inside the attention call (:mod:`inductionlab.core.attention`; the fused kernel's
    log-sum-exp on CPU, query-head indexed, so GQA-safe); no ``[Q, K]`` pattern is kept. (The authors' stored
    profiles are pre-softmax attention scores, not probabilities: see docs/study-head-types.md.)

    Args: as :func:`compute_head_scores` (``seqs``: the sequences; control rows and the separator unused), and
        max_lag: lags kept, at most ``seq_len − 1`` (default 8).

    Returns: :class:`AttentionCRP`, ``profile`` ``[n_layers, n_heads, 2·max_lag + 1]``. Sharded over ``dist`` as
    :func:`compute_head_scores` (the result is that of one process).

    Raises:
        InductionLabError: the lag window does not fit ``seq_len``; what :func:`compute_head_scores` refuses."""
    model, tokenizer, sq = ScoreSequences.of(seqs, fields, "attention_crp").resolved(model, tokenizer)
    seq_len, batch_size, bos_id, sequences = sq.seq_len, sq.batch_size, sq.bos_id, sq.sequences
    shape = attention_shape(model.config)
    device = execution_device(model)
    max_lag = check_lag_window(max_lag, seq_len)
    bos = bos_id is not None
    ctx = shape["max_position_embeddings"]
    if ctx and int(bos) + 2 * seq_len > ctx:
        raise InductionLabError(f"sequence of {int(bos) + 2 * seq_len} tokens exceeds the model's context of {ctx}; "
                                "use a smaller seq_len")
    if sequences is None:
        sequences = random_sequences(sq.token_pool(shape["vocab_size"], tokenizer), batch_size * sq.n_batches, seq_len,
                                     sq.seed)
    lags = list(range(-max_lag, max_lag + 1))
    targets = {f"lag{d:+d}": lag_targets(seq_len, bos, d) for d in lags}
    L, H = shape["n_layers"], shape["n_heads"]
    N = sequences.shape[0]
    every = repeated(Stimulus(sequences, None, bos_id))                # [N, p0 + 2T], batched below
    parts = []
    with torch.inference_mode():
        for start in D.local_batches(N, batch_size, dist):
            ids = every[start:start + batch_size].to(device)
            with instrument(model, reductions=targets) as inst:
                _forward(model, ids, with_loss=False)
            parts.append(torch.stack([_mean_over_queries(inst.reduced[n], t) for n, t in targets.items()], -1).cpu())
            if progress is not None and (dist is None or dist.is_main):
                progress(D.round_size(start, N, batch_size, dist))
    total = torch.zeros(L, H, len(lags), dtype=torch.float64)
    for p in D.gather_batches(parts, -(-N // batch_size), dist):
        total += p
    params = {"seq_len": seq_len, "n_sequences": N, "batch_size": batch_size, "seed": sq.seed, "bos_id": bos_id,
              "max_lag": max_lag, "definition": "raw attention probability from second-copy queries to the first-copy "
              "key at each lag from the earlier occurrence, mean over queries then sequences (Ji-An et al. 2024)"}
    return AttentionCRP((total / N).numpy(), np.asarray(lags), params)


#: Positions whose full-vocabulary logits the induction loss holds at once (memory ∝ this × vocab).
LOSS_CHUNK = 256


def _forward(model, ids: torch.Tensor, *, with_loss: bool) -> torch.Tensor | None:
    """One forward for the scores: no full-vocabulary logits unless the loss is wanted, and then
    one row and :data:`LOSS_CHUNK` positions at a time.

    Returns: float64 ``[B, n - 1]`` next-token loss (nats) per position if ``with_loss``, else None.
    The per-row logits are the model's own (its output embedding applied to its decoder's last
    hidden state, with Gemma's final soft-capping), so the loss equals the one read from
    ``model(ids).logits``; memory is ``LOSS_CHUNK × vocab`` instead of ``2 × B × n × vocab`` floats,
    so it does not grow with the sequence length.
    """
    got = {}
    decoder = model.get_decoder() if with_loss and hasattr(model, "get_decoder") else None
    head = model.get_output_embeddings() if decoder is not None else None
    if head is not None and any(type(w).__name__ == "DTensor" for w in head.parameters()):
        head = None                  # sharded (FSDP): only the model's own forward may gather it
    if decoder is not None and decoder is not model and head is not None:
        def grab(mod, args, out):
            got["h"] = out[0] if isinstance(out, tuple) else out.last_hidden_state
        hook = decoder.register_forward_hook(grab)
    else:
        hook = None
    try:
        out = forward(model, ids, keep=1 if (hook is not None or not with_loss) else None)
    finally:
        if hook is not None:
            hook.remove()
    if not with_loss:
        return None
    cap = getattr(model.config, "final_logit_softcapping", None)
    rows = []
    n = ids.shape[1]
    for b in range(ids.shape[0]):
        parts = []
        for s in range(0, n - 1, LOSS_CHUNK):              # positions s .. s+C-1 predict s+1 .. s+C
            e = min(s + LOSS_CHUNK, n - 1)
            if "h" in got:
                logits = head(got["h"][b, s:e])
                if cap is not None:
                    logits = torch.tanh(logits / cap) * cap
            else:
                logits = out.logits[b, s:e]
            parts.append(torch.log_softmax(logits.float(), -1).gather(-1, ids[b, s + 1:e + 1, None]).squeeze(-1))
        rows.append(-torch.cat(parts).cpu().double())
    return torch.stack(rows)


def copy_offset_scores(model, *, span_length: int, pool: torch.Tensor, sep_id: int | None, bos_id: int | None,
                       batch_size: int = 16, seed: int = 0) -> dict[str, np.ndarray]:
    """``copy_offset`` and ``copy_offset_control`` scores, each float64 [n_layers, n_heads]
    (one batch of ``batch_size`` snippets of span ``span_length``; the telemetry's call).

    Raises:
        InductionLabError: the snippet is longer than the model's context or the pool too small.
    """
    seqs = ScoreSequences(seq_len=span_length, batch_size=batch_size, seed=seed, bos_id=bos_id, pool=pool,
                          sep_id=sep_id)
    hs = compute_head_scores(model, seqs, names=("copy_offset", "copy_offset_control"), induction_loss=False)
    return dict(hs.scores)
