"""Non-finite models (issue 28 §5): a NaN or an inf in a weight is refused before anything is written,
naming the tensor; an overflow of the activations (every weight finite) stops the run at the first
forward pass whose logits hold one, naming the module where the non-finite values first appear.
Before, both ended in a pandas traceback ("Encountered all NA values") while the report was written."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from _tiny import tiny_llama_dir
from test_bad_inputs import MODEL_COMMANDS, refused
from inductionlab.cli import main
from inductionlab.errors import InductionLabError

FAST = ["--n-permutations", "3", "--list-length", "30", "--cue-position", "15", "--ks", "1,2", "--n-draws", "2",
        "--score-seq-len", "8", "--score-batch-size", "2", "--top", "3", "--quiet", "--dtype", "float32"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_llama_dir(tmp_path_factory.mktemp("tiny") / "llama", n_layers=2, n_heads=4)


def _edited(model_dir: Path, root: Path, edit) -> Path:
    from safetensors.torch import load_file, save_file

    d = Path(shutil.copytree(model_dir, root / "model"))
    w = load_file(d / "model.safetensors")
    edit(w)
    save_file(w, d / "model.safetensors", metadata={"format": "pt"})
    return d


WEIGHTS = {   # name -> (edit of the state dict, the tensor the error names)
    "NaN LM head": (lambda w: w["lm_head.weight"].fill_(float("nan")), "lm_head.weight"),
    "NaN in one LM-head row": (lambda w: w["lm_head.weight"][7].fill_(float("nan")), "lm_head.weight"),
    "inf in a value projection": (lambda w: w["model.layers.1.self_attn.v_proj.weight"].__setitem__((0, 3), float("inf")),
                                  r"model\.layers\.1\.self_attn\.v_proj\.weight holds 1 inf of"),
    "-inf in an embedding row": (lambda w: w["model.embed_tokens.weight"][4].fill_(float("-inf")),
                                 r"model\.embed_tokens\.weight holds 32 inf"),
}


@pytest.mark.parametrize("command", list(MODEL_COMMANDS))
@pytest.mark.parametrize("case", list(WEIGHTS))
def test_non_finite_weight_refused_before_anything_is_written(tmp_path, model_dir, case, command):
    edit, pattern = WEIGHTS[case]
    d = _edited(model_dir, tmp_path, edit)
    args = [str(a) for a in MODEL_COMMANDS[command](str(d), str(tmp_path / "out"))]
    refused(args, rf"weight {pattern}", tmp_path)


def test_overflow_named_where_it_first_appears(tmp_path, model_dir):
    """Every weight finite, the final norm's scale 3e38: its output overflows float32; the run stops at
    the first forward pass with one line naming ``model.norm``."""
    d = _edited(model_dir, tmp_path, lambda w: w["model.norm.weight"].fill_(3e38))
    r = CliRunner().invoke(main, ["analyze", "--model", str(d), "--out", str(tmp_path / "out"), *FAST])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    errors = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, r.output
    assert re.search(r"logits hold .* NaN.* first appear in the output of model\.norm \(LlamaRMSNorm: [\d,]+ inf of "
                     r"[\d,]+ values\); every weight is finite, so an activation overflows float32", errors[0]), errors[0]


def test_api_guard_names_the_first_module_and_ignores_masked_logits():
    from transformers import LlamaConfig, LlamaForCausalLM

    from inductionlab.core.finite import check_finite_weights, finite_outputs

    torch.manual_seed(0)
    m = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=1)).eval()
    ids = torch.tensor([[1, 2, 3, 4]])
    check_finite_weights(m)
    with finite_outputs(m), torch.no_grad():
        m(ids)                                               # finite: nothing said
        h = m.lm_head.register_forward_hook(lambda mod, a, out: out.index_fill(-1, torch.tensor([3]), -float("inf")))
        m(ids)                                               # one token masked to -inf: a probability of 0, fine
        h.remove()
        m.model.layers[1].post_attention_layernorm.weight.data.fill_(3e38)
        with pytest.raises(InductionLabError, match=r"first appear in the output of "
                                                    r"model\.layers\.1\.post_attention_layernorm \(LlamaRMSNorm: "):
            m(ids)
    m.model.layers[1].mlp.down_proj.weight.data[0, 0] = float("nan")
    with pytest.raises(InductionLabError, match=r"weight model\.layers\.1\.mlp\.down_proj\.weight holds 1 NaN of 512"):
        check_finite_weights(m)
