"""Everything distributed about training in one place (torchtitan's ``distributed/``), so the
single-process path stays plain PyTorch. The process group itself (:class:`Dist`, :func:`init`,
:func:`barrier`, :func:`mean_across`) is :mod:`inductionlab.runtime.distributed`, shared with the analysis.

Launch with PyTorch's own launcher: ``torchrun --nproc_per_node=N -m inductionlab.cli train ...``
(multi-node: add ``--nnodes``, ``--node_rank``, ``--rdzv_endpoint``). :func:`init` reads the
``RANK`` / ``LOCAL_RANK`` / ``WORLD_SIZE`` variables torchrun sets and joins the process group
(NCCL on CUDA, gloo on CPU). Two modes:

* ``ddp``: :class:`torch.nn.parallel.DistributedDataParallel`, gradients all-reduced (mean);
* ``fsdp``: FSDP2 :func:`torch.distributed.fsdp.fully_shard` on each decoder layer and then on the
  root (the pattern of ``torchtitan/distributed/fsdp.py``), with a bf16-parameter / fp32-reduce
  :class:`MixedPrecisionPolicy` when training in bf16.

Only rank 0 writes files; state dicts are gathered to full, CPU-resident tensors for saving.
"""

from __future__ import annotations

import contextlib

import torch

from ..runtime.distributed import Dist, barrier, init as _init, mean_across, shutdown  # noqa: F401 (shared with analysis)


def init() -> Dist:
    """Join the process group when launched by torchrun with WORLD_SIZE > 1; the device is CUDA
    (``cuda:LOCAL_RANK``) when available, else the CPU (:func:`inductionlab.runtime.distributed.init`)."""
    return _init()


def wrap(model: torch.nn.Module, mode: str, d: Dist, bf16: bool) -> torch.nn.Module:
    """Wrap ``model`` for data parallelism (no-op on one process). Returns the module to train."""
    if not d.distributed:
        return model
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        return DDP(model, device_ids=[d.local_rank] if d.device.type == "cuda" else None)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    layers = list(model.model.layers)
    for i, layer in enumerate(layers):
        # the last block is gathered right away for backward anyway, so keep it unsharded after forward
        fully_shard(layer, mp_policy=mp, reshard_after_forward=i < len(layers) - 1)
    fully_shard(model, mp_policy=mp)
    return model


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if hasattr(model, "module") and not hasattr(model, "config") else model


@contextlib.contextmanager
def gradient_sync(model: torch.nn.Module, mode: str, d: Dist, sync: bool):
    """Skip the gradient all-reduce on accumulation micro-steps (``sync=False``)."""
    if not d.distributed or sync:
        if d.distributed and mode == "fsdp":
            model.set_requires_gradient_sync(True)
        yield
    elif mode == "ddp":
        with model.no_sync():
            yield
    else:
        model.set_requires_gradient_sync(False)
        yield


def clip_grad_norm(model: torch.nn.Module, max_norm: float) -> float:
    """Clip the global gradient L2 norm; return the norm before clipping (works on DTensor grads)."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return float(norm)


def full_model_state(model: torch.nn.Module, mode: str, d: Dist) -> dict | None:
    """Unsharded CPU state dict of the model (on rank 0; None elsewhere). Collective under FSDP."""
    if d.distributed and mode == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return sd if d.is_main else None
    return {k: v.detach().cpu() for k, v in unwrap(model).state_dict().items()} if d.is_main else None


def optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, mode: str, d: Dist) -> dict | None:
    """Full optimizer state (rank 0; None elsewhere). Collective under FSDP."""
    if d.distributed and mode == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
        sd = get_optimizer_state_dict(model, optimizer,
                                      options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return sd if d.is_main else None
    return optimizer.state_dict() if d.is_main else None


def load_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict, mode: str,
                         d: Dist) -> None:
    """Load a full optimizer state saved by :func:`optimizer_state` (every rank passes it)."""
    if d.distributed and mode == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
        set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))
    else:
        optimizer.load_state_dict(state)
