"""The options that are not a config's: the model (``--model``, ``--dtype``, ``--device``), the accelerator
(``--device-map``, ``--threads``), the run directory (``--out``, ``--overwrite``), ``--quiet``; and what
every model command does before its study (:func:`start_run`, :func:`join_processes`). A config's options
are generated from the config (:mod:`inductionlab.cli.generate`).

Every numeric option of every command has the type :data:`INT` or :data:`FLOAT` (or a config leaf's type:
NaN, infinities and integers beyond 64 bits refused while parsing, naming the option); ranges are checked
in one place, the configs' ``validate()``, which the Python API calls too (so a bad value gives the same
one-line error from both); options that contradict each other are refused (:func:`refuse_conflicts`),
never one silently ignored.
"""

from __future__ import annotations

from typing import Callable

import click

from ..errors import InductionLabError
from ..names import DEFAULT_MODEL, ablation_method_names as _ablation_methods  # no torch: --help stays fast


def _stack(*decorators: Callable) -> Callable:
    def apply(f):
        for d in reversed(decorators):
            f = d(f)
        return f
    return apply


class _Number(click.ParamType):
    """An ``int`` or ``float`` option that refuses what no command can use, with one ``error:``
    line naming the option: NaN and infinities, integers beyond 64 bits, values below ``lo``
    (options without a config to check them). Ranges proper are the configs' ``validate()``."""

    def __init__(self, kind: type, lo=None):
        self.kind, self.lo = kind, lo
        self.name = "integer" if kind is int else "float"

    def convert(self, value, param, ctx):
        from ..checks import check_float, check_int

        if isinstance(value, self.kind) and not isinstance(value, bool):
            v = value
        else:
            try:
                v = self.kind(str(value).strip()) if self.kind is int else float(value)
            except ValueError:
                self.fail(f"{value!r} is not a valid {self.name}", param, ctx)
        name = param.opts[0] if param is not None and param.opts else "value"
        return (check_int if self.kind is int else check_float)(v, name, lo=self.lo)


INT, FLOAT = _Number(int), _Number(float)   # type=INT / type=FLOAT in every command's numeric options


model_options = _stack(
    click.option("--model", "-m", "model", default=DEFAULT_MODEL, show_default=True,
                 help="smollm2-135m, gemma3-270m, a local model directory, a .gguf file or a cached hub id."),
    click.option("--dtype", default="auto", show_default=True,
                 type=click.Choice(["auto", "bfloat16", "float32", "float16"]),
                 help="auto: bfloat16 where the device runs it fast (CUDA with bf16; a CPU with AMX or "
                      "avx512_bf16, confirmed by a 0.2 s matmul probe), else float32 (docs/analyze.md: dtype)."),
    click.option("--device", default="cpu", show_default=True, help="cpu | cuda | cuda:N"),
)

accelerator_options = _stack(
    click.option("--device-map", default=None, help='e.g. "auto" to spread a model over several GPUs'),
    click.option("--threads", type=INT, default=None, help="torch CPU threads [default: torch's]"),
)

quiet_option = click.option("--quiet", "--no-progress", "quiet", is_flag=True, help="No progress bars.")


def given(name: str) -> bool:
    """Whether the option ``name`` (its parameter name) was given on the command line or through
    the environment, not left at its default (False outside a click command)."""
    from click.core import ParameterSource

    ctx = click.get_current_context(silent=True)
    return ctx is not None and ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE,
                                                                  ParameterSource.ENVIRONMENT)


def refuse_conflicts(*pairs: tuple[str, str, bool]) -> None:
    """Options that contradict each other are refused, never one silently ignored: each
    ``(flag, other flag, both given)``.

    Raises:
        InductionLabError: the first pair given together, naming both."""
    for a, b, both in pairs:
        if both:
            raise InductionLabError(f"{a} and {b} conflict: {b} decides alone, so {a} would be ignored; "
                                    f"drop one of them")


def start_run(kw: dict, out, overwrite: bool, quiet: bool, inputs=()) -> tuple:
    """What every model command does before its study: check ``--out`` (cheap, before the model
    loads; ``inputs`` must not lie inside it), silence progress bars under ``--quiet`` (also the
    GGUF de-quantisation bar, which ignores transformers' logging switch), then load the model.
    (The dtype it runs in and why is printed by the study once its checks pass: ``log=click.echo``.)

    Returns: ``(loaded, load_s)``, the model bundle and its load time in seconds.

    Raises:
        InductionLabError: ``--device`` beside ``--device-map``; as
            :meth:`~inductionlab.runtime.runs.ResumableRun.check_out` and :func:`load_from_options`."""
    import os
    import time

    from ..runtime.runs import ResumableRun

    refuse_conflicts(("--device", "--device-map", bool(kw.get("device_map")) and given("device")))
    ResumableRun.check_out(out, overwrite, inputs=[kw["model"], *inputs])
    if quiet:
        os.environ["TQDM_DISABLE"] = "1"
    t0 = time.perf_counter()
    loaded = load_from_options(kw)
    return loaded, time.perf_counter() - t0


