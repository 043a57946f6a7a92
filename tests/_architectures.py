"""Tiny random models of every causal-LM architecture transformers ships, and the independent hook
reference the architecture tests compare the instrumentation against (tests/test_architectures.py).

:func:`tiny_config` derives a config from the architecture's own defaults, shrinking the size fields
generically (:data:`SIZES`: 2 layers, hidden 64, 4 heads, a 512-entry vocabulary; per-layer lists cut to
2 entries that keep each kind the defaults start with) with a small table of per-architecture
overrides (:data:`OVERRIDES`) only where the generic shrink cannot be built. The reference shares no
code with the package: a forward pre-hook on the attention output projection that zeroes one head's
input slice (:func:`zero_head_reference`), and ``output_attentions=True`` under eager attention.
"""

from __future__ import annotations

import re

import torch

VOCAB = 512
SEQ = 10            # tokens per row of the probe batch (shorter than every tiny sliding window: 16)

# size fields of the configs' defaults -> the tiny value (set only where the default is an int)
SIZES = {
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "n_embed", "emb_dim", "hidden_dim", "embedding_dim"), 64),
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers", "encoder_layers",
                     "num_blocks"), 2),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads", "n_heads", "decoder_attention_heads",
                     "encoder_attention_heads"), 4),
    **dict.fromkeys(("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num"), 2),
    **dict.fromkeys(("intermediate_size", "n_inner", "ffn_dim", "d_ff", "decoder_ffn_dim", "encoder_ffn_dim",
                     "ffn_hidden_size", "mlp_only_intermediate_size"), 128),
    **dict.fromkeys(("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts"), 4),
    **dict.fromkeys(("moe_intermediate_size", "shared_expert_intermediate_size", "expert_ffn_hidden_size"), 32),
    "num_experts_per_tok": 2, "moe_topk": 2, "head_dim": 16, "rotary_dim": 8, "vocab_size": VOCAB,
    "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 24,
    "vocab_size_per_layer_input": VOCAB, "hidden_size_per_layer_input": 16, "sliding_window": 16, "window_size": 16,
    "attention_window_size": 16, "max_window_layers": 2, "num_kv_shared_layers": 0, "first_k_dense_replace": 1,
    "lru_width": 64, "attention_hidden_size": 64, "attention_head_dim": 16, "index_head_dim": 16, "index_n_heads": 2,
    "index_num_heads": 2, "index_topk": 4, "mamba_d_state": 16, "mamba_n_heads": 8, "mamba_d_head": 16,
    "mamba_dt_rank": 8, "state_size": 16, "time_step_rank": 8, "n_group": 1, "topk_group": 1,
}
# the fields read as the number of layers (a per-layer list of this length is cut with them)
LAYER_FIELDS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers", "num_blocks")

# per-architecture overrides, only where the generic shrink cannot be built or leaves no attention layer
OVERRIDES = {
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},
    "mamba2": {"num_heads": 8, "head_dim": 16, "n_groups": 1},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1},
    "zamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "layers_block_type": None},
    "bamba": {"attn_layer_indices": [1]},
    "deepseek_v2": {"num_experts_per_tok": 2, "n_group": 1, "topk_group": 1},
    "dots1": {"n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2},
    "zaya": {"num_experts_per_tok": 1},
    "dots3_note": {"num_key_value_heads": 4},
    "dots3_note_text": {"num_key_value_heads": 4},
    "xmod": {"default_language": None},
    "nemotron": {"num_key_value_heads": 2},         # its default None breaks its own attention
}


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _keep(values: list) -> list[int]:
    """Two indices of a per-layer list: the first, and the first of another kind if there is one (a hybrid's
    attention layer beside its first recurrent one), else the second."""
    other = next((i for i, v in enumerate(values) if v != values[0]), 1)
    return [0, other]


