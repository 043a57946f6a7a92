"""Positive control / CPU calibration for the Bi-Induct study (issue 10, item 1).

Not a test: run by hand, one training at a time on one thread, e.g.

    OMP_NUM_THREADS=1 PYTHONPATH=src python bench/positive_control.py --list
    OMP_NUM_THREADS=1 PYTHONPATH=src python bench/positive_control.py --only control
    OMP_NUM_THREADS=1 PYTHONPATH=src python bench/positive_control.py          # every setting not yet run

Each *setting* is a set of overrides on top of :data:`BASE` (the recipe of the earlier CPU runs
that formed no induction head) and is trained with ``inductionlab.train.train`` -- our trainer,
our Bi-Induct stream, our telemetry -- with the curriculum variant the setting names. Settings are
measured one lever at a time: either one lever added to the old recipe, or one lever taken back
from the working ``control`` (leave-one-out).

Per setting the table reports tokens, wall time (training + telemetry, one thread), the maximum
induction score over heads at the last checkpoint and the best over checkpoints, the emergence
step (first checkpoint with max induction score >= 0.3), and the loss on the first vs the second
copy of repeated random sequences ([S S], |S| = 50, 16 sequences, as in SPEC §3) at the last
checkpoint -- at |S| = PROBE_T (inside the trained span lengths) and at |S| = 50 -- and, at the
last checkpoint, the loss and the best last-layer head's attention on the training format S SEP S.
``--calibration`` reruns CALIBRATION.md's toy and probes it at other copy lengths. Settings
without a recorded result were not run (see docs/positive_control.md).

Results: one JSON per setting in ``bench/results/positive_control/`` (resumable: a setting
already there is skipped unless ``--force``), and the aggregate ``bench/results/positive_control.json``
(versions, every config, every checkpoint's max induction score and copy losses) plus a markdown
table printed to stdout.

Needs the prepared demo corpora (``inductionlab corpus prepare demo --out data/demo-V --vocab-size V``
for V in 4096, 512, 257).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

hf_logging.disable_progress_bar()

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
THRESHOLD = 0.3                       # issue 10: "max induction score >= 0.3"
PROBE_T = 16                          # probe copy length inside the trained span lengths (8-24)

# The recipe of the earlier CPU runs (README "What to expect on a CPU"): cpu-tiny, BPE 4096,
# seq 128, 8192 tokens per update, paper schedule (3 % warm-up, cosine to 10 %, wd 0.1),
# Bi-Induct induction m0 = 0.5 annealed over the whole budget, natural spans of fixed L = 20.
BASE: dict = dict(variant="induction", preset="cpu-tiny", vocab=4096, seq_len=128, tokens_per_update=8192,
                  lr=1e-3, warmup_frac=0.03, min_lr_ratio=0.1, weight_decay=0.1,
                  m0=0.5, anneal_frac=1.0, span_source="natural", span=(20, 20), tokens=2_457_600)

# The working recipe found here (the proposed default CPU preset of `study bi-induct`).
CONTROL: dict = dict(BASE, preset="cpu-micro", vocab=512, tokens_per_update=4096, span_source="random",
                     span=(8, 24), tokens=6_553_600)

# The first setting that formed an induction head here (probe inside the trained copy distances):
# near-pure random-token snippets (m0 = 1, no anneal), constant lr 3e-3, 2048 tokens per update.
PC: dict = dict(CONTROL, m0=1.0, anneal_frac=1000.0, tokens=8_192_000, tokens_per_update=2048,
                lr=3e-3, warmup_frac=0.01, min_lr_ratio=1.0, weight_decay=0.0)

# name -> (what it tests, overrides on BASE)
SETTINGS: dict[str, tuple[str, dict]] = {
    "control": ("cpu-micro + BPE 512 + random spans 8-24, 4096 tok/update", CONTROL),
    "control-none": ("control preset, natural-only (variant none)", dict(CONTROL, variant="none")),
    "control-natural-spans": ("control, spans cut from natural text", dict(CONTROL, span_source="natural")),
    "control-fixed-span": ("control, fixed span L = 20", dict(CONTROL, span=(20, 20))),
    "control-vocab4096": ("control, BPE 4096 (same wall time)", dict(CONTROL, vocab=4096, tokens=1_638_400)),
    "control-cpu-tiny": ("control, cpu-tiny model (same wall time)", dict(CONTROL, preset="cpu-tiny",
                                                                          tokens=1_638_400)),
    "copy-heavy": ("control, m0 = 1 without anneal (~75% snippets), 1.6 M tokens",
                   dict(CONTROL, m0=1.0, anneal_frac=1000.0, tokens=1_638_400)),
    "copy-heavy-lr3e-3": ("copy-heavy, constant lr 3e-3, 1% warm-up, no wd, 3.3 M tokens",
                          dict(CONTROL, m0=1.0, anneal_frac=1000.0, tokens=3_276_800, lr=3e-3, warmup_frac=0.01,
                               min_lr_ratio=1.0, weight_decay=0.0)),
    "copy-heavy-lr3e-3-long": ("copy-heavy-lr3e-3, 2048 tok/update, 4000 updates (8.2 M tokens)", PC),
    "pc-seed1": ("copy-heavy-lr3e-3-long, seed 1 (init and stream)", dict(PC, seed=1)),
    "pc-none": ("copy-heavy-lr3e-3-long preset, natural-only (variant none)", dict(PC, variant="none")),
    "pc-m0.5-anneal": ("copy-heavy-lr3e-3-long with the paper mix: m0 = 0.5 annealed to 0 over the budget",
                       dict(PC, m0=0.5, anneal_frac=1.0)),
    "pc-m0.5-flat": ("copy-heavy-lr3e-3-long with m0 = 0.5 held constant (no anneal)", dict(PC, m0=0.5)),
    "control-m0.8": ("control, m0 = 0.8", dict(CONTROL, m0=0.8)),
    "control-const-lr": ("control, constant lr 1e-3, 1% warm-up, no wd",
                         dict(CONTROL, warmup_frac=0.01, min_lr_ratio=1.0, weight_decay=0.0)),
    "control-bytes": ("control, byte-level vocab 257", dict(CONTROL, vocab=257)),
    "control-balanced": ("control preset, balanced variant", dict(CONTROL, variant="balanced")),
    "base": ("old CPU recipe (cpu-tiny, BPE 4096, natural spans L=20, m0 0.5)", dict(BASE)),
}


def run_config(name: str, s: dict, seed: int = 0):
    """The one place a setting becomes a trainer config (adapt here when TrainConfig changes)."""
    from inductionlab.data.curriculum import CurriculumConfig
    from inductionlab.train.config import TrainConfig

    lo, hi = s["span"]
    steps = s["tokens"] // s["tokens_per_update"]
    return TrainConfig(
        data=str(ROOT / "data" / f"demo-{s['vocab']}"), out=str(ROOT / "runs" / "positive_control" / name),
        preset=s["preset"], seq_len=s["seq_len"], tokens=s["tokens"], tokens_per_update=s["tokens_per_update"],
        micro_batch_size=s["tokens_per_update"] // s["seq_len"],
        lr=s["lr"], warmup_frac=s["warmup_frac"], min_lr_ratio=s["min_lr_ratio"], weight_decay=s["weight_decay"],
        seed=s.get("seed", seed),
        curriculum=CurriculumConfig(
            variant=s["variant"], m0=s["m0"], span_source=s["span_source"],
            anneal_tokens=int(s["anneal_frac"] * s["tokens"]) if s["anneal_frac"] != 1 else None,
            span_length=lo if lo == hi else (lo + hi) // 2, span_length_range=(lo, hi) if lo < hi else None),
        log_checkpoints=8, dense_start=0, dense_end=steps, dense_every=max(1, steps // 16),
        telemetry=True, telemetry_seq_len=50, telemetry_batch=16, induction_threshold=THRESHOLD,
        eval_tokens=16384, progress=False, tensorboard=False, log_every=10)


def copy_losses(run_dir: Path, vocab_size: int, special_ids, seed: int = 0) -> list[dict]:
    """Per checkpoint, on [S S] (16 random sequences, no BOS, as the trainer's telemetry): the max
    induction score over heads and the mean loss on the first / second copy, at |S| = PROBE_T (inside
    the trained copy distances) and at |S| = 50 (SPEC §3 default; beyond the longest span trained)."""
    from transformers import LlamaForCausalLM

    from inductionlab.core.scores import compute_head_scores

    out = []
    for d in sorted((run_dir / "checkpoints").glob("step_*"), key=lambda p: int(p.name.split("_")[1])):
        if not (d / "config.json").is_file():
            continue
        model = LlamaForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
        tel = json.loads((d / "telemetry.json").read_text()) if (d / "telemetry.json").is_file() else {}
        sc = tel.get("scores", {})
        row = {"step": int(d.name.split("_")[1]), "tokens": tel.get("tokens"),
               "max_anti_induction": max(map(max, sc["anti_induction"])) if sc else None,
               "max_copy_offset": max(map(max, sc["copy_offset"])) if sc else None,
               "max_copy_offset_control": max(map(max, sc["copy_offset_control"])) if sc else None,
               "heldout_loss": tel.get("heldout_loss")}
        for T, tag in ((PROBE_T, ""), (50, "_T50")):
            hs = compute_head_scores(model, vocab_size=vocab_size, exclude_ids=tuple(special_ids), bos_id=None,
                                     seq_len=T, batch_size=16, seed=seed, names=("induction",))
            row.update({f"max_induction{tag}": float(hs.scores["induction"].max()),
                        f"first_copy_loss{tag}": hs.induction_loss["first_copy"],
                        f"second_copy_loss{tag}": hs.induction_loss["second_copy"]})
        out.append(row)
    return out


def snippet_losses(run_dir: Path, sep_id: int, vocab_size: int, special_ids, lengths=(12, 16, 24, 40),
                   n: int = 32, seed: int = 0) -> dict:
    """Final checkpoint, on the training format ``S SEP S`` (S random, no BOS): mean loss on the first
    and second copy and the best layer-1 head's attention from each second-copy token to the token
    after its earlier occurrence, per span length L (40 lies beyond the trained 8-24)."""
    from transformers import LlamaForCausalLM

    from inductionlab.core.stimuli import ordinary_token_ids, random_sequences

    d = max((run_dir / "checkpoints").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    model = LlamaForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    pool = ordinary_token_ids(vocab_size, tuple(special_ids) + (sep_id,))
    out = {}
    for L in lengths:
        S = random_sequences(pool, n, L, seed)
        ids = torch.cat([S, torch.full((n, 1), sep_id), S], 1)
        with torch.inference_mode():
            o = model(input_ids=ids, output_attentions=True)
        nll = torch.nn.functional.cross_entropy(o.logits[:, :-1].reshape(-1, o.logits.shape[-1]),
                                                ids[:, 1:].reshape(-1), reduction="none").view(n, -1)
        q = torch.arange(L + 1, 2 * L)                   # holds S[j], j = 0..L-2 -> key j + 1
        att = o.attentions[-1][:, :, q, q - L].mean((0, 2))
        out[str(L)] = {"first_copy": float(nll[:, :L - 1].mean()), "second_copy": float(nll[:, L + 1:].mean()),
                       "max_head_attention_to_next_of_earlier": float(att.max())}
    return {"step": int(d.name.split("_")[1]), "by_L": out}


def summarize_curve(curve: list[dict]) -> dict:
    last = curve[-1]
    emerg = next((c for c in curve if c["max_induction"] >= THRESHOLD), None)
    return {"final": last, "best_max_induction": max(c["max_induction"] for c in curve),
            "best_max_induction_T50": max(c["max_induction_T50"] for c in curve),
            "emergence_step": emerg["step"] if emerg else None,
            "emergence_tokens": emerg["tokens"] if emerg else None}


def run_setting(name: str, force: bool = False) -> dict:
    from inductionlab.train.trainer import open_data, train

    path = RESULTS / "positive_control" / f"{name}.json"
    if path.is_file() and not force:
        return json.loads(path.read_text())
    desc, s = SETTINGS[name]
    cfg = run_config(name, s)
    if Path(cfg.out).exists():
        shutil.rmtree(cfg.out)
    data = open_data(cfg)
    t0 = time.perf_counter()
    res = train(cfg, data=data)
    wall = time.perf_counter() - t0
    curve = copy_losses(Path(cfg.out), data.vocab_size, data.special_ids)
    snip = snippet_losses(Path(cfg.out), data.sep_id, data.vocab_size, data.special_ids)
    rec = {"snippet_probe": snip, "name": name, "description": desc, "setting": {**s, "span": list(s["span"])}, "config": cfg.to_dict(),
           "steps": res.steps, "tokens": res.tokens, "wall_s": wall,
           "train_s": res.record["results"]["train_time_s"], "tokens_per_s": res.tokens_per_s,
           "params": res.record["budget"], "stream": res.record.get("stream"),
           **summarize_curve(curve), "curve": curve, "versions": res.record["versions"],
           "special_ids": list(data.special_ids), "vocab_size": data.vocab_size, "sep_id": data.sep_id}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec, indent=1))
    return rec


def calibration_replica(steps: int = 200, vocab: int = 64, seed: int = 0) -> dict:
    """CALIBRATION.md's toy (2 x 64 Llama, batch 64 of [BOS] S S with |S| = 32 fixed, AdamW 1e-3
    constant, no wd) -- then its best head probed at T = 32 (the training offset) and at T = 20 / 50.

    A head that attends by *position* (offset T - 1 = 31) scores ~1 at T = 32 and the uniform value
    elsewhere; a content-matching induction head scores high at every T.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    from inductionlab.core.scores import compute_head_scores

    torch.manual_seed(seed)
    bos = 0
    mc = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256, bos_token_id=bos,
                     tie_word_embeddings=False)
    mc._attn_implementation = "eager"
    model = LlamaForCausalLM(mc)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    t0 = time.perf_counter()
    for _ in range(steps):
        S = torch.randint(1, vocab, (64, 32))
        ids = torch.cat([torch.full((64, 1), bos), S, S], 1)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    wall = time.perf_counter() - t0
    model.eval()
    probes = {}
    for T in (32, 20, 50):
        hs = compute_head_scores(model, vocab_size=vocab, exclude_ids=(bos,), bos_id=bos, seq_len=T, batch_size=16,
                                 seed=seed, names=("induction",))
        probes[str(T)] = {"max_induction": float(hs.scores["induction"].max()), **hs.induction_loss}
    return {"steps": steps, "vocab": vocab, "train_wall_s": wall, "probe_by_T": probes}


