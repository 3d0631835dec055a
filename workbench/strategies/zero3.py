"""ZeRO-3-like strategies: parameters, gradients and optimizer state all sharded; units gathered to run.

``zero3`` and ``hsdp`` are the models (the buckets are the units; HSDP shards within a group of N and
all-reduces each shard across R replicas); ``fsdp-full`` is the workbench's run of ZeRO-3, one unit per
transformer block plus the root, each array's rows split over the ranks.
"""

from workbench.strategies.base import Implementation, Sharded, Strategy, register

_ALL = Sharded(parameters=True, gradients=True, optimizer=True)

ZERO3 = register(Strategy(
    name="zero3", family="zero_3", summary="ZeRO-3: every state sharded; each unit gathered for forward and backward",
    sharded=_ALL))
HSDP = register(Strategy(
    name="hsdp", family="zero_3", summary="hybrid: ZeRO-3 within a shard group, replicated across groups",
    sharded=_ALL, replicas=True))
FSDP_FULL = register(Strategy(
    name="fsdp-full", family="zero_3", summary="full sharding (ZeRO-3), one unit per transformer block plus the root",
    sharded=_ALL, layout="row", units="modules",
    implementations=(
        Implementation(framework="mlx", builder="workbench.adapters.mlx.zero3_trainer:make_zero3_trainer", sync_per="unit",
                       norm="always", unit_buffers="mlx"),
        Implementation(framework="jax", builder="workbench.adapters.jax.zero3:make_zero3_step", sync_per="unit",
                       norm="max_norm", update_copies="parameters_and_state", reuses_gathers=True,  # not donated
                       unit_buffers="whole_model",  # XLA gathers every unit at once (estimate.knobs)
                       collective_scratch=1.5),  # XLA's CPU reduce-scatter over gloo (estimate.knobs)
    )))
