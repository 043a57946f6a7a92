"""Which heads carry in-context learning (``inductionlab study head-types``; SPEC §10): induction heads and
function-vector (FV) heads on one model, scored, compared and ablated exclusively, as Yin & Steinhardt 2025
(arXiv 2502.14010) did for Pythia, GPT-2 and Llama-2.

Pieces (each checkpointed in ``<out>/checkpoints/``; a re-run with the same ``--out`` resumes):

1. the attention-pattern head scores (SPEC §3) → ``scores.json``;
2. the FV score of every head per task (:mod:`inductionlab.protocols.function_vectors`: clean means, CIE of
   each head on each corrupted prompt) → ``fv/<task>.npz``;
2a. (``--no-attribution`` skips it) per task, the attribution-patching estimate of every head's CIE on the same
   corrupted prompts (:func:`~inductionlab.core.attribution.attribution_patching`, source the task mean at the
   last position, metric P(answer)) and the direct logit attribution of every head on the clean prompts
   (:func:`~inductionlab.core.attribution.direct_logit_attribution`) → ``attribution/<task>.npz``; their agreement
   with the exact AIE and the writer / canceller / indirect roles (:func:`attribution_roles`) go to results.json;
2b. (``--no-dual-route`` skips it) the concept and token induction scores of every head
   (:mod:`inductionlab.protocols.dual_route`, Feucht et al. 2025) → ``dual_route.npz``; their columns join
   ``head_scores.csv`` (rankings for every ablation option: ``--rank-by concept_copying --scores-file``);
3. the function vector's check (top heads by AIE vs random heads, zero-shot HITS@1 with the vector added
   after a middle layer) → ``fv_check.json``;
4. the conditions: for each fraction f, the top heads by induction score and by FV score, each also with the
   other ranking's top 2% excluded, and random draws of the same counts
   (:func:`~inductionlab.core.ablation.selection_conditions`); under each: 10-shot HITS@1 of the function
   probes with the heads' last-position output set to its mean over the FV scoring prompts and to zero (all
   conditions at once per prompt, as the ablation edits the last position only: ``probes/<task>.npz``), the
   token-loss ICL score (:mod:`inductionlab.studies.token_loss`: a pilot ``icl_pilot`` sizing the windows
   ``icl_sample_size``, then ``icl/<condition>`` and the sensitivity arms ``icl_<method>/<condition>``; the
   log-slope benefit D decides Y2) and the lag probe (``lag/<condition>``).

Then ``results.json``, tables, figures and ``report.md``, with the verdicts Y1–Y4 of
:mod:`inductionlab.studies.head_types.verdicts` (rules fixed in code before the first real run).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ...config import to_dict
from ...core.ablation import Condition, excluded_count, selection_conditions
from ...core.attribution import DLA_KINDS, attribution_patching, direct_logit_attribution, dla_unsupported
from ...core.models import LoadedModel, ran_identity
from ...core.scores import HeadScores
from ...core.stimuli import seed_for
from ...errors import InductionLabError
from ...measures import cmr as C
from ...measures.overlap import estimate_agreement, head_overlap
from ...measures.stats import drop_table
from ...protocols import dual_route as DR, function_probes, function_vectors as F, lag_probe
from ...protocols.cmr_fit import attention_crp_cmr_fit
from ...protocols.configs import DualRouteConfig, FVScoreConfig, LagProbeConfig
from ...protocols.icl_tasks import Prompt, build_tasks, make_prompts
from ...protocols.lag_probe import LagProbeResult
from ...protocols.token_loss import window_table
from ..configs import check_trial_ids
from .. import token_loss as TLS
from ..engine import Context, Phase, StudyResult, run_study
from ..spec import RunOptions, Study, StudyPlan
from .config import SPEC, HeadTypesConfig
from .report import FVEC, RVEC, ZS, summary, write
from .verdicts import decide, per_trial


@dataclass(kw_only=True)
class Plan(StudyPlan):
    """What :func:`prepare` settles for this model: the fractions kept, the prompts, the text windows, the
    protocols' configs with the study's seed, and the run's ``params``."""
    loaded: LoadedModel
    cfg: HeadTypesConfig
    fractions: list[float]
    fv: FVScoreConfig
    fv_layer: int
    fv_prompts: dict[str, F.TaskPrompts]
    probe_prompts: list[Prompt]
    zero_shot: list[Prompt]
    icl: TLS.TokenLossPlan
    lag: LagProbeConfig
    route: DualRouteConfig | None = None
    route_prompts: tuple | None = None     # (word, random-token, attention) prompts of dual_route.build_prompts


