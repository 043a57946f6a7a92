"""A port of the authors' FV score, one full forward per (prompt, head), as the oracle of
:mod:`inductionlab.protocols.function_vectors` (tests and ``bench/fv_speed.py``).

Ported from ericwtodd/function_vectors (MIT): ``src/utils/extract_utils.py::get_mean_head_activations``
(the clean means: each prompt's ``o_proj`` input at the last token, reshaped to heads, averaged over
prompts) and ``src/compute_indirect_effect.py::activation_replacement_per_class_intervention`` (for each
layer and head, one forward of the corrupted prompt with that head's slice of the ``o_proj`` input at the
last token replaced by its mean; the probability of the answer's first token minus the unpatched one).
Their ``TraceDict`` editing is a plain forward pre-hook on the output projection here. It shares no code
with the package beyond locating the output projection.
"""

from __future__ import annotations

import torch

from inductionlab.core.models import attention_shape
from inductionlab.protocols.function_vectors import output_projection


def _o_proj_inputs(model, ids, L):
    """Each layer's o_proj input of one forward: [L, T, H*D]."""
    got = {}
    hooks = [output_projection(model, l).register_forward_pre_hook(
        lambda m, a, l=l: got.__setitem__(l, a[0][0].detach().clone())) for l in range(L)]
    try:
        with torch.no_grad():
            logits = model(input_ids=ids).logits[:, -1]
    finally:
        for h in hooks:
            h.remove()
    return torch.stack([got[l] for l in range(L)]), logits


def mean_head_activations(model, prompts):
    """get_mean_head_activations: [L, H, D] mean over prompts of the last token's per-head o_proj input."""
    s = attention_shape(model.config)
    L, H, D = s["n_layers"], s["n_heads"], s["head_dim"]
    dev = next(model.parameters()).device
    acts = []
    for p in prompts:
        x, _ = _o_proj_inputs(model, torch.tensor([p.input_ids], device=dev), L)
        acts.append(x[:, -1].reshape(L, H, D))
    return torch.stack(acts).mean(0)


def indirect_effect(model, prompt, means, heads=None):
    """activation_replacement_per_class_intervention, last token only: ``{(l, h): P_patched - P_corrupted}``
    for one corrupted prompt, one forward per head."""
    s = attention_shape(model.config)
    L, H, D = s["n_layers"], s["n_heads"], s["head_dim"]
    dev = next(model.parameters()).device
    ids = torch.tensor([prompt.input_ids], device=dev)
    y = prompt.target_id
    with torch.no_grad():
        base = torch.softmax(model(input_ids=ids).logits[:, -1].double(), -1)[0, y].item()
    heads = [(l, h) for l in range(L) for h in range(H)] if heads is None else heads
    out = {}
    for l, h in heads:
        def edit(m, args, l=l, h=h):
            x = args[0].clone()
            x = x.view(*x.shape[:-1], H, D)
            x[:, -1, h] = means[l, h].to(x.dtype)
            return (x.view(*x.shape[:-2], H * D), *args[1:])
        handle = output_projection(model, l).register_forward_pre_hook(edit)
        try:
            with torch.no_grad():
                p = torch.softmax(model(input_ids=ids).logits[:, -1].double(), -1)[0, y].item()
        finally:
            handle.remove()
        out[(l, h)] = p - base
    return out, base
