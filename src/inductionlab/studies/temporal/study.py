"""The temporal-dependencies study (``inductionlab study temporal``): the whole experimental
design of protocol T (SPEC §4–§5) on one model, resumable, with one report.

This module holds the study's config, its phase list and its verdicts; the plumbing is shared:
trials × conditions × ablation in :mod:`inductionlab.protocols.runner`, checkpoints in
:class:`inductionlab.runtime.runs.ResumableRun`, CIs in :mod:`inductionlab.measures.stats`, figures in
:mod:`inductionlab.studies.plots`, the report text in :mod:`inductionlab.studies.report`.

Pieces, each checkpointed in ``<out>/checkpoints/`` as soon as it finishes (atomic writes, so an
interrupted or killed run never leaves a half-written file and a re-run with the same ``--out``
continues from the finished pieces):

1. head scores (SPEC §3) → ``scores.json``;
2. :data:`PHASES`: for every condition — intact; top-k induction heads ablated; k random heads
   outside the top N (``n_draws`` seeded draws), for each k — the lag probe
   (``lag/<condition>.npz``) and few-shot serial recall (``recall/<condition>.npz``); then the
   per-head load-bearing map: each of the top-N induction heads ablated alone, lag probe on the
   first ``load_bearing_permutations`` trials (``single/<condition>.npz``) and serial recall
   (``single_recall/<condition>.npz``).

Then ``results.json``, ``tables/*.csv``, ``plots/*.png`` and ``report.md`` are written, stating
each claim of the temporal-dependencies paper on this model as reproduced / not reproduced:

(A) the lag curve peaks at lag +1;
(B) ablating the top-k induction heads lowers p(lag +1) far more than ablating k random heads;
(C) random ablation leaves p(lag +1) intact or raises it;
(D) serial recall suffers more under induction ablation than under random ablation.

Decision rules (this project's; the paper states the claims without tests) are in
:func:`verdicts`, each claim a :class:`~inductionlab.studies.run.Verdict`. All CIs are 95%, normal approximation over trials; differences between
conditions are paired (every condition sees the same trials).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from ...protocols import lag_probe, serial_recall

from .. import report

from ...checks import check_fields, check_loaded, check_type
from ...core.ablation import Condition, ablation_conditions, default_exclude_top_n
from ...core.models import LoadedModel, agree_dtype, announce_dtype, params_identity, ran_identity, with_dtype_choice
from ...core.scores import HeadScores
from ...errors import InductionLabError
from ...measures import serial_position
from ...measures.crp import lag_probe_crp
from ...measures.stats import ci
from ...protocols.lag_probe import LagProbeConfig, LagProbeResult
from ...protocols.load_bearing import concentration, load_bearing_table, single_head_conditions
from ...protocols.runner import auto_batch_size, check_method
from ...protocols.serial_recall import SerialRecallConfig, SerialRecallResult
from ...runtime.distributed import Dist
from ...runtime.runs import versions
from ..pieces import Phase, check_ks, check_lag_headline, check_study_options, check_trial_ids, check_trials_fit, head_scores_piece, run_phases
from ..report import fmt_ci, row_ci
from ..run import StudyRun, Verdict

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
    defaults (the seed protocol used 5,000 permutations; see README for GPU settings).

    ``seed`` and ``method`` are the study's: they replace the nested configs' own ``seed`` and
    ``method``, so every protocol sees the same ones. A protocol's ``batch_size`` of None is
    chosen from free GPU memory (CPU: 8)."""
    method: str = "zero"                    # ablation: zero (paper: attention scores −∞) | mean | sink
    ks: list[int] | None = None             # None: default_ks(n_heads_total)
    n_draws: int = 3                        # random-head draws per k
    exclude_top_n: int | None = None        # None: min(300, n_heads_total // 2) (SPEC §4)
    seed: int = 0
    lag: LagProbeConfig = field(default_factory=lambda: LagProbeConfig(n_permutations=64, cues="all:10"))  # seed: 5,000
    recall: SerialRecallConfig = field(default_factory=SerialRecallConfig)
    # per-head load-bearing map
    load_bearing_top: int = 10              # 0 disables
    load_bearing_permutations: int | None = None   # None: lag.n_permutations (first trials of the probe)
    # head scores (SPEC §3)
    score_seq_len: int = 50
    score_batch_size: int = 16

    def protocols(self) -> tuple[LagProbeConfig, SerialRecallConfig]:
        """The nested configs with the study's seed and method."""
        return (replace(self.lag, seed=self.seed, method=self.method),
                replace(self.recall, seed=self.seed, method=self.method))

    @property
    def load_bearing_n(self) -> int:
        return self.load_bearing_permutations or self.lag.n_permutations

    def validate(self) -> None:
        """Check every option that needs no model (the CLI and the API call it before loading).

        Raises:
            InductionLabError: unknown method, k < 1, negative draws or sizes, a protocol's own
                checks, more load-bearing trials than lag-probe trials, --load-bearing-permutations
                with the map off (--load-bearing-top 0), a NaN / infinite / beyond-64-bit number.
            TypeError: a field of the wrong type (``lag`` / ``recall`` not their configs).
        """
        check_fields(self)
        check_type(self.lag, LagProbeConfig, "TemporalStudyConfig.lag")
        check_type(self.recall, SerialRecallConfig, "TemporalStudyConfig.recall")
        check_method(self.method)
        check_study_options(ks=self.ks, n_draws=self.n_draws, exclude_top_n=self.exclude_top_n, seed=self.seed,
                            score_seq_len=self.score_seq_len, score_batch_size=self.score_batch_size)
        if self.load_bearing_top < 0:
            raise InductionLabError(f"--load-bearing-top {self.load_bearing_top} must be >= 0 (0 = no per-head map)")
        for c in self.protocols():
            c.validate()
        check_lag_headline(self.lag)
        check_trials_fit(self.lag.n_permutations, self.lag.list_length + 4, "--n-permutations")
        r = self.recall
        check_trials_fit(r.n_trials, (r.n_shots + 1) * (2 * r.list_length + 4), "--recall-trials")
        if self.load_bearing_permutations is not None and self.load_bearing_permutations < 2:
            raise InductionLabError(f"--load-bearing-permutations {self.load_bearing_permutations}: at least 2 "
                                    "trials are needed for a CI")
        if self.load_bearing_permutations is not None and self.load_bearing_top == 0:
            raise InductionLabError(f"--load-bearing-permutations {self.load_bearing_permutations} has no effect with "
                                    "--load-bearing-top 0 (no per-head map); drop one of them")
        if self.load_bearing_n > self.lag.n_permutations:
            raise InductionLabError(f"--load-bearing-permutations {self.load_bearing_n} exceeds --n-permutations "
                                    f"{self.lag.n_permutations}; the per-head map reuses the first trials of the lag "
                                    "probe: lower it or raise --n-permutations")