@dataclass(kw_only=True)
class HeadTypesStudy(StudyResult):
    """Everything a finished study computed (also written to the run directory)."""
    loaded: LoadedModel
    config: HeadTypesConfig
    scores: HeadScores
    fv: F.FVScores
    fv_check: dict
    conditions: list[Condition]
    probes: pd.DataFrame              # per prompt, condition and method: hits1, rank, p_target
    icl: pd.DataFrame                 # per window and condition: loss_early, loss_late, benefit, slope (D), band (B)
    lag: LagProbeResult
    drops: pd.DataFrame               # per condition and measure: value, CI, drop vs intact (stats.drop_table)
    overlap: pd.DataFrame             # one row per pair of rankings
    route: DR.RouteScores | None = None   # concept / token induction scores (None: --no-dual-route)
    cmr: dict | None = None           # --cmr: profile [L, H, 2m+1], lags, the fit's arrays, the grid's params
    attribution: dict | None = None   # AtP and DLA: task -> the piece's arrays (None: --no-attribution)


def _bos(loaded: LoadedModel, on: bool) -> int | None:
    return loaded.tokenizer.bos_token_id if on else None


def kept_fractions(fractions, n_total: int) -> tuple[list[float], list[float]]:
    """``(kept, dropped)``: fractions in ascending order, a fraction dropped when ``max(1, int(f·N))`` equals a
    smaller kept one's (its random draws would pool with that one's: Gemma 3 270M's 72 heads give 1 head for
    both 1% and 2%)."""
    kept, dropped, seen = [], [], set()
    for f in sorted(fractions):
        n = max(1, int(f * n_total))
        (dropped if n in seen else kept).append(f)
        seen.add(n)
    return kept, dropped


def prepare(loaded: LoadedModel, cfg: HeadTypesConfig) -> Plan:
    """The checks that need the model, before anything is written: the fractions on this model's heads, every
    task's prompts on this tokenizer, the FV layer, the text windows, the lag probe's trials and cues.

    Raises:
        InductionLabError: what the checks refuse (one line naming the option and the fix)."""
    ident = ran_identity(loaded)
    L, H = ident["n_layers"], ident["n_heads"]
    n_total = L * H
    kept, dropped = kept_fractions(cfg.selection.fractions, n_total)
    fv, lag = cfg.protocols()
    fv_layer = L // 3 if fv.layer is None else fv.layer
    if not 0 <= fv_layer < L:
        raise InductionLabError(f"--fv-layer {fv_layer}: the model has layers 0-{L - 1}")
    if fv.top > n_total:
        raise InductionLabError(f"--fv-top {fv.top} exceeds the model's {n_total} heads")
    tasks = build_tasks(fv.task_names())
    bos = _bos(loaded, fv.bos)
    fv_prompts = F.task_prompts(tasks, loaded.tokenizer, shots=fv.shots, n_prompts=fv.n_prompts, seed=fv.seed,
                                bos_id=bos)
    probe_prompts = [p for t in tasks.values() for p in make_prompts(
        t, loaded.tokenizer, shots=(fv.shots,), n_prompts=cfg.probes.n_prompts, seed=seed_for(cfg.seed, 1),
        permuted=False, bos_id=bos)]
    zero_shot = [p for t in tasks.values() for p in make_prompts(
        t, loaded.tokenizer, shots=(0,), n_prompts=fv.zero_shot_prompts, seed=seed_for(cfg.seed, 2), permuted=False,
        bos_id=bos)]
    icl = TLS.plan(loaded, cfg.icl, cfg.seed)
    check_trial_ids(lag_probe.build_trials(loaded, replace(lag, n_permutations=2)), loaded, "lag probe")
    lag_probe.check_cues(loaded, lag)
    route, route_prompts = cfg.route_config(), None
    if route.enabled:
        try:
            route_prompts = DR.build_prompts(loaded.tokenizer, loaded.model.config.vocab_size, n_words=route.n_words,
                                             n_attention=route.n_attention, seq_len=route.seq_len,
                                             lengths=route.lengths, top_n=route.word_pool, seed=route.seed)
        except InductionLabError as e:      # e.g. Gemma 3's 262k vocabulary splits few common words into 5 tokens
            raise InductionLabError(f"dual-route scores: {e} (--route-word-lengths 2,3,4, a larger --route-word-pool, "
                                    "fewer --route-prompts, or --no-dual-route)") from None
    skipped = dla_unsupported(loaded.model) if cfg.attribution else None      # e.g. Gemma 2: said, not refused
    params = {"config": to_dict(cfg), **({"attribution_skipped": skipped} if skipped else {}), "fractions": kept, "fractions_dropped": dropped,
              "counts": {f"{f:g}": max(1, int(f * n_total)) for f in kept}, "fv_layer": fv_layer,
              "fv_tasks": list(fv_prompts), **icl.params(),
              "probe_prompts_seed": "seed_for(seed, 1)", "zero_shot_prompts_seed": "seed_for(seed, 2)"}
    return Plan(loaded=loaded, cfg=cfg, fractions=kept, fv=fv, fv_layer=fv_layer, fv_prompts=fv_prompts,
                probe_prompts=probe_prompts, zero_shot=zero_shot, icl=icl, lag=lag,
                params=params, route=route if route.enabled else None, route_prompts=route_prompts)


