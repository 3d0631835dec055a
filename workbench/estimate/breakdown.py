"""A memory estimate, row by row: the components, their phases, and the peak they add up to.

Rows fall in three phases, and the peak is not their sum: ``states`` persist all step; the
``backward`` rows (activations, the gathered unit, the gradient accumulator) are gone before
the ``step`` rows (collective buffers, update copies) appear, so ``total_bytes = states +
max(backward, step)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: Rows by phase: ``states`` persist; ``step`` (gradient sync and update) and ``backward`` never coexist.
#: ``gradient_accumulator`` and ``collective_scratch`` are last, so the rows before them keep their positions in
#: :data:`COMPONENTS`.
PHASES = {
    "states": ("parameters", "gradients", "master_weights", "optimizer_state", "fp32_gradients", "flat_padding"),
    "step": ("reduced_gradients", "updated_parameters", "updated_optimizer_state", "all_reduce_buffer",
             "reduce_scatter_buffer", "all_gather_buffer"),
    "backward": ("gathered_unit", "activations", "gradient_accumulator", "collective_scratch"),
}


COMPONENTS = tuple(name for rows in PHASES.values() for name in rows)


MODEL_STATES = PHASES["states"][:5]


@dataclass(frozen=True)
class MemoryComponent:
    """One row of a breakdown: ``rank_bytes`` held by every rank, and how it was computed."""

    name: str
    rank_bytes: int
    formula: str = ""

    @property
    def phase(self) -> str:
        """``"states"``, ``"step"`` or ``"backward"`` (see :data:`PHASES`)."""
        return next(p for p, rows in PHASES.items() if self.name in rows)


@dataclass(frozen=True, kw_only=True)
class MemoryEstimate:
    """Per-rank memory of one strategy at its peak: ``total_bytes`` is the ``states`` rows plus the
    larger of the ``backward`` and ``step`` phases (:meth:`phase_bytes`)."""

    strategy: str
    num_params: int
    num_shards: int
    num_replicas: int
    components: tuple[MemoryComponent, ...]
    total_bytes: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "total_bytes", self.phase_bytes("states") + max(
            self.phase_bytes("step"), self.phase_bytes("backward")))

    def phase_bytes(self, phase: str) -> int:
        """Sum of the rows of ``phase`` (a key of :data:`PHASES`)."""
        if phase not in PHASES:
            raise KeyError(f"No phase {phase!r}; phases: {', '.join(PHASES)}.")
        return sum(c.rank_bytes for c in self.components if c.name in PHASES[phase])

    @property
    def peak_phase(self) -> str:
        """The transient phase that sets the peak: ``"step"`` or ``"backward"`` (ties: ``"step"``)."""
        return "step" if self.phase_bytes("step") >= self.phase_bytes("backward") else "backward"

    def __getitem__(self, name: str) -> int:
        for c in self.components:
            if c.name == name:
                return c.rank_bytes
        raise KeyError(f"No component {name!r}; components: {', '.join(COMPONENTS)}.")

    @property
    def model_state_bytes(self) -> int:
        """Parameters, gradients, master weights, optimizer state and fp32 gradients (the ZeRO terms)."""
        return sum(self[n] for n in MODEL_STATES)

    def as_dict(self) -> dict[str, int]:
        return {c.name: c.rank_bytes for c in self.components}
