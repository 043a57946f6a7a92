"""Issue 28, kind 7 (its item 6): models that large-model users have.

A model dispatched by accelerate keeps its offloaded weights on the ``meta`` device and loads them in hooks
for each forward (CPU offload, disk offload, ``device_map`` with ``"disk"``). Head scores and the lag probe
on such a model equal those of the plain model, and leave it dispatched. A model whose weights are on
``meta`` with nothing to load them is refused with one line before anything is written.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from conftest import make_tiny
from inductionlab.core.ablation import Condition
from inductionlab.core.models import LoadedModel, attention_shape, ran_identity
from inductionlab.core.placement import execution_device
from inductionlab.core.scores import compute_head_scores
from inductionlab.errors import InductionLabError
from inductionlab.protocols.lag_probe import LagProbeConfig, run_lag_probe
from test_bad_inputs import ANALYZE_FAST, model_dir, refused  # noqa: F401 (fixture)

HOW = ["cpu_offload", "dispatch with disk", "from_pretrained device_map with disk"]


def _dispatched(plain, how: str, tmp):
    """A copy of ``plain`` dispatched by accelerate, some or all of its weights on ``meta``."""
    import accelerate
    from accelerate.utils import offload_state_dict

    if how == "cpu_offload":
        return accelerate.cpu_offload(copy.deepcopy(plain), execution_device=torch.device("cpu"))
    device_map = {"model.embed_tokens": "cpu", "model.layers.0": "disk", "model.layers.1": "cpu",
                  "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "disk"}
    if how == "dispatch with disk":
        model = copy.deepcopy(plain)
        offload_state_dict(tmp / "offload", {k: v for k, v in model.state_dict().items()
                                             if k.startswith(("model.layers.0.", "lm_head."))})
        return accelerate.dispatch_model(model, device_map, main_device="cpu", offload_dir=tmp / "offload")
    from transformers import AutoModelForCausalLM
    plain.save_pretrained(tmp / "saved")
    return AutoModelForCausalLM.from_pretrained(tmp / "saved", device_map=device_map, offload_folder=tmp / "offload",
                                                dtype=torch.float32, attn_implementation="sdpa").eval()


@pytest.fixture(scope="module")
def plain():
    return make_tiny("llama", ctx=64)


def _on_meta(model) -> bool:
    return any(p.device.type == "meta" for p in model.parameters())


@pytest.mark.parametrize("how", HOW)
def test_head_scores_and_lag_probe_of_a_dispatched_model_are_the_plain_ones(tmp_path, plain, word_tokenizer, how):
    model = _dispatched(plain, how, tmp_path)
    assert _on_meta(model) and execution_device(model) == torch.device("cpu")
    kw = dict(vocab_size=800, seq_len=10, batch_size=2, n_batches=2, seed=3)
    want, got = compute_head_scores(plain, **kw), compute_head_scores(model, **kw)
    for name in want.scores:
        np.testing.assert_allclose(got.scores[name], want.scores[name], atol=1e-6, err_msg=name)
    assert got.induction_loss == pytest.approx(want.induction_loss, abs=1e-5)

    conds = [Condition("intact", "intact"), Condition("induction-1", "induction", 1, 0, [(1, 2)]),
             Condition("layer0", "single", 1, 0, [(0, 1)])]
    loaded = {m: LoadedModel(m, word_tokenizer, {"name": "tiny", **attention_shape(m.config)}) for m in (plain, model)}
    for cues in ("seed", "all:4"):
        cfg = LagProbeConfig(n_permutations=3, list_length=12, cue_position=6, batch_size=2, cues=cues)
        want, got = (run_lag_probe(loaded[m], conds, cfg) for m in (plain, model))
        for c in conds:
            np.testing.assert_allclose(got.probs[c.name], want.probs[c.name], atol=1e-6, err_msg=f"{cues} {c.name}")
            np.testing.assert_allclose(got.list_mass[c.name], want.list_mass[c.name], atol=1e-6)
    assert _on_meta(model), "the model was moved off its hooks"
    assert ran_identity(loaded[model])["device"] == "cpu"


def _meta_loaded(word_tokenizer):
    from conftest import tiny_config
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(tiny_config("llama", ctx=64))
    return LoadedModel(model, word_tokenizer, {"name": "meta", "dtype": "float32", **attention_shape(model.config)})


def test_a_model_on_meta_without_hooks_is_refused_before_anything_is_written(tmp_path, word_tokenizer):
    from inductionlab.studies.analyze.config import AnalyzeConfig
    from inductionlab.studies.analyze.study import analyze
    from inductionlab.studies.configs import AblationConfig, HeadScoreConfig
    from inductionlab.studies.spec import RunOptions

    loaded = _meta_loaded(word_tokenizer)
    cfg = AnalyzeConfig(ablation=AblationConfig(ks=(1,), n_draws=1), top=2, scores=HeadScoreConfig(seq_len=8, batch_size=2),
                        lag=LagProbeConfig(n_permutations=2, list_length=20, cue_position=10))
    with pytest.raises(InductionLabError, match=r"weight model\.embed_tokens\.weight .* meta device .*no offload hook"):
        analyze(loaded, cfg, tmp_path / "out", RunOptions(progress=False))
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(InductionLabError, match="meta device"):
        compute_head_scores(loaded.model, vocab_size=800, seq_len=8, batch_size=2)
    with pytest.raises(InductionLabError, match="meta device"):
        run_lag_probe(loaded, [Condition("intact", "intact")], LagProbeConfig(n_permutations=2, list_length=12,
                                                                             cue_position=6, batch_size=2))


def test_a_partly_meta_model_is_refused(tmp_path, plain, word_tokenizer):
    """One weight left on meta (a load that skipped it), the rest real: the first such weight is named."""
    from inductionlab.core.placement import check_weights_present

    model = copy.deepcopy(plain)
    model.model.layers[1].mlp.down_proj.to("meta")
    with pytest.raises(InductionLabError, match=r"model\.layers\.1\.mlp\.down_proj\.weight is on the meta device"):
        check_weights_present(model)
    check_weights_present(plain)


def test_cli_device_map_meta_is_refused(tmp_path, model_dir):  # noqa: F811
    refused(["analyze", "--model", model_dir, "--out", tmp_path / "out", *ANALYZE_FAST, "--device-map", "meta"],
            r"device map 'meta' leaves weights unloaded: .*meta device", tmp_path)
