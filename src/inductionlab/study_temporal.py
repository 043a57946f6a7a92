"""The temporal-dependencies study (``inductionlab study temporal``): the whole experimental
design of protocol T (SPEC §4–§5) on one model, resumable, with one report.

Phases, each checkpointed in ``<out>/checkpoints/`` as soon as it finishes (atomic writes, so an
interrupted or killed run never leaves a half-written file and a re-run with the same ``--out``
continues from the finished pieces):

1. head scores (SPEC §3) → ``scores.json``;
2. for every condition — intact; top-k induction heads ablated; k random heads outside the top N
   (``n_draws`` seeded draws), for each k — the lag probe (``lag/<condition>.npz``) and few-shot
   serial recall (``recall/<condition>.npz``);
3. the per-head load-bearing map: each of the top-N induction heads ablated alone, lag probe on
   the first ``load_bearing_permutations`` trials (``single/<condition>.npz``) and serial recall
   (``single_recall/<condition>.npz``).

Then ``results.json``, ``tables/*.csv``, ``plots/*.png`` and ``report.md`` are written, stating
each claim of the temporal-dependencies paper on this model as reproduced / not reproduced:

(a) the lag curve peaks at lag +1;
(b) ablating the top-k induction heads lowers p(lag +1) far more than ablating k random heads;
(c) random ablation leaves p(lag +1) intact or raises it;
(d) serial recall suffers more under induction ablation than under random ablation.

Decision rules (this project's; the paper states the claims without tests) are in
:func:`verdicts`. All CIs are 95%, normal approximation over trials; differences between
conditions are paired (every condition sees the same trials).
"""

from __future__ import annotations

import io
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from . import plots
from .ablation import Condition, ablation_conditions, default_exclude_top_n
from .crp import lag_probe_crp
from .errors import InductionLabError
from .lag_probe import LagProbeConfig, LagProbeResult, _mean_ci, run_lag_probe
from .load_bearing import concentration, load_bearing_table, plot_concentration, plot_load_bearing, \
    single_head_conditions
from .models import LoadedModel
from .runs import atomic_write_bytes, atomic_write_json, atomic_write_text, versions
from .scores import HeadScores, compute_head_scores
from .serial_recall import SerialRecallConfig, SerialRecallResult, run_serial_recall

PAPER_KS = (10, 20, 50, 100)   # SPEC §4: the seed protocol's k list (models of ~1,000 heads)
FALLBACK_FRACTIONS = (0.05, 0.1, 0.2, 0.35)


def default_ks(n_total: int, exclude_top_n: int | None = None) -> list[int]:
    """The k list scaled to the model (decision, SPEC §4 "clipped to what the model has").

    The paper's k ∈ {10, 20, 50, 100} are kept while k ≤ 75% of the heads left for random draws
    (``n_total − N``, so random draws still differ); if fewer than three survive, k is instead
    5%, 10%, 20%, 35% of all heads (rounded, ≥ 1, same cap). SmolLM2 (270 heads, N = 135):
    10, 20, 50, 100. Gemma 3 270M (72 heads, N = 36): 4, 7, 14, 25 → capped at 27.
    """
    N = default_exclude_top_n(n_total) if exclude_top_n is None else exclude_top_n
    cap = max(1, int(0.75 * (n_total - N)))
    ks = [k for k in PAPER_KS if k <= cap]
    if len(ks) < 3:
        ks = sorted({min(cap, max(1, round(f * n_total))) for f in FALLBACK_FRACTIONS})
    return ks


@dataclass
class TemporalStudyConfig:
    """Parameters of the study. Protocol defaults are the papers' (SPEC §4–§5); sizes are CPU
    defaults (the seed protocol used 5,000 permutations; see README for GPU settings)."""
    method: str = "zero"                    # ablation: zero (paper: attention scores −∞) | mean | sink
    ks: list[int] | None = None             # None: default_ks(n_heads_total)
    n_draws: int = 3                        # random-head draws per k
    exclude_top_n: int | None = None        # None: min(300, n_heads_total // 2) (SPEC §4)
    seed: int = 0
    # lag probe (SPEC §4)
    n_permutations: int = 64                # seed protocol: 5,000
    list_length: int = 500
    cue_position: int = 250
    # serial recall (SPEC §5)
    recall_trials: int = 64
    recall_list_length: int = 14
    n_shots: int = 3
    generate: bool = True
    # per-head load-bearing map
    load_bearing_top: int = 10              # 0 disables
    load_bearing_permutations: int | None = None   # None: n_permutations (first trials of the probe)
    # head scores (SPEC §3)
    score_seq_len: int = 50
    score_batch_size: int = 16
    batch_size: int | None = None           # None: from free GPU memory (CPU: 8)


