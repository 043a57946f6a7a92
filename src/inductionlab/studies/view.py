"""The interactive run view (``inductionlab view RUN_DIR``): one self-contained HTML file of a finished run,
``RUN_DIR/view.html``, that opens offline in a browser with no server (issue 37, deliverable 3).

What the page shows, and where each part comes from (the run directory; nothing is recomputed from a result
object, so the page can be made again from any finished run):

* **attention patterns** of heads on the run's sequences, a heat map (query × key) of the chosen head and a
  token strip under it: hovering a token (or a row of the heat map) makes it the query; every key's background
  then shows the attention weight the query puts on it (opacity = weight) and the :data:`TOP_KEYS` keys of
  largest weight are outlined. Sequences:

  - ``[BOS] S S``, the induction score's sequence: an analyze run's ``attention_patterns.npz`` (the top
    induction heads and one random head, with the token ids; the tokens' text too for runs written since this
    view). **With the model** (the run's own, loaded by the command: :func:`run_model`), every head's pattern
    on the same ids is computed at view time (:func:`~inductionlab.core.instrument.attention_patterns`), so
    a click on any cell of a heat map shows that head; a run that stored no patterns (``study head-types``,
    ``study routes``) gets the score's first ``[BOS] S S`` sequence of the run's seed and ``seq_len``
    (:func:`~inductionlab.core.scores.induction_sequence`, as analyze draws it). **Without the model**
    (``--no-model``), the stored heads only: a click on another head says that its pattern was not stored.
  - a lag-probe list (with the model, when the run has a lag probe): the first trial of the run's lag probe,
    shortened to fit :data:`MAX_TEXT_TOKENS` (:func:`lag_list`: the run's word format and seed, the cue at the
    same relative position), every head;
  - a user's text (``--text``, needs the model): every head's pattern on the text's tokens, the model's BOS
    first (as the head scores' sequences), at most :data:`MAX_TEXT_TOKENS` tokens.

* **head-score heat maps** (layers × query heads), one per numeric column of ``head_scores.csv`` (analyze:
  induction, anti-induction, previous-token, duplicate-token, sink; ``study head-types`` adds the FV score,
  concept / token copying and attention and, with ``--cmr``, the CMR distance); a click on a cell shows that
  head's pattern.
* **lag curves** and the **serial-position curve** when the run has them: ``lag_curves.csv`` (the seed cue),
  ``lag_curves_corrected.csv``, ``lag_cues_curve.csv`` (pooled over cues; probability and word-prior
  corrected) and ``serial_position.csv`` (p(lag +1), p(lag −1), p(lag 0) and list mass by cue position),
  in the run directory or its ``tables/``, with 95% CI bands; per-draw random rows are left out where their
  pooled row is there.

The plots are plotly figures (plotly.js inlined once, ``include_plotlyjs`` semantics: the page loads nothing);
the glue script (token hover, head click) is :data:`GLUE_JS`. Patterns travel as base64 uint16 (weight ×
65535, rounded: absolute error ≤ 7.7e-6) of each head's lower triangle, row by row; a SmolLM2 page with all
270 heads on the 101-token ``[BOS] S S`` holds 2.8 MB of them.
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ..documents import read_json
from ..errors import InductionLabError
from ..runtime.runs import atomic_write_text

#: Keys outlined in the token strip: the hovered query's ``TOP_KEYS`` largest attention weights.
TOP_KEYS = 3
#: The longest ``--text`` (tokens, BOS included): every head's lower-triangle pattern is in the page
#: (``n_heads × T (T + 1) / 2 × 2`` bytes: 4.4 MB for SmolLM2's 270 heads at 128 tokens).
MAX_TEXT_TOKENS = 128
#: The ``[BOS] S S`` sequence of a run that stored none: S's length at most this (as analyze's figure).
MAX_SEQ_LEN = 100
PATTERNS_FILE = "attention_patterns.npz"
CURVE_DIRS = ("", "tables")          # where a run keeps its tables: analyze at the top, temporal in tables/


@dataclass
class PatternSet:
    """The attention patterns of some heads on one sequence.

    Attributes:
        name: what the page calls the sequence (``"[BOS] S S"``, ``"text"``).
        tokens: the tokens' text (``#id`` where no tokenizer was at hand), ``T`` of them.
        heads: ``(layer, head)`` per pattern, query-head indexing.
        patterns: float32 ``[n_heads, T, T]``, attention probabilities (rows sum to 1, causal).
        note: one line on where the patterns come from.
    """
    name: str
    tokens: list[str]
    heads: list[tuple[int, int]]
    patterns: np.ndarray
    note: str = ""


@dataclass
class RunView:
    """What the page shows of a run: :func:`read_run` fills it from the directory, :func:`add_model_patterns`
    adds the patterns that need the model. ``scores``: ``head_scores.csv`` (``layer``, ``head`` and one column
    per score; None: the run has none); ``curves``: file name -> table of the curve files found."""
    run: Path
    record: dict
    scores: pd.DataFrame | None = None
    sequences: list[PatternSet] = field(default_factory=list)
    curves: dict[str, pd.DataFrame] = field(default_factory=dict)
    stored: dict | None = None         # attention_patterns.npz's arrays (None: the run stored no patterns)

    @property
    def shape(self) -> tuple[int, int] | None:
        """``(n_layers, n_heads)`` of the run's model (from results.json), None when it does not say."""
        m = self.record.get("model", {})
        return (int(m["n_layers"]), int(m["n_heads"])) if "n_layers" in m and "n_heads" in m else None


