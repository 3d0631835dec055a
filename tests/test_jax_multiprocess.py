"""Two real JAX processes (one CPU device each, gloo over 127.0.0.1) run DDP and FSDP.

FSDP (row and flat; SGD and AdamW with clipping) must equal DDP, and both must equal a
single-process reference written out here. The ranks are started by the workbench's one
launcher (:func:`~workbench.launch.plan.plan_launch` + :func:`~workbench.launch.local_run.run_local`),
which never hangs: a failing rank or a timeout stops every rank and raises
:class:`~workbench.launch.local_run.LaunchError` with their output.
"""

import dataclasses
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from workbench.adapters.jax.base import spec_from_jax
from workbench.adapters.jax.distributed import bind_gloo_to
from workbench.core.buckets import plan_buckets
from workbench.launch.plan import plan_launch
from workbench.launch.local_run import LaunchError, run_local
from workbench.models.jax_mlp import build_problem, mlp_loss

from programs import rank_env
from programs.jax_fsdp_check import CONFIGS, make_optimizer, parse_args

STEPS = 3
COMMUNICATION_SIZE = 256  # bytes: the worker's default, 2 buckets for its MLP


def jax_plan(num_processes: int = 2):
    """A JAX plan whose ranks import this checkout's ``workbench`` whether or not it is installed, and the
    rank program (``programs``, under tests/)."""
    return plan_launch(num_processes, framework="jax", backend="gloo", env=rank_env())


def worker_argv(out_dir: Path, *extra: str) -> list[str]:
    """The same argv for every rank: coordinator, process count and id come from the plan's environment."""
    return ["-m", "programs.jax_fsdp_check", "--out", str(out_dir / "rank{process_id}.json"), "--steps", str(STEPS), *extra]


def reference_run(params, batch, opt_name, max_norm):
    """The same steps in one process on one device, without any mesh: (params, losses, grad norms)."""
    opt = make_optimizer(opt_name)

    @jax.jit
    def step(params, state):
        loss, grads = jax.value_and_grad(mlp_loss)(params, batch)
        norm = jnp.sqrt(sum(jnp.sum(g**2) for g in jax.tree_util.tree_leaves(grads)))
        if max_norm is not None:
            grads = jax.tree_util.tree_map(lambda g: g * jnp.minimum(max_norm / (norm + 1e-6), 1.0), grads)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss, norm

    state, losses, norms = opt.init(params), [], []
    for _ in range(STEPS):
        params, state, loss, norm = step(params, state)
        losses.append(float(loss))
        norms.append(float(norm))
    return {p: np.asarray(a) for p, a in zip(spec_from_jax(params).paths, jax.tree_util.tree_leaves(params))}, losses, norms


def assert_params_close(actual: dict, expected: dict, what: str, rtol: float = 1e-6) -> None:
    assert actual.keys() == expected.keys()
    for path, e in expected.items():
        e = np.asarray(e, np.float64)
        np.testing.assert_allclose(np.asarray(actual[path]), e, rtol=rtol, atol=rtol * np.abs(e).max(),
                                   err_msg=f"{what} {path}")


