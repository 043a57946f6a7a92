"""Several processes, one place: the process group under PyTorch's own launcher (``torchrun``),
and the few collectives the analysis and the trainer share.

Launch with ``torchrun --nproc-per-node N -m inductionlab.cli <command> ...``: :func:`init` reads
the ``RANK`` / ``LOCAL_RANK`` / ``WORLD_SIZE`` variables torchrun sets and joins the process group
(NCCL on CUDA, gloo on CPU). Without them (or with ``WORLD_SIZE=1``) it returns a one-process
:class:`Dist` and every helper here is a no-op, so the single-process path stays plain PyTorch.

Analysis shards by **batch**: batch ``b`` (trials ``[b·bs, (b+1)·bs)``, the same slice as in one
process) runs on rank ``b % world_size`` (:func:`local_batches`); :func:`gather_batches` puts the
per-batch outputs back in batch order on every rank. Every batch holds the same trials as in one
process and sums are taken in the same order, so the numbers are those of one process (bit for
bit on CPU at the same thread count; on GPUs with the same kernels).

Sharding is always asked for explicitly (a ``dist`` argument): the trainer's telemetry scores heads
on rank 0 alone while the process group is up, and must not enter a collective.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from ..errors import InductionLabError, os_error

ANALYSIS_TIMEOUT_S = 3600   # analysis: a collective waiting longer fails (covers slow, uneven model loads)


@dataclass(frozen=True)
class Dist:
    """This process's place in the group (world size 1: no group)."""
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def record(self) -> dict:
        """The run record's entry: world size, backend, and how trials were split."""
        rec = {"world_size": self.world_size, "backend": self.backend}
        if self.distributed:
            rec["sharding"] = ("batch b on rank b % world_size, gathered in batch order: every batch holds the "
                               "same trials as in one process, so results do not depend on world_size")
        return rec


def world_size_env() -> int:
    """``WORLD_SIZE`` as torchrun sets it (1 when not launched by torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def init(device: str | torch.device | None = None, timeout_s: float | None = None) -> Dist:
    """Join the process group when launched by torchrun with ``WORLD_SIZE`` > 1; pick the device.

    Args:
        device: ``"cpu"``, ``"cuda"`` (rank r uses ``cuda:LOCAL_RANK``), or None: CUDA when
            available (the trainer's rule).
        timeout_s: seconds a collective may wait for the other ranks before it fails (None:
            torch's default). A rank that exits is noticed sooner: torchrun then stops the others.

    Returns: :class:`Dist` (its ``device`` is where this rank's model goes).
    """
    world = world_size_env()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available() if device is None else torch.device(device).type == "cuda"
    dev = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    if world <= 1:
        return Dist(device=dev)
    backend = "nccl" if cuda else "gloo"
    if not dist.is_initialized():
        timeout = None if timeout_s is None else datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(backend=backend, device_id=dev if cuda else None, timeout=timeout)
    return Dist(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local, device=dev,
                backend=backend)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier(d: Dist | None) -> None:
    if d is not None and d.distributed:
        dist.barrier()


def broadcast(obj: Any, d: Dist | None) -> Any:
    """Rank 0's ``obj`` on every rank (picklable objects; a no-op on one process)."""
    if d is None or not d.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def on_main(fn: Callable[[], Any], d: Dist | None) -> Any:
    """Run ``fn`` on rank 0 only and return its result on every rank. An
    :class:`InductionLabError` (or ``OSError``, as :func:`~inductionlab.errors.os_error`) it raises is
    raised on every rank (the same one-line message), so a
    refused run ends every process the same way instead of leaving the others waiting."""
    if d is None or not d.distributed:
        return fn()
    result, error = None, None
    if d.is_main:
        try:
            result = fn()
        except InductionLabError as e:
            error = str(e)
        except OSError as e:             # a full disk, a link loop, ...: the same one line on every rank
            error = str(os_error(e))
    result, error = broadcast((result, error), d)
    if error is not None:
        raise InductionLabError(error)
    return result


def min_across(value: int, d: Dist | None) -> int:
    """The smallest ``value`` over the ranks (e.g. a batch size picked from each GPU's free memory)."""
    if d is None or not d.distributed:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=d.device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def mean_across(value: float, d: Dist | None) -> float:
    if d is None or not d.distributed:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=d.device)
    dist.all_reduce(t)
    return float(t.item()) / d.world_size


def local_batches(n: int, batch_size: int, d: Dist | None) -> range:
    """Start indices of this rank's batches of ``n`` items in batches of ``batch_size``: batch
    ``b`` (start ``b·batch_size``) belongs to rank ``b % world_size``; all of them on one process."""
    world, rank = (d.world_size, d.rank) if d is not None else (1, 0)
    return range(rank * batch_size, n, world * batch_size)


def round_size(start: int, n: int, batch_size: int, d: Dist | None) -> int:
    """Items in the round of batches that the batch at ``start`` belongs to (``world_size``
    consecutive batches): rank 0 reports these as done, so its progress bar counts every rank's."""
    world = d.world_size if d is not None else 1
    return min(n, start + world * batch_size) - start


def gather_batches(local: Sequence[Any], n_batches: int, d: Dist | None) -> list[Any]:
    """Every rank's per-batch outputs (``local``: this rank's, in its batch order, as from
    :func:`local_batches`) as one list in batch order, on every rank. Outputs are pickled
    (tensors travel with their exact bits); move them to the CPU first."""
    if d is None or not d.distributed:
        return list(local)
    parts: list = [None] * d.world_size
    dist.all_gather_object(parts, list(local))
    out = [parts[b % d.world_size][b // d.world_size] for b in range(n_batches)]
    return out
