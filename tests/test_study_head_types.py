"""``inductionlab study head-types`` (SPEC §10) on a tiny random Llama with a BPE tokenizer trained on the
tasks' text: every piece and file, the selections' exclusions, the FV column, resume, the fractions kept on a
model of 72 heads, and the verdict rules on made-up per-trial values."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from conftest import make_tiny
from inductionlab.cli import main
from inductionlab.core.ablation import Condition, select_heads
from inductionlab.errors import InductionLabError
from inductionlab.protocols.configs import DualRouteConfig, FVScoreConfig, LagProbeConfig
from inductionlab.studies.configs import HeadScoreConfig
from inductionlab.studies.head_types.config import (CMRConfig, HeadTypesConfig, ProbesConfig, SelectionConfig,
                                                    TokenLossConfig)
from inductionlab.studies.spec import RunOptions


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    from transformers import PreTrainedTokenizerFast
    from wordfreq import top_n_list

    from inductionlab.core.models import LoadedModel, attention_shape
    from inductionlab.data.tokenizer import train_bpe
    from inductionlab.protocols.icl_tasks import build_tasks, format_prompt

    words = [w for w in top_n_list("en", 600) if w.isalpha()]
    texts = [format_prompt([it], it.x) for t in build_tasks(["copy", "next_letter"]).values() for it in t.items]
    texts += [" ".join(words[i:i + 50]) for i in range(0, 600, 50)] * 3
    tok = PreTrainedTokenizerFast(tokenizer_object=train_bpe(texts, 1500).tokenizer, eos_token="<|endoftext|>",
                                  bos_token="<|endoftext|>")
    model = make_tiny("llama", vocab_size=len(tok))
    text = tmp_path_factory.mktemp("text") / "words.txt"
    text.write_text(" ".join(words * 5))
    return LoadedModel(model, tok, {"name": "tiny-llama", **attention_shape(model.config), "dtype": "float32"}), text


def small(text: Path, **over) -> HeadTypesConfig:
    cfg = HeadTypesConfig(
        scores=HeadScoreConfig(seq_len=12, batch_size=4),
        fv=FVScoreConfig(tasks=("copy", "next_letter"), shots=3, n_prompts=3, zero_shot_prompts=3, top=3),
        route=DualRouteConfig(n_words=4, n_attention=4, word_pool=5000),
        selection=SelectionConfig(fractions=(0.1, 0.25), exclude_fraction=0.2),
        probes=ProbesConfig(n_prompts=2), icl=TokenLossConfig(text=str(text), late=40, early=10, n_sequences=3),
        lag=LagProbeConfig(list_length=20, cue_position=10, n_permutations=4, cues="all:5"))
    for k, v in over.items():
        setattr(cfg, k, v)
    return cfg


@pytest.fixture(scope="module")
def study(loaded, tmp_path_factory):
    """The study with ``--cmr`` on and two sensitivity arms for Y2 (resample, mean). The CMR grid is stood in for by
    random normalised CRPs (the grid's own tests are in test_cmr.py), cached in a temporary cache dir."""
    from inductionlab.measures import cmr
    from inductionlab.studies.head_types.study import run_head_types
    lm, text = loaded
    out = tmp_path_factory.mktemp("ht") / "run"

    def fake_grid(n_exps, seed, n_s0, progress=None):
        x = np.random.default_rng(seed).random((20, 21, 11, 17))
        return x / x.sum(-1, keepdims=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        mp.setattr(cmr, "compute_grid", fake_grid)
        cfg = small(text, cmr=CMRConfig(enabled=True, n_exps=1, n_starts=1, top=4),
                    icl=TokenLossConfig(text=str(text), late=40, early=10, n_sequences=3,
                                        sensitivity=("resample", "mean")))
        return run_head_types(lm, cfg, out, RunOptions(progress=False)), out


def test_every_piece_and_file_is_written(study):
    res, out = study
    for f in ("report.md", "results.json", "fv_scores.csv", "head_scores.csv", "drops.csv", "overlap.csv",
              "fv_check.csv", "probe_rows.csv", "icl_rows.csv", "fv_heatmap.png", "scores_scatter.png",
              "drop_vs_fraction.png"):
        assert (out / f).is_file(), f
    for task in ("copy", "next_letter"):
        assert (out / "checkpoints" / "fv" / f"{task}.npz").is_file()
    rec = json.loads((out / "results.json").read_text())
    assert [v["claim"] for v in rec["verdicts"]] == ["Y1", "Y2", "Y3", "Y4"]
    assert len(rec["top_fv_heads"]) == 10 and rec["params"]["counts"] == {"0.1": 1, "0.25": 4}


def test_cmr_files_and_columns(study):
    """--cmr: cmr_fit.csv, head_crp.csv and the figure are written; head_scores.csv's cmr_like is 1 / (1 + distance)
    and ranks through --scores-file; the attention CRP at lag 0 is the duplicate-token score (same sequences, same
    queries and keys)."""
    from inductionlab.studies.configs import RankingConfig
    res, out = study
    for f in ("cmr_fit.csv", "head_crp.csv", "cmr_fits.png"):
        assert (out / f).is_file(), f
    heads = pd.read_csv(out / "head_scores.csv")
    np.testing.assert_allclose(heads.cmr_like, 1 / (1 + heads.cmr_distance), rtol=1e-12)
    fit = pd.read_csv(out / "cmr_fit.csv").set_index(["layer", "head"])
    assert (fit.cmr_like == (fit.cmr_distance < 0.5)).all() and fit.cmr_distance.is_monotonic_increasing
    crp = pd.read_csv(out / "head_crp.csv")
    assert len(crp) == 16 * 17 and sorted(crp.lag.unique()) == list(range(-8, 9))
    lag0 = crp[crp.lag == 0].set_index(["layer", "head"]).attention.to_numpy().reshape(2, 8)
    np.testing.assert_allclose(lag0, res.scores["duplicate_token"], atol=1e-6)
    rec = json.loads((out / "results.json").read_text())
    assert rec["cmr"]["n_cmr_like"] == int((heads.cmr_distance < 0.5).sum()) and len(rec["cmr"]["share_per_layer"]) == 2
    rank = RankingConfig(rank_by="cmr_like", scores_file=str(out / "head_scores.csv"))
    rank._validate_selection()                          # what every ablation option's --rank-by checks
    table = rank.score_tables((2, 8))["cmr_like"]
    np.testing.assert_allclose(table, heads.cmr_like.to_numpy().reshape(2, 8))


def test_crp_lag_window_must_fit_the_score_sequences(tmp_path):
    text = tmp_path / "text.txt"                  # --icl-text must name a file: validate() checks it
    text.write_text("some words\n")
    with pytest.raises(InductionLabError, match="--crp-max-lag"):
        small(text, cmr=CMRConfig(enabled=True, max_lag=20)).validate()


def test_the_fv_column_is_the_aie_over_tasks_and_prompts(study):
    res, out = study
    heads = pd.read_csv(out / "head_scores.csv")
    fv = pd.read_csv(out / "fv_scores.csv")
    per_task = fv[fv.task != "all"].groupby(["layer", "head"]).aie.mean()
    assert np.allclose(heads.set_index(["layer", "head"]).fv.loc[per_task.index], per_task, atol=1e-12)
    assert np.allclose(heads.fv.to_numpy().reshape(2, 8), res.fv.cie.mean(axis=(0, 1)), atol=1e-12)


def test_the_dual_route_columns_are_rankings_for_every_ablation_option(study):
    """The four dual-route scores join head_scores.csv as the means of the piece's per-prompt arrays, and the
    ranking config reads them as a --scores-file column; the overlap table carries their Spearman ρ."""
    from inductionlab.studies.configs import RankingConfig
    res, out = study
    heads = pd.read_csv(out / "head_scores.csv")
    cc = np.load(out / "checkpoints" / "dual_route.npz")["word"][:, 0].mean(0)
    assert np.allclose(heads.concept_copying.to_numpy().reshape(2, 8), cc, atol=1e-12)
    rc = RankingConfig(rank_by="concept_copying", scores_file=str(out / "head_scores.csv"))
    table = rc.score_tables((2, 8))["concept_copying"]
    assert select_heads(table, k=3) == select_heads(cc, k=3)
    ov = pd.read_csv(out / "overlap.csv")
    assert {("induction", "token_copying"), ("induction", "token_attention")} <= set(zip(ov.a, ov.b))
    rec = json.loads((out / "results.json").read_text())["dual_route"]
    assert rec["params"]["cost"]["ratio"] > 1 and len(rec["top"]["token_copying"]) == 10
    assert (out / "route_scatter.png").is_file() and (out / "route_scores.csv").is_file()


def test_exclusive_selections_never_hold_the_other_rankings_top_heads(study):
    res, _ = study
    ind, fv = res.scores["induction"], res.fv.aie()
    top_fv, top_ind = set(select_heads(fv, fraction=0.2)), set(select_heads(ind, fraction=0.2))   # int(0.2·16) = 3
    by = {c.name: c for c in res.conditions}
    assert not set(by["induction-excl-fv-25pct"].heads) & top_fv
    assert not set(by["fv-excl-induction-25pct"].heads) & top_ind
    assert by["fv-25pct"].heads == select_heads(fv, k=4) and by["induction-10pct"].heads == select_heads(ind, k=1)
    assert sorted(c.name for c in res.conditions if c.kind == "random") == \
        ["random-10pct-d0", "random-10pct-d1", "random-25pct-d0", "random-25pct-d1"]


def test_drops_are_paired_against_the_intact_rows(study):
    res, _ = study
    p = res.probes
    intact = p[(p.condition == "intact") & (p.method == "mean")].hits1.mean()
    ablated = p[(p.condition == "fv-25pct") & (p.method == "mean")].hits1.mean()
    row = res.drops[(res.drops.arm == "fv-25pct") & (res.drops.measure == "hits1_mean")].iloc[0]
    assert row.intact == pytest.approx(intact) and row.value == pytest.approx(ablated)
    assert row["drop"] == pytest.approx(intact - ablated)
    assert "intact" not in set(res.drops.kind)


def test_a_second_run_resumes_from_the_pieces(study, loaded, monkeypatch):
    """Every piece loads: AtP and DLA (made to raise here) are not computed again, and the attribution record,
    cost included (the pieces' own seconds), is the first run's."""
    from inductionlab.studies.head_types import study as S
    res, out = study

    def refuse(*a, **k):
        raise AssertionError("recomputed on resume")
    monkeypatch.setattr(S, "attribution_patching", refuse)
    monkeypatch.setattr(S, "direct_logit_attribution", refuse)
    again = S.run_head_types(loaded[0], small(loaded[1], cmr=res.config.cmr, icl=res.config.icl), out,
                             RunOptions(progress=False))
    assert np.array_equal(again.fv.cie, res.fv.cie) and again.drops.equals(res.drops)
    assert np.array_equal(again.cmr["distance"], res.cmr["distance"], equal_nan=True)
    first, second = dict(res.record["attribution"]), dict(again.record["attribution"])
    first["cost"], second["cost"] = dict(first["cost"]), dict(second["cost"])
    first["cost"].pop("session_timings"), second["cost"].pop("session_timings")
    assert second == first and again.record["resumed"]


def test_attribution_estimates_the_fv_score_and_names_the_roles(study):
    """results.json's ``attribution``: AtP's [L, H] mean is the pieces' per-prompt estimates averaged; its agreement
    is estimate_agreement recomputed from the stored AtP and the exact AIE (head_scores.csv's fv column); AtP's
    unpatched metric is the exact path's P(answer) on the corrupted prompt; the roles follow the rule written in
    attribution_roles' docstring, recomputed here from attribution.csv."""
    from inductionlab.measures.overlap import estimate_agreement
    res, out = study
    rec = json.loads((out / "results.json").read_text())
    a = rec["attribution"]
    atp = np.asarray(a["atp"])
    assert atp.shape == (2, 8) and np.asarray(a["dla"]["mean"]).shape == (2, 8)
    pieces = {t: np.load(out / "checkpoints" / "attribution" / f"{t}.npz") for t in ("copy", "next_letter")}
    for t, p in pieces.items():
        assert p["atp"].shape == (3, 2, 8) and p["dla_centered"].shape == (3, 2, 8) and p["seconds"].shape == (2,)
        np.testing.assert_allclose(p["dla_centered"].sum((1, 2)) + p["dla_rest_centered"], p["dla_total_centered"],
                                   rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(atp, np.stack([p["atp"] for p in pieces.values()]).mean((0, 1)), rtol=1e-12)
    np.testing.assert_allclose(np.stack([p["atp_metric"] for p in pieces.values()]), res.fv.p_base, atol=1e-5)
    assert a["atp_metric_vs_p_base"] < 1e-5
    exact = pd.read_csv(out / "head_scores.csv").fv.to_numpy().reshape(2, 8)
    want = estimate_agreement(atp, exact)
    assert a["agreement"]["spearman"] == pytest.approx(want["spearman"], abs=1e-12)
    assert a["agreement"]["recall"] == want["recall"] and a["agreement"]["misses"] == want["misses"]
    assert [r["label"] for r in a["agreement"]["recall"]] == ["10", "5%"]
    c = a["cost"]
    fv_cie = sum(float(np.load(out / "checkpoints" / "fv" / f"{t}.npz")["seconds"][1]) for t in pieces)
    assert c["fv_cie_seconds"] == pytest.approx(fv_cie)
    assert c["atp_vs_fv_cie"] == pytest.approx(c["atp_seconds"] / fv_cie)
    t = pd.read_csv(out / "attribution.csv", keep_default_na=False)
    big = set(t.sort_values("aie", ascending=False, kind="stable").head(10).index) & set(t.index[t.aie > 0])
    med = np.median(np.abs(t.dla))
    role = lambda i: ("writer" if i in big and t.dla[i] > 0 and abs(t.dla[i]) >= med else   # noqa: E731
                      "indirect" if i in big and abs(t.dla[i]) < med else
                      "canceller" if t.dla[i] < 0 and abs(t.dla[i]) >= med and
                      (t.dla[i] <= np.sort(t.dla[(t.dla < 0) & (t.dla.abs() >= med)])[:10].max()) else "")
    assert [role(i) for i in t.index] == list(t.role)
    assert {"writer", "indirect"} & set(t.role)                       # 10 of 16 heads have a large AIE
    md = (out / "report.md").read_text()
    assert "## Attribution" in md and f"Spearman ρ {want['spearman']:+.3f}" in md
    assert "[`view.html`](view.html), written by `inductionlab view RUN_DIR`" in md
    assert (out / "dla_vs_aie.png").is_file()
    from inductionlab.studies.head_types.report import summary
    assert f"AtP vs exact AIE: Spearman {want['spearman']:+.3f}" in "\n".join(summary(res))


def test_no_attribution_leaves_it_out(loaded, tmp_path):
    from inductionlab.studies.head_types.study import run_head_types
    lm, text = loaded
    cfg = small(text, attribution=False, route=DualRouteConfig(enabled=False))
    res = run_head_types(lm, cfg, tmp_path / "run", RunOptions(progress=False))
    out = tmp_path / "run"
    rec = json.loads((out / "results.json").read_text())
    assert rec["attribution"] is None and res.attribution is None
    assert rec["params"]["config"]["attribution"] is False
    assert not (out / "checkpoints" / "attribution").exists() and not (out / "attribution.csv").exists()
    assert "## Attribution" not in (out / "report.md").read_text()
    r = CliRunner().invoke(main, ["study", "head-types", "--help"])
    assert "--no-attribution" in r.output


def test_fractions_that_select_the_same_count_are_dropped():
    from inductionlab.studies.head_types.study import kept_fractions
    assert kept_fractions((0.01, 0.02, 0.05, 0.1), 72) == ([0.01, 0.05, 0.1], [0.02])     # Gemma 3 270M: 1, 1, 3, 7
    assert kept_fractions((0.01, 0.02, 0.05, 0.1), 270) == ([0.01, 0.02, 0.05, 0.1], [])  # SmolLM2: 2, 5, 13, 27


def test_the_drop_figure_shows_the_icl_score_y2_decides_on(study):
    """drop_vs_fraction.png's ICL panel is D (the log-slope benefit) when the run has it, not the single-token one."""
    from inductionlab.studies.head_types.report import plotted_measures
    from inductionlab.studies.head_types.verdicts import MEASURES
    drops, icl = pd.read_csv(study[1] / "drops.csv"), pd.read_csv(study[1] / "icl_rows.csv")
    assert "icl_slope" in set(drops.measure)
    assert list(plotted_measures(drops, icl)) == ["hits1_mean", "icl_slope", "temporal_factor"]
    old = icl.drop(columns="slope")                            # a run from before D: the single-token benefit
    assert list(plotted_measures(drops, old)) == ["hits1_mean", "icl_benefit", "temporal_factor"]
    assert plotted_measures(drops, old)["icl_benefit"] == MEASURES["icl_benefit"]


def _fake(values: dict[str, dict[str, np.ndarray]]):
    """probes, icl and a lag-probe stand-in whose per-trial measures are ``values[condition][measure]``."""
    probes, icl = [], []
    lag = SimpleNamespace(probs={}, cue_probs={}, cue_positions=None, config=SimpleNamespace(cue_position=0))
    for name, v in values.items():
        n = len(v["hits1_mean"])
        probes.append(pd.DataFrame({"condition": name, "method": "mean", "task": "t", "index": range(n),
                                    "hits1": v["hits1_mean"]}))
        icl.append(pd.DataFrame({"condition": name, "sequence": range(n), "benefit": v["icl_benefit"]}))
        lag.probs[name] = v["lag_plus1"][:, None]
    return pd.concat(probes), pd.concat(icl), lag


def test_y1_and_y2_follow_the_paired_difference_of_the_exclusive_ablations():
    from inductionlab.measures.stats import drop_table
    from inductionlab.studies.head_types.verdicts import decide, per_trial
    n = 40
    rng = np.random.default_rng(0)
    hits = lambda p: (rng.random(n) < p).astype(float)  # noqa: E731
    vals = {"intact": {"hits1_mean": np.ones(n), "icl_benefit": np.full(n, 1.0), "lag_plus1": np.full(n, 0.5)},
            "induction-excl-fv-10pct": {"hits1_mean": np.ones(n), "icl_benefit": np.full(n, 0.2) + rng.normal(0, .01, n),
                                        "lag_plus1": np.full(n, 0.4)},
            "fv-excl-induction-10pct": {"hits1_mean": hits(0.3), "icl_benefit": np.full(n, 0.9) + rng.normal(0, .01, n),
                                        "lag_plus1": np.full(n, 0.45)}}
    probes, icl, lag = _fake(vals)
    conds = [Condition("intact", "intact"), Condition("induction-excl-fv-10pct", "induction-excl-fv", 3, 0, [(0, 1)]),
             Condition("fv-excl-induction-10pct", "fv-excl-induction", 3, 0, [(0, 2)])]
    overlap = pd.DataFrame([{"a": "induction", "b": "fv", "n_top": 5, "overlap": 4, "expected": 0.1,
                             "p_value": 1e-6, "spearman": 0.3}])
    verd = {v.claim: v for v in decide(drop_table(conds, lambda c: per_trial(c, probes, icl, lag)), probes, icl, lag, conds, overlap, {3: 0.1})}
    assert verd["Y1"].status == "reproduced" and verd["Y2"].status == "reproduced"
    assert verd["Y3"].status == "not testable"                          # no cues: no temporal factor
    assert verd["Y4"].status == "reproduced"
    assert verd["Y1"].per_k["0.1"]["difference"] == pytest.approx(1 - vals["fv-excl-induction-10pct"]["hits1_mean"].mean())
    # the other way round: induction-exclusive ablation lowers HITS@1 more -> Y1 not reproduced
    vals["induction-excl-fv-10pct"]["hits1_mean"], vals["fv-excl-induction-10pct"]["hits1_mean"] = \
        vals["fv-excl-induction-10pct"]["hits1_mean"], np.ones(n)
    probes, icl, lag = _fake(vals)
    verd = {v.claim: v for v in decide(drop_table(conds, lambda c: per_trial(c, probes, icl, lag)), probes, icl, lag, conds, overlap, {3: 0.1})}
    assert verd["Y1"].status == "not reproduced"


def test_bad_options_are_one_line_refusals(tmp_path):
    r = CliRunner().invoke(main, ["study", "head-types", "--fractions", "0,0.1", "--out", str(tmp_path / "x")])
    assert r.exit_code != 0 and "--fractions" in r.output and not (tmp_path / "x").exists()
    with pytest.raises(InductionLabError, match="--fv-shots"):
        small(tmp_path, fv=FVScoreConfig(shots=1)).validate()
    with pytest.raises(InductionLabError, match="--fv-tasks"):
        small(tmp_path, fv=FVScoreConfig(tasks=("capitals",))).validate()


def test_a_missing_text_file_is_refused_before_anything_is_written(loaded, tmp_path):
    from inductionlab.studies.head_types.study import run_head_types
    with pytest.raises(InductionLabError, match="--icl-text"):
        run_head_types(loaded[0], small(tmp_path / "none.txt"), tmp_path / "out", RunOptions(progress=False))
    assert not (tmp_path / "out").exists()


def test_a_tokenizer_without_enough_long_words_is_refused_before_anything_is_written(loaded, tmp_path):
    """Gemma 3's vocabulary splits one word of wordfreq's top 50,000 into 5 tokens: the dual-route step's default
    word lengths cannot be met there. The run stops in ``prepare`` (nothing written) naming the options that fix it."""
    from inductionlab.errors import InductionLabError
    from inductionlab.studies.head_types.study import run_head_types
    lm, text = loaded
    cfg = small(text, route=DualRouteConfig(n_words=4, n_attention=4, word_pool=3))
    with pytest.raises(InductionLabError, match=r"dual-route scores: .*--route-word-lengths 2,3,4.*--no-dual-route"):
        run_head_types(lm, cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_token_loss_record_windows_and_per_window_arrays(study):
    """Issue 34: Y2 decides on D under sink, resample beside it; the windows' construction is recorded; every
    condition's piece holds D, B and the single-token benefit per window, equal to the reductions of its losses."""
    from inductionlab.measures.token_loss import benefits
    res, out = study
    rec = json.loads((out / "results.json").read_text())
    tl = rec["token_loss"]
    assert tl["method"] == "sink" and tl["sensitivity_methods"] == ["resample", "mean"] and tl["n_windows"] == 3
    assert tl["sizing"] == {"fixed": 3, "option": "--icl-sequences"} and "consecutive" in tl["windows"]
    assert tl["window_tokens"] == 49 and tl["measured_tokens"] == [8, 48] and tl["band"] is None   # ⌊1.2·40⌋ = 48
    y2 = next(v for v in rec["verdicts"] if v["claim"] == "Y2")
    assert "log-slope" in y2["rule"] and "sensitivity arm" in y2.get("caveat", "")
    piece = np.load(out / "checkpoints" / "icl" / "intact.npz")
    got = benefits(piece["nll"].astype(np.float64), np.arange(8, 49), 10, 40)
    for m in ("slope", "band", "single"):
        assert np.allclose(piece[m], got[m], atol=1e-4), m          # nll stored as float32
    rows = pd.read_csv(out / "icl_rows.csv")
    assert {"slope", "band", "benefit"} <= set(rows.columns)
    assert (out / "checkpoints" / "icl_resample").is_dir() and (out / "checkpoints" / "icl_mean").is_dir()
    assert "## Token-loss ICL score" in (out / "report.md").read_text()


def test_each_sensitivity_arm_gives_y2s_difference_under_its_method(study):
    """``--icl-sensitivity resample,mean``: one piece per arm and Y2 condition, ``icl_<method>/<condition>``, on the
    primary's windows; Y2's caveat gives, per arm in the order given, the mean over fractions of D(FV-exclusive) −
    D(induction-exclusive) per window, recomputed here from the arm's pieces alone."""
    from inductionlab.measures.stats import ci
    from inductionlab.studies.report import fmt_ci
    res, out = study
    y2 = sorted(c.name for c in res.conditions if c.kind in ("induction-excl-fv", "fv-excl-induction"))
    caveat = next(v for v in json.loads((out / "results.json").read_text())["verdicts"] if v["claim"] == "Y2")["caveat"]
    said = caveat.split("sensitivity arms, the same difference under another ablation: ")[1].split("; ")
    assert [s.split(" ")[0] for s in said] == ["resample", "mean"]
    for method, text in zip(("resample", "mean"), said):
        arm = out / "checkpoints" / f"icl_{method}"
        assert sorted(p.stem for p in arm.glob("*.npz")) == y2
        slope = {c: np.load(arm / f"{c}.npz")["slope"].astype(np.float64) for c in y2}
        fractions = sorted({c.rsplit("-", 1)[1] for c in y2})
        d = np.mean([slope[f"fv-excl-induction-{f}"] - slope[f"induction-excl-fv-{f}"] for f in fractions], axis=0)
        assert d.shape == (3,) and text == f"{method} {fmt_ci(*ci(d))}"
    assert not np.allclose(*(np.load(out / "checkpoints" / f"icl_{m}" / f"{y2[0]}.npz")["slope"]
                             for m in ("resample", "mean")))            # two methods, two results


def test_sensitivity_arms_are_refused_when_repeated_primary_or_unknown(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("some words " * 50)
    for arms, message in ((("mean", "mean"), "repeats a method"), (("resample", "sink"), "is the primary"),
                          (("patch",), "use sink, resample, mean, zero")):
        with pytest.raises(InductionLabError, match=f"--icl-sensitivity .*{message}"):
            TokenLossConfig(text=str(text), sensitivity=arms).validate()
    assert TokenLossConfig(text=str(text), sensitivity=None).arms == ()
    r = CliRunner().invoke(main, ["study", "head-types", "--icl-text", str(text), "--icl-sensitivity", "mean,mean",
                                  "--out", str(tmp_path / "x")])
    assert r.exit_code != 0 and "--icl-sensitivity mean,mean repeats a method" in r.output
    assert not (tmp_path / "x").exists()


def test_the_icl_score_runs_under_the_claims_conditions_only(study):
    """``--icl-conditions claim`` (default): the token-loss pieces are intact and Y2's exclusive arms, nothing else
    (every window of the budget goes to the verdict); the drop table has ICL rows for exactly those arms, while the
    other measures keep every arm."""
    res, out = study
    y2 = {c.name for c in res.conditions if c.kind in ("induction-excl-fv", "fv-excl-induction")}
    assert y2 and {p.stem for p in (out / "checkpoints" / "icl").glob("*.npz")} == {"intact"} | y2
    assert set(res.icl.condition) == {"intact"} | y2
    icl_arms = set(res.drops[res.drops.measure == "icl_slope"].arm)
    assert icl_arms == y2
    assert set(res.drops[res.drops.measure == "hits1_mean"].arm) > y2       # plain and random arms too
    rec = json.loads((out / "results.json").read_text())
    assert rec["params"]["config"]["icl_conditions"] == "claim"
    assert rec["token_loss"]["cost"]["conditions"] == 1 + len(y2)
