"""Attribution patching (AtP, AtP*'s GradDrop) and direct logit attribution, against exact patching and against
decompositions worked out independently here (tiny random models; GQA Llama: 8 query heads on 2 KV heads).

The first-order checks run the model in float64: an exact patching effect of a patch scaled by eps = 1e-3 is
~1e-7 of a probability, below float32's resolution of the logits it is read from."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import make_tiny
from inductionlab.core.anatomy import final_norm, mlp_module, output_projection, unembedding
from inductionlab.core.attribution import attribution_patching, direct_logit_attribution
from inductionlab.core.instrument import HeadIntervention, head_outputs
from inductionlab.core.patching import patched_last_logits
from inductionlab.errors import InductionLabError

L, H, D = 2, 8, 8           # make_tiny("llama"): 2 layers, 8 query heads, 2 KV heads, head_dim 8


@pytest.fixture(scope="module")
def llama64():
    return make_tiny("llama").double()


def _ids(seed: int, T: int = 12) -> list[int]:
    return torch.randint(5, 700, (T,), generator=torch.Generator().manual_seed(seed)).tolist()


def _last_outputs(model, ids, under=()) -> torch.Tensor:
    """Every head's last-position output ``[L, H, D]`` (float64), read by the instrumentation's capture."""
    heads = [(l, h) for l in range(L) for h in range(H)]
    if under:
        from inductionlab.core.instrument import instrument
        with torch.inference_mode(), instrument(model, list(under), capture_heads=heads, strict=False) as inst:
            model(input_ids=torch.tensor([ids]))
        outs = inst.captured
    else:
        outs = head_outputs(model, torch.tensor([ids]), heads)
    return torch.stack([outs[lh][0, -1] for lh in heads]).reshape(L, H, D).double()


def _exact(model, ids, target, source, metric="prob", under=()) -> np.ndarray:
    """Each head's exact patching effect (one patch set per head, core/patching), ``[L, H]``."""
    base, logits, _ = patched_last_logits(model, ids, [[(l, h, source[l, h])] for l in range(L) for h in range(H)],
                                          under=under)
    f = torch.softmax if metric == "prob" else torch.log_softmax
    return (f(logits.double(), -1)[:, target] - f(base.double(), -1)[target]).reshape(L, H).numpy()


@pytest.mark.parametrize("metric,under", [("prob", ()), ("logprob", ()),
                                          ("prob", (HeadIntervention(0, 3, "zero"),))])
