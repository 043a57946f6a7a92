"""In-context learning score (Olsson et al. 2022) and the induction loss on repeated random tokens.

**ICL score.** On natural held-out text, ``loss(late) − loss(early)`` where ``loss(t) =
−log p(x_t | x_<t)`` in nats for the token at 0-based index ``t`` of a window that starts at a
document start. Olsson et al. use the 500th vs the 50th token; when the model's context (or the
window) is shorter than ``late + 1`` tokens, both positions are scaled by the same factor
(decision: ``late' = context − 1``, ``early' = max(1, round(early · late' / late))``).
Negative = the model predicts later tokens better thanks to the context. Per-sequence values
give a 95% CI over sequences (normal approximation). The *ICL benefit* ``loss(early) −
loss(late)`` (= −score, larger is better) is what the load-bearing test compares.

**Induction loss** (SPEC §3): ``[BOS] S S`` with ``S`` = T distinct random ordinary tokens
(the sequences of :mod:`inductionlab.core.scores`); mean next-token loss over the first copy
(predicting ``S[1:]``) and over the second copy (predicting every token of the repeat), per
sequence; *induction benefit* = first − second. The means equal
:func:`inductionlab.core.scores.compute_head_scores`' ``induction_loss`` on the same sequences. *Copy
accuracy*: the fraction of ``S[1:]`` in the repeat whose next token is the model's top-1 prediction.

**Associative recall** (:func:`associative_recall`): P random key-value pairs, then the same pairs
in a shuffled order; top-1 accuracy of each value after its repeated key (a content match, not a
positional copy). Both accuracies are measured in the model's own tokens, so a 2-layer model
trained on a small vocabulary can do them (issue 19).

All three are reductions of one protocol of :func:`inductionlab.protocols.runner.run_conditions`:
:func:`measure_batch` gives the per-position next-token loss (and top-1 hits) of equal-length
sequences, and :func:`icl_summary`, :func:`induction_summary` and :func:`recall_summary` reduce
those arrays (numpy, float64) per sequence. The functions :func:`icl_score`,
:func:`induction_loss` and :func:`associative_recall` run them on the intact model; under
ablation run ``run_conditions(loaded, conditions, Trials({"ids": ...}), method=...,
measure_batch=measure_batch)`` and reduce each condition's arrays.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import torch

from ..core.models import LoadedModel
from ..errors import InductionLabError
from ..measures.stats import ci
from .runner import Trials, run_conditions


def icl_positions(context: int, late: int = 500, early: int = 50) -> tuple[int, int]:
    """The (late, early) token indices used for a window of ``context`` tokens (module docstring).

    Raises: InductionLabError when ``early >= late``, ``early < 1`` or ``context < 3``."""
    if not 1 <= early < late:
        raise InductionLabError(f"ICL score positions need 1 <= early < late, got early={early}, late={late}")
    if context < 3:
        raise InductionLabError(f"a context of {context} tokens is too short for an ICL score (need >= 3)")
    if late <= context - 1:
        return late, early
    new_late = context - 1
    return new_late, min(new_late - 1, max(1, round(early * new_late / late)))


def measure_batch(model, batch: dict[str, torch.Tensor], cfg=None, *, hits: bool = False) -> dict[str, torch.Tensor]:
    """One batch of equal-length sequences ``ids`` ``[b, T]`` (no padding): ``nll`` float64
    ``[b, T − 1]``, column ``t − 1`` = ``−log p(x_t | x_<t)`` in nats; with ``hits``, also ``hits``
    bool ``[b, T − 1]`` (the argmax of ``p(· | x_<t)`` is ``x_t``)."""
    x = batch["ids"]
    logits = model(input_ids=x).logits[:, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none")
    out = {"nll": nll.double()}
    if hits:
        out["hits"] = logits.argmax(-1) == x[:, 1:]
    return out


def measure_at(model, batch: dict[str, torch.Tensor], positions) -> dict[str, torch.Tensor]:
    """:func:`measure_batch` at chosen token indices only: ``nll`` float64 ``[b, len(positions)]``, column j =
    ``−log p(x_t | x_<t)`` for ``t = positions[j]`` (nats), the LM head run at the positions ``t − 1`` only
    (:func:`~inductionlab.protocols.runner.forward_logits`). For an ICL score of window 1, the two positions."""
    from .runner import forward_logits

    x = batch["ids"]
    t = torch.as_tensor(list(positions), dtype=torch.long, device=x.device)
    logits = forward_logits(model, x, t - 1)                                   # [b, n, V] float32
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), x[:, t], reduction="none")
    return {"nll": nll.double()}


def token_losses(model, ids: torch.Tensor, *, batch_size: int = 2, return_hits: bool = False,
                 dist=None) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Next-token losses of equal-length sequences on the intact model (:func:`measure_batch`
    through :func:`~inductionlab.protocols.runner.run_conditions`).

    Args:
        ids: LongTensor ``[N, T]`` (no padding).
        return_hits: also return whether the top-1 (argmax) prediction is the next token.
        dist: a :class:`~inductionlab.runtime.distributed.Dist` to shard the batches over (None: one process).

    Returns: float64 ``[N, T − 1]``; column ``t − 1`` is ``−log p(x_t | x_<t)`` in nats. With
    ``return_hits``: ``(nll, hits)``, ``hits`` bool ``[N, T − 1]`` (argmax of ``p(· | x_<t)`` is ``x_t``).
    """
    from ..core.ablation import Condition

    ids = torch.as_tensor(ids, dtype=torch.long)
    out = run_conditions(LoadedModel(model, tokenizer=None), [Condition("intact", "intact")], Trials({"ids": ids}),
                         batch_size=batch_size, measure_batch=partial(measure_batch, hits=return_hits), dist=dist,
                         reuse=False)["intact"]
    if not out:      # no sequences
        out = {"nll": np.zeros((0, max(ids.shape[1] - 1, 0))), "hits": np.zeros((0, max(ids.shape[1] - 1, 0)), bool)}
    return (out["nll"], out["hits"]) if return_hits else out["nll"]


