"""``inductionlab view``: the page of a finished analyze run (tiny random Llama), its data against attention
computed independently (transformers' own eager attention, ``output_attentions=True``), bad input, and a real
browser (Debian's chromium driven by playwright) that hovers a token and clicks a head."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import tempfile

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from conftest import make_tiny
from inductionlab.cli import main
from inductionlab.core.models import LoadedModel, attention_shape
from inductionlab.errors import InductionLabError
from inductionlab.protocols.lag_probe import LagProbeConfig
from inductionlab.studies.analyze import AnalyzeConfig, analyze
from inductionlab.studies.configs import AblationConfig, HeadScoreConfig
from inductionlab.studies.spec import RunOptions
from inductionlab.studies.view import MAX_TEXT_TOKENS, TOP_KEYS, encode_patterns, write_view

TEXT = "the people of the city and the people of the state"
L, H = 2, 8                     # the tiny Llama


@pytest.fixture(scope="module")
def tiny(word_tokenizer):
    model = make_tiny("llama", ctx=64)
    return LoadedModel(model, word_tokenizer, {"name": "tiny", "dtype": "float32", **attention_shape(model.config)})


@pytest.fixture(scope="module")
def run_dir(tiny, tmp_path_factory):
    """A finished analyze run: scores on [BOS] S S with |S| = 8 (17 tokens), the stored patterns of the top 4
    induction heads and one random head, a lag probe with every cue (the serial-position curve)."""
    cfg = AnalyzeConfig(ablation=AblationConfig(ks=(1,), n_draws=1, method="zero"),
                        scores=HeadScoreConfig(seq_len=8, batch_size=2), top=3,
                        lag=LagProbeConfig(n_permutations=2, list_length=12, cue_position=6, batch_size=2, cues="all"))
    out = tmp_path_factory.mktemp("view") / "run"
    analyze(tiny, cfg, out, RunOptions(progress=False))
    return out


@pytest.fixture(scope="module")
def pages(run_dir, tiny, tmp_path_factory):
    """The page made without the model (stored heads) and with it (every head; the text too)."""
    d = tmp_path_factory.mktemp("pages")
    return {"stored": write_view(run_dir, d / "stored.html"),
            "model": write_view(run_dir, d / "model.html", loaded=tiny, text=TEXT)}


def eager_attention(model, ids) -> np.ndarray:
    """``[L, H, T, T]``: the model's attention probabilities as transformers returns them (eager attention,
    ``output_attentions=True``), not through inductionlab's instrumentation."""
    model.config._attn_implementation = "eager"
    try:
        with torch.no_grad():
            out = model(input_ids=torch.as_tensor(np.asarray(ids))[None], output_attentions=True)
    finally:
        model.config._attn_implementation = "sdpa"
    return np.stack([a[0].float().numpy() for a in out.attentions])


def page_data(path) -> dict:
    text = path.read_text()
    return json.loads(re.search(r"<script type='application/json' id='view-data'>(.*?)</script>", text, re.S)
                      .group(1).replace("<\\/", "</"))


def decode(seq: dict) -> np.ndarray:
    """The page's patterns back to ``[n_heads, T, T]`` (the lower triangle, row by row, weight × 65535)."""
    T = len(seq["tokens"])
    u = np.frombuffer(base64.b64decode(seq["patterns"]), dtype="<u2").reshape(len(seq["heads"]), -1)
    out = np.zeros((len(seq["heads"]), T, T))
    rows, cols = np.tril_indices(T)
    out[:, rows, cols] = u / 65535
    return out


def test_encoding_by_hand():
    p = np.zeros((1, 3, 3), np.float32)
    p[0, 0, 0] = 1.0
    p[0, 1, :2] = [0.25, 0.75]
    p[0, 2] = [0.5, 0.5, 0.0]
    # lower triangle row by row: 1 | .25 .75 | .5 .5 0, times 65535, rounded (16383.75 -> 16384)
    want = [65535, 16384, 49151, 32768, 32768, 0]
    assert np.frombuffer(base64.b64decode(encode_patterns(p)), "<u2").tolist() == want


