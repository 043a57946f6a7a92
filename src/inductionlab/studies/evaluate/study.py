"""The evaluation study (``inductionlab evaluate MODEL``, SPEC §8): how well a model learns in
context, and how much of that rests on its top induction heads compared with matched random heads.

Run by :func:`inductionlab.studies.engine.run_study`: every piece is checkpointed in ``<out>/checkpoints/``
(the same command continues an interrupted run from its finished pieces). The measures are probes
(:class:`~inductionlab.protocols.runner.Probe`) run as phases over conditions (``<phase>/<condition>.npz``),
so under torchrun every one is sharded by batch (rank 0 alone writes); a method that needs a reference
value (``mean``) gets the first 8 induction-loss sequences ``[BOS] S S`` in every measure:

1. head scores (SPEC §3) → ``scores.json``;
2. function-style ICL probes, intact (:mod:`inductionlab.protocols.icl_tasks`, :mod:`inductionlab.protocols.function_probes`):
   HITS@1 / HITS@3 on the first answer token per task at every number of shots (default 0, 1,
   10) and the label-permutation control (k ≥ 2) → ``hits/intact.npz``;
3. ICL score on natural held-out text (Olsson et al. 2022, :mod:`inductionlab.protocols.icl_score`; only with
   ``shards``: windows from the MD5 held-out split that start at document starts — without
   shards the ICL score is skipped and the report says so), the induction loss on repeated
   random tokens and associative recall → ``icl/``, ``induction/``, ``recall/`` ``<condition>.npz``
   (per-position losses and top-1 hits; intact and under every ablation);
4. perplexity guard on the held-out split (:mod:`inductionlab.protocols.perplexity`; only with ``shards``,
   whose tokenizer must be the model's: a mismatch is refused before anything is written) →
   ``perplexity.json``;
5. load-bearing test (SPEC §3, §8): for each ablation variant — ``per-layer-<p>pct`` (per layer the
   top ``ceil(p·heads)`` induction heads, at least one: :func:`~inductionlab.core.ablation.per_layer_top_p`)
   against ``n_draws`` seeded draws of matched random heads (the same number per layer, never a
   chosen head: :func:`~inductionlab.core.ablation.matched_random_heads`), and ``top-<k>`` (global top-k
   against k random heads outside the top N = min(300, heads/2), as in the temporal study) —
   the probes at ``load_bearing.shots`` (default 10; intact prompts, no control), the ICL
   benefit and the induction benefit, each condition → ``hits_ablated/<condition>.npz`` (and the
   token losses above);
6. lm-evaluation-harness (optional, :mod:`inductionlab.protocols.lm_eval_tasks`): our probes exported as
   offline lm-eval tasks (``inductionlab_icl``, ``inductionlab_icl_<task>``) and/or installed
   lm-eval tasks by name, intact → ``lm_eval.json`` and (unless ``lm_eval.ablated`` is off) under every
   load-bearing condition, through the model type ``inductionlab``
   (:mod:`inductionlab.protocols.lm_eval_model`; ``mean`` from the probes' reference batch) →
   ``lm_eval_ablated/<condition>.json``; the drop table ``tables/lm_eval_drops.csv``.

Then ``results.json``, ``tables/*.csv``, ``plots/*.png`` and ``report.md``.

Measures of the load-bearing test (each larger = better, per unit, paired across conditions):
HITS@1 of every prompt at ``load_bearing.shots`` shots (all tasks pooled), the ICL benefit
``loss(early) − loss(late)`` of every held-out window, the induction benefit ``loss(first copy)
− loss(second copy)`` of every random sequence. Their relative change ``mean(ablated) /
mean(intact) − 1`` with a paired delta-method 95% CI and the papers' headline form ("−22.6%")
come from :func:`inductionlab.measures.load_bearing_eval.drops_table`; random draws are pooled per unit.

This module holds ``prepare`` (the inputs: shards, held-out windows, token pool, prompts, all checked
before anything is written), ``phases`` and ``result``, :class:`EvaluateResult` and :func:`run_evaluate`;
the config is in :mod:`~inductionlab.studies.evaluate.config`, the tidy tables in
:mod:`~inductionlab.studies.evaluate.tables`, the run directory's files in :mod:`~inductionlab.studies.evaluate.report`.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ...config import to_dict
from ...core.ablation import Condition
from ...core.models import LoadedModel
from ...core.scores import HeadScores
from ...core.stimuli import random_sequences
from ...errors import InductionLabError
from ...measures.load_bearing_eval import score_concentration
from ...names import TASK_NAMES
from ...protocols import function_probes, icl_score
from ...protocols.function_probes import probe_rows
from ...protocols.icl_score import (heldout_windows, icl_positions, icl_summary, induction_summary, model_context,
                                    recall_sequences, recall_summary, scaled_positions)
from ...protocols.icl_tasks import Prompt, build_tasks, make_all_prompts
from ...protocols.runner import REFERENCE_TRIALS, Probe, Trials, needs_reference
from ..engine import Context, Phase, StudyResult, run_study
from ..spec import RunOptions, Study, StudyPlan
from .config import SPEC, EvaluateConfig
from .report import summary, write
from .tables import drops_by_measure, hits_table, icl_table, lm_eval_drops, load_bearing_conditions, per_sequence

INTACT = Condition("intact", "intact")


@dataclass(kw_only=True)
class EvaluateResult(StudyResult):
    """Everything a finished evaluation computed (also written to the run directory).

    Attributes:
        probe_rows: one row per prompt and condition (``condition, variant, task, shots, control,
            index, rank, hits1, hits3, p_target``).
        hits: :func:`~inductionlab.protocols.function_probes.summarize_hits` by condition × shots × control
            (random draws also pooled per variant as ``random-<variant>``), macro rows included.
        icl: ``"intact"`` -> ``{"icl": icl_score dict | None, "induction": induction_loss dict, "recall":
            associative recall dict}``; each ablated condition -> its per-sequence values of every
            :data:`~inductionlab.studies.evaluate.tables.SEQUENCE_MEASURES` (None without held-out windows).
        icl_summary: :func:`icl_table` (ICL score, ICL and induction benefits with CIs per condition).
        drops: :func:`~inductionlab.measures.load_bearing_eval.drops_table` rows with a ``measure`` column.
        concentration: :func:`~inductionlab.measures.load_bearing_eval.score_concentration` of the induction score.
        lm_eval: lm-eval on the intact model (:func:`~inductionlab.protocols.lm_eval_tasks.run_lm_eval`; None without tasks).
        lm_eval_drops: :func:`~inductionlab.studies.evaluate.tables.lm_eval_drops`: every task's metrics per condition
            and their drop vs intact (empty without tasks).
        notes: what was skipped and why.
        pool: LongTensor of the ids random probe tokens were drawn from (:func:`token_pool`).
    """
    loaded: LoadedModel
    config: EvaluateConfig
    scores: HeadScores
    conditions: list[Condition]
    variants: dict[str, str]
    probe_rows: pd.DataFrame
    hits: pd.DataFrame
    icl: dict[str, dict]
    icl_summary: pd.DataFrame
    perplexity: dict | None
    drops: pd.DataFrame
    concentration: dict
    lm_eval: dict | None
    notes: list[str]
    pool: torch.Tensor | None = None
    lm_eval_drops: pd.DataFrame = field(default_factory=pd.DataFrame)


@dataclass(kw_only=True)
class Plan(StudyPlan):
    """What the evaluation reads besides the model, made and checked by :func:`prepare` before any file
    is written, and the run's ``params``."""
    loaded: LoadedModel
    cfg: EvaluateConfig
    shards: object | None                 # TokenShards (None without shards)
    windows: torch.Tensor | None          # held-out windows of the ICL score [n, T] (None without shards)
    pool: torch.Tensor                    # ids of the random tokens (:func:`token_pool`)
    prompts: list[Prompt]                 # every probe prompt (all tasks, shots and controls)
    bos: int | None                       # the probes' BOS (None without ``cfg.probes.bos``)
    notes: list[str]                      # what was skipped and why
    file_scores: dict = field(default_factory=dict)   # the scores file's columns the selection names

    @property
    def ablation_prompts(self) -> list[Prompt]:
        """The prompts of the load-bearing test: intact controls at ``load_bearing.shots`` shots."""
        return [p for p in self.prompts if p.shots == self.cfg.load_bearing.shots and p.control == "intact"]