def _shrunk(config_cls, base, overrides: dict) -> dict:
    d = base.to_dict()
    kw = {k: v for k, v in SIZES.items() if k in d and (_int(d[k]) or (k == "head_dim" and d[k] is None
                                                                        and "qk_rope_head_dim" not in d))}
    if "kv_lora_rank" in d:                            # MLA: as many key/value heads as query heads
        kw.update({k: 4 for k in ("num_key_value_heads",) if k in d})
    if "qk_rope_head_dim" in d and "head_dim" in d:
        kw["head_dim"] = SIZES["qk_rope_head_dim"]      # MLA: head_dim is the rotary part
    n = next((d[k] for k in LAYER_FIELDS if _int(d.get(k))), None)
    typed = next((d[k] for k in ("layer_types", "layers_block_type", "block_types") if isinstance(d.get(k), list)
                  and len(d[k]) == n), None)
    keep = _keep(typed) if typed else [0, 1]
    for k, v in d.items():                # per-layer lists: the kept layers' entries
        if isinstance(v, list) and n and len(v) == n and n > 2:
            kw[k] = [v[i] for i in keep]
    for k in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
        v = d.get(k)
        if _int(v) and v >= VOCAB:
            kw[k] = 1
        elif isinstance(v, list):
            kw[k] = [x if x < VOCAB else 1 for x in v]
    for sub in getattr(base, "sub_configs", {}) or {}:
        sc = getattr(base, sub, None)
        if sc is not None and hasattr(sc, "to_dict"):
            kw[sub] = _shrunk(type(sc), sc, {})
    kw.update(overrides)
    return kw


def tiny_config(model_type: str):
    """The tiny config of ``model_type`` (a key of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``), fp32, eager-capable."""
    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    return cls(**_shrunk(cls, cls(), OVERRIDES.get(model_type, {})))


def build(model_type: str, seed: int = 0):
    """``(model, None)``, or ``(None, reason)`` when the tiny config of ``model_type`` cannot be built or run."""
    from transformers import AutoModelForCausalLM

    try:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(tiny_config(model_type), dtype=torch.float32).eval()
        with torch.no_grad():
            model(input_ids=probe_ids())
    except Exception as e:  # noqa: BLE001 - any failure of transformers' own code on its defaults is a skip
        text = " ".join(str(e).split())[:160]
        return None, f"{type(e).__name__}: {text}"
    return model, None


def probe_ids(seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(8, VOCAB - 8, (2, SEQ), generator=g)


# -- the independent reference ------------------------------------------------------------------------
_OUT_NAMES = ("o_proj", "out_proj", "dense", "c_proj", "wo", "Wo", "o", "out", "proj")


def _in_dim(m) -> int | None:
    if isinstance(m, torch.nn.Linear):
        return m.in_features
    if type(m).__name__ == "Conv1D":          # GPT-2's: weight [in, out]
        return m.weight.shape[0]
    return None


def output_projections(model) -> dict[int, torch.nn.Module]:
    """Layer index (from the module path: ``...layers.N...`` / ``.h.N.`` / ``.blocks.N.``) -> the output
    projection of that layer's self-attention (a Linear / Conv1D child named like one), in the language model
    (paths naming a vision, audio or encoder tower, or cross-attention, are left out)."""
    found = {}
    for name, mod in model.named_modules():
        cls = type(mod).__name__
        if not re.search("Attention|Attn|MLA", cls) or re.search("cross|vision|visual|audio|image|encoder", name.lower()):
            continue
        m = re.search(r"\.(?:layers|h|blocks|layer|decoder_layers)\.(\d+)\.", f".{name}.")
        if m is None:
            continue
        for child in _OUT_NAMES:
            proj = getattr(mod, child, None)
            proj = getattr(proj, "linear", proj)       # a wrapper holding its Linear
            if proj is not None and _in_dim(proj) is not None:
                found.setdefault(int(m.group(1)), proj)
                break
    return found


def zero_head_reference(model, ids: torch.Tensor, layer: int, head: int, n_heads: int) -> torch.Tensor:
    """Logits ``[B, T, V]`` with the input slice of ``head`` to ``layer``'s attention output projection zeroed
    (a plain forward pre-hook; the slice is ``in_dim / n_heads`` wide)."""
    proj = output_projections(model)[layer]
    width = _in_dim(proj) // n_heads

    def hook(mod, args):
        x = args[0].clone()
        x[..., head * width:(head + 1) * width] = 0
        return (x,) + args[1:]

    handle = proj.register_forward_pre_hook(hook)
    try:
        with torch.no_grad():
            return model(input_ids=ids).logits.float()
    finally:
        handle.remove()


def eager_patterns(model, ids: torch.Tensor) -> list[torch.Tensor]:
    """Each layer's ``[B, H, T, T]`` attention probabilities from ``output_attentions=True`` under eager
    attention (the model's own implementation restored after)."""
    impl = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            return [a.float() for a in model(input_ids=ids, output_attentions=True).attentions]
    finally:
        model.set_attn_implementation(impl)
