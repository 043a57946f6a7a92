"""Head telemetry over training (SPEC §8): per-head scores and held-out perplexity at every
checkpoint, their summaries, the emergence step, and plots.

Measured at each checkpoint (:func:`measure`):

* ``induction`` / ``anti_induction``: :func:`inductionlab.core.scores.compute_head_scores` on random
  repeated sequences of ``telemetry_seq_len`` tokens (50 by default, SPEC §3).
* ``copy_offset``: mean attention probability from each query in the second half of a snippet
  ``[BOS] S SEP S`` (S = L random tokens, L = the curriculum's span length) to the key q − L,
  i.e. the token that followed the earlier occurrence of the query token, which sits L + 1
  positions before the token being predicted (the fixed offset of Bi-Induct snippets, SPEC §6).
* ``copy_offset_control``: the same key offset on ``[BOS] S SEP R`` with R fresh random tokens,
  where content gives no reason to look there. A head that copies by *position* scores high on
  both; an induction head scores high on ``copy_offset`` (and on ``induction``, measured at
  offset 50 ≠ L) but not on the control.
* held-out loss (nats/token) and perplexity ``exp(loss)`` on the natural held-out split.

Summaries per checkpoint and score (:func:`summarize`): max, mean of the top 2% of heads
(at least one head), number of heads above each threshold, layer of the strongest head, and the
share of the total (positive) score held by the top 2% (concentration). The emergence step is
the first checkpoint whose maximum induction score exceeds a stated threshold.
"""

from __future__ import annotations

import contextlib
import math
import random
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd
import torch

from ..core.scores import copy_offset_scores, copy_offset_targets  # noqa: F401 (moved to scores.py; re-exported)
from ..documents import read_json
from ..errors import InductionLabError
from ..runtime.run_dir import TrainRun

DEFAULT_THRESHOLDS = (0.1, 0.2, 0.4)


@contextlib.contextmanager
def preserved_rng():
    """Run a block without disturbing torch, numpy or python RNG streams (for resumable runs)."""
    np_state, py_state = np.random.get_state(), random.getstate()
    with torch.random.fork_rng(devices=[]):
        yield
    np.random.set_state(np_state)
    random.setstate(py_state)


def heldout_loss(model, tokens: np.ndarray, *, seq_len: int, n_tokens: int, batch_size: int = 8,
                 autocast_dtype: torch.dtype | None = None) -> float:
    """Mean next-token loss (nats/token) on the first ``n_tokens`` held-out tokens, cut into
    non-overlapping windows of ``seq_len`` tokens.

    Raises:
        InductionLabError: the held-out split is shorter than one window.
    """
    n_win = min(n_tokens, len(tokens)) // seq_len
    if n_win < 1:
        raise InductionLabError(f"held-out split has {len(tokens)} tokens, fewer than one window of {seq_len}; "
                                "prepare the data with a larger held-out fraction or lower seq_len")
    device = next(model.parameters()).device
    win = torch.from_numpy(np.asarray(tokens[: n_win * seq_len], dtype=np.int64)).view(n_win, seq_len)
    total, count = 0.0, 0
    with torch.inference_mode():
        for i in range(0, n_win, batch_size):
            ids = win[i:i + batch_size].to(device)
            with torch.autocast(device.type, dtype=autocast_dtype or torch.float32,
                                enabled=autocast_dtype is not None):
                logits = model(input_ids=ids).logits
            nll = torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                                                    ids[:, 1:].reshape(-1), reduction="sum")
            total += nll.item()
            count += ids[:, 1:].numel()
    return total / count


