"""Mixture-of-experts in the memory model: which parameters are routed experts, and the expert-parallel
policies compared (experts sharded by FSDP, or outside it over k expert-parallel ranks)."""

from __future__ import annotations

from typing import Sequence

from workbench.core.checks import as_whole
from workbench.core.presets import PRESETS, get_preset, is_expert_param
from workbench.core.specs import ModelSpec

#: The default policies compared: experts sharded by FSDP, then experts outside FSDP with EP degree 1 and 4.
DEFAULT_EXPERT_PARALLEL = (None, 1, 4)


def policy_label(expert_parallel: int | None) -> str:
    """A display name: ``None`` -> experts sharded by FSDP; k -> experts sharded by EP = k, outside FSDP."""
    if expert_parallel is None:
        return "experts sharded by FSDP"
    if expert_parallel == 1:
        return "experts outside FSDP, replicated"
    return f"experts outside FSDP, EP={expert_parallel}"


def moe_preset(preset_name: str) -> tuple[ModelSpec, int]:
    """The spec of an MoE preset and its experts per block; ``ValueError`` naming the preset otherwise."""
    if preset_name not in PRESETS:
        raise ValueError(f"preset_name: unknown preset {preset_name!r}; known: {', '.join(sorted(PRESETS))}.")
    config = PRESETS[preset_name]
    if not config.is_moe:
        moe = sorted(k for k, c in PRESETS.items() if c.is_moe)
        raise ValueError(f"preset_name: {preset_name!r} is a dense model (no experts); MoE presets: {', '.join(moe)}.")
    return get_preset(preset_name), config.num_experts


def check_expert_parallel(degrees: Sequence[int | None], num_experts: int) -> tuple[int | None, ...]:
    """``degrees`` as a tuple, if each is None or a k >= 1 dividing ``num_experts``; else a ValueError."""
    degrees = tuple(degrees)
    if not degrees:
        raise ValueError("expert_parallel_degrees: need at least one policy (None, or an EP degree k >= 1).")
    for k in degrees:
        if k is not None and (as_whole(k) is None or as_whole(k) < 1 or num_experts % as_whole(k)):
            raise ValueError(f"expert_parallel={k!r} must be None or an integer k >= 1 that divides the "
                             f"{num_experts} experts per block (each EP rank holds whole experts).")
    return tuple(None if k is None else as_whole(k) for k in degrees)


def expert_params(spec: ModelSpec) -> int:
    """Elements of the routed-expert parameters of ``spec`` (:func:`~workbench.core.presets.is_expert_param`)."""
    return sum(p.size for p in spec if is_expert_param(p.path))