def test_two_processes_fsdp_equals_ddp_and_single_process_reference(tmp_path):
    run_local(jax_plan(2), worker_argv(tmp_path), timeout_s=120, workdir=tmp_path)
    records = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(2)]
    for i, r in enumerate(records):
        assert (r["process_id"], r["num_processes"], r["num_devices"], r["num_local_devices"]) == (i, 2, 2, 1)
        assert r["gloo_bound_to"] == "127.0.0.1"
        assert set(r["results"]) == set(CONFIGS)
    strip = [{k: {f: v for f, v in res.items() if f != "wall_s"} for k, res in r["results"].items()} for r in records]
    assert strip[0] == strip[1], "replicated parameters and metrics must agree exactly across processes"

    params, batch = build_problem(0)
    num_buckets = plan_buckets(spec_from_jax(params), COMMUNICATION_SIZE).num_buckets
    assert num_buckets == 2
    results, references = records[0]["results"], {}
    for name, (kind, layout, opt, max_norm) in CONFIGS.items():
        res = results[name]
        if (opt, max_norm) not in references:
            references[opt, max_norm] = reference_run(params, batch, opt, max_norm)
        ref_params, ref_losses, ref_norms = references[opt, max_norm]
        assert max_norm is None or max(ref_norms) > max_norm, "clipping must be active"
        assert_params_close(res["params"], ref_params, f"{name} vs single process")
        np.testing.assert_allclose(res["losses"], ref_losses, rtol=1e-6)
        np.testing.assert_allclose(res["grad_norms"], ref_norms, rtol=1e-6)
        if kind == "fsdp":
            assert_params_close(res["params"], results[f"ddp-{opt}"]["params"], f"{name} vs DDP")
            np.testing.assert_allclose(res["grad_norms"], results[f"ddp-{opt}"]["grad_norms"], rtol=1e-6)
            assert res["num_buckets"] == num_buckets
            assert res["num_collectives"] == 2 * num_buckets + (max_norm is not None)
        else:
            assert res["num_collectives"] == len(ref_params)
    assert not np.allclose(results["fsdp-row-sgd"]["params"]["l0.w"], params["l0"]["w"])
    # The default reduce-scatter on CPU (all-to-all, the faster over gloo) and XLA's psum_scatter compute
    # the same step (to the last bit or so: XLA fuses the two differently).
    assert {"fsdp-row-rs-adamw", "fsdp-flat-rs-sgd"} <= set(results)
    assert_params_close(results["fsdp-row-rs-adamw"]["params"], results["fsdp-row-adamw"]["params"], "psum_scatter vs auto")
    assert_params_close(results["fsdp-flat-rs-sgd"]["params"], results["fsdp-flat-sgd"]["params"], "psum_scatter vs auto")


def test_a_failing_rank_stops_the_run_and_reports_its_output(tmp_path):
    """Rank 1 dies at once (a malformed process id in its environment); rank 0, waiting for it
    at the coordinator, is stopped."""
    plan = jax_plan(2)
    plan = dataclasses.replace(plan, rank_env=(plan.rank_env[0], {**plan.rank_env[1], "WORKBENCH_PROCESS_ID": "one"}))
    start = time.monotonic()
    with pytest.raises(LaunchError, match=r"(?s)rank 1 of 2 exited with code 2.*WORKBENCH_PROCESS_ID='one'") as info:
        run_local(plan, worker_argv(tmp_path), timeout_s=120, workdir=tmp_path)
    assert time.monotonic() - start < 30
    assert info.value.rank == 1


def test_a_hung_run_times_out_and_stops_every_rank(tmp_path):
    """Both ranks wait at the coordinator for a third process (the flag overrides the plan's
    count) that never starts: the run must time out, not hang."""
    start = time.monotonic()
    with pytest.raises(LaunchError, match=r"timed out after 3 s \(ranks \[0, 1\] still running, stopped\)") as info:
        run_local(jax_plan(2), worker_argv(tmp_path, "--num-processes", "3"), timeout_s=3, workdir=tmp_path)
    assert time.monotonic() - start < 30
    assert info.value.rank is None
    assert not list(tmp_path.glob("rank*.json"))


def test_worker_reads_the_plan_environment_and_flags_override_it():
    plan = jax_plan(2)
    args = [parse_args(["--out", "r{process_id}.json"], env) for env in plan.rank_env]
    assert [(a.coordinator, a.num_processes, a.process_id, a.backend, a.out) for a in args] == [
        (plan.coordinator, 2, r, "gloo", f"r{r}.json") for r in range(2)]
    a = parse_args(["--out", "o.json", "--coordinator", "h:1", "--num-processes", "3", "--process-id", "2"], plan.rank_env[0])
    assert (a.coordinator, a.num_processes, a.process_id) == ("h:1", 3, 2)
    with pytest.raises(SystemExit):
        parse_args(["--out", "o.json"], {})


@pytest.mark.parametrize("missing", ["module", "attribute"])
def test_bind_gloo_to_returns_false_when_jax_moves_its_private_hook(monkeypatch, missing):
    import sys

    import jax._src
    from jax._src import xla_bridge

    if missing == "module":  # ``from jax._src import xla_bridge`` raises ImportError
        monkeypatch.delattr(jax._src, "xla_bridge")
        monkeypatch.setitem(sys.modules, "jax._src.xla_bridge", None)
    else:  # ``xla_bridge._jax`` is gone: AttributeError
        monkeypatch.delattr(xla_bridge, "_jax")
    assert bind_gloo_to("127.0.0.1") is False
