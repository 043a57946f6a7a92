"""The token-loss ICL score under ablation (issue 34), the protocol shared by ``study head-types`` (claim Y2) and
``study routes`` (claim R3): natural-text windows, a probe that keeps every position's loss from ``⌈0.8·early⌉``
to ``⌊1.2·late⌋`` (where the window holds it) and reduces each window to the log-slope benefit D, the band
benefit B and Olsson's single-token benefit (:mod:`inductionlab.measures.token_loss`), and the pilot that sizes
the number of windows (:mod:`inductionlab.measures.power`).

**Windows** (:func:`text_windows`; recorded as :func:`window_construction`): from the demo corpus, one window per
draw at a random character offset inside one work (the first partial word dropped; a BOS prepended): windows start
mid-document and hold no document boundary; from a ``.txt`` file, consecutive non-overlapping windows from its
start. Neither is Yin & Steinhardt's construction (Pile rows concatenated with EOS and cut every 1,023 tokens, so
rows start mid-document and may cross a boundary) nor Ji-An et al.'s (the first tokens of C4 documents of at least
512 tokens); :func:`~inductionlab.protocols.icl_score.heldout_windows` gives Ji-An's document starts.

**Ablation**: Yin's ``head_ablation_hook`` as their code runs it writes the random run's position-0 (BOS) value
at every position, which equals the ``sink`` cut on a BOS-prefixed window (tests/test_yin_port.py); so ``sink`` is
the default, ``resample`` (a random-token output per position) a sensitivity arm.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ..errors import InductionLabError
from ..measures import token_loss as TL
from ..measures.power import sample_size
from . import icl_score
from .configs import TokenLossConfig
from .runner import Probe, Trials

MEASURES = ("slope", "band", "single")


def positions(model, cfg: TokenLossConfig) -> tuple[int, int, int]:
    """``(length, late, early)``: the window's tokens and the (scaled) token indices for ``model``: ``late``
    and ``early`` as :func:`~inductionlab.protocols.icl_score.icl_positions` (scaled down where the model's
    context is shorter than ``late + 1``); ``length = ⌊1.2·late⌋ + 1`` with ``cfg.bands`` (capped by the
    context), else ``late + 1``."""
    ctx = icl_score.model_context(model)
    late, early = icl_score.icl_positions(min(cfg.late + 1, ctx or cfg.late + 1), cfg.late, cfg.early)
    length = TL.band(late)[1] + 1 if cfg.bands else late + 1
    return (min(length, ctx) if ctx else length), late, early


def window_construction(cfg: TokenLossConfig) -> str:
    """The windows' construction in words, for results.json (module docstring)."""
    if cfg.text == "demo":
        return ("demo corpus: one window per draw at a random character offset inside one work (seed_for(seed, 11)), "
                "first partial word dropped, BOS prepended: mid-document starts, no document boundary inside a window "
                "(neither Yin's concatenated Pile rows nor Ji-An's document-start C4 windows)")
    return (f"{cfg.text}: consecutive non-overlapping windows from the file's start, BOS prepended (one document; "
            "only the first window starts at its beginning; neither Yin's concatenated rows nor Ji-An's document "
            "starts)")


def _demo_works(length: int) -> list[str]:
    """The demo corpus's works long enough for a window of ``length`` tokens at a drawn offset: at least
    ``23 × length`` characters (the offset lies in [10 %, len − 20·length) and the window's text is read from
    12·length characters; a short poem of the corpus is otherwise drawn and cannot fill a window)."""
    from ..data.corpus import demo_texts
    works = [t for _, t in demo_texts() if len(t) >= 23 * length]
    if not works:
        raise InductionLabError(f"no work of the demo corpus is long enough for windows of {length} tokens; lower "
                                "--icl-late or give --icl-text FILE")
    return works


def text_windows(loaded, cfg: TokenLossConfig, length: int, n: int, seed: int) -> torch.Tensor:
    """``[n, length]`` windows of natural text: from the demo corpus (one window per work long enough, works and character
    offsets drawn with ``seed``) or a text file (consecutive windows from the start, the first ``n``). A BOS is
    prepended when the tokenizer has one.

    Raises:
        InductionLabError: the demo corpus is not installed (the message gives the command), the file is
            missing or too short for the windows."""
    tok = loaded.tokenizer
    bos = tok.bos_token_id
    if cfg.text == "demo":
        return _demo_windows(tok, _demo_works(length), length, n, seed)
    w = _file_windows(loaded, cfg, length)
    if len(w) < n:
        raise InductionLabError(f"--icl-text {cfg.text} gives {len(w)} windows of {length} tokens, fewer than "
                                f"--icl-sequences {n}; give a longer text or fewer sequences")
    return w[:n]