def model_context(model) -> int | None:
    """The model's maximum positions (``max_position_embeddings`` / ``n_positions``), or None."""
    cfg = model.config
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    return getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)


def heldout_windows(tokens: np.ndarray, eos_id: int, n: int, length: int, *, seed: int = 0,
                    bos_id: int | None = None) -> torch.Tensor:
    """Windows of natural text that start at document starts.

    Args:
        tokens: a token stream with every document followed by ``eos_id`` (e.g.
            ``TokenShards.heldout``, the MD5 held-out split).
        n: windows wanted; documents with at least ``length`` tokens (``length − 1`` with a
            BOS) are drawn without replacement by ``seed``; fewer are returned when fewer qualify.
        bos_id: prepended to each window when given.

    Returns: LongTensor ``[n', length]`` with ``1 <= n' <= n``.

    Raises: InductionLabError when no document is long enough.
    """
    tokens = np.asarray(tokens)
    body = length - (bos_id is not None)
    ends = np.flatnonzero(tokens == eos_id)
    starts = np.concatenate([[0], ends + 1])[:len(ends) + 1]
    stops = np.concatenate([ends, [len(tokens)]])
    ok = np.flatnonzero(stops - starts >= body)
    if len(ok) == 0:
        raise InductionLabError(f"no held-out document has {body} tokens; lower the late token position "
                                "or use a corpus with longer documents")
    pick = np.sort(np.random.default_rng(seed).permutation(ok)[:n])
    rows = [np.asarray(tokens[starts[d]:starts[d] + body], np.int64) for d in pick]
    if bos_id is not None:
        rows = [np.concatenate([[bos_id], r]) for r in rows]
    return torch.as_tensor(np.stack(rows))