def table(recs: list[dict]) -> str:
    head = (f"| setting | variant | tokens | updates | wall time | max induction T={PROBE_T} (last / best) | "
            f"emergence step (tokens), T={PROBE_T} | loss 1st / 2nd copy T={PROBE_T} | max induction T=50 (best) | "
            "loss 1st / 2nd copy T=50 | S SEP S L=16: loss 1st / 2nd, head attn | held-out loss |\n"
            "| --- | --- | ---: | ---: | ---: | --- | --- | --- | --- | --- | --- | ---: |")
    rows = []
    for r in recs:
        f = r["final"]
        p = r.get("snippet_probe", {}).get("by_L", {}).get("16")
        sp = f"{p['first_copy']:.2f} / {p['second_copy']:.2f}, {p['max_head_attention_to_next_of_earlier']:.2f}" if p else "-"
        em = f"{r['emergence_step']} ({r['emergence_tokens'] / 1e6:.2f} M)" if r["emergence_step"] is not None else "none"
        rows.append(f"| {r['name']}: {r['description']} | {r['setting']['variant']} | {r['tokens'] / 1e6:.2f} M | "
                    f"{r['steps']} | {r['wall_s']:.0f} s | {f['max_induction']:.3f} / {r['best_max_induction']:.3f} | "
                    f"{em} | {f['first_copy_loss']:.2f} / {f['second_copy_loss']:.2f} | "
                    f"{f['max_induction_T50']:.3f} ({r['best_max_induction_T50']:.3f}) | "
                    f"{f['first_copy_loss_T50']:.2f} / {f['second_copy_loss_T50']:.2f} | {sp} | {f['heldout_loss']:.2f} |")
    return "\n".join([head, *rows])


