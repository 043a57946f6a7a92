"""The selection options of analyze / study temporal / evaluate (issue 25): rank by any head score or a
column of a scores file, exclude another score's top heads, random heads from all or outside the top N.
With the defaults the conditions are exactly SPEC §4's (:func:`ablation_conditions`)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from conftest import make_tiny
from inductionlab.core.ablation import ablation_conditions, random_heads, ranked_conditions, select_heads, top_k_heads
from inductionlab.core.models import LoadedModel, attention_shape
from inductionlab.core.stimuli import seed_for
from inductionlab.errors import InductionLabError
from inductionlab.measures.stats import ranked_kind
from inductionlab.protocols.lag_probe import LagProbeConfig
from inductionlab.studies.analyze import AnalyzeConfig, analyze
from inductionlab.studies.configs import AblationConfig, HeadScoreConfig
from inductionlab.studies.spec import RunOptions

QUIET = RunOptions(progress=False)


def _tables(seed=0, shape=(3, 6)):
    rng = np.random.default_rng(seed)
    return {n: rng.random(shape) for n in ("induction", "previous_token", "fv")}


# -- the one function ------------------------------------------------------------------------------

@pytest.mark.parametrize("n_draws, top_n, seed", [(3, None, 0), (2, 4, 7), (0, 0, 1)])
def test_defaults_equal_ablation_conditions(n_draws, top_n, seed):
    t = _tables(seed)
    a = ranked_conditions(t, [1, 3, 5], n_draws=n_draws, exclude_top_n=top_n, seed=seed)
    b = ablation_conditions(t["induction"], [1, 3, 5], n_draws=n_draws, exclude_top_n=top_n, seed=seed)
    assert [c.to_dict() for c in a] == [c.to_dict() for c in b]


def test_rank_by_and_exclude_by_name_the_ranking():
    t = _tables(1)
    cs = ranked_conditions(t, [2, 4], rank_by="previous_token", exclude_by="induction", exclude_fraction=0.2, n_draws=2)
    ranked = [c for c in cs if c.kind not in ("intact", "random")]
    assert [c.name for c in ranked] == ["previous_token-excl-induction-2", "previous_token-excl-induction-4"]
    assert ranked_kind(cs) == "previous_token-excl-induction" and not any(c.kind == "induction" for c in cs)
    gone = set(top_k_heads(t["induction"], int(0.2 * 18)))
    for c in ranked:
        assert c.heads == select_heads(t["previous_token"], k=c.k, exclude_scores=t["induction"], exclude_fraction=0.2)
        assert not gone & set(c.heads)
    # random draws: outside the top N of the ranking, the seeds of ablation_conditions
    top = set(top_k_heads(t["previous_token"], 9))
    for c in cs:
        if c.kind == "random":
            assert c.name == f"random-{c.k}-d{c.draw}"
            assert c.heads == random_heads((3, 6), c.k, sorted(top), seed_for(0, c.k, c.draw))
    plain = ranked_conditions(t, [2], rank_by="fv", n_draws=0)
    assert [c.name for c in plain] == ["intact", "fv-2"] and plain[1].heads == top_k_heads(t["fv"], 2)


def test_random_all_draws_from_every_head():
    t = _tables(2)
    cs = ranked_conditions(t, [3], random="all", n_draws=3, seed=5)
    rnd = [c for c in cs if c.kind == "random"]
    assert [c.name for c in rnd] == ["random-all-3-d0", "random-all-3-d1", "random-all-3-d2"]
    assert all(c.heads == random_heads((3, 6), 3, (), seed_for(5, 3, c.draw)) for c in rnd)
    assert [c.name for c in cs if c.kind == "induction"] == ["induction-3"]


@pytest.mark.parametrize("kw, msg", [
    ({"rank_by": "nope"}, "available: induction, previous_token, fv"),
    ({"exclude_by": "induction"}, "ranking itself"),
    ({"random": "some"}, "random="),
    ({"random": "all", "exclude_top_n": 3}, "exclude_top_n"),
])
def test_ranked_conditions_refuse(kw, msg):
    with pytest.raises(InductionLabError, match=msg):
        ranked_conditions(_tables(), [1], **kw)


# -- the config ------------------------------------------------------------------------------------

def _file(path, L=2, H=8, cols=("fv",), seed=0, **edit):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame([{"layer": l, "head": h, **{c: float(rng.random()) for c in cols}} for l in range(L) for h in range(H)])
    for k, v in edit.items():
        df.loc[0, k] = v
    df.to_csv(path, index=False)
    return path


@pytest.mark.parametrize("kw, msg", [
    ({"rank_by": "fv"}, "--rank-by fv: not a head score this command computes"),
    ({"exclude_by": "fv"}, "--exclude-by fv"),
    ({"exclude_by": "induction"}, "ranking itself"),
    ({"random": "any"}, "--random 'any'"),
    ({"random": "all", "exclude_top_n": 2}, "--exclude-top-n is for --random outside-top-n"),
    ({"exclude_fraction": 1.0, "exclude_by": "sink"}, "--exclude-fraction 1.0"),
    ({"exclude_fraction": -0.1, "exclude_by": "sink"}, "--exclude-fraction"),
    ({"rank_by": ""}, "--rank-by ''"),
])
def test_config_refuses_without_a_model(kw, msg):
    with pytest.raises(InductionLabError, match=msg):
        AblationConfig(**kw).validate()


def test_config_reads_the_file_header(tmp_path):
    f = _file(tmp_path / "s.csv", cols=("fv", "fv_abs"))
    AblationConfig(rank_by="fv", exclude_by="induction", scores_file=str(f)).validate()
    with pytest.raises(InductionLabError, match=r"has no column 'cie'; its score columns: fv, fv_abs"):
        AblationConfig(rank_by="cie", scores_file=str(f)).validate()
    with pytest.raises(InductionLabError, match="no --rank-by / --exclude-by names one of its columns"):
        AblationConfig(scores_file=str(f)).validate()
    with pytest.raises(InductionLabError, match="cannot read it"):
        AblationConfig(rank_by="fv", scores_file=str(tmp_path / "missing.csv")).validate()


# -- analyze end to end ----------------------------------------------------------------------------

@pytest.fixture
def loaded(word_tokenizer):
    model = make_tiny("llama", ctx=64)                 # 2 layers x 8 heads
    return LoadedModel(model, word_tokenizer, {"name": "tiny", "dtype": "float32", **attention_shape(model.config)})


def small(**ab):
    return AnalyzeConfig(ablation=AblationConfig(ks=(1, 2), n_draws=1, method="mean", **ab),
                         scores=HeadScoreConfig(seq_len=8, batch_size=4), top=3,
                         lag=LagProbeConfig(n_permutations=3, list_length=24, cue_position=12, batch_size=3, cues="seed"))


def _ranked(res):
    return {c.name: c.heads for c in res.lag.conditions if c.kind not in ("intact", "random")}


def test_analyze_defaults_are_ablation_conditions(loaded, tmp_path):
    res = analyze(loaded, small(), tmp_path / "run", QUIET)
    want = ablation_conditions(res.scores["induction"], [1, 2], n_draws=1, seed=0)
    assert [c.to_dict() for c in res.lag.conditions] == [c.to_dict() for c in want]
    assert "Induction vs random ablation" in (tmp_path / "run" / "report.md").read_text()
    # the params of a default run are those of the commands before the selection options (a resume of an older
    # run directory is not refused)
    params = json.loads((tmp_path / "run" / "results.json").read_text())["params"]
    assert set(params["config"]["ablation"]) == {"method", "positions", "ks", "n_draws", "exclude_top_n"}
    assert "scores_file_sha256" not in params


def test_analyze_rank_by_previous_token_excluding_induction(loaded, tmp_path):
    res = analyze(loaded, small(rank_by="previous_token", exclude_by="induction", exclude_fraction=0.25),
                  tmp_path / "run", QUIET)
    prev, ind = res.scores["previous_token"], res.scores["induction"]
    gone = set(top_k_heads(ind, 4))
    ranked = _ranked(res)
    assert list(ranked) == ["previous_token-excl-induction-1", "previous_token-excl-induction-2"]
    for k, (name, heads) in zip((1, 2), ranked.items()):
        assert heads == select_heads(prev, k=k, exclude_scores=ind, exclude_fraction=0.25)
        assert not gone & set(heads)
    assert not any(c.kind == "induction" or c.name.startswith("induction") for c in res.lag.conditions)
    out = tmp_path / "run"
    rec = json.loads((out / "results.json").read_text())
    ab = rec["params"]["config"]["ablation"]
    assert (ab["rank_by"], ab["exclude_by"], ab["exclude_fraction"]) == ("previous_token", "induction", 0.25)
    assert "random" not in ab and "scores_file" not in ab          # at their defaults: left out, as before
    assert {"previous_token-excl-induction", "random_minus_previous_token-excl-induction"} <= \
        set(rec["lag_probe"]["contrasts_lag_plus1"][0])
    report = (out / "report.md").read_text()
    assert "Previous_token-excl-induction vs random ablation" in report and "by the previous_token score" in report
    # a resume with other selection options is refused like any other change
    with pytest.raises(InductionLabError, match="different parameters"):
        analyze(loaded, small(rank_by="previous_token"), out, QUIET)


def test_analyze_scores_file_fv_column(loaded, tmp_path):
    f = _file(tmp_path / "head_scores.csv", cols=("fv", "note"), seed=3)
    res = analyze(loaded, small(rank_by="fv", scores_file=str(f), random="all"), tmp_path / "run", QUIET)
    df = pd.read_csv(f)
    fv = df["fv"].to_numpy().reshape(2, 8)
    assert _ranked(res) == {f"fv-{k}": select_heads(fv, k=k) for k in (1, 2)}
    assert [c.name for c in res.lag.conditions if c.kind == "random"] == ["random-all-1-d0", "random-all-2-d0"]
    params = json.loads((tmp_path / "run" / "results.json").read_text())["params"]
    assert len(params["scores_file_sha256"]) == 64 and params["exclude_top_n"] == 0


@pytest.mark.parametrize("make, msg", [
    (lambda p: _file(p, cols=("fv_abs",)), r"no column 'fv'.*fv_abs"),
    (lambda p: _file(p, L=2, H=4), "has 8 rows but the model has 2 layers x 8 heads = 16"),
    (lambda p: _file(p, fv=np.nan), "layer 0, head 0 is nan, not a finite number"),
    (lambda p: _file(p, fv=np.inf), "not a finite number"),
    (lambda p: _file(p, head=1), "listed twice"),
])
def test_bad_scores_file_leaves_nothing(loaded, tmp_path, make, msg):
    f = make(tmp_path / "s.csv")
    out = tmp_path / "run"
    with pytest.raises(InductionLabError, match=msg) as e:
        analyze(loaded, small(rank_by="fv", scores_file=str(f)), out, QUIET)
    assert "\n" not in str(e.value)
    assert not out.exists()


def test_exclusion_leaving_too_few_heads_is_refused_before_the_run(loaded, tmp_path):
    cfg = small(rank_by="previous_token", exclude_by="induction", exclude_fraction=0.9)
    cfg = replace(cfg, ablation=replace(cfg.ablation, ks=(1, 3)))
    with pytest.raises(InductionLabError, match="k=3: only 2 of 16 heads remain after excluding the top 14 by induction"):
        analyze(loaded, cfg, tmp_path / "run", QUIET)
    assert not (tmp_path / "run").exists()


# -- study temporal and the command line -----------------------------------------------------------

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from _tiny import tiny_llama_dir

    return tiny_llama_dir(tmp_path_factory.mktemp("tiny") / "model", n_layers=2, n_heads=4)   # 8 heads


@pytest.mark.parametrize("command", ["analyze", "study temporal"])
def test_help_lists_the_selection_flags(command):
    from click.testing import CliRunner

    from inductionlab.cli import main

    r = CliRunner().invoke(main, [*command.split(), "--help"], terminal_width=200)
    assert r.exit_code == 0, r.output
    for flag in ("--rank-by", "--exclude-by", "--exclude-fraction", "--random", "--scores-file"):
        assert flag in r.output, flag


TEMPORAL = ["--permutations", "4", "--list-length", "20", "--cue-position", "10", "--recall-trials", "2",
            "--recall-list-length", "5", "--recall-shots", "1", "--ks", "1,2", "--n-draws", "1", "--load-bearing-top", "0",
            "--score-seq-len", "8", "--score-batch-size", "2", "--dtype", "float32", "--no-progress", "--method", "mean"]


def test_cli_study_temporal_rank_by(model_dir, tmp_path):
    from click.testing import CliRunner

    from inductionlab.cli import main

    out = tmp_path / "run"
    r = CliRunner().invoke(main, ["study", "temporal", "--model", str(model_dir), "--out", str(out), *TEMPORAL,
                                  "--rank-by", "previous_token", "--random", "all"])
    assert r.exit_code == 0, r.output
    rec = json.loads((out / "results.json").read_text())
    names = [c["name"] for c in rec["conditions"]]
    assert names == ["intact", "previous_token-1", "random-all-1-d0", "previous_token-2", "random-all-2-d0"]
    prev = np.asarray(rec["head_scores"]["previous_token"])
    assert [c["ablated_heads"] for c in rec["conditions"] if c["kind"] == "previous_token"] == \
        [[list(h) for h in top_k_heads(prev, k)] for k in (1, 2)]
    head = pd.read_csv(out / "tables" / "headline.csv")
    assert {"previous_token", "random_minus_previous_token"} <= set(head.columns) and "induction" not in head.columns
    v = {d["claim"]: d for d in rec["verdicts"]}
    assert v["B"]["text"].startswith("previous_token-head ablation") and "random_minus_previous_token" in v["B"]["per_k"]["1"]
    report = (out / "report.md").read_text()
    assert "| previous_token-k ablated |" in report and "random heads drawn from all heads" in report
    assert (out / "plots" / "ablation_vs_k.png").stat().st_size > 0
    # the same command with another ranking is refused (the run's params differ), one line, nothing changed
    r = CliRunner().invoke(main, ["study", "temporal", "--model", str(model_dir), "--out", str(out), *TEMPORAL])
    assert r.exit_code == 2 and "different parameters" in r.output


@pytest.mark.parametrize("extra, message", [
    (["--rank-by", "fv"], "--rank-by fv: not a head score"),
    (["--exclude-fraction", "0.1"], "--exclude-fraction has no effect without --exclude-by"),
    (["--random", "all", "--exclude-top-n", "2"], "--exclude-top-n is for --random outside-top-n"),
    (["--rank-by", "fv", "--scores-file", "BAD"], "has 3 rows but the model has 2 layers x 4 heads = 8"),
])
def test_cli_bad_selection_one_line_nothing_written(model_dir, tmp_path, extra, message):
    from click.testing import CliRunner

    from inductionlab.cli import main

    bad = _file(tmp_path / "s.csv", L=1, H=3)
    extra = [str(bad) if x == "BAD" else x for x in extra]
    out = tmp_path / "out" / "run"
    r = CliRunner().invoke(main, ["analyze", "--model", str(model_dir), "--out", str(out), "--n-permutations", "3",
                                  "--list-length", "20", "--cue-position", "10", "--ks", "1", "--quiet", *extra])
    assert r.exit_code == 2, r.output
    err = r.stderr.strip()
    assert err.startswith("error:") and message in err and "\n" not in err
    assert not out.exists() and not out.parent.exists()


# -- evaluate ------------------------------------------------------------------------------------------

def test_load_bearing_conditions_rank_by_and_exclusion():
    from inductionlab.studies.evaluate import LoadBearingConfig, load_bearing_conditions

    t = _tables(4, shape=(4, 8))
    plain = load_bearing_conditions(t["induction"], LoadBearingConfig(ablate=("per-layer-20pct", "top-3")), seed=2)
    same = load_bearing_conditions(t, LoadBearingConfig(ablate=("per-layer-20pct", "top-3")), seed=2)
    assert [(v, c.to_dict()) for v, c in plain] == [(v, c.to_dict()) for v, c in same]     # the default: induction
    cfg = LoadBearingConfig(ablate=("per-layer-20pct", "top-3"), rank_by="fv", exclude_by="induction",
                            exclude_fraction=0.25, random="all", n_draws=2)
    by = {c.name: c for _, c in load_bearing_conditions(t, cfg, seed=2)}
    assert list(by) == ["fv-excl-induction-per-layer-20pct", "random-per-layer-20pct-d0", "random-per-layer-20pct-d1",
                        "fv-excl-induction-top-3", "random-all-top-3-d0", "random-all-top-3-d1"]
    gone = set(top_k_heads(t["induction"], 8))
    assert by["fv-excl-induction-top-3"].heads == select_heads(t["fv"], k=3, exclude_scores=t["induction"],
                                                               exclude_fraction=0.25)
    per = by["fv-excl-induction-per-layer-20pct"].heads
    assert len(per) == 4 * 2 and not gone & set(per) and not gone & set(by["fv-excl-induction-top-3"].heads)
    for layer in range(4):
        left = [h for h in np.argsort(-t["fv"][layer], kind="stable").tolist() if (layer, h) not in gone]
        assert [h for l, h in per if l == layer] == left[:2]
    assert by["random-all-top-3-d1"].heads == random_heads((4, 8), 3, (), seed_for(2, 3, 1))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 2-update cpu-micro training run (2 layers x 4 heads), as test_evaluate builds it."""
    from test_train_helpers import tiny_trained_run

    return tiny_trained_run(tmp_path_factory.mktemp("evaluate"))[1]


