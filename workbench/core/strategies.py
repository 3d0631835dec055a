"""Strategy names, defined once.

Two vocabularies meet here. The memory and communication models (:mod:`workbench.estimate.memory`,
:mod:`workbench.estimate.comm`) speak of ZeRO stages and FSDP variants; a training run
(:class:`workbench.runs.spec.RunSpec`) is one of four steps the workbench implements. Each run
strategy is modelled as one model strategy.
"""

#: What the memory and communication models know: DDP, ZeRO-1/2, ``fsdp`` (MLX's step: gradients and
#: optimizer state sharded, parameters whole), ZeRO-3 (everything sharded) and HSDP.
MODEL_STRATEGIES = ("ddp", "zero1", "zero2", "fsdp", "zero3", "hsdp")
#: What a training run can be: DDP, FSDP in the row or flat layout, and full sharding (ZeRO-3).
RUN_STRATEGIES = ("ddp", "fsdp-row", "fsdp-flat", "fsdp-full")
#: The model strategy of each run strategy.
MODEL_STRATEGY = {"ddp": "ddp", "fsdp-row": "fsdp", "fsdp-flat": "fsdp", "fsdp-full": "zero3"}
#: The collectives of a data-parallel step, in the order a step issues them (sync, then gather); the key
#: every count, benchmark and table of collectives uses.
COLLECTIVE_KINDS = ("all_reduce", "reduce_scatter", "all_gather")
