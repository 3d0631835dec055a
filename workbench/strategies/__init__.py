"""The sharding strategies, as records in one registry (:mod:`workbench.strategies.base`).

A pure layer just above :mod:`workbench.core`: one module per family registers its records on import.
"""

# Each family registers its records on import, in this order (the order tables and listings show).
from workbench.strategies import ddp  # noqa: F401  isort: skip
from workbench.strategies import zero  # noqa: F401  isort: skip
from workbench.strategies import zero3  # noqa: F401  isort: skip
from workbench.strategies import fully_shard  # noqa: F401  isort: skip
from workbench.strategies.base import (FAMILIES, LAYOUTS, UPDATE_COPIES, Collective, Implementation, Sharded, StepShape,
                                       Strategy, get_strategy, strategies)
from workbench.strategies.collectives import COLLECTIVE_KINDS, COLLECTIVES, bus_factor, ring_steps

#: Every registered strategy, by name: what the memory and communication models estimate.
NAMES = tuple(s.name for s in strategies())
#: The registered strategies some framework runs: what ``RunSpec.strategy`` may be.
RUN_NAMES = tuple(s.name for s in strategies() if s.frameworks)

__all__ = ["COLLECTIVES", "COLLECTIVE_KINDS", "FAMILIES", "LAYOUTS", "NAMES", "RUN_NAMES", "Collective", "Implementation", "Sharded",
           "StepShape", "Strategy", "UPDATE_COPIES", "bus_factor", "get_strategy", "ring_steps", "strategies"]
