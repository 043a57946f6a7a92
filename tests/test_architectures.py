"""The supported-architecture policy on every causal-LM architecture transformers ships.

For each model type of the installed transformers' ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` (a new release
adds cases by itself) a tiny random model is built (tests/_architectures.py: 2 layers, hidden 64, 4 heads,
a 512-entry vocabulary, fp32) and :func:`~inductionlab.core.support.check_supported` either passes it,
and then zero ablation of one head per layer, the per-head patterns and the fused target reductions equal
an independent reference within 1e-5 (a forward pre-hook zeroing the head's slice of the attention
output projection's input; ``output_attentions=True`` under eager attention), or refuses it with one line
naming the reason, which for the model types of :data:`EXPECTED` is the one written there. A tiny config
transformers cannot build or run is skipped with its error (:func:`test_how_many_architectures`
counts each outcome). Gemma 2 and GPT-Neo also run ``analyze`` and ``study head-types`` from the command
line, and a refused architecture is refused by the command line before anything is written.
"""

from __future__ import annotations

import functools
import json

import pytest
import torch
from click.testing import CliRunner
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

import _architectures as A
from inductionlab.cli import main
from inductionlab.core.attention import UnsupportedArchitecture
from inductionlab.core.instrument import ablate, instrument
from inductionlab.core.models import attention_shape
from inductionlab.core.support import check_supported

TYPES = sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
ATOL = 1e-5

NO_ATTENTION = "has no attention layers"
DIFFERENTIAL = "differential attention: a head is two maps"
HYBRID = "is a hybrid"
NOT_CAUSAL = "is not causal"
NO_DISPATCH = "does not dispatch through transformers' attention interface"
NOT_RUN = "does not run through transformers' attention interface"
NOT_REPRODUCED = "does not reproduce its own forward"
PER_LAYER = "has no single head grid"
LOOP = "times in one forward"
HEADS = "query heads per attention call"
SLICE = "changes a head's output on its way to the output projection"
NO_PROJ = "has no output projection"
REASONS = (NO_ATTENTION, DIFFERENTIAL, HYBRID, NOT_CAUSAL, NO_DISPATCH, NOT_RUN, NOT_REPRODUCED, PER_LAYER, LOOP,
           HEADS, SLICE, NO_PROJ, "reports other attention maps", "reports attention maps of another shape")

# the outcome of each model type whose tiny model builds: "measured", or the reason of its refusal. A model
# type not listed (a new transformers release) passes when measured exactly or refused for one of REASONS.
MEASURED = "measured"
EXPECTED = {
    **dict.fromkeys(("gpt2", "gpt_neox", "gptj", "opt", "phi", "phi3", "mistral", "mixtral", "qwen2", "qwen2_moe",
                     "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3", "gemma3_text", "llama", "olmo", "olmo2",
                     "olmo3", "olmoe", "stablelm", "starcoder2", "cohere", "cohere2", "granite", "granitemoe",
                     "gpt_bigcode", "codegen", "smollm3", "helium", "glm", "exaone4", "persimmon", "falcon",
                     "gpt_oss", "gpt_neo", "deepseek_v2", "deepseek_v3", "vaultgemma", "mllama", "llama4_text",
                     "doge", "nemotron"),
                    MEASURED),
    **dict.fromkeys(("mamba", "mamba2", "falcon_mamba", "rwkv"), NO_ATTENTION),
    "diffllama": DIFFERENTIAL,
    **dict.fromkeys(("jamba", "bamba", "minimax", "qwen3_next", "olmo_hybrid", "lfm3"), HYBRID),
    **dict.fromkeys(("bert", "roberta", "xlm-roberta", "electra", "camembert", "xlm", "xlnet", "roformer"),
                    NOT_CAUSAL),
    **dict.fromkeys(("bloom", "mpt", "xglm", "gpt_neox_japanese", "trocr", "prophetnet", "openai-gpt",
                     "git"), NO_DISPATCH),
    "bitnet": SLICE,
    "jetmoe": NO_PROJ,
    "dory": LOOP,
    "laguna": HEADS,
}


@functools.lru_cache(maxsize=None)
def _outcome(model_type: str) -> tuple[str, str]:
    """``("skip" | "refused" | "measured", detail)`` of ``model_type``'s tiny model (cached: the count reads it)."""
    model, why = A.build(model_type)
    if model is None:
        return "skip", why
    try:
        check_supported(model)
    except UnsupportedArchitecture as e:
        return "refused", str(e)
    return "measured", _compare(model)


