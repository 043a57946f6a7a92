"""The all-cue lag probe (issue 17): the list runs once per trial and every chosen list position is
cued after it in one packed forward (4-D mask, the seed trial's position ids).

The reference is always today's single-cue path (``cues="seed"``, one forward of the seed trial
``[BOS] w1 … wL sep w_i sep``, last position read), run with ``cue_position=i``: cue i of the
all-cue path must give its probabilities within 1e-5 in fp32, under every ablation method, on
tiny random models of every architecture, with residual reuse on or off and sharded over 2
processes."""

from __future__ import annotations

import sys
import types
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conftest import ARCHS, make_tiny

from inductionlab.core.ablation import Condition
from inductionlab.errors import InductionLabError
from inductionlab.protocols.lag_probe import LagProbeConfig, build_trials, measure_batch, run_lag_probe
from inductionlab.core.models import LoadedModel, attention_shape
from inductionlab.protocols.runner import run_conditions
from inductionlab.core.reuse import ResidualCache

HERE = Path(__file__).parent
TOL = 1e-5
L, CUE = 30, 15
INTACT = Condition("intact", "intact")
ABLATED = Condition("ablated", "induction", k=2, heads=[(1, 0), (0, 1)])
# (separator, instruction): the default space list, and a comma list after an instruction prefix
FORMATS = [(" ", ""), (", ", "Remember these words:")]


def loaded_tiny(arch, tok, attn="sdpa"):
    model = make_tiny(arch, attn)
    return LoadedModel(model, tok, {"name": arch, "dtype": "float32", **attention_shape(model.config)})


def config(**kw):
    return LagProbeConfig(**{"list_length": L, "cue_position": CUE, "n_permutations": 3, "batch_size": 2, **kw})


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)).max()) for k in a)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("method", ["intact", "zero", "mean", "sink"])
def test_seed_cue_of_all_cues_equals_the_seed_trial(word_tokenizer, arch, method):
    lm = loaded_tiny(arch, word_tokenizer)
    conds = [INTACT] if method == "intact" else [INTACT, ABLATED]
    for sep, instruction in FORMATS:
        base = config(separator=sep, instruction=instruction, method="zero" if method == "intact" else method)
        seed = run_lag_probe(lm, conds, base)
        allc = run_lag_probe(lm, conds, replace(base, cues="all"))
        assert allc.cue_probs["intact"].shape == (3, L, L) and list(allc.cue_positions) == list(range(1, L + 1))
        diff = max_diff(seed.probs, allc.probs)
        assert diff < TOL
        np.testing.assert_allclose(allc.list_mass["intact"], seed.list_mass["intact"], atol=TOL * L)
        for c in allc.probs:            # the headline's array is the per-cue array's seed column
            np.testing.assert_array_equal(allc.cue_probs[c][:, CUE - 1], allc.probs[c])
            np.testing.assert_array_equal(allc.cue_argmax_lag[c][:, CUE - 1], allc.argmax_lag[c])
            np.testing.assert_allclose(allc.cue_list_mass[c], allc.cue_probs[c].astype(np.float64).sum(-1), rtol=1e-6)
        if method != "intact":          # the ablation moved the numbers by far more than the difference
            assert np.abs(seed.probs["ablated"] - seed.probs["intact"]).max() > 1000 * diff


@pytest.mark.parametrize("arch,attn", [(a, "sdpa") for a in ARCHS] + [("llama", "eager"), ("gemma3", "eager")])
def test_every_cue_equals_the_single_cue_trial_at_that_position(word_tokenizer, arch, attn):
    """Cue i reads what ``cue_position=i`` reads: the first, a middle and the last list position
    (zero ablation; sink on the GQA Llama and Gemma 3; mean's reference batch is the run's own seed
    trials, so it is compared at the seed cue only, above)."""
    lm = loaded_tiny(arch, word_tokenizer, attn)
    methods = ["zero", "sink"] if arch in ("llama", "gemma3") else ["zero"]
    for method in methods:
        allc = run_lag_probe(lm, [INTACT, ABLATED], config(cues="all", method=method, separator=", "))
        for i in (1, 7, L):
            single = run_lag_probe(lm, [INTACT, ABLATED], config(cue_position=i, method=method, separator=", "))
            assert max_diff(single.probs, {c: v[:, i - 1] for c, v in allc.cue_probs.items()}) < TOL, (method, i)
            for c in single.probs:
                np.testing.assert_array_equal(single.argmax_lag[c], allc.cue_argmax_lag[c][:, i - 1])