def auto_batch_size(loaded: LoadedModel, seq_len: int, logit_positions: int = 1, cap: int = 64) -> int:
    """Trials per forward pass from free accelerator memory (CPU: 8).

    Heuristic (inference, no gradients): per sequence ≈ seq_len × (24·hidden + 4·heads·head_dim)
    activations in the model dtype, plus one eager attention map heads × seq_len² in float32
    (needed by ``sink`` / reductions), plus ``logit_positions`` × vocab float32 logits ×3
    (logits, softmax, gather). Uses half of the smallest free memory over the devices the model
    occupies.
    """
    params = list(loaded.model.parameters())
    devs = {p.device for p in params if p.device.type == "cuda"}
    if not devs:
        return 8
    free = min(torch.cuda.mem_get_info(d)[0] for d in devs)
    s = loaded.identity
    nbytes = params[0].element_size()
    per = (seq_len * (24 * s["hidden_size"] + 4 * s["n_heads"] * s["head_dim"]) * nbytes
           + s["n_heads"] * seq_len ** 2 * 4 + logit_positions * s["vocab_size"] * 4 * 3)
    return int(max(1, min(cap, 0.5 * free // per)))


# -- checkpoints ------------------------------------------------------------------------
class Checkpoints:
    """Per-piece checkpoint files under ``<out>/checkpoints`` (npz / json, written atomically)."""

    def __init__(self, out: Path):
        self.dir = Path(out) / "checkpoints"

    def _path(self, key: str, ext: str) -> Path:
        return self.dir / f"{key}.{ext}"

    def load_npz(self, key: str) -> dict[str, np.ndarray] | None:
        p = self._path(key, "npz")
        if not p.exists():
            return None
        try:
            with np.load(p, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
        except (OSError, ValueError) as e:
            raise InductionLabError(f"checkpoint {p} is corrupt ({e}); delete it and re-run to recompute it") from e

    def save_npz(self, key: str, arrays: dict[str, np.ndarray]) -> None:
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        atomic_write_bytes(self._path(key, "npz"), buf.getvalue())


def _check_params(out: Path, params: dict) -> bool:
    """Write ``study.json`` (new study) or check it matches (resume). Returns True when resuming."""
    path = out / "study.json"
    params = json.loads(json.dumps(params))
    if path.exists():
        try:
            old = json.loads(path.read_text())["params"]
        except (OSError, ValueError, KeyError) as e:
            raise InductionLabError(f"{path} is corrupt ({e}); use a new --out or --overwrite") from e
        if old != params:
            diff = sorted(k for k in set(old) | set(params) if old.get(k) != params.get(k))
            raise InductionLabError(f"{out} holds a study with different parameters ({', '.join(diff)}); "
                                    "use a new --out, the same options, or --overwrite")
        return True
    if out.exists() and any(p.name != "checkpoints" for p in out.iterdir()):
        raise InductionLabError(f"output directory {out} exists and is not a study run; use a new --out or --overwrite")
    atomic_write_json(path, {"kind": "study-temporal", "params": params})
    return False


# -- the study ----------------------------------------------------------------------------
@dataclass
class TemporalStudy:
    """Everything a finished study computed (also written to the run directory)."""
    loaded: LoadedModel
    config: TemporalStudyConfig
    scores: HeadScores
    conditions: list[Condition]
    lag: LagProbeResult
    recall: SerialRecallResult
    load_bearing: pd.DataFrame | None
    concentration: dict[str, dict] | None
    headline: pd.DataFrame
    verdicts: list[dict]
    record: dict
    timings: dict = field(default_factory=dict)


def run_temporal_study(loaded: LoadedModel, cfg: TemporalStudyConfig, out: str | Path, *, progress: bool = True,
                       on_checkpoint=None) -> TemporalStudy:
    """Run (or resume) the study and write the run directory ``out``.

    Args:
        loaded: the model (:func:`inductionlab.models.load_model`).
        out: run directory. If it holds checkpoints of a study with the same parameters and
            model, finished pieces are loaded instead of recomputed.
        on_checkpoint: optional callable(key) called after each checkpoint is written.

    Returns: :class:`TemporalStudy`.

    Raises:
        InductionLabError: ``out`` holds another study or other files; k larger than the heads
            available; pool / context too small (see the lag probe and serial recall); unknown method.
    """
    t_start = time.perf_counter()
    out = Path(out)
    if cfg.method not in ("zero", "mean", "sink"):
        raise InductionLabError(f"unknown ablation method {cfg.method!r}; use zero, mean or sink")
    ident = loaded.identity
    n_total = ident["n_layers"] * ident["n_heads"]
    N = default_exclude_top_n(n_total) if cfg.exclude_top_n is None else int(cfg.exclude_top_n)
    ks = sorted(set(int(k) for k in cfg.ks)) if cfg.ks else default_ks(n_total, N)
    for k in ks:
        if not 1 <= k <= n_total - N:
            raise InductionLabError(f"k={k}: must be between 1 and the {n_total - N} heads left outside the top "
                                    f"{N} for random draws; lower k or --exclude-top-n")
    lb_n = cfg.load_bearing_permutations or cfg.n_permutations
    if lb_n > cfg.n_permutations:
        raise InductionLabError(f"load_bearing_permutations={lb_n} exceeds n_permutations={cfg.n_permutations}; "
                                "the per-head map reuses the first trials of the lag probe")
    lag_bs = cfg.batch_size or auto_batch_size(loaded, cfg.list_length + 4)
    rec_bs = cfg.batch_size or auto_batch_size(loaded, (cfg.n_shots + 1) * (2 * cfg.recall_list_length + 4),
                                               cfg.recall_list_length)
    lag_cfg = LagProbeConfig(list_length=cfg.list_length, cue_position=cfg.cue_position,
                             n_permutations=cfg.n_permutations, batch_size=lag_bs, seed=cfg.seed, method=cfg.method)
    rec_cfg = SerialRecallConfig(list_length=cfg.recall_list_length, n_shots=cfg.n_shots, n_trials=cfg.recall_trials,
                                 batch_size=rec_bs, seed=cfg.seed, generate=cfg.generate, method=cfg.method)
    identity = {k: v for k, v in ident.items() if k not in ("device",)}
    params = {"config": asdict(cfg), "ks": ks, "exclude_top_n": N, "lag_probe": asdict(lag_cfg),
              "serial_recall": asdict(rec_cfg), "load_bearing_permutations": lb_n, "model": identity}
    # batch sizes change nothing but speed: not part of the identity of a study
    for block in ("lag_probe", "serial_recall"):
        params[block] = {k: v for k, v in params[block].items() if k != "batch_size"}
    params["config"] = {k: v for k, v in params["config"].items() if k != "batch_size"}
    out.mkdir(parents=True, exist_ok=True)
    resumed = _check_params(out, params)
    ck = Checkpoints(out)
    timings: dict[str, float] = {}

    def saved(key):
        if on_checkpoint is not None:
            on_checkpoint(key)

    # 1. head scores
    t = time.perf_counter()
    sp = ck.dir / "scores.json"
    if sp.exists():
        raw = json.loads(sp.read_text())
        hs = HeadScores({k: np.asarray(v) for k, v in raw["scores"].items()}, raw["induction_loss"], raw["params"])
    else:
        with tqdm(total=cfg.score_batch_size, desc="head scores", disable=not progress) as bar:
            hs = compute_head_scores(loaded.model, tokenizer=loaded.tokenizer, seq_len=cfg.score_seq_len,
                                     batch_size=cfg.score_batch_size, seed=cfg.seed, progress=bar.update)
        atomic_write_json(sp, {"scores": hs.scores, "induction_loss": hs.induction_loss, "params": hs.params})
        saved("scores")
    timings["head_scores_s"] = time.perf_counter() - t
    induction = hs["induction"]
    conditions = ablation_conditions(induction, ks, n_draws=cfg.n_draws, exclude_top_n=N, seed=cfg.seed)
    singles = single_head_conditions(induction, cfg.load_bearing_top) if cfg.load_bearing_top > 0 else []

    # 2–3. conditions
    todo = [("lag", c) for c in conditions] + [("recall", c) for c in conditions] + \
        [("single", c) for c in singles] + [("single_recall", c) for c in singles]
    sizes = {"lag": cfg.n_permutations, "recall": cfg.recall_trials, "single": lb_n, "single_recall": cfg.recall_trials}
    pending = [(ph, c) for ph, c in todo if not ck._path(f"{ph}/{c.name}", "npz").exists()]
    parts: dict[str, dict[str, dict]] = {ph: {} for ph in sizes}
    words: dict[str, list[str]] = {}
    with tqdm(total=sum(sizes[ph] for ph, _ in pending), desc="conditions", unit="trial", disable=not progress) as bar:
        for phase, c in todo:
            key = f"{phase}/{c.name}"
            t = time.perf_counter()
            arrays = ck.load_npz(key)
            if arrays is None:
                bar.set_postfix_str(key)
                if phase in ("recall", "single_recall"):
                    r = run_serial_recall(loaded, [c], rec_cfg, progress=bar.update)
                    arrays = {**r.data[c.name], "words": np.asarray(r.words)}
                else:
                    pc = lag_cfg if phase == "lag" else LagProbeConfig(**{**asdict(lag_cfg), "n_permutations": lb_n})
                    r = run_lag_probe(loaded, [c], pc, progress=bar.update)
                    arrays = {"probs": r.probs[c.name], "list_mass": r.list_mass[c.name],
                              "argmax_lag": r.argmax_lag[c.name], "words": np.asarray(r.words)}
                ck.save_npz(key, arrays)
                saved(key)
                timings[f"{phase}_s"] = timings.get(f"{phase}_s", 0.0) + time.perf_counter() - t
            words[phase] = [str(w) for w in arrays.pop("words")]
            parts[phase][c.name] = arrays
    lag_parts, rec_parts = parts["lag"], parts["recall"]

    lag = LagProbeResult({n: a["probs"] for n, a in lag_parts.items()}, {n: a["list_mass"] for n, a in lag_parts.items()},
                         {n: a["argmax_lag"] for n, a in lag_parts.items()}, conditions, lag_cfg, words["lag"])
    recall = SerialRecallResult(rec_parts, conditions, rec_cfg, words["recall"])
    col = cfg.cue_position  # column of lag +1 (0-based index cue_position)
    lb_table = conc = None
    if singles:
        single_rec = SerialRecallResult(parts["single_recall"], singles, rec_cfg)
        rec_intact = recall.trial_measures("intact")
        intact = {"lag_plus1": lag.probs["intact"][:lb_n, col], "recall_lag_plus1": rec_intact["lag_plus1"],
                  "recall_accuracy": rec_intact["accuracy"]}
        single = {c.name: {"lag_plus1": parts["single"][c.name]["probs"][:, col],
                           **{f"recall_{k}": v for k, v in single_rec.trial_measures(c.name).items()
                              if k in ("lag_plus1", "accuracy")}} for c in singles}
        lb_table = load_bearing_table(induction, singles, intact, single)
        conc = {m: concentration(lb_table, m) for m in intact}
    head = headline_table(lag, recall, ks)
    verd = verdicts(lag, recall, head, ks)
    record = {
        "kind": "study-temporal", "model": identity, "params": params, "versions": versions(),
        "seeds": {"study": cfg.seed, "lag_probe_trials": "seed_for(seed, trial)",
                  "serial_recall_trials": "seed_for(seed, 7, trial)", "random_draws": "seed_for(seed, k, draw)"},
        "head_scores": {**hs.to_dict(), "params": hs.params},
        "conditions": [c.to_dict() for c in conditions],
        "headline": head.to_dict(orient="records"),
        "verdicts": verd,
        "lag_probe": lag.to_json(),
        "lag_crp_argmax": _crp_block(lag_probe_crp(lag)),
        "serial_recall": recall.to_json(),
        "load_bearing": None if lb_table is None else {"table": lb_table.to_dict(orient="records"),
                                                       "concentration": conc, "n_trials": lb_n},
    }
    t = time.perf_counter()
    write_outputs(out, loaded, hs, lag, recall, lb_table, conc, head, verd, record, ks)
    timings["write_s"] = time.perf_counter() - t
    timings["total_s"] = time.perf_counter() - t_start
    atomic_write_json(out / "timing.json", {"resumed": resumed, "this_session_s": timings})
    return TemporalStudy(loaded, cfg, hs, conditions, lag, recall, lb_table, conc, head, verd, record, timings)


def _crp_block(crp: pd.DataFrame, window: int = 10) -> dict:
    """CRP of arg-max responses near the cue, per condition (full table in tables/lag_crp_argmax.csv)."""
    near = crp[crp.lag.abs() <= window]
    return {name: {"n_transitions": int(d.n_transitions.iloc[0]),
                   "crp": {int(r.lag): (None if math.isnan(r.prob) else float(r.prob)) for r in d.itertuples()}}
            for name, d in near.groupby("condition", sort=False)}


# -- headline and verdicts ------------------------------------------------------------------
def _per_trial(lag: LagProbeResult, recall: SerialRecallResult, kind: str, k: int) -> dict[str, np.ndarray]:
    """Per-trial measures of one arm (intact, induction-k, or random-k pooled over draws)."""
    if kind == "intact":
        names = ["intact"]
    elif kind == "induction":
        names = [f"induction-{k}"]
    else:
        names = [c.name for c in lag.conditions if c.kind == "random" and c.k == k]
    col = lag.config.cue_position
    out = {"lag_plus1": np.mean([lag.probs[n][:, col] for n in names], axis=0).astype(np.float64)}
    out.update({f"recall_{m}": v for m, v in recall.pooled_measures(names).items()})
    return out


def _ci(v: np.ndarray) -> tuple[float, float, float]:
    m, half = _mean_ci(np.asarray(v, np.float64))
    return float(m), float(m - half), float(m + half)


MEASURES = {"lag_plus1": "lag probe p(lag +1)", "recall_accuracy": "serial recall accuracy (teacher-forced)",
            "recall_lag_plus1": "serial recall p(lag +1) (renormalised)", "recall_exact_match": "serial recall exact match"}


def headline_table(lag: LagProbeResult, recall: SerialRecallResult, ks: list[int]) -> pd.DataFrame:
    """One row per (measure, k): intact / induction-k / random-k (pooled draws) means with 95% CIs,
    and paired differences induction − intact, random − intact, random − induction."""
    rows = []
    intact = _per_trial(lag, recall, "intact", 0)
    for k in ks:
        ind, rnd = _per_trial(lag, recall, "induction", k), _per_trial(lag, recall, "random", k)
        for m in MEASURES:
            if m not in intact:
                continue
            row = {"measure": m, "k": k}
            for arm, v in (("intact", intact[m]), ("induction", ind[m]), ("random", rnd[m]),
                           ("induction_minus_intact", ind[m] - intact[m]), ("random_minus_intact", rnd[m] - intact[m]),
                           ("random_minus_induction", rnd[m] - ind[m])):
                row[arm], row[arm + "_ci_low"], row[arm + "_ci_high"] = _ci(v)
            rows.append(row)
    return pd.DataFrame(rows)


def verdicts(lag: LagProbeResult, recall: SerialRecallResult, head: pd.DataFrame, ks: list[int]) -> list[dict]:
    """The four claims, each ``{"claim", "reproduced": bool, "rule", "evidence", "per_k"}``.

    Decision rules (project decisions):

    (a) the intact mean curve's highest lag (lag 0 excluded) is +1 and its 95% CI lies above the
        CI of the next highest lag;
    (b) at k: the paired difference p_random − p_induction has a CI above 0 and the induction drop
        (intact − induction) is positive and at least twice the random drop; reproduced if this
        holds at half of the ks or more and the opposite (random − induction CI below 0) holds at
        none. (Not "at the largest k": at a large fraction of a small model's heads both arms can
        sit at the floor, which is no evidence either way; every k is listed in ``per_k``.)
    (c) at k: random ablation lowers p(+1) by less than 10% of the intact value, or the paired
        difference random − intact is not significantly negative (CI reaches 0); reproduced if it
        holds at every k;
    (d) at k: the paired difference of teacher-forced serial-recall accuracy random − induction
        has a CI above 0; reproduced like (b) (majority of ks, contradicted at none).
    """
    f = lambda m, lo, hi: f"{m:.3g} [{lo:.3g}, {hi:.3g}]"  # noqa: E731
    s = lag.summary()
    cur = s[(s.condition == "intact") & (s.lag != 0)].sort_values("mean", ascending=False)
    best, second = cur.iloc[0], cur.iloc[1]
    p1 = cur[cur.lag == 1].iloc[0]
    a_ok = bool(best.lag == 1 and p1.ci_low > second.ci_high)
    runner = second if best.lag == 1 else best
    out = [{"claim": "a", "text": "the intact lag curve peaks at lag +1", "reproduced": a_ok,
            "rule": "highest lag (0 excluded) is +1 and its CI lies above the next highest lag's CI",
            "evidence": f"p(+1) = {f(p1['mean'], p1.ci_low, p1.ci_high)}; highest other lag {int(runner.lag):+d}: "
                        f"{f(runner['mean'], runner.ci_low, runner.ci_high)}"}]

    def rows(measure):
        return {int(r.k): r for r in head[head.measure == measure].itertuples()}

    def majority(per_k):
        hold = [per_k[k]["holds"] for k in ks]
        against = [per_k[k]["random_minus_induction"][2] < 0 for k in ks]
        return bool(sum(hold) * 2 >= len(hold) and not any(against))

    lp = rows("lag_plus1")
    per_b, per_c = {}, {}
    for k in ks:
        r = lp[k]
        d_ind, d_rnd = r.intact - r.induction, r.intact - r.random
        per_b[k] = {"holds": bool(r.random_minus_induction_ci_low > 0 and d_ind > 0 and d_ind >= 2 * max(d_rnd, 0.0)),
                    "induction_drop": d_ind, "random_drop": d_rnd,
                    "random_minus_induction": [r.random_minus_induction, r.random_minus_induction_ci_low,
                                               r.random_minus_induction_ci_high]}
        per_c[k] = {"holds": bool(r.random >= 0.9 * r.intact or r.random_minus_intact_ci_high >= 0),
                    "random": [r.random, r.random_ci_low, r.random_ci_high],
                    "random_minus_intact": [r.random_minus_intact, r.random_minus_intact_ci_low,
                                            r.random_minus_intact_ci_high]}
    kmax = ks[-1]
    r = lp[kmax]
    out.append({"claim": "b", "text": "induction-head ablation lowers p(lag +1) far more than random ablation",
                "reproduced": majority(per_b), "per_k": per_b,
                "rule": "random − induction CI > 0 and induction drop ≥ 2 × random drop at ≥ half the ks, "
                        "significantly reversed at none",
                "evidence": f"intact {f(r.intact, r.intact_ci_low, r.intact_ci_high)}; " + "; ".join(
                    f"k={k}: induction {f(lp[k].induction, lp[k].induction_ci_low, lp[k].induction_ci_high)}, random "
                    f"{f(lp[k].random, lp[k].random_ci_low, lp[k].random_ci_high)}" for k in ks)
                    + f"; held at {sum(v['holds'] for v in per_b.values())}/{len(ks)} ks"})
    up = [k for k in ks if lp[k].random_minus_intact_ci_low > 0]
    out.append({"claim": "c", "text": "random ablation leaves p(lag +1) intact or raises it",
                "reproduced": all(v["holds"] for v in per_c.values()), "per_k": per_c,
                "rule": "at every k: random ≥ 0.9 × intact, or the random − intact CI reaches 0",
                "evidence": "; ".join(f"k={k}: random − intact {f(*v['random_minus_intact'])}" for k, v in per_c.items())
                            + (f" (significantly raised at k = {', '.join(map(str, up))})" if up else "")})
    ra = rows("recall_accuracy")
    per_d = {}
    for k in ks:
        r = ra[k]
        per_d[k] = {"holds": bool(r.random_minus_induction_ci_low > 0),
                    "intact": r.intact, "induction": r.induction, "random": r.random,
                    "random_minus_induction": [r.random_minus_induction, r.random_minus_induction_ci_low,
                                               r.random_minus_induction_ci_high]}
    r = ra[kmax]
    out.append({"claim": "d", "text": "serial recall suffers more under induction ablation than under random ablation",
                "reproduced": majority(per_d), "per_k": per_d,
                "rule": "teacher-forced accuracy random − induction CI > 0 at ≥ half the ks, significantly reversed at none",
                "evidence": f"accuracy intact {f(r.intact, r.intact_ci_low, r.intact_ci_high)}; " + "; ".join(
                    f"k={k}: induction {f(ra[k].induction, ra[k].induction_ci_low, ra[k].induction_ci_high)}, random "
                    f"{f(ra[k].random, ra[k].random_ci_low, ra[k].random_ci_high)}" for k in ks)
                    + f"; held at {sum(v['holds'] for v in per_d.values())}/{len(ks)} ks"})
    return out


# -- outputs -------------------------------------------------------------------------------
def plot_vs_k(head: pd.DataFrame, path, title: str = "") -> None:
    """Lag +1 probability and serial-recall accuracy vs k, induction vs random ablation, 95% CIs."""
    plt = plots.plt
    measures = [m for m in ("lag_plus1", "recall_accuracy", "recall_lag_plus1") if m in set(head.measure)]
    fig, axes = plt.subplots(1, len(measures), figsize=(4.6 * len(measures), 3.8), squeeze=False)
    for ax, m in zip(axes[0], measures):
        d = head[head.measure == m].sort_values("k")
        for arm, mk in (("induction", "o"), ("random", "s")):
            err = np.vstack([d[arm] - d[arm + "_ci_low"], d[arm + "_ci_high"] - d[arm]])
            ax.errorbar(d.k, d[arm], yerr=err, marker=mk, capsize=3, label=f"{arm} heads ablated")
        ax.axhline(d.intact.iloc[0], color="k", lw=1, label="intact")
        ax.axhspan(d.intact_ci_low.iloc[0], d.intact_ci_high.iloc[0], color="k", alpha=0.1)
        ax.set_xlabel("k (heads ablated)")
        ax.set_title(MEASURES[m], fontsize=9)
        ax.set_ylim(bottom=0)
    axes[0][0].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    plots.save(fig, path)


def plot_curves(df: pd.DataFrame, path, conditions, xlabel: str, ylabel: str, title: str = "",
                value: str = "mean") -> None:
    """Generic tidy-curve plot (columns condition, lag, ``value``, ci_low, ci_high), lag 0 dropped."""
    plt = plots.plt
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name in conditions:
        d = df[(df.condition == name) & (df.lag != 0)].sort_values("lag")
        if d.empty:
            continue
        line, = ax.plot(d.lag, d[value], marker="o", ms=3, label=name)
        if "ci_low" in d:
            ax.fill_between(d.lag, d.ci_low, d.ci_high, alpha=0.2, color=line.get_color())
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.axvline(0, color="grey", lw=0.5)
    ax.legend(fontsize=7)
    if title:
        ax.set_title(title)
    plots.save(fig, path)


def write_outputs(out: Path, loaded, hs, lag, recall, lb_table, conc, head, verd, record, ks) -> None:
    """results.json, tables/, plots/ and report.md (each file written atomically)."""
    name = loaded.identity["name"]
    tables, figs = out / "tables", out / "plots"
    L, H = hs["induction"].shape

    def csv(df, fname):
        atomic_write_text(tables / fname, df.to_csv(index=False))

    csv(pd.DataFrame([{"layer": l, "head": h, **{n: float(v[l, h]) for n, v in hs.scores.items()}}
                      for l in range(L) for h in range(H)]), "head_scores.csv")
    summary = lag.summary()
    csv(summary, "lag_curves.csv")
    csv(lag.headline(), "lag_headline.csv")
    crp = lag_probe_crp(lag)
    csv(crp, "lag_crp_argmax.csv")
    csv(recall.headline(), "recall_headline.csv")
    csv(recall.positions(), "recall_positions.csv")
    trans = recall.transition_curve()
    csv(trans, "recall_transition_curve.csv")
    csv(recall.crp(), "recall_crp.csv")
    csv(head, "headline.csv")
    csv(pd.DataFrame([{k: v for k, v in d.items() if k != "per_k"} for d in verd]), "verdicts.csv")
    if lb_table is not None:
        csv(lb_table, "load_bearing.csv")

    plots.head_heatmaps(hs.scores, figs / "head_scores.png", title=name)
    for k in ks:
        plots.lag_curves(summary, figs / f"lag_curves_k{k}.png", conditions=["intact", f"induction-{k}", f"random-{k}"],
                         title=f"{name}: lag probe, k = {k} heads ablated ({lag.config.method})")
    kmax = ks[-1]
    plot_vs_k(head, figs / "ablation_vs_k.png", title=f"{name}: induction vs random ablation ({lag.config.method})")
    plot_curves(trans, figs / "recall_transition_curve.png", ["intact", f"induction-{kmax}", f"random-{kmax}"],
                "lag (item position − previous item's position)", "p(next = item at lag), renormalised over list",
                f"{name}: serial recall transitions")
    shown = ["intact", f"induction-{kmax}"] + [c.name for c in lag.conditions if c.kind == "random" and c.k == kmax][:1]
    plot_curves(crp[crp.lag.abs() <= 10], figs / "lag_crp_argmax.png", shown, "lag", "CRP (arg-max response)",
                f"{name}: psifr-style lag-CRP of the arg-max response", value="prob")
    if lb_table is not None:
        plot_load_bearing(lb_table, {m: MEASURES[m] for m in conc}, figs / "load_bearing.png",
                          title=f"{name}: per-head effect of ablating one induction head ({lag.config.method})")
        plot_concentration({MEASURES[m]: conc[m] for m in ("lag_plus1", "recall_lag_plus1")}, figs / "concentration.png",
                           title=f"{name}: concentration of the lag +1 effect")
    atomic_write_json(out / "results.json", record)
    atomic_write_text(out / "report.md", report(loaded, lag, recall, lb_table, conc, head, verd, record, ks))


def _f(m, lo, hi, d: int = 3) -> str:
    """``m [lo, hi]`` with ``d`` significant digits."""
    return f"{m:.{d}g} [{lo:.{d}g}, {hi:.{d}g}]"


def report(loaded, lag, recall, lb_table, conc, head, verd, record, ks) -> str:
    """The Markdown report: verdicts with numbers and CIs, headline table, figures."""
    ident = loaded.identity
    p = record["params"]
    lines = [f"# Temporal-dependencies study: {ident['name']}", "",
             f"Model: `{ident['spec']}` ({ident['architecture']}, {ident['n_layers']} layers × {ident['n_heads']} query "
             f"heads, {ident['n_kv_heads']} KV heads, head_dim {ident['head_dim']}, dtype {ident['dtype']}). "
             f"Ablation: **{lag.config.method}**; k ∈ {ks}; random heads drawn outside the top "
             f"{p['exclude_top_n']} by induction score, {p['config']['n_draws']} seeded draws per k. "
             f"Lag probe: {lag.config.n_permutations} permutations of {lag.config.list_length} words, cue at "
             f"{lag.config.cue_position} (seed protocol: 5,000). Serial recall: {recall.config.n_trials} prompts, "
             f"{recall.config.n_shots} shots, lists of {recall.config.list_length}. 95% CIs over trials "
             "(normal approximation); differences are paired.", "",
             "## Claims", "", "| claim | verdict | evidence |", "| --- | --- | --- |"]
    for v in verd:
        lines.append(f"| ({v['claim']}) {v['text']} | **{'reproduced' if v['reproduced'] else 'not reproduced'}** "
                     f"| {v['evidence']} |")
    lines += ["", "Decision rules: " + "; ".join(f"({v['claim']}) {v['rule']}" for v in verd) + ".", ""]
    if not verd[0]["reproduced"]:
        lines += ["Claim (a) is not reproduced: p(lag +1) is not a peak of the intact lag curve on this model, so (b) and "
                  "(c) compare ablations on a probability the model does not single out.", ""]
    tc = recall.transition_curve()
    tc = tc[(tc.condition == "intact") & (tc.lag != 0)].sort_values("mean", ascending=False)
    if len(tc):
        top = tc.iloc[0]
        lines += [f"For comparison, the intact serial-recall transition curve (renormalised over the "
                  f"{recall.config.list_length} list items) peaks at lag {int(top.lag):+d}: "
                  f"{_f(top['mean'], top.ci_low, top.ci_high)}.", ""]
    intact = lag.headline().set_index("condition").loc["intact"]
    lines += [f"Intact list mass (probability on the {lag.config.list_length} list words): "
              f"{_f(intact.list_mass, intact.list_mass_ci_low, intact.list_mass_ci_high)}; p(lag 0, repeating the cue): "
              f"{_f(intact.lag0, intact.lag0_ci_low, intact.lag0_ci_high, 4)}. A small list mass means the model does not "
              "treat the list as something to recall; the lag curve is then reported as it is, not tuned.", ""]
    lines += ["## Headline", "", "| measure | k | intact | induction-k ablated | random-k ablated (pooled draws) "
              "| random − induction (paired) |", "| --- | --- | --- | --- | --- | --- |"]
    for r in head.itertuples():
        lines.append(f"| {MEASURES[r.measure]} | {r.k} | {_f(r.intact, r.intact_ci_low, r.intact_ci_high)} | "
                     f"{_f(r.induction, r.induction_ci_low, r.induction_ci_high)} | "
                     f"{_f(r.random, r.random_ci_low, r.random_ci_high)} | "
                     f"{_f(r.random_minus_induction, r.random_minus_induction_ci_low, r.random_minus_induction_ci_high)} |")
    lines += ["", "![ablation vs k](plots/ablation_vs_k.png)", ""]
    lines += [f"![lag curves k={k}](plots/lag_curves_k{k}.png)" for k in ks]
    lines += ["", "## Serial recall", "",
              "Teacher-forced accuracy per position, the renormalised transition lag curve and the psifr-style CRP of the "
              "greedy recalls are in `tables/recall_positions.csv`, `tables/recall_transition_curve.csv` and "
              "`tables/recall_crp.csv`.", "", "![serial recall transitions](plots/recall_transition_curve.png)", ""]
    crp = record["lag_crp_argmax"]
    if "intact" in crp:
        c = crp["intact"]
        lines += ["## psifr-style lag-CRP of the arg-max response", "",
                  f"Intact: {c['n_transitions']} of {lag.config.n_permutations} arg-max responses were list words other "
                  f"than the cue (transitions); CRP(+1) = {c['crp'].get(1)}, CRP(−1) = {c['crp'].get(-1)}. "
                  "Full tables: `tables/lag_crp_argmax.csv`.", "", "![lag-CRP](plots/lag_crp_argmax.png)", ""]
    if lb_table is not None:
        lines += ["## Per-head load-bearing map", "",
                  f"Each of the top {len(lb_table)} heads by induction score ablated alone ({lag.config.method}): lag probe "
                  f"on {record['load_bearing']['n_trials']} trials and serial recall on {recall.config.n_trials} prompts; "
                  "Δ = ablated − intact, paired 95% CI.", "",
                  "| rank | head | induction score | Δ lag probe p(+1) | Δ serial recall p(+1) | Δ serial recall accuracy |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for r in lb_table.to_dict(orient="records"):
            cells = [_f(r[f"{m}_delta"], r[f"{m}_delta_ci_low"], r[f"{m}_delta_ci_high"])
                     for m in ("lag_plus1", "recall_lag_plus1", "recall_accuracy")]
            lines.append(f"| {r['rank']} | L{r['layer']}H{r['head']} | {r['induction_score']:.3f} | " + " | ".join(cells) + " |")
        lines.append("")
        for m, c in conc.items():
            if m == "recall_accuracy":
                continue
            lines.append(f"Concentration of {MEASURES[m]}: total single-head drop {c['total_drop']:.3g}; the largest "
                         + " / ".join(str(n) for n in c["by_effect"]) + " heads carry "
                         + " / ".join(f"{v:.0%}" for v in c["by_effect"].values()) + " of it (the top "
                         + " / ".join(str(n) for n in c["by_induction_rank"]) + " by induction score: "
                         + " / ".join(f"{v:.0%}" for v in c["by_induction_rank"].values()) + ").")
        lines += ["", "![load-bearing](plots/load_bearing.png)", "", "![concentration](plots/concentration.png)", ""]
    lines += ["## Head scores", "", "![head scores](plots/head_scores.png)", "",
              "All numbers: `results.json`; tables: `tables/`.", ""]
    return "\n".join(lines)