def _visible(s: str) -> str:
    """A token's text with its white space made visible (space ``␣``, new line ``↵``, tab ``⇥``)."""
    return s.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥") or "∅"


def token_texts(tokenizer, ids) -> list[str]:
    """Each id decoded on its own, white space made visible (``#id`` without a tokenizer)."""
    ids = [int(i) for i in np.asarray(ids).ravel()]
    if tokenizer is None:
        return [f"#{i}" for i in ids]
    return [_visible(tokenizer.decode([i])) for i in ids]


def read_run(run_dir: str | os.PathLike) -> RunView:
    """Read what the page shows from a finished run directory (no model): results.json, head_scores.csv,
    attention_patterns.npz (the run directory's, else the ``checkpoints/`` piece) and the curve tables.

    Raises:
        InductionLabError: not a directory, or no results.json in it (an unfinished run: run its command again
            to finish it), or a results.json that does not parse."""
    run = Path(run_dir)
    if not run.is_dir():
        raise InductionLabError(f"run directory {run} does not exist; pass the --out of a finished run")
    if not (run / "results.json").is_file():
        raise InductionLabError(f"{run} holds no results.json: not a finished run (run its command again to finish "
                                "it, then view it)")
    view = RunView(run=run, record=read_json(run / "results.json", "results.json"))
    if (run / "head_scores.csv").is_file():
        df = pd.read_csv(run / "head_scores.csv")
        if {"layer", "head"} <= set(df.columns):
            view.scores = df
    for p in (run / PATTERNS_FILE, run / "checkpoints" / PATTERNS_FILE):
        if p.is_file():
            with np.load(p, allow_pickle=False) as z:
                view.stored = {k: z[k] for k in z.files}
            break
    if view.stored is not None:
        s = view.stored
        tokens = [_visible(str(t)) for t in s["tokens"]] if "tokens" in s else token_texts(None, s["input_ids"])
        view.sequences.append(PatternSet(
            _sequence_name(s), tokens, [tuple(int(x) for x in lh) for lh in s["heads"]],
            np.asarray(s["patterns"], np.float32),
            f"the heads the run stored ({PATTERNS_FILE}): the top induction heads and one random head"))
    for name in ("lag_curves.csv", "lag_curves_corrected.csv", "lag_cues_curve.csv", "serial_position.csv"):
        for sub in CURVE_DIRS:
            if (run / sub / name).is_file():
                view.curves[name] = pd.read_csv(run / sub / name)
                break
    return view


def _sequence_name(stored: dict) -> str:
    return "[BOS] S S" if int(stored.get("bos", 1)) else "S S"


def run_model(view: RunView) -> tuple[str, str] | None:
    """``(spec, dtype)`` of the run's model as results.json records it (what ``inductionlab view`` loads), None
    when it records no spec (a model built in memory)."""
    m = view.record.get("model", {})
    return (str(m["spec"]), str(m.get("dtype", "float32"))) if m.get("spec") else None


