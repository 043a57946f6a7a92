"""HITS@k on a fake model with a known ranking; batching, padding and the ablation hook."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from inductionlab.protocols.function_probes import run_probes, summarize_hits, target_ranks
from inductionlab.protocols.icl_tasks import Item, Prompt

V = 50


class ShiftRanker(torch.nn.Module):
    """At every real position, logit(v) = −((v − x_t) mod V): the token x_t ranks 1st, x_t + 1
    2nd, ...  Pads (mask 0) are set to garbage so a left-padding bug changes ranks."""

    def __init__(self):
        super().__init__()
        self.dummy = torch.nn.Parameter(torch.zeros(1))
        self.config = SimpleNamespace(vocab_size=V)
        self.calls = []

    def forward(self, input_ids, attention_mask=None, position_ids=None, logits_to_keep=0, **kw):
        self.calls.append((input_ids.clone(), attention_mask.clone(), position_ids.clone()))
        v = torch.arange(V)
        logits = -((v[None, None, :] - input_ids[:, :, None]) % V).float()
        logits = torch.where(attention_mask[:, :, None].bool(), logits, torch.randn_like(logits))
        if logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        return SimpleNamespace(logits=logits)


def _prompt(task, ids, target, index=0, shots=0, control="intact"):
    return Prompt(task, shots, control, index, "", list(ids), target, Item("x", "y"))


def test_target_ranks_ties_favour_target():
    logits = torch.tensor([[3.0, 1.0, 3.0, 0.0], [0.0, 1.0, 2.0, 3.0]])
    assert target_ranks(logits, torch.tensor([0, 0])).tolist() == [1, 4]
    assert target_ranks(logits, torch.tensor([1, 2])).tolist() == [3, 2]


def test_hits_on_known_ranking_with_padding():
    # last token x, target x + d has rank d + 1
    prompts = [_prompt("a", [1, 2, 5], 5), _prompt("a", [7], 8, 1), _prompt("a", [3, 3, 3, 3, 9], 11, 2),
               _prompt("a", [4, 10], 15, 3), _prompt("b", [49], 0, 0), _prompt("b", [2, 48], 47, 1)]
    model = ShiftRanker()
    rows = run_probes(model, prompts, pad_id=0, batch_size=4)
    assert rows["rank"].tolist() == [1, 2, 3, 6, 2, 50]
    assert rows["hits1"].tolist() == [1, 0, 0, 0, 0, 0]
    assert rows["hits3"].tolist() == [1, 1, 1, 0, 1, 0]
    assert len(model.calls) == 2                                        # batches of 4 + 2
    ids, mask, pos = model.calls[0]
    assert (pos[mask.bool()] == torch.cat([torch.arange(int(n)) for n in mask.sum(1)])).all()
    p = rows["p_target"].to_numpy()
    assert np.isclose(p[0], 1 / np.exp(-np.arange(V)).sum())           # softmax of 0 over logits −0..−49


def test_summary_by_hand():
    rows = run_probes(ShiftRanker(), [_prompt("a", [1], 1, 0), _prompt("a", [1], 2, 1), _prompt("a", [1], 1, 2),
                                      _prompt("a", [1], 1, 3), _prompt("b", [1], 9, 0), _prompt("b", [1], 9, 1)],
                      pad_id=0)
    s = summarize_hits(rows).set_index("task")
    # task a hits1 = [1, 0, 1, 1]: mean .75, sd .5, CI ± 1.96·.5/2; task b all 0
    assert s.loc["a", "hits1"] == pytest.approx(0.75)
    assert s.loc["a", "hits1_ci_high"] - 0.75 == pytest.approx(1.959964 * 0.5 / 2, rel=1e-5)
    assert s.loc["b", "hits1"] == 0 and s.loc["b", "hits1_ci_low"] == 0
    assert s.loc["macro", "hits1"] == pytest.approx(0.375) and s.loc["macro", "n"] == 2
    assert s.loc["macro", "hits1_ci_high"] - 0.375 == pytest.approx(1.959964 * 0.25 / 2, rel=1e-5)
    assert s.loc["a", "hits3"] == 1.0


def test_ablation_hook_changes_only_under_heads():
    from conftest import make_tiny
    from inductionlab.core.instrument import ablate
    model = make_tiny("llama")
    rng = np.random.default_rng(0)
    prompts = [_prompt("t", rng.integers(5, 700, n).tolist(), int(rng.integers(5, 700)), i)
               for i, n in enumerate((6, 9, 4))]
    intact = run_probes(model, prompts, pad_id=0)
    again = run_probes(model, prompts, pad_id=0)
    abl = _ablated_probes(model, prompts, [(0, h) for h in range(8)])
    assert np.allclose(intact["p_target"], again["p_target"])
    assert not np.allclose(intact["p_target"], abl["p_target"])
    with torch.inference_mode(), ablate(model, [(0, h) for h in range(8)]):   # one prompt alone, unpadded
        lp = model(input_ids=torch.tensor([prompts[1].input_ids])).logits[0, -1].float().softmax(-1)
    assert abl["p_target"][1] == pytest.approx(lp[prompts[1].target_id].item(), rel=1e-4, abs=1e-7)


def _ablated_probes(model, prompts, heads):
    """The probes with ``heads`` zero-ablated: their trials under one condition of the runner."""
    from inductionlab.core.ablation import Condition
    from inductionlab.protocols.function_probes import build_trials, measure_batch, probe_rows
    from inductionlab.protocols.runner import run_conditions

    a = run_conditions(SimpleNamespace(model=model), [Condition("ablated", "induction", heads=heads)],
                       build_trials(prompts, 0), batch_size=16, measure_batch=measure_batch)["ablated"]
    return probe_rows(prompts, a)


def test_last_position_conditions_equal_the_runner_with_last_position_ablation():
    """All conditions and methods from one prefix per prompt (copies of the last token) give the ranks and
    probabilities of the runner running each condition over left-padded batches with positions="last"."""
    from conftest import make_tiny
    from inductionlab.core.ablation import Condition
    from inductionlab.protocols.function_probes import build_trials, last_position_conditions, measure_batch, probe_rows
    from inductionlab.protocols.runner import run_conditions

    model = make_tiny("llama")
    rng = np.random.default_rng(1)
    prompts = [_prompt("t", rng.integers(5, 700, n).tolist(), int(rng.integers(5, 700)), i)
               for i, n in enumerate((6, 9, 4, 12))]
    conds = [Condition("intact", "intact"), Condition("a", "induction", 2, 0, [(0, 1), (1, 5)]),
             Condition("b", "random", 3, 0, [(1, 0), (1, 2), (1, 7)])]
    means = torch.randn(2, 8, 8, generator=torch.Generator().manual_seed(0))
    got = last_position_conditions(model, prompts, conds, {"mean": means, "zero": torch.zeros(2, 8, 8)}, rows=2)
    assert len(got) == 4 * 3 * 2
    for method in ("mean", "zero"):
        trials = build_trials(prompts, 0)
        trials.reference_means = means
        ref = run_conditions(SimpleNamespace(model=model), conds, trials, method=method, batch_size=3,
                             measure_batch=measure_batch, positions="last")
        for c in conds:
            want = probe_rows(prompts, ref[c.name])
            g = got[(got.condition == c.name) & (got.method == method)].reset_index(drop=True)
            assert (g["rank"].to_numpy() == want["rank"].to_numpy()).all()
            assert np.allclose(g.p_target, want.p_target, atol=1e-6)
    mean_a = got[(got.condition == "a") & (got.method == "mean")].p_target.to_numpy()
    assert not np.allclose(mean_a, got[(got.condition == "intact") & (got.method == "mean")].p_target)
