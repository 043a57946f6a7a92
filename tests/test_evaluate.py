"""`inductionlab evaluate` (SPEC §8) on a tiny model our trainer wrote: end to end through the CLI,
resume from finished pieces, one-line refusals that write nothing, the per-layer selection and
matched random draws of the load-bearing test, and trainer checkpoints loading through load_model."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner

from inductionlab.cli import main
from inductionlab.errors import InductionLabError
from inductionlab.studies.configs import HeadScoreConfig
from inductionlab.studies.spec import RunOptions
from inductionlab.studies.evaluate import (EvaluateConfig, ICLScoreConfig, InductionLossConfig, LoadBearingConfig,
                                   PerplexityConfig, ProbeConfig, load_bearing_conditions, parse_variant, run_evaluate)
from test_train_helpers import tiny_trained_run

# small sizes: the tiny model's context is 64 tokens
SMALL = ["--prompts", "3", "--ablate", "per-layer-2pct,top-2", "--draws", "2", "--icl-sequences", "3",
         "--score-seq-len", "12", "--score-batch-size", "4", "--induction-seq-len", "12", "--perplexity-tokens", "1024",
         "--dtype", "float32", "--quiet"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(corpus dir, training run dir): a 2-update cpu-micro run (2 layers x 4 heads, context 64)."""
    return tiny_trained_run(tmp_path_factory.mktemp("evaluate"))


def small_config(**over) -> EvaluateConfig:
    cfg = EvaluateConfig(probes=ProbeConfig(n_prompts=3, tasks=("copy", "next_letter", "list_last")),
                         icl=ICLScoreConfig(n_sequences=3), induction=InductionLossConfig(seq_len=12, n_sequences=4),
                         perplexity=PerplexityConfig(max_tokens=1024),
                         load_bearing=LoadBearingConfig(ablate=("per-layer-2pct",), n_draws=2),
                         scores=HeadScoreConfig(seq_len=12, batch_size=4))
    for k, v in over.items():
        setattr(cfg, k, v)
    return cfg


