"""MLX's own ``fully_shard`` (``mlx.nn.fully_shard``, MLX >= 0.32.1).

Each wrapped module is a unit: one ``all_gather`` of its parameters in forward, in the row-per-parameter
layout, and a custom VJP that reduce-scatters (``sum_scatter``) its gradients in backward. The gathered
weights stay alive until backward (no resharding), and there is no bucket size. Modelled as ZeRO-3
without resharding after forward, units = the wrapped modules.
"""

from workbench.strategies.base import Sharded, Strategy, register

FULLY_SHARD = register(Strategy(
    name="mlx-fully-shard", family="fully_shard",
    summary="MLX's fully_shard: each wrapped module gathered in forward, kept to backward, grads sum-scattered",
    sharded=Sharded(parameters=True, gradients=True, optimizer=True), layout="row", units="modules",
    reshard_after_forward=False))