def recurve(name: str) -> None:
    """Recompute a recorded setting's probe curve from its checkpoints (after a probe change)."""
    path = RESULTS / "positive_control" / f"{name}.json"
    if path.is_file():
        rec = json.loads(path.read_text())
    else:                                  # a run stopped early: record what its checkpoints hold
        desc, s = SETTINGS[name]
        cfg = run_config(name, s)
        steps = [json.loads(line) for line in (Path(cfg.out) / "metrics.jsonl").read_text().splitlines()]
        last = max(int(d.name.split("_")[1]) for d in (Path(cfg.out) / "checkpoints").glob("step_*"))
        from inductionlab.runtime.runs import versions
        rec = {"name": name, "description": desc + f" [stopped at update {last} of {cfg.steps}]",
               "setting": {**s, "span": list(s["span"])}, "config": cfg.to_dict(), "steps": last,
               "tokens": last * cfg.tokens_per_update, "partial": True,
               "wall_s": sum(r["step_time_s"] for r in steps if r["step"] <= last) * cfg.log_every,  # approx.
               "versions": versions()}
    run_dir = Path(rec["config"]["out"])
    if "sep_id" not in rec:
        from inductionlab.data.shards import TokenShards
        sh = TokenShards.open(rec["config"]["data"])
        rec["special_ids"] = [i for i in (sh.eos_id, sh.bos_id) if i is not None]
        rec["vocab_size"] = sh.vocab_size
        rec["sep_id"] = sh.sep_id
    rec["curve"] = copy_losses(run_dir, rec["vocab_size"], rec["special_ids"])
    rec["snippet_probe"] = snippet_losses(run_dir, rec["sep_id"], rec["vocab_size"], rec["special_ids"])
    rec.update(summarize_curve(rec["curve"]))
    path.write_text(json.dumps(rec, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", help="settings to run (default: all)")
    ap.add_argument("--force", action="store_true", help="rerun settings already recorded")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-run", action="store_true", help="only aggregate what is recorded")
    ap.add_argument("--recurve", action="store_true",
                    help="recompute the probe curves of recorded settings from their checkpoints")
    ap.add_argument("--calibration", action="store_true",
                    help="also rerun CALIBRATION.md's toy and probe it at T = 32 / 20 / 50 (~1 min)")
    a = ap.parse_args()
    if a.list:
        for k, (d, s) in SETTINGS.items():
            print(f"{k:24s} {d}")
        return
    torch.set_num_threads(a.threads)
    names = a.only or list(SETTINGS)
    for n in names:
        if n not in SETTINGS:
            raise SystemExit(f"error: unknown setting {n!r}; see --list")
    if a.recurve:
        for n in names:
            if ((RESULTS / "positive_control" / f"{n}.json").is_file()
                    or (Path(run_config(n, SETTINGS[n][1]).out) / "checkpoints").is_dir()):
                recurve(n)
    elif not a.no_run:
        for n in names:
            print(f"== {n}", flush=True)
            r = run_setting(n, a.force)
            print(f"   {r['tokens']:,} tokens {r['wall_s']:.0f} s  max induction {r['final']['max_induction']:.3f} "
                  f"emergence {r['emergence_step']}  copy loss {r['final']['first_copy_loss']:.2f} / "
                  f"{r['final']['second_copy_loss']:.2f}", flush=True)
    cal_path = RESULTS / "positive_control" / "calibration_replica.json"
    if a.calibration and (a.force or not cal_path.is_file()):
        cal_path.parent.mkdir(parents=True, exist_ok=True)
        cal_path.write_text(json.dumps(calibration_replica(), indent=1))
    from inductionlab.runtime.runs import versions
    recs = [json.loads((RESULTS / "positive_control" / f"{n}.json").read_text()) for n in SETTINGS
            if (RESULTS / "positive_control" / f"{n}.json").is_file()]
    agg = {"kind": "positive_control", "threshold": THRESHOLD, "threads": a.threads,
           "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "versions": versions(),
           "base": {**BASE, "span": list(BASE["span"])}, "settings": recs,
           "calibration_replica": json.loads(cal_path.read_text()) if cal_path.is_file() else None}
    (RESULTS / "positive_control.json").write_text(json.dumps(agg, indent=1))
    print(table(recs))
    if agg["calibration_replica"]:
        c = agg["calibration_replica"]
        print(f"\nCALIBRATION.md toy after {c['steps']} updates (vocab {c['vocab']}), probed at T = 32 / 20 / 50:")
        for T, p in c["probe_by_T"].items():
            print(f"  T = {T}: max induction {p['max_induction']:.3f}, loss 1st / 2nd copy "
                  f"{p['first_copy']:.2f} / {p['second_copy']:.2f}")


if __name__ == "__main__":
    main()