def test_cli_end_to_end_on_a_trained_checkpoint(trained, tmp_path):
    data, run = trained
    out = tmp_path / "ev"
    r = CliRunner().invoke(main, ["evaluate", str(run), "--shards", str(data), *SMALL, "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[0] == "dtype float32 (requested explicitly)"       # the first line printed
    rec = json.loads((out / "results.json").read_text())
    assert rec["model"]["dtype_choice"] == {"requested": "float32", "dtype": "float32",
                                            "reason": "requested explicitly"}
    assert "dtype_choice" not in rec["params"]["model"] and rec["params"]["model"]["dtype"] == "float32"
    # the training run directory resolves to its final checkpoint (2 updates), tokenizer next to it
    assert rec["model"]["checkpoint"]["step"] == 2 and rec["model"]["checkpoint"]["tokenizer"] == "checkpoint"
    for f in ("report.md", "tables/hits.csv", "tables/drops.csv", "tables/icl.csv", "tables/probe_rows.csv",
              "plots/hits_by_task.png", "plots/drops.png", "plots/head_scores.png"):
        assert (out / f).is_file(), f
    rows = pd.read_csv(out / "tables" / "probe_rows.csv")
    intact = rows[rows.condition == "intact"]
    # 13 tasks x 3 shots x 3 prompts, plus the permuted twin of each 10-shot prompt (none for 0, 1 shots)
    assert len(intact) == 13 * 3 * 3 + 13 * 3
    assert set(intact[intact.control == "permuted"].shots) == {10}
    # every ablated condition re-scores exactly the 10-shot intact prompts
    ab = rows[rows.condition != "intact"]
    assert set(ab.shots) == {10} and set(ab.control) == {"intact"} and len(ab) == 6 * 13 * 3

    # one intact prompt's rank re-derived by a plain forward pass of the checkpoint
    from inductionlab.protocols.icl_tasks import build_tasks, make_prompts
    from inductionlab.core.models import load_model
    lm = load_model(str(run), dtype="float32")
    p = make_prompts(build_tasks(["copy"])["copy"], lm.tokenizer, shots=(10,), n_prompts=3, seed=0, permuted=False,
                     bos_id=lm.tokenizer.bos_token_id)[1]
    with torch.no_grad():
        logits = lm.model(input_ids=torch.tensor([p.input_ids])).logits[0, -1]
    rank = 1 + int((logits > logits[p.target_id]).sum())
    got = intact[(intact.task == "copy") & (intact.shots == 10) & (intact.control == "intact") & (intact["index"] == 1)]
    assert int(got["rank"].iloc[0]) == rank

    # the headline drop's intact value is the mean 10-shot HITS@1 of the intact prompts
    drops = pd.read_csv(out / "tables" / "drops.csv")
    d = drops[(drops.measure == "hits1_10shot") & (drops.kind == "induction")]
    assert d.intact.iloc[0] == pytest.approx(intact[(intact.shots == 10) & (intact.control == "intact")].hits1.mean())
    assert set(drops.measure) == {"hits1_10shot", "icl_benefit", "induction_benefit", "copy_accuracy",
                                  "recall_accuracy"}
    assert {"induction", "random", "induction-random"} <= set(drops.kind)
    # per-layer 2% of 4 heads = 1 head per layer; matched draws: 1 per layer, never the chosen one
    conds = {c["name"]: c for c in rec["conditions"]}
    chosen = {tuple(h) for h in conds["induction-per-layer-2pct"]["ablated_heads"]}
    assert sorted(l for l, _ in chosen) == [0, 1]
    for d in (0, 1):
        rnd = {tuple(h) for h in conds[f"random-per-layer-2pct-d{d}"]["ablated_heads"]}
        assert sorted(l for l, _ in rnd) == [0, 1] and not rnd & chosen
    # the perplexity guard counts tokens exactly: 1024 tokens in windows of 64 -> 16 x 63 scored
    assert rec["perplexity"]["n_scored"] == 16 * 63 and rec["perplexity"]["n_tokens"] == 1024
    assert "−" in (out / "report.md").read_text() or "+" in (out / "report.md").read_text()


def test_resume_reuses_finished_pieces(trained, tmp_path):
    from inductionlab.core.models import load_model
    data, run = trained
    lm = load_model(str(run), dtype="float32")
    cfg = small_config(shards=str(data))

    class Stop(Exception):
        pass

    def stop_after_probes(key):
        if key == "hits/intact":
            raise Stop

    with pytest.raises(Stop):
        run_evaluate(lm, cfg, tmp_path / "a", RunOptions(progress=False, on_checkpoint=stop_after_probes))
    assert (tmp_path / "a" / "checkpoints" / "hits" / "intact.npz").is_file()
    written = []
    res = run_evaluate(lm, cfg, tmp_path / "a", RunOptions(progress=False, on_checkpoint=written.append))
    assert "scores" not in written and "hits/intact" not in written      # reused, not recomputed
    assert "icl/intact" in written and "hits_ablated/induction-per-layer-2pct" in written
    fresh = run_evaluate(lm, cfg, tmp_path / "b", RunOptions(progress=False))
    pd.testing.assert_frame_equal(res.hits, fresh.hits)
    pd.testing.assert_frame_equal(res.drops, fresh.drops)
    # a third run recomputes nothing
    again = []
    run_evaluate(lm, cfg, tmp_path / "a", RunOptions(progress=False, on_checkpoint=again.append))
    assert again == []


def _refused(args, tmp_path, msg):
    out = tmp_path / "never"
    r = CliRunner().invoke(main, ["evaluate", *args, "--out", str(out)])
    assert r.exit_code == 2, r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    if lines[0].startswith("Usage:"):                      # click's own check of a choice, before any work
        lines = [lines[-1].replace("Error: ", "error: ", 1)]
    assert len(lines) == 1 and lines[0].startswith("error: ") and msg in lines[0], r.output
    assert not out.exists()


@pytest.mark.parametrize("args, msg", [
    (["--tasks", "copy,nope"], "unknown ICL task(s) 'nope'"),
    (["--shots", "0,-1"], "shots [0, -1]"),
    (["--ablate", "per-layer-2"], "unknown ablation variant 'per-layer-2'"),
    (["--draws", "0"], "draws 0 must be >= 1"),
    (["--shots", "0,1", "--ablation-shots", "10"], "ablation shots 10 is not among --shots 0,1"),
    (["--method", "nope"], "'nope' is not one of 'zero', 'mean', 'sink'"),    # a choice, as in every command
    (["--method", "resample", "--lm-eval-tasks", "inductionlab_icl_copy"], "--method resample needs a source run"),
])
def test_bad_options_refused_before_loading(trained, tmp_path, args, msg):
    _refused([str(trained[1]), *SMALL, *args], tmp_path, msg)


def test_model_dependent_refusals_write_nothing(trained, tmp_path):
    from inductionlab.data.shards import prepare_corpus
    data, run = trained
    other = prepare_corpus(data.parent / "corpus.txt", tmp_path / "other", vocab_size=280, heldout_fraction=0.05,
                           chunk_chars=2000).path
    _refused([str(run), *SMALL, "--shards", str(other)], tmp_path, "not with the model's tokenizer")
    _refused([str(run), *SMALL, "--shards", str(tmp_path)], tmp_path, "is not a prepared corpus")
    _refused([str(run), "--prompts", "3", "--quiet"], tmp_path, "exceeds the model's context of 64")
    _refused([str(run), *SMALL, "--ablate", "top-7"], tmp_path, "k=7: must be between 1 and the 4 heads")
    _refused([str(run), *SMALL, "--lm-eval-tasks", "inductionlab_icl_nope"], tmp_path, "unknown ICL task")


def test_lm_eval_local_task_recorded(trained, tmp_path):
    pytest.importorskip("lm_eval")
    data, run = trained
    out = tmp_path / "lm"
    r = CliRunner().invoke(main, ["evaluate", str(run), *SMALL, "--tasks", "copy", "--ablate", "per-layer-2pct",
                                  "--lm-eval-tasks", "inductionlab_icl_copy", "--lm-eval-limit", "4",
                                  "--lm-eval-fewshot", "2", "--out", str(out)])
    assert r.exit_code == 0, r.output
    lm = json.loads((out / "results.json").read_text())["lm_eval"]
    assert lm["lm_eval_version"] and lm["batch_size"] == 8 and lm["num_fewshot"] == 2 and lm["limit"] == 4
    assert 0.0 <= lm["results"]["inductionlab_icl_copy"]["acc,none"] <= 1.0
    assert (out / "lm_eval_tasks" / "copy.yaml").is_file()
    rec = json.loads((out / "results.json").read_text())
    assert "no --shards" in " ".join(rec["notes"])
    # under every ablation condition too: the drop table beside the probes' (results.json, CSV, report)
    from inductionlab.core.models import load_model
    from inductionlab.protocols.lm_eval_tasks import run_lm_eval
    task, names = "inductionlab_icl_copy", ["induction-per-layer-2pct", "random-per-layer-2pct-d0",
                                            "random-per-layer-2pct-d1"]
    drops = pd.read_csv(out / "tables" / "lm_eval_drops.csv")
    pd.testing.assert_frame_equal(drops.fillna(-1), pd.DataFrame(rec["load_bearing"]["lm_eval_drops"]).fillna(-1),
                                  check_dtype=False)                     # NaN: null in JSON (intact 0, pooled draw)
    assert set(drops.metric) == {"acc,none"}
    d = drops.set_index("condition")
    assert list(d.index) == ["intact", *names, "random-per-layer-2pct"] and (d.task == task).all()
    loaded = load_model(str(run), dtype="float32")                          # the intact-only run, by hand
    alone = run_lm_eval(loaded.model, loaded.tokenizer, [task], include_path=out / "lm_eval_tasks", num_fewshot=2,
                        batch_size=8, limit=4, seed=0)
    assert d.loc["intact", "value"] == alone["results"][task]["acc,none"] == lm["results"][task]["acc,none"]
    assert (d["intact"] == d.loc["intact", "value"]).all()
    assert np.allclose(d["drop"], d["intact"] - d["value"])
    assert d.loc["random-per-layer-2pct", "value"] == pytest.approx(d.loc[names[1:], "value"].mean())
    conds = pd.read_csv(out / "tables" / "conditions.csv").set_index("condition")
    for n in names:
        ran = rec["lm_eval_ablated"][n]["intervention"]
        assert " ".join(f"L{l}H{h}" for l, h in ran["heads"]) == conds.loc[n, "heads"] and ran["method"] == "zero"
        assert d.loc[n, "n_heads"] == conds.loc[n, "n_heads"]
    assert "lm-eval under each ablation" in (out / "report.md").read_text()


def test_checkpoint_without_tokenizer_takes_the_training_corpus_tokenizer(trained, tmp_path):
    from inductionlab.data.shards import TokenShards
    from inductionlab.core.models import TOKENIZER_FILES, load_model
    data, run = trained
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    ck = copy / "checkpoints" / "step_00000002"
    for f in TOKENIZER_FILES + ("special_tokens_map.json",):
        (ck / f).unlink(missing_ok=True)
    lm = load_model(str(ck))
    assert lm.identity["checkpoint"]["tokenizer"] == str(data) and lm.identity["checkpoint"]["step"] == 2
    assert lm.tokenizer.get_vocab() == TokenShards.open(data).tokenizer().get_vocab(with_added_tokens=True)
    # a run directory means its newest checkpoint
    assert load_model(str(copy)).identity["path"] == str(ck)
    # without a run record next to it, a tokenizer-less checkpoint is a one-line error
    lone = tmp_path / "lone"
    shutil.copytree(ck, lone / "checkpoints" / "step_00000002")
    with pytest.raises(InductionLabError, match="holds no tokenizer"):
        load_model(str(lone / "checkpoints" / "step_00000002"))


def test_load_bearing_conditions_per_layer_and_matched_draws():
    rng = np.random.default_rng(0)
    scores = rng.random((5, 8))
    conds = load_bearing_conditions(scores, LoadBearingConfig(ablate=("per-layer-2pct", "per-layer-30pct", "top-3"),
                                                              n_draws=3), seed=1)
    by = {c.name: (v, c) for v, c in conds}
    # 2% of 8 heads -> ceil = 1 per layer: each layer's argmax
    assert by["induction-per-layer-2pct"][1].heads == [(l, int(np.argmax(scores[l]))) for l in range(5)]
    # 30% of 8 -> ceil(2.4) = 3 per layer, the layer's three best
    ind30 = by["induction-per-layer-30pct"][1].heads
    for l in range(5):
        assert sorted(h for ll, h in ind30 if ll == l) == sorted(np.argsort(-scores[l])[:3].tolist())
    for v in ("per-layer-2pct", "per-layer-30pct"):
        ind = by[f"induction-{v}"][1]
        draws = [by[f"random-{v}-d{d}"][1].heads for d in range(3)]
        for heads in draws:
            assert [sum(1 for l, _ in heads if l == x) for x in range(5)] == \
                   [sum(1 for l, _ in ind.heads if l == x) for x in range(5)]
            assert not set(heads) & set(ind.heads)
        assert draws[0] != draws[1] or draws[1] != draws[2]
    # seeded: the same seed gives the same draws, another seed other draws
    again = load_bearing_conditions(scores, LoadBearingConfig(ablate=("per-layer-30pct",), n_draws=3), seed=1)
    assert [c.heads for _, c in again] == [by[c.name][1].heads for _, c in again]
    other = load_bearing_conditions(scores, LoadBearingConfig(ablate=("per-layer-30pct",), n_draws=3), seed=2)
    assert [c.heads for _, c in other][1:] != [by[c.name][1].heads for _, c in other][1:]
    # global top-3 vs 3 random heads outside the top N = 20
    top = by["induction-top-3"][1].heads
    assert top == [divmod(int(i), 8) for i in np.argsort(-scores.reshape(-1))[:3]]
    top20 = {divmod(int(i), 8) for i in np.argsort(-scores.reshape(-1))[:20]}
    for d in range(3):
        assert len(by[f"random-top-3-d{d}"][1].heads) == 3 and not set(by[f"random-top-3-d{d}"][1].heads) & top20


def test_parse_variant():
    assert parse_variant("per-layer-2pct") == ("per-layer", 0.02)
    assert parse_variant("per-layer-12.5pct") == ("per-layer", 0.125)
    assert parse_variant("top-10") == ("top", 10)
    for bad in ("top-0", "per-layer-0pct", "per-layer-150pct", "random-10", "top10"):
        with pytest.raises(InductionLabError):
            parse_variant(bad)


def _evaluate_sharded(run: str, data: str, base: str, dist) -> dict:
    """``run_evaluate`` (mean ablation, uneven last batches) with ``dist`` (None: one process), each
    rank given its own ``out`` (rank 0's alone may be written); the tables every rank returns."""
    from inductionlab.core.models import load_model

    torch.set_num_threads(1)
    rank = dist.rank if dist is not None else "one"
    lm = load_model(run, dtype="float32")
    cfg = small_config(load_bearing=LoadBearingConfig(ablate=("per-layer-2pct", "top-2"), n_draws=2, method="mean"),
                       perplexity=PerplexityConfig(max_tokens=1000), shards=str(data))  # 15 windows of 64, a tail of 40
    # recall: its 32 sequences in one batch, so rank 1 has none of it (and must not open the ablation)
    cfg.probes.batch_size, cfg.induction.batch_size, cfg.recall.batch_size = 5, 3, 32
    res = run_evaluate(lm, cfg, f"{base}/rank{rank}", RunOptions(progress=False, dist=dist))
    return {"hits": res.hits, "drops": res.drops, "icl": res.icl_summary, "rows": res.probe_rows,
            "perplexity": res.perplexity, "scores": res.scores.scores}


def test_evaluate_two_processes_equal_one_bit_for_bit(trained, tmp_path):
    from functools import partial

    from test_distributed_analysis import run_sharded

    data, run = trained
    measure = partial(_evaluate_sharded, str(run), str(data), str(tmp_path))
    sharded = run_sharded(measure, str(tmp_path / "res"))
    threads = torch.get_num_threads()
    try:
        single = measure(None)
    finally:
        torch.set_num_threads(threads)
    for got in sharded:
        for k in ("hits", "drops", "icl", "rows"):
            pd.testing.assert_frame_equal(got[k], single[k], check_exact=True)
        assert got["perplexity"] == single["perplexity"]
        for name, s in single["scores"].items():
            assert np.array_equal(got["scores"][name], s)
    # the comparison is not between two intact runs: the ablation moved the numbers
    icl = single["icl"].set_index("condition")
    assert icl.loc["induction-top-2", "induction_benefit"] != icl.loc["intact", "induction_benefit"]
    assert single["perplexity"]["n_windows"] == 16 and single["perplexity"]["n_scored"] == 15 * 63 + 39
    # rank 0 wrote its run directory, rank 1 nothing; the record says how it ran
    rec = json.loads((tmp_path / "rank0" / "results.json").read_text())
    assert rec["distributed"]["world_size"] == 2 and rec["distributed"]["backend"] == "gloo"
    assert not (tmp_path / "rank1").exists()
    one = json.loads((tmp_path / "rankone" / "results.json").read_text())
    assert one["distributed"]["world_size"] == 1
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent.parent / "bench"))
    from compare_runs import diff       # bench/compare_runs.py: every leaf, tolerance 0

    drop = ("timings", "versions", "distributed")
    assert diff({k: v for k, v in one.items() if k not in drop}, {k: v for k, v in rec.items() if k not in drop}) == []


@pytest.mark.slow
def test_evaluate_under_torchrun_equals_one_process(trained, tmp_path):
    from test_distributed_analysis import _numbers, _torchrun

    data, run = trained
    flags = [str(run), "--shards", str(data), *SMALL, "--tasks", "copy,list_last", "--method", "mean",
             "--batch-size", "5", "--threads", "1"]
    one = CliRunner().invoke(main, ["evaluate", *flags, "--out", str(tmp_path / "one")])
    assert one.exit_code == 0, one.output
    p = _torchrun(["evaluate", *flags, "--out", tmp_path / "two"])
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.count("macro HITS@1") == 1                   # rank 0 alone prints
    a = json.loads((tmp_path / "one" / "results.json").read_text())
    b = json.loads((tmp_path / "two" / "results.json").read_text())
    assert b["distributed"]["world_size"] == 2 and a["distributed"]["world_size"] == 1
    assert json.dumps(_numbers(a), sort_keys=True) == json.dumps(_numbers(b), sort_keys=True)   # NaN-safe
    for f in ("hits.csv", "drops.csv", "icl.csv", "probe_rows.csv"):
        assert (tmp_path / "one" / "tables" / f).read_text() == (tmp_path / "two" / "tables" / f).read_text(), f
