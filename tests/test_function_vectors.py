"""The FV score (Todd et al. 2024's AIE) and the function vector (SPEC §10): identities, the authors'
per-head loop as oracle (tests/fv_oracle.py), GQA slices, and the function vector against the output
projection's weights by hand. Tiny random models; prompts are random token strings (the CIE is defined for
any prompt and answer token)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from conftest import make_tiny
from fv_oracle import indirect_effect, mean_head_activations
from inductionlab.core.instrument import HeadIntervention, instrument
from inductionlab.core.models import attention_shape
from inductionlab.core.patching import copies_mask
from inductionlab.errors import InductionLabError
from inductionlab.protocols import function_vectors as F
from inductionlab.protocols.icl_tasks import Item, Prompt, build_task, build_tasks


def _repeat_cache(cache, rows: int):
    c = copy.deepcopy(cache)
    c.batch_repeat_interleave(rows)
    return c


def _prompts(n: int, seed: int, first: int = 3, length: int = 14) -> list[Prompt]:
    g = torch.Generator().manual_seed(seed)
    return [Prompt("t", 10, "x", i, "", [first] + torch.randint(5, 700, (length + i,), generator=g).tolist(),
                   17 + i, Item("a", "b")) for i in range(n)]


@pytest.fixture(scope="module")
def llama():
    return make_tiny("llama")        # 8 query heads sharing 2 KV heads


def test_a_prompt_patched_with_its_own_mean_has_cie_zero_at_every_head(llama):
    p = _prompts(1, 0)
    means, _ = F.clean_means(llama, p)
    _, cie = F.indirect_effects(llama, p[0], means, rows=5)
    assert np.abs(cie).max() <= 1e-6 and not np.isnan(cie).any()


def test_a_head_forced_onto_the_first_token_has_aie_exactly_zero(llama):
    """Under the sink cut the head outputs v(first token), the same in every prompt (all start with the same
    token), so its clean mean is that value and the patch changes nothing: CIE exactly 0 on every prompt,
    while other heads move."""
    sink = [HeadIntervention(1, 3, "sink")]
    clean, corrupted = _prompts(4, 1), _prompts(3, 2)
    means, _ = F.clean_means(llama, clean, under=sink)
    cies = [F.indirect_effects(llama, p, means, rows=6, under=sink)[1] for p in corrupted]
    assert all(c[1, 3] == 0.0 for c in cies)
    assert max(np.abs(c).max() for c in cies) > 1e-6


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma3", "qwen2", "gpt_neox"])
def test_fast_path_equals_the_authors_per_head_loop(arch):
    model = make_tiny(arch)
    clean, corrupted = _prompts(3, 3), _prompts(2, 4)
    means, p_clean = F.clean_means(model, clean)
    assert torch.allclose(means, mean_head_activations(model, clean).double(), atol=1e-6)
    for p in corrupted:
        base, cie = F.indirect_effects(model, p, means, rows=7)
        oracle, oracle_base = indirect_effect(model, p, means)
        assert abs(base - oracle_base) <= 1e-6
        assert max(abs(cie[l, h] - v) for (l, h), v in oracle.items()) <= 1e-6
        assert max(abs(v) for v in oracle.values()) > 1e-6              # the comparison is not of zeros


def test_the_patch_of_one_row_changes_only_its_query_head_under_gqa(llama):
    """Patching one row of a batch against a repeated prefix cache (the ``rows`` of an intervention): row 1's patch of (1, 2) changes
    only that head's output in that row: every other head of layer 1 (its KV peer (1, 3) included) and row 0
    are bit-identical to the same batch run without the patch."""
    ids = torch.tensor([_prompts(1, 5)[0].input_ids])
    with torch.inference_mode():
        prefix = llama(input_ids=ids[:, :-1], use_cache=True).past_key_values
    value = torch.full((attention_shape(llama.config)["head_dim"],), 0.5)
    iv = HeadIntervention(1, 2, "mean", value=value, positions=(ids.shape[1] - 1,), rows=(1,))
    heads = [(1, h) for h in range(8)]
    outs = []
    for ivs in ([], [iv]):
        with torch.inference_mode(), instrument(llama, ivs, capture_heads=heads) as inst:
            llama(input_ids=ids[:, -1:].expand(2, 1), past_key_values=_repeat_cache(prefix, 2), use_cache=True)
        outs.append({h: inst.captured[(1, h)][:, -1] for h in range(8)})      # [2, D] each
    plain, patched = outs
    for h in range(8):
        assert torch.equal(plain[h][0], patched[h][0])
        if h == 2:
            assert torch.equal(patched[h][1], value) and not torch.equal(plain[h][1], value)
        else:
            assert torch.equal(plain[h][1], patched[h][1])


def test_fv_scores_table_and_rankings_on_known_effects():
    cie = np.zeros((2, 3, 2, 2))
    cie[:, :, 0, 1] = 0.1                             # every prompt of both tasks: +0.1
    cie[0, :, 1, 0] = [-0.3, -0.3, -0.3]              # task 0 only: -0.3, task 1: 0
    cie[1, :, 1, 1] = [0.0, 0.06, 0.12]               # mean 0.06, sd 0.06
    s = F.FVScores(["a", "b"], np.ones((2, 3)), np.zeros((2, 3)), cie, torch.zeros(2, 2, 2, 4))
    assert np.allclose(s.aie(), [[0, 0.1], [-0.15, 0.03]])
    assert s.ranking() == [(0, 1), (1, 1), (0, 0), (1, 0)]
    assert s.ranking(signed=False) == [(1, 0), (0, 1), (1, 1), (0, 0)]
    t = s.table().set_index(["layer", "head", "task"])
    row = t.loc[(1, 1, "b")]
    half = 1.959963984540054 * 0.06 / np.sqrt(3)
    assert row.aie == pytest.approx(0.06) and row.ci_high - row.aie == pytest.approx(half)
    allrow = t.loc[(1, 1, "all")]                     # task a: se 0, task b: se 0.06/√3
    assert allrow.aie == pytest.approx(0.03) and allrow.ci_high - allrow.aie == pytest.approx(half / 2)
    assert allrow.n == 6


@pytest.fixture(scope="module")
def bpe_tokenizer():
    """A byte-level BPE trained on the copy task's text (its ids fit the tiny models' vocabulary of 800)."""
    from transformers import PreTrainedTokenizerFast

    from inductionlab.data.tokenizer import train_bpe
    from inductionlab.protocols.icl_tasks import format_prompt
    info = train_bpe([format_prompt([it], it.x) for it in build_task("copy").items], 700)
    return PreTrainedTokenizerFast(tokenizer_object=info.tokenizer, eos_token="<|endoftext|>")


def test_fv_scores_end_to_end_matches_its_parts(llama, bpe_tokenizer):
    tasks = build_tasks(["copy"])
    tp = F.task_prompts(tasks, bpe_tokenizer, shots=3, n_prompts=2)
    s = F.fv_scores(llama, tp, rows=16)
    means, _ = F.clean_means(llama, tp["copy"].clean)
    _, cie = F.indirect_effects(llama, tp["copy"].corrupted[1], means, rows=3)
    assert torch.equal(s.means[0], means) and np.allclose(s.cie[0, 1], cie, atol=1e-9)
    assert s.cie.shape == (1, 2, 2, 8)


def test_the_function_vector_is_the_heads_writes_through_the_output_projection(llama):
    s = attention_shape(llama.config)
    means = torch.randn(s["n_layers"], s["n_heads"], s["head_dim"], generator=torch.Generator().manual_seed(0))
    heads = [(0, 1), (1, 5), (1, 6)]
    fv = F.function_vector(llama, means, heads)
    D = s["head_dim"]
    by_hand = sum(llama.model.layers[l].self_attn.o_proj.weight[:, h * D:(h + 1) * D] @ means[l, h].float()
                  for l, h in heads)
    assert torch.allclose(fv, by_hand.detach(), atol=1e-5)


def test_the_vector_is_added_after_its_layer_at_the_last_position_only(llama):
    ids = torch.tensor([_prompts(1, 6)[0].input_ids])
    with torch.inference_mode():
        plain = llama(input_ids=ids).logits
        with F.added_to_residual(llama, 1, torch.ones(llama.config.hidden_size)):
            added = llama(input_ids=ids).logits
        with F.added_to_residual(llama, 1, None):
            none = llama(input_ids=ids).logits
    assert torch.equal(plain[:, :-1], added[:, :-1]) and not torch.allclose(plain[:, -1], added[:, -1])
    assert torch.equal(plain, none)


def test_fewer_than_two_shots_is_refused(bpe_tokenizer):
    with pytest.raises(InductionLabError, match="at least 2 shots"):
        F.task_prompts(build_tasks(["copy"]), bpe_tokenizer, shots=1)


def test_knowledge_tasks_come_from_the_geonames_country_table():
    caps = dict((it.x, it.y) for it in build_task("country_capital").items)
    assert caps["France"] == "Paris" and caps["Japan"] == "Tokyo" and caps["Kenya"] == "Nairobi"
    cur = dict((it.x, it.y) for it in build_task("country_currency").items)
    assert cur["Japan"] == "Yen" and cur["France"] == "Euro"


def test_copies_of_the_last_token_each_patch_only_their_own_query_head_under_gqa(llama):
    """The fast path's forward: copies of the last token against the prefix cache, copy 1 patching (1, 2).
    Every other head of layer 1 (its KV peer (1, 3) included) and copy 0 equal the same forward without the
    patch, bit for bit, and copy 0 equals a plain forward of the whole prompt's last position."""
    ids = torch.tensor([_prompts(1, 5)[0].input_ids])
    last = ids.shape[1] - 1
    with torch.inference_mode():
        prefix = llama(input_ids=ids[:, :-1], use_cache=True).past_key_values
    value = torch.full((attention_shape(llama.config)["head_dim"],), 0.5)
    kw = {"input_ids": ids[:, -1:].expand(1, 3), "position_ids": torch.full((1, 3), last),
          "attention_mask": copies_mask(llama, prefix, last, 3, torch.float32, "cpu")}
    heads = [(1, h) for h in range(8)]
    outs, logits = [], []
    for ivs in ([], [HeadIntervention(1, 2, "mean", value=value, positions=(last + 1,))]):
        with torch.inference_mode(), instrument(llama, ivs, capture_heads=heads) as inst:
            logits.append(llama(**kw, past_key_values=copy.deepcopy(prefix), use_cache=True).logits[0])
        outs.append({h: inst.captured[(1, h)][0] for h in range(8)})           # [3 copies, D]
    plain, patched = outs
    for h in range(8):
        assert torch.equal(plain[h][0], patched[h][0]) and torch.equal(plain[h][2], patched[h][2])
        if h == 2:
            assert torch.equal(patched[h][1], value) and not torch.equal(plain[h][1], value)
        else:
            assert torch.equal(plain[h][1], patched[h][1])
    with torch.inference_mode():
        full = llama(input_ids=ids).logits[0, -1]
    assert torch.allclose(logits[0][0], full, atol=1e-5) and torch.allclose(logits[0][2], full, atol=1e-5)
    assert not torch.allclose(logits[1][1], full, atol=1e-5)
