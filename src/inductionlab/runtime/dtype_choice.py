"""``dtype="auto"``: bfloat16 where the device runs it fast, float32 otherwise (SPEC: dtype).

What decides, in order:

1. An explicit dtype (``float32``, ``bfloat16``, ``float16``, a ``torch.dtype``) is taken as
   asked; nothing is probed.
2. CUDA: bfloat16 on a GPU with native bf16 (compute capability ≥ 8.0, Ampere and later; on
   ROCm, torch's ``is_bf16_supported``), float32 on older GPUs (bf16 is emulated there).
3. CPU: the CPU's flags, as torch's own cpuinfo reads them (``torch.cpu._is_amx_tile_supported``,
   ``_is_avx512_bf16_supported``; ``/proc/cpuinfo`` where those are missing). An x86 CPU with
   neither AMX nor avx512_bf16 gets float32 without a benchmark: torch emulates bf16 matmuls there
   (measured on one such CPU: a bf16 linear layer 5.7× slower than fp32). Otherwise (a CPU with
   those flags, or one whose flags say nothing: ARM, unknown) a micro-benchmark decides: one
   ``F.linear`` of the model's MLP shape (``[M × hidden]·[hidden × intermediate]``, M ≤ 256
   tokens, scaled down for large models) in bf16 and in fp32, interleaved, the minimum of up to 20
   repeats each, at torch's current thread count, in at most ~0.2 s. bfloat16 when bf16 runs at
   least :data:`MIN_SPEEDUP` × the fp32 speed. The torch "capability" string alone cannot decide:
   an AVX-512 CPU with avx512_bf16 and one without both report ``AVX512``.
4. MPS and other devices: float32 (not probed).

Why a margin of 1.5× on the matmul: a whole forward gains less than its matmuls (the CPU
flash-attention kernel gains less from bf16). Measured on an AMD EPYC with avx512_bf16 (torch
capability AVX512, one thread): matmul 2.4× → SmolLM2 502-token forward 1.7× (1.44 s → 0.85 s);
on an Intel CPU with AMX: matmul 2.9× → lag-probe trial 2.5×.

The decision is cached per process (per device, shape and thread count): every load of a run pays
for the probe once. :func:`resolve_dtype` returns a :class:`DtypeChoice`, whose ``record()`` goes
into the model identity (``identity["dtype_choice"]``) and from there into ``results.json``.
"""

from __future__ import annotations

import functools
import platform
import time
from dataclasses import dataclass, field

import torch

from ..errors import InductionLabError

NAMES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
         "float16": torch.float16, "fp16": torch.float16}
MIN_SPEEDUP = 1.5            # bf16 matmul / fp32 matmul speed needed to choose bf16 (decision; see above)
PROBE_BUDGET_S = 0.2         # wall-time budget of the CPU micro-benchmark
DEFAULT_SHAPE = (576, 1536)  # hidden, intermediate of SmolLM2-135M: the probe's shape when the model's is unknown


@dataclass(frozen=True)
class DtypeChoice:
    """What ``dtype`` a model is loaded in and why.

    ``requested``: what was asked (``"auto"`` or a dtype name); ``dtype``: the resolved name;
    ``reason``: one line; ``facts``: what the decision read (``cpu``: flags, capability, model
    name; ``cuda``: device name, compute capability); ``probe``: the micro-benchmark, if it ran
    (shape ``[m, k, n]``, GFLOP/s in fp32 and bf16, speedup, seconds, threads)."""
    requested: str
    dtype: str
    reason: str
    facts: dict = field(default_factory=dict)
    probe: dict | None = None

    @property
    def torch_dtype(self) -> torch.dtype:
        return NAMES[self.dtype]

    def record(self) -> dict:
        """The JSON-able record: ``{"requested", "dtype", "reason", "cpu" | "cuda", "probe"}``."""
        out = {"requested": self.requested, "dtype": self.dtype, "reason": self.reason, **self.facts}
        if self.probe is not None:
            out["probe"] = self.probe
        return out

    def line(self) -> str:
        """``dtype bfloat16 (auto: ...reason...)``: the first line a command prints (:func:`choice_line`)."""
        return choice_line(self.record())


