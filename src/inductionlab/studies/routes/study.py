"""Which route carries the seed's effects (``inductionlab study routes``; SPEC §10, issue 26): the top heads of
each ranking — token induction (the induction score, computed here), concept induction, CMR-like, FV (columns of
``--scores-file``) — ablated, with exclusions where a claim compares two rankings, against seeded random heads,
under four measures.

Pieces (each checkpointed in ``<out>/checkpoints/``; a re-run with the same ``--out`` resumes):

1. the attention-pattern head scores (SPEC §3) → ``scores.json``;
2. the conditions (:func:`conditions_for`): intact; per head count k and ranking r, ``r-k`` (top k by r); for
   claim R2, ``<token>-excl-<concept>-k`` (the token ranking's top k after removing the concept ranking's top k:
   two disjoint sets); ``random-all-k-d<d>`` (k heads of all heads, seeded ``seed_for(seed, k, d)``);
3. under each condition (one phase each, every condition on the same trials, sharded over torchrun's ranks):
   the all-cue lag probe (``lag/<condition>``), few-shot serial recall (``recall/…``), the word-list copy probe
   (:mod:`inductionlab.protocols.word_copy`, ``copy/…``) and the token-loss ICL score
   (:mod:`inductionlab.studies.token_loss`: a pilot ``icl_pilot`` sizes the windows ``icl_sample_size``, then
   ``icl/…``; the log-slope benefit D decides R3);
4. the cost: one bare forward pass (no instrumentation, last-position logits) over each probe's trials
   → ``cost.json``, and the phases' seconds of this session as a ratio to it per condition.

Then ``results.json``, ``drops.csv``, ``conditions.csv``, ``copy_outputs.csv``, ``drops_by_ranking.png`` and
``report.md``, with the verdicts R1–R3 of :mod:`inductionlab.studies.routes.verdicts` (rules fixed in code before
the first real run).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ...config import to_dict
from ...core.ablation import Condition, ranked_conditions, top_k_heads
from ...core.models import LoadedModel, ran_identity
from ...core.placement import execution_device
from ...core.scores import HeadScores
from ...errors import InductionLabError
from ...measures.serial_position import by_lag, cue_log_enrichment, lag_rank, lags_of
from ...names import SCORE_NAMES
from ...protocols import lag_probe, serial_recall, word_copy
from ...protocols import token_loss as TLP
from ...protocols.configs import LagProbeConfig, SerialRecallConfig, WordCopyConfig
from ...protocols.lag_probe import LagProbeResult
from ...protocols.runner import Probe, Trials, auto_batch_size, forward_logits, model_inputs, trim_padding
from ...runtime import distributed as D
from .. import token_loss as TLS
from ..configs import RankingConfig, check_trial_ids, read_score_file
from ..engine import Context, Phase, StudyResult, run_study
from ..spec import RunOptions, Study, StudyPlan
from .config import SPEC, RoutesConfig
from .report import summary, write
from ...measures.stats import drop_table
from .verdicts import decide, exclusive_kind, needed_rankings

PHASES = ("lag", "recall", "copy", "icl")


@dataclass(kw_only=True)
class Plan(StudyPlan):
    """What :func:`prepare` settles for this model: head counts, the rankings read from the scores file, the
    protocols' configs with the study's seed and method, the copy probe's trials, the text windows, ``params``."""
    loaded: LoadedModel
    cfg: RoutesConfig
    sizes: list[int]
    file_tables: dict[str, np.ndarray]
    names: dict[str, str]
    lag: LagProbeConfig
    recall: SerialRecallConfig
    copy: WordCopyConfig
    copy_trials: Trials
    icl: TLS.TokenLossPlan
    lag_words: LagProbeConfig | None = None     # claim R2's multi-token arm (RoutesConfig.word_lag)


