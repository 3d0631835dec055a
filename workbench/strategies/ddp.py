"""DDP: every rank keeps everything and all-reduces the gradients, bucket by bucket."""

from workbench.strategies.base import Implementation, Sharded, Strategy, register

DDP = register(Strategy(
    name="ddp", family="data_parallel", summary="data parallel: every state whole on every rank; gradients all-reduced",
    sharded=Sharded(parameters=False, gradients=False, optimizer=False),
    implementations=(
        Implementation(framework="mlx", builder="workbench.adapters.mlx.accum:make_trainer"),
        # JAX's DDP step all-reduces each array (XLA may merge them: the runs' compiled_collectives show it).
        Implementation(framework="jax", builder="workbench.adapters.jax.fsdp:make_ddp_step", sync_per="array",
                       update_copies="parameters_and_state"),  # not donated: new parameters and state
    )))