def test_page_without_model_holds_the_stored_patterns(run_dir, pages):
    html = pages["stored"].read_text()
    z = np.load(run_dir / "attention_patterns.npz")
    (seq,) = page_data(pages["stored"])["sequences"]
    assert seq["name"] == "[BOS] S S" and [tuple(h) for h in seq["heads"]] == [tuple(h) for h in z["heads"].tolist()]
    assert len(seq["tokens"]) == 17 and seq["tokens"][0] == "<bos>" and seq["tokens"][1:9] == seq["tokens"][9:]
    np.testing.assert_allclose(decode(seq), z["patterns"], atol=1 / 65535)
    # offline: plotly.js inline, nothing loaded from elsewhere
    assert "<script src" not in html and "<link" not in html and "Plotly.newPlot" in html
    assert len(html) > 3_000_000                                  # plotly.js itself
    for div in ("score-induction", "score-previous_token", "curve-lag_curves", "curve-lag_cues_curve-prob",
                "curve-serial_position"):
        assert f'id="{div}"' in html


def test_page_with_model_holds_every_head_on_every_sequence(run_dir, tiny, pages):
    data = page_data(pages["model"])
    bss, lag, text = data["sequences"]
    assert data["top_keys"] == TOP_KEYS
    heads = [(l, h) for l in range(L) for h in range(H)]
    ids = np.load(run_dir / "attention_patterns.npz")["input_ids"]
    want = eager_attention(tiny.model, ids).reshape(L * H, len(ids), len(ids))
    assert [tuple(h) for h in bss["heads"]] == heads
    np.testing.assert_allclose(decode(bss), want, atol=2e-5)
    # the text: BOS, then one token per word of the word-level tokenizer
    tok = tiny.tokenizer
    text_ids = [tok.bos_token_id] + tok(TEXT, add_special_tokens=False)["input_ids"]
    assert text["tokens"] == ["<bos>"] + TEXT.split()
    np.testing.assert_allclose(decode(text), eager_attention(tiny.model, text_ids).reshape(L * H, 12, 12), atol=2e-5)
    # the lag-probe list: the run's 12 words fit 128 tokens, so the list is the run's first trial itself: BOS, the
    # 12 words (one token each, the space folded into the word), the cue (word 6) again
    z = np.load(run_dir / "checkpoints" / "lag" / "intact.npz")
    words = z["list_ids"][0].tolist()
    lag_ids = [tok.bos_token_id] + words + [words[5]]
    assert lag["name"] == "lag-probe list" and "12 words, cue at position 6" in lag["note"]
    assert lag["tokens"] == [tok.decode([i]) for i in lag_ids] and len(lag["heads"]) == L * H
    np.testing.assert_allclose(decode(lag), eager_attention(tiny.model, lag_ids).reshape(L * H, 14, 14), atol=2e-5)