# -- prepare: the inputs, checked before anything is written --------------------------------------
def prepare(loaded: LoadedModel, cfg: EvaluateConfig) -> Plan:
    """Open the shards, draw the held-out windows, the token pool and the prompts, and refuse (one
    InductionLabError, nothing written) whatever does not fit the model.

    Raises:
        InductionLabError: shards from another tokenizer or without a long enough document, a token pool
            smaller than a measure needs, a task with too few well-defined items for the shots, probes or
            sequences beyond the model's vocabulary or context, an ablation larger than the model allows,
            an unknown lm-eval task or one whose dataset is not on disk."""
    tok = loaded.tokenizer
    bos = _bos_ids(loaded, cfg)[0]
    notes: list[str] = []
    shards = _open_shards(cfg.shards, loaded) if cfg.shards is not None else None
    windows = _windows(cfg, loaded, shards, bos) if shards is not None else None
    pool = token_pool(loaded, cfg, shards)
    for what, need in (("induction loss", cfg.induction.seq_len), ("head scores", cfg.scores.seq_len),
                       ("associative recall", 2 * cfg.recall.n_pairs)):
        if need > len(pool):
            raise InductionLabError(f"{what} needs {need} distinct tokens but the token pool ({cfg.token_pool}) has "
                                    f"{len(pool)}; lower it or use another pool")
    prompts = make_all_prompts(build_tasks(cfg.probes.tasks), tok, shots=cfg.probes.shots,
                               n_prompts=cfg.probes.n_prompts, seed=cfg.seed, permuted=cfg.probes.permutation_control,
                               bos_id=bos)
    _check_fits_model(loaded, cfg, prompts)
    _check_lm_eval(cfg, tok)
    if shards is None:
        notes.append("no --shards: the ICL score (natural held-out text) and the perplexity guard were skipped")
    ident = loaded.identity
    file_scores = cfg.load_bearing.score_tables((ident["n_layers"], ident["n_heads"]))
    return Plan(loaded=loaded, cfg=cfg, shards=shards, windows=windows, pool=pool, prompts=prompts, bos=bos,
                notes=notes, file_scores=file_scores, params=_params(cfg, shards))