def test_cue_range_chunks_and_a_seed_cue_outside_it(word_tokenizer):
    """``--cues A-B`` stores those cues only; the headline still comes from the seed cue (run as an
    extra cue); chunks of cues give what one packed forward gives."""
    lm = loaded_tiny("gemma3", word_tokenizer)
    seed = run_lag_probe(lm, [INTACT, ABLATED], config())
    part = run_lag_probe(lm, [INTACT, ABLATED], config(cues="3-6"))
    assert list(part.cue_positions) == [3, 4, 5, 6] and part.cue_probs["ablated"].shape == (3, 4, L)
    assert part.cue_list_mass["ablated"].shape == part.cue_argmax_lag["ablated"].shape == (3, 4)
    assert max_diff(seed.probs, part.probs) < TOL
    one = run_lag_probe(lm, [INTACT, ABLATED], config(cues="all"))
    chunked = run_lag_probe(lm, [INTACT, ABLATED], config(cues="all", cue_chunk=4))
    assert max_diff(one.cue_probs, chunked.cue_probs) < TOL
    assert max_diff(part.cue_probs, {c: v[:, 2:6] for c, v in one.cue_probs.items()}) < TOL
    js = part.to_json()
    assert js["cues"]["n_cues"] == 4 and js["cues"]["headline_cue"] == CUE and js["config"]["cues"] == "3-6"


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_residual_reuse_serves_the_packed_forward_bit_for_bit(word_tokenizer, arch):
    """Layer-1 conditions are fed the hidden state recorded by an earlier one (the Gemma 3 masks
    are a dict by layer type), and give exactly what a full forward gives."""
    lm = loaded_tiny(arch, word_tokenizer)
    cfg = config(cues="all", method="zero")
    conds = [INTACT, Condition("a", "induction", heads=[(1, 0)]), Condition("b", "random", heads=[(1, 1)])]
    trials = build_trials(lm, cfg)
    cache = ResidualCache(lm.model, [1])
    kw = dict(method="zero", batch_size=2, measure_batch=lambda m, b: measure_batch(m, b, cfg))
    on = run_conditions(lm, conds, trials, reuse=cache, **kw)
    off = run_conditions(lm, conds, trials, reuse=False, **kw)
    assert cache.skipped > 0
    for c in on:
        for key in ("probs", "cue_probs", "cue_list_mass", "cue_argmax_lag"):
            np.testing.assert_array_equal(on[c][key], off[c][key])
    assert not np.array_equal(on["a"]["cue_probs"], on["b"]["cue_probs"])


@pytest.mark.parametrize("cues,message", [
    ("junk", "use all, seed or a range A-B"), ("3", "use all, seed or a range A-B"), ("-3", "A-B"),
    ("0-5", "outside the list of 30 words"), ("5-31", "outside the list of 30 words"),
    ("6-5", "starts after it ends"), ("all:0", "step must be at least 1"), ("all:x", "optionally with a step"),
    ("3-9:", "optionally with a step"), ("all:-2", "optionally with a step")])
def test_bad_cues_refused(cues, message):
    with pytest.raises(InductionLabError, match=message):
        config(cues=cues).validate()


@pytest.mark.parametrize("cues,expected", [
    ("all", list(range(1, 31))), ("all:10", [1, 11, 21]), ("all:30", [1]), ("all:31", [1]),
    ("4-12:4", [4, 8, 12]), ("4-13:4", [4, 8, 12]), ("7-7:3", [7]), (" 2-5 ", [2, 3, 4, 5]), ("seed", [CUE])])
def test_cue_positions_with_a_step(cues, expected):
    """Steps count from the range's first position; the seed cue is the config's own."""
    assert config(cues=cues).cue_positions() == expected


def test_a_stepped_run_stores_exactly_those_cues(word_tokenizer):
    """``all:S`` stores the cues 1, 1+S, … and their arrays equal the same cues of ``all``."""
    lm = loaded_tiny("llama", word_tokenizer)
    every = run_lag_probe(lm, [INTACT, ABLATED], config(cues="all"))
    some = run_lag_probe(lm, [INTACT, ABLATED], config(cues="all:7"))
    assert some.cue_positions.tolist() == list(range(1, 31, 7))
    for c in ("intact", ABLATED.name):
        np.testing.assert_allclose(some.cue_probs[c], every.cue_probs[c][:, ::7], rtol=0, atol=1e-6)
        np.testing.assert_allclose(some.probs[c], every.probs[c], rtol=0, atol=1e-6)


def test_memory_guard_names_the_limit_and_the_fix():
    with pytest.raises(InductionLabError, match=r"1\.0 GiB.*--cues A-B.*--n-permutations"):
        LagProbeConfig(n_permutations=5000, cues="all").validate()
    LagProbeConfig(n_permutations=5000, cues="seed").validate()          # one cue: 10 MB
    LagProbeConfig(n_permutations=5000, cues="200-300").validate()       # 101 cues: 1.01 GB < 1 GiB
    with pytest.raises(InductionLabError, match="cue chunk 0"):
        config(cues="all", cue_chunk=0).validate()


