"""Issue 18, kinds 6, 7 and 10: model files that do not match their config, damaged run files, and
the bug classes reported against other interpretability tools (dropout left on, a second thread,
a stale KV cache).

CLI cases follow tests/test_bad_inputs.py (one ``error:`` line, exit 2, nothing written: its
:func:`refused`); API cases expect an :class:`InductionLabError` naming the problem.
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch as st
import torch
from click.testing import CliRunner

from conftest import tiny_config
from inductionlab.studies.engine import kept
from inductionlab.cli import main
from inductionlab.errors import InductionLabError
from test_bad_inputs import ANALYZE_FAST, MODEL_COMMANDS, TEMPORAL_FAST, _args, model_dir, refused  # noqa: F401
from test_cli_train_data import _fake_run
from test_train_helpers import make_corpus, run_cli, tiny_flags


# -- kind 6: model files whose weights or config do not make the model they claim -------------------------

def _edit_weights(d: Path, edit) -> None:
    w = d / "model.safetensors"
    sd = st.load_file(w)
    edit(sd)
    st.save_file(sd, w, metadata={"format": "pt"})


def _edit_config(d: Path, edit) -> None:
    c = json.loads((d / "config.json").read_text())
    edit(c)
    (d / "config.json").write_text(json.dumps(c))


Q0 = "model.layers.0.self_attn.q_proj.weight"
WEIGHT_CASES = {   # name -> (edit of a copy of the tiny model, pattern of the error line)
    "missing weight": (lambda d: _edit_weights(d, lambda s: s.pop(Q0)),
                       rf"weight {Q0} is missing from .*model\.safetensors.*randomly initialised.*save the model again"),
    "missing lm_head (untied)": (lambda d: _edit_weights(d, lambda s: s.pop("lm_head.weight")),
                                 r"weight lm_head\.weight is missing"),
    "unexpected weight": (lambda d: _edit_weights(d, lambda s: s.__setitem__("model.layers.7.mlp.extra.weight",
                                                                            torch.zeros(3))),
                          r"holds weight model\.layers\.7\.mlp\.extra\.weight, which the model .* has no place for"),
    "mis-shaped weight": (lambda d: _edit_weights(d, lambda s: s.__setitem__(Q0, torch.zeros(16, 32))),
                          rf"weight {Q0} in .*model\.safetensors has shape \[16, 32\] but the model's config gives "
                          r"\[32, 32\]"),
    "config with a layer the weights lack": (lambda d: _edit_config(d, lambda c: c.update(num_hidden_layers=3)),
                                             r"weight model\.layers\.2\..* is missing .*and 8 more"),
    "heads do not divide the hidden size": (lambda d: _edit_config(d, lambda c: c.update(num_attention_heads=5)),
                                            r"config\.json is not a valid model config .*hidden size \(32\) is not a "
                                            r"multiple of the number of attention heads \(5\).*fix .*config\.json"),
    "unknown model_type": (lambda d: _edit_config(d, lambda c: c.update(model_type="nosuchmodel")),
                           r"config\.json is not a valid model config .*nosuchmodel"),
    "config without model_type": (lambda d: _edit_config(d, lambda c: c.pop("model_type")),
                                  r"config\.json is not a valid model config .*model_type"),
    "config.json a JSON list": (lambda d: (d / "config.json").write_text("[1, 2]"), r"config\.json .*model config"),
    "a size of the wrong type": (lambda d: _edit_config(d, lambda c: c.update(hidden_size="wide")),
                                 r"config\.json is not a valid model config .*hidden_size"),
    "a negative size": (lambda d: _edit_config(d, lambda c: c.update(intermediate_size=-3)),
                        r"config\.json cannot be built .*negative dimension"),
}


def _damaged_copy(model_dir: Path, root: Path, case: str) -> Path:
    d = Path(shutil.copytree(model_dir, root / case.replace(" ", "-")))
    WEIGHT_CASES[case][0](d)
    return d


@pytest.mark.parametrize("command", list(MODEL_COMMANDS))
@pytest.mark.parametrize("case", list(WEIGHT_CASES))
def test_model_files_that_do_not_match(tmp_path, model_dir, command, case):
    model = _damaged_copy(model_dir, tmp_path, case)
    refused(_args(command, model, tmp_path / "work" / "out"), WEIGHT_CASES[case][1], tmp_path)


@pytest.mark.parametrize("case", list(WEIGHT_CASES))
def test_load_model_refuses_files_that_do_not_match(tmp_path, model_dir, case):
    from inductionlab.core.models import load_model
    with pytest.raises(InductionLabError, match=WEIGHT_CASES[case][1]):
        load_model(str(_damaged_copy(model_dir, tmp_path, case)))


def test_intact_and_tied_models_still_load(tmp_path, model_dir):
    """No false alarm: the intact tiny model loads with its saved weights, and a tied-embedding model
    (saved without lm_head.weight) is not 'missing' one."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from inductionlab.core.models import load_model
    lm = load_model(str(model_dir))
    saved = st.load_file(model_dir / "model.safetensors")
    assert torch.equal(lm.model.state_dict()[Q0], saved[Q0])
    tied = tmp_path / "tied"
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(lm.tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    LlamaForCausalLM(cfg).save_pretrained(tied)
    lm.tokenizer.save_pretrained(tied)
    assert "lm_head.weight" not in st.load_file(tied / "model.safetensors")
    t = load_model(str(tied))
    assert t.model.lm_head.weight.data_ptr() == t.model.model.embed_tokens.weight.data_ptr()


def test_bin_checkpoint_missing_a_weight(tmp_path, model_dir):
    """The same check for a PyTorch .bin checkpoint (save_pretrained(safe_serialization=False))."""
    from inductionlab.core.models import load_model
    d = Path(shutil.copytree(model_dir, tmp_path / "bin"))
    sd = st.load_file(d / "model.safetensors")
    (d / "model.safetensors").unlink()
    sd.pop("model.norm.weight")
    torch.save(sd, d / "pytorch_model.bin")
    with pytest.raises(InductionLabError, match=r"weight model\.norm\.weight is missing from .*pytorch_model\.bin"):
        load_model(str(d))


# -- kind 7: damaged run files -------------------------------------------------------------------------

def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2])