def choice_line(record: dict | None) -> str | None:
    """One line from a :meth:`DtypeChoice.record` (``identity["dtype_choice"]``), e.g.
    ``dtype bfloat16 (auto: cpu avx512_bf16: bf16 matmul 2.4x fp32 (probe 0.15 s))``; None for None."""
    if not record:
        return None
    how = "auto: " if record.get("requested") == "auto" else ""
    return f"dtype {record.get('dtype')} ({how}{record.get('reason')})"


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def resolve_dtype(requested: str | torch.dtype, device: str | torch.device = "cpu",
                  shape: tuple[int, int] | None = None) -> DtypeChoice:
    """Resolve ``requested`` (``"auto"`` or a dtype) for ``device``.

    Args:
        requested: ``"auto"`` | ``float32`` | ``bfloat16`` | ``float16`` (or ``fp32``, ``bf16``,
            ``fp16``) | a ``torch.dtype``.
        device: where the model runs (``cpu``, ``cuda``, ``cuda:N``, ``mps``).
        shape: ``(hidden, intermediate)`` of the model's MLP, the CPU probe's matmul
            (:func:`mlp_shape`); None: SmolLM2-135M's.

    Returns: a :class:`DtypeChoice` (cached per process for ``auto``).

    Raises:
        InductionLabError: an unknown dtype name.
        TypeError: ``requested`` neither a string nor a ``torch.dtype``."""
    if isinstance(requested, torch.dtype):
        return DtypeChoice(_name(requested), _name(requested), "requested explicitly")
    if not isinstance(requested, str):
        raise TypeError(f"dtype must be a string or a torch.dtype, not {type(requested).__name__}")
    if requested != "auto":
        if requested not in NAMES:
            raise InductionLabError(f"unknown dtype {requested!r}; use one of auto, float32, bfloat16, float16")
        return DtypeChoice(requested, _name(NAMES[requested]), "requested explicitly")
    d = torch.device(device)
    if d.type == "cuda":
        return _cuda_choice(d.index)
    if d.type != "cpu":
        return DtypeChoice("auto", "float32", f"{d.type}: bf16 speed not probed there")
    k, n = shape or DEFAULT_SHAPE
    return _cpu_choice(int(k), int(n), torch.get_num_threads())