PHASES = (Phase("lag", "lag", "ablation"), Phase("recall", "recall", "ablation"),
          Phase("single", "lag_seed", "single"), Phase("single_recall", "recall", "single"))
PROTOCOLS = {"lag": lag_probe, "lag_seed": lag_probe, "recall": serial_recall}   # lag_seed: the seed cue only


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
    verdicts: list[Verdict]
    record: dict
    ks: list[int] = field(default_factory=list)
    timings: dict = field(default_factory=dict)


def _resolve(loaded: LoadedModel, cfg: TemporalStudyConfig):
    """ks, N and the protocol configs with batch sizes, for this model."""
    ident = loaded.identity
    n_total = ident["n_layers"] * ident["n_heads"]
    N = default_exclude_top_n(n_total) if cfg.exclude_top_n is None else int(cfg.exclude_top_n)
    ks = sorted(set(int(k) for k in cfg.ks)) if cfg.ks else default_ks(n_total, N)
    check_ks(ks, n_total, N)
    if cfg.load_bearing_top > n_total:
        raise InductionLabError(f"--load-bearing-top {cfg.load_bearing_top:,} exceeds the model's {n_total} heads; use "
                                f"at most {n_total}")
    lag_cfg, rec_cfg = cfg.protocols()
    lag_cfg = replace(lag_cfg, batch_size=lag_cfg.batch_size or auto_batch_size(loaded, lag_cfg.list_length + 4))
    rec_cfg = replace(rec_cfg, batch_size=rec_cfg.batch_size or auto_batch_size(
        loaded, (rec_cfg.n_shots + 1) * (2 * rec_cfg.list_length + 4), rec_cfg.list_length))
    return ks, N, lag_cfg, rec_cfg


