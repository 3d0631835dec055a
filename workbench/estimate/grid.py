"""A grid of memory estimates: one model under each strategy and N, activations included (what the memory
explorer and the notebooks draw). Pure: the figures are :mod:`workbench.views.memory`'s."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Sequence

from workbench.estimate.activations import estimate_activation_bytes
from workbench.estimate.breakdown import MemoryEstimate
from workbench.estimate.memory import estimate_memory

if TYPE_CHECKING:
    from workbench.core.resolve import ModelArg

EXPLORER_STRATEGIES = ("ddp", "zero1", "zero2", "fsdp", "zero3")
POWERS_OF_TWO = tuple(2**k for k in range(11))


def powers_between(low: int, high: int) -> tuple[int, ...]:
    """The powers of two from ``low`` to ``high`` (both powers of two in 1..1024), the explorer's N values."""
    if low not in POWERS_OF_TWO or high not in POWERS_OF_TWO or low > high:
        raise ValueError(f"num_shards must be (low, high), powers of two in 1..1024 with low <= high; "
                         f"got {(low, high)!r}.")
    return POWERS_OF_TWO[POWERS_OF_TWO.index(low):POWERS_OF_TWO.index(high) + 1]


def estimate_breakdowns(model: "ModelArg", strategies: Sequence[str] = EXPLORER_STRATEGIES,
                        num_shards: Sequence[int] = (8, 64), *, param_dtype: str = "bfloat16",
                        master_dtype: str | None = "float32", optimizer: str = "adamw", micro_batch_size: int = 1,
                        seq_len: int = 2048, update_copies: str = "none", recompute: bool = False,
                        fused_attention: bool = False) -> list[MemoryEstimate]:
    """:func:`estimate_memory` of a preset for each strategy and N (strategy-major), activations included.

    Args:
        model: A preset name of :mod:`workbench.core.presets` (its blocks are the ZeRO-3 units), a
            ``config.json`` path or dict, or a :class:`~workbench.core.specs.ModelSpec` (from
            ``spec_from_mlx``, ``spec_from_nnx``...; shapes only, so activations count 0).
        strategies, num_shards: The grid; N is ranks (the data-parallel degree).
        param_dtype, master_dtype, optimizer, update_copies: As :func:`estimate_memory` (optimizer states in fp32).
        micro_batch_size, seq_len: Sequences per rank and tokens per sequence, for
            :func:`estimate_activation_bytes` (Korthikanti et al.).
        recompute, fused_attention: The activation levers, as :func:`estimate_activation_bytes`: full
            recomputation keeps only each layer's input; a fused attention kernel keeps no ``s x s`` scores.

    Raises:
        ValueError: naming the knob (``model``, ``num_shards``, ``strategy``, ``seq_len``...).
    """
    from workbench.core.presets import PRESETS, get_preset
    from workbench.core.resolve import resolve_spec

    if isinstance(model, str) and model not in PRESETS and not os.path.exists(model):
        raise ValueError(f"model: unknown preset {model!r}; known: {', '.join(sorted(PRESETS))}.")
    if not strategies or not num_shards:
        raise ValueError(f"strategies and num_shards must be non-empty, got {strategies!r} and {num_shards!r}.")
    try:
        spec = get_preset(model, param_dtype) if isinstance(model, str) and model in PRESETS else None
    except ValueError as err:
        raise ValueError(f"param_dtype: {err}") from None
    spec = spec or resolve_spec(model, dtype=param_dtype, argument="model")
    # A ModelSpec holds shapes only: no hidden size or layers to estimate activations from.
    act = 0 if isinstance(model, type(spec)) else estimate_activation_bytes(
        seq_len=seq_len, micro_batch_size=micro_batch_size, config=model, recompute=recompute,
        fused_attention=fused_attention)
    return [estimate_memory(spec, s, n, param_dtype=param_dtype, master_dtype=master_dtype, optimizer=optimizer,
                            activation_bytes=act, update_copies=update_copies) for s in strategies for n in num_shards]
