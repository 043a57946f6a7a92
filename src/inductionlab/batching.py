"""Padded batches that give the same numbers as one sequence at a time.

Left padding shifts every real token's position unless ``position_ids`` are derived from the
attention mask (TransformerLens #1609, nnsight #672: absolute-position models such as GPT-2
silently change their outputs). :func:`pad_left` builds ``input_ids``, ``attention_mask`` and
mask-derived ``position_ids``; :func:`last_token_logits` runs them.
"""

from __future__ import annotations

from typing import Sequence

import torch


def pad_left(seqs: Sequence[Sequence[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Left-pad token id lists into one batch.

    Returns: ``input_ids`` / ``attention_mask`` / ``position_ids``, each LongTensor ``[B, T_max]``;
    positions count real tokens only (0 at each sequence's first real token; pads get 0 too,
    and are masked out of attention).
    """
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), T), dtype=torch.long)
    for b, s in enumerate(seqs):
        if len(s):
            ids[b, T - len(s):] = torch.as_tensor(list(s), dtype=torch.long)
            mask[b, T - len(s):] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": pos}


def last_token_logits(model, seqs: Sequence[Sequence[int]], pad_id: int = 0) -> torch.Tensor:
    """Logits at each sequence's last token from one left-padded forward pass: float32 ``[B, V]``."""
    device = next(model.parameters()).device
    batch = {k: v.to(device) for k, v in pad_left(seqs, pad_id).items()}
    return model(**batch).logits[:, -1].float()