def _params(cfg: EvaluateConfig, shards) -> dict:
    """What defines the result (batch sizes change nothing but speed: left out)."""
    config = to_dict(cfg)
    for k in ("probes", "icl", "induction", "recall", "perplexity", "lm_eval"):
        config[k].pop("batch_size", None)
    shard_id = None
    if shards is not None:
        m = shards.manifest
        shard_id = {"path": str(shards.path), "corpus_sha256": m.get("corpus_sha256"),
                    "heldout_sha256": m["splits"]["heldout"].get("sha256"),
                    "tokenizer": m.get("tokenizer", {}).get("spec")}
    return {"config": config, "shards": shard_id, **cfg.load_bearing.params()}


def _check_fits_model(loaded: LoadedModel, cfg: EvaluateConfig, prompts: list[Prompt]) -> None:
    """The probes' token ids within the model's vocabulary, ``[BOS] S S`` within its context and the
    ablation variants within its heads (InductionLabError otherwise)."""
    ident = loaded.identity
    top = max((max(p.input_ids + [p.target_id]) for p in prompts), default=-1)
    if ident.get("vocab_size") and top >= ident["vocab_size"]:
        raise InductionLabError(f"the probes use token id {top} but the model's vocabulary has {ident['vocab_size']} "
                                "ids: the tokenizer is not the model's own; load the model with its tokenizer")
    ctx = model_context(loaded.model)
    for what, T, opt in (("head scores", cfg.scores.seq_len, "scores.seq_len (--score-seq-len)"),
                         ("induction loss", cfg.induction.seq_len, "induction.seq_len")):
        if ctx and 2 * T + 1 > int(ctx):
            raise InductionLabError(f"{what}: [BOS] S S of 2 x {T} + 1 tokens exceeds the model's context of {ctx}; "
                                    f"lower {opt} to <= {(int(ctx) - 1) // 2}")
    lb, zeros = cfg.load_bearing, np.zeros((ident["n_layers"], ident["n_heads"]))
    load_bearing_conditions({n: zeros for n in (lb.rank_by, lb.exclude_by) if n}, lb, cfg.seed)  # sizes


def _open_shards(shards, loaded: LoadedModel):
    from ...data.shards import TokenShards
    from ...protocols.perplexity import check_tokenizer_match

    s = TokenShards.open(shards)
    check_tokenizer_match(s, loaded.tokenizer, loaded.identity.get("vocab_size"))
    return s


