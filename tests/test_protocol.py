"""The protocol runner: a toy probe through run_conditions alone; left-padded batches equal
one-at-a-time runs (absolute and rotary positions); padded trials through the runner; the
reference batch asked for by the method's table entry."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import make_tiny
from inductionlab.core.ablation import Condition
from inductionlab.errors import InductionLabError
from inductionlab.core.instrument import ablate
from inductionlab.checks import check_method
from inductionlab.protocols.runner import (REFERENCE_TRIALS, Trials, forward_logits, last_token_logits, model_inputs,
                                           needs_reference, pad_left, run_conditions, trim_padding)


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


def test_padded_trials_through_the_runner_equal_batches_padded_alone():
    """Trials left-padded to the longest of all: each batch, cut to its own padding, is exactly
    pad_left of its own sequences (so the numbers of a per-batch padding, bit for bit)."""
    model = make_tiny("llama", "eager")
    seqs = [[11, 12], [21, 22, 23], [31, 32, 33, 34, 35, 36, 37], [41], [51, 52, 53, 54]]
    trials = Trials.padded(seqs, 0, index=torch.arange(5))
    assert trials.tensors["ids"].shape == (5, 7) and trials.tensors["attention_mask"].sum().item() == 17
    seen = []

    def measure(m, batch):
        batch = trim_padding(batch)
        seen.append(batch)
        out = m(**model_inputs(batch), logits_to_keep=1).logits[:, -1].float()     # as last_token_logits
        return {"logits": out, "index": batch["index"]}

    out = run_conditions(SimpleNamespace(model=model), [Condition("intact", "intact")], trials, batch_size=2,
                         measure_batch=measure)["intact"]
    # batch 0 = seqs 0, 1 (longest 3), batch 1 = seqs 2, 3 (7), batch 2 = seq 4 (4)
    assert [b["ids"].shape[1] for b in seen] == [3, 7, 4]
    for b, (lo, hi) in zip(seen, [(0, 2), (2, 4), (4, 5)]):
        alone = pad_left(seqs[lo:hi], 0)
        assert torch.equal(b["ids"], alone["input_ids"]) and torch.equal(b["position_ids"], alone["position_ids"])
        assert torch.equal(b["attention_mask"], alone["attention_mask"])
    with torch.inference_mode():
        want = torch.cat([last_token_logits(model, seqs[lo:hi]) for lo, hi in [(0, 2), (2, 4), (4, 5)]])
    assert torch.equal(torch.as_tensor(out["logits"]), want) and out["index"].tolist() == [0, 1, 2, 3, 4]
    assert trim_padding({"ids": torch.ones(2, 3)})["ids"].shape == (2, 3)      # unpadded: as it is


def test_reference_batch_from_the_method_table():
    """A method whose table entry needs a value gets Trials.reference (else the first trials);
    the others none."""
    from inductionlab.core.instrument import ABLATION_METHODS

    assert needs_reference("mean") and not needs_reference("zero") and not needs_reference("sink")
    assert all(needs_reference(n) == (m.needs == "value") for n, m in ABLATION_METHODS.items())
    model = make_tiny("llama", "eager")
    loaded = SimpleNamespace(model=model)
    trials = build_repeat_trials(6, 10)
    other = torch.randint(300, 600, (3, 9), generator=torch.Generator().manual_seed(5))
    cond = [Condition("L0", "induction", 2, 0, [(0, 1), (0, 5)])]
    default = run_conditions(loaded, cond, trials, method="mean", batch_size=6, measure_batch=measure_repeat)["L0"]
    given = run_conditions(loaded, cond, Trials(trials.tensors, reference=other), method="mean", batch_size=6,
                           measure_batch=measure_repeat)["L0"]
    ids, tgt = trials.tensors["ids"], trials.tensors["target"]
    with torch.inference_mode():
        for ref, got in ((ids[:REFERENCE_TRIALS], default), (other, given)):
            with ablate(model, cond[0].heads, "mean", reference_ids=ref):
                p = torch.softmax(model(input_ids=ids).logits[:, -1].float(), -1).gather(1, tgt[:, None])[:, 0]
            np.testing.assert_allclose(got["p_next"], p.numpy(), rtol=1e-5, atol=1e-7)
    assert not np.allclose(default["p_next"], given["p_next"])          # the reference reached the ablation
    # zero ablation reads no reference: a given one changes nothing
    z = [run_conditions(loaded, cond, t, method="zero", batch_size=6, measure_batch=measure_repeat)["L0"]["p_next"]
         for t in (trials, Trials(trials.tensors, reference=other))]
    assert np.array_equal(*z)


@pytest.mark.parametrize("takes_keep", [True, False])
def test_forward_logits_keeps_the_last_positions_or_an_index(takes_keep):
    """``keep``: an int (the last positions) or an index tensor, through ``logits_to_keep`` where the
    model takes it and by indexing the full forward where it does not: the same logits."""
    torch.manual_seed(0)
    model = make_tiny("llama")
    ids = torch.randint(10, 200, (2, 9))
    full = model(input_ids=ids).logits.float()
    if not takes_keep:
        class NoKeep(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, input_ids, **kw):
                if "logits_to_keep" in kw:
                    raise TypeError("unexpected keyword argument 'logits_to_keep'")
                return self.inner(input_ids=input_ids, **kw)
        model = NoKeep(model)
    with torch.no_grad():
        last = forward_logits(model, ids, 3)
        at = forward_logits(model, ids, torch.tensor([6, 2, 4]))
    assert last.dtype == torch.float32 and last.shape == (2, 3, full.shape[-1])
    assert torch.allclose(last, full[:, -3:], atol=1e-5)
    assert at.shape == (2, 3, full.shape[-1]) and torch.allclose(at, full[:, [6, 2, 4]], atol=1e-5)


class _Counting(torch.nn.Module):
    """A tiny model behind a stand-in for another architecture's ``logits_to_keep``: ``"refuse"`` (no such keyword:
    TypeError), ``"ignore"`` (takes it, returns every position) or ``"one"`` (takes it, always returns one
    position); each call's keywords recorded."""

    def __init__(self, inner, how: str):
        super().__init__()
        self.inner, self.how, self.calls = inner, how, []

    def forward(self, input_ids, **kw):
        self.calls.append(sorted(kw))
        if "logits_to_keep" in kw and self.how == "refuse":
            raise TypeError("forward() got an unexpected keyword argument 'logits_to_keep'")
        keep = kw.pop("logits_to_keep", None)
        out = self.inner(input_ids=input_ids, **kw)
        if keep is not None and self.how == "one":
            out.logits = out.logits[:, -1:]
        return out


@pytest.mark.parametrize("how, calls", [("refuse", 2), ("ignore", 1), ("one", 2)])
def test_forward_keeps_the_asked_positions_whatever_the_architecture_does_with_logits_to_keep(how, calls):
    """``core.models.forward``: the last n positions or an index, from ``logits_to_keep`` where the model honours it,
    else indexed from one full forward (a second forward only where the first could not serve); ``keep=None``
    never passes the keyword. Bit-equal to the same positions of a plain full forward."""
    from inductionlab.core.models import forward

    torch.manual_seed(0)
    inner = make_tiny("llama")
    ids = torch.randint(10, 200, (2, 9))
    with torch.inference_mode():
        full = inner(input_ids=ids).logits
        for keep, want in ((3, full[:, -3:]), (torch.tensor([6, 2, 4]), full[:, [6, 2, 4]]), (None, full)):
            model = _Counting(inner, how)
            got = forward(model, ids, keep=keep).logits
            assert got.shape == want.shape and torch.equal(got, want)
            assert model.calls == ([[]] if keep is None else [["logits_to_keep"], []][:calls])