def test_atp_is_exact_patching_to_first_order(llama64, metric, under):
    """source = clean + eps·d: the ratio exact / AtP tends to 1, its error shrinking like eps (second order)."""
    ids, target = _ids(0), 7
    clean = _last_outputs(llama64, ids, under)
    d = torch.randn(L, H, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    if under:
        d[0, 3] = 0.0                              # the ablated head is held at 0: not patched
    errs = []
    for eps in (1e-1, 1e-2, 1e-3):
        src = clean + eps * d
        est = attribution_patching(llama64, [ids], target, src, metric=metric, under=under).atp[0]
        exact = _exact(llama64, ids, target, src, metric, under)
        live = np.abs(est) > 1e-3 * np.abs(est).max()
        assert live.sum() >= L * H - 2
        errs.append(np.abs(exact[live] / est[live] - 1).max())
    assert errs[2] < 0.05, errs
    assert errs[1] / errs[2] > 5 and errs[0] / errs[1] > 3, errs       # O(eps): ~10x per decade


def test_a_head_that_does_not_reach_the_metric_gets_zero(llama64):
    model = make_tiny("llama").double()
    with torch.no_grad():
        w = output_projection(model, 0).weight                 # [hidden, H·D]: head 5's columns zeroed
        w[:, 5 * D:6 * D] = 0.0
    ids, target = _ids(2), 11
    src = _last_outputs(model, ids) + torch.randn(L, H, D, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    r = attribution_patching(model, [ids], target, src, graddrop=True)
    exact = _exact(model, ids, target, src)
    assert r.atp[0, 0, 5] == 0.0 and r.graddrop[0, 0, 5] == 0.0
    assert abs(exact[0, 5]) < 1e-12 and np.abs(exact).max() > 1e-5
    assert np.count_nonzero(r.atp[0]) == L * H - 1
    dla = direct_logit_attribution(model, [ids], target)
    assert dla.heads["logit"][0, 0, 5] == 0.0


def test_gqa_slices_address_the_named_query_head(llama64):
    """A source that differs from the clean outputs at one query head only: that head alone gets an estimate, and
    it matches that head's exact patch; its KV-group peers (heads 4-7 of layer 1 share KV head 1) get 0."""
    ids, target = _ids(4), 20
    clean = _last_outputs(llama64, ids)
    src = clean.clone()
    src[1, 6] += 1e-3 * torch.randn(D, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    est = attribution_patching(llama64, [ids], target, src).atp[0]
    exact = _exact(llama64, ids, target, src)
    assert np.count_nonzero(est) == 1 and est[1, 6] != 0
    assert exact[1, 6] == pytest.approx(est[1, 6], rel=0.02)


def test_a_source_prompt_is_its_heads_outputs_at_the_same_positions(llama64):
    ids, other, target = _ids(6), _ids(7, T=9), 3
    from_prompt = attribution_patching(llama64, [ids], target, [other])
    from_values = attribution_patching(llama64, [ids], target, _last_outputs(llama64, other))
    np.testing.assert_allclose(from_prompt.atp, from_values.atp, rtol=1e-9, atol=1e-15)
    itself = attribution_patching(llama64, [ids], target, [ids], positions=[-1, -3])
    assert not itself.atp.any()                                # a patch with the run's own outputs moves nothing
    zero = attribution_patching(llama64, [ids, other], [target, 9], "zero")
    assert zero.atp.shape == (2, L, H) and zero.mean().shape == (L, H)
    np.testing.assert_allclose(zero.mean(), zero.atp.mean(0))


def test_graddrop_is_the_mean_over_dropped_layers_of_the_absolute_estimates(llama64):
    """Two layers: a layer-1 head's ĉ_GD is |ĉ_AtP| (dropping layer 0 changes nothing above it, dropping layer 1
    gives 0; divided by L − 1 = 1); a layer-0 head's is |its estimate with layer 1's writes cut from the backward
    pass|, computed here another way: layer 1's attention and MLP outputs detached, the gradient read at the input
    of layer 0's o_proj."""
    from inductionlab.core.anatomy import attention_module
    ids, target = _ids(8), 30
    clean = _last_outputs(llama64, ids)
    src = clean + torch.randn(L, H, D, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    r = attribution_patching(llama64, [ids], target, src, graddrop=True)
    np.testing.assert_allclose(r.graddrop[0, 1], np.abs(r.atp[0, 1]), rtol=1e-12)
    seen = {}

    def leaf(module, args):
        seen["a"] = args[0].detach().requires_grad_()
        return (seen["a"],)

    def cut(module, args, output):
        return (output[0].detach(), *output[1:]) if isinstance(output, tuple) else output.detach()
    hooks = [output_projection(llama64, 0).register_forward_pre_hook(leaf),
             attention_module(llama64, 1).register_forward_hook(cut), mlp_module(llama64, 1).register_forward_hook(cut)]
    try:
        logits = llama64(input_ids=torch.tensor([ids])).logits[0, -1]
    finally:
        for h in hooks:
            h.remove()
    (g,) = torch.autograd.grad(torch.softmax(logits, -1)[target], seen["a"])
    g = g[0, -1].reshape(H, D)
    cut_est = ((src[0] - clean[0]) * g).sum(-1).numpy()
    np.testing.assert_allclose(r.graddrop[0, 0], np.abs(cut_est), rtol=1e-9)
    assert not np.allclose(np.abs(cut_est), np.abs(r.atp[0, 0]))         # the dropped path mattered


def _independent_rest(model, arch, ids, target):
    """The logit share of everything but the heads, summed here from the embeddings, the MLP outputs and the
    output projections' biases at the last position, through the final norm frozen at the clean run."""
    parts, hooks = [], []
    emb = model.get_input_embeddings()
    hooks.append(emb.register_forward_hook(lambda m, a, o: parts.append(o[0, -1].detach().double())))
    if arch == "gpt2":
        hooks.append(model.transformer.wpe.register_forward_hook(lambda m, a, o: parts.append(o[0, -1].detach().double())))
    for l in range(model.config.num_hidden_layers):
        hooks.append(mlp_module(model, l).register_forward_hook(lambda m, a, o: parts.append(o[0, -1].detach().double())))
        b = getattr(output_projection(model, l), "bias", None)
        if b is not None:
            parts.append(b.detach().double())
    x = {}

    def norm_input(module, args, output):
        x["x"] = args[0][0, -1].detach().double()
    hooks.append(final_norm(model).register_forward_hook(norm_input))
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]))
    finally:
        for h in hooks:
            h.remove()
    v, x = sum(parts), x["x"]
    norm, u = final_norm(model), unembedding(model).weight[target].detach().double()
    if arch == "gpt2":
        sigma = torch.sqrt(x.var(unbiased=False) + norm.eps)
        return float((norm.weight.detach().double() * (v - v.mean()) / sigma + norm.bias.detach().double()) @ u)
    sigma = torch.sqrt((x * x).mean() + norm.variance_epsilon)
    return float((norm.weight.detach().double() * v / sigma) @ u)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_dla_heads_and_rest_sum_to_the_logit(arch):
    model = make_tiny(arch)                                               # float32
    prompts = [_ids(10), _ids(11, T=7)]
    r = direct_logit_attribution(model, prompts, [5, 40])
    for k in ("logit", "centered", "diff"):
        got = r.heads[k].sum((1, 2)) + r.rest[k]
        np.testing.assert_allclose(got, r.total[k], rtol=1e-5, atol=1e-5 * np.abs(r.total[k]).max())
    for i, ids in enumerate(prompts):
        assert r.rest["logit"][i] == pytest.approx(_independent_rest(model, arch, ids, [5, 40][i]), rel=1e-5, abs=1e-6)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompts[0]])).logits[0, -1]
    assert r.total["logit"][0] == pytest.approx(float(logits[5]), rel=1e-6)
    assert r.rival[0] == int(torch.topk(logits, 2).indices[1 if int(logits.argmax()) == 5 else 0])


