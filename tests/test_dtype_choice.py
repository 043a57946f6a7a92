"""``dtype="auto"``: both branches of the choice on any CPU (the probe's answer is forced), an
explicit dtype that bypasses the probe, the CUDA branch through a patched ``torch.cuda``, the
record in the identity and results.json, and a resume in another resolved dtype refused."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from inductionlab.runtime import dtype_choice as D
from inductionlab.errors import InductionLabError

AMD = {"amx": False, "avx512_bf16": True, "capability": "AVX512", "model": "AMD EPYC", "machine": "x86_64"}
AVX512_ONLY = {**AMD, "avx512_bf16": False, "model": "Intel Xeon (no bf16)"}
INTEL_AMX = {**AMD, "amx": True, "model": "Intel Xeon (AMX)"}


def fake_probe(speedup: float, calls: list | None = None):
    def probe(k, n, budget_s=D.PROBE_BUDGET_S):
        if calls is not None:
            calls.append((k, n))
        return {"shape": [256, k, n], "fp32_gflops": 86.0, "bf16_gflops": 86.0 * speedup, "speedup": speedup,
                "seconds": 0.05, "threads": torch.get_num_threads()}
    return probe


def no_probe(*a, **k):
    raise AssertionError("the probe must not run")


@pytest.fixture
def cpu(monkeypatch):
    """Force the CPU's flags and the benchmark's answer: ``cpu(flags, speedup)``; returns the probe calls."""
    D._cpu_choice.cache_clear()

    def force(flags: dict, speedup: float | None):
        D._cpu_choice.cache_clear()                                 # a new process, as far as the cache goes
        calls: list = []
        monkeypatch.setattr(D, "cpu_flags", lambda: dict(flags))
        monkeypatch.setattr(D, "bf16_matmul_speedup", no_probe if speedup is None else fake_probe(speedup, calls))
        return calls
    yield force
    D._cpu_choice.cache_clear()


def test_auto_is_bf16_where_the_probe_finds_it_fast(cpu):
    calls = cpu(AMD, 2.4)
    c = D.resolve_dtype("auto", "cpu", (576, 1536))
    assert (c.requested, c.dtype, c.torch_dtype) == ("auto", "bfloat16", torch.bfloat16)
    assert c.reason == "cpu avx512_bf16: bf16 matmul 2.4x fp32 (probe 0.05 s)"
    assert calls == [(576, 1536)]                                   # the model's MLP shape was timed
    rec = c.record()
    assert rec["cpu"] == AMD and rec["probe"]["speedup"] == 2.4 and rec["dtype"] == "bfloat16"
    assert c.line() == "dtype bfloat16 (auto: cpu avx512_bf16: bf16 matmul 2.4x fp32 (probe 0.05 s))"
    # cached per process: the same device, shape and threads ask nothing again
    assert D.resolve_dtype("auto", "cpu", (576, 1536)) is c and len(calls) == 1
    D.resolve_dtype("auto", "cpu", (64, 128))
    assert calls == [(576, 1536), (64, 128)]


def test_auto_is_fp32_where_the_probe_finds_bf16_slow(cpu):
    cpu(INTEL_AMX, 1.2)                                             # flags say yes, the benchmark says no
    c = D.resolve_dtype("auto", "cpu")
    assert c.dtype == "float32" and "below the 1.5x needed" in c.reason and "amx" in c.reason
    assert c.record()["probe"]["speedup"] == 1.2


def test_threshold_is_inclusive(cpu):
    cpu(AMD, D.MIN_SPEEDUP)
    assert D.resolve_dtype("auto", "cpu").dtype == "bfloat16"


def test_x86_without_bf16_flags_is_fp32_without_a_benchmark(cpu):
    cpu(AVX512_ONLY, None)                                         # the probe would raise
    c = D.resolve_dtype("auto", "cpu")
    assert c.dtype == "float32" and c.probe is None
    assert c.reason == "cpu without AMX or avx512_bf16 (torch capability AVX512): bf16 matmuls are emulated there"
    assert "probe" not in c.record() and c.record()["cpu"]["model"] == "Intel Xeon (no bf16)"


def test_other_cpus_are_decided_by_the_benchmark_alone(cpu):
    arm = {"amx": False, "avx512_bf16": False, "capability": "DEFAULT", "model": None, "machine": "aarch64"}
    cpu(arm, 2.0)
    c = D.resolve_dtype("auto", "cpu")
    assert c.dtype == "bfloat16" and c.reason.startswith("cpu (capability DEFAULT, no bf16 flags known)")
    cpu({**AMD, "avx512_bf16": None, "amx": None}, 0.3)              # x86 whose flags could not be read
    assert D.resolve_dtype("auto", "cpu").dtype == "float32"


def test_an_explicit_dtype_bypasses_the_probe(cpu, monkeypatch):
    cpu(AMD, None)
    monkeypatch.setattr(D, "cpu_flags", no_probe)
    for name, want in [("float32", "float32"), ("fp32", "float32"), ("bf16", "bfloat16"), ("float16", "float16")]:
        c = D.resolve_dtype(name, "cpu")
        assert (c.requested, c.dtype, c.reason, c.probe) == (name, want, "requested explicitly", None)
    c = D.resolve_dtype(torch.bfloat16, "cuda")                     # no CUDA needed either
    assert (c.requested, c.dtype) == ("bfloat16", "bfloat16")
    assert c.line() == "dtype bfloat16 (requested explicitly)"


def test_bad_dtypes():
    with pytest.raises(InductionLabError, match="unknown dtype 'int8'; use one of auto, float32"):
        D.resolve_dtype("int8", "cpu")
    with pytest.raises(TypeError, match="not int"):
        D.resolve_dtype(8, "cpu")


def test_cuda_branch(monkeypatch, cpu):
    cpu(AMD, None)                                                  # a CUDA choice never times the CPU
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: ["NVIDIA H200", "Tesla V100"][i])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None: [(9, 0), (7, 0)][i])
    c = D.resolve_dtype("auto", "cuda")
    assert c.dtype == "bfloat16" and c.reason == "cuda NVIDIA H200 (compute capability 9.0): native bf16"
    assert c.record()["cuda"] == {"name": "NVIDIA H200", "capability": [9, 0]}
    c = D.resolve_dtype("auto", "cuda:1")
    assert c.dtype == "float32" and "Tesla V100 (compute capability 7.0): no native bf16" in c.reason
    assert D.resolve_dtype("auto", "mps").dtype == "float32"


def test_probe_dims_follow_the_model_and_stay_small():
    assert D._probe_dims(576, 1536) == (256, 576, 1536)              # SmolLM2: 0.45 GFLOP, as is
    m, k, n = D._probe_dims(4096, 14336)                             # Llama-3.1-8B: 64 tokens, narrower
    assert m == 64 and 2 * m * k * n <= 0.5e9 and abs(k / n - 4096 / 14336) < 0.01


def test_the_real_probe_measures_both_dtypes():
    r = D.bf16_matmul_speedup(64, 128)
    assert r["shape"] == [256, 64, 128] and r["threads"] == torch.get_num_threads()
    assert r["fp32_gflops"] > 0 and r["bf16_gflops"] > 0
    assert r["speedup"] == pytest.approx(r["bf16_gflops"] / r["fp32_gflops"], abs=0.02)


def test_cpu_flags_agree_with_proc_cpuinfo():
    f = D.cpu_flags()
    assert set(f) == {"amx", "avx512_bf16", "capability", "model", "machine"}
    try:
        words = open("/proc/cpuinfo").read().split()
    except OSError:
        pytest.skip("no /proc/cpuinfo")
    if f["machine"] == "x86_64":
        assert f["avx512_bf16"] == ("avx512_bf16" in words) and f["amx"] == ("amx_tile" in words)


def test_mlp_shape_of_configs():
    from conftest import tiny_config
    assert D.mlp_shape(tiny_config("llama")) == (64, 128)
    assert D.mlp_shape(tiny_config("gpt2")) == (64, 256)             # n_inner None: 4 × n_embd


# -- load_model and the run record ------------------------------------------------------------------

def test_load_model_auto_follows_the_probe(cpu, tiny_dir):
    from inductionlab.core.models import load_model

    calls = cpu(AMD, 2.4)
    lm = load_model(str(tiny_dir))                                   # the default is auto
    assert next(lm.model.parameters()).dtype == torch.bfloat16 and lm.identity["dtype"] == "bfloat16"
    ch = lm.identity["dtype_choice"]
    assert ch["requested"] == "auto" and ch["reason"].startswith("cpu avx512_bf16: bf16 matmul 2.4x")
    assert calls == [(64, 128)]                                      # the tiny Llama's hidden, intermediate
    cpu(AMD, 0.5)
    lm = load_model(str(tiny_dir), dtype="auto")
    assert next(lm.model.parameters()).dtype == torch.float32 and lm.identity["dtype_choice"]["dtype"] == "float32"
    cpu(AMD, None)
    lm = load_model(str(tiny_dir), dtype="bfloat16")
    assert lm.identity["dtype_choice"] == {"requested": "bfloat16", "dtype": "bfloat16",
                                           "reason": "requested explicitly"}
    with pytest.raises(InductionLabError, match="use one of auto, float32, bfloat16, float16"):
        load_model(str(tiny_dir), dtype="int8")


def test_ran_identity_says_when_the_choice_was_undone(cpu, tiny_dir):
    from inductionlab.core.models import load_model, params_identity, ran_identity

    cpu(AMD, 2.4)
    lm = load_model(str(tiny_dir))
    lm.model.to(torch.float32)
    ran = ran_identity(lm)
    assert ran["dtype"] == "float32" and ran["dtype_choice"]["dtype"] == "float32"
    assert ran["dtype_choice"]["reason"].startswith("cast to float32 after loading (load_model chose bfloat16: cpu")
    p = params_identity(ran)
    assert "dtype_choice" not in p and "device" not in p and p["dtype"] == "float32"


def test_every_torchrun_rank_runs_in_rank_0s_dtype(cpu, tiny_dir, monkeypatch):
    import inductionlab.runtime.distributed as dist_mod
    from inductionlab.runtime.distributed import Dist
    from inductionlab.core.models import agree_dtype, load_model

    cpu(AMD, 0.5)
    lm = load_model(str(tiny_dir))                                   # this rank's probe said float32
    rank0 = ("bfloat16", {"requested": "auto", "dtype": "bfloat16", "reason": "rank 0's reason"})
    agree_dtype(lm, Dist())                                          # one process: nothing happens
    assert lm.identity["dtype"] == "float32"
    monkeypatch.setattr(dist_mod, "broadcast", lambda obj, d: rank0)
    agree_dtype(lm, Dist(rank=1, world_size=2))
    assert next(lm.model.parameters()).dtype == torch.bfloat16
    assert lm.identity["dtype"] == "bfloat16" and lm.identity["dtype_choice"] == rank0[1]


def _analyze_args(model, out, *extra):
    return ["analyze", "--model", str(model), "--out", str(out), "--n-permutations", "2", "--list-length", "20",
            "--cue-position", "10", "--ks", "1", "--n-draws", "1", "--score-seq-len", "8", "--score-batch-size", "2",
            "--top", "2", "--quiet", *extra]


def test_cli_default_is_auto_printed_first_and_recorded(cpu, tiny_dir, tmp_path):
    from inductionlab.cli import main

    cpu(AMD, 2.4)
    out = tmp_path / "run"
    r = CliRunner().invoke(main, _analyze_args(tiny_dir, out))
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[0] == "dtype bfloat16 (auto: cpu avx512_bf16: bf16 matmul 2.4x fp32 (probe 0.05 s))"
    rec = json.loads((out / "results.json").read_text())
    assert rec["model"]["dtype"] == "bfloat16" and rec["model"]["dtype_choice"]["requested"] == "auto"
    assert rec["model"]["dtype_choice"]["cpu"] == AMD and rec["model"]["dtype_choice"]["probe"]["speedup"] == 2.4
    assert rec["params"]["model"]["dtype"] == "bfloat16" and "dtype_choice" not in rec["params"]["model"]
    # the same run again, the probe measuring another speedup but the same dtype: it resumes
    cpu(AMD, 3.1)
    r = CliRunner().invoke(main, _analyze_args(tiny_dir, out))
    assert r.exit_code == 0, r.output
    assert json.loads((out / "results.json").read_text())["model"]["dtype_choice"]["probe"]["speedup"] == 3.1
    # an explicit --dtype that resolves to the same dtype is the same run too
    r = CliRunner().invoke(main, _analyze_args(tiny_dir, out, "--dtype", "bfloat16"))
    assert r.exit_code == 0 and r.output.splitlines()[0] == "dtype bfloat16 (requested explicitly)", r.output
    # another resolved dtype is another run: refused, one error line
    cpu(AMD, 0.5)
    r = CliRunner().invoke(main, _analyze_args(tiny_dir, out))
    assert r.exit_code == 2 and r.output.strip().splitlines() == [
        f"error: {out} holds a analyze run with another model (model.dtype); use a new --out, the same model and "
        "options, or --overwrite"], r.output


def test_a_refused_input_prints_only_its_error(cpu, tiny_dir, tmp_path):
    from inductionlab.cli import main

    cpu(AMD, 2.4)
    r = CliRunner().invoke(main, _analyze_args(tiny_dir, tmp_path / "x", "--ks", "99"))
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: k=99"), r.output


def test_study_temporal_resume_in_another_dtype_is_refused(cpu, tiny_dir, tmp_path):
    from inductionlab.protocols.lag_probe import LagProbeConfig
    from inductionlab.core.models import load_model
    from inductionlab.protocols.serial_recall import SerialRecallConfig
    from inductionlab.studies.configs import AblationConfig, HeadScoreConfig
    from inductionlab.studies.spec import RunOptions
    from inductionlab.studies.temporal import TemporalStudyConfig, run_temporal_study

    cfg = TemporalStudyConfig(lag=LagProbeConfig(n_permutations=2, list_length=20, cue_position=10),
                              recall=SerialRecallConfig(n_trials=2, list_length=4, n_shots=1),
                              ablation=AblationConfig(ks=(1,), n_draws=1), load_bearing_top=0,
                              scores=HeadScoreConfig(seq_len=8, batch_size=2))
    cpu(AMD, 2.4)
    lines: list = []
    first = run_temporal_study(load_model(str(tiny_dir)), cfg, tmp_path / "s", RunOptions(progress=False, log=lines.append))
    assert lines[0] == "dtype bfloat16 (auto: cpu avx512_bf16: bf16 matmul 2.4x fp32 (probe 0.05 s))"
    assert all("first batch" in ln for ln in lines[1:])              # and only the time estimate after it
    assert first.record["model"]["dtype_choice"]["dtype"] == "bfloat16"
    assert first.record["params"]["model"]["dtype"] == "bfloat16"
    cpu(AMD, 2.9)                                                    # same dtype, other timings: resumes
    again = run_temporal_study(load_model(str(tiny_dir)), cfg, tmp_path / "s", RunOptions(progress=False))
    assert again.record["params"] == first.record["params"]
    with pytest.raises(InductionLabError, match=r"another model \(model\.dtype\)"):
        run_temporal_study(load_model(str(tiny_dir), dtype="float32"), cfg, tmp_path / "s", RunOptions(progress=False))