# ---- FV scores -------------------------------------------------------------------------------------

def _fv_scores(plan: Plan, ctx: Context) -> tuple[F.FVScores, dict[str, np.ndarray]]:
    """The FV score per task, each task a piece ``fv/<task>`` (means, P(y₁) clean and corrupted, CIE per prompt,
    and the piece's own seconds ``[clean means, CIEs]``). Returns the scores and task -> those seconds (tasks whose
    piece predates issue 37 have none)."""
    model = plan.loaded.model

    def score(task: str, progress) -> dict:
        tp = plan.fv_prompts[task]
        t0 = time.perf_counter()
        means, p_clean = F.clean_means(model, tp.clean)
        t1 = time.perf_counter()
        progress(len(tp.clean))
        base, cie = [], []
        for p in tp.corrupted:
            b, c = F.indirect_effects(model, p, means, rows=plan.fv.rows)
            base.append(b)
            cie.append(c)
            progress(1)
        seconds = np.array([t1 - t0, time.perf_counter() - t1])      # clean means, CIEs (the attribution's cost base)
        return {"means": means.numpy(), "p_clean": p_clean, "p_base": np.asarray(base), "cie": np.stack(cie),
                "seconds": seconds}
    parts = ctx.pieces("fv", plan.fv_prompts, score, desc="FV scores", unit="prompt", timing="fv_scores",
                       total=lambda t: 2 * len(plan.fv_prompts[t].corrupted))
    tasks = list(plan.fv_prompts)
    seconds = {t: np.asarray(parts[t]["seconds"], float) for t in tasks if "seconds" in parts[t]}
    return F.FVScores(tasks, np.stack([parts[t]["p_clean"] for t in tasks]),
                      np.stack([parts[t]["p_base"] for t in tasks]), np.stack([parts[t]["cie"] for t in tasks]),
                      torch.as_tensor(np.stack([parts[t]["means"] for t in tasks])),
                      {"shots": plan.fv.shots, "n_prompts": plan.fv.n_prompts, "seed": plan.fv.seed,
                       "tasks": tasks, "rows": plan.fv.rows}), seconds


# ---- attribution: AtP beside the exact FV score, DLA -------------------------------------------------

#: The heads with a large effect: the top ``ROLE_TOP`` by signed AIE (the FV report's own top 10), AIE > 0.
ROLE_TOP = 10
#: The DLA direction the roles read: the answer's logit minus the mean logit (the part of log P(answer) that is
#: linear in the residual stream; a uniform shift of every logit, which moves no probability, counts 0).
ROLE_DLA = "centered"