def _garbage(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[len(data) // 2: len(data) // 2 + 64] = b"\xff" * 64          # inside an array's bytes: a bad CRC
    p.write_bytes(bytes(data))


DAMAGE = {"truncated": _truncate, "overwritten bytes": _garbage, "empty": lambda p: p.write_bytes(b""),
          "an .npy, not an .npz": lambda p: np.save(open(p, "wb"), np.zeros(3))}


def _pieces(out: Path) -> dict:
    return {str(p.relative_to(out)): dict(np.load(p)) for p in sorted((out / "checkpoints").rglob("*.npz"))}


def _equal_pieces(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].keys() == b[k].keys(), k
        for name in a[k]:
            np.testing.assert_array_equal(a[k][name], b[k][name], err_msg=f"{k}:{name}")


@pytest.mark.parametrize("command, damage", [("analyze", d) for d in DAMAGE] + [("study temporal", "truncated")])
def test_damaged_lag_piece_is_recomputed(tmp_path, model_dir, command, damage):
    """A damaged ``lag/*.npz`` piece of a finished run: the rerun says so on stderr, recomputes it
    (exit 0) and gets the same arrays a fresh run has."""
    out = tmp_path / "run"
    args = _args(command, model_dir, out)
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    want = _pieces(out)
    piece = out / "checkpoints" / "lag" / "intact.npz"
    if not piece.exists():                                   # study temporal keys its pieces by phase
        piece = sorted((out / "checkpoints").rglob("intact.npz"))[0]
    DAMAGE[damage](piece)
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert "Traceback" not in r.output
    assert f"checkpoint piece {piece} is damaged" in r.stderr and "computing it again" in r.stderr, r.stderr
    _equal_pieces(_pieces(out), want)


def test_damaged_pieces_api(tmp_path):
    """ResumableRun, the one reader of pieces: npz and JSON pieces, each damage is recomputed once."""
    from inductionlab.runtime.runs import ResumableRun
    run = ResumableRun(tmp_path / "r", "toy", {"a": 1})
    run.open()
    calls = []
    first = kept(run, "lag/x", lambda: calls.append(1) or {"v": np.arange(4.0)})
    assert kept(run, "scores", lambda: calls.append(2) or {"s": [1, 2]}, json=True) == {"s": [1, 2]}
    for damage in DAMAGE.values():
        damage(run.path("lag/x", "npz"))
        np.testing.assert_array_equal(kept(run, "lag/x", lambda: calls.append(1) or {"v": np.arange(4.0)})["v"],
                                      first["v"])
    (run.path("scores", "json")).write_text('{"s": [1,')
    assert kept(run, "scores", lambda: calls.append(2) or {"s": [1, 2]}, json=True) == {"s": [1, 2]}
    assert calls == [1, 2] + [1] * len(DAMAGE) + [2]
    assert kept(run, "lag/x", lambda: pytest.fail("recomputed an intact piece"))["v"].tolist() == [0, 1, 2, 3]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(corpus, training run): a 2-update cpu-micro run, telemetry at its checkpoints."""
    tmp = tmp_path_factory.mktemp("trained")
    data = make_corpus(tmp)
    flags = tiny_flags(data, tmp / "run", preset="cpu-micro", tokens=2048, log_checkpoints=0)
    r = run_cli(["train", *flags])
    assert r.returncode == 0, r.stderr
    return data, tmp / "run", flags


def test_damaged_evaluate_piece_is_recomputed(tmp_path, trained):
    """The same for ``evaluate`` (its phase pieces are .npz, its perplexity piece JSON)."""
    from test_evaluate import SMALL
    data, run, _ = trained
    out = tmp_path / "ev"
    args = ["evaluate", str(run), "--shards", str(data), *SMALL, "--out", str(out)]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    want = _pieces(out)
    npz, js = out / "checkpoints" / "hits" / "intact.npz", out / "checkpoints" / "perplexity.json"
    want_json = json.loads(js.read_text())
    _truncate(npz)
    js.write_text(js.read_text()[:10])
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert f"checkpoint piece {npz} is damaged" in r.stderr and f"checkpoint piece {js} is damaged" in r.stderr
    _equal_pieces(_pieces(out), want)
    assert json.loads(js.read_text()) == want_json


def _telemetry_files(run: Path) -> list[Path]:
    return sorted((run / "checkpoints").glob("step_*/telemetry.json"))


TELEMETRY_DAMAGE = {   # name -> (edit of the text of a checkpoint's telemetry.json, pattern)
    "truncated": (lambda t: t[: len(t) // 2], r"telemetry .* is damaged \(.*\); restore it .* or delete the checkpoint"),
    "empty": (lambda t: "", r"telemetry .* is damaged"),
    "a JSON list": (lambda t: "[]", r"is damaged \(a JSON list, not an object\)"),
    "no scores": (lambda t: json.dumps({**json.loads(t), "scores": {}}), r"no 'scores' with induction"),
    "ragged grid": (lambda t: json.dumps({**json.loads(t), "scores": {**json.loads(t)["scores"],
                                                                      "induction": [[0.1, 0.2], [0.3]]}}),
                    r"score 'induction' is not a \[layers\]\[heads\] grid"),
    "step a string": (lambda t: json.dumps({**json.loads(t), "step": "two"}), r"'step' is 'two', not a count"),
    "a value changed": (lambda t: json.dumps({**json.loads(t), "heldout_loss": 0.01}),
                        r"SHA-256 differs from the one meta.json recorded"),
}


@pytest.mark.parametrize("case", list(TELEMETRY_DAMAGE))
def test_damaged_checkpoint_telemetry_refused_by_telemetry(tmp_path, trained, case):
    _, run, _ = trained
    copy = Path(shutil.copytree(run, tmp_path / "run"))
    f = _telemetry_files(copy)[-1]
    edit, pattern = TELEMETRY_DAMAGE[case]
    f.write_text(edit(f.read_text()))
    refused(["telemetry", copy, "--out", tmp_path / "tel"], pattern, tmp_path)
    from inductionlab.train.telemetry import read_telemetry
    with pytest.raises(InductionLabError, match=pattern):
        read_telemetry(copy)


def test_damaged_checkpoint_telemetry_refused_on_train_resume(tmp_path, trained):
    """A run killed after its last checkpoint (status still running) resumes only over intact telemetry."""
    data, run, flags = trained
    copy = Path(shutil.copytree(run, tmp_path / "run"))
    rec = json.loads((copy / "run.json").read_text())
    (copy / "run.json").write_text(json.dumps({**rec, "status": "running"}))
    f = _telemetry_files(copy)[0]
    f.write_text(f.read_text()[:40])
    flags = [f"--out={copy}" if a.startswith("--out=") else a for a in flags]
    refused(["train", *flags], rf"checkpoint telemetry {f} is damaged", tmp_path)


@pytest.mark.parametrize("text", ["{not json", "[]", json.dumps({"budget": {"tokens": 1}})])
def test_damaged_run_record_refused_by_telemetry(tmp_path, text):
    run = _fake_run(tmp_path / "run")
    (run / "run.json").write_text(text)
    refused(["telemetry", run, "--out", tmp_path / "tel"], r"training run record .*run\.json is damaged", tmp_path)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"), n_lines=1500)


def _manifest_edit(c: Path, edit) -> None:
    m = json.loads((c / "manifest.json").read_text())
    edit(m)
    (c / "manifest.json").write_text(json.dumps(m))


VERIFY_CASES = {
    "no train checksum": (lambda c: _manifest_edit(c, lambda m: m["splits"]["train"].pop("sha256")),
                          r"records no checksum of train\.bin \(splits\.train\.sha256 is None\).*cannot be verified"),
    "no heldout checksum": (lambda c: _manifest_edit(c, lambda m: m["splits"]["heldout"].update(sha256=7)),
                            r"records no checksum of heldout\.bin"),
    "no tokenizer checksum": (lambda c: _manifest_edit(c, lambda m: m["tokenizer"].pop("sha256")),
                              r"records no checksum of tokenizer\.json"),
    "tokenizer edited": (lambda c: (c / "tokenizer.json").write_text((c / "tokenizer.json").read_text() + " "),
                         r"tokenizer\.json sha256 .* != manifest"),
}


@pytest.mark.parametrize("case", list(VERIFY_CASES))
def test_corpus_verify_needs_the_checksums(tmp_path, corpus, case):
    c = Path(shutil.copytree(corpus, tmp_path / "c"))
    VERIFY_CASES[case][0](c)
    refused(["corpus", "info", c, "--verify"], VERIFY_CASES[case][1], tmp_path)
    from inductionlab.data.shards import TokenShards
    with pytest.raises(InductionLabError, match=VERIFY_CASES[case][1]):
        TokenShards.open(c).verify()


def test_corpus_verify_passes_an_intact_corpus(corpus):
    r = CliRunner().invoke(main, ["corpus", "info", str(corpus), "--verify"])
    assert r.exit_code == 0 and "sha256: ok" in r.output, r.output


# -- kind 10: dropout left on, a second thread, a stale KV cache ---------------------------------------------

@pytest.fixture
def dropout_loaded(word_tokenizer):
    """A tiny Llama with attention dropout 0.5, left in train() mode, one submodule set to eval()."""
    from transformers import AutoModelForCausalLM

    from inductionlab.core.models import LoadedModel, attention_shape
    cfg = tiny_config("llama")
    cfg.attention_dropout = 0.5
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").train()
    model.model.layers[1].eval()
    return LoadedModel(model, word_tokenizer, {"name": "dropout-llama", **attention_shape(model.config)})


def _modes(model) -> list[bool]:
    return [m.training for m in model.modules()]


def test_train_mode_head_scores_are_the_eval_mode_scores(dropout_loaded):
    from inductionlab.core.scores import compute_head_scores
    model = dropout_loaded.model
    x = torch.randint(5, 800, (1, 12))
    with torch.no_grad():                              # dropout is live in this model: train-mode forwards differ
        assert not torch.equal(model(input_ids=x).logits, model(input_ids=x).logits)
    modes = _modes(model)
    kw = dict(vocab_size=800, seq_len=10, batch_size=2, seed=3)
    a = compute_head_scores(model, **kw)
    b = compute_head_scores(model, **kw)
    assert _modes(model) == modes                      # each module's mode restored, the eval one too
    model.eval()
    want = compute_head_scores(model, **kw)
    for name in want.scores:
        np.testing.assert_array_equal(a.scores[name], want.scores[name])
        np.testing.assert_array_equal(b.scores[name], want.scores[name])


def test_train_mode_lag_probe_is_the_eval_mode_probe(dropout_loaded):
    from inductionlab.core.ablation import Condition
    from inductionlab.protocols.lag_probe import LagProbeConfig, run_lag_probe
    model = dropout_loaded.model
    conds = [Condition("intact", "intact"), Condition("induction-1", "induction", 1, 0, [(1, 2)])]
    cfg = LagProbeConfig(n_permutations=2, list_length=12, cue_position=6, batch_size=2)
    modes = _modes(model)
    a, b = (run_lag_probe(dropout_loaded, conds, cfg) for _ in range(2))
    assert _modes(model) == modes
    model.eval()
    want = run_lag_probe(dropout_loaded, conds, cfg)
    for c in ("intact", "induction-1"):
        for got in (a, b):
            np.testing.assert_array_equal(got.probs[c], want.probs[c], err_msg=c)
            np.testing.assert_array_equal(got.list_mass[c], want.list_mass[c], err_msg=c)


def test_another_threads_forward_is_not_ablated(tiny_loaded):
    """While thread A holds ablate(), thread B's plain forward of the same model gets the plain logits,
    and B's own ablate() of that model is refused with a clear error."""
    from inductionlab.core.instrument import AlreadyInstrumented, ablate
    model = tiny_loaded.model
    x = torch.randint(5, 800, (1, 10))
    with torch.inference_mode():
        plain = model(input_ids=x).logits
    inside, go, done, got = threading.Event(), threading.Event(), threading.Event(), {}

    def a():
        with torch.inference_mode(), ablate(model, [(0, h) for h in range(8)]):
            got["a"] = model(input_ids=x).logits
            inside.set()
            go.wait(30)                                      # B runs while A's context is open
            got["a2"] = model(input_ids=x).logits
        done.set()

    def b():
        inside.wait(30)
        try:
            with torch.inference_mode():
                got["b"] = model(input_ids=x).logits
                try:
                    with ablate(model, [(1, 0)]):
                        pass
                except AlreadyInstrumented as e:
                    got["b_err"] = e
        finally:
            go.set()

    ta, tb = threading.Thread(target=a), threading.Thread(target=b)
    ta.start(), tb.start()
    ta.join(60), tb.join(60)
    assert done.is_set()
    assert (got["a"] - plain).abs().max() > 1e-3            # A is ablated ...
    torch.testing.assert_close(got["a2"], got["a"], rtol=0, atol=0)
    torch.testing.assert_close(got["b"], plain, rtol=0, atol=1e-6)   # ... B is not
    assert isinstance(got["b_err"], InductionLabError) and "another thread" in str(got["b_err"])


def test_intact_kv_cache_reused_inside_ablate_is_refused(tiny_loaded):
    from transformers import DynamicCache

    from inductionlab.core.instrument import StaleKVCache, ablate, instrument
    model = tiny_loaded.model
    x = torch.randint(5, 800, (1, 9))
    heads = [(0, 1), (0, 5)]
    with torch.inference_mode():
        prefix = model(input_ids=x[:, :6], use_cache=True).past_key_values       # computed intact
        with ablate(model, heads):
            full = model(input_ids=x).logits
            with pytest.raises(StaleKVCache, match=r"holds 6 positions computed without interventions.*recompute"):
                model(input_ids=x[:, 6:], cache=prefix, use_cache=True)
        # computed inside an equal ablation: accepted, and equal to the full ablated forward
        with ablate(model, heads):
            cache = model(input_ids=x[:, :6], use_cache=True).past_key_values
        with ablate(model, heads):
            tail = model(input_ids=x[:, 6:], cache=cache, use_cache=True).logits
        torch.testing.assert_close(tail, full[:, 6:], rtol=0, atol=1e-5)
        # an ablated cache inside another ablation, or inside an instrument() without one: refused
        with ablate(model, heads):
            c2 = DynamicCache(config=model.config)
            model(input_ids=x[:, :6], cache=c2, use_cache=True)
        with pytest.raises(StaleKVCache, match=r"computed with zero \(0, 1\)"), ablate(model, [(1, 3)]):
            model(input_ids=x[:, 6:], cache=c2, use_cache=True)
        with instrument(model, reductions={"t": torch.zeros(9, dtype=torch.long)}):
            with pytest.raises(StaleKVCache):
                model(input_ids=x[:, 6:], cache=c2, use_cache=True)
            model(input_ids=x[:, 6:], cache=prefix, use_cache=True)            # intact in intact: fine
