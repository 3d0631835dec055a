"""MLX's own ``fully_shard`` (``mlx.nn.fully_shard``, MLX >= 0.32.1).

Each wrapped module is a unit: one ``all_gather`` of its parameters in forward, in the row-per-parameter
layout, and a custom VJP that reduce-scatters (``sum_scatter``) its gradients in backward. The gathered
weights stay alive until backward (no resharding), and there is no bucket size. Modelled as ZeRO-3
without resharding after forward, units = the wrapped modules.

MLX runs it through :class:`~workbench.adapters.mlx.fully_shard_trainer.FullyShardTrainer`: every
transformer block, then the root, wrapped by ``fully_shard`` itself; the ``sum_scatter`` ring and MPI
lack supplied by the workbench's CPU reduce-scatter for the run. Every micro-batch's backward
reduce-scatters every unit (the VJP cannot be put off), so a run cannot defer the sync
(``RunSpec.defer_sync`` must be False with ``num_microbatches`` > 1); the gradient norm is one
``all_sum`` (``clip_grad_norm_sharded``), issued when ``max_norm`` is set: a run always sets it, so always.
"""

from workbench.strategies.base import Implementation, Sharded, Strategy, register

FULLY_SHARD = register(Strategy(
    name="mlx-fully-shard", family="fully_shard",
    summary="MLX's fully_shard: each wrapped module gathered in forward, kept to backward, grads sum-scattered",
    sharded=Sharded(parameters=True, gradients=True, optimizer=True), layout="row", units="modules",
    reshard_after_forward=False, splits_axis0=True,
    implementations=(
        Implementation(framework="mlx", builder="workbench.adapters.mlx.fully_shard_trainer:FullyShardTrainer",
                       sync_per="unit", norm="always", defers_sync=False, unit_buffers="sum_scatter_ring"),
    )))
