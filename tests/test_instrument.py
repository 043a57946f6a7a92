"""Instrumentation: transparency, per-query-head interventions, no global side effects."""

from __future__ import annotations

import pytest
import torch

from conftest import ARCHS, make_tiny
from inductionlab.errors import InductionLabError
from inductionlab.core.instrument import (ABLATION_METHODS, AblationMethod, HeadIntervention, NoOpIntervention,
                                     UnsupportedArchitecture, ablate, ablation_methods, gather_targets,
                                     head_output_means, instrument, self_check)
from inductionlab.core.models import attention_shape


def ids_for(model, B=2, T=12, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(5, model.config.vocab_size, (B, T), generator=g)


def attn_module(model, layer):
    for name, m in model.named_modules():
        if getattr(m, "layer_idx", None) == layer and name.endswith(("attn", "attention", "self_attn")):
            return m
    raise LookupError


def out_proj(attn):
    for name in ("o_proj", "dense", "c_proj"):
        if hasattr(attn, name):
            return getattr(attn, name)
    raise LookupError


def per_head_outputs(model, ids, layer, ctx):
    """Per-head attention outputs (o_proj input) of one layer: [B, T, H, D]."""
    shape = attention_shape(model.config)
    got = {}
    h = out_proj(attn_module(model, layer)).register_forward_pre_hook(lambda m, a: got.__setitem__("x", a[0].detach().clone()))
    try:
        with torch.inference_mode(), ctx:
            model(input_ids=ids)
    finally:
        h.remove()
    x = got["x"]
    return x.reshape(*x.shape[:2], shape["n_heads"], shape["head_dim"])


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_instrumented_logits_equal_plain(arch, attn):
    model = make_tiny(arch, attn)
    ids = ids_for(model)
    with torch.inference_mode():
        plain = model(input_ids=ids).logits
        with instrument(model) as inst:
            same = model(input_ids=ids).logits
        # reading probabilities (eager path) on an eager model is bit-identical too
        if attn == "eager":
            with instrument(model, reductions={"prev": torch.arange(ids.shape[1]) - 1}):
                same_eager = model(input_ids=ids).logits
            assert torch.equal(plain, same_eager)
    assert inst.calls == attention_shape(model.config)["n_layers"]
    assert torch.equal(plain, same)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3", "gpt2", "gpt_neox"])
@pytest.mark.parametrize("method", ["zero", "mean", "sink"])
def test_ablation_changes_only_the_named_query_head(arch, method):
    model = make_tiny(arch)
    ids = ids_for(model)
    shape = attention_shape(model.config)
    layer, head = 1, shape["n_heads"] - 1 if arch != "llama" else 3
    base = per_head_outputs(model, ids, layer, torch.no_grad())
    ref = ids_for(model, seed=7) if method == "mean" else None
    abl = per_head_outputs(model, ids, layer, ablate(model, [(layer, head)], method, reference_ids=ref))
    for h in range(shape["n_heads"]):
        if h == head:
            assert not torch.equal(base[:, :, h], abl[:, :, h])
        else:
            assert torch.equal(base[:, :, h], abl[:, :, h]), f"head {h} changed"
    if method == "zero":
        assert torch.count_nonzero(abl[:, :, head]) == 0
    if method == "mean":
        means = head_output_means(model, ref)
        assert torch.allclose(abl[:, :, head], means[layer, head].expand_as(abl[:, :, head]), atol=1e-6)


def test_gqa_shapes_are_query_heads():
    model = make_tiny("llama")  # 8 query heads, 2 KV heads
    ids = ids_for(model)
    with torch.inference_mode(), instrument(model, reductions={"sink": torch.zeros(ids.shape[1], dtype=torch.long)}) as inst:
        model(input_ids=ids)
    assert inst.reduced["sink"].shape == (2, 2, 8, 12)  # [layers, B, query heads, Q]


def test_sink_and_zero_show_in_reductions():
    model = make_tiny("gemma3")
    ids = ids_for(model)
    T = ids.shape[1]
    red = {"sink": torch.zeros(T, dtype=torch.long), "prev": torch.arange(T) - 1}
    # layer 1 is full attention; layer 0 is sliding-window (4 keys), where key 0 leaves the window
    ivs = [HeadIntervention(1, 1, "sink"), HeadIntervention(0, 1, "sink"), HeadIntervention(1, 2, "zero")]
    with torch.inference_mode(), instrument(model, ivs, reductions=red) as inst:
        model(input_ids=ids)
    assert torch.allclose(inst.reduced["sink"][1, :, 1], torch.ones(2, T))
    # inside the window the head rests on key 0; past it, no key is left and the head writes nothing
    assert torch.allclose(inst.reduced["sink"][0, :, 1, :4], torch.ones(2, 4))
    assert torch.count_nonzero(inst.reduced["sink"][0, :, 1, 4:]) == 0
    assert torch.count_nonzero(inst.reduced["sink"][1, :, 2]) == 0
    assert torch.count_nonzero(inst.reduced["prev"][1, :, 2]) == 0


def test_reductions_match_full_patterns():
    model = make_tiny("qwen2", "eager")
    ids = ids_for(model, T=10)
    t = torch.arange(10) - 2
    with torch.inference_mode(), instrument(model, reductions={"lag2": t}, keep_patterns=True) as inst:
        model(input_ids=ids)
    for layer, pat in enumerate(inst.patterns):
        assert torch.allclose(pat.sum(-1), torch.ones_like(pat.sum(-1)), atol=1e-5)
        assert torch.equal(inst.reduced["lag2"][layer], gather_targets(pat, t))


def test_knockout_changes_logits_and_noop_raises():
    model = make_tiny("llama")
    ids = ids_for(model, B=1, T=8)
    T = ids.shape[1]
    prev_edges = [(q, q - 1) for q in range(1, T)]
    with torch.inference_mode():
        plain = model(input_ids=ids).logits
        with instrument(model, [HeadIntervention(1, 0, "knockout", edges=prev_edges)],
                        reductions={"prev": torch.arange(T) - 1}) as inst:
            ko = model(input_ids=ids).logits
        assert not torch.equal(plain, ko)
        assert torch.count_nonzero(inst.reduced["prev"][1, :, 0]) == 0
        assert torch.count_nonzero(inst.reduced["prev"][1, :, 1]) > 0
        # a future edge is already masked by causality: knocking it out provably does nothing
        with pytest.raises(NoOpIntervention):
            with instrument(model, [HeadIntervention(1, 0, "knockout", edges=[(2, 5)])]):
                model(input_ids=ids)


def test_knockout_of_every_key_zeroes_the_row():
    model = make_tiny("llama")
    ids = ids_for(model, B=1, T=6)
    edges = torch.zeros(6, 6, dtype=torch.bool)
    edges[3, :4] = True  # query 3 loses every key it could see
    base = per_head_outputs(model, ids, 0, torch.no_grad())
    out = per_head_outputs(model, ids, 0, instrument(model, [HeadIntervention(0, 5, "knockout", edges=edges)]))
    assert torch.count_nonzero(out[0, 3, 5]) == 0
    assert torch.equal(out[0, :3, 5], base[0, :3, 5]) and torch.equal(out[0, 4:, 5], base[0, 4:, 5])


def test_context_exit_leaves_no_trace():
    a, b = make_tiny("llama", seed=0), make_tiny("gpt2", seed=1)
    ids_a, ids_b = ids_for(a), ids_for(b)
    with torch.inference_mode():
        before_a, before_b = a(input_ids=ids_a).logits, b(input_ids=ids_b).logits
        impl = a.config._attn_implementation
        with ablate(a, [(0, 0), (1, 3)]):
            a(input_ids=ids_a)
            during_b = b(input_ids=ids_b).logits   # the other model is untouched while a is instrumented
        after_a, after_b = a(input_ids=ids_a).logits, b(input_ids=ids_b).logits
    assert a.config._attn_implementation == impl
    assert torch.equal(before_a, after_a) and torch.equal(before_b, after_b) and torch.equal(before_b, during_b)


def test_self_check_passes_and_bad_heads_raise():
    model = make_tiny("gemma3")
    report = self_check(model, ids_for(model))
    assert report["max_abs_diff_plain"] == 0.0
    with pytest.raises(InductionLabError, match="out of range"):
        with ablate(model, [(2, 0)]):
            pass
    with pytest.raises(InductionLabError, match="out of range"):
        with ablate(model, [(0, 4)]):
            pass
    with pytest.raises(InductionLabError, match="unknown ablation method"):
        with ablate(model, [(0, 0)], "scramble"):
            pass


def test_unsupported_architecture_raises():
    from transformers import LlamaConfig

    class NotDispatching(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = LlamaConfig(num_hidden_layers=1, num_attention_heads=2, hidden_size=8)
            self.lin = torch.nn.Linear(8, 8)

    with pytest.raises(UnsupportedArchitecture):
        with instrument(NotDispatching()):
            pass


def test_registry_lists_methods_for_ablate_and_instrument():
    assert ablation_methods() == ("zero", "mean", "sink", "resample")
    assert ablation_methods(with_edges=True) == ("zero", "mean", "sink", "resample", "patch", "knockout")
    kinds = {n: "mask" if m.cut else "output" for n, m in ABLATION_METHODS.items()}
    assert kinds == {"zero": "output", "mean": "output", "sink": "mask", "resample": "output", "patch": "output",
                     "knockout": "mask"}


def _negate(iv, out, where):
    """Toy output edit: the head writes minus its output."""
    return -out


def _keep_self_and_previous(iv, pos):
    """Toy mask edit: each query keeps only itself and the previous position."""
    q, k = pos.query[:, :, None], pos.key[:, None, :]
    return (k != q) & (k != q - 1)


def test_a_new_output_edit_method_is_one_function_and_one_entry(monkeypatch):
    monkeypatch.setitem(ABLATION_METHODS, "negate", AblationMethod("negate", "toy", replace=_negate))
    assert "negate" in ablation_methods()
    model = make_tiny("llama")
    ids = ids_for(model)
    base = per_head_outputs(model, ids, 1, torch.no_grad())
    out = per_head_outputs(model, ids, 1, ablate(model, [(1, 3)], "negate"))
    assert torch.equal(out[:, :, 3], -base[:, :, 3])
    keep = [h for h in range(8) if h != 3]
    assert torch.equal(out[:, :, keep], base[:, :, keep])


def test_a_new_mask_edit_method_is_one_function_and_one_entry(monkeypatch):
    from test_scores import uniform_llama
    monkeypatch.setitem(ABLATION_METHODS, "local", AblationMethod("local", "toy", cut=_keep_self_and_previous))
    model = uniform_llama()                           # uniform causal attention: 1/(q+1) on each key
    T = 8
    ids = torch.arange(2, 2 + T)[None]
    prev = torch.arange(T) - 1
    with torch.inference_mode(), ablate(model, [(0, 2)], "local") as inst:   # strict: it must change something
        model(input_ids=ids)
    assert inst.effect == {0: True}
    with torch.inference_mode(), instrument(model, [HeadIntervention(0, 2, "local")], reductions={"prev": prev}) as inst:
        model(input_ids=ids)
    r = inst.reduced["prev"][:, 0]                     # [layers, heads, Q]
    want_uniform = torch.tensor([0.0] + [1 / (q + 1) for q in range(1, T)])
    assert torch.allclose(r[0, 2, 1:], torch.full((T - 1,), 0.5))    # two keys left: 1/2 on the previous one
    assert torch.allclose(r[0, 1], want_uniform) and torch.allclose(r[1, 2], want_uniform)


@pytest.mark.parametrize("heads, match", [
    ([(18, 6.7)], r"layer must be an integer in 0-1|head must be an integer in 0-7"),
    ([(1, 6.7)], r"head must be an integer in 0-7, got 6.7"),
    ([(1, True)], r"head must be an integer in 0-7"),
    ([(1, "3")], r"head must be an integer in 0-7"),
    ([(2, 0)], r"head \(2, 0\) out of range: the model has 2 layers \(0-1\) x 8 query heads \(0-7\)"),
    ([(0, 8)], r"out of range"),
    ([(-1, 0)], r"out of range"),
])
def test_heads_must_be_integers_in_range(heads, match):
    model = make_tiny("llama")
    with pytest.raises(InductionLabError, match=match):
        with ablate(model, heads):
            pass


def test_integer_like_heads_and_loaded_bundles_are_accepted(tiny_loaded):
    import numpy as np
    ids = ids_for(tiny_loaded.model)
    a = per_head_outputs(tiny_loaded.model, ids, 1, ablate(tiny_loaded, [(np.int64(1), torch.tensor(3))]))
    assert torch.count_nonzero(a[:, :, 3]) == 0


def test_method_misuse_is_one_line():
    model = make_tiny("llama")
    with pytest.raises(InductionLabError, match="unknown ablation method 'scramble'; use one of zero, mean, sink, resample, patch, knockout"):
        with ablate(model, [(0, 0)], "scramble"):
            pass
    with pytest.raises(InductionLabError, match="knockout needs edges; use instrument"):
        with ablate(model, [(0, 0)], "knockout"):
            pass
    with pytest.raises(InductionLabError, match="needs a reference batch"):
        with ablate(model, [(0, 0)], "mean"):
            pass
    with pytest.raises(InductionLabError, match="knockout positions must be >= 0"):
        with instrument(model, [HeadIntervention(0, 0, "knockout", edges=[(3, -1)])]):
            pass
    with pytest.raises(InductionLabError, match="holds no real token"):
        head_output_means(model, torch.ones(1, 4, dtype=torch.long), attention_mask=torch.zeros(1, 4, dtype=torch.long))


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_ablated_forward_lets_sdpa_run_causal_as_the_plain_model_does(arch, monkeypatch):
    """Under instrumentation the model's mask function is ours and builds an explicit causal mask;
    a layer without mask edits must still reach SDPA with no mask and is_causal (the plain model's
    call, which skips the masked blocks), and a padded batch must keep its mask."""
    model = make_tiny(arch)
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kw):
        calls.append((attn_mask is None, bool(is_causal)))
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    ids = ids_for(model)
    n_layers = attention_shape(model.config)["n_layers"]
    with torch.inference_mode():
        plain = model(input_ids=ids).logits
        calls.clear()
        with ablate(model, [(1, 0)], "zero"):
            zeroed = model(input_ids=ids).logits
    assert calls == [(True, True)] * n_layers
    assert not torch.equal(plain, zeroed)                       # the ablation did run
    mask = torch.ones_like(ids)
    mask[0, :3] = 0                                             # left padding: the mask must stay
    calls.clear()
    with torch.inference_mode(), ablate(model, [(1, 0)], "zero"):
        model(input_ids=ids, attention_mask=mask)
    assert calls and all(c == (False, False) for c in calls)