def attribution_roles(aie: np.ndarray, dla: np.ndarray, top: int = ROLE_TOP) -> dict:
    """Writers, cancellers and indirect heads from the exact AIE and the mean DLA (one place for the thresholds).

    ``small`` |DLA| means below the median |DLA| over all heads; ``large AIE`` means among the ``top`` heads by signed
    AIE, and AIE > 0 (they raise the answer when patched in). Writers: large AIE, DLA > 0 and not small (they raise
    the answer directly). Indirect: large AIE, |DLA| small (their effect goes through later layers). Cancellers: the
    ``top`` most negative DLA among heads whose DLA is negative and not small (they lower the answer directly,
    whatever their AIE).

    Args: aie, dla: float ``[n_layers, n_heads]`` (probability; logit units).

    Returns: ``{"rule": {...}, "writers" / "cancellers" / "indirect": [{"layer", "head", "aie", "dla"}, ...]}``,
    writers and indirect heads in AIE order, cancellers most negative first."""
    aie, dla = np.asarray(aie, float), np.asarray(dla, float)
    L, H = aie.shape
    k = min(top, aie.size)
    median = float(np.median(np.abs(dla)))
    order_aie = [i for i in sorted(range(aie.size), key=lambda i: (-aie.flat[i], i))[:k] if aie.flat[i] > 0]
    small = np.abs(dla) < median

    def entry(i):
        return {"layer": i // H, "head": i % H, "aie": float(aie.flat[i]), "dla": float(dla.flat[i])}
    writers = [entry(i) for i in order_aie if dla.flat[i] > 0 and not small.flat[i]]
    indirect = [entry(i) for i in order_aie if small.flat[i]]
    neg = sorted((i for i in range(dla.size) if dla.flat[i] < 0 and not small.flat[i]), key=lambda i: (dla.flat[i], i))
    return {"rule": {"top_aie": k, "dla_kind": ROLE_DLA, "small_dla_below": median,
                     "writers": f"top {k} by signed AIE (AIE > 0) with DLA > 0 and |DLA| >= the median |DLA|",
                     "indirect": f"top {k} by signed AIE (AIE > 0) with |DLA| < the median |DLA|",
                     "cancellers": f"the {k} most negative DLA with |DLA| >= the median |DLA|"},
            "writers": writers, "indirect": indirect, "cancellers": [entry(i) for i in neg[:k]]}


def _attribution(plan: Plan, ctx: Context, fv: F.FVScores) -> dict[str, dict[str, np.ndarray]] | None:
    """Per task a piece ``attribution/<task>``: ``atp`` ``[n, L, H]`` (AtP's estimate of each head's CIE on the FV
    score's corrupted prompts: the head's last-position output set to the task's clean mean, metric P(answer) in
    float64, as :func:`~inductionlab.protocols.function_vectors.indirect_effects`), ``atp_metric`` ``[n]`` (P(answer)
    on the unpatched corrupted run: the FV score's ``p_base``), ``dla_<kind>`` ``[n, L, H]``, ``dla_rest_<kind>`` and
    ``dla_total_<kind>`` ``[n]`` for each of :data:`~inductionlab.core.attribution.DLA_KINDS` on the clean prompts,
    and ``seconds`` ``[AtP, DLA]``. None with ``--no-attribution``."""
    if not plan.cfg.attribution or plan.params.get("attribution_skipped"):
        return None
    model, index = plan.loaded.model, {t: i for i, t in enumerate(fv.tasks)}

    def compute(task: str, progress) -> dict:
        tp = plan.fv_prompts[task]
        t0 = time.perf_counter()
        r = attribution_patching(model, [p.input_ids for p in tp.corrupted], [p.target_id for p in tp.corrupted],
                                 fv.means[index[task]], positions=(-1,), metric="prob")
        t1 = time.perf_counter()
        progress(len(tp.corrupted))
        d = direct_logit_attribution(model, [p.input_ids for p in tp.clean], [p.target_id for p in tp.clean])
        progress(len(tp.clean))
        return {"atp": r.atp, "atp_metric": r.metric, "seconds": np.array([t1 - t0, time.perf_counter() - t1]),
                **{f"dla_{k}": d.heads[k] for k in DLA_KINDS}, **{f"dla_rest_{k}": d.rest[k] for k in DLA_KINDS},
                **{f"dla_total_{k}": d.total[k] for k in DLA_KINDS}}
    return ctx.pieces("attribution", plan.fv_prompts, compute, desc="attribution", unit="prompt",
                      timing="attribution",
                      total=lambda t: len(plan.fv_prompts[t].corrupted) + len(plan.fv_prompts[t].clean))


def attribution_record(fv: F.FVScores, attr: dict[str, dict[str, np.ndarray]], fv_seconds: dict[str, np.ndarray],
                       timings: dict) -> dict:
    """results.json's ``attribution``: AtP's mean (the estimate of the AIE) and its agreement with the exact AIE
    (:func:`~inductionlab.measures.overlap.estimate_agreement`: Spearman ρ over all heads, recall of the top 10 and
    top 5%, the largest misses), the cost, DLA's means and the roles (:func:`attribution_roles`).

    Args: ``attr``: task -> its attribution piece; ``fv_seconds``: task -> the FV piece's ``[means, CIEs]`` seconds;
    ``timings``: this session's wall seconds of the two steps (``ctx.timing``: a loaded piece counts its load only)."""
    tasks = fv.tasks
    aie = fv.aie()
    atp = np.stack([attr[t]["atp"] for t in tasks]).mean((0, 1))
    dla = {k: np.stack([attr[t][f"dla_{k}"] for t in tasks]).mean((0, 1)) for k in DLA_KINDS}
    atp_s = sum(float(attr[t]["seconds"][0]) for t in tasks)
    dla_s = sum(float(attr[t]["seconds"][1]) for t in tasks)
    fv_s = [float(fv_seconds[t][1]) for t in tasks if t in fv_seconds]
    cie_s = sum(fv_s) if len(fv_s) == len(tasks) else None
    return {
        "definition": "AtP (Nanda 2023; Kramar et al. 2024 eq. 4): per corrupted FV prompt, sum over the last position "
                      "of (task mean - head output) . dP(answer)/d(head output), the first-order estimate of the "
                      "head's CIE; mean over tasks and prompts = the estimate of the AIE. DLA: the head's "
                      "last-position output on the clean prompts through o_proj, the final norm (scale frozen from "
                      "the clean run) and the unembedding, read on the answer token; mean over tasks and prompts.",
        "metric": "prob", "positions": [-1], "source": "the task's clean mean at the last position (the FV score's)",
        "atp": atp.tolist(),
        "agreement": estimate_agreement(atp, aie),
        "atp_metric_vs_p_base": float(np.max(np.abs(np.stack([attr[t]["atp_metric"] for t in tasks]) - fv.p_base))),
        "cost": {"atp_seconds": atp_s, "dla_seconds": dla_s, "fv_cie_seconds": cie_s,
                 "fv_seconds": None if cie_s is None else cie_s + sum(float(fv_seconds[t][0]) for t in tasks),
                 "atp_vs_fv_cie": None if not cie_s else atp_s / cie_s,
                 "session_timings": timings,
                 "note": "seconds stored in each piece when computed (so a resumed run keeps them); the exact "
                         "score's clean means, which AtP reuses, are outside fv_cie_seconds"},
        "dla": {"kind": ROLE_DLA, "mean": dla[ROLE_DLA].tolist(), "logit": dla["logit"].tolist()},
        "roles": attribution_roles(aie, dla[ROLE_DLA]),
    }


ROUTE_ARRAYS = ("word", "random", "attention", "p_word", "p_random")


def _route_scores(plan: Plan, ctx: Context) -> DR.RouteScores | None:
    """The concept / token induction scores, one piece ``dual_route`` (per-prompt effects and attention, and the
    cost: the piece's seconds and those of one bare forward of every prompt)."""
    if plan.route is None:
        return None
    wp, rp, ap = plan.route_prompts

    def compute():
        with ctx.progress(len(wp) + len(rp) + len(ap), "dual-route scores", "prompt") as update:
            r = DR.route_scores(plan.loaded.model, wp, rp, ap, rows=plan.route.rows, progress=update)
        c = r.params["cost"]
        return {**{k: getattr(r, k) for k in ROUTE_ARRAYS},
                "cost": np.array([c["seconds"], c["bare_forward_seconds"], c["bare_forwards"]])}
    got = ctx.arrays("dual_route", compute)
    sec, bare, n = (float(v) for v in got["cost"])
    r = plan.route
    return DR.RouteScores(*(got[k] for k in ROUTE_ARRAYS), params={
        "n_words": r.n_words, "n_attention": r.n_attention, "seq_len": r.seq_len, "lengths": list(r.lengths),
        "word_pool": r.word_pool, "seed": r.seed, "rows": r.rows,
        "cost": {"seconds": sec, "bare_forward_seconds": bare, "bare_forwards": int(n), "ratio": sec / bare}})


def fv_ranking_scores(fv: F.FVScores, ranking: str) -> np.ndarray:
    """The ``[n_layers, n_heads]`` table the FV selection ranks: AIE (``signed``) or |AIE| (``absolute``)."""
    a = fv.aie()
    return a if ranking == "signed" else np.abs(a)


def _fv_check(plan: Plan, fv: F.FVScores) -> dict:
    """Zero-shot HITS@1 per task: the prompt alone, with the function vector of the top ``fv.top`` heads by AIE
    added after ``fv_layer``, and with the vector of ``fv.top`` random heads (seeded) made the same way."""
    loaded, model = plan.loaded, plan.loaded.model
    top = fv.ranking(signed=True)[:plan.fv.top]
    L, H = fv.aie().shape
    rng = np.random.default_rng(seed_for(plan.cfg.seed, 3))
    rand = [(int(i) // H, int(i) % H) for i in rng.permutation(L * H)[:plan.fv.top]]
    pad = function_probes.default_pad_id(loaded.tokenizer)
    rows = []
    for t, task in enumerate(fv.tasks):
        prompts = [p for p in plan.zero_shot if p.task == task]
        vectors = {ZS: None, FVEC: F.function_vector(model, fv.means[t], top),
                   RVEC: F.function_vector(model, fv.means[t], rand)}
        for name, vec in vectors.items():
            with F.added_to_residual(model, plan.fv_layer, vec):
                r = function_probes.run_probes(model, prompts, pad_id=pad, batch_size=plan.cfg.probes.batch_size)
            rows.append({"task": task, "vector": name, "n": len(r), "hits1": float(r.hits1.mean()),
                         "hits1_per_prompt": r.hits1.astype(int).tolist(),
                         "norm": None if vec is None else float(vec.norm())})
    return {"layer": plan.fv_layer, "top_heads": [list(h) for h in top], "random_heads": [list(h) for h in rand],
            "rows": rows}


# ---- the measures under ablation ---------------------------------------------------------------------

def _probes(plan: Plan, ctx: Context, conditions: list[Condition], fv: F.FVScores) -> pd.DataFrame:
    """10-shot HITS@1 under every condition, the heads' last-position output set to its mean over the FV scoring
    prompts of all tasks (Yin's accuracy ablation) and to zero: all conditions per prompt at once
    (:func:`~inductionlab.protocols.function_probes.last_position_conditions`), one piece ``probes/<task>`` per task."""
    D = fv.means.shape[-1]
    values = {"mean": fv.means.mean(0).float()}                 # each head's mean at the last position, all tasks
    if plan.cfg.probes.zero:
        values["zero"] = torch.zeros(*fv.means.shape[1:3], D)
    prompts = {}
    for p in plan.probe_prompts:
        prompts.setdefault(p.task, []).append(p)

    def probe(task: str, progress) -> dict:
        df = function_probes.last_position_conditions(plan.loaded.model, prompts[task], conditions, values,
                                                       rows=plan.fv.rows, progress=progress)
        return {c: df[c].to_numpy() for c in ("condition", "method", "index", "rank", "p_target")}
    got = ctx.pieces("probes", prompts, probe, desc="10-shot probes", unit="prompt", total=lambda t: len(prompts[t]))
    parts = []
    for task, arrays in got.items():
        d = pd.DataFrame({c: arrays[c] for c in ("condition", "method", "index", "rank", "p_target")})
        d.insert(2, "task", task)
        parts.append(d)
    df = pd.concat(parts, ignore_index=True)
    df["condition"], df["method"] = df["condition"].astype(str), df["method"].astype(str)
    df["hits1"] = (df["rank"] <= 1).astype(np.float64)
    return df


def _pilot_condition(conditions: list[Condition]) -> Condition:
    """The pilot's ablation for Y2: induction-exclusive at the largest fraction (the claim's own kind of condition)."""
    excl = [c for c in conditions if c.kind == "induction-excl-fv"]
    return max(excl, key=lambda c: c.k) if excl else next(c for c in conditions if c.kind != "intact")


def _y2_conditions(conditions: list[Condition]) -> list[Condition]:
    """The conditions Y2 reads (the two exclusive selections at each fraction): the sensitivity arm's."""
    return [c for c in conditions if c.kind in ("induction-excl-fv", "fv-excl-induction")]


def conditions_for(induction: np.ndarray, fv_table: np.ndarray, plan: Plan) -> list[Condition]:
    """Intact, then per fraction: top by induction, induction excluding FV's top, top by FV, FV excluding
    induction's top, and the random draws (shared by both rankings: the same counts and seeds)."""
    sel = plan.cfg.selection
    common = dict(fractions=plan.fractions, exclude_fraction=sel.exclude_fraction, n_draws=sel.n_draws,
                  random=sel.random, seed=plan.cfg.seed)
    if sel.random == "outside-top-n":
        from ...core.ablation import default_exclude_top_n
        common["exclude_top_n"] = default_exclude_top_n(induction.size)
    ind = selection_conditions(induction, exclude_scores=fv_table, exclude_label="fv", label="induction", **common)
    fvc = selection_conditions(fv_table, exclude_scores=induction, exclude_label="induction", label="fv",
                               intact=False, **{**common, "n_draws": 0})
    return ind + fvc


def _cmr(plan: Plan, ctx: Context) -> dict:
    """The piece ``cmr`` (``--cmr``): every head's attention CRP on the head scores' ``[BOS] S S`` sequences (same
    seed and pool, so the same S), the CMR grid (:func:`~inductionlab.protocols.cmr_fit.cmr_grid`, cached in the user
    cache dir) and each head's best fit."""
    cfg, loaded = plan.cfg, plan.loaded

    def compute():
        return attention_crp_cmr_fit(loaded.model, cfg.scores.sequences(cfg.seed), tokenizer=loaded.tokenizer,
                                     max_lag=cfg.cmr.max_lag, n_exps=cfg.cmr.n_exps, n_starts=cfg.cmr.n_starts,
                                     dist=ctx.dist)
    return dict(ctx.arrays("cmr", compute))


def phases(plan: Plan, ctx: Context) -> dict:
    """Head scores (and with ``--cmr`` the attention CRP and CMR fit), FV scores, the function vector's check,
    then the four measures under every condition."""
    cfg = plan.cfg
    scores = ctx.head_scores(cfg.scores, seed=cfg.seed)
    cmr = _cmr(plan, ctx) if cfg.cmr.enabled else None
    fv, fv_seconds = _fv_scores(plan, ctx)
    attribution = _attribution(plan, ctx, fv)
    fv_check = ctx.piece("fv_check", lambda: _fv_check(plan, fv))
    route = _route_scores(plan, ctx)
    fv_table = fv_ranking_scores(fv, cfg.selection.fv_ranking)
    conditions = conditions_for(scores["induction"], fv_table, plan)
    pilot, y2 = _pilot_condition(conditions), _y2_conditions(conditions)
    probes = _probes(plan, ctx, conditions, fv)
    icl_conds = conditions if cfg.icl_conditions == "all" else [conditions[0], *y2]     # conditions[0]: intact
    icl = TLS.measure(ctx, plan.icl, icl_conds, pilot, y2)
    runs = ctx.measure(Phase("lag", lag_probe.probe(plan.lag), conditions))
    return {"scores": scores, "cmr": cmr, "fv": fv, "fv_seconds": fv_seconds, "attribution": attribution,
            "attribution_timings": {k: ctx.timing(k) for k in ("attribution", "fv_scores")}, "fv_check": fv_check,
            "route": route, "conditions": conditions,
            "probes": probes, "icl": icl, "icl_cost": TLS.cost(icl, ctx.timing("icl"), len(icl_conds)), **runs}


def overlap_table(induction: np.ndarray, fv: F.FVScores, other: dict[str, np.ndarray],
                  route: DR.RouteScores | None = None) -> pd.DataFrame:
    """Overlap rows (:func:`~inductionlab.measures.overlap.head_overlap`): induction vs FV signed and vs FV
    absolute, FV (signed) vs each other attention-pattern score, and with ``route``: induction vs token copying
    and vs next-token matching (``token_attention``), concept copying vs FV and vs token copying (Feucht's
    overlaps; reported, never thresholded)."""
    signed, absolute = fv.aie(), np.abs(fv.aie())
    rows = [head_overlap(induction, signed, ("induction", "fv")),
            head_overlap(induction, absolute, ("induction", "fv_abs"))]
    rows += [head_overlap(v, signed, (k, "fv")) for k, v in other.items() if k != "induction"]
    if route is not None:
        s = route.scores()
        rows += [head_overlap(induction, s["token_copying"], ("induction", "token_copying")),
                 head_overlap(induction, s["token_attention"], ("induction", "token_attention")),
                 head_overlap(s["concept_copying"], signed, ("concept_copying", "fv")),
                 head_overlap(s["concept_copying"], s["token_copying"], ("concept_copying", "token_copying"))]
    return pd.DataFrame(rows)


def result(plan: Plan, pieces: dict) -> HeadTypesStudy:
    hs, fv, conditions = pieces["scores"], pieces["fv"], pieces["conditions"]
    lag = LagProbeResult.from_parts(pieces["lag"].arrays, conditions, plan.lag, pieces["lag"].words)
    probes = pieces["probes"]
    icl_run = pieces["icl"]
    icl = icl_run.table
    counts = {max(1, int(f * hs["induction"].size)): f for f in plan.fractions}
    drops = drop_table(conditions, lambda name: per_trial(name, probes, icl, lag), counts)
    route = pieces.get("route")
    overlap = overlap_table(hs["induction"], fv, hs.scores, route)
    intact = icl_run.arrays["intact"]
    sens = {m: window_table({"intact": intact, **arms}) for m, arms in icl_run.sensitivity.items()}
    verd = decide(drops, probes, icl, lag, conditions, overlap, counts, icl_cost=pieces["icl_cost"], icl_sensitivity=sens)
    verd = TLS.with_cap_note(verd, "Y2", icl_run)
    aie = fv.aie()
    table = fv.table()
    allrows = table[table.task == "all"].set_index(["layer", "head"])

    def heads(order, n=10):
        return [{"layer": l, "head": h, "aie": float(aie[l, h]), "ci_low": float(allrows.loc[(l, h), "ci_low"]),
                 "ci_high": float(allrows.loc[(l, h), "ci_high"]), "induction": float(hs["induction"][l, h])}
                for l, h in order[:n]]
    record = {
        "seeds": {"study": plan.cfg.seed, "fv_prompts": "icl_tasks.make_prompts(seed)",
                  "probe_prompts": "seed_for(seed, 1)", "zero_shot_prompts": "seed_for(seed, 2)",
                  "fv_random_heads": "seed_for(seed, 3)", "random_draws": "permutation seed_for(seed, count, draw)",
                  "text_windows": "seed_for(seed, 11)", "pilot_windows": "seed_for(seed, 12)"},
        "token_loss": TLS.record(plan.icl, icl_run) | {"cost": pieces["icl_cost"]},
        "exclusion": {"fraction": plan.cfg.selection.exclude_fraction, "heads_excluded":
                      excluded_count(hs["induction"].size, plan.cfg.selection.exclude_fraction),
                      "of_heads": int(hs["induction"].size), "rule": "max(1, int(fraction x heads))"},
        "head_scores": {**{k: v.tolist() for k, v in hs.scores.items()}, "fv": aie.tolist(), "params": hs.params},
        "fv": {"params": fv.params, "tasks": fv.tasks, "p_clean": fv.p_clean.mean(1).tolist(),
               "p_corrupted": fv.p_base.mean(1).tolist()},
        "top_fv_heads": heads(fv.ranking(signed=True)),
        "top_fv_heads_absolute": heads(fv.ranking(signed=False)),
        "bottom_fv_heads": heads(fv.ranking(signed=True)[::-1]),
        "fv_check": {k: v for k, v in pieces["fv_check"].items() if k != "rows"} |
                    {"rows": [{k: v for k, v in r.items() if k != "hits1_per_prompt"} for r in pieces["fv_check"]["rows"]]},
        "dual_route": None if route is None else {
            "params": route.params,
            "top": {n: [{"layer": l, "head": h, "score": v} for l, h, v in route.top(n)] for n in DR.ROUTE_SCORES},
            "p_corrupt": {"word_p_e1": float(route.p_word[:, 0].mean()),
                          "random_p_e0": float(route.p_random[:, 1].mean())}},
        "attribution": None if pieces.get("attribution") is None else attribution_record(
            fv, pieces["attribution"], pieces["fv_seconds"], pieces["attribution_timings"]),
        "conditions": [c.to_dict() for c in conditions],
        "overlap": overlap.to_dict(orient="records"),
        "drops": drops.to_dict(orient="records"),
        "verdicts": [v.to_dict() for v in verd],
    }
    cmr = pieces.get("cmr")
    if cmr is not None:
        d = cmr["distance"]
        like = np.nan_to_num(d, nan=np.inf) < C.CMR_LIKE_THRESHOLD
        record["cmr"] = {
            "definition": "attention CRP: raw attention probability, second-copy query -> first-copy key at each lag "
                          "from the earlier occurrence; CMR distance on lags -5..5, min-shifted, max-scaled, "
                          "variance-normalised (Ji-An et al. 2024); cmr_like score = 1 / (1 + distance)",
            "threshold": C.CMR_LIKE_THRESHOLD, "n_cmr_like": int(like.sum()),
            "share_per_layer": like.mean(1).tolist(),
            "grid": {"n_exps": plan.cfg.cmr.n_exps, "n_starts": plan.cfg.cmr.n_starts, "seed": 0,
                     "seconds": float(cmr["grid_seconds"]), "cpu_seconds": float(cmr["grid_cpu_seconds"]),
                     "from_cache": bool(cmr["grid_from_cache"])},
        }
    return HeadTypesStudy(loaded=plan.loaded, config=plan.cfg, scores=hs, fv=fv, fv_check=pieces["fv_check"],
                          conditions=conditions, probes=probes, icl=icl, lag=lag, drops=drops, overlap=overlap,
                          route=route, cmr=cmr, attribution=pieces.get("attribution"), verdicts=verd, record=record)


def run_head_types(loaded: LoadedModel, cfg: HeadTypesConfig, out: str | Path,
                   opts: RunOptions | None = None) -> HeadTypesStudy:
    """Run (or resume) the study on ``loaded`` and write the run directory ``out``
    (:func:`~inductionlab.studies.engine.run_study` of :data:`~inductionlab.studies.head_types.config.SPEC`).

    Raises:
        InductionLabError: bad config, what :func:`prepare` refuses, ``out`` holding another study.
        TypeError: ``loaded`` not a LoadedModel, ``cfg`` not a HeadTypesConfig."""
    return run_study(SPEC, loaded, cfg, out, opts)


STUDY: Study[HeadTypesConfig, Plan, HeadTypesStudy] = Study(prepare, phases, result, write, summary)

__all__ = ["STUDY", "HeadTypesStudy", "Plan", "prepare", "phases", "result", "run_head_types", "kept_fractions",
           "fv_ranking_scores", "conditions_for", "overlap_table", "attribution_roles", "attribution_record",
           "ROLE_TOP", "ROLE_DLA"]