def measure(model, *, vocab_size: int, special_ids: Sequence[int] = (), bos_id: int | None = None,
            sep_id: int | None = None, span_length: int = 20, seq_len: int = 50, batch_size: int = 16,
            heldout: np.ndarray | None = None, eval_seq_len: int = 1024, eval_tokens: int = 65536,
            autocast_dtype: torch.dtype | None = None, seed: int = 0,
            pool: np.ndarray | None = None) -> dict[str, Any]:
    """All telemetry of one model state (see module docstring). RNG streams are left untouched.

    ``pool``: the ids random probe tokens are drawn from (the training split's own ids,
    :meth:`~inductionlab.data.shards.TokenShards.token_pool`; special ids and SEP are removed);
    None: every ordinary id of the vocabulary (an id training never saw has an untrained
    embedding and understates the scores, 2–3× on a synth-bigram corpus: issue 19).

    Returns: ``{"scores": {name: [[float]] (n_layers x n_heads)}, "heldout_loss": nats | None,
    "heldout_ppl": float | None, "params": {...}}``.
    """
    from ..core.scores import compute_head_scores
    from ..core.stimuli import ordinary_token_ids

    was_training = model.training
    model.eval()
    try:
        with preserved_rng():
            excl = tuple(special_ids) + ((sep_id,) if sep_id is not None else ())
            if pool is None:
                head_pool, copy_pool = None, ordinary_token_ids(vocab_size, excl)
            else:
                keep = np.asarray(pool, dtype=np.int64)
                head_pool = torch.as_tensor(keep[~np.isin(keep, tuple(special_ids))])
                copy_pool = torch.as_tensor(keep[~np.isin(keep, excl)])
            hs = compute_head_scores(model, vocab_size=vocab_size, exclude_ids=tuple(special_ids), bos_id=bos_id,
                                     seq_len=seq_len, batch_size=batch_size, seed=seed,
                                     names=("induction", "anti_induction"), pool=head_pool)
            cs = copy_offset_scores(model, span_length=span_length, pool=copy_pool, sep_id=sep_id, bos_id=bos_id,
                                    batch_size=batch_size, seed=seed + 1)
            loss = None
            if heldout is not None and eval_tokens > 0:
                loss = heldout_loss(model, heldout, seq_len=eval_seq_len, n_tokens=eval_tokens,
                                    autocast_dtype=autocast_dtype)
    finally:
        model.train(was_training)
    scores = {"induction": hs.scores["induction"], "anti_induction": hs.scores["anti_induction"], **cs}
    return {"scores": {k: np.asarray(v, dtype=float).tolist() for k, v in scores.items()},
            "heldout_loss": loss, "heldout_ppl": math.exp(loss) if loss is not None else None,
            "params": {"seq_len": seq_len, "batch_size": batch_size, "span_length": span_length, "seed": seed,
                       "eval_tokens": eval_tokens, "eval_seq_len": eval_seq_len, "bos_id": bos_id, "sep_id": sep_id,
                       "pool": ({"source": "vocabulary", "size": int(len(copy_pool))} if pool is None else
                                {"source": "training split", "size": int(len(head_pool))})}}


# ---- tables ----------------------------------------------------------------------------------