def join_processes(kw: dict, out):
    """Under ``torchrun`` (``WORLD_SIZE`` > 1): join the process group (gloo for ``--device cpu``,
    NCCL for ``--device cuda``, rank r on ``cuda:LOCAL_RANK``), silence the other ranks' bars, and
    agree on rank 0's ``out`` (a default run directory is named by the clock). One process: nothing
    happens. Call after the config's ``validate()`` and before :func:`start_run`.

    Returns: ``(dist, out)``: the :class:`~inductionlab.runtime.distributed.Dist` and the run directory.

    Raises:
        InductionLabError: ``--device-map`` or ``--device cuda:N`` under torchrun (each rank takes
            one GPU; a model larger than one GPU runs as one process with ``--device-map auto``)."""
    import os
    from pathlib import Path

    from ..runtime import distributed as D

    if D.world_size_env() <= 1:
        return D.Dist(), out
    if kw.get("device_map"):
        raise InductionLabError(f"--device-map with torchrun: each of the {D.world_size_env()} processes would spread "
                                "the model over every GPU; run one process with --device-map auto, or torchrun "
                                "with --device cuda (one GPU per process)")
    device = str(kw["device"])
    if device.startswith("cuda:"):
        raise InductionLabError(f"--device {device} with torchrun: use --device cuda (process r takes cuda:LOCAL_RANK)")
    from ..core.models import check_device

    check_device(device)
    if device == "cuda":
        import torch

        n_gpu, local = torch.cuda.device_count(), int(os.environ.get("LOCAL_RANK", "0"))
        if local >= n_gpu:
            raise InductionLabError(f"--device cuda with torchrun: process {local} on this node has no GPU of its own "
                                    f"(torch sees {n_gpu}); use --nproc-per-node {n_gpu} or fewer")
    dist = D.init(device, timeout_s=D.ANALYSIS_TIMEOUT_S)
    if dist.device.type == "cuda":
        kw["device"] = str(dist.device)
    if not dist.is_main:
        os.environ["TQDM_DISABLE"] = "1"
    return dist, Path(D.broadcast(str(out), dist))


def load_from_options(kw: dict):
    """Load the model named by :data:`model_options` and :data:`accelerator_options` (pops their keys).

    Raises:
        InductionLabError: a bad ``--device`` (``cuda`` without a CUDA device, ...;
            :func:`~inductionlab.core.models.check_device`, before any loading), ``--threads`` below 1,
            unknown or corrupt model."""
    import os

    import torch

    from ..core.models import check_device, check_device_map
    from ..core.support import load_model

    model, dtype, device = kw.pop("model"), kw.pop("dtype"), kw.pop("device")
    device_map, threads = kw.pop("device_map", None), kw.pop("threads", None)
    if threads is not None and not 1 <= threads <= (os.cpu_count() or 1):
        raise InductionLabError(f"--threads {threads}: use 1 to {os.cpu_count() or 1} (this machine's CPUs)")
    if threads:
        torch.set_num_threads(threads)
    if not device_map:
        check_device(device)
    else:
        check_device_map(device_map)
    return load_model(model, dtype=dtype, device=device, device_map=device_map)


def run_dir_options(kind: str, *, required: bool = False) -> Callable:
    """``--out/-o DIR`` and ``--overwrite``; ``kind`` names the default run directory (``runs/<kind>-<time>``,
    or the whole pattern when it holds a ``/``).

    ``--overwrite`` means the same in every command: delete what ``--out`` holds and start
    afresh. Without it a one-shot command refuses a non-empty ``--out`` and a resumable run
    resumes the run it holds."""
    default_help = "" if required else f" [default: {kind if '/' in kind else f'runs/{kind}-<time>'}]"
    return _stack(
        click.option("--out", "-o", "out", required=required, default=None,
                     type=click.Path(file_okay=False), help=f"Run directory.{default_help}"),
        click.option("--overwrite", is_flag=True,
                     help="Delete an existing --out and start afresh (without it: refuse, or resume the same run)."),
    )