def test_dla_sums_under_gemma3s_post_attention_norm():
    model = make_tiny("gemma3")
    r = direct_logit_attribution(model, [_ids(12)], 9)
    np.testing.assert_allclose(r.heads["logit"].sum() + r.rest["logit"], r.total["logit"], rtol=1e-5, atol=1e-5)
    assert np.count_nonzero(r.heads["logit"]) == r.heads["logit"].size


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_dla_in_bfloat16_freezes_the_norm_at_its_weights_precision(arch):
    """A bf16 model (what --dtype auto picks on avx512_bf16 CPUs): the frozen norm's gain is the final norm's own
    weight (Llama: w; Gemma: 1 + w), not a bf16 rounding of it, and DLA's parts still sum to the logit DLA reads
    to the bf16 logit's own rounding (float64 arithmetic on the bf16 model's activations)."""
    torch.manual_seed(0)
    model = make_tiny(arch)
    norm = final_norm(model)
    with torch.no_grad():
        norm.weight.copy_(0.3 * torch.randn_like(norm.weight) + (0.0 if arch == "gemma3" else 1.0))
    model = model.to(torch.bfloat16)
    from inductionlab.core.attribution import freeze_norm
    x = torch.randn(norm.weight.shape[0], dtype=torch.bfloat16)
    want = norm.weight.detach().double() + (1.0 if arch == "gemma3" else 0.0)
    np.testing.assert_allclose(freeze_norm(norm, x).gain.numpy(), want.numpy(), rtol=1e-6)
    r = direct_logit_attribution(model, [_ids(3)], 9)
    eps = torch.finfo(torch.bfloat16).eps          # the model's logit is bf16: its own rounding, 2^-7 relative
    np.testing.assert_allclose(r.heads["logit"].sum() + r.rest["logit"], r.total["logit"], rtol=eps,
                               atol=eps * np.abs(r.total["logit"]).max())


def test_bad_input_is_one_error(llama64):
    ids = _ids(0)
    with pytest.raises(InductionLabError, match="shape"):
        attribution_patching(llama64, [ids], 1, torch.zeros(L, H, D + 1))
    with pytest.raises(InductionLabError, match="metric"):
        attribution_patching(llama64, [ids], 1, "zero", metric="kl")
    with pytest.raises(InductionLabError, match="outside"):
        attribution_patching(llama64, [ids], 1, "zero", positions=[40])
    with pytest.raises(InductionLabError, match="one per prompt"):
        attribution_patching(llama64, [ids, ids], [1, 2, 3], "zero")
    with pytest.raises(InductionLabError, match="source"):
        attribution_patching(llama64, [ids], 1, "mean")
    with pytest.raises(InductionLabError, match="non-empty"):
        direct_logit_attribution(llama64, [], 1)