def _read_checkpoint_telemetry(p: Path) -> dict[str, Any]:
    """One checkpoint's ``telemetry.json``, checked: valid JSON, integer ``step`` / ``tokens``, every
    score a rectangular ``[n_layers][n_heads]`` grid of numbers (null for NaN), the same shape for
    all, and (when the checkpoint's ``meta.json`` records it) the SHA-256 written with it.

    Raises:
        InductionLabError: the file is unreadable, not JSON, of another shape, or fails its checksum
            (naming the file and the fix)."""
    from ..runtime.runs import sha256_file

    fix = (f"restore it from a copy of the run, or delete the checkpoint {p.parent} to leave step "
           f"{p.parent.name.removeprefix('step_').lstrip('0') or '0'} out of the telemetry")

    def bad(why: str):
        return InductionLabError(f"checkpoint telemetry {p} is damaged ({why}); {fix}")
    try:
        t = read_json(p, "checkpoint telemetry")
    except (OSError, ValueError) as e:
        raise bad(" ".join(str(e).split())[:160] or type(e).__name__) from None
    if not isinstance(t, dict):
        raise bad(f"a JSON {type(t).__name__}, not an object")
    for k in ("step", "tokens"):
        if isinstance(t.get(k), bool) or not isinstance(t.get(k), int) or t[k] < 0:
            raise bad(f"{k!r} is {t.get(k)!r}, not a count")
    scores = t.get("scores")
    if not isinstance(scores, dict) or not {"induction", "anti_induction"} <= set(scores):
        raise bad("no 'scores' with induction and anti_induction")
    shape = None
    for name, grid in scores.items():
        ok = isinstance(grid, list) and grid and all(isinstance(r, list) and r for r in grid)
        ok = ok and all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for r in grid for v in r)
        if not ok or len({len(r) for r in grid}) != 1:
            raise bad(f"score {name!r} is not a [layers][heads] grid of numbers")
        if shape is None:
            shape = (len(grid), len(grid[0]))
        elif (len(grid), len(grid[0])) != shape:
            raise bad(f"score {name!r} is {len(grid)} x {len(grid[0])}, the others {shape[0]} x {shape[1]}")
    for k in ("heldout_loss", "heldout_ppl"):
        v = t.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise bad(f"{k!r} is {v!r}, not a number")
    try:
        want = read_json(p.parent / "meta.json", "checkpoint meta").get("sha256", {}).get(p.name)
    except (OSError, ValueError, AttributeError):
        want = None
    if isinstance(want, str) and sha256_file(p) != want:
        raise bad("its SHA-256 differs from the one meta.json recorded when the checkpoint was written")
    return t


def check_telemetry(run_dir: str | Path) -> None:
    """Check every checkpoint ``telemetry.json`` of a run (:func:`_read_checkpoint_telemetry`); a run
    without any passes.

    Raises:
        InductionLabError: one is damaged (the message names it and the fix)."""
    for p in TrainRun(run_dir).telemetry_files():
        _read_checkpoint_telemetry(p)


