"""Left-padded batches equal one-at-a-time runs (absolute and rotary positions)."""

from __future__ import annotations

import pytest
import torch

from conftest import make_tiny
from inductionlab.protocol import last_token_logits, pad_left


def test_pad_left_layout():
    b = pad_left([[5, 6, 7], [8]], pad_id=0)
    assert b["input_ids"].tolist() == [[5, 6, 7], [0, 0, 8]]
    assert b["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert b["position_ids"].tolist() == [[0, 1, 2], [0, 0, 0]]


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_padded_batch_matches_single_runs(arch):
    model = make_tiny(arch, "eager")
    seqs = [[11, 12, 13, 14, 15, 16, 17], [21, 22, 23], [31, 32, 33, 34, 35]]
    with torch.inference_mode():
        batched = last_token_logits(model, seqs)
        for b, s in enumerate(seqs):
            alone = model(input_ids=torch.tensor([s])).logits[0, -1].float()
            assert torch.allclose(batched[b], alone, atol=1e-5), b
        # the trap: without mask-derived positions, GPT-2's padded rows change
        if arch == "gpt2":
            p = pad_left(seqs, 0)
            naive = model(input_ids=p["input_ids"], attention_mask=p["attention_mask"]).logits[:, -1]
            alone = model(input_ids=torch.tensor([seqs[1]])).logits[0, -1]
            assert not torch.allclose(naive[1], alone, atol=1e-3)