def _windows(cfg: EvaluateConfig, loaded: LoadedModel, shards, bos_id):
    """Held-out windows of ``late + 1`` tokens (or the model's context), from document starts."""
    ctx = model_context(loaded.model)
    length = cfg.icl.late + 1 if not ctx else min(cfg.icl.late + 1, int(ctx))
    icl_positions(length, cfg.icl.late, cfg.icl.early)     # a context too short: error now
    return heldout_windows(shards.heldout, shards.eos_id, cfg.icl.n_sequences, length, seed=cfg.seed, bos_id=bos_id)


def token_pool(loaded, cfg: EvaluateConfig, shards=None):
    """LongTensor of the ids random probe tokens are drawn from (``cfg.token_pool``).

    Raises: InductionLabError for ``"shards"`` without shards."""
    from ...core.models import attention_shape
    from ...core.stimuli import ordinary_token_ids

    tok = loaded.tokenizer
    vocab = ordinary_token_ids(attention_shape(loaded.model.config)["vocab_size"], (), tok)
    if cfg.token_pool == "vocab":
        return vocab
    if shards is None:
        raise InductionLabError("token pool 'shards' needs --shards (a corpus tokenised with the model's tokenizer)")
    ids = torch.as_tensor(shards.token_pool(), dtype=torch.long)
    return ids[torch.isin(ids, vocab)]


def _is_ours(name: str) -> bool:
    from ...protocols.lm_eval_tasks import PREFIX, TAG
    return name == TAG or name.startswith(PREFIX)


def _export_lm_eval(d: Path, cfg: EvaluateConfig, tokenizer) -> Path | None:
    """Export the local lm-eval tasks named in ``cfg.lm_eval.tasks`` into ``d`` (None: none named)."""
    from ...protocols.lm_eval_tasks import PREFIX, TAG, export_lm_eval_tasks

    names = cfg.lm_eval.tasks
    if not any(_is_ours(n) for n in names):
        return None
    ours = list(cfg.probes.tasks or TASK_NAMES) if TAG in names else []
    ours += [n.removeprefix(PREFIX) for n in names if n.startswith(PREFIX) and n.removeprefix(PREFIX) not in ours]
    export_lm_eval_tasks(d, tasks=ours, tokenizer=tokenizer, seed=cfg.seed)
    return d


def _check_lm_eval(cfg: EvaluateConfig, tokenizer) -> None:
    """Every lm-eval task name known and its dataset on disk (one-line error otherwise), nothing written."""
    if not cfg.lm_eval.tasks:
        return
    from ...protocols.lm_eval_tasks import load_lm_eval_tasks

    with tempfile.TemporaryDirectory(prefix="inductionlab-lm-eval-") as d:
        load_lm_eval_tasks(cfg.lm_eval.tasks, include_path=_export_lm_eval(Path(d), cfg, tokenizer))


# -- phases ------------------------------------------------------------------------------------------
def phases(plan: Plan, ctx: Context) -> dict:
    """Head scores and from them the load-bearing conditions; the perplexity guard (with shards); the probes
    intact and, at ``load_bearing.shots``, under every ablation; the ICL score (with shards), induction loss
    and associative recall intact and under every ablation; lm-eval (rank 0 alone)."""
    cfg = plan.cfg
    scores = ctx.head_scores(cfg.scores, seed=cfg.seed, pool=None if cfg.token_pool == "vocab" else plan.pool)
    pairs = load_bearing_conditions({**plan.file_scores, **scores.scores}, cfg.load_bearing, cfg.seed)
    conditions, variants = [c for _, c in pairs], {c.name: v for v, c in pairs}
    ppl = ctx.piece("perplexity", partial(_perplexity, plan, ctx)) if plan.shards is not None else None
    probes = _probes(plan)
    every = [INTACT, *conditions]
    runs = ctx.measure(Phase("hits", probes["probes"], [INTACT], len(plan.prompts)),
                       *(Phase(k, probes[k], every) for k in ("icl", "induction", "recall") if k in probes),
                       Phase("hits_ablated", probes["probes_ablated"], conditions, len(plan.ablation_prompts)))
    lm = ctx.piece("lm_eval", partial(_lm_eval, plan, ctx)) if cfg.lm_eval.tasks else None
    lm_ablated = {}
    if cfg.lm_eval.tasks and cfg.lm_eval.ablated and conditions:
        memo: dict = {}                                  # the mean-ablation reference, computed once when needed
        lm_ablated = {c.name: ctx.piece(f"lm_eval_ablated/{c.name}", partial(_lm_eval, plan, ctx, c, memo))
                      for c in conditions}
    return {"scores": scores, "conditions": conditions, "variants": variants, "perplexity": ppl, "lm_eval": lm,
            "lm_eval_ablated": lm_ablated, **runs}