def read_telemetry(run_dir: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Telemetry of a run from its checkpoints' ``telemetry.json``.

    Returns: (heads, evals): ``heads`` tidy rows (step, tokens, score, layer, head, value);
    ``evals`` rows (step, tokens, heldout_loss, heldout_ppl).

    Raises:
        InductionLabError: the directory holds no telemetry, or a checkpoint's telemetry.json is
            damaged (:func:`_read_checkpoint_telemetry`).
    """
    rows, evals = [], []
    for p in TrainRun(run_dir).telemetry_files():
        t = _read_checkpoint_telemetry(p)
        step, tokens = t["step"], t["tokens"]
        evals.append({"step": step, "tokens": tokens, "heldout_loss": t.get("heldout_loss"),
                      "heldout_ppl": t.get("heldout_ppl")})
        for name, grid in t["scores"].items():
            for layer, row in enumerate(grid):
                for head, v in enumerate(row):
                    rows.append({"step": step, "tokens": tokens, "score": name, "layer": layer, "head": head,
                                 "value": v})
    if not evals:
        raise InductionLabError(f"{run_dir} holds no telemetry (no checkpoints/step_*/telemetry.json); "
                                "pass a run directory written by `inductionlab train`")
    return pd.DataFrame(rows), pd.DataFrame(evals)


def summarize(heads: pd.DataFrame, thresholds: Iterable[float] = DEFAULT_THRESHOLDS,
              top_frac: float = 0.02) -> pd.DataFrame:
    """Per (step, score): max, top-2% mean, heads above each threshold, layer of the max head,
    concentration (share of the positive total held by the top 2% of heads)."""
    out = []
    for (step, tokens, score), g in heads.groupby(["step", "tokens", "score"], sort=True):
        v = g["value"].to_numpy()
        k = max(1, math.ceil(top_frac * len(v)))
        order = np.argsort(-v, kind="stable")
        pos = np.clip(v, 0, None)
        row = {"step": step, "tokens": tokens, "score": score, "max": float(v[order[0]]),
               "top2pct_mean": float(v[order[:k]].mean()),
               "max_layer": int(g["layer"].to_numpy()[order[0]]), "max_head": int(g["head"].to_numpy()[order[0]]),
               "concentration": float(pos[order[:k]].sum() / pos.sum()) if pos.sum() > 0 else float("nan")}
        for t in thresholds:
            row[f"n_above_{t:g}"] = int((v > t).sum())
        out.append(row)
    return pd.DataFrame(out)


def emergence_step(summary: pd.DataFrame, threshold: float = 0.4, score: str = "induction") -> int | None:
    """First checkpoint step whose maximum ``score`` exceeds ``threshold`` (None if never)."""
    s = summary[(summary["score"] == score) & (summary["max"] > threshold)].sort_values("step")
    return int(s["step"].iloc[0]) if len(s) else None


EMERGENCE_LAW_CONSTANT = 5e5
EMERGENCE_LAW_SOURCE = ("Aoyama, Wilcox & Schneider, 'Predicting the emergence of induction heads', arXiv 2511.16893 "
                        "(code: t-aoyam/predict-ih-review): N ~ 5e5 * sqrt(B * C) training tokens")


def predicted_emergence(batch_sequences: int, context: int) -> dict[str, Any]:
    """The published emergence law: induction heads form after about ``N ≈ 5·10^5 · √(B·C)``
    training tokens, i.e. ``N / (B·C) = 5·10^5 / √(B·C)`` updates (B sequences per update, C tokens
    of context), reported as roughly independent of model size.

    Source: Aoyama, Wilcox & Schneider, "Predicting the emergence of induction heads" (arXiv
    2511.16893; code t-aoyam/predict-ih-review). The constant was fitted on their GPU runs
    (2-layer models at C = 64, constant learning rate after warm-up and larger): an order of
    magnitude, not a promise. Examples: B·C = 2048 → 2.26·10^7 tokens; B = 4, C = 64 → 8·10^6
    tokens, 31,250 updates.

    Returns:
        ``{"tokens": float, "updates": float, "batch_sequences": B, "context": C, "law": str}``.

    Raises:
        InductionLabError: ``batch_sequences`` or ``context`` below 1.
    """
    if int(batch_sequences) < 1 or int(context) < 1:
        raise InductionLabError(f"the emergence law needs B >= 1 sequences per update and C >= 1 tokens of "
                                f"context, got B = {batch_sequences}, C = {context}")
    bc = int(batch_sequences) * int(context)
    tokens = EMERGENCE_LAW_CONSTANT * math.sqrt(bc)
    return {"tokens": tokens, "updates": tokens / bc, "batch_sequences": int(batch_sequences),
            "context": int(context), "law": EMERGENCE_LAW_SOURCE}


def format_emergence(measured_tokens: int | None, measured_step: int | None, law: dict | None) -> str:
    """``"emergence 1,200,128 tokens (step 4,688); law predicts ≈ 8e+06 tokens (31,250 updates)"``
    ("none" when no checkpoint passed the threshold; the law part only when ``law`` is given)."""
    m = "none" if measured_tokens is None else f"{int(measured_tokens):,} tokens (step {int(measured_step):,})"
    if law is None:
        return f"emergence {m}"
    return f"emergence {m}; law predicts ≈ {law['tokens']:.2g} tokens ({law['updates']:,.0f} updates)"


def run_summary(heads: pd.DataFrame, evals: pd.DataFrame, threshold: float,
                summary: pd.DataFrame | None = None, *, batch_sequences: int | None = None,
                context: int | None = None) -> dict[str, Any]:
    """The run summary of a training run's telemetry: the one definition used by the trainer
    (``run.json`` results) and by ``inductionlab telemetry`` (``telemetry.json``).

    Args:
        heads, evals: :func:`read_telemetry` tables.
        threshold: induction score above which a head counts as an induction head.
        summary: :func:`summarize` of ``heads`` when already computed (else computed here).

        batch_sequences, context: the run's sequences per update B and context C; when both are
            given the summary adds ``"predicted_emergence"`` (:func:`predicted_emergence`), the
            law's tokens and updates, beside the measured emergence.

    Returns: ``{"emergence_step": step | None, "emergence_tokens": tokens | None,
    "induction_threshold": threshold, "final": {score: {"max", "top2pct_mean", "max_layer_head"}},
    "final_max_induction", "final_max_anti_induction", "final_heldout_ppl": float | None}``
    (scores are attention probabilities; "final" = the last checkpoint), plus
    ``"predicted_emergence"`` as above.
    """
    s = summarize(heads) if summary is None else summary
    em = emergence_step(s, threshold)
    last = s[s["step"] == s["step"].max()].set_index("score")
    final = {sc: {"max": float(last.loc[sc, "max"]), "top2pct_mean": float(last.loc[sc, "top2pct_mean"]),
                  "max_layer_head": [int(last.loc[sc, "max_layer"]), int(last.loc[sc, "max_head"])]}
             for sc in last.index}
    ppl = evals.sort_values("step")["heldout_ppl"].iloc[-1] if len(evals) else None
    return {"emergence_step": em,
            "emergence_tokens": None if em is None else int(s.loc[s["step"] == em, "tokens"].iloc[0]),
            "induction_threshold": float(threshold), "final": final,
            "final_max_induction": final["induction"]["max"],
            "final_max_anti_induction": final["anti_induction"]["max"],
            "final_heldout_ppl": None if ppl is None or pd.isna(ppl) else float(ppl),
            **({"predicted_emergence": predicted_emergence(batch_sequences, context)}
               if batch_sequences is not None and context is not None else {})}


def write_tables(run_dir: str | Path) -> None:
    """Rebuild the run-level telemetry tables (heads, eval, summary CSVs) from the checkpoints'
    telemetry.json, each written atomically."""
    from ..runtime.runs import atomic_write_text
    heads, evals = read_telemetry(run_dir)
    atomic_write_text(Path(run_dir) / "telemetry_heads.csv", heads.to_csv(index=False))
    atomic_write_text(Path(run_dir) / "telemetry_eval.csv", evals.to_csv(index=False))
    atomic_write_text(Path(run_dir) / "telemetry_summary.csv", summarize(heads).to_csv(index=False))


# ---- the trainer's component --------------------------------------------------------------------

class Telemetry:
    """Telemetry as a trainer component: which steps it measures and what it measures there.

    Args:
        cfg: the run's :class:`~inductionlab.train.TrainConfig` (telemetry_* fields, span length,
            eval_tokens, seq_len, seed, tokens_per_update).
        data: the run's :class:`~inductionlab.train.TrainData` (vocabulary, special ids, held-out split).
        schedule: checkpoint steps at which to measure.
        autocast_dtype: the training autocast dtype (held-out loss runs under it), or None.
    """

    def __init__(self, cfg, data, schedule, autocast_dtype: torch.dtype | None = None):
        self.cfg, self.data, self.amp = cfg, data, autocast_dtype
        self.schedule = frozenset(schedule)

    def should_measure(self, step: int) -> bool:
        """True at the scheduled checkpoints when telemetry is on (not at rolling resume points)."""
        return self.cfg.telemetry and step in self.schedule

    def measure(self, model, step: int) -> dict[str, Any]:
        """:func:`measure` of ``model`` (a full, unsharded copy) at ``step``; RNG streams untouched."""
        c, d = self.cfg, self.data
        tel = measure(model, vocab_size=d.vocab_size, special_ids=d.special_ids, bos_id=d.bos_id, sep_id=d.sep_id,
                      span_length=c.curriculum.span_length, seq_len=c.telemetry_seq_len,
                      batch_size=c.telemetry_batch, heldout=d.heldout, eval_seq_len=c.seq_len,
                      eval_tokens=c.eval_tokens, autocast_dtype=self.amp, seed=c.seed,
                      pool=getattr(d, "probe_pool", None))
        tel.update(step=step, tokens=step * c.tokens_per_update)
        return tel
