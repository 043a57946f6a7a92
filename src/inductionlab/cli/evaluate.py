"""``inductionlab evaluate MODEL``: the evaluation study of SPEC §8 (:mod:`inductionlab.studies.evaluate`) —
function-style ICL probes, ICL score, induction loss, perplexity guard, the load-bearing test
(top induction heads vs matched random heads) and optional lm-eval tasks, in one resumable run
directory."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import InductionLabError
from ..runtime.runs import timestamp
from .options import (INT, accelerator_options, given, head_score_options, join_processes, start_run, model_options,
                          quiet_option, run_dir_options)


def _ints(name: str, value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        return tuple(int(x) for x in value.split(",") if x.strip())
    except ValueError:
        raise InductionLabError(f"{name} {value!r} is not a comma-separated list of integers, e.g. 0,1,10") from None


def _names(value: str | None) -> tuple[str, ...] | None:
    return None if value is None else tuple(x.strip() for x in value.split(",") if x.strip())


@click.command("evaluate")
@click.argument("model_arg", metavar="[MODEL]", required=False)
@model_options
@accelerator_options
@run_dir_options("evaluate-<model>")
@quiet_option
@head_score_options
@click.option("--shards", type=click.Path(), default=None,
              help="Prepared corpus (inductionlab corpus prepare) tokenised with the model's tokenizer: natural "
                   "held-out text for the ICL score and the perplexity guard [default: both skipped].")
@click.option("--tasks", default=None, help="ICL probe tasks, comma-separated [default: all 13].")
@click.option("--shots", default="0,1,10", show_default=True, help="Numbers of demonstrations, comma-separated.")
@click.option("--prompts", "n_prompts", type=INT, default=32, show_default=True,
              help="Prompts per task and number of shots.")
@click.option("--no-permutation-control", is_flag=True, help="Skip the label-permuted prompts.")
@click.option("--ablate", default="per-layer-2pct,top-10", show_default=True,
              help="Ablation variants: per-layer-<p>pct (top p% heads per layer, ceil, >= 1) and/or top-<k>.")
@click.option("--draws", "--n-draws", "n_draws", type=INT, default=3, show_default=True,
              help="Seeded matched random-head draws per variant.")
@click.option("--ablation-shots", type=INT, default=10, show_default=True,
              help="Probe shots under ablation (must be among --shots).")
@click.option("--method", default="zero", show_default=True, help="Ablation method: zero | mean | sink.")
@click.option("--seed", type=INT, default=0, show_default=True)
@click.option("--induction-seq-len", type=INT, default=50, show_default=True,
              help="T of the induction-loss sequences [BOS] S S.")
@click.option("--recall-pairs", type=INT, default=8, show_default=True,
              help="Key-value pairs per associative-recall sequence (then the same pairs shuffled).")
@click.option("--token-pool", type=click.Choice(["vocab", "shards"]), default="vocab", show_default=True,
              help="Random probe tokens from the whole vocabulary, or from the ids of --shards' training split "
                   "(for a model trained on that corpus).")
@click.option("--icl-sequences", type=INT, default=16, show_default=True, help="Held-out windows for the ICL score.")
@click.option("--icl-late", type=INT, default=500, show_default=True, help="Late token (Olsson et al.: 500).")
@click.option("--icl-early", type=INT, default=50, show_default=True, help="Early token (Olsson et al.: 50).")
@click.option("--icl-window", type=INT, default=1, show_default=True,
              help="Tokens averaged at each position (1 = Olsson et al.; more = less noise per window).")
@click.option("--perplexity-tokens", type=INT, default=32768, show_default=True,
              help="Held-out tokens for the perplexity guard (0 = the whole split).")
@click.option("--lm-eval-tasks", default=None,
              help="lm-eval tasks, comma-separated: inductionlab_icl (our probes, exported offline), "
                   "inductionlab_icl_<task>, or installed lm-eval task names.")
@click.option("--lm-eval-fewshot", type=INT, default=None, help="lm-eval few-shot [default: each task's].")
@click.option("--lm-eval-limit", type=INT, default=50, show_default=True, help="lm-eval test documents per task.")
@click.option("--batch-size", type=INT, default=16, show_default=True, help="Prompts per forward pass.")
def evaluate(**kw) -> None:
    """Evaluate MODEL (an embedded name, a model directory, a .gguf file, a checkpoint of our trainer
    or a training run directory): function-style ICL probes (HITS@1/@3 at each number of shots,
    label-permutation control), ICL score and perplexity on --shards, induction loss, and the
    load-bearing test — top induction heads (per layer and global top-k) vs matched random heads.
    An existing run with the same options in --out is resumed."""
    from ..studies.evaluate import (EvaluateConfig, ICLScoreConfig, InductionLossConfig, LmEvalConfig, LoadBearingConfig,
                           PerplexityConfig, RecallConfig, ProbeConfig, run_evaluate)

    arg = kw.pop("model_arg")
    if arg is not None and given("model"):
        raise InductionLabError(f"the model is named twice: MODEL {arg!r} and --model {kw['model']!r}; pass one of "
                                "them")
    if arg is not None:
        kw["model"] = arg
    for o in ("fewshot", "limit"):
        if given(f"lm_eval_{o}") and not kw["lm_eval_tasks"]:
            raise InductionLabError(f"--lm-eval-{o} has no effect without --lm-eval-tasks; add the tasks or drop it")
    shots = _ints("--shots", kw["shots"])
    ppl_tokens = kw["perplexity_tokens"]
    cfg = EvaluateConfig(
        probes=ProbeConfig(tasks=_names(kw["tasks"]), shots=shots, n_prompts=kw["n_prompts"],
                           permutation_control=not kw["no_permutation_control"], batch_size=kw["batch_size"]),
        icl=ICLScoreConfig(late=kw["icl_late"], early=kw["icl_early"], n_sequences=kw["icl_sequences"],
                           window=kw["icl_window"]),
        perplexity=PerplexityConfig(max_tokens=None if ppl_tokens == 0 else ppl_tokens),
        load_bearing=LoadBearingConfig(ablate=_names(kw["ablate"]) or (), n_draws=kw["n_draws"], method=kw["method"],
                                       shots=kw["ablation_shots"]),
        lm_eval=LmEvalConfig(tasks=_names(kw["lm_eval_tasks"]) or (), num_fewshot=kw["lm_eval_fewshot"],
                             limit=kw["lm_eval_limit"]),
        induction=InductionLossConfig(seq_len=kw["induction_seq_len"]),
        recall=RecallConfig(n_pairs=kw["recall_pairs"]), token_pool=kw["token_pool"],
        seed=kw["seed"], score_seq_len=kw["score_seq_len"], score_batch_size=kw["score_batch_size"])
    cfg.validate()                                     # fail before the slow part
    shards = kw["shards"]
    if kw["token_pool"] == "shards" and shards is None:
        raise InductionLabError("--token-pool shards draws probe tokens from a corpus; add --shards DIR")
    if shards is not None and not (Path(shards) / "manifest.json").is_file():
        raise InductionLabError(f"--shards {shards} is not a prepared corpus (no manifest.json); run: inductionlab "
                                "corpus prepare SOURCE --tokenizer MODEL --out DIR")
    out = Path(kw.pop("out") or Path("runs") / f"evaluate-{Path(kw['model'].rstrip('/')).name}-{timestamp()}")
    overwrite, quiet = kw.pop("overwrite"), kw.pop("quiet")
    dist, out = join_processes(kw, out)            # torchrun: shard by batch, rank 0 writes
    loaded, load_s = start_run(kw, out, overwrite, quiet, inputs=[shards] if shards else [])
    res = run_evaluate(loaded, cfg, out, shards=shards, overwrite=overwrite, progress=not quiet, dist=dist,
                       log=click.echo)
    if dist.is_main:
        _print_summary(res, load_s, out)
    from ..runtime.distributed import shutdown

    shutdown()


def _print_summary(res, load_s: float, out: Path) -> None:
    from ..studies.report import row_ci

    h = res.hits
    macro = h[(h.task == "macro") & (h.condition == "intact")]
    click.echo(f"\n{res.loaded.identity.get('name')}: macro HITS@1 [95% CI]")
    for r in macro.to_dict("records"):
        click.echo(f"  {r['shots']:>2}-shot {r['control']:<8s} {row_ci(r, 'hits1')}")
    i0 = res.icl_summary.iloc[0].to_dict()
    if i0.get("icl_score") is not None and i0.get("icl_score") == i0.get("icl_score"):
        click.echo(f"ICL score (token {int(i0['late'])} − {int(i0['early'])}): {row_ci(i0, 'icl_score')} nats")
    click.echo(f"induction benefit: {row_ci(i0, 'induction_benefit')} nats")
    if res.perplexity:
        click.echo(f"held-out perplexity: {res.perplexity['perplexity']:.3f} ({res.perplexity['n_scored']:,} tokens)")
    d = res.drops
    if len(d):
        click.echo("relative change under ablation (induction heads | matched random, pooled):")
        for (m, v), g in d.groupby(["measure", "variant"], sort=False):
            ind = g[g.kind == "induction"].iloc[0]
            rnd = g[(g.kind == "random") & (g.draw == "pooled")]
            click.echo(f"  {m:<18s} {v:<15s} {ind['headline']:>8s} | "
                       f"{rnd['headline'].iloc[0] if len(rnd) else '—':>8s}")
    for n in res.notes:
        click.echo(f"note: {n}")
    click.echo(f"model loaded in {load_s:.1f} s; evaluation {res.timings['total_s']:.1f} s; report: {out / 'report.md'}")


COMMANDS = [evaluate]   # registered on `inductionlab` by cli/main._register
