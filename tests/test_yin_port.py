"""Issue 34 deliverable 4: Yin & Steinhardt 2025's token-loss ablation, as their code runs it, equals our ``sink``.

Their ``icl-heads/src/evaluate_icl_score.py`` truncates the row to 505 tokens, caches a random-token run of
``[BOS] + 505`` random ids (506 tokens, ``run_and_cache_model_random_tokens``, batch dim removed), and hooks
``hook_v`` of each ablated head with ``utils/ablate_utils.head_ablation_hook``: the position-matched assignment
``[1, 505, d] ← [1, 506, d]`` raises, and the bare ``except`` writes the cache's position-0 value into every
position. Position 0 of the random run is BOS, whose value does not depend on the random tokens (causal), so the
head outputs v(BOS) everywhere: the ``sink`` cut onto the first token of a BOS-prefixed window.

The port below runs their hook on a Hugging Face Llama (no GQA, so one value head per query head, as in the models
they ablated), on ``v_proj``'s output viewed ``[batch, seq, n_heads, d_head]`` (TransformerLens' ``hook_v``).
"""

from __future__ import annotations

import pytest
import torch

from inductionlab.core.instrument import ablate

T = 24            # window tokens (their 505)
HEADS = [(0, 1), (1, 3)]


def head_ablation_hook(attn_result, hook, head_index_to_ablate, act_name, random_cache):
    """Yin & Steinhardt's hook, verbatim in its logic (``attn_result``: ``[batch, seq, n_heads, d_head]``;
    ``random_cache[act_name]``: ``[seq + 1, n_heads, d_head]``, the batch dim removed)."""
    try:
        attn_result[:, :, head_index_to_ablate, :] = random_cache[act_name][:, head_index_to_ablate, :].unsqueeze(0)
    except Exception:
        attn_result[:, :, head_index_to_ablate, :] = (
            random_cache[act_name][0, head_index_to_ablate, :].unsqueeze(0).unsqueeze(0))
        hook.fell_back = True
    return attn_result


@pytest.fixture(scope="module")
def model():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=4, max_position_embeddings=128, vocab_size=300, bos_token_id=1)
    return LlamaForCausalLM(cfg).eval()


def _v_hooks(model, fn):
    """Forward hooks on each layer's ``v_proj`` calling ``fn(layer, v [b, s, H, dh]) -> v``."""
    H = model.config.num_attention_heads
    hs = []
    for i, layer in enumerate(model.model.layers):
        def hook(mod, args, out, i=i):
            v = out.view(*out.shape[:2], H, -1).clone()
            return fn(i, v).reshape(out.shape)
        hs.append(layer.self_attn.v_proj.register_forward_hook(hook))
    return hs


def yin_logits(model, ids: torch.Tensor, heads, seed: int = 42) -> tuple[torch.Tensor, bool]:
    """Logits of ``ids`` ``[1, T]`` under the port of their ablation; also whether every hook took the ``except``."""
    g = torch.Generator().manual_seed(seed)
    rand = torch.cat([torch.tensor([[1]]), torch.randint(0, model.config.vocab_size, (1, ids.shape[1] + 1),
                                                          generator=g)], 1)[:, :ids.shape[1] + 1]   # BOS + 505 -> 506
    cache = {}
    hs = _v_hooks(model, lambda i, v: cache.__setitem__(f"v{i}", v[0]) or v)       # remove_batch_dim
    with torch.no_grad():
        model(rand)
    for h in hs:
        h.remove()
    assert cache["v0"].shape[0] == ids.shape[1] + 1
    fell = []

    def fn(i, v):
        for layer, head in heads:
            if layer == i:
                hook = type("Hook", (), {"fell_back": False})()
                v = head_ablation_hook(v, hook, head, f"v{i}", cache)
                fell.append(hook.fell_back)
        return v
    hs = _v_hooks(model, fn)
    try:
        with torch.no_grad():
            out = model(ids).logits
    finally:
        for h in hs:
            h.remove()
    return out, all(fell) and len(fell) == len(heads)


def test_yin_hook_as_run_equals_the_sink_cut_on_bos_windows(model):
    g = torch.Generator().manual_seed(1)
    ids = torch.cat([torch.tensor([[1]]), torch.randint(2, 300, (1, T - 1), generator=g)], 1)   # BOS-prefixed
    theirs, fell_back = yin_logits(model, ids, HEADS)
    assert fell_back                                   # the position-matched assignment raised, every time
    with torch.no_grad(), ablate(model, HEADS, "sink"):
        ours = model(ids).logits
    with torch.no_grad():
        intact = model(ids).logits
    assert (theirs - ours).abs().max().item() < 1e-4
    assert (theirs - intact).abs().max().item() > 1e-2          # the ablation does something
    # another random source gives the same numbers: the random tokens never reach the ablated heads
    assert torch.allclose(yin_logits(model, ids, HEADS, seed=7)[0], theirs, atol=1e-6)


def test_yin_hook_is_not_our_resample_and_needs_a_bos_window(model):
    """Named differences: our ``resample`` writes the random run's output position by position (not v(BOS)); and on
    a window without a leading BOS, v(BOS) is not the window's first value, so their hook is no longer ``sink``."""
    g = torch.Generator().manual_seed(2)
    ids = torch.cat([torch.tensor([[1]]), torch.randint(2, 300, (1, T - 1), generator=g)], 1)
    theirs, _ = yin_logits(model, ids, HEADS)
    with torch.no_grad(), ablate(model, HEADS, "resample", source_ids=torch.randint(2, 300, (1, T), generator=g)):
        resampled = model(ids).logits
    assert (theirs - resampled).abs().max().item() > 1e-3
    no_bos = ids[:, 1:]
    theirs_nb, _ = yin_logits(model, no_bos, HEADS)
    with torch.no_grad(), ablate(model, HEADS, "sink"):
        sink_nb = model(no_bos).logits
    assert (theirs_nb - sink_nb).abs().max().item() > 1e-3
