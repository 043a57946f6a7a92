"""Interventions and reductions name absolute positions (issue 11 §1): position 0 is a row's first
real token, and a query decoded against a KV cache keeps its position in the whole sequence.

For every method (zero, mean, sink, knockout with tensor and pair edges) and for reductions:
(a) a left-padded batch gives each row what it gives alone, (b) cached decoding (a prefix cached,
the rest decoded token by token) gives what the full forward gives — on the tiny GQA Llama and
the Gemma-3 config with a 4-token sliding window (whose cache drops keys), fp32, within 1e-5.
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from conftest import make_tiny
from inductionlab.core.instrument import HeadIntervention, ablate, head_output_means, instrument

ATOL = 1e-5
LENGTHS = (5, 9, 7)          # rows of the padded batch
T_FULL, PREFIX = 10, 6       # cached decoding: 6 tokens cached, 4 decoded one by one


def seqs(n_tokens=LENGTHS, seed=3, vocab=700):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(10, vocab, (n,), generator=g) for n in n_tokens]


def left_pad(rows, pad_id=0):
    """Left-padded ids [B, P], mask [B, P] and mask-derived position ids [B, P]."""
    P = max(len(r) for r in rows)
    ids = torch.full((len(rows), P), pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), P, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, P - len(r):] = r
        mask[b, P - len(r):] = 1
    return ids, mask, (mask.cumsum(1) - 1).clamp(min=0)


def reductions(T):
    t = torch.arange(T)
    return {"previous": t - 1, "sink": torch.where(t > 0, 0, -1), "lag3": torch.where(t >= 3, t - 3, -1)}


def interventions(model, method):
    """Interventions of one method on heads of both layers (layer 0 of Gemma-3 is sliding)."""
    if method == "zero":
        return [HeadIntervention(0, 1, "zero"), HeadIntervention(1, 2, "zero")]
    if method == "mean":
        means = head_output_means(model, torch.stack(seqs((8, 8), seed=11)))
        return [HeadIntervention(0, 1, "mean", value=means[0, 1]), HeadIntervention(1, 2, "mean", value=means[1, 2])]
    if method == "sink":
        return [HeadIntervention(0, 1, "sink"), HeadIntervention(1, 2, "sink")]
    if method == "knockout-tensor":
        e = torch.zeros(12, 12, dtype=torch.bool)
        q = torch.arange(1, 12)
        e[q, q - 1] = True                    # previous-token edges
        e[6, 2] = e[8, 0] = True
        return [HeadIntervention(0, 1, "knockout", edges=e), HeadIntervention(1, 2, "knockout", edges=e)]
    if method == "knockout-pairs":
        pairs = [(q, q - 1) for q in range(1, 12)] + [(6, 2), (8, 0)]
        return [HeadIntervention(0, 1, "knockout", edges=pairs), HeadIntervention(1, 2, "knockout", edges=pairs)]
    assert method == "none"
    return []


METHODS = ["none", "zero", "mean", "sink", "knockout-tensor", "knockout-pairs"]


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def model(request):
    return make_tiny(request.param)


@pytest.mark.parametrize("method", METHODS)
def test_left_padded_batch_equals_each_row_alone(model, method):
    rows = seqs()
    ids, mask, pos = left_pad(rows)
    P = ids.shape[1]
    ivs = interventions(model, method)
    red = reductions(P)
    with torch.inference_mode():
        with instrument(model, ivs, reductions=red, strict=False) as inst:
            padded = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        got = {n: r.clone() for n, r in inst.reduced.items()}
        for b, r in enumerate(rows):
            n = len(r)
            with instrument(model, ivs, reductions=red, strict=False) as inst:
                alone = model(input_ids=r[None]).logits
            torch.testing.assert_close(padded[b, P - n:], alone[0], atol=ATOL, rtol=0)
            for name in red:
                # reductions are indexed by absolute query position: row b's first n entries
                torch.testing.assert_close(got[name][:, b, :, :n], inst.reduced[name][:, 0, :, :n], atol=ATOL, rtol=0)
                assert torch.count_nonzero(got[name][:, b, :, n:]) == 0          # past the row's end: nothing


@pytest.mark.parametrize("method", METHODS)
def test_cached_decoding_equals_full_forward(model, method):
    x = seqs((T_FULL,), seed=5)[0][None]
    ivs = interventions(model, method)
    red = reductions(T_FULL)
    with torch.inference_mode():
        with instrument(model, ivs, reductions=red) as inst:
            full = model(input_ids=x).logits
        want = {n: r.clone() for n, r in inst.reduced.items()}
        with instrument(model, ivs, reductions=red) as inst:
            cache = DynamicCache(config=model.config)
            steps = [model(input_ids=x[:, :PREFIX], cache=cache, use_cache=True).logits]
            for t in range(PREFIX, T_FULL):
                steps.append(model(input_ids=x[:, t:t + 1], cache=cache, use_cache=True).logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=ATOL, rtol=0)
    for name in red:
        torch.testing.assert_close(inst.reduced[name], want[name], atol=ATOL, rtol=0)


@pytest.mark.parametrize("method", ["sink", "knockout-pairs"])
def test_left_padded_cached_decoding_equals_each_row_alone(model, method):
    rows = seqs((4, 7), seed=8)
    extra = seqs((3, 3), seed=9)                         # tokens decoded after each row
    ids, mask, pos = left_pad(rows)
    ivs = interventions(model, method)
    with torch.inference_mode(), instrument(model, ivs, strict=False):
        cache = DynamicCache(config=model.config)
        out = [model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True).logits[:, -1]]
        nxt = pos[:, -1]
        for t in range(3):
            mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], 1)
            nxt = nxt + 1
            col = torch.stack([e[t] for e in extra])[:, None]
            out.append(model(input_ids=col, attention_mask=mask, position_ids=nxt[:, None], cache=cache,
                             use_cache=True).logits[:, -1])
        for b, r in enumerate(rows):
            alone = model(input_ids=torch.cat([r, extra[b]])[None]).logits[0, len(r) - 1:]
            torch.testing.assert_close(torch.stack([o[b] for o in out]), alone, atol=ATOL, rtol=0)


def test_mean_reference_counts_real_tokens_only(model):
    """head_output_means over a padded batch == the mean of the rows' per-head outputs alone."""
    rows = seqs((3, 8), seed=4)
    ids, mask, _ = left_pad(rows)
    ids_r = torch.zeros_like(ids)
    mask_r = torch.zeros_like(mask)
    for b, r in enumerate(rows):                  # right-padded too
        ids_r[b, :len(r)] = r
        mask_r[b, :len(r)] = 1
    with torch.inference_mode(), instrument(model, capture_head_means=True) as inst:
        for r in rows:
            model(input_ids=r[None])
    want = inst.head_output_sum / inst.head_output_count
    assert inst.head_output_count == 11
    for i, m in ((ids_r, mask_r), (ids, mask)):
        pos = (m.cumsum(1) - 1).clamp(min=0)
        with torch.inference_mode(), instrument(model, capture_head_means=True) as inst:
            model(input_ids=i, attention_mask=m, position_ids=pos)
        torch.testing.assert_close(inst.head_output_sum / inst.head_output_count, want, atol=ATOL, rtol=0)


