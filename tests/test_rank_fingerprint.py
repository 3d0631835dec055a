"""Ranks whose plans differ fail at once on every rank, naming the field and the ranks (issue 14, item 9)."""

import os

import pytest

from workbench.launch.engines import EngineFailure, start_engines
from workbench.launch.plan import plan_launch
from workbench.ranks.fingerprint import first_mismatch

HERE = os.path.dirname(os.path.abspath(__file__))


def exchange(differ: str | None):
    """One rank's side: rank 1 changes ``differ`` in its fingerprint; returns the exchange's seconds."""
    import mlx.core as mx

    from workbench.ranks.fingerprint import check_ranks_agree, plan_fingerprint

    group = mx.distributed.init(backend="ring", strict=True)
    params = [("layers.0.w", mx.zeros((8, 4))), ("layers.0.b", mx.zeros((8,)))]
    settings = dict(strategy="fsdp-row", communication_size=32 * 2**20, clipping=False)
    if group.rank() == 1 and differ == "communication_size":
        settings["communication_size"] = 0
    if group.rank() == 1 and differ == "clipping":
        settings["clipping"] = True
    if group.rank() == 1 and differ == "shapes":
        params[1] = ("layers.0.b", mx.zeros((9,)))
    if group.rank() == 1 and differ == "paths":
        params[1] = ("layers.0.bias", mx.zeros((8,)))
    return check_ranks_agree(group, plan_fingerprint(params, group_size=group.size(), **settings))


def test_first_mismatch_names_the_first_field_and_every_rank_that_differs():
    assert first_mismatch(["a", "b"], [[1, 2], [1, 3], [1, 2], [1, 4]]) == ("b", [1, 3])
    assert first_mismatch(["a", "b"], [[1, 2], [1, 2]]) is None


def test_ranks_that_disagree_fail_on_every_rank_naming_the_field_and_agreeing_ranks_pay_once():
    with start_engines(plan_launch(2, framework="mlx", env={"PYTHONPATH": HERE})) as run:
        seconds = run.apply(exchange, [(None,), (None,)], timeout_s=60)
        print(f"fingerprint exchange, 2 ring ranks: {max(seconds) * 1e3:.2f} ms (once per run)")
        assert max(seconds) < 1.0
        for field in ("communication_size", "clipping", "shapes", "paths"):
            asks = [run.client[run.rank_engine[r]].apply_async(exchange, field) for r in (0, 1)]
            for ask in asks:  # every rank raises, naming the field and the ranks
                with pytest.raises(Exception, match=rf"ranks disagree on '{field}' .* ranks \[1\] differ from rank 0"):
                    ask.get(30)
    with pytest.raises(EngineFailure):  # and through the run's own failure path, naming a rank
        with start_engines(plan_launch(2, framework="mlx", env={"PYTHONPATH": HERE})) as run:
            run.apply(exchange, [("shapes",), ("shapes",)], timeout_s=60)