def _compare(model) -> str:
    """The largest difference from the reference, as ``"ablation=.. patterns=.. reductions=.."``; raises on a
    layer without a reference projection."""
    ids = A.probe_ids()
    H = attention_shape(model.config)["n_heads"]
    L = attention_shape(model.config)["n_layers"]
    projections = A.output_projections(model)
    assert sorted(projections) == list(range(L)), f"reference projections found for layers {sorted(projections)}"
    d_abl = 0.0
    with torch.no_grad():
        plain = model(input_ids=ids).logits.float()
        for layer in range(L):
            ref = A.zero_head_reference(model, ids, layer, 1, H)
            assert (ref - plain).abs().max() > 1e-4, "the reference ablation changed nothing"
            with ablate(model, [(layer, 1)]):
                got = model(input_ids=ids).logits.float()
            d_abl = max(d_abl, float((got - ref).abs().max()))
    patterns = A.eager_patterns(model, ids)
    with torch.no_grad(), instrument(model, keep_patterns=True) as inst:
        model(input_ids=ids)
    d_pat = max(float((a - b).abs().max()) for a, b in zip(patterns, inst.patterns, strict=True))
    T = ids.shape[1]
    prev = torch.arange(-1, T - 1)                      # each query's previous token
    with torch.no_grad(), instrument(model, reductions={"prev": prev}) as inst:
        model(input_ids=ids)
    ref_prev = torch.stack([p[:, :, torch.arange(1, T), torch.arange(T - 1)] for p in patterns])
    d_red = float((inst.reduced["prev"][..., 1:] - ref_prev).abs().max())
    return f"ablation={d_abl:.1e} patterns={d_pat:.1e} reductions={d_red:.1e}"


@pytest.mark.parametrize("model_type", TYPES)
def test_measured_exactly_or_refused_for_its_reason(model_type):
    kind, detail = _outcome(model_type)
    if kind == "skip":
        pytest.skip(f"tiny config not buildable: {detail}")
    want = EXPECTED.get(model_type)
    if kind == "refused":
        assert "\n" not in detail, detail                          # one line
        assert want != MEASURED, f"{model_type} should be measured, but: {detail}"
        assert any(r in detail for r in ((want,) if want else REASONS)), detail
        return
    assert want is None or want == MEASURED, f"{model_type} was measured, expected refusal: {want}"
    values = dict(part.split("=") for part in detail.split())
    assert all(float(v) <= ATOL for v in values.values()), f"{model_type}: {detail}"


def test_how_many_architectures():
    """Every model type has an outcome; the counts are printed (``pytest -s``) for the closing note."""
    outcomes = {t: _outcome(t) for t in TYPES}
    counts = {k: sum(1 for o in outcomes.values() if o[0] == k) for k in ("measured", "refused", "skip")}
    print(f"\n{len(TYPES)} architectures: {counts}")
    assert sum(counts.values()) == len(TYPES)
    assert counts["measured"] >= len([t for t, w in EXPECTED.items() if w == MEASURED])


def test_refusal_is_before_anything_is_written(tmp_path):
    """The command line refuses a model of no attention, with one line and exit 2, writing nothing."""
    from transformers import AutoModelForCausalLM

    cfg = A.tiny_config("mamba")
    cfg.vocab_size = len(_tokenizer())
    model = AutoModelForCausalLM.from_config(cfg)
    d = tmp_path / "mamba"
    model.save_pretrained(d)
    _tokenizer().save_pretrained(d)
    out = tmp_path / "run"
    r = CliRunner().invoke(main, ["analyze", "--model", str(d), "--out", str(out), "--quiet"])
    assert r.exit_code == 2, r.output
    err = r.stderr.strip()
    assert err.startswith("error:") and NO_ATTENTION in err and "\n" not in err
    assert not out.exists()


def test_the_fused_kernel_is_skipped_for_unequal_head_sizes():
    """Multi-head latent attention (value head size != query/key head size) takes the unfused path."""
    kind, detail = _outcome("deepseek_v3")
    if kind == "skip":
        pytest.skip(detail)
    model, _ = A.build("deepseek_v3")
    with torch.no_grad(), instrument(model, reductions={"prev": torch.arange(-1, A.SEQ - 1)}) as inst:
        model(input_ids=A.probe_ids())
    assert inst.fused_calls == 0 and inst.calls == 2
    assert {c[0][1] for c in inst.layer_calls.values()} == {A.SIZES["v_head_dim"]}


# -- the command line on Gemma 2 and GPT-Neo --------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _tokenizer():
    """A BPE tokenizer (1,500 entries) trained on the ICL tasks' prompts and frequent words, as the head-types
    study's tests build it, so that every task has items with a well-defined first answer token."""
    from transformers import PreTrainedTokenizerFast
    from wordfreq import top_n_list

    from inductionlab.data.tokenizer import train_bpe
    from inductionlab.protocols.icl_tasks import build_tasks, format_prompt

    words = [w for w in top_n_list("en", 600) if w.isalpha()]
    texts = [format_prompt([it], it.x) for t in build_tasks(["copy", "next_letter"]).values() for it in t.items]
    texts += [" ".join(words[i:i + 50]) for i in range(0, 600, 50)] * 3
    return PreTrainedTokenizerFast(tokenizer_object=train_bpe(texts, 1500).tokenizer, eos_token="<|endoftext|>",
                                  bos_token="<|endoftext|>")


