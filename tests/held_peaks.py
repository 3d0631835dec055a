"""Issue 26's held peaks: each rank of each real run against the peak predicted from its model's profile.

The suite that holds every peak within 10% on 2 real ranks, in MLX and JAX, under ddp, fsdp-row, fsdp-flat and
fsdp-full: the built-in LM (tests/test_validation.py, the run's stored estimate: the closed formula fitted to it),
the example factory examples.tiny_attention_lm, an attention model of 128 tokens (tests/test_profile_runs.py), and
a model from a config: mlx-lm's own Llama and Qwen3 classes in MLX, and in JAX the workbench's LM with the Qwen3
config's shape at 128 tokens (tests/test_mlx_lm_runs.py). Those two use :func:`rank_peaks`.
"""

from workbench.runs.estimate import spec_from_row
from workbench.runs.profile_estimate import estimate_with_profile
from workbench.runs.tables import load_runs
from workbench.studies.memory import PEAK_TOLERANCE, is_plan, measured_peak


def rank_peaks(root, profile_of) -> list[tuple]:
    """``(model, framework, strategy, rank, predicted, measured, ratio)`` for every rank of every run under
    ``root``; ``profile_of(spec)`` gives ``(model name, its profile)``. A JAX rank's measure is its truth
    (VmHWM), never XLA's plan."""
    rows = []
    for _, run in load_runs(root).runs.iterrows():
        spec = spec_from_row(run)
        model, profile = profile_of(spec)
        predicted = estimate_with_profile(spec, profile, run.get("model_shapes")).total_bytes
        for rank in run["summary.ranks"]:
            measured, source, _ = measured_peak(rank["measured_memory"])
            assert not is_plan(source), (model, spec["strategy"], rank["rank"], source)
            rows.append((model, spec["framework"], spec["strategy"], rank["rank"], predicted, measured,
                         measured / predicted))
    return sorted(rows)


def assert_held(rows: list[tuple], count: int) -> None:
    """Print ``rows`` (:func:`rank_peaks`) as a table and assert there are ``count`` of them, each within
    :data:`~workbench.studies.memory.PEAK_TOLERANCE`."""
    print("\nmodel       framework strategy   rank  predicted B  measured B  measured/predicted")
    for row in rows:
        print("{:11} {:9} {:10} {:4} {:12,} {:11,} {:8.3f}".format(*row))
    assert len(rows) == count, rows
    missed = [row for row in rows if abs(row[-1] - 1) > PEAK_TOLERANCE]
    assert not missed, missed
