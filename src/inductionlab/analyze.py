"""The main job: find induction heads and run the lag probe with ablations (``inductionlab analyze``).

Phases: load the model → self-check the instrumentation → score every head (SPEC §3) → lag
probe intact, with the top-k induction heads ablated and with k random heads ablated
(outside the top N, several seeded draws) for each k (SPEC §4) → tables, plots, report.
Everything lands in one run directory, moved into place only when the run succeeds.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from . import plots
from .ablation import ablation_conditions, default_exclude_top_n, top_k_heads
from .errors import InductionLabError
from .instrument import self_check
from .lag_probe import LagProbeConfig, LagProbeResult, run_lag_probe
from .models import DEFAULT_MODEL, LoadedModel, load_model
from .runs import atomic_write_json, atomic_write_text, staged_run_dir, versions
from .scores import HeadScores, compute_head_scores


@dataclass
class AnalyzeConfig:
    """Parameters of the main job. Defaults are sized for ≤ 10 minutes on 2 CPU cores."""
    model: str = DEFAULT_MODEL
    dtype: str = "bfloat16"          # bf16 is 2–3× faster than fp32 on AMX CPUs; see README for the effect
    device: str = "cpu"
    seed: int = 0
    # head scores (SPEC §3)
    score_seq_len: int = 50
    score_batch_size: int = 16
    score_batches: int = 1
    top: int = 10                    # heads listed in the headline
    # ablations (SPEC §4)
    ks: tuple[int, ...] = (5, 10, 20)
    n_draws: int = 2                 # random-head draws per k
    exclude_top_n: int | None = None  # None: min(300, n_heads // 2)
    lag: LagProbeConfig = field(default_factory=lambda: LagProbeConfig(n_permutations=64))


@dataclass
class AnalyzeResult:
    loaded: LoadedModel
    scores: HeadScores
    lag: LagProbeResult
    timings: dict
    record: dict


def _bar(desc: str, total: int, disable: bool):
    unit = {"head scores": "seq", "lag probe": "trial"}.get(desc, "step")
    return tqdm(total=total, desc=f"{desc:<12s}", unit=unit, disable=disable, dynamic_ncols=True, leave=True)


def analyze(cfg: AnalyzeConfig, *, loaded: LoadedModel | None = None, progress: bool = True) -> AnalyzeResult:
    """Run the main job in memory (no files). See :func:`write_run` for the run directory.

    Raises:
        InductionLabError: unknown model, k larger than the heads available (or than those left
            outside the top N), word pool smaller than the list, list longer than the context.
    """
    cfg.lag.validate()                       # fail before the slow model load
    if any(k < 1 for k in cfg.ks):
        raise InductionLabError(f"--ks must be positive integers, got {list(cfg.ks)}")
    timings = {}
    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    if loaded is None:
        with _bar("load model", 1, not progress) as bar:
            loaded = load_model(cfg.model, dtype=cfg.dtype, device=cfg.device)
            bar.update(1)
    timings["load_s"] = time.perf_counter() - t0
    n_total = loaded.identity["n_layers"] * loaded.identity["n_heads"]
    N = default_exclude_top_n(n_total) if cfg.exclude_top_n is None else cfg.exclude_top_n
    for k in cfg.ks:
        if k > n_total:
            raise InductionLabError(f"k={k} heads requested but the model has {n_total}; use k <= {n_total}")
        if k > n_total - N:
            raise InductionLabError(f"k={k} random heads requested but only {n_total - N} remain outside the "
                                    f"top {N}; lower k or --exclude-top")
    if cfg.top > n_total:
        raise InductionLabError(f"--top {cfg.top} exceeds the model's {n_total} heads")

    t = time.perf_counter()
    device = next(loaded.model.parameters()).device
    check_ids = torch.randint(100, min(loaded.identity["vocab_size"], 1000), (1, 16)).to(device)
    check = self_check(loaded.model, check_ids, atol=1e-2 if cfg.dtype != "float32" else 1e-4)
    timings["self_check_s"] = time.perf_counter() - t

    t = time.perf_counter()
    n_seq = cfg.score_batch_size * cfg.score_batches
    with _bar("head scores", n_seq, not progress) as bar:
        hs = compute_head_scores(loaded.model, tokenizer=loaded.tokenizer, seq_len=cfg.score_seq_len,
                                 batch_size=cfg.score_batch_size, n_batches=cfg.score_batches, seed=cfg.seed,
                                 progress=bar.update)
    timings["head_scores_s"] = time.perf_counter() - t

    conditions = ablation_conditions(hs["induction"], cfg.ks, n_draws=cfg.n_draws, exclude_top_n=N, seed=cfg.seed)
    lag_cfg = LagProbeConfig(**{**asdict(cfg.lag), "seed": cfg.seed})
    t = time.perf_counter()
    with _bar("lag probe", lag_cfg.n_permutations * len(conditions), not progress) as bar:
        lag = run_lag_probe(loaded, conditions, lag_cfg, progress=bar.update)
    timings["lag_probe_s"] = time.perf_counter() - t
    timings["total_s"] = time.perf_counter() - t0

    top = top_k_heads(hs["induction"], cfg.top)
    params = asdict(cfg)
    params["exclude_top_n"] = N
    params["lag"] = asdict(lag_cfg)
    record = {
        "model": loaded.identity,
        "params": params,
        "versions": versions(),
        "self_check": check,
        "heads": {**{k: v.tolist() for k, v in hs.scores.items()}, "induction_loss": hs.induction_loss,
                  "score_params": hs.params},
        "top_induction_heads": [{"layer": l, "head": h, "score": float(hs["induction"][l, h])} for l, h in top],
        "lag_probe": lag.to_json(),
        "timings": timings,
    }
    return AnalyzeResult(loaded, hs, lag, timings, record)


def write_run(res: AnalyzeResult, out: str | Path, overwrite: bool = False) -> Path:
    """Write results.json, CSV tables, PNG plots and report.md into ``out`` (atomically as a whole)."""
    out = Path(out)
    with staged_run_dir(out, overwrite=overwrite) as d:
        t = time.perf_counter()
        hs = res.scores
        L, H = hs["induction"].shape
        heads = pd.DataFrame([{"layer": l, "head": h, **{n: float(v[l, h]) for n, v in hs.scores.items()}}
                              for l in range(L) for h in range(H)])
        heads.to_csv(d / "head_scores.csv", index=False)
        summary = res.lag.summary()
        summary.to_csv(d / "lag_curves.csv", index=False)
        headline = res.lag.headline()
        headline.to_csv(d / "lag_headline.csv", index=False)
        np.savez_compressed(d / "lag_trials.npz", **{f"probs/{k}": v for k, v in res.lag.probs.items()})
        name = res.loaded.identity["name"]
        plots.head_heatmaps(hs.scores, d / "head_scores.png", title=name)
        shown = ["intact"] + [c for c in summary["condition"].unique()
                              if c.startswith("induction-") or (c.startswith("random-") and "-d" not in c)]
        lc = res.record["params"]["lag"]
        sub = f"{lc['n_permutations']} trials/condition, {lc['method']} ablation, random = mean of draws"
        intact = headline[headline["condition"] == "intact"].iloc[0]
        plots.lag_curves(summary, d / "lag_curve.png", conditions=shown, title=f"{name}: lag probe\n{sub}",
                         chance=float(intact["list_mass"]) / lc["list_length"])
        plots.lag_curves(summary, d / "lag_curve_renorm.png", conditions=shown, column="mean_renorm",
                         title=f"{name}: lag probe, renormalised over the list\n{sub}", chance=1 / lc["list_length"])
        res.timings["write_s"] = time.perf_counter() - t
        atomic_write_json(d / "results.json", res.record)
        atomic_write_text(d / "report.md", report(res))
    return out


def _fmt_ci(m, lo, hi) -> str:
    return f"{m:.4f} [{lo:.4f}, {hi:.4f}]"


def report(res: AnalyzeResult) -> str:
    """A short Markdown report of the main job."""
    idn, cfg = res.record["model"], res.record["params"]
    hl = res.lag.headline()
    intact = hl[hl["condition"] == "intact"].iloc[0]
    summary = res.lag.summary()
    cur = summary[(summary["condition"] == "intact") & (summary["lag"] != 0)]
    peak = int(cur.loc[cur["mean"].idxmax(), "lag"])
    near = cur[cur["lag"].abs() <= 10]
    peak_near = int(near.loc[near["mean"].idxmax(), "lag"])
    chance = intact["list_mass"] / cfg["lag"]["list_length"]
    lines = [f"# inductionlab analyze — {idn['name']}", "",
             f"Model: `{idn['spec']}` ({idn['architecture']}, {idn['n_layers']} layers × {idn['n_heads']} query heads, "
             f"{idn['n_kv_heads']} KV heads, head_dim {idn['head_dim']}), dtype {idn['dtype']}.", "",
             "## Top induction heads", "", "| rank | layer | head | induction score |", "|---|---|---|---|"]
    for i, h in enumerate(res.record["top_induction_heads"], 1):
        lines.append(f"| {i} | {h['layer']} | {h['head']} | {h['score']:.3f} |")
    il = res.scores.induction_loss
    lines += ["", f"Induction loss: first copy {il['first_copy']:.2f} nats, second copy {il['second_copy']:.2f} nats.",
              "", "## Lag probe", "",
              f"{cfg['lag']['n_permutations']} trials per condition, list of {cfg['lag']['list_length']} words, cue at "
              f"position {cfg['lag']['cue_position']}, {cfg['lag']['method']} ablation. "
              "Probabilities are raw next-token probabilities; 95% CIs over trials.", "",
              "| condition | lag +1 | lag -1 | lag 0 | list mass |", "|---|---|---|---|---|"]
    for _, r in hl.iterrows():
        if r["kind"] == "random" and "mean" not in str(r["draw"]):
            continue
        lines.append(f"| {r['condition']} | {_fmt_ci(r['lag_plus1'], r['lag_plus1_ci_low'], r['lag_plus1_ci_high'])} | "
                     f"{_fmt_ci(r['lag_minus1'], r['lag_minus1_ci_low'], r['lag_minus1_ci_high'])} | "
                     f"{r['lag0']:.4f} | {r['list_mass']:.3f} |")
    above = intact["lag_plus1_ci_low"] > chance
    if peak_near == 1 and above:
        verdict = "Intact model shows a lag +1 peak"
    elif peak_near == 1:
        verdict = ("Intact model: lag +1 is the highest lag within ±10, but its CI includes the even-spread "
                   "value, so this is **no** clear lag +1 peak")
    else:
        verdict = f"Intact model shows **no** lag +1 peak: the highest lag within ±10 is {peak_near:+d}"
    lines += ["", f"{verdict}. Lag +1 = {intact['lag_plus1']:.4f} [{intact['lag_plus1_ci_low']:.4f}, "
              f"{intact['lag_plus1_ci_high']:.4f}] vs {chance:.4f} if the list mass were spread evenly over the list; "
              f"the highest lag over all lags is {peak:+d} (one word per lag and trial, so single lags are noisy).", "",
              "Induction vs random ablation at lag +1 (paired over the same trials; random = mean of draws):", "",
              "| k | induction-k | random-k | random − induction [95% CI] |", "|---|---|---|---|"]
    for _, r in res.lag.contrasts(1).iterrows():
        lines.append(f"| {int(r['k'])} | {r['induction']:.4f} | {r['random']:.4f} | "
                     f"{r['random_minus_induction']:+.4f} [{r['ci_low']:+.4f}, {r['ci_high']:+.4f}] |")
    lines += ["",
              "Random rows pool the draws (per-trial mean over draws); per-draw rows are in `lag_headline.csv`.", "",
              "## Timings", ""]
    lines += [f"- {k.removesuffix('_s')}: {v:.1f} s" for k, v in res.timings.items()]
    lines += ["", "Files: `results.json` (everything, incl. parameters and versions), `head_scores.csv`, "
              "`lag_curves.csv`, `lag_headline.csv`, `lag_trials.npz`, `head_scores.png`, `lag_curve.png`, "
              "`lag_curve_renorm.png`.", ""]
    return "\n".join(lines)
