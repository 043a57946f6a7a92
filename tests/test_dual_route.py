"""Concept and token induction scores (Feucht et al. 2025; SPEC §10): the batched fast path against a port of
the authors' per-head loop (``causal_scores.patch_head_m2``: an ``o_proj`` pre-hook, one forward per head), the
sink identity, value weighting by hand, word sampling under a BPE tokenizer, and the table's CIs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import make_tiny
from inductionlab.core.instrument import HeadIntervention, instrument
from inductionlab.core.models import attention_shape
from inductionlab.errors import InductionLabError
from inductionlab.protocols import dual_route as D
from inductionlab.protocols.function_vectors import output_projection


@pytest.fixture(scope="module")
def bpe():
    """A byte-level BPE of 700 ids (fits the tiny models' 800): most wordfreq words split into several tokens."""
    from transformers import PreTrainedTokenizerFast

    from inductionlab.data.tokenizer import train_bpe
    from inductionlab.protocols.icl_tasks import build_task, format_prompt
    info = train_bpe([format_prompt([it], it.x) for it in build_task("copy").items], 700)
    return PreTrainedTokenizerFast(tokenizer_object=info.tokenizer, eos_token="<|endoftext|>")


@pytest.fixture(scope="module")
def prompts(bpe):
    return D.build_prompts(bpe, 800, n_words=4, n_attention=4, top_n=3000, seed=3)


@pytest.fixture(scope="module")
def llama():
    return make_tiny("llama")        # 8 query heads sharing 2 KV heads


def _authors_loop(model, prompt):
    """Port of ``patch_head_m2`` + ``stats_from_logits``: per head, the corrupted forward with the head's slice of
    the ``o_proj`` input at −2 set to the clean run's; returns {(l, h): (m1, m2)} patched − corrupt."""
    s = attention_shape(model.config)
    L, H, D_ = s["n_layers"], s["n_heads"], s["head_dim"]
    e = prompt.word
    got = {}
    hooks = [output_projection(model, l).register_forward_pre_hook(
        lambda m, a, l=l: got.__setitem__(l, a[0][0, -2].detach().clone())) for l in range(L)]
    with torch.no_grad():
        model(input_ids=torch.tensor([prompt.clean]))
    for h in hooks:
        h.remove()
    corrupt = torch.tensor([prompt.corrupt])

    def stats():
        with torch.no_grad():
            p = torch.softmax(model(input_ids=corrupt).logits[0].double(), -1)
        return p[-1, e[1]].item(), p[-2, e[0]].item()
    b1, b2 = stats()
    out = {}
    for l in range(L):
        for h in range(H):
            def edit(m, args, l=l, h=h):
                x = args[0].clone()
                x = x.view(*x.shape[:-1], H, D_)
                x[:, -2, h] = got[l].view(H, D_)[h]
                return (x.view(*x.shape[:-2], H * D_), *args[1:])
            handle = output_projection(model, l).register_forward_pre_hook(edit)
            try:
                m1, m2 = stats()
            finally:
                handle.remove()
            out[(l, h)] = (m1 - b1, m2 - b2)
    return out, (b1, b2)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma3"])     # gemma3: sliding-window layers
def test_the_batched_path_equals_the_authors_per_head_loop(arch, prompts):
    model = make_tiny(arch)
    for pr in (prompts[0][0], prompts[1][-1]):                  # a 2-token word, a 5-token random word
        p0, eff = D.copying_effects(model, pr, rows=5)
        oracle, base = _authors_loop(model, pr)
        assert np.allclose(p0, base, atol=1e-7)
        diff = max(max(abs(eff[0, l, h] - a), abs(eff[1, l, h] - b)) for (l, h), (a, b) in oracle.items())
        big = max(abs(v) for ab in oracle.values() for v in ab)
        assert diff <= 1e-3 * big and big > 1e-6                   # the effects are small on random tiny models


def test_a_sink_head_scores_exactly_zero_on_both_causal_scores(llama, prompts):
    """Forced onto position 0 (BOS in clean and corrupted prompts alike) the head outputs v(BOS) in both runs:
    the patch writes the value it already had, so both effects are exactly 0 while other heads move."""
    sink = [HeadIntervention(1, 3, "sink")]
    for pr in (prompts[0][1], prompts[1][2]):
        _, eff = D.copying_effects(llama, pr, rows=6, under=sink)
        assert eff[0, 1, 3] == 0.0 and eff[1, 1, 3] == 0.0
        assert np.abs(eff).max() > 1e-6


def test_value_weighting_by_hand_and_with_equal_value_norms():
    a = torch.tensor([[0.5, 0.25, 0.25]])
    assert torch.allclose(D.value_weighted(a, torch.tensor([1.0, 2.0, 4.0])),
                          torch.tensor([[0.5, 0.5, 1.0]], dtype=torch.float64) / 2.0)
    assert torch.allclose(D.value_weighted(a, torch.full((3,), 7.0)), a.double())


def test_value_weighted_attention_equals_raw_attention_when_every_value_has_the_same_norm(prompts):
    """GPT-2 with the value part of ``c_attn`` zeroed and its bias set to ones: every v_j is the same vector, so
    the weighting is the raw pattern (read independently with ``keep_patterns``)."""
    model = make_tiny("gpt2")
    d = model.config.n_embd
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_attn.weight[:, 2 * d:] = 0.0
            block.attn.c_attn.bias[2 * d:] = 1.0
    pr = prompts[2][0]
    got = D.attention_scores(model, pr)
    with torch.inference_mode(), instrument(model, keep_patterns=True) as inst:
        model(input_ids=torch.tensor([pr.ids]))
    raw = np.stack([[p[0, :, -1, pr.first].numpy() for p in inst.patterns],
                    [p[0, :, -1, pr.last].numpy() for p in inst.patterns]])
    assert np.allclose(got, raw, atol=1e-6)
    assert not np.allclose(D.attention_scores(make_tiny("gpt2"), pr), raw, atol=1e-4)   # weighting matters


def test_value_weighting_reads_each_query_heads_kv_group_under_gqa(llama, prompts):
    """Llama, 8 query heads on 2 KV heads: value norms read off ``v_proj``'s output by a hook, query head h
    weighted by its group's (h // 4) norms, against the package's value-weighted scores."""
    s = attention_shape(llama.config)
    L, H, KV, D_ = s["n_layers"], s["n_heads"], s["n_kv_heads"], s["head_dim"]
    pr = prompts[2][2]
    vals = {}
    hooks = [llama.model.layers[l].self_attn.v_proj.register_forward_hook(
        lambda m, a, o, l=l: vals.__setitem__(l, o[0].detach().view(-1, KV, D_).norm(dim=-1).T)) for l in range(L)]
    with torch.inference_mode(), instrument(llama, keep_patterns=True) as inst:
        llama(input_ids=torch.tensor([pr.ids]))
    for h in hooks:
        h.remove()
    got = D.attention_scores(llama, pr)
    for l in range(L):
        for h in range(H):
            w = inst.patterns[l][0, h, -1].double() * vals[l][h // (H // KV)].double()
            w = w / w.sum()
            assert abs(got[0, l, h] - w[pr.first]) < 1e-6 and abs(got[1, l, h] - w[pr.last]) < 1e-6


def test_words_have_2_to_5_tokens_and_are_deterministic_by_seed(bpe):
    a = D.sample_words(bpe, 10, seed=1, top_n=3000)
    assert a == D.sample_words(bpe, 10, seed=1, top_n=3000) != D.sample_words(bpe, 10, seed=2, top_n=3000)
    assert [len(w) for w in a] == [2, 2, 2, 3, 3, 3, 4, 4, 5, 5]
    for w in a:
        assert len(bpe.encode(bpe.decode(list(w)), add_special_tokens=False)) == len(w)
        assert bpe.decode(list(w))[0] == " " and bpe.decode(list(w))[1:].isalpha()


def test_prompts_follow_the_authors_layout(prompts):
    (wp, rp, ap), pr = prompts, prompts[0][2]
    e, T = pr.word, len(pr.clean)
    assert len(pr.corrupt) == T == 1 + 30 + 1 + (30 - len(e)) + 1
    assert pr.clean[0] == pr.corrupt[0] and pr.clean[-1] == e[0] and pr.clean[31 - len(e):31] == e
    assert pr.clean[32:] == pr.corrupt[32:] and pr.clean[1:31 - len(e)] == pr.clean[32:-1]
    a = ap[1]
    assert a.ids[a.first:a.last + 1] == a.word and 15 + 1 <= a.first
    r1 = a.ids[1:a.first]
    assert a.ids[-len(r1):] == r1 and len(a.ids) == 1 + 30 + 1 + len(r1)


def test_a_word_pool_too_small_is_a_one_line_error(bpe):
    with pytest.raises(InductionLabError, match="words of .* tokens among wordfreq's top 40") as e:
        D.sample_words(bpe, 400, top_n=40)
    assert "\n" not in str(e.value)


def test_table_means_and_cis_by_hand():
    word = np.zeros((2, 2, 1, 2))
    word[:, 0, 0, 1] = [1.0, 3.0]
    rs = D.RouteScores(word, np.zeros((3, 2, 1, 2)), np.full((2, 2, 1, 2), 0.25), np.zeros((2, 2)), np.zeros((3, 2)))
    t = rs.table().set_index(["layer", "head"])
    assert t.loc[(0, 1), "concept_copying"] == 2.0
    half = 1.959963984540054 * np.sqrt(2.0) / np.sqrt(2)
    assert np.isclose(t.loc[(0, 1), "concept_copying_ci_high"], 2.0 + half)
    assert t.loc[(0, 0), "token_attention"] == 0.25 and rs.top("concept_copying", 1) == [(0, 1, 2.0)]


def test_random_tokens_and_filler_come_from_a_given_pool(bpe):
    """With ``pool`` (a small model's training-split ids), every random-word token and every filler token is drawn
    from it; the real words are the tokenizer's own."""
    import numpy as np

    pool = np.arange(300, 420)
    words, rand, att = D.build_prompts(bpe, 800, n_words=4, n_attention=4, top_n=3000, seed=3, pool=pool)
    allowed = set(pool.tolist()) | {t for t in D.special_ids(bpe) if t is not None}   # BOS and "\n" frame them
    for p in rand:
        assert set(p.word) <= allowed and set(p.clean) | set(p.corrupt) <= allowed
    for p in words:
        assert not set(p.word) <= allowed                                  # a real word of the tokenizer
        assert (set(p.clean) | set(p.corrupt)) - set(p.word) <= allowed   # filler from the pool
    for a in att:
        assert set(a.ids) - set(a.word) <= allowed
    assert rand != D.build_prompts(bpe, 800, n_words=4, n_attention=4, top_n=3000, seed=3)[1]
