"""Ranks whose plans differ fail at once on every rank, naming the field and the ranks (issue 14, item 9)."""

import os

import pytest

from workbench.launch.engines import EngineFailure, start_engines
from workbench.launch.plan import plan_launch
from workbench.core.fingerprint import first_mismatch

HERE = os.path.dirname(os.path.abspath(__file__))


def exchange(differ: str | None):
    """One rank's side: rank 1 changes ``differ`` in its fingerprint; returns the exchange's seconds."""
    import mlx.core as mx

    from workbench.adapters.mlx.agree import check_ranks_agree
    from workbench.core.fingerprint import plan_fingerprint

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
    if group.rank() == 1 and differ == "out of step":  # rank 1 runs a data collective of the same size instead
        mx.eval(mx.distributed.all_gather(mx.zeros((1, 19), dtype=mx.int32), group=group))
        return 0.0
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
        stray = run.client[run.rank_engine[1]].apply_async(exchange, "out of step")
        with pytest.raises(Exception, match=r"ranks are out of step: rank 0 was comparing plans but ranks \[1\]"):
            run.client[run.rank_engine[0]].apply_async(exchange, "out of step").get(30)
        assert stray.get(30) == 0.0
    with pytest.raises(EngineFailure):  # and through the run's own failure path, naming a rank
        with start_engines(plan_launch(2, framework="mlx", env={"PYTHONPATH": HERE})) as run:
            run.apply(exchange, [("shapes",), ("shapes",)], timeout_s=60)


def direct_step(differ: str | None, steps: int = 2):
    """One rank calling ``fsdp_apply_gradients`` itself, as a user's loop does; rank 1 differs in ``differ``
    (the issue's cases). Returns each step's ``(num_rank_checks, rank_check_s)`` and the final ``w``."""
    import mlx.core as mx
    import mlx.optimizers as optim

    from workbench.adapters.mlx.agree import forget_agreements
    from workbench.adapters.mlx.fsdp import fsdp_apply_gradients

    forget_agreements()  # each call is a new program: no plan checked yet (the engines live on between calls)
    group = mx.distributed.init(backend="ring", strict=True)
    one = group.rank() == 1
    params = {"w": mx.ones((8, 4)), "b": mx.ones((8,))}
    kw = {"communication_size": 2**30, "max_norm": None}
    if differ == "max_norm" and not one:
        kw["max_norm"] = 1.0
    if differ == "communication_size" and one:
        kw["communication_size"] = 0
    if differ == "extra parameter" and one:
        params["c"] = mx.ones((4,))
    if differ == "shape" and one:
        params["b"] = mx.ones((10,))
    if differ == "names" and one:
        params = {"w": params["w"], "bias": params["b"]}
    opt, out = optim.SGD(learning_rate=0.1), []
    for _ in range(steps):
        grads = {k: mx.full(v.shape, float(group.rank() + 1)) for k, v in params.items()}
        report: dict = {}
        res = fsdp_apply_gradients(grads, params, opt, group, layout="row", report=report, **kw)
        params = res[0] if kw["max_norm"] is not None else res
        mx.eval(params)
        out.append((report["num_rank_checks"], report["rank_check_s"]))
    return out, params["w"].tolist()


#: The issue's cases (item 9) -> the field every rank must name.
DIRECT_CASES = {"max_norm": "clipping", "communication_size": "communication_size", "extra parameter": "paths",
                "shape": "shapes", "names": "paths"}


def test_fsdp_apply_gradients_itself_checks_the_ranks_once_per_plan_and_names_what_differs():
    """Direct callers of the step (no run around it) are protected too: every case of issue 14, item 9
    that hung or returned wrong parameters now fails on every rank within seconds, naming the field."""
    with start_engines(plan_launch(2, framework="mlx", env={"PYTHONPATH": HERE})) as run:
        agreed = run.apply(direct_step, [(None,), (None,)], timeout_s=60)
        for checks, w in agreed:
            assert [c for c, _ in checks] == [1, 0]  # one exchange, on the plan's first step only
            assert checks[0][1] < 1.0 and checks[1][1] is None
            # Gradients 1 and 2 average to 1.5: two SGD steps of 0.1 take w from 1 to 0.7 on both ranks.
            assert w == [[0.7] * 4] * 8 or all(abs(x - 0.7) < 1e-6 for row in w for x in row)
        assert agreed[0][1] == agreed[1][1]
        print(f"plan check inside fsdp_apply_gradients, 2 ring ranks: "
              f"{max(c[0][1] for c, _ in agreed) * 1e3:.2f} ms on the first step, none after")
        for differ, field in DIRECT_CASES.items():
            asks = [run.client[run.rank_engine[r]].apply_async(direct_step, differ) for r in (0, 1)]
            for ask in asks:
                with pytest.raises(Exception, match=rf"ranks disagree on '{field}' .* ranks \[1\] differ from rank 0"):
                    ask.get(30)
