"""Where a causal LM keeps the parts that head-level analyses read: each layer's attention module, its output
projection (``o_proj``: its input is the query heads' outputs side by side, the slices activation patching and
attribution address), the decoder block around it, the MLP, the final norm and the unembedding.

Looked up by attribute name over the architectures the package supports (Llama, Qwen2, Gemma 3, GPT-2,
GPT-NeoX; :data:`inductionlab.core.reuse.SUPPORTED`); a model without the part raises one
:class:`~inductionlab.errors.InductionLabError` naming it. Read by the FV protocol (the function vector:
a head's write through its output projection), the dual-route scores and :mod:`inductionlab.core.attribution`
(direct logit attribution).
"""

from __future__ import annotations

import torch

from ..errors import InductionLabError
from .attention import attention_modules
from .instrument import unwrap_model

#: Output projections of attention modules, by attribute name (Llama/Qwen2/Gemma: o_proj; GPT-NeoX:
#: dense; GPT-2: c_proj; OPT/BART-style: out_proj).
OUTPUT_PROJECTIONS = ("o_proj", "dense", "c_proj", "out_proj")
#: Final norms of the base model (Llama/Qwen2/Gemma: norm; GPT-2: ln_f; GPT-NeoX: final_layer_norm).
FINAL_NORMS = ("norm", "ln_f", "final_layer_norm")
#: MLPs of a decoder block (every supported architecture: mlp).
MLPS = ("mlp", "feed_forward")


def attention_module(model, layer: int) -> torch.nn.Module:
    """The attention module of ``layer``, as the instrumentation finds it
    (:func:`~inductionlab.core.attention.attention_modules`).

    Raises: InductionLabError when the model has none with that index."""
    model = unwrap_model(model)
    m = attention_modules(model).get(layer)
    if m is not None:
        return m
    raise InductionLabError(f"{type(model).__name__}: no attention module with layer_idx {layer}")


def output_projection(model, layer: int) -> torch.nn.Module:
    """The output projection of ``layer``'s attention (its input: the query heads' outputs side by side,
    ``[..., n_heads · head_dim]``).

    Raises: InductionLabError when the attention module has none of :data:`OUTPUT_PROJECTIONS`."""
    attn = attention_module(model, layer)
    for name in OUTPUT_PROJECTIONS:
        if isinstance(getattr(attn, name, None), torch.nn.Module):
            return getattr(attn, name)
    raise InductionLabError(f"{type(attn).__name__}: no output projection named one of {', '.join(OUTPUT_PROJECTIONS)}")


def decoder_layer(model, layer: int) -> torch.nn.Module:
    """The decoder block holding ``layer``'s attention (its output: the residual stream after ``layer``): the
    entry of the layer list on the attention module's path (``model.layers.3`` of ``model.layers.3.self_attn``;
    GPT-Neo's ``transformer.h.3`` of ``transformer.h.3.attn.attention``)."""
    model = unwrap_model(model)
    attn = attention_module(model, layer)
    names = {id(m): n for n, m in model.named_modules()}
    parts = names[id(attn)].split(".")
    last = max((i for i, p in enumerate(parts) if p.isdigit()), default=len(parts) - 2)
    return model.get_submodule(".".join(parts[:last + 1]))     # the block: the entry of the layer list


def mlp_module(model, layer: int) -> torch.nn.Module:
    """The MLP of decoder block ``layer``. Raises: InductionLabError when the block has none of :data:`MLPS`."""
    block = decoder_layer(model, layer)
    for name in MLPS:
        if isinstance(getattr(block, name, None), torch.nn.Module):
            return getattr(block, name)
    raise InductionLabError(f"{type(block).__name__}: no MLP named one of {', '.join(MLPS)}")


def post_attention_norm(model, layer: int) -> torch.nn.Module | None:
    """The norm applied to ``layer``'s attention output before it joins the residual stream (Gemma 2/3's
    ``post_attention_layernorm``, told apart from Llama's pre-MLP norm of that name by the block also having a
    ``pre_feedforward_layernorm``), or None where the attention output is added as it is."""
    block = decoder_layer(model, layer)
    if isinstance(getattr(block, "pre_feedforward_layernorm", None), torch.nn.Module):
        return block.post_attention_layernorm
    return None


def final_norm(model) -> torch.nn.Module:
    """The norm between the last decoder block and the unembedding.

    Raises: InductionLabError when the base model has none of :data:`FINAL_NORMS`."""
    base = unwrap_model(model).base_model
    for name in FINAL_NORMS:
        if isinstance(getattr(base, name, None), torch.nn.Module):
            return getattr(base, name)
    raise InductionLabError(f"{type(base).__name__}: no final norm named one of {', '.join(FINAL_NORMS)}")


def unembedding(model) -> torch.nn.Module:
    """The output embedding (LM head): ``weight`` ``[vocab, hidden]``, perhaps a ``bias``.

    Raises: InductionLabError for a model without one."""
    head = unwrap_model(model).get_output_embeddings()
    if head is None or getattr(head, "weight", None) is None:
        raise InductionLabError(f"{type(unwrap_model(model)).__name__} has no output embedding (LM head)")
    return head


__all__ = ["OUTPUT_PROJECTIONS", "FINAL_NORMS", "MLPS", "attention_module", "output_projection", "decoder_layer",
           "mlp_module", "post_attention_norm", "final_norm", "unembedding"]