def test_architecture_without_a_custom_mask_refused(word_tokenizer):
    class Fake(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.config = types.SimpleNamespace(vocab_size=len(word_tokenizer))

        def forward(self, input_ids, logits_to_keep=0, **kw):
            return types.SimpleNamespace(logits=torch.zeros(input_ids.shape[0], 1, self.config.vocab_size))

    lm = LoadedModel(Fake(), word_tokenizer, {"name": "fake", "max_position_embeddings": 4096})
    with pytest.raises(InductionLabError, match="cannot take the all-cue .*--cues seed"):
        run_lag_probe(lm, [INTACT], config(cues="all"))
    assert run_lag_probe(lm, [INTACT], config()).cue_probs["intact"].shape == (3, 1, L)


@pytest.mark.parametrize("extra,message", [(["--cues", "5-3"], "starts after it ends"),
                                           (["--cues", "1-99"], "outside the list of 24 words"),
                                           (["--cues", "x"], "use all, seed or a range")])
def test_cli_bad_cues_one_line_nothing_written(tiny_dir, tmp_path, extra, message):
    from inductionlab.cli import main

    out = tmp_path / "run"
    r = CliRunner().invoke(main, ["analyze", "--model", str(tiny_dir), "--out", str(out), "--n-permutations", "3",
                                  "--list-length", "24", "--cue-position", "12", "--quiet", *extra])
    assert r.exit_code == 2, r.output
    errors = [line for line in r.output.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error:") and message in errors[0], r.output
    assert not out.exists()


# -- two processes on gloo ----------------------------------------------------------------------

DIST_LAG = dict(n_permutations=5, list_length=12, cue_position=6, batch_size=2, cues="all")   # 3 batches


def _measure(dist) -> dict:
    sys.path.insert(0, str(HERE))
    from test_distributed_analysis import _loaded

    torch.set_num_threads(1)
    loaded = _loaded()
    out = {}
    for method in ("zero", "sink"):
        lag = run_lag_probe(loaded, [INTACT, Condition("ablated", "induction", heads=[(1, 0), (1, 3)])],
                            LagProbeConfig(**DIST_LAG, method=method), dist=dist)
        out[method] = {c: {"probs": lag.probs[c], "cue_probs": lag.cue_probs[c], "cue_argmax_lag": lag.cue_argmax_lag[c]}
                       for c in lag.probs}
    return out


def test_two_processes_equal_one_bit_for_bit(tmp_path):
    from test_distributed_analysis import run_sharded

    shards = run_sharded(_measure, str(tmp_path / "res"))
    threads = torch.get_num_threads()
    try:
        single = _measure(None)
    finally:
        torch.set_num_threads(threads)
    for sharded in shards:
        for method in single:
            for c in single[method]:
                for key, x in single[method][c].items():
                    y = sharded[method][c][key]
                    assert x.shape == y.shape and np.array_equal(x, y, equal_nan=True), (method, c, key)
    assert single["zero"]["intact"]["cue_probs"].shape == (5, 12, 12)
    assert not np.array_equal(single["zero"]["intact"]["cue_probs"], single["zero"]["ablated"]["cue_probs"])


def test_analyze_all_cues_keeps_the_seed_headline_and_stores_the_cues(word_tokenizer, tmp_path):
    """``analyze`` with every cue (its default cues every position: all) gives the seed run's headline within 1e-5, and
    writes the per-cue arrays to lag_trials.npz and results.json's record."""
    from inductionlab.studies.analyze import AnalyzeConfig, analyze

    model = make_tiny("llama", ctx=64)
    lm = LoadedModel(model, word_tokenizer, {"name": "tiny", "dtype": "float32", **attention_shape(model.config)})
    from inductionlab.studies.configs import AblationConfig, HeadScoreConfig
    from inductionlab.studies.spec import RunOptions

    assert AnalyzeConfig().lag.cues == "all" and LagProbeConfig().cues == "seed"

    def cfg(cues):
        return AnalyzeConfig(ablation=AblationConfig(ks=(1,), n_draws=1), scores=HeadScoreConfig(seq_len=8, batch_size=4),
                             top=3, lag=LagProbeConfig(n_permutations=3, list_length=24, cue_position=12, batch_size=2,
                                                       cues=cues))

    seed = analyze(lm, cfg("seed"), tmp_path / "seed", RunOptions(progress=False))
    allc = analyze(lm, cfg("all"), tmp_path / "all", RunOptions(progress=False))
    a, b = seed.lag.headline(), allc.lag.headline()
    assert list(a["condition"]) == list(b["condition"])
    np.testing.assert_allclose(a["lag_plus1"], b["lag_plus1"], atol=TOL)
    np.testing.assert_allclose(a["list_mass"], b["list_mass"], atol=TOL * 24)
    with np.load(tmp_path / "all" / "lag_trials.npz") as z:
        assert z["cue_probs/intact"].shape == (3, 24, 24) and list(z["cue_positions"]) == list(range(1, 25))
        np.testing.assert_array_equal(z["cue_probs/intact"], allc.lag.cue_probs["intact"])
        assert z["cue_argmax_lag/intact"].shape == z["cue_list_mass/intact"].shape == (3, 24)
    again = analyze(lm, cfg("all"), tmp_path / "all", RunOptions(progress=False))          # the same directory again
    for c in allc.lag.cue_probs:
        np.testing.assert_array_equal(again.lag.cue_probs[c], allc.lag.cue_probs[c])
    assert again.record["lag_probe"]["cues"]["n_cues"] == 24