def test_lag_list_is_shortened_to_fit_the_page(tiny):
    """A run's 500-word list (one token a word) is cut to the longest list whose trial fits MAX_TEXT_TOKENS, the
    cue at the same relative position (250 of 500 -> the middle)."""
    from inductionlab.config import to_dict
    from inductionlab.studies.view import lag_list

    record = {"params": {"config": {"lag": to_dict(LagProbeConfig(list_length=500, cue_position=250))}}}
    ids, where = lag_list(tiny, record)
    n = (MAX_TEXT_TOKENS - 4) // 2                     # 62 words: BOS + 62 + cue = 64 tokens
    assert len(ids) == n + 2 and ids[-1] == ids[n // 2] and len(set(ids[1:-1])) == n
    assert f"shortened to {n} words, cue at position {n // 2}" in where and "500 words, cue at 250" in where
    assert lag_list(tiny, {"params": {"config": {}}}) is None


def test_a_run_without_stored_patterns(run_dir, tiny, tmp_path):
    """A head-types-like run (no attention_patterns.npz; head_scores.csv with the signed FV score and the CMR
    distance): the model's patterns on the induction score's first [BOS] S S of the run's seed and seq_len,
    every head; an FV map with a diverging scale centred on 0."""
    import pandas as pd

    from inductionlab.core.scores import induction_sequence

    run = tmp_path / "ht"
    shutil.copytree(run_dir, run, ignore=shutil.ignore_patterns("attention_patterns.npz", "lag_*", "serial_*"))
    scores = pd.read_csv(run / "head_scores.csv")
    scores["fv"] = np.linspace(-0.02, 0.05, len(scores))
    scores["cmr_distance"] = np.linspace(0.3, 2.0, len(scores))
    scores.to_csv(run / "head_scores.csv", index=False)
    page = write_view(run, loaded=tiny)
    assert page == run / "view.html"
    seq, lag = page_data(page)["sequences"]
    assert lag["name"] == "lag-probe list"
    ids = induction_sequence(tiny, seq_len=8, seed=0).numpy()
    assert seq["tokens"] == [tiny.tokenizer.decode([int(i)]) for i in ids] and len(seq["heads"]) == L * H
    np.testing.assert_allclose(decode(seq), eager_attention(tiny.model, ids).reshape(L * H, 17, 17), atol=2e-5)
    html = page.read_text()
    fv = json.loads(re.search(r'Plotly.newPlot\(\s*"score-fv",\s*(\[.*?\]),\s*\{', html, re.S).group(1))[0]
    assert fv["zmid"] == 0 and fv["z"][1][7] == pytest.approx(scores["fv"].iloc[15])
    assert 'id="score-cmr_distance"' in html and 'id="curve-' not in html


def test_report_links_the_view(run_dir):
    assert "view.html" in (run_dir / "report.md").read_text()


def test_bad_input(run_dir, tiny, tmp_path):
    with pytest.raises(InductionLabError, match="needs the run's model"):
        write_view(run_dir, tmp_path / "a.html", text="hello")
    with pytest.raises(InductionLabError, match="--text is empty"):
        write_view(run_dir, tmp_path / "a.html", loaded=tiny, text="  ")
    with pytest.raises(InductionLabError, match=f"at most {MAX_TEXT_TOKENS}"):
        write_view(run_dir, tmp_path / "a.html", loaded=tiny, text="the " * MAX_TEXT_TOKENS)
    with pytest.raises(InductionLabError, match="no results.json"):
        write_view(tmp_path, tmp_path / "a.html")
    other = make_tiny("qwen2", ctx=64)                            # 2 layers x 4 heads, not the run's 2 x 8
    wrong = LoadedModel(other, tiny.tokenizer, {"name": "q", **attention_shape(other.config)})
    with pytest.raises(InductionLabError, match="pass --model with the run's model"):
        write_view(run_dir, tmp_path / "a.html", loaded=wrong)
    assert not list(tmp_path.glob("*.html"))


def test_cli_on_a_model_directory(tiny_dir, tmp_path):
    """`inductionlab view RUN --text` loads the run's model from results.json's spec (a saved directory);
    refused: a directory that is not a run (exit 2, one line), --text beside --no-model."""
    out = tmp_path / "run"
    r = CliRunner().invoke(main, ["analyze", "--model", str(tiny_dir), "--out", str(out), "--n-permutations", "2",
                                  "--list-length", "12", "--cue-position", "6", "--ks", "1", "--n-draws", "1",
                                  "--score-seq-len", "6", "--score-batch-size", "2", "--quiet", "--dtype", "float32"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["view", str(out), "--text", TEXT])
    assert r.exit_code == 0, r.output
    assert f"wrote {out / 'view.html'}" in r.output
    names = [s["name"] for s in page_data(out / "view.html")["sequences"]]
    assert names == ["[BOS] S S", "lag-probe list", "text"] and len(page_data(out / "view.html")["sequences"][0]["heads"]) == L * H
    (tmp_path / "a_file").write_text("x")
    for args, message in ((["view", str(tmp_path)], "no results.json"),
                          (["view", str(out), "--no-model", "--text", "x"], "--text and --no-model conflict"),
                          (["view", str(out), "--out", str(out)], "is a directory"),
                          (["view", str(out), "--out", str(tmp_path / "a_file" / "v.html")], "is a file"),
                          (["view", str(out), "--out", str(out / "results.json")], "is not an HTML page")):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 2 and message in r.output and len(r.output.strip().splitlines()) == 1, r.output


# -- in a real browser ------------------------------------------------------------------------------------------

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]


def _browser_or_skip() -> str:
    """The chromium executable; a skip naming what is missing (a failure under CI, which must run this test:
    its set-up, ``make test`` -> scripts/setup.sh --browser, installs both)."""
    import importlib.util

    exe = os.environ.get("INDUCTIONLAB_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    missing = ([] if exe else ["Debian's chromium (apt-get install chromium, as root)"]) + \
              ([] if importlib.util.find_spec("playwright") else ["the Python package playwright (pip install playwright)"])
    if missing:
        why = "browser test needs " + " and ".join(missing) + "; `make test` installs what is missing where it runs as root"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return exe


@pytest.fixture(scope="module")
def browser():
    exe = _browser_or_skip()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
        ctx = p.chromium.launch_persistent_context(profile, executable_path=exe, args=CHROMIUM_ARGS, headless=True,
                                                   viewport={"width": 1300, "height": 1000})
        yield ctx
        ctx.close()


def _open(browser, path):
    page = browser.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.resolve().as_uri())
    page.wait_for_selector("#tokens span")
    return page, errors


def _click_head(page, score: str, layer: int, head: int) -> None:
    """A real mouse click on the cell (layer, head) of a score's heat map (its pixel from plotly's axes)."""
    x, y = page.evaluate("""([id, l, h]) => { const gd = document.getElementById(id), r = gd.getBoundingClientRect();
        const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
        return [r.left + xa._offset + xa.l2p(h), r.top + ya._offset + ya.l2p(l)]; }""", [f"score-{score}", layer, head])
    page.mouse.click(x, y)


def test_browser_hover_and_click(browser, pages, run_dir, tiny):
    """Hovering a query token outlines the keys of its largest attention weights and shades every key by its
    weight; clicking a head on the induction map shows that head's pattern; without the model, a head the run
    did not store says so."""
    ids = np.load(run_dir / "attention_patterns.npz")["input_ids"]
    att = eager_attention(tiny.model, ids)                       # [L, H, T, T], independent of the page
    page, errors = _open(browser, pages["model"])
    shown = tuple(page.evaluate("() => window.inductionView.head"))
    target = (1, 5) if shown != (1, 5) else (0, 2)
    _click_head(page, "induction", *target)
    assert tuple(page.evaluate("() => window.inductionView.head")) == target
    assert page.text_content("#pattern-plot .gtitle").startswith(f"L{target[0]} H{target[1]} on [BOS] S S")
    z = np.array(page.evaluate("() => document.getElementById('pattern-plot').data[0].z"), dtype=float)
    want = att[target]
    np.testing.assert_allclose(np.nan_to_num(z), np.tril(want), atol=2e-5)
    # the query whose TOP_KEYS-th and next weights are furthest apart: its top keys are unambiguous
    rows = np.sort(want, axis=1)[:, ::-1]
    q = int(np.argmax(rows[:, TOP_KEYS - 1] - rows[:, TOP_KEYS]))
    assert rows[q, TOP_KEYS - 1] - rows[q, TOP_KEYS] > 1e-3
    page.hover(f"#tokens span[data-i='{q}']")
    top = page.evaluate("() => [...document.querySelectorAll('#tokens span.top')].map((e) => +e.dataset.i)")
    assert sorted(top) == sorted(np.argsort(-want[q])[:TOP_KEYS].tolist())
    alpha = page.evaluate("""() => [...document.querySelectorAll('#tokens span')].map((e) => {
        const m = getComputedStyle(e).backgroundColor.match(/rgba?\\(([^)]*)\\)/)[1].split(',');
        return m.length === 4 ? +m[3] : (m[0].trim() === '0' && m[1].trim() === '0' ? 0 : 1); })""")
    np.testing.assert_allclose(alpha[: q + 1], want[q, : q + 1], atol=3e-3)    # the colour's alpha: 8 bits
    assert max(alpha[q + 1:], default=0) == 0
    assert page.evaluate("() => document.querySelector('#tokens span.query').dataset.i") == str(q)
    # the lag-probe list, then the text
    page.select_option("#seq-select", "1")
    assert page.text_content("#pattern-plot .gtitle").startswith(f"L{target[0]} H{target[1]} on lag-probe list (14 tokens)")
    page.select_option("#seq-select", "2")
    assert page.text_content("#pattern-plot .gtitle").startswith(f"L{target[0]} H{target[1]} on text (12 tokens)")
    assert errors == []
    page.close()
    page, errors = _open(browser, pages["stored"])
    stored = {tuple(h) for h in np.load(run_dir / "attention_patterns.npz")["heads"].tolist()}
    missing = next((l, h) for l in range(L) for h in range(H) if (l, h) not in stored)
    _click_head(page, "induction", *missing)
    assert f"L{missing[0]} H{missing[1]}: its pattern on [BOS] S S was not stored" in page.text_content("#pattern-msg")
    assert errors == []
    page.close()