def check_model(view: RunView, loaded) -> None:
    """The model is the run's: its shape, and its weights' SHA-256 where both record them.

    Raises:
        InductionLabError: another shape or other weights, naming the fix (``--model`` with the run's model)."""
    from ..core.models import attention_shape

    shape = attention_shape(loaded.model.config)
    if view.shape is not None and (shape["n_layers"], shape["n_heads"]) != view.shape:
        raise InductionLabError(f"the model has {shape['n_layers']} layers x {shape['n_heads']} heads, the run's "
                                f"{view.shape[0]} x {view.shape[1]}; pass --model with the run's model")
    mine, theirs = loaded.identity.get("sha256"), view.record.get("model", {}).get("sha256")
    if mine and theirs and mine != theirs:
        raise InductionLabError("the model's weights are not the run's (their SHA-256 differ from results.json's); "
                                "pass --model with the run's model, or --no-model")


def text_ids(loaded, text: str):
    """``text``'s token ids, the model's BOS first when it has one (as the head scores' sequences).

    Raises:
        InductionLabError: an empty text, or one of more than :data:`MAX_TEXT_TOKENS` tokens."""
    tok = loaded.tokenizer
    ids = list(tok(text, add_special_tokens=False)["input_ids"])
    bos = getattr(tok, "bos_token_id", None)
    if bos is not None:
        ids = [bos] + ids
    if not text.strip() or len(ids) <= int(bos is not None):
        raise InductionLabError("--text is empty; give the text whose attention patterns to show")
    if len(ids) > MAX_TEXT_TOKENS:
        raise InductionLabError(f"--text is {len(ids)} tokens long, the view keeps at most {MAX_TEXT_TOKENS} "
                                "(every head's pattern is in the page); shorten it")
    return ids