def test_cli_evaluate_rank_by(trained, tmp_path):
    from click.testing import CliRunner

    from inductionlab.cli import main

    out = tmp_path / "ev"
    r = CliRunner().invoke(main, ["evaluate", str(trained), "--out", str(out), "--prompts", "3", "--quiet",
                                  "--tasks", "copy,next_letter", "--ablate", "top-2", "--draws", "1",
                                  "--score-seq-len", "12", "--score-batch-size", "4", "--induction-seq-len", "12",
                                  "--dtype", "float32", "--rank-by", "previous_token"])
    assert r.exit_code == 0, r.output
    rec = json.loads((out / "results.json").read_text())
    assert [c["name"] for c in rec["conditions"]] == ["previous_token-top-2", "random-top-2-d0"]
    prev = np.asarray(rec["head_scores"]["previous_token"])
    assert rec["conditions"][0]["ablated_heads"] == [list(h) for h in top_k_heads(prev, 2)]
    kinds = set(pd.read_csv(out / "tables" / "drops.csv").kind)
    assert {"previous_token", "previous_token-random", "random"} <= kinds and "induction" not in kinds
    assert rec["params"]["config"]["load_bearing"]["rank_by"] == "previous_token"
    assert "previous_token heads ablated" in (out / "report.md").read_text()