@dataclass(kw_only=True)
class RoutesStudy(StudyResult):
    """Everything a finished study computed (also written to the run directory)."""
    loaded: LoadedModel
    config: RoutesConfig
    scores: HeadScores
    rankings: dict[str, np.ndarray]     # ranking -> [n_layers, n_heads]
    conditions: list[Condition]
    drops: pd.DataFrame                 # per arm and measure: value, CI, drop vs intact (stats.drop_table)
    copy_outputs: pd.DataFrame          # per condition and copy trial: kind, item, greedy continuation, outcome
    cost: dict


def prepare(loaded: LoadedModel, cfg: RoutesConfig) -> Plan:
    """The checks that need the model, before anything is written: head counts on this model's heads, the scores
    file's rows, every probe's trials on this tokenizer, the text windows.

    Raises:
        InductionLabError: what the checks refuse (one line naming the option and the fix)."""
    ident = ran_identity(loaded)
    L, H = ident["n_layers"], ident["n_heads"]
    N = L * H
    sel = cfg.selection
    sizes = sel.sizes(N)
    names = {"token": sel.token_ranking, "concept": sel.concept_ranking, "cmr": sel.cmr_ranking}
    two = all(r in sel.rankings for r in needed_rankings("R2", names))
    for k in sizes:
        if k > N or (two and 2 * k > N):
            raise InductionLabError(f"k={k}: the model has {N} heads" + (" and claim R2 needs two disjoint sets of k"
                                    if two else "") + "; lower --ks or --fractions")
    from_file = [r for r in sel.rankings if r not in SCORE_NAMES]
    file_tables = read_score_file(sel.scores_file, (L, H), from_file) if from_file else {}
    lag, recall, copy = cfg.protocols()
    check_trial_ids(lag_probe.build_trials(loaded, replace(lag, n_permutations=2)), loaded, "lag probe")
    lag_probe.check_cues(loaded, lag)
    lag_words = cfg.word_lag()
    if lag_words is not None:                  # refuses a tokenizer without enough such words, before any forward
        check_trial_ids(lag_probe.build_trials(loaded, replace(lag_words, n_permutations=2)), loaded, "lag probe")
        lag_probe.check_cues(loaded, lag_words)
    check_trial_ids(serial_recall.build_trials(loaded, replace(recall, n_trials=1)), loaded, "serial recall")
    copy_trials = word_copy.build_trials(loaded, copy)
    check_trial_ids(copy_trials, loaded, "copy probe")
    icl = TLS.plan(loaded, cfg.icl, cfg.seed)
    params = {"config": to_dict(cfg), "sizes": sizes, "rankings_from_file": from_file,
              **(RankingConfig(scores_file=sel.scores_file).params() if from_file else {}),
              **icl.params(), "copy_words": len(copy_trials.words)}
    return Plan(loaded=loaded, cfg=cfg, sizes=sizes, file_tables=file_tables, names=names, lag=lag, recall=recall,
                copy=copy, copy_trials=copy_trials, icl=icl, params=params, lag_words=lag_words)


def exclusive_heads(scores: np.ndarray, excluded: np.ndarray, k: int) -> list[tuple[int, int]]:
    """The top ``k`` heads by ``scores`` after removing the top ``k`` by ``excluded`` (the two sets are disjoint;
    ties by (layer, head) order, as :func:`~inductionlab.core.ablation.top_k_heads`)."""
    banned = set(top_k_heads(excluded, k))
    return [h for h in top_k_heads(scores, scores.size) if h not in banned][:k]


