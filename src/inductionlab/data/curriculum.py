"""Protocol B1 — the Bi-Induct curriculum (SPEC §6) as a deterministic, iso-token stream.

Training windows of ``seq_len`` tokens are cut from the natural token stream; a *snippet*
``S SEP S`` (induction), ``S SEP reverse(S)`` (anti-induction) or, per snippet, one of the two
with probability ½ (balanced) replaces natural tokens inside the window, so every variant
trains on exactly the same number of tokens, windows and batches (iso-FLOPs).

How a window (one row of a batch, global index ``r``, first token ``t_r = r·seq_len``) is built:

1. Target: ``X_r = seq_len · mean_{t in window} m(t)`` synthetic tokens, with the mix ratio
   ``m(t) = m0 · max(0, 1 − t / T_a)`` (SPEC §6), averaged exactly over the window's tokens.
2. Snippet count ``k_r = floor(X_r / s̄) + Bernoulli(frac(X_r / s̄))`` where ``s̄ = 2·E[L] + 1``
   is the mean snippet length, so ``E[synthetic tokens] = X_r`` exactly. Span lengths are ``L``
   or, with ``span_length_range = (lo, hi)``, uniform integers in ``[lo, hi]`` per snippet
   (rules out a fixed copy distance ``L + 1``, SPEC §6).
3. Snippets that would overflow the window are dropped from the end, so the realised fraction
   is capped near 1 (at most ``floor(seq_len / s)·s / seq_len`` with fixed length ``s = 2L+1``);
   for ``m0 ≤ 0.5`` and ``2L+1 ≤ seq_len/2`` the cap never binds.
4. The remaining ``n_r = seq_len − synthetic`` positions hold the next ``n_r`` natural tokens,
   in order; the snippets sit between them at uniformly drawn gap positions. The natural
   stream therefore advances by exactly ``n_r``: concatenating the natural tokens of all
   windows gives the plain stream (wrapping around at its end; ``epochs`` records how often).
5. ``S`` is a span of the natural stream at a uniformly drawn offset (spans containing a
   special id are redrawn, up to 8 times), or ``L`` uniform random ids excluding the special
   ids and SEP (``span_source="random"``).

Tolerance: with a fixed L a window's snippet count is the floor or the ceiling of its target,
so its realised fraction is within ``(2L+1)/seq_len`` of the window's mean m(t); the mean over
R independent windows is then within ε of the schedule except with probability
``2·exp(−2Rε² / ((2L+1)/seq_len)²)`` (Hoeffding). After ``T_a`` every window is natural text.

Every random quantity is a pure function of ``(seed, purpose, window index, slot)`` through the
SplitMix64 finaliser (Steele, Lea & Flood 2014), so ``batch(step)`` is random access: a
restarted trainer, or a DDP rank reading its rows, gets bit-identical batches without
replaying the stream. The one piece of state, each window's offset into the natural stream,
is a cumulative sum computed once (vectorised) in ``__init__``. For the same seed the snippet
placements and spans are identical across ``induction``, ``anti`` and ``balanced``; only the
copy's direction differs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np

if TYPE_CHECKING:
    import torch

from ..config import opt
from ..errors import InductionLabError
from ..runtime.runs import physical_memory

VARIANTS = ("none", "induction", "anti", "balanced")
SPAN_SOURCES = ("natural", "random")


@dataclass
class CurriculumConfig:
    """Bi-Induct settings; defaults are SPEC §6's. Nested as ``TrainConfig.curriculum``.

    Raises (:meth:`validate`): InductionLabError naming the field and the fix.
    """
    variant: str = opt("none", "Bi-Induct variant (SPEC §6).", choices=VARIANTS, flag="--curriculum",
                       aliases=("--variant",))
    span_length: int = opt(20, "L, snippet span length in tokens.", source="SPEC §6")
    span_length_range: tuple[int, int] | None = opt(
        None, "LO,HI: draw L per snippet uniformly from [LO, HI] instead of a fixed L (SPEC §6 option).",
        flag="--span-range", metavar="LO,HI", overrides="--span-length")
    m0: float = opt(0.5, "Initial synthetic-token fraction; m(t) = m0 * max(0, 1 - t/T_a).", source="SPEC §6")
    anneal_tokens: int | None = opt(None, "T_a in tokens.", none="the whole token budget (SPEC §6)")
    span_source: str = opt("natural", "Where S comes from: natural (spans of the corpus) | random ids.",
                           choices=SPAN_SOURCES, source="decision, SPEC §6")
    sep_id: int | None = opt(None, "SEP token id.", none="the corpus' newline token, else its space token")
    seed: int | None = opt(None, "Seed of snippet placement.", none="the run's --seed; 0 outside a run", cli=False)

    def __post_init__(self) -> None:
        if isinstance(self.span_length_range, list):
            self.span_length_range = tuple(self.span_length_range)

    def length_bounds(self) -> tuple[int, int]:
        """(lo, hi) of the span length L."""
        if self.span_length_range is not None:
            lo, hi = self.span_length_range
            return int(lo), int(hi)
        return int(self.span_length), int(self.span_length)

    def validate(self) -> None:
        """Check every field on its own (the stream checks the fit to ``seq_len`` and the data).

        Raises:
            InductionLabError: unknown variant or span source, m0 not in [0, 1] (or NaN), span
                length < 1, a range with lo > hi, anneal_tokens <= 0, negative sep_id or seed, a NaN /
                infinite / beyond-64-bit number.
            TypeError: a number field of the wrong type.
        """
        if self.variant not in VARIANTS:
            raise InductionLabError(f"unknown curriculum variant {self.variant!r}; use one of {', '.join(VARIANTS)}")
        if self.span_source not in SPAN_SOURCES:
            raise InductionLabError(f"unknown span source {self.span_source!r}; use natural or random")
        if not (isinstance(self.m0, (int, float)) and 0.0 <= self.m0 <= 1.0):
            raise InductionLabError(f"m0 must be in [0, 1] (a fraction of training tokens), got {self.m0}")
        r = self.span_length_range
        if r is not None and (len(r) != 2 or not all(isinstance(x, int) for x in r)):
            raise InductionLabError(f"span_length_range must be two integers LO,HI (e.g. 10,30), got {r!r}")
        lo, hi = self.length_bounds()
        if lo < 1 or hi < lo:
            raise InductionLabError(f"span length must be >= 1 (range lo <= hi), got {r or self.span_length}")
        if self.anneal_tokens is not None and self.anneal_tokens <= 0:
            raise InductionLabError(f"anneal_tokens must be > 0 (or unset = the full budget), got {self.anneal_tokens}")
        if self.sep_id is not None and self.sep_id < 0:
            raise InductionLabError(f"sep_id must be a token id >= 0, got {self.sep_id}")
        if self.seed is not None and self.seed < 0:
            raise InductionLabError(f"seed must be >= 0, got {self.seed}")
        from ..checks import check_fields

        # effects=False: the Bi-Induct presets set span_length beside span_length_range (which decides alone) and
        # trained runs record both in their identity; the command line still refuses --span-length with --span-range
        check_fields(self, effects=False)


@dataclass
class Batch:
    """One training batch.

    Attributes:
        step: batch index.
        input_ids: LongTensor [batch_size, seq_len]; labels are the same ids (HF shifts them).
        synthetic_mask: BoolTensor [batch_size, seq_len], True on snippet tokens (S, SEP, copy).
        tokens_before: training tokens before this batch (= step · batch_size · seq_len).
        synthetic_fraction: realised fraction of snippet tokens in this batch.
        snippets: (row, start column, span length L, "forward" | "backward") per snippet; the
            snippet occupies columns [start, start + 2L + 1).
    """
    step: int
    input_ids: torch.Tensor
    synthetic_mask: torch.Tensor
    tokens_before: int
    synthetic_fraction: float
    snippets: list[tuple[int, int, int, str]] = field(default_factory=list)


# --- stateless randomness: SplitMix64 finaliser (Steele, Lea & Flood 2014) ----------------------

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)
_P_COUNT, _P_LEN, _P_POS, _P_DIR, _P_SPAN, _P_RAND = 1, 2, 3, 4, 5, 6
_SPAN_TRIES = 8


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64 step on a uint64 array (wrapping arithmetic)."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _C1
    x = (x ^ (x >> np.uint64(27))) * _C2
    return x ^ (x >> np.uint64(31))


def _uniform(seed: int, purpose: int, rows: np.ndarray, slots: np.ndarray | int = 0) -> np.ndarray:
    """Uniform floats in [0, 1), a pure function of (seed, purpose, row, slot); broadcasts."""
    with np.errstate(over="ignore"):
        key = _mix(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64) ^ np.uint64(purpose))
        h = _mix(key ^ np.asarray(rows, dtype=np.uint64))
        h = _mix(h ^ np.asarray(slots, dtype=np.uint64))
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)


def check_token_ids(tokens: np.ndarray, vocab_size: int, what: str, chunk: int = 1 << 24) -> None:
    """Raise when a token id is outside ``[0, vocab_size)`` (one pass, in chunks of a memmap).

    Raises:
        InductionLabError: the largest id is >= vocab_size (a corpus prepared with another tokenizer
            or a damaged shard).
    """
    for a in range(0, len(tokens), chunk):
        part = np.asarray(tokens[a:a + chunk])
        if part.size and (int(part.max()) >= vocab_size or int(part.min()) < 0):
            bad = int(part.max()) if int(part.max()) >= vocab_size else int(part.min())
            raise InductionLabError(f"{what} holds token id {bad}, outside the vocabulary [0, {vocab_size}); "
                                    "the shard is damaged or from another tokenizer: prepare the corpus again")


class BiInductStream:
    """Deterministic, resumable Bi-Induct batches over a natural token stream.

    Args:
        tokens: 1-D array of natural token ids (e.g. ``TokenShards.train``), documents joined by EOS.
        cfg: :class:`CurriculumConfig`.
        batch_size, seq_len: rows per batch, tokens per row.
        total_tokens: training budget in tokens; ``num_batches = total_tokens // (batch_size·seq_len)``.
        vocab_size: ids are < vocab_size (random spans draw from it).
        sep_id: SEP token id (used when ``cfg.sep_id`` is None).
        special_ids: ids never put inside S (e.g. EOS, BOS); SEP is also excluded from random S.

    Raises:
        InductionLabError: unknown variant or span source, m0 outside [0, 1], span length < 1 or
            a snippet (2L + 1 tokens) longer than ``seq_len``, budget below one batch, empty
            token stream, ids out of range.
    """

    def __init__(self, tokens: np.ndarray, cfg: CurriculumConfig, *, batch_size: int,
                 seq_len: int, total_tokens: int, vocab_size: int, sep_id: int,
                 special_ids: Sequence[int] = ()):
        self.cfg = cfg
        self.tokens = tokens
        self.batch_size, self.seq_len = int(batch_size), int(seq_len)
        self.vocab_size = int(vocab_size)
        self.sep_id = int(cfg.sep_id if cfg.sep_id is not None else sep_id)
        self.special_ids = tuple(int(i) for i in special_ids)
        self.seed = 0 if cfg.seed is None else int(cfg.seed)
        self._validate(total_tokens)
        self.tokens_per_batch = self.batch_size * self.seq_len
        self.num_batches = int(total_tokens) // self.tokens_per_batch
        self.total_tokens = self.num_batches * self.tokens_per_batch
        self.anneal_tokens = int(cfg.anneal_tokens) if cfg.anneal_tokens is not None else self.total_tokens
        self.lo, self.hi = cfg.length_bounds()
        self.active = cfg.variant != "none" and cfg.m0 > 0
        self._kmax = self.seq_len // (2 * self.lo + 1) if self.active else 0
        self._mean_snippet = 2.0 * (self.lo + self.hi) / 2.0 + 1.0
        if cfg.span_source == "random":
            allowed = np.ones(self.vocab_size, dtype=bool)
            for i in (*self.special_ids, self.sep_id):
                if 0 <= i < self.vocab_size:
                    allowed[i] = False
            self._allowed = np.flatnonzero(allowed)
            if self._allowed.size == 0:
                raise InductionLabError("no token id left for random spans after excluding the "
                                        "special ids and SEP; check vocab_size")
        # Natural tokens per window, then each window's offset into the stream (one cumsum).
        n_rows = self.num_batches * self.batch_size
        synth = np.zeros(n_rows, dtype=np.int64)
        if self.active:
            chunk = max(1, (1 << 22) // max(1, self._kmax))
            for a in range(0, n_rows, chunk):
                rows = np.arange(a, min(n_rows, a + chunk), dtype=np.int64)
                synth[a:a + rows.size] = self._plan(rows)[2]
        self._synthetic = synth
        self._offsets = np.concatenate([[0], np.cumsum(self.seq_len - synth)]).astype(np.int64)
        self.natural_tokens_used = int(self._offsets[-1])
        self.epochs = self.natural_tokens_used / len(self.tokens)

    # -- validation ----------------------------------------------------------------------------
    def _validate(self, total_tokens: int) -> None:
        c = self.cfg
        c.validate()
        if self.batch_size < 1 or self.seq_len < 1:
            raise InductionLabError(f"batch_size and seq_len must be >= 1, got "
                                    f"{self.batch_size} and {self.seq_len}")
        lo, hi = c.length_bounds()
        if c.variant != "none" and 2 * hi + 1 > self.seq_len:
            raise InductionLabError(f"span length {hi} does not fit the context: a snippet "
                                    f"S SEP copy takes 2*{hi}+1 = {2 * hi + 1} tokens > seq_len "
                                    f"{self.seq_len}; use a span length <= {(self.seq_len - 1) // 2}")
        tok = self.tokens
        if getattr(tok, "ndim", 0) != 1 or len(tok) == 0:
            raise InductionLabError("the natural token stream is empty or not 1-D; "
                                    "prepare a corpus with inductionlab corpus prepare")
        if c.variant != "none" and c.span_source == "natural" and len(tok) < hi:
            raise InductionLabError(f"the token stream ({len(tok)} tokens) is shorter than the "
                                    f"span length {hi}")
        if not 0 <= self.sep_id < self.vocab_size:
            raise InductionLabError(f"sep_id {self.sep_id} outside the vocabulary [0, {self.vocab_size})")
        check_token_ids(tok, self.vocab_size, "the natural token stream")
        if int(total_tokens) < self.batch_size * self.seq_len:
            raise InductionLabError(f"token budget {total_tokens} is below one batch "
                                    f"({self.batch_size}x{self.seq_len} = "
                                    f"{self.batch_size * self.seq_len} tokens); raise total_tokens")
        # the plan holds two int64 per window (snippet tokens, stream offset): it must fit in memory
        windows = int(total_tokens) // self.seq_len
        plan_bytes, mem = 16 * windows, physical_memory()
        if mem and plan_bytes > mem // 4:
            raise InductionLabError(f"token budget {total_tokens:,} is {windows:,} windows of {self.seq_len} tokens; "
                                    f"their plan needs {plan_bytes / 2**30:.1f} GiB, more than a quarter of this "
                                    f"machine's {mem / 2**30:.0f} GiB: lower the token budget or raise the sequence length")

    # -- schedule ------------------------------------------------------------------------------
    def expected_fraction(self, t: int) -> float:
        """m(t) = m0 · max(0, 1 − t / T_a): expected fraction of snippet tokens at training
        token t (0 for variant ``none``)."""
        if not self.active:
            return 0.0
        return float(self.cfg.m0 * max(0.0, 1.0 - t / self.anneal_tokens))

    def _window_mean(self, rows: np.ndarray) -> np.ndarray:
        """Exact mean of m(t) over each window's tokens t in [r·T, (r+1)·T)."""
        a = rows.astype(np.float64) * self.seq_len
        c = np.minimum(a + self.seq_len, float(self.anneal_tokens))
        n = np.maximum(c - a, 0.0)  # tokens of the window with t < T_a
        s = n - (a + c - 1.0) * n / (2.0 * self.anneal_tokens)
        return self.cfg.m0 * s / self.seq_len

    # -- plan ----------------------------------------------------------------------------------
    def _plan(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per window: snippet count k [R], span lengths [R, kmax] (first k valid), synthetic
        token count [R]."""
        kmax = self._kmax
        target = self._window_mean(rows) * self.seq_len / self._mean_snippet
        base = np.floor(target)
        k = (base + (_uniform(self.seed, _P_COUNT, rows) < target - base)).astype(np.int64)
        k = np.minimum(k, kmax)
        slots = np.arange(kmax, dtype=np.int64)[None, :]
        if self.hi > self.lo:
            u = _uniform(self.seed, _P_LEN, rows[:, None], slots)
            lens = self.lo + np.floor(u * (self.hi - self.lo + 1)).astype(np.int64)
        else:
            lens = np.full((rows.size, kmax), self.lo, dtype=np.int64)
        sizes = np.where(slots < k[:, None], 2 * lens + 1, 0)
        fits = np.cumsum(sizes, axis=1) <= self.seq_len      # drop overflowing tail snippets
        k = np.minimum(k, fits.sum(axis=1))
        synth = np.where(slots < k[:, None], 2 * lens + 1, 0).sum(axis=1)
        return k, lens, synth

    def realised_fractions(self) -> np.ndarray:
        """Realised snippet-token fraction of every batch, float64 [num_batches] (no batch built)."""
        s = self._synthetic.reshape(self.num_batches, self.batch_size).sum(axis=1)
        return s / self.tokens_per_batch

    # -- batches -------------------------------------------------------------------------------
    def _spans(self, rows: np.ndarray, slots: np.ndarray, lens: np.ndarray) -> np.ndarray:
        """S for each snippet: int64 [n, hi], the first ``lens[i]`` entries valid."""
        c, hi = self.cfg, self.hi
        q = np.arange(hi)
        if c.span_source == "random":
            u = _uniform(self.seed, _P_RAND, rows[:, None], slots[:, None] * hi + q[None, :])
            return self._allowed[np.floor(u * self._allowed.size).astype(np.int64)]
        n = len(self.tokens)
        tries = np.arange(_SPAN_TRIES)
        u = _uniform(self.seed, _P_SPAN, rows[:, None], slots[:, None] * _SPAN_TRIES + tries[None, :])
        starts = np.floor(u * (n - lens[:, None] + 1)).astype(np.int64)           # [n, tries]
        win = np.asarray(self.tokens[np.minimum(starts[:, :, None] + q, n - 1)], dtype=np.int64)
        if self.special_ids:
            bad = (np.isin(win, self.special_ids) & (q < lens[:, None, None])).any(axis=2)
            ok = ~bad
            pick = np.where(ok.any(axis=1), ok.argmax(axis=1), _SPAN_TRIES - 1)  # first clean try
        else:
            pick = np.zeros(len(rows), dtype=np.int64)
        return win[np.arange(len(rows)), pick]

    def batch(self, step: int) -> Batch:
        """Batch ``step`` (0-based); a pure function of (tokens, cfg, step).

        Raises:
            InductionLabError: step outside [0, num_batches).
        """
        if not 0 <= step < self.num_batches:
            raise InductionLabError(f"step {step} outside [0, {self.num_batches})")
        B, T, c = self.batch_size, self.seq_len, self.cfg
        rows = step * B + np.arange(B, dtype=np.int64)
        ids = np.empty((B, T), dtype=np.int64)
        mask = np.zeros((B, T), dtype=bool)
        snippets: list[tuple[int, int, int, str]] = []
        synth = np.zeros(B, dtype=np.int64)
        if self.active:
            k, lens, synth = self._plan(rows)
            kmax = self._kmax
            slot = np.arange(kmax)[None, :]
            valid = slot < k[:, None]                                     # [B, kmax]
            n_nat = T - synth
            # gap positions: natural tokens before each snippet, sorted within the row
            upos = _uniform(self.seed, _P_POS, rows[:, None], slot)
            gaps = np.where(valid, np.floor(upos * (n_nat[:, None] + 1)), np.inf)
            gaps = np.sort(gaps, axis=1)
            size = np.where(valid, 2 * lens + 1, 0)
            before = np.cumsum(size, axis=1) - size                      # snippet tokens before slot
            col = np.where(valid, gaps, 0).astype(np.int64) + before    # first column of snippet
            udir = _uniform(self.seed, _P_DIR, rows[:, None], slot)
            if c.variant == "induction":
                fwd = np.ones_like(valid)
            elif c.variant == "anti":
                fwd = np.zeros_like(valid)
            else:
                fwd = udir < 0.5
            bi, sj = np.nonzero(valid)                                   # row-major: by row, slot
            if bi.size:
                L = lens[bi, sj]
                S = self._spans(rows[bi], sj, L)                          # [n, hi]
                q = np.arange(2 * self.hi + 1)[None, :]
                Lc = L[:, None]
                src = np.where(q < Lc, q, np.where(fwd[bi, sj][:, None], q - Lc - 1, 2 * Lc - q))
                tok = np.take_along_axis(S, np.clip(src, 0, self.hi - 1), axis=1)
                tok = np.where(q == Lc, self.sep_id, tok)
                inside = q < 2 * Lc + 1
                rr = np.broadcast_to(bi[:, None], inside.shape)[inside]
                cc = (col[bi, sj][:, None] + q)[inside]
                ids[rr, cc] = tok[inside]
                mask[rr, cc] = True
                cols, fw = col[bi, sj], fwd[bi, sj]
                snippets = [(int(b_), int(c_), int(l_), "forward" if f_ else "backward")
                            for b_, c_, l_, f_ in zip(bi, cols, L, fw)]
        # natural tokens: the rows of one batch read consecutive stretches of the stream
        off = int(self._offsets[rows[0]])
        n_total = int(B * T - synth.sum())
        idx = (off + np.arange(n_total)) % len(self.tokens)
        ids[~mask] = np.asarray(self.tokens[idx], dtype=np.int64)
        import torch   # lazy: the CLI's options read this module

        return Batch(step=step, input_ids=torch.from_numpy(ids), synthetic_mask=torch.from_numpy(mask),
                     tokens_before=step * self.tokens_per_batch,
                     synthetic_fraction=float(synth.sum()) / self.tokens_per_batch,
                     snippets=snippets)

    def batches(self, start_step: int = 0) -> Iterator[Batch]:
        """Batches ``start_step, ..., num_batches − 1``; resuming at a step reproduces the
        uninterrupted stream exactly."""
        if not 0 <= start_step <= self.num_batches:
            raise InductionLabError(f"start_step {start_step} outside [0, {self.num_batches}]")
        for s in range(start_step, self.num_batches):
            yield self.batch(s)

    def step_at_tokens(self, tokens_seen: int) -> int:
        """The step to resume at after ``tokens_seen`` training tokens (a batch boundary).

        Raises:
            InductionLabError: ``tokens_seen`` is not a multiple of batch_size·seq_len or
                exceeds the budget.
        """
        if tokens_seen % self.tokens_per_batch or not 0 <= tokens_seen <= self.total_tokens:
            raise InductionLabError(f"cannot resume at token {tokens_seen}: it must be a multiple "
                                    f"of {self.tokens_per_batch} (batch_size x seq_len) within "
                                    f"[0, {self.total_tokens}]")
        return tokens_seen // self.tokens_per_batch

    def __len__(self) -> int:
        return self.num_batches

    @classmethod
    def from_shards(cls, shards, cfg: CurriculumConfig, *, batch_size: int, seq_len: int,
                    total_tokens: int) -> "BiInductStream":
        """Stream over ``shards.train`` with its vocabulary, SEP and special ids (EOS, BOS)."""
        special = [shards.eos_id] + ([shards.bos_id] if shards.bos_id is not None else [])
        return cls(shards.train, cfg, batch_size=batch_size, seq_len=seq_len,
                   total_tokens=total_tokens, vocab_size=shards.vocab_size,
                   sep_id=shards.sep_id, special_ids=special)

    def describe(self) -> dict:
        """Run-record entry: config, budget, epochs over the natural stream."""
        from dataclasses import asdict
        return {**asdict(self.cfg), "seed_used": self.seed, "sep_id_used": self.sep_id, "batch_size": self.batch_size,
                "seq_len": self.seq_len, "num_batches": self.num_batches,
                "total_tokens": self.total_tokens, "anneal_tokens_used": self.anneal_tokens,
                "natural_tokens_used": self.natural_tokens_used, "epochs": self.epochs,
                "synthetic_tokens": int(self._synthetic.sum()), "special_ids": list(self.special_ids)}