def mlp_shape(config) -> tuple[int, int] | None:
    """``(hidden, intermediate)`` of a transformers config (its text config), or None if it says
    nothing usable (absent, not a positive integer: the model load then refuses the config itself)."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    h = getattr(cfg, "hidden_size", None) or getattr(cfg, "n_embd", None)
    if not isinstance(h, int) or isinstance(h, bool) or h < 1:
        return None
    i = getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None) or 4 * h
    if not isinstance(i, int) or isinstance(i, bool) or i < 1:
        i = 4 * h
    return h, i


def _cuda_choice(index: int | None) -> DtypeChoice:
    idx = torch.cuda.current_device() if index is None else index
    name, cap = torch.cuda.get_device_name(idx), tuple(torch.cuda.get_device_capability(idx))
    facts = {"cuda": {"name": name, "capability": list(cap)}}
    native = bool(torch.cuda.is_bf16_supported()) if torch.version.hip else cap >= (8, 0)
    if native:
        return DtypeChoice("auto", "bfloat16", f"cuda {name} (compute capability {cap[0]}.{cap[1]}): native bf16",
                           facts)
    return DtypeChoice("auto", "float32", f"cuda {name} (compute capability {cap[0]}.{cap[1]}): no native bf16 "
                       "(needs 8.0+)", facts)


def cpu_flags() -> dict:
    """What the CPU says about bf16: ``{"amx": bool | None, "avx512_bf16": bool | None, "capability",
    "model", "machine"}``. The flags come from torch's cpuinfo (``torch.cpu._is_*_supported``), else
    from ``/proc/cpuinfo``; None where neither says."""
    flags: dict = {"amx": None, "avx512_bf16": None}
    tc = getattr(torch, "cpu", None)
    for key, fn in (("amx", "_is_amx_tile_supported"), ("avx512_bf16", "_is_avx512_bf16_supported")):
        try:
            flags[key] = bool(getattr(tc, fn)())
        except Exception:  # noqa: BLE001 - private torch helper: absent or failing on some builds
            pass
    model = platform.processor() or None
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
    except OSError:
        info = ""
    words = set()
    for line in info.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            words |= set(value.split())
        elif key.strip() == "model name" and value.strip():
            model = value.strip()
    if words:
        if flags["amx"] is None:
            flags["amx"] = "amx_tile" in words
        if flags["avx512_bf16"] is None:
            flags["avx512_bf16"] = "avx512_bf16" in words
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except Exception:  # noqa: BLE001
        capability = None
    return {**flags, "capability": capability, "model": model, "machine": platform.machine()}


def _probe_dims(k: int, n: int, max_gflop: float = 0.5) -> tuple[int, int, int]:
    """``(m, k, n)`` of the probe's matmul: 256 tokens of the model's shape, fewer tokens (≥ 64),
    then narrower k and n (in proportion) for a large model, so that one fp32 matmul is at most
    ``max_gflop`` (≈ 5 ms at 90 GFLOP/s; SmolLM2: [256 × 576]·[576 × 1536], 0.45 GFLOP)."""
    m = 256
    while m > 64 and 2 * m * k * n > max_gflop * 1e9:
        m //= 2
    scale = min(1.0, (max_gflop * 1e9 / (2 * m * k * n)) ** 0.5)
    return m, max(16, int(k * scale)), max(16, int(n * scale))


def bf16_matmul_speedup(k: int, n: int, budget_s: float = PROBE_BUDGET_S) -> dict:
    """Time one ``F.linear`` ``[m × k]·[k × n]`` in bf16 and in fp32 (:func:`_probe_dims`),
    interleaved, the minimum of up to 20 repeats each (the minimum: other jobs on the cores only
    ever slow a repeat down), within ``budget_s`` of wall time (a warm-up of each first; at least 3
    repeats).

    Returns: ``{"shape": [m, k, n], "fp32_gflops", "bf16_gflops", "speedup", "seconds", "threads"}``
    (speedup = bf16 GFLOP/s ÷ fp32 GFLOP/s)."""
    import torch.nn.functional as F

    m, k, n = _probe_dims(k, n)
    t_start = time.perf_counter()
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen) / k ** 0.5
    pairs = {"fp32": (x, w), "bf16": (x.bfloat16(), w.bfloat16())}
    best = {}
    with torch.inference_mode():
        for key, (a, b) in pairs.items():               # warm-up (kernel selection, page faults)
            F.linear(a, b)
        for rep in range(20):
            for key, (a, b) in pairs.items():
                t = time.perf_counter()
                F.linear(a, b)
                best[key] = min(best.get(key, float("inf")), time.perf_counter() - t)
            if rep >= 2 and time.perf_counter() - t_start > 0.75 * budget_s:
                break
    flop = 2.0 * m * k * n
    g32, g16 = flop / best["fp32"] / 1e9, flop / best["bf16"] / 1e9
    return {"shape": [m, k, n], "fp32_gflops": round(g32, 1), "bf16_gflops": round(g16, 1),
            "speedup": round(g16 / g32, 2), "seconds": round(time.perf_counter() - t_start, 3),
            "threads": torch.get_num_threads()}


@functools.lru_cache(maxsize=None)
def _cpu_choice(k: int, n: int, threads: int) -> DtypeChoice:
    flags = cpu_flags()
    facts = {"cpu": flags}
    has = [f for f in ("amx", "avx512_bf16") if flags[f]]
    x86 = flags["machine"].lower() in ("x86_64", "amd64", "i386", "i686")
    cap = flags["capability"]
    if x86 and not has and flags["amx"] is not None and flags["avx512_bf16"] is not None:
        return DtypeChoice("auto", "float32", f"cpu without AMX or avx512_bf16 (torch capability {cap}): "
                           "bf16 matmuls are emulated there", facts)
    probe = bf16_matmul_speedup(k, n)
    what = f"cpu {'+'.join(has)}" if has else f"cpu (capability {cap}, no bf16 flags known)"
    ratio = f"bf16 matmul {probe['speedup']:.1f}x fp32 (probe {probe['seconds']:.2f} s)"
    if probe["speedup"] >= MIN_SPEEDUP:
        return DtypeChoice("auto", "bfloat16", f"{what}: {ratio}", facts, probe)
    return DtypeChoice("auto", "float32", f"{what}: {ratio}, below the {MIN_SPEEDUP}x needed for bf16",
                       facts, probe)
