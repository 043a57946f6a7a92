"""CLI for pretraining data: ``inductionlab corpus prepare|info`` and
``inductionlab curriculum preview`` (thin layer over :mod:`inductionlab.data` and
:mod:`inductionlab.data.curriculum`)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import click
import numpy as np

from ..data.curriculum import SPAN_SOURCES, VARIANTS, BiInductStream, Batch, CurriculumConfig
from ..errors import InductionLabError
from ..runtime.outputs import check_output_file
from ..data.shards import CorpusConfig
from ..data.synth_bigram import SynthBigramConfig
from .generate import build_config, config_options, given_flags, with_options as _with
from .options import INT, run_dir_options


@click.group()
def corpus() -> None:
    """Prepare and inspect tokenised pretraining corpora. Guide: docs/data.md."""


_CORPUS = config_options(CorpusConfig)
_SYNTH = [o for o in config_options(SynthBigramConfig) if o.opts[0] != "--seed"]   # one --seed, both configs'


@corpus.command("prepare")
@click.argument("source")
@_with(_CORPUS + _SYNTH)
@run_dir_options("corpus", required=True)
def corpus_prepare(source, out, overwrite, **options) -> None:
    """Tokenise SOURCE ('demo', a .txt/.jsonl/.parquet file or directory, or a saved Hugging
    Face dataset) into memory-mapped shards with an MD5 held-out split.

    SOURCE 'synth-bigram' samples a semi-synthetic corpus instead (Aoyama et al. 2025): sequences
    from the bigram statistics of the prepared corpus --from, with repetition P(A B ... A) and
    reliability P(B | A B ... A), e.g. ``corpus prepare synth-bigram --from data/demo-512
    --repetition 0.9 --reliability 0.9 --tokens 12000000 --out data/synth``. Guide: docs/data.md."""
    from ..data.shards import prepare_corpus   # lazy: tokenizers

    text, synth = given_flags(CorpusConfig) - {"--seed"}, given_flags(SynthBigramConfig) - {"--seed"}
    cfg, scfg = build_config(CorpusConfig, dict(options)), build_config(SynthBigramConfig, dict(options))
    if source == "synth-bigram":
        if text:
            raise InductionLabError(f"{', '.join(sorted(text))}: not used by synth-bigram (it keeps the --from "
                                    "corpus's tokenizer); drop them")
        missing = [f for f in ("--from", "--repetition", "--reliability", "--tokens") if f not in synth]
        if missing:
            raise InductionLabError(f"synth-bigram needs {', '.join(missing)}; e.g. --from data/demo-512 "
                                    "--repetition 0.9 --reliability 0.9 --tokens 12000000")
        from ..data.synth_bigram import prepare_synth_bigram
        shards = prepare_synth_bigram(Path(scfg.source), out, repetition=scfg.repetition, reliability=scfg.reliability,
                                      tokens=scfg.tokens, seq_len=scfg.seq_len, alpha=scfg.alpha,
                                      heldout_tokens=scfg.heldout_tokens, seed=scfg.seed, overwrite=overwrite)
        _print_info(shards)
        return
    if synth:
        raise InductionLabError(f"{', '.join(sorted(synth))}: only for SOURCE synth-bigram; drop them or pass "
                                "synth-bigram as SOURCE")
    if not cfg.shuffle and "--seed" in given_flags(CorpusConfig):
        raise InductionLabError("--seed orders the shuffled documents; with --no-shuffle it has no effect: drop one "
                                "of them")
    if cfg.tokenizer != "bpe" and "--vocab-size" in text:
        raise InductionLabError(f"--vocab-size sizes the BPE trained by --tokenizer bpe; --tokenizer {cfg.tokenizer} "
                                "brings its own vocabulary: drop --vocab-size (or use --tokenizer bpe)")
    shards = prepare_corpus(source, out, cfg, overwrite=overwrite)
    _print_info(shards)


@corpus.command("info")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--verify", is_flag=True, help="Also check the token files' sha256.")
def corpus_info(path, verify) -> None:
    """Summarise a prepared corpus directory. Guide: docs/data.md."""
    from ..data.shards import TokenShards, prepare_corpus   # lazy: tokenizers, numpy

    shards = TokenShards.open(path)
    if verify:
        shards.verify()
    _print_info(shards)
    if verify:
        click.echo("sha256: ok")


def _print_info(s: "TokenShards") -> None:
    m = s.manifest
    t = m["tokenizer"]
    src = m.get("source", {}).get("spec", "?") if isinstance(m.get("source"), dict) else "?"
    size = f"{m['characters']:,} characters" if "characters" in m else "sampled"
    click.echo(f"corpus: {s.path}  (source {src}, {m.get('documents', '?')} documents, {size})")
    g = m.get("generator")
    if isinstance(g, dict):
        real = (g.get("realised") or {}).get("train") or {}
        click.echo(f"generator: {g.get('name')} from {m['source'].get('from')}  repetition {g.get('repetition')} "
                   f"(realised {real.get('repetition', float('nan')):.4f})  reliability {g.get('reliability')} "
                   f"(realised {real.get('reliability') if real.get('reliability') is not None else float('nan'):.4f})  "
                   f"seq-len {g.get('seq_len')}  seed {g.get('seed')}")
    click.echo(f"tokenizer: {t.get('spec', '?')} vocab {s.vocab_size}  eos {s.eos_id} "
               f"bos {s.bos_id} sep {s.sep_id} ({t.get('sep_token')!r})  dtype {m['dtype']}")
    frac = m.get("heldout_fraction")
    click.echo(f"held-out fraction: {frac if frac is None else format(frac, '.4g')} "
               f"({m.get('heldout_fraction_requested')})")
    for split, c in m["splits"].items():
        click.echo(f"  {split:8s} {c.get('documents', 0):>8,} documents {c['tokens']:>12,} tokens")


@click.group()
def curriculum() -> None:
    """The Bi-Induct curriculum (SPEC §6). Guide: docs/data.md."""


def _render_row(batch: Batch, row: int, decode, color: bool) -> str:
    """Decoded window with snippets marked ⟦S ⟨SEP⟩ copy⟧ (newlines inside snippets as ↵)."""
    ids = batch.input_ids[row].tolist()
    out, col = [], 0
    for r, start, L, direction in sorted(x for x in batch.snippets if x[0] == row):
        out.append(decode(ids[col:start]))
        s = decode(ids[start:start + L]).replace("\n", "↵")
        copy = decode(ids[start + L + 1:start + 2 * L + 1]).replace("\n", "↵")
        arrow = "→" if direction == "forward" else "←"
        out.append(click.style(f"⟦{arrow} ", fg="yellow", bold=True) if color else f"⟦{arrow} ")
        out.append(click.style(s, fg="cyan") if color else s)
        out.append(click.style(" ⟨SEP⟩ ", fg="yellow") if color else " ⟨SEP⟩ ")
        out.append(click.style(copy, fg="green" if direction == "forward" else "magenta")
                   if color else copy)
        out.append(click.style("⟧", fg="yellow", bold=True) if color else "⟧")
        col = start + 2 * L + 1
    out.append(decode(ids[col:]))
    return "".join(out)


def plot_synthetic_fraction(stream: BiInductStream, path: Path) -> None:
    """PNG: realised snippet-token fraction per batch against the schedule m(t)."""
    from ..studies.plots import curriculum_fraction
    tt = np.linspace(0, stream.total_tokens, 400)
    L = stream.lo if stream.lo == stream.hi else (stream.lo, stream.hi)
    curriculum_fraction(stream.realised_fractions(), stream.tokens_per_batch, tt,
                        np.array([stream.expected_fraction(t) for t in tt]), path,
                        f"Bi-Induct {stream.cfg.variant}: m0={stream.cfg.m0}, T_a={stream.anneal_tokens:,}, L={L}",
                        stream.cfg.m0)


_PREVIEW = CurriculumConfig(variant="balanced")      # preview shows snippets unless told otherwise


@curriculum.command("preview")
@click.argument("corpus_dir", type=click.Path(path_type=Path))
@_with(config_options(_PREVIEW))
@click.option("--seed", type=INT, default=0, show_default=True, help="Seed of snippet placement.")
@click.option("--batch-size", type=INT, default=8, show_default=True)
@click.option("--seq-len", type=INT, default=128, show_default=True)
@click.option("--total-tokens", type=INT, default=1_000_000, show_default=True)
@click.option("--step", type=INT, default=0, show_default=True, help="Batch to show.")
@click.option("--windows", type=INT, default=2, show_default=True, help="Rows of that batch to print.")
@click.option("--plot", type=click.Path(path_type=Path), default=None,
              help="Write a PNG of realised synthetic fraction vs the schedule.")
@click.option("--color/--no-color", default=None, help="Colour snippets [default: if a terminal].")
def curriculum_preview(corpus_dir, seed, batch_size, seq_len, total_tokens, step, windows, plot, color,
                       **cur) -> None:
    """Print decoded training windows with Bi-Induct snippets marked ⟦→ S ⟨SEP⟩ copy⟧
    (→ induction copy, ← reversed copy) and optionally plot the realised synthetic fraction. Guide: docs/data.md."""
    cfg = dataclasses.replace(build_config(_PREVIEW, cur), seed=seed)
    cfg.validate()
    for name, v, lo in (("--batch-size", batch_size, 1), ("--seq-len", seq_len, 2), ("--total-tokens", total_tokens, 1),
                        ("--step", step, 0), ("--windows", windows, 0), ("--seed", seed, 0)):
        if v < lo:
            raise InductionLabError(f"{name} must be >= {lo}, got {v}")
    if plot is not None:
        check_output_file(plot, "--plot", inputs=[corpus_dir])
    from ..data.shards import TokenShards, prepare_corpus   # lazy: tokenizers, numpy

    shards = TokenShards.open(corpus_dir)
    stream = BiInductStream.from_shards(shards, cfg, batch_size=batch_size, seq_len=seq_len,
                                        total_tokens=total_tokens)
    if step >= stream.num_batches:
        raise InductionLabError(f"--step {step} is past the last batch ({stream.num_batches - 1}) of "
                                f"--total-tokens {total_tokens}; pass a smaller --step")
    b = stream.batch(step)
    tok = shards.tokenizer()

    def decode(ids):
        return tok.decode(ids, skip_special_tokens=False)

    if color is None:
        color = sys.stdout.isatty()
    fr = stream.realised_fractions()
    variant = cfg.variant
    click.echo(f"variant {variant}: {stream.num_batches} batches of {batch_size}x{seq_len}, "
               f"{stream.total_tokens:,} tokens ({stream.epochs:.3f} epochs of natural text); "
               f"step {step}: synthetic {b.synthetic_fraction:.3f}, m(t) "
               f"{stream.expected_fraction(b.tokens_before):.3f}; whole run: realised "
               f"{fr.mean():.4f} vs schedule mean "
               f"{np.mean([stream.expected_fraction(t) for t in np.arange(stream.total_tokens, step=max(1, stream.total_tokens // 10000))]):.4f}")
    for row in range(min(windows, batch_size)):
        n = sum(1 for x in b.snippets if x[0] == row)
        click.echo(click.style(f"--- window {row} ({n} snippets) ---", bold=True) if color
                   else f"--- window {row} ({n} snippets) ---")
        click.echo(_render_row(b, row, decode, color), color=color)
    if plot is not None:
        plot_synthetic_fraction(stream, plot)
        click.echo(f"plot: {plot}")


COMMANDS = [corpus, curriculum]   # registered on `inductionlab` by cli/main._register