def conditions_for(tables: dict[str, np.ndarray], plan: Plan) -> list[Condition]:
    """Intact; per ranking its top k at every k (:func:`~inductionlab.core.ablation.ranked_conditions`); for claim
    R2 (both rankings present) the token ranking's top k excluding the concept ranking's top k; the random draws
    of k heads of all heads (``random-all-<k>-d<d>``, shared by every ranking)."""
    cfg, sel = plan.cfg, plan.cfg.selection
    out: list[Condition] = []
    for i, r in enumerate(sel.rankings):
        conds = ranked_conditions(tables, plan.sizes, rank_by=r, random="all", n_draws=0, seed=cfg.seed, intact=i == 0)
        out += conds
    tok, con = plan.names["token"], plan.names["concept"]
    if tok in tables and con in tables:
        kind = exclusive_kind(tok, con)
        out += [Condition(f"{kind}-{k}", kind, k, 0, exclusive_heads(tables[tok], tables[con], k)) for k in plan.sizes]
    rand = ranked_conditions(tables, plan.sizes, rank_by=sel.rankings[0], random="all", n_draws=sel.n_draws,
                             seed=cfg.seed, intact=False)
    return out + [c for c in rand if c.kind == "random"]


def ranking_tables(scores: HeadScores, plan: Plan) -> dict[str, np.ndarray]:
    """ranking -> ``[n_layers, n_heads]``: the computed scores, then the scores file's columns."""
    return {r: (scores[r] if r in scores.scores else plan.file_tables[r]) for r in plan.cfg.selection.rankings}


def probes(plan: Plan) -> dict[str, Probe]:
    """Three probes: lag, serial recall, the copy probe (its trials built by :func:`prepare`); and ``lag_words``,
    claim R2's multi-token lag probe, when asked for. The token-loss score's probe is built once its windows are
    sized (:func:`~inductionlab.studies.token_loss.measure`)."""
    words = {"lag_words": lag_probe.probe(plan.lag_words)} if plan.lag_words is not None else {}
    return {"lag": lag_probe.probe(plan.lag), "recall": serial_recall.probe(plan.recall),
            "copy": replace(word_copy.probe(plan.copy), build_trials=lambda loaded: plan.copy_trials)} | words


def pilot_condition(conditions, plan: Plan) -> Condition:
    """The pilot's ablation for R3: the CMR ranking's top k at the largest k (else the first ablated condition)."""
    cmr = [c for c in conditions if c.kind == plan.names["cmr"]]
    return max(cmr, key=lambda c: c.k) if cmr else next(c for c in conditions if c.kind != "intact")


def bare_forward(ctx: Context, plan: Plan, bound: dict[str, Probe], conditions) -> dict:
    """Seconds of one bare forward pass (no instrumentation, the last position's logits) over each probe's trials
    in its batches (this rank's batches under torchrun), and each phase's seconds of this session per condition
    as a ratio to it (None where the phase was loaded from a checkpoint)."""
    loaded, model = plan.loaded, plan.loaded.model
    device = execution_device(model)
    bare, ratio = {}, {}
    for key, p in bound.items():
        tr = ctx.trials(p)
        t = tr.tensors
        bs = p.trials_per_batch(loaded, tr) or auto_batch_size(loaded, t["ids"].shape[1])
        t0 = time.perf_counter()
        with torch.inference_mode():
            for s in D.local_batches(len(tr), bs, ctx.dist):
                batch = trim_padding({k: v[s:s + bs].to(device) for k, v in t.items()})
                kw = model_inputs(batch)
                forward_logits(model, kw.pop("input_ids"), 1, **kw)
        bare[key] = time.perf_counter() - t0
        spent = ctx.timing(key) or 0.0
        ratio[key] = spent / (len(conditions) * bare[key]) if spent > 0 and bare[key] > 0 else None
    return {"bare_forward_s": bare, "phase_s": {k: ctx.timing(k) for k in bound},
            "n_conditions": len(conditions), "ratio_per_condition": ratio,
            "definition": "phase seconds of this session / (conditions x seconds of one bare forward over the same "
                          "trials in the same batches); the phase's extra forwards (all-cue packing, greedy tokens, "
                          "a resample source run) are what the ratio shows"}