def _params(loaded, cfg, ks, N, lag_cfg, rec_cfg) -> dict:
    """What defines the study's result (batch sizes change nothing but speed: left out)."""
    drop = lambda d: {k: v for k, v in d.items() if k != "batch_size"}  # noqa: E731
    config = asdict(cfg)
    config["lag"], config["recall"] = drop(asdict(lag_cfg)), drop(asdict(rec_cfg))   # with the study's seed, method
    return {"config": config, "ks": ks, "exclude_top_n": N, "lag_probe": drop(asdict(lag_cfg)),
            "serial_recall": drop(asdict(rec_cfg)), "load_bearing_permutations": cfg.load_bearing_n,
            "model": params_identity(ran_identity(loaded))}


def run_temporal_study(loaded: LoadedModel, cfg: TemporalStudyConfig, out: str | Path, *, progress: bool = True,
                       overwrite: bool = False, on_checkpoint=None, dist=None, log=None) -> TemporalStudy:
    """Run (or resume) the study and write the run directory ``out``.

    Args:
        loaded: the model (:func:`inductionlab.core.models.load_model`).
        out: run directory. If it holds checkpoints of a study with the same parameters and
            model, finished pieces are loaded instead of recomputed.
        overwrite: delete ``out`` first and start afresh.
        on_checkpoint: optional callable(key) called after each checkpoint is written.
        dist: a :class:`~inductionlab.runtime.distributed.Dist` of several processes (torchrun; every rank
            calls with the same arguments): head scores, lag probe and serial recall are sharded
            by batch over the ranks, every rank returns the same study, rank 0 alone writes ``out``.
        log: optional callable(str) (the CLI: ``click.echo``) given the line saying which dtype runs
            and why, once the checks have passed (:func:`inductionlab.core.models.announce_dtype`).

    Returns: :class:`TemporalStudy`.

    Raises:
        InductionLabError: bad config (:meth:`TemporalStudyConfig.validate`); ``out`` holds another
            study or other files; k larger than the heads available; pool / context too small
            (see the lag probe and serial recall).
        TypeError: ``loaded`` not a LoadedModel, ``cfg`` not a TemporalStudyConfig (a dict included).
    """
    t_start = time.perf_counter()
    check_loaded(loaded, "run_temporal_study")
    check_type(cfg, TemporalStudyConfig, "run_temporal_study: cfg")
    cfg.validate()
    out = Path(out)
    agree_dtype(loaded, dist)             # torchrun: every rank in rank 0's dtype
    ks, N, lag_cfg, rec_cfg = _resolve(loaded, cfg)
    lb_n = cfg.load_bearing_n
    # model-dependent checks (pool, context) before any file is written
    check_trial_ids(lag_probe.build_trials(loaded, replace(lag_cfg, n_permutations=2)), loaded, "lag probe")
    lag_probe.check_cues(loaded, lag_cfg)
    check_trial_ids(serial_recall.build_trials(loaded, replace(rec_cfg, n_trials=1)), loaded, "serial recall")
    run = StudyRun(out, "study-temporal", _params(loaded, cfg, ks, N, lag_cfg, rec_cfg), overwrite=overwrite,
                   on_checkpoint=on_checkpoint, inputs=[loaded.identity.get("path")], dist=dist, started=t_start)
    run.open()
    announce_dtype(ran_identity(loaded), log, run.is_main)

    with run.timed("head_scores"):
        hs = head_scores_piece(run, loaded, seq_len=cfg.score_seq_len, batch_size=cfg.score_batch_size,
                               seed=cfg.seed, progress=progress)
    induction = hs["induction"]
    conditions = ablation_conditions(induction, ks, n_draws=cfg.n_draws, exclude_top_n=N, seed=cfg.seed)
    singles = single_head_conditions(induction, cfg.load_bearing_top) if cfg.load_bearing_top > 0 else []
    parts, words = run_phases(run, loaded, PHASES, PROTOCOLS, {"lag": lag_cfg, "lag_seed": replace(lag_cfg, cues="seed"),
                                                               "recall": rec_cfg},
                              {"ablation": conditions, "single": singles},
                              {"lag": lag_cfg.n_permutations, "recall": rec_cfg.n_trials, "single": lb_n,
                               "single_recall": rec_cfg.n_trials}, progress=progress, timings=run.timings)

    lag_parts = parts["lag"]
    lag = LagProbeResult.from_parts(lag_parts, conditions, lag_cfg, words["lag"])
    recall = SerialRecallResult(parts["recall"], conditions, rec_cfg, words["recall"])
    lb_table = conc = None
    if singles:
        lb_table, conc = _load_bearing(induction, singles, lag, recall, parts, lb_n)
    head = headline_table(lag, recall, ks)
    verd = verdicts(lag, recall, head, ks)
    record = {
        "kind": "study-temporal", "model": with_dtype_choice(run.params["model"], loaded), "params": run.params,
        "versions": versions(),
        "seeds": {"study": cfg.seed, "lag_probe_trials": "seed_for(seed, trial)",
                  "serial_recall_trials": "seed_for(seed, 7, trial)", "random_draws": "seed_for(seed, k, draw)"},
        "head_scores": {**hs.to_dict(), "params": hs.params},
        "conditions": [c.to_dict() for c in conditions],
        "headline": head.to_dict(orient="records"),
        "verdicts": [v.to_dict() for v in verd],
        "lag_probe": lag.to_json(),
        **({"lag_cues": serial_position.cue_json(lag)} if serial_position.has_cues(lag) else {}),
        "lag_crp_argmax": _crp_block(lag_probe_crp(lag)),
        "serial_recall": recall.to_json(),
        "load_bearing": None if lb_table is None else {"table": lb_table.to_dict(orient="records"),
                                                       "concentration": conc, "n_trials": lb_n},
        "distributed": (dist or Dist()).record(),
    }
    study = TemporalStudy(loaded, cfg, hs, conditions, lag, recall, lb_table, conc, head, verd, record, ks,
                          run.timings)
    run.finish(record, lambda: report.write_temporal_outputs(out, study, MEASURES))   # rank 0 writes
    return study


