"""Option groups shared by the sub-commands, declared once: the same name, type, default and
meaning in every command that takes them, and the one place that turns them into configs.

Each group is a decorator that adds its options to a click command, e.g.::

    @click.command()
    @model_options
    @run_dir_options("analyze")
    @ablation_options(ks="5,10,20", n_draws=2)
    @lag_probe_options
    def analyze(**kw): cfg = AnalyzeConfig(lag=lag_probe_config(kw), ...)

Every numeric option of every command has the type :data:`INT` or :data:`FLOAT` (NaN, infinities
and integers beyond 64 bits refused while parsing, naming the option); ranges are checked in one
place, the configs' ``validate()``, which the Python API calls too (so a bad value gives the same
one-line error from both); options that contradict each other are refused
(:func:`refuse_conflicts`), never one silently ignored. Defaults a command must keep (``analyze``'s
k list) are parameters of the groups.
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


def _int_list(ctx, param, value):
    if value is None:
        return None
    try:
        out = [int(x) for x in str(value).split(",") if x.strip()]
    except ValueError:
        raise InductionLabError(f"--ks {value!r} is not a comma-separated list of integers, e.g. 10,20,50") from None
    return out   # ranges and repeats: the config's validate()


model_options = _stack(
    click.option("--model", "-m", "model", default=DEFAULT_MODEL, show_default=True,
                 help="smollm2-135m, gemma3-270m, a local model directory, a .gguf file or a cached hub id."),
    click.option("--dtype", default="auto", show_default=True,
                 type=click.Choice(["auto", "bfloat16", "float32", "float16"]),
                 help="auto: bfloat16 where the device runs it fast (CUDA with bf16; a CPU with AMX or "
                      "avx512_bf16, confirmed by a 0.2 s matmul probe), else float32 (README: dtype)."),
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

    from ..core.models import check_device, load_model

    model, dtype, device = kw.pop("model"), kw.pop("dtype"), kw.pop("device")
    device_map, threads = kw.pop("device_map", None), kw.pop("threads", None)
    if threads is not None and not 1 <= threads <= (os.cpu_count() or 1):
        raise InductionLabError(f"--threads {threads}: use 1 to {os.cpu_count() or 1} (this machine's CPUs)")
    if threads:
        torch.set_num_threads(threads)
    if not device_map:
        check_device(device)
    return load_model(model, dtype=dtype, device=device, device_map=device_map)


def run_dir_options(kind: str, *, required: bool = False) -> Callable:
    """``--out/-o DIR`` and ``--overwrite``.

    ``--overwrite`` means the same in every command: delete what ``--out`` holds and start
    afresh. Without it a one-shot command refuses a non-empty ``--out`` and a resumable run
    resumes the run it holds."""
    default_help = "" if required else f" [default: runs/{kind}-<time>]"
    return _stack(
        click.option("--out", "-o", "out", required=required, default=None,
                     type=click.Path(file_okay=False), help=f"Run directory.{default_help}"),
        click.option("--overwrite", is_flag=True,
                     help="Delete an existing --out and start afresh (without it: refuse, or resume the same run)."),
    )


def ablation_options(*, ks: str | None = None, n_draws: int = 3) -> Callable:
    """``--method``, ``--ks``, ``--n-draws``, ``--exclude-top-n`` and ``--seed``; ``ks`` and
    ``n_draws`` are the command's defaults (``ks=None``: scaled to the model's heads)."""
    ks_help = f"Numbers of heads to ablate, comma-separated [default: {ks}]." if ks else \
        "Numbers of heads to ablate, comma-separated [default: 10,20,50,100 clipped/scaled to the model's heads]."
    return _stack(
        click.option("--method", type=click.Choice(list(_ablation_methods())), default="zero", show_default=True,
                     help="Ablation method (zero: the paper's attention scores set to −∞)."),
        click.option("--ks", callback=_int_list, default=ks, help=ks_help),
        click.option("--n-draws", type=INT, default=n_draws, show_default=True,
                     help="Random-head draws per k."),
        click.option("--exclude-top-n", "--exclude-top", "exclude_top_n", type=INT, default=None,
                     help="Random heads come from outside the top N by induction score [default: min(300, heads/2)]."),
        click.option("--seed", type=INT, default=0, show_default=True, help="Seed of trials and random draws."),
    )


head_score_options = _stack(
    click.option("--score-seq-len", type=INT, default=50, show_default=True,
                 help="T, tokens per copy for head scores."),
    click.option("--score-batch-size", type=INT, default=16, show_default=True,
                 help="Sequences for head scores."),
)


lag_probe_options = _stack(
    click.option("--n-permutations", "--permutations", "n_permutations", type=INT, default=64,
                 show_default=True, help="Lag-probe trials per condition (seed protocol: 5000)."),
    click.option("--list-length", type=INT, default=500, show_default=True, help="Words per lag-probe list."),
    click.option("--cue-position", type=INT, default=250, show_default=True,
                 help="1-based list position of the repeated word (lag k = the word at cue + k)."),
    click.option("--separator", default=" ",
                 help='Between words: " " (default: each word is its own leading-space token), ", " or "\\n".'),
    click.option("--instruction", default="", help="Text after BOS, before the list."),
    click.option("--no-bos", is_flag=True, help="Do not prepend BOS."),
    click.option("--resample-words", is_flag=True, help="Draw a new word set per trial instead of permuting a fixed set."),
    click.option("--batch-size", type=INT, default=None,
                 help="Trials per forward pass [default: from free GPU memory; 8 on CPU]."),
    click.option("--far-lag", type=INT, default=20, show_default=True,
                 help="Word-prior-corrected curve: a word's baseline is its mean probability where it sits at |lag| > this."),
    click.option("--cues", default="all:10", show_default=True,
                 help="Cued list positions: all, seed (only --cue-position, one forward per cue) or A-B (1-based), "
                      "all:S / A-B:S for every S-th position; "
                      "the list runs once per trial and each cue appends its own tokens. The headline is the seed cue's."),
)


def lag_probe_config(kw: dict):
    """The :class:`~inductionlab.protocols.lag_probe.LagProbeConfig` of :data:`lag_probe_options` (pops its keys)."""
    from ..protocols.lag_probe import LagProbeConfig

    return LagProbeConfig(n_permutations=kw.pop("n_permutations"), list_length=kw.pop("list_length"),
                          cue_position=kw.pop("cue_position"), separator=kw.pop("separator").replace("\\n", "\n"),
                          instruction=kw.pop("instruction"), bos=not kw.pop("no_bos"),
                          resample_words=kw.pop("resample_words"), batch_size=kw["batch_size"],
                          far_lag=kw.pop("far_lag"), cues=kw.pop("cues"))


recall_options = _stack(
    click.option("--recall-trials", type=INT, default=64, show_default=True,
                 help="Serial-recall prompts per condition."),
    click.option("--recall-list-length", type=INT, default=14, show_default=True, help="Words per serial-recall list."),
    click.option("--shots", type=INT, default=3, show_default=True, help="Solved study/recall examples before the test list."),
    click.option("--no-generate", is_flag=True, help="Skip greedy generation (exact match, CRP of recalls)."),
)


def recall_config(kw: dict):
    """The :class:`~inductionlab.protocols.serial_recall.SerialRecallConfig` of :data:`recall_options` (pops its keys;
    shares ``--batch-size`` with the lag probe)."""
    from ..protocols.serial_recall import SerialRecallConfig

    return SerialRecallConfig(n_trials=kw.pop("recall_trials"), list_length=kw.pop("recall_list_length"),
                              n_shots=kw.pop("shots"), generate=not kw.pop("no_generate"), batch_size=kw["batch_size"])