def phases(plan: Plan, ctx: Context) -> dict:
    """Head scores, the conditions, the four measures under every condition, the cost."""
    cfg = plan.cfg
    scores = ctx.head_scores(cfg.scores, seed=cfg.seed)
    tables = ranking_tables(scores, plan)
    conditions = conditions_for(tables, plan)
    bound = probes(plan)
    keys = [k for k in (*PHASES, "lag_words") if k in bound]
    runs = ctx.measure(*(Phase(k, bound[k], conditions) for k in keys))
    icl = TLS.measure(ctx, plan.icl, conditions, pilot_condition(conditions, plan))
    bound["icl"] = TLP.probe(icl.windows, plan.cfg.icl, plan.icl.early, plan.icl.late)
    cost = ctx.piece("cost", lambda: bare_forward(ctx, plan, bound, conditions), timing="bare_forward")
    return {"scores": scores, "tables": tables, "conditions": conditions, "cost": cost, "icl": icl,
            "icl_cost": TLS.cost(icl, ctx.timing("icl"), len(conditions)), **runs}


class Values:
    """Per-trial measures of every condition (:data:`~inductionlab.studies.routes.verdicts.MEASURES`), computed
    once per condition: ``values(name) -> {measure: [n_trials] float64}``."""

    def __init__(self, plan: Plan, pieces: dict):
        self.plan, self.pieces = plan, pieces
        self.lag = LagProbeResult.from_parts(pieces["lag"].arrays, pieces["conditions"], plan.lag, pieces["lag"].words)
        self.words = (LagProbeResult.from_parts(pieces["lag_words"].arrays, pieces["conditions"], plan.lag_words,
                                                pieces["lag_words"].words) if "lag_words" in pieces else None)
        self.cache: dict[str, dict] = {}

    def __call__(self, name: str) -> dict[str, np.ndarray]:
        if name not in self.cache:
            self.cache[name] = self._compute(name)
        return self.cache[name]

    def _compute(self, name: str) -> dict[str, np.ndarray]:
        lag, p = self.lag, self.pieces
        cp, L = np.asarray(lag.cue_positions), lag.config.list_length
        plus1 = int(np.flatnonzero(lags_of(L) == 1)[0])
        probs = lag.cue_probs[name]
        enrich = cue_log_enrichment(probs, lag.list_ids, cp, lag.config.far_lag)
        out = {"lag_plus1": by_lag(probs, cp)[1][:, plus1],
               "lag_enrichment": by_lag(probs, cp, transform=enrich)[1][:, plus1],
               "temporal_factor": np.nanmean(lag_rank(probs, cp), axis=1),
               "recall_accuracy": p["recall"].arrays[name]["correct"].mean(1).astype(np.float64)}
        for kind, ms in word_copy.kind_measures(p["copy"].arrays[name], self.plan.loaded.tokenizer).items():
            out.update({f"copy_{m}_{kind}": v for m, v in ms.items()})
        icl = p["icl"].arrays[name]
        out["icl_benefit"] = icl["single"].astype(np.float64)
        out["icl_slope"] = icl["slope"].astype(np.float64)
        if np.isfinite(icl["band"]).any():
            out["icl_band"] = icl["band"].astype(np.float64)
        if self.words is not None:                 # claim R2's multi-token arm
            w = self.words
            wp, wcp = w.cue_probs[name], np.asarray(w.cue_positions)
            out["lag_word_plus1"] = w.whole_word(name, 1)
            out["lag_word_logp_plus1"] = w.whole_word(name, 1, log=True)
            out["lag_first_plus1"] = by_lag(wp, wcp)[1][:, plus1]
            out["lag_first_enrichment"] = by_lag(wp, wcp, transform=cue_log_enrichment(
                wp, w.list_ids, wcp, w.config.far_lag))[1][:, plus1]
        return out