def _demo_windows(tok, works: list[str], length: int, n: int, seed: int) -> torch.Tensor:
    """``[n, length]`` windows of the demo corpus's ``works`` (:func:`text_windows`): works drawn with ``seed`` (each
    once while ``n`` <= works), a character offset in each. A work whose text at the drawn offset holds fewer
    tokens than a window under this tokenizer (12 characters per token assumed; a tokenizer of a larger vocabulary
    packs more) is skipped and another drawn in its place, so the windows are those of the fixed construction
    whenever no work is skipped.

    Raises:
        InductionLabError: fewer works fill a window than the windows need (without reuse), or none does."""
    bos = tok.bos_token_id
    body = length - (bos is not None)
    rng = np.random.default_rng(seed)
    reuse = n > len(works)
    queue = [int(i) for i in rng.choice(len(works), size=n, replace=reuse)]
    skipped: set[int] = set()
    used = set(queue)
    rows = []
    while queue:
        i = queue.pop(0)
        text = works[i]
        start = int(rng.integers(len(text) // 10, max(len(text) // 10 + 1, len(text) - 20 * length)))
        ids = tok.encode(text[start:start + 12 * length], add_special_tokens=False)[1:]   # [1:]: a cut word
        if len(ids) >= body:
            rows.append(([bos] if bos is not None else []) + ids[:body])
            continue
        skipped.add(i)                                        # too few tokens here: draw another work instead
        left = [j for j in range(len(works)) if j not in skipped and (reuse or j not in used)]
        if not left:
            fit = len(works) - len(skipped)
            raise InductionLabError(f"only {fit} of the demo corpus's {len(works)} long works fill a window of "
                                    f"{length} tokens with this tokenizer, fewer than the {n} windows needed; lower "
                                    "--icl-sequences or --icl-late, or give --icl-text FILE")
        j = int(left[int(rng.integers(len(left)))])
        used.add(j)
        queue.insert(0, j)
    return torch.tensor(rows, dtype=torch.long)


def _file_windows(loaded, cfg: TokenLossConfig, length: int) -> torch.Tensor:
    from ..data.corpus import read_text
    path = Path(cfg.text)
    if not path.is_file():
        raise InductionLabError(f"--icl-text {cfg.text}: no such file; give a .txt file or 'demo' (make corpus)")
    return icl_score.text_windows(loaded.tokenizer, read_text(path), length, bos_id=loaded.tokenizer.bos_token_id)


def text_sha256(cfg: TokenLossConfig) -> str | None:
    """The SHA-256 of the ``--icl-text`` file's bytes (None for ``demo``): recorded in a run's params, so a resume after
    the file changed in place is refused instead of measuring windows of two texts.

    Raises:
        InductionLabError: the file is missing; OSError: it cannot be read."""
    import hashlib

    if cfg.text == "demo":
        return None
    path = Path(cfg.text)
    if not path.is_file():
        raise InductionLabError(f"--icl-text {cfg.text}: no such file; give a .txt file or 'demo' (make corpus)")
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def available_windows(loaded, cfg: TokenLossConfig, length: int) -> int:
    """Windows of ``length`` tokens the text provides without overlap: a file's count exactly; the demo corpus's
    estimated as Σ over works of (0.9 × its characters) / (characters per token × length), characters per token
    measured on the first work's first 20,000 characters."""
    if cfg.text != "demo":
        return len(_file_windows(loaded, cfg, length))
    works = _demo_works(length)
    sample = works[0][:20000]
    cpt = len(sample) / max(1, len(loaded.tokenizer.encode(sample, add_special_tokens=False)))
    return int(sum(max(1, int(0.9 * len(w) / (cpt * length))) for w in works))


def measure(model, batch: dict[str, torch.Tensor], positions, early: int, late: int) -> dict[str, torch.Tensor]:
    """One batch of windows ``ids`` ``[b, T]``: ``nll`` float32 ``[b, P]`` at token indices ``positions`` (nats;
    the LM head run there only, :func:`~inductionlab.protocols.icl_score.measure_at`) and per window ``slope`` (D),
    ``band`` (B, NaN where the window stops before ``⌊1.2·late⌋``) and ``single`` (``ℓ_early − ℓ_late``), float64
    ``[b]``, with ``loss_early`` and ``loss_late``."""
    nll = icl_score.measure_at(model, batch, positions)["nll"]
    got = TL.benefits(nll.cpu().numpy(), positions, early, late)
    return {"nll": nll.float(), **{m: torch.as_tensor(got[m]) for m in (*MEASURES, "loss_early", "loss_late")}}


def probe(windows: torch.Tensor, cfg: TokenLossConfig, early: int, late: int, method: str | None = None) -> Probe:
    """The token-loss probe over ``windows`` ``[n, T]`` (:func:`measure` from ``⌈0.8·early⌉`` to ``⌊1.2·late⌋`` or
    ``late``), under ``method`` (default ``cfg.method``)."""
    first, last = TL.measured_range(early, late, windows.shape[1])
    return Probe.of_trials("token-loss ICL score", Trials({"ids": windows}),
                           partial(measure, positions=tuple(range(first, last + 1)), early=early, late=late),
                           batch_size=cfg.batch_size, method=method or cfg.method)


def run_pilot(loaded, pr: Probe, conditions) -> dict[str, np.ndarray]:
    """The pilot: ``pr`` under ``conditions`` (intact, then the claim's ablation), timed. Returns
    ``{"<condition index>_<measure>": [P]}`` for slope, band, single, and ``seconds`` ``[1]`` (wall seconds of the
    pilot, all conditions)."""
    t0 = time.perf_counter()
    got = pr.run(loaded, conditions)
    out = {f"{i}_{m}": got[c.name][m] for i, c in enumerate(conditions) for m in MEASURES}
    return out | {"seconds": np.array([time.perf_counter() - t0])}


def _sd(x) -> float:
    x = np.asarray(x, np.float64)
    x = x[np.isfinite(x)]
    return float(x.std(ddof=1)) if len(x) > 1 else float("nan")


def choose_n(pilot: dict, cfg: TokenLossConfig, conditions: int, available: int | None) -> dict:
    """The n of the confirmatory run from the pilot (:func:`run_pilot`: intact = 0, the claim's ablation = 1): the
    claim's statistic is a paired difference of D, so n = ⌈(1.96·σ/h)²⌉ with σ the pilot's SD of the paired
    difference of D (ablated − intact), taken at its 80% upper confidence limit
    (:func:`~inductionlab.measures.power.planning_sigma`, Browne 1995), and h = ``cfg.half_width``; at least the windows
    the gate needs ("the intact model gains from context": its D's CI above 0 with 80% power at the pilot's intact
    mean's one-sided 80% lower limit, :func:`~inductionlab.measures.power.planning_effect`, where that mean is > 0;
    :func:`~inductionlab.measures.power.n_to_decide`); capped by ``cfg.budget_minutes`` over ``conditions`` and by
    ``available`` windows (:func:`~inductionlab.measures.power.sample_size`).

    Returns: JSON-able ``{"sample_size": SampleSize.to_dict(), "sentence", "sigma_used", "pilot": {"n", "seconds",
    "seconds_per_window_condition", "sigma": {"intact_slope", "intact_band", "intact_single", "paired_slope",
    "paired_band", "paired_single"}, "mean": {...}}}``."""
    from ..measures.power import n_to_decide, planning_effect, planning_sigma
    p = len(pilot["0_slope"])
    per = float(pilot["seconds"][0]) / (2 * p)
    sig = {f"intact_{m}": _sd(pilot[f"0_{m}"]) for m in MEASURES}
    sig |= {f"paired_{m}": _sd(pilot[f"1_{m}"] - pilot[f"0_{m}"]) for m in MEASURES}
    mean = {f"intact_{m}": float(np.nanmean(pilot[f"0_{m}"])) if np.isfinite(pilot[f"0_{m}"]).any() else None
            for m in MEASURES}
    m0 = mean["intact_slope"] or 0.0
    planned = {"intact_sigma": planning_sigma(sig["intact_slope"], p),
               "intact_mean": planning_effect(m0, sig["intact_slope"], p),
               "paired_sigma": planning_sigma(sig["paired_slope"], p)}
    gate = n_to_decide(planned["intact_sigma"], planned["intact_mean"]) if m0 > 0 else None
    sigma = planned["paired_sigma"] if np.isfinite(planned["paired_sigma"]) else 0.0
    size = sample_size(sigma, cfg.half_width, budget_minutes=cfg.budget_minutes, seconds_per_trial_condition=per,
                       conditions=conditions, available=available,
                       gate_n=None if gate is None or not np.isfinite(gate) else int(gate))
    clean = {k: (None if not np.isfinite(v) else v) for k, v in sig.items()}
    return {"sample_size": size.to_dict(), "sentence": size.sentence(),
            "sigma_used": "SD of the paired difference of D (ablated − intact); at least the gate's n (intact D's CI "
                          "above 0 with 80% power at the pilot's intact mean, when that mean is > 0); both planned "
                          "conservatively: each σ at its 80% upper confidence limit (Browne 1995), the intact mean at "
                          "its one-sided 80% lower limit (at least half the mean)",
            "planned": {k: (None if not np.isfinite(v) else v) for k, v in planned.items()},
            "pilot": {"n": p, "seconds": float(pilot["seconds"][0]), "seconds_per_window_condition": per,
                      "sigma": clean, "mean": mean}}


def window_table(arrays: dict[str, dict[str, np.ndarray]]) -> pd.DataFrame:
    """Per window and condition: ``loss_early``, ``loss_late`` (nats), ``benefit`` (single-token, early − late),
    ``slope`` (D), ``band`` (B). ``arrays``: condition -> the probe's arrays (:func:`measure`)."""
    out = []
    for name, a in arrays.items():
        n = len(a["slope"])
        out.append(pd.DataFrame({"condition": name, "sequence": np.arange(n),
                                 "loss_early": a["loss_early"].astype(np.float64),
                                 "loss_late": a["loss_late"].astype(np.float64),
                                 "benefit": a["single"].astype(np.float64), "slope": a["slope"].astype(np.float64),
                                 "band": a["band"].astype(np.float64)}))
    return pd.concat(out, ignore_index=True)


__all__ = ["TokenLossConfig", "MEASURES", "positions", "window_construction", "text_windows", "available_windows",
           "measure", "probe", "run_pilot", "choose_n", "window_table"]
