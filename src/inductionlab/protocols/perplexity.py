"""Perplexity guard (SPEC §8): perplexity on the MD5 held-out split of a prepared corpus.

The held-out stream (``TokenShards.heldout``: documents assigned by ``md5(document) < fraction``,
each followed by EOS) — optionally only its first ``max_tokens`` tokens — is cut into
consecutive non-overlapping windows of ``context`` tokens (the last one may be shorter). Every
token of a window but its first is predicted from the tokens before it in the window, so
exactly ``Σ (len(window) − 1)`` tokens are scored (windows of one token score nothing)::

    perplexity = exp( Σ −log p(x_t | window prefix) / n_scored )      (nats inside, e^·)

The windows are trials of :func:`inductionlab.protocols.runner.run_conditions` (the per-position losses of
:func:`inductionlab.protocols.icl_score.measure_batch`): the full windows in one rectangular set, a shorter
final window in its own; under torchrun their batches are sharded over the processes (``dist``).

The shards must be tokenised with the model's own tokenizer (or the model trained on the
shards' tokenizer, as our trainer's checkpoints are): the two vocabularies (token → id) must be
identical, else a one-line error before any forward pass.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..errors import InductionLabError
from .icl_score import model_context, token_losses


def check_tokenizer_match(shards, tokenizer=None, vocab_size: int | None = None) -> None:
    """Refuse shards tokenised differently from the model.

    Args:
        shards: an opened :class:`inductionlab.data.shards.TokenShards`.
        tokenizer: the model's tokenizer (``get_vocab()``); compared token by token with the
            shards' tokenizer.
        vocab_size: the model's embedding rows; shard ids must be below it.

    Raises: InductionLabError naming both tokenizers and the fix.
    """
    spec = shards.manifest.get("tokenizer", {}).get("spec", "?")
    if vocab_size is not None and shards.vocab_size > int(vocab_size):
        raise InductionLabError(f"shards in {shards.path} use tokenizer {spec} with {shards.vocab_size} ids but the "
                                f"model has {vocab_size}; prepare the corpus with the model's tokenizer "
                                "(inductionlab corpus prepare SOURCE --tokenizer MODEL)")
    if tokenizer is not None:
        theirs = shards.tokenizer().get_vocab(with_added_tokens=True)
        ours = tokenizer.get_vocab()
        if ours != theirs:
            diff = len(set(ours.items()) ^ set(theirs.items()))
            raise InductionLabError(f"shards in {shards.path} were tokenised with {spec} (vocab {len(theirs)}), not "
                                    f"with the model's tokenizer (vocab {len(ours)}, {diff} entries differ); prepare "
                                    "the corpus with the model's tokenizer (inductionlab corpus prepare SOURCE "
                                    "--tokenizer MODEL)")


def heldout_perplexity(model, shards, *, tokenizer=None, context: int | None = None, max_tokens: int | None = None,
                       batch_size: int = 4, split: str = "heldout", dist=None) -> dict:
    """Perplexity of ``model`` on a prepared corpus' held-out split.

    Args:
        shards: :class:`inductionlab.data.shards.TokenShards`.
        tokenizer: the model's tokenizer, checked against the shards' (None: only the id range
            is checked).
        context: window length in tokens (default: min(model context, 1024)).
        max_tokens: use only the first ``max_tokens`` tokens of the split (None: all).
        split: ``heldout`` (default) or ``train``.
        dist: a :class:`~inductionlab.runtime.distributed.Dist` to shard the windows' batches over (every
            rank calls with the same arguments and gets the same result; None: one process).

    Returns: ``{"perplexity", "nll_per_token" (nats), "nll_sum", "n_scored", "n_tokens",
    "n_windows", "context", "split", "tokenizer"}``; ``n_scored = n_tokens − n_windows`` exactly, less one
    when a final 1-token tail is left over (it is not a window).

    Raises: InductionLabError for a tokenizer mismatch, an empty split, bad context/max_tokens.
    """
    from ..core.models import attention_shape

    if split not in ("heldout", "train"):
        raise InductionLabError(f"split must be heldout or train, got {split!r}")
    check_tokenizer_match(shards, tokenizer, attention_shape(model.config)["vocab_size"])
    mc = model_context(model)
    context = int(context or min(int(mc or 1024), 1024))
    if context < 2 or (mc and context > int(mc)):
        raise InductionLabError(f"context must be between 2 and the model's {mc} tokens, got {context}")
    if max_tokens is not None and max_tokens < 2:
        raise InductionLabError(f"max_tokens must be >= 2, got {max_tokens}")
    stream = getattr(shards, split)
    stream = np.asarray(stream[:max_tokens] if max_tokens is not None else stream, np.int64)
    if len(stream) < 2:
        raise InductionLabError(f"the {split} split of {shards.path} has {len(stream)} tokens; nothing to score")
    n_full = len(stream) // context
    nll_sum, n_scored, n_windows = 0.0, 0, 0
    if n_full:
        full = torch.as_tensor(stream[:n_full * context].reshape(n_full, context))
        nll = token_losses(model, full, batch_size=batch_size, dist=dist)
        nll_sum += float(nll.sum())
        n_scored += nll.size
        n_windows += n_full
    tail = stream[n_full * context:]
    if len(tail) >= 2:
        nll = token_losses(model, torch.as_tensor(tail[None]), dist=dist)
        nll_sum += float(nll.sum())
        n_scored += nll.size
        n_windows += 1
    per = nll_sum / n_scored
    return {"perplexity": math.exp(per), "nll_per_token": per, "nll_sum": nll_sum, "n_scored": int(n_scored),
            "n_tokens": int(len(stream)), "n_windows": n_windows, "context": context, "split": split,
            "tokenizer": shards.manifest.get("tokenizer", {}).get("spec")}


__all__ = ["check_tokenizer_match", "heldout_perplexity"]
