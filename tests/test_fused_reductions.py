"""Reductions read from the fused kernel's log-sum-exp equal those read from the eager pattern.

``instrument(..., reductions=)`` alone runs SDPA's CPU flash attention and computes each target
probability as ``exp(scale·q·k_t + mask_t − lse)``; ``need_probs=True`` forces the eager kernel
and reads the same probability from the materialised ``[B, H, Q, K]`` pattern. On every tiny
architecture (GQA Llama, Qwen2, Gemma-3 with a 4-token sliding window, GPT-2, NeoX), fp32, with
left padding, cached decoding and every ablation kind, the two agree within 1e-6 and the
logits within 1e-5 (SDPA vs eager rounding, compounded over layers).
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from conftest import ARCHS, make_tiny
from inductionlab.core.instrument import HeadIntervention, instrument
from inductionlab.core.scores import induction_targets

ATOL_PROB, ATOL_LOGIT = 1e-6, 1e-5


def _batch(T=12, pad=(0, 3)):
    g = torch.Generator().manual_seed(1)
    S = torch.randint(10, 700, (len(pad), T), generator=g)
    ids, mask = S.clone(), torch.ones_like(S)
    for b, p in enumerate(pad):
        ids[b, :p], mask[b, :p] = 0, 0
    return ids, mask


def _run(model, ids, mask, targets, ivs=(), **kw):
    with torch.no_grad(), instrument(model, ivs, reductions={"t": targets}, strict=False, **kw) as inst:
        logits = model(input_ids=ids, attention_mask=mask).logits
        fused_used = inst.fused_calls == inst.calls > 0
    return inst.reduced["t"], logits, fused_used


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("ablation", ["none", "zero", "sink", "knockout"])
def test_fused_equals_eager(arch, ablation):
    model = make_tiny(arch)
    T = 12
    ids, mask = _batch(T)
    targets = torch.arange(-1, T - 1)                 # previous-token targets, absolute positions
    targets[5] = 0                                    # one query reads the first token (sink-like)
    ivs = {"none": [], "zero": [HeadIntervention(1, 0, "zero")], "sink": [HeadIntervention(0, 1, "sink")],
           "knockout": [HeadIntervention(1, 1, "knockout", edges=[(6, 5), (7, 6), (8, 7)])]}[ablation]
    fast, lf, used = _run(model, ids, mask, targets, ivs)
    slow, ls, _ = _run(model, ids, mask, targets, ivs, need_probs=True)
    assert used
    assert fast.shape == slow.shape and slow.abs().sum() > 0
    torch.testing.assert_close(fast, slow, atol=ATOL_PROB, rtol=0)
    torch.testing.assert_close(lf, ls, atol=ATOL_LOGIT, rtol=0)
    if ablation == "zero":
        assert fast[1, :, 0].abs().max() == 0


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_fused_cached_decoding_equals_full(arch):
    """A prefix cached and the rest decoded token by token (Q = 1 < K): same reductions as eager."""
    model = make_tiny(arch)
    T, P = 10, 6
    ids = torch.randint(10, 700, (1, T), generator=torch.Generator().manual_seed(2))
    targets = torch.tensor(induction_targets(T // 2, bos=False).tolist())
    out = {}
    for need in (None, True):
        with torch.no_grad(), instrument(model, reductions={"t": targets}, need_probs=need) as inst:
            cache = DynamicCache(config=model.config)
            model(input_ids=ids[:, :P], past_key_values=cache, use_cache=True)
            for i in range(P, T):
                model(input_ids=ids[:, i:i + 1], past_key_values=cache, use_cache=True)
        out[need] = inst.reduced["t"]
    torch.testing.assert_close(out[None], out[True], atol=ATOL_PROB, rtol=0)


def test_induction_head_scores_match_eager_path():
    """compute_head_scores' values (fused) equal the eager pattern's on the tiny GQA Llama."""
    from inductionlab.core.scores import score_from_pattern
    model = make_tiny("llama")
    Tc = 8
    S = torch.randint(10, 700, (3, Tc), generator=torch.Generator().manual_seed(4))
    ids = torch.cat([S, S], 1)
    t = induction_targets(Tc, bos=False)
    fast, _, _ = _run(model, ids, torch.ones_like(ids), t)
    with torch.no_grad(), instrument(model, keep_patterns=True) as inst:
        model(input_ids=ids)
    pat = torch.stack(inst.patterns)                    # [L, B, H, Q, K]
    ref = torch.stack([torch.as_tensor(score_from_pattern(pat[l], "induction", Tc, bos=False)) for l in range(pat.shape[0])])
    valid = t >= 0
    got = fast[..., valid].mean(dim=(1, 3))
    torch.testing.assert_close(got.double(), ref.double(), atol=ATOL_PROB, rtol=0)
