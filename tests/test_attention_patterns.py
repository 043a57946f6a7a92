"""attention_patterns: a GQA model's query-head patterns against softmax(q k^T) by hand and against
transformers' own eager attention weights; rows, causality, the [BOS] S S sequence, bad input, the figure."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import make_tiny
from inductionlab import attention_patterns, compute_head_scores, induction_sequence
from inductionlab.core.scores import induction_targets
from inductionlab.errors import InductionLabError

T = 6          # tokens per copy: [BOS] S S has 13 positions


@pytest.fixture(scope="module")
def llama():
    return make_tiny("llama")          # 8 query heads, 2 KV heads: query heads 0-3 share KV head 0, 4-7 KV head 1


def test_gqa_pattern_equals_softmax_of_q_k_by_hand(llama):
    """Layer 0 by hand: RMSNorm(embeddings) -> q, k with rotary; query head h reads KV head h // 4."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    ids = torch.tensor([1, 40, 41, 42, 43, 40, 41, 42, 43])
    n, H, KV, D = len(ids), 8, 2, 8
    with torch.no_grad():
        x = llama.model.layers[0].input_layernorm(llama.model.embed_tokens(ids[None]))
        att = llama.model.layers[0].self_attn
        q = att.q_proj(x).view(1, n, H, D).transpose(1, 2)
        k = att.k_proj(x).view(1, n, KV, D).transpose(1, 2)
        cos, sin = llama.model.rotary_emb(x, torch.arange(n)[None])
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        logits = q[0] @ k[0, [h // 4 for h in range(H)]].transpose(-1, -2) / D ** 0.5        # [H, n, n]
        want = torch.softmax(logits.masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf")), -1)
    got = attention_patterns(llama, ids, [(0, h) for h in range(H)])
    assert got.shape == (H, n, n) and got.dtype == np.float32
    np.testing.assert_allclose(got, want.numpy(), atol=1e-6)
    assert not np.allclose(got[0], got[1], atol=1e-3)          # same KV head, own queries: different patterns


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_equals_transformers_eager_attention_weights(arch):
    """The sdpa-loaded model's patterns = the eager model's ``output_attentions`` (same weights), head by head,
    in the order asked; rows sum to 1, nothing above the diagonal (gemma3: a sliding window of 4 too)."""
    sdpa, eager = make_tiny(arch), make_tiny(arch, attn="eager")
    ids = torch.arange(20, 33)
    heads = [(1, 3), (0, 1), (1, 0)]
    got = attention_patterns(sdpa, ids[None], heads)
    with torch.no_grad():
        ref = eager(ids[None], output_attentions=True).attentions
    for i, (l, h) in enumerate(heads):
        np.testing.assert_allclose(got[i], ref[l][0, h].float().numpy(), atol=1e-6)
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-5)
    assert np.triu(got, 1).max() == 0.0
    if arch == "gemma3":                    # layer 0 slides over 4 keys: query 12 sees keys 9-12 only
        assert got[1, 12, :9].max() == 0.0 and got[1, 12, 9:].sum() == pytest.approx(1.0, abs=1e-5)


def test_induction_sequence_is_the_scores_first_and_its_pattern_gives_the_score(llama, word_tokenizer):
    """[BOS] S S with S distinct ordinary tokens; compute_head_scores on that one sequence (batch 1, same seed)
    equals the pattern's mean mass on the induction targets (key i - T + 1 for i in the second copy)."""
    ids = induction_sequence(llama, tokenizer=word_tokenizer, seq_len=T, seed=3)
    bos = word_tokenizer.bos_token_id
    S = ids[1:1 + T]
    assert ids[0] == bos and torch.equal(ids[1 + T:], S) and len(set(S.tolist())) == T
    assert not set(S.tolist()) & set(word_tokenizer.all_special_ids)
    hs = compute_head_scores(llama, tokenizer=word_tokenizer, seq_len=T, batch_size=1, seed=3, names=("induction",),
                             induction_loss=False)
    pats = attention_patterns(llama, ids, [(l, h) for l in range(2) for h in range(8)])
    q = np.arange(1 + T, 1 + 2 * T)
    assert induction_targets(T, True)[q].tolist() == (q - T + 1).tolist()
    mass = pats[:, q, q - T + 1].mean(1).reshape(2, 8)
    np.testing.assert_allclose(hs["induction"], mass, atol=1e-5)


@pytest.mark.parametrize("heads,ids,message", [
    ([(2, 0)], None, r"head \(2, 0\) out of range: the model has 2 layers \(0-1\) x 8 query heads \(0-7\)"),
    ((0, 8), None, r"head \(0, 8\) out of range"),
    ([], None, "heads is empty"),
    ([(0, 1.5)], None, "head must be an integer"),
    ([(0, 0)], torch.zeros(2, 5, dtype=torch.long), r"one non-empty sequence .* got shape \(2, 5\)"),
    ([(0, 0)], [], "one non-empty sequence"),
    ([(0, 0)], [3, 800], "token id 800 is outside the model's vocabulary 0-799"),
    ([(0, 0)], [0.5, 1.0], "integer token ids"),
])
def test_bad_input_is_one_line(llama, heads, ids, message):
    with pytest.raises(InductionLabError, match=message) as e:
        attention_patterns(llama, torch.arange(5) if ids is None else ids, heads)
    assert "\n" not in str(e.value)


def test_longer_than_context_is_refused():
    model = make_tiny("llama", ctx=16)
    with pytest.raises(InductionLabError, match="17 tokens exceed the model's context of 16"):
        attention_patterns(model, torch.arange(17), [(0, 0)])


def test_figure_full_and_windowed(tmp_path):
    from inductionlab.studies import plots

    assert plots.pattern_window(101) == (0, 101) and plots.pattern_window(300, 128) == (172, 300)
    for n in (13, 301):
        p = np.tril(np.ones((n, n), np.float32))
        p /= p.sum(1, keepdims=True)
        plots.attention_patterns(np.stack([p, p]), ["L1 H3 induction 0.87", "L0 H2 random (induction 0.01)"],
                                 tmp_path / f"{n}.png", title="tiny")
        assert (tmp_path / f"{n}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
