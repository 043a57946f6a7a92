"""Few-shot serial recall (SPEC §5): template, bookkeeping on exact fake models, ablation on a tiny Llama."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from _tiny import FakeRecallModel, word_tokenizer
from inductionlab.core.ablation import Condition
from inductionlab.errors import InductionLabError
from inductionlab.protocols.serial_recall import SerialRecallConfig, build_recall_trials, run_serial_recall

L = 14


@pytest.fixture(scope="module")
def tok():
    return word_tokenizer()


def _run(model, tok, n=6, **kw):
    loaded = SimpleNamespace(model=model, tokenizer=tok, identity={})
    cfg = SerialRecallConfig(n_trials=n, batch_size=4, **kw)
    return run_serial_recall(loaded, [Condition("intact", "intact")], cfg)


def test_template_layout(tok):
    cfg = SerialRecallConfig(n_trials=3, n_shots=2)
    tr = build_recall_trials(tok, cfg)
    study = tok.encode("Study:", add_special_tokens=False)
    recall = tok.encode("\nRecall:", add_special_tokens=False)
    assert len(study) == 2 and len(recall) == 2            # study : / recall :
    for p, t in zip(tr.prompt.tolist(), tr.targets.tolist()):
        assert p[0] == tok.bos_token_id
        body = p[1:]
        block = 2 + L + 2 + L                              # Study: w×14 Recall: w×14 ("\n\n" has no token here)
        shots = [body[i * block:(i + 1) * block] for i in range(2)]
        for s in shots:
            assert s[:2] == study and s[2 + L:4 + L] == recall
            assert s[2:2 + L] == s[4 + L:]                 # the recall repeats the study list in order
        last = body[2 * block:]
        assert last == study + t + recall                  # test list then the cue; targets = test list
        words = [w for s in shots for w in s[2:2 + L]] + t
        assert len(set(words)) == 3 * L                    # every word of a trial is distinct
    again = build_recall_trials(tok, cfg)
    assert torch.equal(again.prompt, tr.prompt)            # reproducible from the seed
    assert not torch.equal(tr.targets[0], tr.targets[1])   # trials differ


def test_next_item_model_scores_perfectly(tok):
    fake = FakeRecallModel(len(tok), tok.convert_tokens_to_ids("study"), L, mode="next", skip=1)
    n = 6
    res = _run(fake, tok, n)
    d = res.data["intact"]
    assert d["correct"].shape == (n, L) and d["correct"].all()
    assert d["exact"].all()
    np.testing.assert_allclose(d["list_mass"], 1.0, atol=1e-6)
    h = res.headline().iloc[0]
    assert h.accuracy == 1.0 and h.exact_match == 1.0
    assert h.lag_plus1 == pytest.approx(1.0, abs=1e-6)
    curve = res.transition_curve().set_index("lag")["mean"]
    assert curve[1] == pytest.approx(1.0, abs=1e-6)
    assert curve.drop(1).abs().max() < 1e-6
    assert list(curve.index) == list(range(-12, 14))       # prev item ≤ 13th: lag −13 never exists
    # greedy recalls 1, 2, …, 14: transition i→i+1 leaves items i+1…14, possible +1…+(14−i)
    crp = res.crp()
    gen = crp[crp.source == "generated"].set_index("lag")
    assert gen.loc[1, "actual"] == 13 * n and gen.loc[1, "possible"] == 13 * n and gen.loc[1, "prob"] == 1.0
    assert gen.loc[2, "possible"] == 12 * n and gen.loc[2, "prob"] == 0.0
    assert gen.loc[13, "possible"] == n and gen.loc[-1, "possible"] == 0
    tf = crp[crp.source == "teacher_forced"].set_index("lag")
    assert tf.loc[1, "prob"] == pytest.approx(1.0, abs=1e-6) and tf.loc[2, "possible"] == 12 * n
    acc = res.positions()
    assert list(acc.position) == list(range(1, L + 1)) and (acc.accuracy == 1.0).all()


def test_fixed_wrong_item_model(tok):
    colon = tok.convert_tokens_to_ids(":")                 # never a list word
    fake = FakeRecallModel(len(tok), 0, L, mode="fixed", fixed_id=colon)
    res = _run(fake, tok, 5)
    d = res.data["intact"]
    assert not d["correct"].any() and not d["exact"].any()
    assert np.isnan(d["generated"]).all()                  # every generated token is an intrusion
    h = res.headline().iloc[0]
    assert h.accuracy == 0.0 and h.exact_match == 0.0
    assert h.list_mass < 1e-30
    # every list item has the same logit (−100), so renormalised over the 14 items each gets 1/14
    assert h.lag_plus1 == pytest.approx(1 / 14, rel=1e-5)
    curve = res.transition_curve()
    np.testing.assert_allclose(curve["mean"], 1 / 14, rtol=1e-5)
    gen = res.crp().query("source == 'generated'")
    assert (gen.possible == 0).all() and gen.prob.isna().all()


def test_ablation_changes_a_tiny_llama(tok):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)).eval()
    loaded = SimpleNamespace(model=model, tokenizer=tok, identity={"max_position_embeddings": 2048})
    conds = [Condition("intact", "intact"), Condition("all", "induction", 8, 0, [(l, h) for l in range(2) for h in range(4)])]
    for method in ("zero", "mean", "sink"):
        res = run_serial_recall(loaded, conds, SerialRecallConfig(n_trials=2, batch_size=2, method=method, n_shots=1))
        a, b = res.data["intact"], res.data["all"]
        assert a["trans"].shape == (2, L - 1, L)
        np.testing.assert_allclose(a["trans"].sum(-1), 1.0, rtol=1e-5)
        assert not np.allclose(a["trans"], b["trans"]), method


def test_bad_input(tok):
    with pytest.raises(InductionLabError, match="word pool too small"):
        build_recall_trials(tok, SerialRecallConfig(list_length=200, n_shots=3))
    with pytest.raises(InductionLabError, match="exceeds the model's context"):
        build_recall_trials(tok, SerialRecallConfig(n_trials=1), max_len=50)
    with pytest.raises(InductionLabError, match="list_length >= 2"):
        build_recall_trials(tok, SerialRecallConfig(list_length=1))