WINDOW = {"gemma2": 12, "gpt_neo": 4096}     # sliding windows of the command-line models


@pytest.fixture(scope="module", params=["gemma2", "gpt_neo"])
def cli_model(request, tmp_path_factory):
    """A tiny model of the architecture saved with ``save_pretrained``, with :func:`_tokenizer`."""
    from transformers import AutoModelForCausalLM

    tok = _tokenizer()
    cfg = A.tiny_config(request.param)
    cfg.vocab_size = len(tok)
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
        setattr(cfg, k, tok.eos_token_id)
    for k in ("sliding_window", "window_size"):          # Gemma 2: shorter than the score sequences (17 tokens)
        if getattr(cfg, k, None):
            setattr(cfg, k, WINDOW[request.param])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    d = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return request.param, d


def test_analyze_from_the_command_line(cli_model, tmp_path):
    arch, d = cli_model
    out = tmp_path / "run"
    r = CliRunner().invoke(main, ["analyze", "--model", str(d), "--out", str(out), "--n-permutations", "2",
                                  "--list-length", "16", "--cue-position", "8", "--ks", "1", "--n-draws", "1",
                                  "--score-seq-len", "8", "--score-batch-size", "2", "--top", "2", "--cues", "seed", "--quiet",
                                  "--dtype", "float32"])
    assert r.exit_code == 0, r.output
    res = json.loads((out / "results.json").read_text())
    assert res["model"]["model_type"] == arch
    assert len(res["heads"]["induction"]) == 2 and len(res["heads"]["induction"][0]) == 4
    # a sliding window shorter than the sequences is said in the record (and on the terminal), not passed over
    windows = [w for w in res.get("warnings", []) if "sliding attention window of 12 tokens" in w]
    if WINDOW[arch] < 17:
        assert any(w.startswith("the head scores: sequences of 17 tokens") for w in windows), res.get("warnings")
        assert "warning: the head scores" in r.output
    else:
        assert "warnings" not in res


def test_study_head_types_from_the_command_line(cli_model, tmp_path):
    arch, d = cli_model
    text = tmp_path / "words.txt"
    from wordfreq import top_n_list
    text.write_text(" ".join([w for w in top_n_list("en", 600) if w.isalpha()] * 4))
    out = tmp_path / "run"
    r = CliRunner().invoke(main, ["study", "head-types", "--model", str(d), "--out", str(out), "--quiet",
                                  "--dtype", "float32", "--score-seq-len", "8", "--score-batch-size", "2",
                                  "--fv-tasks", "copy,next_letter", "--fv-shots", "3", "--fv-prompts", "2",
                                  "--fv-zero-shot-prompts", "2", "--fv-top", "2", "--route-prompts", "4",
                                  "--route-attention-prompts", "4", "--fractions", "0.25", "--exclude-fraction",
                                  "0.25", "--n-draws", "1", "--probe-prompts", "2", "--icl-text", str(text),
                                  "--icl-late", "40", "--icl-early", "10", "--icl-sequences", "2",
                                  "--list-length", "16", "--cue-position", "8", "--n-permutations", "2",
                                  "--cues", "all:4"])
    assert r.exit_code == 0, r.output
    res = json.loads((out / "results.json").read_text())
    assert res["model"]["model_type"] == arch


@pytest.mark.parametrize("model_type, reason", [("diffllama", DIFFERENTIAL), ("mamba", NO_ATTENTION)])
def test_the_api_refuses_before_a_forward(model_type, reason):
    """A model built without load_model: ablate() refuses it up front, with the same one line."""
    model, why = A.build(model_type)
    if model is None:
        pytest.skip(why)
    calls = []
    handle = model.register_forward_pre_hook(lambda *a: calls.append(1))
    with pytest.raises(UnsupportedArchitecture, match=reason):
        with ablate(model, [(0, 0)]):
            model(input_ids=A.probe_ids())
    handle.remove()
    assert calls == []


@pytest.mark.parametrize("new_decoder", [False, True])
def test_falcon_with_alibi_is_measured_exactly(new_decoder):
    """Falcon with ALiBi adds its position bias to the mask it asks transformers to materialise
    (``allow_is_causal_skip=False``): the instrumentation's mask honours that, so it is measured like the rest."""
    from transformers import AutoModelForCausalLM

    cfg = A.tiny_config("falcon")
    cfg.alibi, cfg.new_decoder_architecture = True, new_decoder
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    check_supported(model)
    values = dict(part.split("=") for part in _compare(model).split())
    assert all(float(v) <= ATOL for v in values.values()), values