# -- the three faults of issue 11 §1, on its exact tiny Llama ----------------------------------

@pytest.fixture(scope="module")
def issue_llama():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    return LlamaForCausalLM(cfg).eval()


def o_proj_inputs(model, **kw):
    got = []
    hooks = [l.self_attn.o_proj.register_forward_pre_hook(lambda m, a: got.append(a[0].detach().clone()))
             for l in model.model.layers]
    try:
        with torch.inference_mode():
            model(**kw)
    finally:
        for h in hooks:
            h.remove()
    return got


def test_issue_sink_under_left_padding_is_the_first_real_token(issue_llama):
    m = issue_llama
    short, long_ = torch.tensor([5, 17, 9]), torch.arange(20, 28)
    ids, mask, pos = left_pad([short, long_])
    with torch.inference_mode():
        with ablate(m, [(0, 1)], "sink"):
            alone = m(input_ids=short[None]).logits[0, -1]
            padded = m(input_ids=ids, attention_mask=mask, position_ids=pos).logits[0, -1]
        with ablate(m, [(0, 1)], "zero"):
            zero = m(input_ids=ids, attention_mask=mask, position_ids=pos).logits[0, -1]
    assert (padded - alone).abs().max() < ATOL          # was 0.168
    assert (padded - zero).abs().max() > 0.1            # was 0: sink had become zero ablation


def test_issue_mean_reference_skips_padding_and_ablate_takes_its_mask(issue_llama):
    m = issue_llama
    ids = torch.zeros(2, 8, dtype=torch.long)
    mask = torch.zeros(2, 8, dtype=torch.long)
    ids[0, :3], ids[1] = torch.tensor([5, 17, 9]), torch.arange(20, 28)
    mask[0, :3], mask[1] = 1, 1
    outs = o_proj_inputs(m, input_ids=ids, attention_mask=mask)
    want = torch.stack([x.reshape(2, 8, 4, 16)[mask.bool()].mean(0) for x in outs])   # 11 real tokens
    all_slots = torch.stack([x.reshape(16, 4, 16).mean(0) for x in outs])
    got = head_output_means(m, ids, attention_mask=mask)
    assert (got - want).abs().max() < ATOL
    assert (all_slots - want).abs().max() > 0.01        # the old answer (mean over 16 slots) is far off
    x = torch.tensor([[3, 50, 60, 70]])
    with ablate(m, [(1, 2)], "mean", reference_ids=ids, reference_mask=mask):
        out = o_proj_inputs(m, input_ids=x)[1].reshape(1, 4, 4, 16)
    torch.testing.assert_close(out[0, :, 2], want[1, 2].expand(4, 16), atol=ATOL, rtol=0)


@pytest.mark.parametrize("edges", ["tensor", "pairs"])
def test_issue_knockout_edges_are_absolute_under_a_kv_cache(issue_llama, edges):
    m = issue_llama
    x = torch.tensor([[3, 50, 60, 70, 80, 90, 100]])
    if edges == "tensor":
        e = torch.zeros(7, 7, dtype=torch.bool)
        e[6, 2] = True
    else:
        e = [(6, 2)]
    iv = [HeadIntervention(0, 1, "knockout", edges=e)]
    with torch.inference_mode():
        plain = m(input_ids=x).logits[0, -1]
        with instrument(m, iv):
            full = m(input_ids=x).logits[0, -1]
        with instrument(m, iv):                           # strict: the edge must take effect
            cache = DynamicCache(config=m.config)
            m(input_ids=x[:, :6], cache=cache, use_cache=True)
            decoded = m(input_ids=x[:, 6:], cache=cache, use_cache=True).logits[0, -1]
    assert (full - plain).abs().max() > 0.02             # 0.031: the knockout does something
    assert (decoded - full).abs().max() < ATOL          # was: equal to no knockout / NoOp / IndexError
