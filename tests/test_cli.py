"""The main job end to end on a tiny local model, and bad input through the CLI."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from inductionlab.cli import main

FAST = ["--n-permutations", "3", "--list-length", "24", "--cue-position", "12", "--ks", "1,2", "--n-draws", "2",
        "--score-seq-len", "8", "--score-batch-size", "4", "--top", "3", "--quiet", "--dtype", "float32"]


def run(args):
    return CliRunner().invoke(main, args)


def test_analyze_end_to_end(tiny_dir, tmp_path):
    out = tmp_path / "run"
    r = run(["analyze", "--model", str(tiny_dir), "--out", str(out), *FAST])
    assert r.exit_code == 0, r.output
    assert "Top 3 induction heads" in r.output and "intact" in r.output
    files = {p.name for p in out.iterdir()}
    assert {"results.json", "report.md", "head_scores.csv", "lag_curves.csv", "lag_headline.csv",
            "head_scores.png", "lag_curve.png", "attention_patterns.png", "attention_patterns.npz"} <= files
    res = json.loads((out / "results.json").read_text())
    assert res["model"]["source"] == "local" and res["model"]["sha256"]
    assert res["kind"] == "analyze" and res["params"]["config"]["seed"] == 0
    assert res["params"]["config"]["lag"]["n_permutations"] == 3
    assert {"torch", "transformers", "python"} <= set(res["versions"])
    assert len(res["heads"]["induction"]) == 2 and len(res["heads"]["induction"][0]) == 8
    top = res["top_induction_heads"]
    assert len(top) == 3 and top[0]["score"] >= top[1]["score"] >= top[2]["score"]
    conds = res["lag_probe"]["conditions"]
    assert [c["name"] for c in conds] == ["intact", "induction-1", "random-1-d0", "random-1-d1",
                                         "induction-2", "random-2-d0", "random-2-d1"]
    first = top[0]
    assert conds[1]["ablated_heads"] == [[first["layer"], first["head"]]]
    for c in conds:
        assert {"lag_plus1", "lag_minus1", "lags", "ci95"} <= set(c)
        assert c["lags"]["1"] == pytest.approx(c["lag_plus1"])
    # the default exclusion for 16 heads is the top 8; random heads are outside it
    top8 = {(t["layer"], t["head"]) for t in sorted(
        ({"layer": l, "head": h, "s": res["heads"]["induction"][l][h]} for l in range(2) for h in range(8)),
        key=lambda x: -x["s"])[:8]}
    for c in conds:
        if c["kind"] == "random":
            assert not {tuple(h) for h in c["ablated_heads"]} & top8
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging leftovers


@pytest.mark.parametrize("extra,message", [
    (["--model", "no-such-model-xyz"], "unknown model"),
    (["--model", "./missing/dir"], "does not exist"),
    (["--ks", "17"], "k=17 heads requested but the model has 16"),
    (["--ks", "9"], "8 heads left outside the top 8"),
    (["--top", "99"], "exceeds the model's 16 heads"),
    (["--list-length", "5000", "--cue-position", "10"], "word pool too small"),
    (["--list-length", "100", "--cue-position", "10"], "exceeds the model's context of 64"),
    (["--n-permutations", "1"], "at least 2 trials"),
    (["--cue-position", "30"], "outside a list of 24 words"),
])
def test_bad_input_one_line_error_nothing_written(tiny_dir, tmp_path, extra, message):
    out = tmp_path / "run"
    args = ["analyze", "--model", str(tiny_dir), "--out", str(out), *FAST]
    # later options override earlier ones in click
    r = run(args + extra)
    assert r.exit_code == 2
    err = r.stderr.strip()
    assert err.startswith("error:") and message in err and "\n" not in err
    assert not out.exists() and not list(tmp_path.iterdir())


def test_existing_output_dir_refused(tiny_dir, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    r = run(["analyze", "--model", str(tiny_dir), "--out", str(out), *FAST])
    assert r.exit_code == 2 and "already exists" in r.stderr
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