def text_windows(tokenizer, text: str, length: int, *, bos_id: int | None = None) -> torch.Tensor:
    """Consecutive non-overlapping windows of ``length`` tokens of a given text (the tail that
    does not fill a window is dropped). Returns LongTensor ``[n, length]``.

    Raises: InductionLabError when the text is shorter than one window."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    body = length - (bos_id is not None)
    n = len(ids) // body
    if n == 0:
        raise InductionLabError(f"the text has {len(ids)} tokens, fewer than one window of {body}; give a "
                                "longer text or lower the late token position")
    rows = [ids[i * body:(i + 1) * body] for i in range(n)]
    if bos_id is not None:
        rows = [[bos_id] + r for r in rows]
    return torch.as_tensor(rows, dtype=torch.long)


def scaled_positions(model, sequences: torch.Tensor, late: int = 500, early: int = 50) -> tuple[int, int]:
    """:func:`icl_positions` for ``sequences`` ``[N, T]`` read by ``model`` (the shorter of ``T``
    and the model's context)."""
    ctx = int(sequences.shape[1])
    mc = model_context(model)
    if mc:
        ctx = min(ctx, int(mc))
    return icl_positions(ctx, late, early)


def icl_summary(nll: np.ndarray, late: int, early: int, window: int = 1) -> dict:
    """The ICL score of :func:`icl_score` from per-position losses ``nll`` ``[N, ≥ late]``
    (:func:`measure_batch`) at the (already scaled) token indices ``late`` and ``early``.

    Raises: InductionLabError when ``window < 1``."""
    if window < 1:
        raise InductionLabError(f"window must be >= 1 token, got {window}")
    lt, et = int(late), int(early)
    w = min(int(window), et)
    ll, le = nll[:, lt - w:lt].mean(1), nll[:, et - w:et].mean(1)
    m, lo, hi = ci(ll - le)
    return {"late": lt, "early": et, "window": w, "n": int(len(ll)), "score": m, "ci_low": lo, "ci_high": hi,
            "loss_late": float(ll.mean()), "loss_early": float(le.mean()),
            "per_sequence": {"loss_late": ll, "loss_early": le, "benefit": le - ll}}


def icl_score(model, sequences: torch.Tensor, *, late: int = 500, early: int = 50, window: int = 1,
              batch_size: int = 2) -> dict:
    """ICL score of ``model`` on ``sequences`` (Olsson et al. 2022).

    Args:
        sequences: LongTensor ``[N, T]`` of natural text (see :func:`heldout_windows`); positions
            are scaled when ``T`` or the model's context is shorter than ``late + 1``; only the
            first ``late + 1`` tokens are run.
        window: average the loss over the ``window`` tokens ending at each position (indices
            ``t − window + 1 .. t``; 1 = the single token, as in Olsson et al.; larger values
            trade locality for less noise per sequence; clipped to ``early``).

    Returns: ``{"late", "early", "window", "n", "score", "ci_low", "ci_high", "loss_late", "loss_early",
    "per_sequence": {"loss_late": [N], "loss_early": [N], "benefit": [N]}}`` (nats; score =
    loss_late − loss_early, benefit = −score per sequence).
    """
    sequences = torch.as_tensor(sequences, dtype=torch.long)
    lt, et = scaled_positions(model, sequences, late, early)
    if window < 1:
        raise InductionLabError(f"window must be >= 1 token, got {window}")
    return icl_summary(token_losses(model, sequences[:, :lt + 1], batch_size=batch_size), lt, et, window)


def induction_summary(nll: np.ndarray, hits: np.ndarray, seq_len: int, bos: bool) -> dict:
    """The induction loss of :func:`induction_loss` from :func:`measure_batch`'s arrays on
    ``[BOS] S S`` (``nll`` / ``hits`` ``[n, 2·seq_len − 1 + bos]``; ``bos``: the sequences start
    with a BOS)."""
    T, p0 = int(seq_len), int(bool(bos))
    first = nll[:, p0:p0 + T - 1].mean(1)
    second = nll[:, p0 + T - 1:].mean(1)
    acc = hits[:, p0 + T:].mean(1).astype(np.float64)     # S[1:] of the repeat: each has one earlier occurrence
    m, lo, hi = ci(first - second)
    am, alo, ahi = ci(acc)
    return {"seq_len": T, "n": int(nll.shape[0]), "first_copy": float(first.mean()), "second_copy": float(second.mean()),
            "benefit": m, "benefit_ci_low": lo, "benefit_ci_high": hi,
            "copy_accuracy": am, "copy_accuracy_ci_low": alo, "copy_accuracy_ci_high": ahi,
            "per_sequence": {"first_copy": first, "second_copy": second, "benefit": first - second,
                             "copy_accuracy": acc}}


def induction_loss(model, *, tokenizer=None, vocab_size: int | None = None, seq_len: int = 50, n: int = 32,
                   seed: int = 0, bos_id: int | None = None, sequences: torch.Tensor | None = None,
                   batch_size: int = 16) -> dict:
    """Induction loss on ``[BOS] S S`` per sequence (SPEC §3; the sequences of scores.py).

    Args:
        tokenizer / vocab_size / bos_id: as in :func:`inductionlab.core.scores.compute_head_scores`
            (random ordinary tokens; the tokenizer's BOS when ``bos_id`` is None).
        sequences: explicit ``S`` ``[n, T]`` instead of ``n`` random ones of ``seq_len``.

    Returns: ``{"seq_len", "n", "first_copy", "second_copy", "benefit", "benefit_ci_low",
    "benefit_ci_high", "per_sequence": {"first_copy": [n], "second_copy": [n], "benefit": [n]}}``
    (mean next-token loss in nats; benefit = first − second).
    """
    ids, T, bos = induction_ids(model, tokenizer=tokenizer, vocab_size=vocab_size, seq_len=seq_len, n=n, seed=seed,
                                bos_id=bos_id, sequences=sequences)
    nll, hits = token_losses(model, ids, batch_size=batch_size, return_hits=True)
    return induction_summary(nll, hits, T, bos)


def induction_ids(model, *, tokenizer=None, vocab_size: int | None = None, seq_len: int = 50, n: int = 32,
                  seed: int = 0, bos_id: int | None = None, sequences: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, int, bool]:
    """The sequences of :func:`induction_loss` (same arguments): ``(ids, T, bos)`` with ``ids``
    LongTensor ``[n, 2T + bos]`` = ``[BOS] S S``, ``T`` the length of ``S``, ``bos`` whether a BOS
    leads (the trials of the induction loss under ablation; reduce with :func:`induction_summary`)."""
    from ..core.models import attention_shape
    from ..core.scores import build_sequences
    from ..core.stimuli import ordinary_token_ids, random_sequences

    if bos_id is None and tokenizer is not None:
        bos_id = tokenizer.bos_token_id
    if sequences is None:
        pool = ordinary_token_ids(vocab_size or attention_shape(model.config)["vocab_size"], (), tokenizer)
        sequences = random_sequences(pool, n, seq_len, seed)
    S = torch.as_tensor(sequences, dtype=torch.long)
    return build_sequences(S, "induction", bos_id), int(S.shape[1]), bos_id is not None


def recall_sequences(pool: torch.Tensor, n: int, n_pairs: int, seed: int, bos_id: int | None = None) -> torch.Tensor:
    """Associative-recall sequences ``[BOS] k1 v1 … kP vP  kπ1 vπ1 … kπP vπP``: ``2P`` distinct
    random tokens from ``pool`` as P key-value pairs, then the same pairs again in a random order
    π (its own per sequence), so a query key's value can be found only by matching its content,
    not by continuing a copy.

    Returns: LongTensor ``[n, 4P + (1 if bos_id is not None)]``.

    Raises: InductionLabError when the pool has fewer than ``2P`` ids or ``P < 2``."""
    from ..core.stimuli import random_sequences

    if n_pairs < 2:
        raise InductionLabError(f"associative recall needs at least 2 key-value pairs, got {n_pairs}")
    kv = random_sequences(pool, n, 2 * n_pairs, seed)                       # [n, 2P] distinct
    g = torch.Generator().manual_seed(int(seed) + 1)
    order = torch.stack([torch.randperm(n_pairs, generator=g) for _ in range(n)])   # [n, P]
    pairs = kv.view(n, n_pairs, 2)
    again = torch.gather(pairs, 1, order[:, :, None].expand(-1, -1, 2)).reshape(n, 2 * n_pairs)
    seq = torch.cat([kv, again], 1)
    if bos_id is not None:
        seq = torch.cat([torch.full((n, 1), int(bos_id), dtype=torch.long), seq], 1)
    return seq


def recall_summary(nll: np.ndarray, hits: np.ndarray, n_pairs: int, bos: bool) -> dict:
    """Associative recall of :func:`associative_recall` from :func:`measure_batch`'s arrays on
    :func:`recall_sequences` (``bos``: the sequences start with a BOS)."""
    p0 = int(bool(bos))
    # value vπj sits at p0 + 2P + 2j + 1; its prediction is column p0 + 2P + 2j (the query key's position)
    cols = p0 + 2 * n_pairs + 2 * np.arange(n_pairs)
    acc = hits[:, cols].mean(1).astype(np.float64)
    loss = nll[:, cols].mean(1)
    m, lo, hi = ci(acc)
    return {"n_pairs": int(n_pairs), "n": int(nll.shape[0]), "accuracy": m, "accuracy_ci_low": lo,
            "accuracy_ci_high": hi, "nll": float(loss.mean()), "per_sequence": {"accuracy": acc, "nll": loss}}


def associative_recall(model, pool: torch.Tensor, *, n_pairs: int = 8, n: int = 32, seed: int = 0,
                       bos_id: int | None = None, batch_size: int = 16) -> dict:
    """Associative recall in the model's own tokens (``… A B … A → B``, the pattern an induction
    head completes; Zoology's multi-query associative recall, Arora et al. 2023, with one query
    per pair): on :func:`recall_sequences`, the top-1 accuracy and the loss of each value ``vπj``
    given its repeated key, per sequence.

    Args:
        pool: LongTensor of ids to draw keys and values from (e.g. the training split's ids).
        n_pairs: P, key-value pairs per sequence (queries per sequence: P).

    Returns: ``{"n_pairs", "n", "accuracy", "accuracy_ci_low", "accuracy_ci_high", "nll",
    "per_sequence": {"accuracy": [n], "nll": [n]}}`` (accuracy a fraction of queries; nll in nats;
    chance accuracy ≈ 1/len(pool) without the context).
    """
    ids = recall_sequences(pool, n, n_pairs, seed, bos_id)
    nll, hits = token_losses(model, ids, batch_size=batch_size, return_hits=True)
    return recall_summary(nll, hits, n_pairs, bos_id is not None)


__all__ = ["icl_positions", "measure_batch", "measure_at", "token_losses", "model_context", "heldout_windows", "text_windows",
           "scaled_positions", "icl_summary", "icl_score", "induction_summary", "induction_loss", "induction_ids", "recall_sequences",
           "recall_summary", "associative_recall"]