def _load_bearing(induction, singles, lag, recall, parts, lb_n):
    """Per-head Δ table and concentration (lag probe p(+1) on the first ``lb_n`` trials, recall)."""
    col = lag.config.cue_position  # column of lag +1 (0-based index cue_position)
    single_rec = SerialRecallResult(parts["single_recall"], singles, recall.config)
    rec_intact = recall.trial_measures("intact")
    intact = {"lag_plus1": lag.probs["intact"][:lb_n, col], "recall_lag_plus1": rec_intact["lag_plus1"],
              "recall_accuracy": rec_intact["accuracy"]}
    single = {c.name: {"lag_plus1": parts["single"][c.name]["probs"][:, col],
                       **{f"recall_{k}": v for k, v in single_rec.trial_measures(c.name).items()
                          if k in ("lag_plus1", "accuracy")}} for c in singles}
    table = load_bearing_table(induction, singles, intact, single)
    return table, {m: concentration(table, m) for m in intact}


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
                row[arm], row[arm + "_ci_low"], row[arm + "_ci_high"] = ci(v)
            rows.append(row)
    return pd.DataFrame(rows)


def verdicts(lag: LagProbeResult, recall: SerialRecallResult, head: pd.DataFrame, ks: list[int]) -> list[Verdict]:
    """The four claims A–D, each a :class:`~inductionlab.studies.run.Verdict` (status reproduced or
    not reproduced; B–D with ``per_k``).

    Decision rules (project decisions):

    (A) the intact mean curve's highest lag (lag 0 excluded) is +1 and its 95% CI lies above the
        CI of the next highest lag;
    (B) at k: the paired difference p_random − p_induction has a CI above 0 and the induction drop
        (intact − induction) is positive and at least twice the random drop; reproduced if this
        holds at half of the ks or more and the opposite (random − induction CI below 0) holds at
        none. (Not "at the largest k": at a large fraction of a small model's heads both arms can
        sit at the floor, which is no evidence either way; every k is listed in ``per_k``.)
    (C) at k: random ablation lowers p(+1) by less than 10% of the intact value, or the paired
        difference random − intact is not significantly negative (CI reaches 0); reproduced if it
        holds at every k;
    (D) at k: the paired difference of teacher-forced serial-recall accuracy random − induction
        has a CI above 0; reproduced like (B) (majority of ks, contradicted at none).
    """
    lp = {int(r.k): r for r in head[head.measure == "lag_plus1"].itertuples()}
    ra = {int(r.k): r for r in head[head.measure == "recall_accuracy"].itertuples()}
    return [_claim_a(lag), *_claims_b_c(lp, ks), _claim_d(ra, ks)]


