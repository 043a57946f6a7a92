"""A model's size from its config, checked against the memory available before transformers builds it.

transformers allocates every weight of a model as it builds it, layer by layer; a ``config.json``
that asks for ten million layers or a hidden size of a million would run until the machine runs out
of memory or the user kills it. :func:`check_model_fits` refuses such a model with one line first.

The estimate is a *lower bound* on the weights (so a real model is never refused wrongly): per layer
the attention projections (q and o: ``hidden x heads x head_dim`` each; k and v: ``hidden x kv_heads x
head_dim`` each) and two MLP matrices (``hidden x intermediate``; a gated MLP has three), plus the
token embeddings and, untied, the LM head (``vocab x hidden`` each). Norms and biases are left out.
Bytes = parameters x bytes per element of the dtype (``"auto"``: 2, the smallest it may pick).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from ..errors import InductionLabError

# More layers than any released causal LM has (the deepest have a few hundred); building a Python
# module per layer for more takes minutes before the first weight (decision).
MAX_LAYERS = 4096


def _int(config: Any, *names: str, default: int | None = None) -> int | None:
    for n in names:
        v = getattr(config, n, None)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return default


def estimate_params(config: Any) -> int | None:
    """A lower bound on the number of weights of the model ``config`` describes; None when the
    config does not say its hidden size and layer count."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    h = _int(text, "hidden_size", "n_embd", "d_model")
    n_layers = _int(text, "num_hidden_layers", "n_layer", "num_layers")
    if h is None or n_layers is None or h <= 0 or n_layers <= 0:
        return None
    heads = max(1, _int(text, "num_attention_heads", "n_head", default=1))
    head_dim = _int(text, "head_dim", default=None) or max(1, h // heads)
    kv = max(1, _int(text, "num_key_value_heads", default=heads))
    inter = max(0, _int(text, "intermediate_size", "n_inner", "ffn_dim", default=0) or 0)
    vocab = max(0, _int(text, "vocab_size", default=0))
    tied = bool(getattr(config, "tie_word_embeddings", True))
    per_layer = 2 * h * heads * head_dim + 2 * h * kv * head_dim + 2 * h * inter
    return n_layers * per_layer + vocab * h * (1 if tied else 2)


def available_memory(device_map: str | None = None) -> int | None:
    """Bytes the weights may take: the memory available now (a model is built in host memory, then
    moved); with a ``device_map``, also the free memory of every GPU and the free disk space of the
    temporary folder (offloaded weights). None where the platform does not say."""
    try:
        import psutil

        free = int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 - psutil missing or refused by the platform
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    if device_map:
        import torch

        if torch.cuda.is_available():
            free += sum(torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count()))
        free += shutil.disk_usage(tempfile.gettempdir()).free
    return free


def check_model_fits(config: Any, dtype: Any, device_map: str | None = None, where: Any = "the model") -> None:
    """Refuse, with one line, a model whose config asks for more layers than :data:`MAX_LAYERS` or
    whose weights (:func:`estimate_params` x bytes per element of ``dtype``) exceed
    :func:`available_memory` — before anything of it is allocated.

    Args:
        dtype: a ``torch.dtype``, a dtype name, or ``"auto"`` (counted at 2 bytes, the least it picks).
        where: names the config in the message (the model folder)."""
    import torch

    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    n_layers = _int(text, "num_hidden_layers", "n_layer", "num_layers")
    if n_layers is not None and n_layers > MAX_LAYERS:
        raise InductionLabError(f"the config of {where} asks for {n_layers:,} layers, more than the {MAX_LAYERS:,} "
                                "this tool builds; check its config.json (num_hidden_layers)")
    params = estimate_params(config)
    if not params:
        return
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None) if dtype != "auto" else torch.bfloat16
    size = dtype.itemsize if isinstance(dtype, torch.dtype) else 2
    need, free = params * size, available_memory(device_map)
    if free is not None and need > free:
        raise InductionLabError(f"the model of {where} has at least {params:,} weights: {need / 2 ** 30:,.1f} GiB in "
                                f"{str(dtype).removeprefix('torch.')}, more than the {free / 2 ** 30:,.1f} GiB of memory "
                                "available; check its config.json, or use a machine (or --device-map auto) with more")