LOGITS_BYTES = 1 << 30   # full-sequence passes (ICL score, perplexity) keep float32 logits under ~1 GiB per batch


def _fit_batch(requested: int, tokens: int, vocab: int) -> int:
    """``requested`` sequences per forward, lowered so that float32 logits ``[b, tokens, vocab]`` stay
    under :data:`LOGITS_BYTES` (Gemma's 262k vocabulary: one 1,024-token window is 1 GiB)."""
    return max(1, min(int(requested), LOGITS_BYTES // max(1, tokens * vocab * 4)))


def _bos_ids(loaded, cfg: EvaluateConfig) -> tuple[int | None, int | None]:
    """``(bos, induction_bos)``: the BOS of probes and associative recall (None without
    ``cfg.probes.bos``) and that of the induction sequences (the tokenizer's BOS then, as in
    :func:`~inductionlab.protocols.icl_score.induction_loss`)."""
    tok = loaded.tokenizer
    bos = tok.bos_token_id if cfg.probes.bos else None
    return bos, bos if bos is not None else tok.bos_token_id


def _reference_ids(plan: Plan):
    """The reference batch of a method that needs one (``mean``; the runner asks for it by the
    method's table entry): the first 8 induction-loss sequences ``[BOS] S S``, shared by every
    measure."""
    from ...core.scores import build_sequences

    cfg = plan.cfg
    S = random_sequences(plan.pool, REFERENCE_TRIALS, cfg.induction.seq_len, cfg.seed)
    return build_sequences(S, "induction", _bos_ids(plan.loaded, cfg)[0])


def _probes(plan: Plan) -> dict[str, Probe]:
    """The probes of the evaluation, their trials built here with the load-bearing test's reference batch:
    ``probes`` (every prompt), ``probes_ablated`` (the prompts of the load-bearing test), ``icl`` (the
    held-out windows, only with them), ``induction``, ``recall``."""
    from ...core.scores import build_sequences

    loaded, cfg, pool = plan.loaded, plan.cfg, plan.pool
    bos, ibos = _bos_ids(loaded, cfg)
    vocab = loaded.identity.get("vocab_size", 1)
    ref = _reference_ids(plan)
    pad = function_probes.default_pad_id(loaded.tokenizer)
    hits = partial(icl_score.measure_batch, hits=True)

    def probe(name: str, trials: Trials, measure, size: int) -> Probe:
        trials.reference = ref
        return Probe.of_trials(name, trials, measure, batch_size=size, method=cfg.load_bearing.method,
                               positions=cfg.load_bearing.positions)

    out = {"probes": probe("ICL probes", function_probes.build_trials(plan.prompts, pad), function_probes.measure_batch,
                           cfg.probes.batch_size),
           "probes_ablated": probe("ICL probes", function_probes.build_trials(plan.ablation_prompts, pad),
                                   function_probes.measure_batch, cfg.probes.batch_size)}
    if plan.windows is not None:
        lt, _ = scaled_positions(loaded.model, plan.windows, cfg.icl.late, cfg.icl.early)
        out["icl"] = probe("ICL score", Trials({"ids": plan.windows[:, :lt + 1]}), icl_score.measure_batch,
                           _fit_batch(cfg.icl.batch_size, plan.windows.shape[1], vocab))
    S = random_sequences(pool, cfg.induction.n_sequences, cfg.induction.seq_len, cfg.seed)
    out["induction"] = probe("induction loss", Trials({"ids": build_sequences(S, "induction", ibos)}), hits,
                             _fit_batch(cfg.induction.batch_size, 2 * cfg.induction.seq_len + 1, vocab))
    out["recall"] = probe("associative recall",
                          Trials({"ids": recall_sequences(pool, cfg.recall.n_sequences, cfg.recall.n_pairs, cfg.seed,
                                                          bos)}), hits,
                          _fit_batch(cfg.recall.batch_size, 4 * cfg.recall.n_pairs + 1, vocab))
    return out


def _perplexity(plan: Plan, ctx: Context) -> dict:
    """The perplexity guard on the held-out split (piece ``perplexity``)."""
    from ...protocols.perplexity import heldout_perplexity

    loaded, cfg = plan.loaded, plan.cfg
    window = cfg.perplexity.context or min(int(model_context(loaded.model) or 1024), 1024)   # heldout_perplexity's
    bs = _fit_batch(cfg.perplexity.batch_size, window, loaded.identity.get("vocab_size", 1))
    return heldout_perplexity(loaded.model, plan.shards, tokenizer=loaded.tokenizer, context=cfg.perplexity.context,
                              max_tokens=cfg.perplexity.tokens, batch_size=bs, dist=ctx.dist)


def _lm_eval_means(plan: Plan):
    """``(means, what)``: the heads' mean outputs over the probes' reference batch (:func:`_reference_ids`) at
    ``load_bearing.positions``, for ``mean`` ablation of the lm-eval tasks (as the runner computes them)."""
    from ...core.instrument import head_output_means

    model, pos = plan.loaded.model, plan.cfg.load_bearing.positions
    means = head_output_means(model, _reference_ids(plan).to(model.device), positions=pos)
    return means, (f"head_output_means over the probes' reference batch: the first {REFERENCE_TRIALS} induction-loss "
                   f"sequences [BOS] S S (T={plan.cfg.induction.seq_len}, seed {plan.cfg.seed}) at positions={pos}")


def _lm_eval(plan: Plan, ctx: Context, condition: Condition | None = None, memo: dict | None = None) -> dict | None:
    """lm-evaluation-harness (piece ``lm_eval``, intact: lm-eval's ``hf``; piece ``lm_eval_ablated/<condition>``:
    the model type ``inductionlab`` with the condition's heads ablated by ``load_bearing.method`` at
    ``load_bearing.positions``): rank 0 alone runs it (not sharded); the others read its piece."""
    if not ctx.is_main:
        return None
    from ...protocols.lm_eval_tasks import run_lm_eval

    cfg, tok = plan.cfg, plan.loaded.tokenizer
    include = _export_lm_eval(ctx.out / "lm_eval_tasks", cfg, tok)
    lm = None
    if condition is not None:
        from ...protocols.lm_eval_model import InductionLabLM

        means = None
        if needs_reference(cfg.load_bearing.method):
            if "means" not in memo:
                memo["means"] = _lm_eval_means(plan)
            means = memo["means"]

        lm = InductionLabLM(plan.loaded, heads=condition.heads, method=cfg.load_bearing.method,
                            positions=cfg.load_bearing.positions, means=None if means is None else means[0],
                            means_source=None if means is None else means[1], batch_size=cfg.lm_eval.batch_size)
    return run_lm_eval(plan.loaded.model, tok, cfg.lm_eval.tasks, include_path=include,
                       num_fewshot=cfg.lm_eval.num_fewshot, batch_size=cfg.lm_eval.batch_size,
                       limit=cfg.lm_eval.limit, seed=cfg.seed, lm=lm)


# -- result: the tidy tables and the record ------------------------------------------------------------
def _rows(prompts: list[Prompt], arrays: dict, condition: str, variant: str, key: str) -> pd.DataFrame:
    """One condition's probe measures in the order of ``prompts``; refuses a piece made with other prompts."""
    df = probe_rows(prompts, arrays)
    if len(df) != len(prompts) or not np.array_equal(np.asarray(arrays["target_id"])[np.argsort(arrays["order"])],
                                                     [p.target_id for p in prompts]):
        raise InductionLabError(f"checkpoint piece {key} was made with other prompts; delete it or use --overwrite")
    df.insert(0, "variant", variant)
    df.insert(0, "condition", condition)
    return df


def _icl_results(plan: Plan, pieces: dict) -> dict:
    """``"intact"`` -> the ICL score (None without windows), induction loss and associative recall
    summaries; each ablated condition -> its per-sequence values of every :data:`~.tables.SEQUENCE_MEASURES`."""
    cfg, windows = plan.cfg, plan.windows
    bos, ibos = _bos_ids(plan.loaded, cfg)
    pos = scaled_positions(plan.loaded.model, windows, cfg.icl.late, cfg.icl.early) if windows is not None else None

    def summaries(name: str) -> dict:
        ind, rec = pieces["induction"].arrays[name], pieces["recall"].arrays[name]
        return {"icl": icl_summary(pieces["icl"].arrays[name]["nll"], *pos, cfg.icl.window) if pos else None,
                "induction": induction_summary(ind["nll"], ind["hits"], cfg.induction.seq_len, ibos is not None),
                "recall": recall_summary(rec["nll"], rec["hits"], cfg.recall.n_pairs, bos is not None)}

    return {"intact": summaries("intact"), **{c.name: per_sequence(summaries(c.name)) for c in pieces["conditions"]}}


def result(plan: Plan, pieces: dict) -> EvaluateResult:
    cfg, hs, conditions, variants = plan.cfg, pieces["scores"], pieces["conditions"], pieces["variants"]
    rows = [_rows(plan.prompts, pieces["hits"].arrays["intact"], "intact", "intact", "hits/intact")]
    rows += [_rows(plan.ablation_prompts, pieces["hits_ablated"].arrays[c.name], c.name, variants[c.name],
                   f"hits_ablated/{c.name}") for c in conditions]
    probe_rows_ = pd.concat(rows, ignore_index=True)
    icl = _icl_results(plan, pieces)
    hits = hits_table(probe_rows_, conditions, variants)
    drops = drops_by_measure(probe_rows_, icl, conditions, variants, cfg.load_bearing.shots)
    conc = score_concentration(hs["induction"])
    icl_summary_ = icl_table(icl, conditions, variants)
    ppl, lm, lm_ablated = pieces["perplexity"], pieces["lm_eval"], pieces.get("lm_eval_ablated") or {}
    lm_drops = lm_eval_drops(lm, lm_ablated, conditions, variants)
    record = {
        "seeds": {"study": cfg.seed, "prompts": "seed_for(seed, crc32(task), shots, index)",
                  "heldout_windows": cfg.seed, "induction_sequences": cfg.seed,
                  "random_draws": "per-layer: seed_for(seed, draw); top-k: seed_for(seed, k, draw)"},
        "head_scores": {**hs.to_dict(), "params": hs.params},
        "concentration": conc,
        "conditions": [{**c.to_dict(), "variant": variants[c.name]} for c in conditions],
        "probes": {"n_prompts": len(plan.prompts), "bos_id": plan.bos, "hits": hits.to_dict(orient="records")},
        "icl": icl_summary_.to_dict(orient="records"),
        "perplexity": ppl,
        "load_bearing": {"shots": cfg.load_bearing.shots, "method": cfg.load_bearing.method,
                         "drops": drops.to_dict(orient="records"),
                         "lm_eval_drops": lm_drops.to_dict(orient="records")},
        "lm_eval": lm,
        "lm_eval_ablated": lm_ablated,
        "notes": plan.notes,
    }
    return EvaluateResult(loaded=plan.loaded, config=cfg, scores=hs, conditions=conditions, variants=variants,
                          probe_rows=probe_rows_, hits=hits, icl=icl, icl_summary=icl_summary_, perplexity=ppl,
                          drops=drops, concentration=conc, lm_eval=lm, lm_eval_drops=lm_drops, notes=plan.notes, pool=plan.pool, record=record)


def run_evaluate(loaded: LoadedModel, cfg: EvaluateConfig, out: str | Path, opts: RunOptions | None = None
                 ) -> EvaluateResult:
    """Run (or resume) the evaluation study on one model and write the run directory ``out``
    (:func:`~inductionlab.studies.engine.run_study` of :data:`~inductionlab.studies.evaluate.config.SPEC`).

    Args:
        loaded: the model (:func:`inductionlab.core.models.load_model`; a trainer checkpoint loads too).
        cfg: :class:`EvaluateConfig` (validated here; ``cfg.shards``: the natural text of the ICL score and
            the perplexity guard).
        out: run directory; holding a run with the same parameters, its finished pieces are reused.
        opts: :class:`~inductionlab.studies.spec.RunOptions`.

    Returns: :class:`EvaluateResult` (``.record`` = results.json).

    Raises:
        TypeError: ``loaded`` not a LoadedModel, ``cfg`` not an EvaluateConfig (a dict included).
        InductionLabError — before anything is written: bad config, ``out`` unusable or holding
        another run, what :func:`prepare` refuses.
    """
    return run_study(SPEC, loaded, cfg, out, opts)


STUDY: Study[EvaluateConfig, Plan, EvaluateResult] = Study(prepare, phases, result, write, summary)

__all__ = ["STUDY", "EvaluateResult", "Plan", "prepare", "phases", "result", "run_evaluate", "token_pool"]
