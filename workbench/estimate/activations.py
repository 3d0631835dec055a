"""What the backward holds beside the model states: activations (Korthikanti et al. 2022) and the
largest FSDP unit of a transformer.
"""

from __future__ import annotations

from workbench.core.architecture import is_expert_param, layer_index
from workbench.core.checks import integer
from workbench.core.resolve import ModelArg, resolve_architecture
from workbench.core.specs import ModelSpec


def largest_unit_params(spec: ModelSpec, *, experts: bool = True) -> int:
    """Elements of the largest FSDP unit when every transformer block is one unit.

    Parameters are grouped by :func:`workbench.core.presets.layer_index`; everything outside the
    blocks (embeddings, final norm, LM head) is the root unit, as FSDP wraps the root module.
    ``experts=False`` leaves out routed-expert parameters (:func:`~workbench.core.presets.is_expert_param`),
    which FSDP does not gather when they are excluded from it.
    """
    units: dict[object, int] = {}
    for p in spec:
        if not experts and is_expert_param(p.path):
            continue
        key = layer_index(p.path)
        units[key] = units.get(key, 0) + p.size
    return max(units.values(), default=0)


def estimate_activation_bytes(*, seq_len: int, micro_batch_size: int, hidden_size: int | None = None,
                              num_heads: int | None = None, num_layers: int | None = None,
                              config: ModelArg | None = None, fused_attention: bool = False,
                              recompute: bool = False) -> int:
    """Activation bytes kept for backward, at their peak: ``L * s * b * h * (34 + 5 * a * s / h)`` by default.

    Korthikanti et al. 2022 (arXiv:2205.05198, Sec. 4.1, Eq. 1): 16-bit activations, no tensor or
    sequence parallelism; embeddings and the output layer excluded. The 34 assumes a 4h MLP, so GLU
    models with other widths are approximate. Per layer, ``34 * s * b * h`` bytes are the inputs of its
    matrix multiplies, norms, activation function and dropouts; ``5 * a * s**2 * b`` are the attention
    scores (softmax output 2, dropout mask 1, dropout output 2 bytes per score).

    Args:
        seq_len: s, tokens per sequence. micro_batch_size: b, sequences per rank.
        hidden_size, num_heads, num_layers: h, a, L; default to ``config``'s.
        config: A preset name, a ``config.json`` path or dict, or an :class:`ArchitectureConfig`
            (:func:`~workbench.core.resolve.resolve_architecture`).
        fused_attention: A fused attention kernel (FlashAttention: Dao et al. 2022, arXiv:2205.14135) keeps no
            ``s x s`` scores for backward (it recomputes them blockwise): each layer keeps ``34 * s * b * h``
            bytes, Korthikanti's selective recomputation (Sec. 4.2, Eq. 2) by another route. Default: False.
        recompute: Full activation recomputation (checkpointing every layer): each layer keeps only its
            16-bit input, ``2 * s * b * h`` bytes (Korthikanti Sec. 4.2, ``2sbhL``), and the backward holds
            one layer's activations again while it recomputes it: ``L * 2sbh`` plus one layer of the
            formula above (with or without the scores, per ``fused_attention``). Default: False.

    Returns:
        Bytes (an int).
    """
    if config is not None:
        config = resolve_architecture(config, argument="config")
    h = hidden_size if hidden_size is not None else getattr(config, "hidden_size", None)
    a = num_heads if num_heads is not None else getattr(config, "num_heads", None)
    n_layers = num_layers if num_layers is not None else getattr(config, "num_layers", None)
    s, b = integer("seq_len", seq_len, low=0), integer("micro_batch_size", micro_batch_size, low=0)
    h, a, n_layers = (integer(k, v, low=1) if v is not None else None
                      for k, v in (("hidden_size", h), ("num_heads", a), ("num_layers", n_layers)))
    if None in (h, a, n_layers):
        raise ValueError("hidden_size, num_heads and num_layers must be given, or a config.")
    for name, flag in (("fused_attention", fused_attention), ("recompute", recompute)):
        if not isinstance(flag, bool):
            raise ValueError(f"{name} must be True or False, got {flag!r}.")
    per_layer = s * b * h * 34 + (0 if fused_attention else 5 * a * s * s * b)
    return int(n_layers * 2 * s * b * h + per_layer) if recompute else int(n_layers * per_layer)
