"""The collectives of a data-parallel step and what each costs on a ring.

Ring collectives of V bytes over N ranks (Patarasuk and Yuan 2009): all-gather and reduce-scatter send
V (N - 1) / N bytes per rank in N - 1 steps; all-reduce sends 2 V (N - 1) / N in 2 (N - 1) steps;
nccl-tests report ``busbw = algbw * factor`` with the same factors (``doc/PERFORMANCE.md``).
Pure: standard library and NumPy only.
"""

from __future__ import annotations

from workbench.core.checks import integer

#: The collectives of a data-parallel step, in the order a step issues them (sync, then gather); the key
#: every count, benchmark and table of collectives uses.
COLLECTIVE_KINDS = ("all_reduce", "reduce_scatter", "all_gather")
#: Every collective the communication model prices (a greedy ZeRO-1 plan also broadcasts).
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


def count_of_ranks(knob: str, value: object) -> int:
    """``value`` as a rank count >= 1, by the one rule for counts (:func:`workbench.core.checks.integer`)."""
    return integer(knob, value, low=1)


def bus_factor(kind: str, num_ranks: int) -> float:
    """nccl-tests' busbw / algbw: 2(N-1)/N all-reduce, (N-1)/N all-gather and reduce-scatter, 1 broadcast."""
    n = count_of_ranks("num_ranks", num_ranks)
    share = (n - 1) / n
    factors = {"all_reduce": 2 * share, "all_gather": share, "reduce_scatter": share, "broadcast": 1.0}
    if kind not in factors:
        raise ValueError(f"Unknown collective kind {kind!r}; choose one of {', '.join(COLLECTIVES)}.")
    return factors[kind]


def ring_steps(kind: str, num_ranks: int) -> int:
    """Latency terms of a ring collective: 2(N-1) for all-reduce, N-1 for the others."""
    bus_factor(kind, num_ranks)
    return (2 if kind == "all_reduce" else 1) * (int(num_ranks) - 1)
