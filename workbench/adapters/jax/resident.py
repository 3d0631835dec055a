"""A training loop's view of a JAX step on what it keeps resident between steps (issue 30).

FSDP (:class:`~workbench.adapters.jax.fsdp.FsdpStep`) keeps its parameters in the plan's bucket buffers
for the whole run: :meth:`~workbench.adapters.jax.fsdp.FsdpStep.to_buckets` once,
:meth:`~workbench.adapters.jax.fsdp.FsdpStep.step_buckets` every step (buffers and optimizer state
donated: XLA writes the next ones into them), :meth:`~workbench.adapters.jax.fsdp.FsdpStep.from_buckets`
only when the arrays are wanted (a checkpoint, an evaluation). Every other step (DDP, ZeRO-3) keeps its
parameter pytree. :class:`ResidentStep` gives both one interface, so a loop never asks which it runs.
"""

from __future__ import annotations

from typing import Any

import jax

from workbench.adapters.jax.fsdp import FsdpStep

__all__ = ["ResidentStep"]


class ResidentStep:
    """Runs ``step`` on its resident form: bucket buffers for FSDP, the parameter pytree otherwise.

    Attributes:
        step: The step built by ``make_fsdp_step``, ``make_ddp_step`` or ``make_zero3_step``.
        bucketed: True where the resident form is FSDP's bucket buffers.
    """

    def __init__(self, step: Any):
        self.step = step
        self.bucketed = isinstance(step, FsdpStep)

    def enter(self, params: Any) -> Any:
        """The resident form of ``params`` (placed as the step takes them): FSDP's bucket buffers
        (per bucket a replicated 1-D array of N*c elements), else ``params`` itself."""
        return self.step.to_buckets(params) if self.bucketed else params

    def params(self, resident: Any) -> Any:
        """The parameter pytree of the resident form (FSDP: read out of the buffers, which stay valid)."""
        return self.step.from_buckets(resident) if self.bucketed else resident

    def lower(self, resident: Any, opt_state: Any, batch: Any) -> jax.stages.Lowered:
        """The lowered program :meth:`__call__` runs for these arguments."""
        if self.bucketed:
            return self.step.lower_buckets(resident, opt_state, batch)
        return self.step.lower(resident, opt_state, batch)

    def bind(self, compiled: Any) -> None:
        """Run ``compiled``, the program :meth:`lower` gave compiled (here, or by another rank), from now on: the
        jitted step would compile it again."""
        self.step.bind(compiled, bucketed=self.bucketed)

    def __call__(self, resident: Any, opt_state: Any, batch: Any) -> tuple[Any, Any, dict]:
        """One step: ``(resident, opt_state, metrics)``. FSDP donates ``resident`` and ``opt_state``
        (they are deleted): pass on the returned ones."""
        if self.bucketed:
            return self.step.step_buckets(resident, opt_state, batch)
        return self.step.step(resident, opt_state, batch)
