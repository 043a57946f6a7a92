"""The protocol runner: a toy probe through run_conditions alone; left-padded batches equal
one-at-a-time runs (absolute and rotary positions)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import make_tiny
from inductionlab.ablation import Condition
from inductionlab.errors import InductionLabError
from inductionlab.instrument import ablate
from inductionlab.protocol import (REFERENCE_TRIALS, Trials, check_method, forward_logits, last_token_logits, pad_left,
                                   run_conditions)


# -- a toy probe: one build_trials + one measure_batch, nothing else ------------------------------
def build_repeat_trials(n: int, length: int, seed: int = 0) -> Trials:
    """Random sequences ``x1 … xL x1``: does the model predict x2 after the repeated x1?"""
    g = torch.Generator().manual_seed(seed)
    body = torch.randint(10, 200, (n, length), generator=g)
    return Trials({"ids": torch.cat([body, body[:, :1]], 1), "target": body[:, 1]})


def measure_repeat(model, batch):
    p = torch.softmax(forward_logits(model, batch["ids"], 1)[:, -1], -1)          # [b, V]
    return {"p_next": p.gather(1, batch["target"][:, None])[:, 0], "argmax": p.argmax(-1)}


@pytest.mark.parametrize("method", ["zero", "mean", "sink"])
def test_toy_probe_through_the_runner(method):
    model = make_tiny("llama", "eager")
    loaded = SimpleNamespace(model=model, identity={})
    trials = build_repeat_trials(11, 12)
    conds = [Condition("intact", "intact"), Condition("L1-all", "induction", 8, 0, [(1, h) for h in range(8)])]
    seen = []
    out = run_conditions(loaded, conds, trials, method=method, batch_size=4, measure_batch=measure_repeat,
                         progress=seen.append)
    assert seen == [4, 4, 3] * 2                                     # trials per batch, per condition
    assert set(out) == {"intact", "L1-all"} and out["intact"]["p_next"].shape == (11,)
    ids, tgt = trials.tensors["ids"], trials.tensors["target"]
    with torch.inference_mode():
        want = torch.softmax(model(input_ids=ids).logits[:, -1].float(), -1).gather(1, tgt[:, None])[:, 0]
        ref = ids[:REFERENCE_TRIALS]                                 # the runner's mean-ablation reference
        with ablate(model, conds[1].heads, method, reference_ids=ref):
            abl = torch.softmax(model(input_ids=ids).logits[:, -1].float(), -1).gather(1, tgt[:, None])[:, 0]
    np.testing.assert_allclose(out["intact"]["p_next"], want.numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(out["L1-all"]["p_next"], abl.numpy(), rtol=1e-5, atol=1e-7)
    assert not np.allclose(out["L1-all"]["p_next"], out["intact"]["p_next"])   # the ablation reached the model
    # batching changes nothing
    one = run_conditions(loaded, conds, trials, method=method, batch_size=11, measure_batch=measure_repeat)
    np.testing.assert_allclose(one["L1-all"]["p_next"], out["L1-all"]["p_next"], rtol=1e-5, atol=1e-7)
    assert np.array_equal(one["intact"]["argmax"], out["intact"]["argmax"])


def test_trials_head_and_method_check():
    tr = build_repeat_trials(5, 4)
    assert len(tr) == 5 and len(tr.head(2)) == 2
    assert torch.equal(tr.head(2).tensors["target"], tr.tensors["target"][:2])
    with pytest.raises(InductionLabError, match="unknown ablation method 'knock'"):
        check_method("knock")


# -- left padding -----------------------------------------------------------------------------
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
