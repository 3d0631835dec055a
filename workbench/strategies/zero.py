"""ZeRO-1/2-like strategies: the optimizer side sharded, gradients reduce-scattered, parameters whole.

ZeRO-1 shards the optimizer state and master weights; ZeRO-2 the gradients as well. MLX's
``fsdp_apply_gradients`` step (``fsdp``, run as ``fsdp-row`` and ``fsdp-flat``: the shard layouts of
:func:`workbench.core.shards.plan_shards`) reduce-scatters each bucket of full gradients, updates its
shard, and all-gathers the parameters. ``hsdp-row`` is that step within a shard group of N/R ranks (a host's), its
shards all-reduced across the R groups (PyTorch's ``_HYBRID_SHARD_ZERO2``; JAX's step over a replica axis).
"""

from workbench.strategies.base import Implementation, Sharded, Strategy, register

_OPTIMIZER_SIDE = Sharded(parameters=False, gradients=False, optimizer=True)


def _runs() -> tuple[Implementation, ...]:
    # Both keep the state resident in the bucket layout (issue 30): MLX each bucket's master shard beside the
    # parameter tree (its update still returns a new tree), JAX the bucket buffers, donated to every step.
    return (Implementation(framework="mlx", builder="workbench.adapters.mlx.accum:make_trainer", norm="always",
                           update_copies="parameters_and_master_shard"),
            Implementation(framework="jax", builder="workbench.adapters.jax.fsdp:make_fsdp_step", norm="max_norm",
                           update_copies="none"))


ZERO1 = register(Strategy(
    name="zero1", family="zero_1_2", summary="ZeRO-1: optimizer state and master weights sharded",
    sharded=_OPTIMIZER_SIDE, greedy=True))
ZERO2 = register(Strategy(
    name="zero2", family="zero_1_2", summary="ZeRO-2: gradients, optimizer state and master weights sharded",
    sharded=Sharded(parameters=False, gradients=True, optimizer=True)))
FSDP = register(Strategy(
    name="fsdp", family="zero_1_2", summary="MLX's FSDP step, either layout: optimizer side sharded, full gradients "
                                        "reduce-scattered, parameters all-gathered after the update",
    sharded=_OPTIMIZER_SIDE))
FSDP_ROW = register(Strategy(
    name="fsdp-row", family="zero_1_2", summary="MLX's FSDP step, each array's rows split over the ranks",
    sharded=_OPTIMIZER_SIDE, layout="row", implementations=_runs()))
FSDP_FLAT = register(Strategy(
    name="fsdp-flat", family="zero_1_2", summary="MLX's FSDP step, each bucket cut flat into N equal chunks",
    sharded=_OPTIMIZER_SIDE, layout="flat", implementations=_runs()))
HSDP_ROW = register(Strategy(
    name="hsdp-row", family="zero_1_2", summary="fsdp-row within a shard group (a host's ranks), each shard's gradient "
                                            "all-reduced across the R groups (HSDP, ZeRO-2-like)",
    sharded=_OPTIMIZER_SIDE, layout="row", replicas=True, implementations=tuple(i for i in _runs() if i.framework == "jax")))  # over a replica axis