def copy_outputs(plan: Plan, pieces: dict) -> pd.DataFrame:
    """Per condition and copy trial: kind, list, the 10th item and the greedy continuation (decoded), p_first,
    top1, verbatim, paraphrase (empty without ``generate``)."""
    tok = plan.loaded.tokenizer
    rows = []
    for c in pieces["conditions"]:
        a = pieces["copy"].arrays[c.name]
        outc = word_copy.copy_outcomes(tok, a["generated"], a["target"], a["target_len"]) if "generated" in a else {}
        for i in range(len(a["kind"])):
            n = int(a["target_len"][i])
            rows.append({"condition": c.name, "kind": word_copy.KINDS[int(a["kind"][i])],
                         "list": int(a["list_index"][i]), "item": tok.decode([int(x) for x in a["target"][i, :n]]),
                         "continuation": tok.decode([int(x) for x in a["generated"][i]]) if "generated" in a else "",
                         "p_first": float(a["p_first"][i]), "top1": bool(a["top1"][i]),
                         **{k: bool(v[i]) for k, v in outc.items()}})
    return pd.DataFrame(rows)


def result(plan: Plan, pieces: dict) -> RoutesStudy:
    hs, tables, conditions = pieces["scores"], pieces["tables"], pieces["conditions"]
    values = Values(plan, pieces)
    drops = drop_table(conditions, values)
    verd = TLS.with_cap_note(decide(conditions, values, plan.cfg.selection.rankings, plan.names,
                                    icl_cost=pieces["icl_cost"]), "R3", pieces["icl"])

    def top(table, n=10):
        return [{"layer": l, "head": h, "score": float(table[l, h])} for l, h in top_k_heads(table, min(n, table.size))]
    record = {
        "seeds": {"study": plan.cfg.seed, "random_draws": "random_heads over all heads, seed_for(seed, k, draw)",
                  "lag_lists": "seed_for(seed, list)", "recall_lists": "seed_for(seed, 7, trial)",
                  "copy_lists": "seed_for(seed, 13, list)", "text_windows": "seed_for(seed, 11)",
                  "pilot_windows": "seed_for(seed, 12)"},
        "token_loss": TLS.record(plan.icl, pieces["icl"]) | {"cost": pieces["icl_cost"]},
        "head_scores": {k: v.tolist() for k, v in hs.scores.items()} | {"params": hs.params},
        "rankings": {r: {"top": top(t), "source": "computed" if r in hs.scores else plan.cfg.selection.scores_file}
                     for r, t in tables.items()},
        "claim_rankings": plan.names,
        "conditions": [c.to_dict() for c in conditions],
        "drops": drops.to_dict(orient="records"),
        "cost": pieces["cost"],
        "paraphrase_definition": (f"not verbatim, and the first alphabetic run of the greedy continuation is a word "
                                  f"of Zipf frequency >= {word_copy.REAL_WORD_ZIPF} (wordfreq) that is neither the "
                                  "item nor a prefix of it, case ignored"),
        "verdicts": [v.to_dict() for v in verd],
    }
    return RoutesStudy(loaded=plan.loaded, config=plan.cfg, scores=hs, rankings=tables, conditions=conditions,
                       drops=drops, copy_outputs=copy_outputs(plan, pieces), cost=pieces["cost"], verdicts=verd,
                       record=record)


def run_routes(loaded: LoadedModel, cfg: RoutesConfig, out: str | Path, opts: RunOptions | None = None) -> RoutesStudy:
    """Run (or resume) the study on ``loaded`` and write the run directory ``out``
    (:func:`~inductionlab.studies.engine.run_study` of :data:`~inductionlab.studies.routes.config.SPEC`).

    Raises:
        InductionLabError: bad config (a ranking absent from the scores file: one line naming the file and its
            columns, before the model is read), what :func:`prepare` refuses, ``out`` holding another study.
        TypeError: ``loaded`` not a LoadedModel, ``cfg`` not a RoutesConfig."""
    return run_study(SPEC, loaded, cfg, out, opts)


STUDY: Study[RoutesConfig, Plan, RoutesStudy] = Study(prepare, phases, result, write, summary)

__all__ = ["STUDY", "RoutesStudy", "Plan", "prepare", "phases", "result", "run_routes", "conditions_for", "exclusive_heads",
           "ranking_tables", "bare_forward", "Values", "pilot_condition"]
