"""Head scores (SPEC §3): induction, anti-induction, previous-token, duplicate-token, sink.

Each score is the raw attention probability a head puts on one target key, averaged over the
queries that have a defined target and over the batch (never renormalised after dropping BOS,
so a head resting 99% on BOS scores ≈ 0 — unlike TransformerLens' ``exclude_bos``).

Sequences (p0 = 1 with BOS, else 0; S = T distinct random ordinary tokens):

=================  ====================  ===================================================
score              sequence              query i → target key
=================  ====================  ===================================================
induction          [BOS] S S             i ∈ second copy → i − T + 1 (token after the earlier occurrence)
duplicate_token    [BOS] S S             i ∈ second copy → i − T (the earlier occurrence)
previous_token     [BOS] S S             every i ≥ 1 → i − 1
sink               [BOS] S S             every i ≥ 1 → 0
anti_induction     [BOS] S reverse(S)    i ∈ reversed copy → the key just before the token's
                                         earlier occurrence (when that key is inside S)
=================  ====================  ===================================================

Also the induction loss: mean next-token loss (nats) on the first copy vs the second copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .instrument import gather_targets, instrument
from .models import attention_shape
from .stimuli import ordinary_token_ids, random_sequences

SCORE_NAMES = ("induction", "anti_induction", "previous_token", "duplicate_token", "sink")
_REPEAT_SCORES = ("induction", "duplicate_token", "previous_token", "sink")


def score_targets(name: str, seq_len: int, bos: bool = True) -> torch.Tensor:
    """Target key index per query position for a score; ``-1`` where a query has no target.

    Args:
        name: one of :data:`SCORE_NAMES`.
        seq_len: T, the length of S. The sequence has ``p0 + 2T`` tokens.

    Returns: LongTensor ``[p0 + 2T]``.
    """
    p0, T = int(bos), seq_len
    n = p0 + 2 * T
    i = torch.arange(n)
    t = torch.full((n,), -1, dtype=torch.long)
    second = i >= p0 + T
    if name == "induction":
        t[second] = i[second] - T + 1
    elif name == "duplicate_token":
        t[second] = i[second] - T
    elif name == "previous_token":
        t[1:] = i[1:] - 1
    elif name == "sink":
        t[1:] = 0
    elif name == "anti_induction":
        j = i - (p0 + T)                   # 0..T-1 inside the reversed copy
        earlier = p0 + T - 1 - j           # earlier occurrence of the same token
        ok = second & (earlier - 1 >= p0)
        t[ok] = earlier[ok] - 1
    else:
        raise ValueError(f"unknown score {name!r}; use one of {SCORE_NAMES}")
    return t


def build_sequences(S: torch.Tensor, name: str, bos_id: int | None) -> torch.Tensor:
    """``[BOS] S S`` (or ``[BOS] S reverse(S)`` for anti-induction) from ``S`` ``[B, T]``."""
    second = S.flip(1) if name == "anti_induction" else S
    parts = [S, second]
    if bos_id is not None:
        parts.insert(0, torch.full((S.shape[0], 1), bos_id, dtype=S.dtype))
    return torch.cat(parts, dim=1)


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
        induction_loss: ``{"first_copy": nats, "second_copy": nats}`` mean next-token loss.
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


def compute_head_scores(model, *, tokenizer=None, vocab_size: int | None = None, exclude_ids=(),
                        bos_id: int | None = None, seq_len: int = 50, batch_size: int = 16,
                        n_batches: int = 1, seed: int = 0, sequences: torch.Tensor | None = None,
                        names=SCORE_NAMES, progress=None) -> HeadScores:
    """Score every head of ``model`` on random repeated sequences.

    Args:
        tokenizer: optional; its special / added tokens are excluded from the random pool and
            its BOS is used when ``bos_id`` is None.
        vocab_size: size of the id range to sample (default: the model's vocabulary).
        exclude_ids: more ids never to sample.
        bos_id: BOS token prepended to each sequence (None and no tokenizer BOS: no BOS).
        seq_len: T, tokens per copy (SPEC §3 default 50).
        batch_size, n_batches: sequences per forward pass and number of passes (default 16 × 1).
        sequences: explicit ``S`` ``[N, T]`` instead of random ones (batched by ``batch_size``).
        names: which scores to compute.

    Returns: :class:`HeadScores`. Scoring in batches equals scoring one sequence at a time
    (each sequence weighs equally; within float tolerance).
    """
    shape = attention_shape(model.config)
    device = next(model.parameters()).device
    if bos_id is None and tokenizer is not None:
        bos_id = tokenizer.bos_token_id
    if sequences is None:
        pool = ordinary_token_ids(vocab_size or shape["vocab_size"], exclude_ids, tokenizer)
        sequences = random_sequences(pool, batch_size * n_batches, seq_len, seed)
    else:
        sequences = torch.as_tensor(sequences, dtype=torch.long)
        seq_len = sequences.shape[1]
    bos = bos_id is not None
    ctx = shape["max_position_embeddings"]
    if ctx and (2 * seq_len + bos) > ctx:
        from .errors import InductionLabError
        raise InductionLabError(f"sequence of {2 * seq_len + bos} tokens exceeds the model's context of {ctx}; "
                                "use a smaller seq_len")
    L, H = shape["n_layers"], shape["n_heads"]
    sums = {n: torch.zeros(L, H, dtype=torch.float64) for n in names}
    loss_sum = {"first_copy": 0.0, "second_copy": 0.0}
    N = sequences.shape[0]
    targets = {n: score_targets(n, seq_len, bos) for n in SCORE_NAMES}
    p0 = int(bos)
    with torch.inference_mode():
        for start in range(0, N, batch_size):
            S = sequences[start:start + batch_size]
            ids = build_sequences(S, "induction", bos_id).to(device)
            red = {n: targets[n] for n in names if n in _REPEAT_SCORES}
            with instrument(model, reductions=red) as inst:
                logits = model(input_ids=ids).logits.float()
            for n in red:
                sums[n] += _mean_over_queries(inst.reduced[n], targets[n])
            lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
            nll = -lp.cpu().double()                          # predicts token at position 1..n-1
            loss_sum["first_copy"] += nll[:, p0:p0 + seq_len - 1].mean(1).sum().item()
            loss_sum["second_copy"] += nll[:, p0 + seq_len - 1:].mean(1).sum().item()
            if "anti_induction" in names:
                ids = build_sequences(S, "anti_induction", bos_id).to(device)
                with instrument(model, reductions={"anti_induction": targets["anti_induction"]}) as inst:
                    model(input_ids=ids)
                sums["anti_induction"] += _mean_over_queries(inst.reduced["anti_induction"], targets["anti_induction"])
            if progress is not None:
                progress(len(S))
    scores = {n: (sums[n] / N).numpy() for n in names}
    params = {"seq_len": seq_len, "batch_size": batch_size, "n_sequences": N, "seed": seed, "bos_id": bos_id,
              "definition": "raw attention probability on the target key (SPEC §3), mean over target-bearing queries"}
    return HeadScores(scores, {k: v / N for k, v in loss_sum.items()}, params)