def lag_list(loaded, record: dict) -> tuple[list[int], str] | None:
    """The first trial of the run's lag probe, shortened to fit :data:`MAX_TEXT_TOKENS`: the run's word format
    (separator, instruction, BOS, tokens per word) and seed, with the longest list that fits and the cue at the
    same relative position (:func:`~inductionlab.protocols.lag_probe.build_trials`). None when results.json
    records no lag probe (``params.config.lag``).

    Returns: ``(ids, where)``: the trial's token ids (list, then separator, cue, separator) and one line naming
    the list length and cue used beside the run's own."""
    from dataclasses import replace

    from ..config import from_dict
    from ..protocols.configs import LagProbeConfig
    from ..protocols.lag_probe import build_trials

    raw = record.get("params", {}).get("config", {}).get("lag")
    if not isinstance(raw, dict):
        return None
    run_cfg = from_dict(LagProbeConfig, raw, where="results.json params.config.lag")
    n = min(run_cfg.list_length, (MAX_TEXT_TOKENS - 4) // (max(run_cfg.token_lengths()) + 1))
    while n >= 2:
        cue = min(n, max(1, round(run_cfg.cue_position * n / run_cfg.list_length)))
        cfg = replace(run_cfg, list_length=n, cue_position=cue, n_permutations=2, cues="seed", batch_size=None,
                      resample_words=False)
        ids = build_trials(loaded, cfg).tensors["ids"][0].tolist()
        if len(ids) <= MAX_TEXT_TOKENS:
            return ids, (f"the lag probe's first trial (seed {cfg.seed}) shortened to {n} words, cue at position {cue} "
                         f"(the run's lists: {run_cfg.list_length} words, cue at {run_cfg.cue_position})")
        n -= 1
    return None


def add_model_patterns(view: RunView, loaded, text: str | None = None) -> None:
    """With the run's model: every head's pattern on the ``[BOS] S S`` sequence (the stored ids, or the run's
    seed and ``seq_len`` when it stored none), on a short lag-probe list when the run has a lag probe
    (:func:`lag_list`), and on ``text`` when given (:func:`text_ids`).

    Raises:
        InductionLabError: a model that is not the run's (:func:`check_model`); a bad text (:func:`text_ids`)."""
    from ..core.instrument import attention_patterns
    from ..core.models import attention_shape
    from ..core.scores import induction_sequence

    check_model(view, loaded)
    shape = attention_shape(loaded.model.config)
    heads = [(l, h) for l in range(shape["n_layers"]) for h in range(shape["n_heads"])]
    ids_text = text_ids(loaded, text) if text is not None else None     # refused before any forward
    if view.stored is not None:
        ids, name = view.stored["input_ids"], _sequence_name(view.stored)
        where = f"the ids of {PATTERNS_FILE}"
    else:
        cfg = view.record.get("params", {}).get("config", {})
        T = min(int(cfg.get("scores", {}).get("seq_len", 50)), MAX_SEQ_LEN)
        seed = int(cfg.get("seed", 0))
        ids = induction_sequence(loaded, seq_len=T, seed=seed).numpy()
        name, where = "[BOS] S S", f"the induction score's first sequence (seed {seed}, |S| = {T})"
    pats = attention_patterns(loaded.model, ids, heads)
    view.sequences = [PatternSet(name, token_texts(loaded.tokenizer, ids), heads, pats,
                                 f"every head, computed with the run's model on {where}")]
    lag = lag_list(loaded, view.record)
    if lag is not None:
        ids_lag, where_lag = lag
        view.sequences.append(PatternSet("lag-probe list", token_texts(loaded.tokenizer, ids_lag), heads,
                                         attention_patterns(loaded.model, ids_lag, heads),
                                         f"every head, computed with the run's model on {where_lag}"))
    if ids_text is not None:
        view.sequences.append(PatternSet("text", token_texts(loaded.tokenizer, ids_text), heads,
                                         attention_patterns(loaded.model, ids_text, heads),
                                         "every head, computed with the run's model on --text"))


# -- the page ---------------------------------------------------------------------------------------------------

def encode_patterns(patterns: np.ndarray) -> str:
    """base64 of uint16 (weight × 65535, rounded) of each pattern's lower triangle, row by row, head by head:
    pattern ``i``, query ``q``, key ``k <= q`` at index ``i · T(T+1)/2 + q(q+1)/2 + k``."""
    p = np.clip(np.asarray(patterns, np.float64), 0.0, 1.0)
    T = p.shape[-1]
    rows, cols = np.tril_indices(T)
    return base64.b64encode(np.rint(p[:, rows, cols] * 65535).astype("<u2").tobytes()).decode("ascii")


#: Scores whose sign matters (a diverging colour scale centred on 0) and scores where low is the type's end.
SIGNED = {"fv", "fv_aie", "concept_copying", "token_copying"}
LOW_IS_MORE = {"cmr_distance"}


def score_figures(scores: pd.DataFrame, shape: tuple[int, int] | None) -> dict[str, object]:
    """One plotly heat map (layers × query heads) per numeric score column of ``head_scores.csv``."""
    import plotly.graph_objects as go

    L = int(scores["layer"].max()) + 1 if shape is None else shape[0]
    H = int(scores["head"].max()) + 1 if shape is None else shape[1]
    figs = {}
    for name in scores.columns:
        if name in ("layer", "head") or not pd.api.types.is_numeric_dtype(scores[name]):
            continue
        z = np.full((L, H), np.nan)
        z[scores["layer"].to_numpy(int), scores["head"].to_numpy(int)] = scores[name].to_numpy(float)
        signed = name in SIGNED or (np.nanmin(z) < 0 if np.isfinite(z).any() else False)
        fig = go.Figure(go.Heatmap(
            z=np.where(np.isfinite(z), z, None).tolist(), x=list(range(H)), y=list(range(L)),
            colorscale="RdBu" if signed else ("Viridis_r" if name in LOW_IS_MORE else "Viridis"),
            zmid=0 if signed else None, colorbar={"thickness": 10},
            hovertemplate="L%{y} H%{x}<br>" + name + " %{z:.4f}<extra>click: show its pattern</extra>"))
        fig.update_layout(title={"text": name.replace("_", " "), "x": 0.5}, width=300, height=120 + 14 * L,
                          margin={"l": 45, "r": 10, "t": 35, "b": 40}, xaxis_title="query head", yaxis_title="layer",
                          xaxis={"dtick": max(1, H // 8)}, yaxis={"autorange": "reversed", "dtick": max(1, L // 8)})
        figs[name] = fig
    return figs


def _shown_conditions(df: pd.DataFrame) -> list[str]:
    """The curve's conditions, per-draw random rows left out where their pooled row is there."""
    conds = list(dict.fromkeys(df["condition"]))
    return [c for c in conds if not (re.search(r"-d\d+$", c) and re.sub(r"-d\d+$", "", c) in conds)]


def _band_traces(df: pd.DataFrame, x: str, cond: str, colour: str, row=None) -> list:
    """A condition's line and its 95% CI band (one legend entry for both)."""
    import plotly.graph_objects as go

    d = df[df["condition"] == cond].sort_values(x)
    xs = d[x].to_numpy()
    f4 = lambda c: d[c].to_numpy(np.float32)     # noqa: E731  (float32: plotly stores it as 4 bytes, not as text)
    traces = []
    if {"ci_low", "ci_high"} <= set(d.columns) and d["ci_low"].notna().any():
        traces.append(go.Scatter(x=np.concatenate([xs, xs[::-1]]), y=np.concatenate([f4("ci_high"), f4("ci_low")[::-1]]),
                                 fill="toself", fillcolor=colour, opacity=0.2, line={"width": 0}, hoverinfo="skip",
                                 legendgroup=cond, showlegend=False))
    traces.append(go.Scatter(x=xs, y=f4("mean"), mode="lines+markers", marker={"size": 4}, name=cond,
                             line={"color": colour}, legendgroup=cond, showlegend=row in (None, 1)))
    return traces


COLOURS = ["#222222", "#d62728", "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf",
           "#bcbd22", "#7f7f7f"]

#: The curve figures: file, measure (None: the file has one), title, x column, y label.
CURVES = (("lag_curves.csv", None, "Lag curve, seed cue", "lag", "p(word at lag)"),
          ("lag_curves_corrected.csv", "log_enrichment", "Lag curve, seed cue, word-prior corrected", "lag",
           "log-enrichment"),
          ("lag_cues_curve.csv", "prob", "Lag curve pooled over cues", "lag", "p(word at lag)"),
          ("lag_cues_curve.csv", "log_enrichment", "Lag curve pooled over cues, word-prior corrected", "lag",
           "log-enrichment"))


def curve_figures(curves: dict[str, pd.DataFrame]) -> dict[str, object]:
    """The lag curves (lags −10..10 shown; zoom out for all) and the serial-position curve, from the tables; keyed
    by the file's stem and the measure shown (``lag_cues_curve-prob``: the div ``curve-lag_cues_curve-prob``)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    figs = {}
    for file, measure, title, x, ylabel in CURVES:
        df = curves.get(file)
        if df is None:
            continue
        if measure is not None and "measure" in df.columns:
            df = df[df["measure"] == measure]
        if df.empty:
            continue
        fig = go.Figure()
        for i, c in enumerate(_shown_conditions(df)):
            fig.add_traces(_band_traces(df, x, c, COLOURS[i % len(COLOURS)]))
        fig.update_layout(title=title, xaxis_title=x, yaxis_title=ylabel, width=620, height=380,
                          xaxis={"range": [-10.5, 10.5]}, margin={"t": 45})
        figs[file.removesuffix(".csv") + (f"-{measure}" if measure else "")] = fig
    sp = curves.get("serial_position.csv")
    if sp is not None and not sp.empty:
        measures = list(dict.fromkeys(sp["measure"]))
        fig = make_subplots(rows=1, cols=len(measures), subplot_titles=measures)
        for j, m in enumerate(measures, 1):
            d = sp[sp["measure"] == m]
            for i, c in enumerate(_shown_conditions(d)):
                for t in _band_traces(d, "cue_position", c, COLOURS[i % len(COLOURS)], row=j):
                    fig.add_trace(t, row=1, col=j)
            fig.update_xaxes(title_text="cue position", row=1, col=j)
        fig.update_layout(title="Serial-position curve", width=max(620, 330 * len(measures)), height=380,
                          margin={"t": 60})
        figs["serial_position"] = fig
    return figs


def page_data(view: RunView) -> dict:
    """The JSON the glue script reads: the sequences (tokens, heads, encoded patterns), the top-k rule and the head
    shown first (:func:`first_head`)."""
    return {"top_keys": TOP_KEYS, "first_head": first_head(view),
            "sequences": [{"name": s.name, "tokens": list(s.tokens), "heads": [list(h) for h in s.heads],
                           "note": s.note, "patterns": encode_patterns(s.patterns)} for s in view.sequences]}


def first_head(view: RunView) -> list[int] | None:
    """The head the page opens on: the run's top stored head (analyze: the top induction head), else the head of
    highest induction score, else the first head of the first sequence."""
    if view.stored is not None and len(view.stored["heads"]):
        return [int(x) for x in view.stored["heads"][0]]
    if view.scores is not None and "induction" in view.scores.columns and view.scores["induction"].notna().any():
        r = view.scores.loc[view.scores["induction"].idxmax()]
        return [int(r["layer"]), int(r["head"])]
    return [int(x) for x in view.sequences[0].heads[0]] if view.sequences else None


def _figure_html(fig, div_id: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config={"displaylogo": False})


def render(view: RunView) -> str:
    """The whole page: plotly.js inline, the figures, the data and the glue script."""
    from plotly.offline import get_plotlyjs

    m = view.record.get("model", {})
    name = html.escape(str(m.get("name", "model")))
    kind = html.escape(str(view.record.get("kind", "run")))
    parts = [f"<h1>{name} — {kind} <span class='run'>{html.escape(view.run.resolve().name)}</span></h1>",
             "<p class='how'>Made by <code>inductionlab view</code> from the run directory; opens offline. "
             "Hover a token (or a row of the pattern) to make it the query: each key's background shows the "
             f"attention weight on it, the {TOP_KEYS} largest are outlined. Click a cell of a score map to show "
             "that head.</p>", "<div class='panes'><div class='pane'>", "<h2>Attention patterns</h2>"]
    if view.sequences:
        parts += ["<div class='controls'><label>sequence <select id='seq-select'></select></label> "
                  "<label>head <select id='head-select'></select></label> <span id='seq-note'></span></div>",
                  "<div id='pattern-msg' class='msg'></div><div id='pattern-plot'></div>",
                  "<div id='query-info'></div><div id='tokens' class='tokens'></div>"]
    else:
        parts.append("<p class='msg'>The run stored no attention patterns and the view was made without the model: "
                     "run <code>inductionlab view RUN_DIR</code> with the run's model at hand.</p>")
    parts.append("</div>")
    if view.scores is not None:
        figs = score_figures(view.scores, view.shape)
        parts += ["<div class='pane scores'><h2>Head scores</h2><div class='grid'>"]
        parts += [f"<div class='cell'>{_figure_html(f, f'score-{n}')}</div>" for n, f in figs.items()]
        parts.append("</div></div>")
    parts.append("</div>")
    curves = curve_figures(view.curves)
    if curves:
        parts += ["<h2>Lag probe</h2><div class='grid'>"]
        parts += [f"<div class='cell'>{_figure_html(f, f'curve-{k}')}</div>"
                  for k, f in curves.items()]
        parts.append("</div>")
    data = json.dumps(page_data(view), separators=(",", ":")).replace("</", "<\\/")
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>{name} — {kind}</title>"
            f"<style>{CSS}</style><script>{get_plotlyjs()}</script></head><body>\n" + "\n".join(parts)
            + f"\n<script type='application/json' id='view-data'>{data}</script>\n<script>{GLUE_JS}</script>"
            "\n</body></html>\n")


def check_out(run_dir: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """The page's path (``out``, default ``RUN_DIR/view.html``), checked before anything is read or loaded: a
    file that can be written (:func:`~inductionlab.runtime.outputs.check_output_file`) and, where it exists, an
    HTML page (a page is replaced; a run's results.json, say, is not).

    Raises:
        InductionLabError: a directory, a path under a file or in a folder that cannot be written, an existing
            file that is not ``.html`` / ``.htm``."""
    from ..runtime.outputs import check_output_file

    path = check_output_file(Path(out) if out is not None else Path(run_dir) / "view.html", "--out")
    if path.exists() and path.suffix.lower() not in (".html", ".htm"):
        raise InductionLabError(f"--out {path} exists and is not an HTML page; pass a new file or an .html file "
                                "to replace")
    return path


def write_view(run_dir: str | os.PathLike, out: str | os.PathLike | None = None, loaded=None,
               text: str | None = None) -> Path:
    """Write the run's view (:func:`render`) to ``out`` (default ``RUN_DIR/view.html``), atomically.

    Args:
        run_dir: a finished run directory (results.json written).
        out: the HTML file.
        loaded: the run's model (a LoadedModel) to compute every head's pattern (:func:`add_model_patterns`);
            None: the patterns the run stored.
        text: a text whose patterns to show too (needs ``loaded``).

    Returns: the path written.

    Raises:
        InductionLabError: as :func:`check_out`, :func:`read_run` and :func:`add_model_patterns`; ``text``
            without a model."""
    if text is not None and loaded is None:
        raise InductionLabError("--text needs the run's model to compute its patterns; drop --no-model (or pass "
                                "--model)")
    path = check_out(run_dir, out)
    view = read_run(run_dir)
    if loaded is not None:
        add_model_patterns(view, loaded, text)
    atomic_write_text(path, render(view))
    return path


CSS = """
body { font-family: system-ui, sans-serif; margin: 1.2em; color: #222; }
h1 { font-size: 1.3em; } h1 .run { color: #777; font-weight: normal; font-size: 0.8em; }
h2 { font-size: 1.1em; border-bottom: 1px solid #ddd; margin-top: 1.4em; }
.how, #seq-note, #query-info { color: #555; font-size: 0.9em; }
.msg { color: #a33; min-height: 1.2em; }
.grid { display: flex; flex-wrap: wrap; gap: 0.5em; }
.panes { display: flex; flex-wrap: wrap; gap: 1.5em; align-items: flex-start; }
.pane { max-width: 640px; } .pane.scores { flex: 1; max-width: none; min-width: 320px; }
.tokens { line-height: 1.9; font-family: ui-monospace, monospace; font-size: 0.85em; }
.tokens span { display: inline-block; padding: 0 3px; margin: 1px; border-radius: 3px; cursor: default; white-space: pre;
               border: 1px solid transparent; }
.tokens span.query { border-color: #1f77b4; box-shadow: 0 0 0 1px #1f77b4; }
.tokens span.top { border: 2px solid #000; }
"""

#: The glue: the sequence and head pickers, the pattern heat map (Plotly.react), the token hover and the
#: score maps' click. State: ``window.inductionView`` (what the browser test reads).
GLUE_JS = r"""
(function () {
  const D = JSON.parse(document.getElementById('view-data').textContent);
  const S = {seq: 0, head: null, query: null, cache: {}};
  window.inductionView = S;
  const $ = (id) => document.getElementById(id);
  if (!D.sequences.length) { return; }
  function decoded(si) {
    if (!S.cache[si]) {
      const bin = atob(D.sequences[si].patterns), buf = new Uint8Array(bin.length);
      for (let i = 0; i < bin.length; i++) buf[i] = bin.charCodeAt(i);
      S.cache[si] = new Uint16Array(buf.buffer);
    }
    return S.cache[si];
  }
  function row(si, hi, q) {       // the query's weights on keys 0..q
    const T = D.sequences[si].tokens.length, tri = T * (T + 1) / 2, u = decoded(si);
    const at = hi * tri + q * (q + 1) / 2, out = new Array(q + 1);
    for (let k = 0; k <= q; k++) out[k] = u[at + k] / 65535;
    return out;
  }
  function headIndex(si, l, h) {
    return D.sequences[si].heads.findIndex((x) => x[0] === l && x[1] === h);
  }
  function fillHeads() {
    const sel = $('head-select'), seq = D.sequences[S.seq];
    sel.innerHTML = seq.heads.map((x, i) => `<option value="${x[0]},${x[1]}">L${x[0]} H${x[1]}</option>`).join('');
    $('seq-note').textContent = seq.note;
  }
  function drawTokens() {
    const seq = D.sequences[S.seq];
    $('tokens').innerHTML = seq.tokens.map((t, i) => {
      const e = document.createElement('span'); e.textContent = t; e.dataset.i = i; e.title = 'position ' + i;
      return e.outerHTML; }).join('');
    $('tokens').querySelectorAll('span').forEach((e) =>
      e.addEventListener('mouseenter', () => setQuery(+e.dataset.i)));
  }
  function showHead(l, h) {
    const seq = D.sequences[S.seq], hi = headIndex(S.seq, l, h);
    S.head = [l, h];
    if (hi < 0) {
      $('pattern-msg').textContent = `L${l} H${h}: its pattern on ${seq.name} was not stored; make the view ` +
        'with the run\'s model (inductionlab view RUN_DIR, without --no-model) to see every head.';
      return false;
    }
    $('pattern-msg').textContent = '';
    $('head-select').value = `${l},${h}`;
    const T = seq.tokens.length, z = [], text = [];
    for (let q = 0; q < T; q++) {
      const r = row(S.seq, hi, q), zr = new Array(T).fill(null), tr = new Array(T).fill('');
      for (let k = 0; k <= q; k++) { zr[k] = r[k]; tr[k] = `q ${q} ${seq.tokens[q]} → k ${k} ${seq.tokens[k]}`; }
      z.push(zr); text.push(tr);
    }
    const trace = {type: 'heatmap', z: z, text: text, colorscale: 'Viridis', zmin: 0, zmax: 1,
                   hovertemplate: '%{text}<br>weight %{z:.4f}<extra></extra>', colorbar: {thickness: 10}};
    const layout = {title: {text: `L${l} H${h} on ${seq.name} (${T} tokens)`}, width: 620, height: 560,
                    xaxis: {title: {text: 'key position'}, zeroline: false},
                    yaxis: {title: {text: 'query position'}, autorange: 'reversed', zeroline: false},
                    margin: {t: 40}, shapes: []};
    Plotly.react('pattern-plot', [trace], layout, {displaylogo: false});
    if (S.query !== null && S.query < T) setQuery(S.query);
    return true;
  }
  function setQuery(q) {
    const seq = D.sequences[S.seq];
    S.query = q;
    if (!S.head) return;
    const hi = headIndex(S.seq, S.head[0], S.head[1]);
    if (hi < 0) return;
    const r = row(S.seq, hi, q);
    const top = r.map((w, k) => [w, k]).sort((a, b) => b[0] - a[0] || a[1] - b[1]).slice(0, D.top_keys).map((x) => x[1]);
    $('tokens').querySelectorAll('span').forEach((e) => {
      const k = +e.dataset.i, w = k <= q ? r[k] : 0;
      e.style.background = k <= q ? `rgba(255, 110, 0, ${w.toFixed(4)})` : 'transparent';
      e.dataset.weight = w;
      e.classList.toggle('query', k === q);
      e.classList.toggle('top', top.includes(k) && k <= q);
    });
    $('query-info').textContent = `query ${q} (${seq.tokens[q]}): largest weights ` +
      top.map((k) => `key ${k} (${seq.tokens[k]}) ${r[k].toFixed(3)}`).join(', ');
    Plotly.relayout('pattern-plot', {shapes: [{type: 'rect', xref: 'x', yref: 'y', x0: -0.5, x1: q + 0.5,
      y0: q - 0.5, y1: q + 0.5, line: {color: '#ff6e00', width: 2}}]});
  }
  const sel = $('seq-select');
  sel.innerHTML = D.sequences.map((s, i) => `<option value="${i}">${s.name}</option>`).join('');
  sel.addEventListener('change', () => {
    const head = S.head; S.seq = +sel.value; S.query = null; fillHeads(); drawTokens();
    if (!head || !showHead(head[0], head[1])) showHead(...D.sequences[S.seq].heads[0]);
  });
  $('head-select').addEventListener('change', (e) => { const [l, h] = e.target.value.split(',').map(Number); showHead(l, h); });
  fillHeads(); drawTokens();
  if (!D.first_head || !showHead(...D.first_head)) showHead(...D.sequences[0].heads[0]);
  document.getElementById('pattern-plot').on('plotly_hover', (ev) => {
    const q = ev.points[0].y; if (q !== S.query) setQuery(q); });
  window.addEventListener('load', () => {
    document.querySelectorAll('div[id^="score-"]').forEach((gd) => {
      if (gd.on) gd.on('plotly_click', (ev) => { showHead(ev.points[0].y, ev.points[0].x);
        $('pattern-plot').scrollIntoView({behavior: 'instant', block: 'nearest'}); });
    });
  });
})();
"""

__all__ = ["PatternSet", "RunView", "read_run", "run_model", "check_model", "add_model_patterns", "render",
           "check_out", "write_view", "encode_patterns", "TOP_KEYS", "MAX_TEXT_TOKENS"]