def _majority(per_k: dict, ks: list[int]) -> bool:
    """Holds at half of the ks or more, and random − induction is significantly negative at none."""
    hold = [per_k[k]["holds"] for k in ks]
    against = [per_k[k]["random_minus_induction"][2] < 0 for k in ks]
    return bool(sum(hold) * 2 >= len(hold) and not any(against))


def _triple(r, name: str) -> list[float]:
    return [getattr(r, name), getattr(r, f"{name}_ci_low"), getattr(r, f"{name}_ci_high")]


def _status(reproduced: bool) -> str:
    return "reproduced" if reproduced else "not reproduced"


def _claim_a(lag: LagProbeResult) -> Verdict:
    s = lag.summary()
    cur = s[(s.condition == "intact") & (s.lag != 0)].sort_values("mean", ascending=False)
    best, second = cur.iloc[0], cur.iloc[1]
    p1 = cur[cur.lag == 1].iloc[0]
    runner = second if best.lag == 1 else best
    return Verdict("A", text="the intact lag curve peaks at lag +1",
                   status=_status(best.lag == 1 and p1.ci_low > second.ci_high),
                   rule="highest lag (0 excluded) is +1 and its CI lies above the next highest lag's CI",
                   evidence=f"p(+1) = {fmt_ci(p1['mean'], p1.ci_low, p1.ci_high)}; highest other lag "
                            f"{int(runner.lag):+d}: {fmt_ci(runner['mean'], runner.ci_low, runner.ci_high)}")


def _per_k_evidence(rows: dict, ks: list[int], per: dict, intact: str) -> str:
    """``<intact> <row at the largest k>; k=…: induction …, random …; held at n/len(ks) ks``."""
    return (f"{intact} {row_ci(rows[ks[-1]], 'intact')}; "
            + "; ".join(f"k={k}: induction {row_ci(rows[k], 'induction')}, random {row_ci(rows[k], 'random')}"
                        for k in ks)
            + f"; held at {sum(v['holds'] for v in per.values())}/{len(ks)} ks")


def _claims_b_c(lp: dict, ks: list[int]) -> list[Verdict]:
    per_b, per_c = {}, {}
    for k in ks:
        r = lp[k]
        d_ind, d_rnd = r.intact - r.induction, r.intact - r.random
        per_b[k] = {"holds": bool(r.random_minus_induction_ci_low > 0 and d_ind > 0 and d_ind >= 2 * max(d_rnd, 0.0)),
                    "induction_drop": d_ind, "random_drop": d_rnd,
                    "random_minus_induction": _triple(r, "random_minus_induction")}
        per_c[k] = {"holds": bool(r.random >= 0.9 * r.intact or r.random_minus_intact_ci_high >= 0),
                    "random": _triple(r, "random"), "random_minus_intact": _triple(r, "random_minus_intact")}
    up = [k for k in ks if lp[k].random_minus_intact_ci_low > 0]
    b = Verdict("B", text="induction-head ablation lowers p(lag +1) far more than random ablation",
                status=_status(_majority(per_b, ks)), per_k=per_b,
                rule="random − induction CI > 0 and induction drop ≥ 2 × random drop at ≥ half the ks, "
                     "significantly reversed at none",
                evidence=_per_k_evidence(lp, ks, per_b, "intact"))
    c = Verdict("C", text="random ablation leaves p(lag +1) intact or raises it",
                status=_status(all(v["holds"] for v in per_c.values())), per_k=per_c,
                rule="at every k: random ≥ 0.9 × intact, or the random − intact CI reaches 0",
                evidence="; ".join(f"k={k}: random − intact {fmt_ci(*v['random_minus_intact'])}"
                                   for k, v in per_c.items())
                         + (f" (significantly raised at k = {', '.join(map(str, up))})" if up else ""))
    return [b, c]


def _claim_d(ra: dict, ks: list[int]) -> Verdict:
    per_d = {k: {"holds": bool(ra[k].random_minus_induction_ci_low > 0), "intact": ra[k].intact,
                 "induction": ra[k].induction, "random": ra[k].random,
                 "random_minus_induction": _triple(ra[k], "random_minus_induction")} for k in ks}
    return Verdict("D", text="serial recall suffers more under induction ablation than under random ablation",
                   status=_status(_majority(per_d, ks)), per_k=per_d,
                   rule="teacher-forced accuracy random − induction CI > 0 at ≥ half the ks, significantly reversed "
                        "at none",
                   evidence=_per_k_evidence(ra, ks, per_d, "accuracy intact"))
