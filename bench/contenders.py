"""Benchmark suite of issue 12 (run by hand; prints tables, writes JSON with versions).

Every contender runs in its own process (one torch thread, ``MALLOC_MMAP_THRESHOLD_=65536`` so
freed tensors go back to the system), loads SmolLM2-135M, warms up once and is timed ``--inner``
times; the parent runs the contenders round-robin ``--rounds`` times (interleaved, so load drift
hits all alike) and reports the minimum time and minimum extra peak RSS over all repeats, with
the spread (max/min time) as the noise measure.

Sub-benchmarks (``--only`` picks some):

* ``scoring``: the induction score of all 270 heads on 8 × ``[BOS] + S + S`` (|S| = 256, 513
  tokens), fp32: the bare forward (SDPA, ``logits_to_keep=1``, the floor); inductionlab's
  reduction path and ``compute_head_scores`` (the score alone; with the induction loss, which
  runs the LM head on every position; all five scores, which read two sequence sets, so two
  forwards: compare with 2 × the floor) (this checkout, and ``--before SRC``: another
  checkout's src, e.g. ../baseline/src); transformers eager ``output_attentions=True``;
  TransformerLens (``--tl-python``: a venv with transformer-lens; its bridge is booted from a
  local ``save_pretrained`` copy of the same weights, no hub).
* ``tscale``: time and extra peak memory of scoring vs the bare forward (and eager) at 1 × T,
  T = 257 … 4097.
* ``lagprobe``: one batch of 8 lag-probe trials (502 tokens) vs the bare last-logit forward,
  intact and with 10 heads zero-ablated, fp32 and bf16.
* ``matmul``: fp32 vs bf16 matmul throughput and oneDNN/AMX facts (is bf16 faster on this CPU?).
* ``help``: ``inductionlab --help`` start-up (this checkout and ``--before``).

    PYTHONPATH=src .venv/bin/python bench/contenders.py --before ../baseline/src \\
        --tl-python /tmp/tl-venv/bin/python --out bench/contenders.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve()
SRC = HERE.parent.parent / "src"
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class PeakRSS:
    """Peak RSS while the block runs (sampled every 2 ms) minus the RSS at entry: ``.extra`` bytes."""

    def __enter__(self):
        self.base = self.peak = rss()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss())
            time.sleep(0.002)

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, rss())
        self.extra = self.peak - self.base


# ----------------------------------------------------------------------------------------------
# workers (run in a child process)

def timed(run, inner: int):
    """One warm-up call of ``run``, then ``inner`` timed calls: ``(seconds, extra peak GB, last result)``."""
    run()
    times, mems = [], []
    for _ in range(inner):
        with PeakRSS() as p:
            t0 = time.perf_counter()
            res = run()
            times.append(time.perf_counter() - t0)
        mems.append(p.extra / 1e9)
    return times, mems, res


def _load(dtype="float32", attn="sdpa"):
    import torch

    from inductionlab.core.models import load_model
    lm = load_model("smollm2-135m", dtype=dtype)
    if attn != "sdpa":
        lm.model.set_attn_implementation(attn)
    return lm, torch


def _score_ids(lm, B, n):
    import torch

    from inductionlab.core.stimuli import ordinary_token_ids, random_sequences
    pool = ordinary_token_ids(lm.model.config.vocab_size, tokenizer=lm.tokenizer)
    S = random_sequences(pool, B, n, 0)
    return S, torch.cat([torch.full((B, 1), lm.tokenizer.bos_token_id), S, S], 1)


def _induction_from_attn(attn, n):
    """[L, H] induction score from per-layer [B, H, T, T] patterns ([BOS] + S + S)."""
    import torch
    T = 2 * n + 1
    q = torch.arange(n + 1, T)
    k = q - n + 1
    return torch.stack([a[:, :, q, k].float().mean(dim=(0, 2)) for a in attn])


def worker(name: str, B: int, n: int, inner: int, dtype: str) -> dict:
    import torch
    torch.set_num_threads(1)
    out = {}
    if name == "tl":
        return tl_worker(B, n, inner)
    lm, _ = _load(dtype, "eager" if name == "eager" else "sdpa")
    model = lm.model
    if name.startswith("lag_"):
        return lag_worker(name, lm, inner)
    S, ids = _score_ids(lm, B, n)

    def run():
        with torch.inference_mode():
            if name == "bare":
                model(input_ids=ids, logits_to_keep=1)
                return None
            if name == "reduction":
                from inductionlab.core.instrument import instrument
                from inductionlab.core.scores import induction_targets
                with instrument(model, reductions={"induction": induction_targets(n, True)}) as inst:
                    model(input_ids=ids, logits_to_keep=1)
                t = induction_targets(n, True)
                return inst.reduced["induction"][..., t >= 0].mean(dim=(1, 3))
            if name == "eager":
                o = model(input_ids=ids, logits_to_keep=1, output_attentions=True)
                return _induction_from_attn(o.attentions, n)
            from inductionlab.core.scores import compute_head_scores
            # scores_induction: the score alone (the job the other contenders do);
            # scores_induction_loss: + the induction loss (LM head on every position);
            # scores_all: the public default, five scores (two sequence sets: two forwards) + the loss
            kw = {"names": ("induction",), "induction_loss": False} if name == "scores_induction" else \
                 {"names": ("induction",)} if name == "scores_induction_loss" else {}
            hs = compute_head_scores(lm, sequences=S, batch_size=B, **kw)
            return torch.as_tensor(hs.scores["induction"])
    times, mems, res = timed(run, inner)
    out.update(time_s=times, extra_peak_gb=mems)
    if res is not None:
        res = res.double()
        out["top10"] = [int(i) for i in res.flatten().argsort(descending=True)[:10]]
        out["scores"] = res.flatten().tolist()
    return out


def tl_worker(B: int, n: int, inner: int) -> dict:
    import torch
    from transformer_lens.model_bridge import TransformerBridge
    hf_dir = os.environ["BENCH_HF_DIR"]
    bridge = TransformerBridge.boot_transformers(hf_dir, device="cpu", dtype=torch.float32)
    ids = torch.load(os.path.join(hf_dir, "bench_ids.pt"))[f"{B}x{n}"]
    flt = lambda name: name.endswith("hook_pattern")   # noqa: E731

    def run():
        with torch.inference_mode():
            _, cache = bridge.run_with_cache(ids, names_filter=flt)
            pats = [cache[k] for k in sorted(cache.keys(), key=lambda s: int(s.split(".")[1]))]
            return _induction_from_attn(pats, n)
    times, mems, res = timed(run, inner)
    res = res.double()
    return {"time_s": times, "extra_peak_gb": mems, "scores": res.flatten().tolist(),
            "top10": [int(i) for i in res.flatten().argsort(descending=True)[:10]],
            "transformer_lens": __import__("transformer_lens").__version__ if hasattr(__import__("transformer_lens"), "__version__") else "4.3.0"}


def lag_worker(name: str, lm, inner: int) -> dict:
    """name: lag_{bare|intact|ablated}_{float32|bfloat16}."""
    import torch

    from inductionlab.core.instrument import ablate
    from inductionlab.protocols.lag_probe import LagProbeConfig, build_trials, measure_batch
    _, kind, _ = name.split("_", 2)
    cfg = LagProbeConfig(n_permutations=8)
    trials = build_trials(lm, cfg).tensors
    batch = {k: v[:8] for k, v in trials.items()}
    heads = [(l, h) for l in range(20, 30) for h in range(1)]            # 10 heads, upper layers
    model = lm.model

    def run():
        with torch.inference_mode():
            if kind == "bare":
                model(input_ids=batch["ids"], logits_to_keep=1)
            elif kind == "intact":
                measure_batch(model, batch, cfg)
            else:
                with ablate(model, heads, "zero"):
                    measure_batch(model, batch, cfg)
    run()
    times = []
    for _ in range(inner):
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) / 8)
    return {"time_s": times, "extra_peak_gb": [0.0]}


def matmul_worker() -> dict:
    import torch
    torch.set_num_threads(1)
    res = {"mkldnn_available": torch.backends.mkldnn.is_available(),
           "mkldnn_enabled": torch.backends.mkldnn.enabled,
           "cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "onednn": torch.backends.mkldnn.version() if hasattr(torch.backends.mkldnn, "version") else None}
    try:
        flags = open("/proc/cpuinfo").read().split("flags")[1].split("\n")[0].split()
        res["cpu_flags"] = sorted(f for f in flags if f.startswith(("amx", "avx512_bf16", "avx512f")))
    except Exception:  # noqa: BLE001
        pass
    m, k, nn = 4104, 576, 1536                                           # 8 × 513 tokens through an MLP matmul
    for dt in ("float32", "bfloat16"):
        a = torch.randn(m, k).to(getattr(torch, dt))
        w = torch.randn(nn, k).to(getattr(torch, dt))
        torch.nn.functional.linear(a, w)
        ts = []
        for _ in range(5):
            t0 = time.perf_counter()
            torch.nn.functional.linear(a, w)
            ts.append(time.perf_counter() - t0)
        res[f"linear_{dt}_gflops"] = 2 * m * k * nn / min(ts) / 1e9
    return res


# ----------------------------------------------------------------------------------------------
# parent

def child(contender: str, src: Path, args, B: int, n: int, dtype="float32", python=None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "MALLOC_MMAP_THRESHOLD_": "65536", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [python or sys.executable, str(HERE), "--worker", contender, "--B", str(B), "--n", str(n),
           "--inner", str(args.inner), "--dtype", dtype]
    if python:                                            # TransformerLens venv: the bench file only
        env["PYTHONPATH"] = str(HERE.parent)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        return {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}",
                "stderr_tail": p.stderr[-2000:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def merge(acc: dict, r: dict) -> None:
    if "error" in r:
        acc.setdefault("errors", []).append(r["error"])
        acc.setdefault("stderr_tail", r.get("stderr_tail"))
        return
    acc.setdefault("time_s", []).extend(r["time_s"])
    acc.setdefault("extra_peak_gb", []).extend(r["extra_peak_gb"])
    for k in ("scores", "top10"):
        if k in r:
            acc[k] = r[k]


def table(title: str, rows: dict, floor: str) -> list[dict]:
    print(f"\n## {title}\n")
    print(f"| contender | time (min) | × floor | spread max/min | extra peak | × floor | n |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    out = []
    f = rows.get(floor, {})
    ft = min(f["time_s"]) if f.get("time_s") else float("nan")
    fm = min(f["extra_peak_gb"]) if f.get("extra_peak_gb") else float("nan")
    for name, r in rows.items():
        if not r.get("time_s"):
            print(f"| {name} | failed: {r.get('errors', ['?'])[0][:80]} | | | | | |")
            out.append({"contender": name, "error": r.get("errors")})
            continue
        t, m = min(r["time_s"]), min(r["extra_peak_gb"])
        spread = max(r["time_s"]) / t
        print(f"| {name} | {t:.3f} s | {t / ft:.2f} | {spread:.2f} | {m:.3f} GB | {m / fm if fm > 0 else float('nan'):.2f} | {len(r['time_s'])} |")
        out.append({"contender": name, "time_s_min": t, "x_floor_time": t / ft, "spread": spread,
                    "extra_peak_gb_min": m, "x_floor_mem": m / fm if fm > 0 else None, "n": len(r["time_s"]),
                    "time_s": r["time_s"], "extra_peak_gb": r["extra_peak_gb"], "top10": r.get("top10")})
    return out


def agreement(rows: dict) -> dict:
    import numpy as np
    ref = rows.get("inductionlab compute_head_scores(induction)", {}).get("scores")
    out = {}
    if ref is None:
        return out
    ref = np.array(ref)
    for name, r in rows.items():
        if r.get("scores") is not None:
            s = np.array(r["scores"])
            out[name] = {"max_abs_diff": float(np.abs(s - ref).max()),
                         "same_top10": r.get("top10") == rows["inductionlab compute_head_scores(induction)"].get("top10")}
    return out


def prepare_tl(args, sizes) -> str | None:
    """A save_pretrained copy of SmolLM2 (fp32) and the exact input ids, for the TransformerLens venv."""
    import torch
    d = Path(args.hf_dir)
    if not (d / "config.json").exists():
        from transformers import AutoModelForCausalLM
        lm, _ = _load("float32")                       # the GGUF de-quantised to fp32: re-save as plain HF
        cfg = lm.model.config
        cfg.quantization_config = None
        if hasattr(cfg, "quantization_config"):
            del cfg.quantization_config
        plain = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        plain.load_state_dict(lm.model.state_dict())
        plain.save_pretrained(d)
        lm.tokenizer.save_pretrained(d)
    from transformers import AutoConfig, AutoTokenizer

    from inductionlab.core.stimuli import ordinary_token_ids, random_sequences
    ids = {}
    tok = AutoTokenizer.from_pretrained(d)
    V = AutoConfig.from_pretrained(d).vocab_size
    pool = ordinary_token_ids(V, tokenizer=tok)
    for B, n in sizes:
        S = random_sequences(pool, B, n, 0)
        ids[f"{B}x{n}"] = torch.cat([torch.full((B, 1), tok.bos_token_id), S, S], 1)
    torch.save(ids, d / "bench_ids.pt")
    return str(d)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker")
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--inner", type=int, default=2)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", default="help,matmul,scoring,lagprobe,tscale")
    ap.add_argument("--before", default=None, help="src of another checkout (before/after rows)")
    ap.add_argument("--tl-python", default=None)
    ap.add_argument("--hf-dir", default="/tmp/smollm2-135m-hf")
    ap.add_argument("--tscale", default="128,256,512,1024,2048,4096",
                    help="|S| values (T = 2|S| + 1; 4096 reaches SmolLM2's 8192-token context)")
    ap.add_argument("--eager-max-t", type=int, default=1100, help="skip eager in tscale above this T (memory)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.worker:
        sys.path.insert(0, str(HERE.parent))
        if args.worker == "matmul":
            r = matmul_worker()
        else:
            if args.worker == "tl":
                os.environ.setdefault("BENCH_HF_DIR", args.hf_dir)
            r = worker(args.worker, args.B, args.n, args.inner, args.dtype)
        print(json.dumps(r))
        return

    import torch
    import transformers
    only = set(args.only.split(","))
    record = {"torch": torch.__version__, "transformers": transformers.__version__,
              "python": platform.python_version(), "machine": platform.machine(), "threads": 1,
              "cpus": os.cpu_count(), "loadavg_start": os.getloadavg(), "rounds": args.rounds, "inner": args.inner,
              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    srcs = {"": SRC}
    if args.before:
        srcs[" @before"] = Path(args.before)

    if "help" in only:
        rows = {}
        for _ in range(3):
            for tag, src in srcs.items():
                env = {**os.environ, "PYTHONPATH": str(src)}
                t0 = time.perf_counter()
                subprocess.run([sys.executable, "-m", "inductionlab.cli", "--help"], env=env, capture_output=True)
                rows.setdefault(f"inductionlab --help{tag}", {"time_s": [], "extra_peak_gb": []})["time_s"].append(
                    time.perf_counter() - t0)
                rows[f"inductionlab --help{tag}"]["extra_peak_gb"].append(0.0)
        for tag, src in srcs.items():
            env = {**os.environ, "PYTHONPATH": str(src)}
            p = subprocess.run([sys.executable, "-c", "import sys, inductionlab.cli; print(sorted(m for m in ('torch','transformers') if m in sys.modules))"],
                               env=env, capture_output=True, text=True)
            rows[f"inductionlab --help{tag}"]["heavy_imports"] = p.stdout.strip()
        record["help"] = table("inductionlab --help start-up (wall, 3 runs)", rows, "inductionlab --help")
        for tag in srcs:
            print(f"imports at --help{tag}: {rows[f'inductionlab --help{tag}']['heavy_imports']}")

    if "matmul" in only:
        r = child("matmul", SRC, args, 0, 0)
        record["matmul"] = r
        print("\n## matmul fp32 vs bf16 (1 thread, 4104×576 @ 576×1536)\n")
        print(json.dumps(r, indent=1))

    if "scoring" in only:
        B, n = args.B, args.n
        contenders = [("bare forward, SDPA, logits_to_keep=1 (floor)", "bare", SRC, None),
                      ("inductionlab reduction path (instrument reductions=)", "reduction", SRC, None),
                      ("inductionlab compute_head_scores(induction)", "scores_induction", SRC, None),
                      ("inductionlab compute_head_scores(induction) + induction loss", "scores_induction_loss", SRC, None),
                      ("inductionlab compute_head_scores (all five: 2 sequence sets) + loss", "scores_all", SRC, None),
                      ("transformers eager output_attentions=True", "eager", SRC, None)]
        if args.before:
            contenders += [("inductionlab compute_head_scores(induction) @before", "scores_induction", Path(args.before), None),
                           ("inductionlab reduction path @before", "reduction", Path(args.before), None)]
        if args.tl_python:
            prepare_tl(args, [(B, n)])
            os.environ["BENCH_HF_DIR"] = args.hf_dir
            contenders.append(("TransformerLens 4.3 bridge run_with_cache (hook_pattern only)", "tl", SRC, args.tl_python))
        rows = {c[0]: {} for c in contenders}
        for _ in range(args.rounds):
            for label, name, src, py in contenders:
                merge(rows[label], child(name, src, args, B, n, python=py))
        record["scoring"] = {"shape": [B, 2 * n + 1], "dtype": "float32",
                             "rows": table(f"Induction score of all heads, {B} × {2 * n + 1}, fp32", rows, contenders[0][0]),
                             "agreement_vs_compute_head_scores": agreement(rows)}
        print(json.dumps(record["scoring"]["agreement_vs_compute_head_scores"], indent=1))

    if "lagprobe" in only:
        rows = {}
        order = [f"lag_{k}_{dt}" for dt in ("float32", "bfloat16") for k in ("bare", "intact", "ablated")]
        for _ in range(args.rounds):
            for name in order:
                dt = name.rsplit("_", 1)[1]
                merge(rows.setdefault(name, {}), child(name, SRC, args, 8, 0, dtype=dt))
        record["lagprobe"] = {}
        for dt in ("float32", "bfloat16"):
            sub = {k.replace("lag_", "").replace(f"_{dt}", ""): rows[k] for k in order if k.endswith(dt)}
            record["lagprobe"][dt] = table(f"Lag-probe trial (per trial, batch 8, 502 tokens), {dt}", sub, "bare")

    if "tscale" in only:
        rows_all = {}
        for n in [int(x) for x in args.tscale.split(",")]:
            cont = [("bare", "bare"), ("reduction path", "reduction"), ("compute_head_scores(induction)", "scores_induction")]
            if 2 * n + 1 <= args.eager_max_t:     # eager keeps L × [1, H, T, T] fp32: 18 GB at T = 4097
                cont.append(("eager output_attentions", "eager"))
            rows = {c[0]: {} for c in cont}
            for _ in range(max(1, args.rounds - 1)):
                for label, name in cont:
                    merge(rows[label], child(name, SRC, args, 1, n))
            rows_all[2 * n + 1] = table(f"T-scaling: 1 × {2 * n + 1} tokens, fp32", rows, "bare")
        record["tscale"] = rows_all

    record["loadavg_end"] = os.getloadavg()
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=1))
        print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
