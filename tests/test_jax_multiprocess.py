"""Two real JAX processes (one CPU device each, gloo over 127.0.0.1) run DDP and FSDP.

FSDP (row and flat; SGD and AdamW with clipping) must equal DDP, and both must equal a
single-process reference written out here. The launcher never hangs: a failing worker
or a timeout kills every worker and raises with their output.
"""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from workbench.adapters.jax import spec_from_jax
from workbench.buckets import plan_buckets
from workbench.jax_worker import CONFIGS, build_problem, make_optimizer, mlp_loss

REPO = Path(__file__).resolve().parents[1]
STEPS = 3
COMMUNICATION_SIZE = 256  # bytes: the worker's default, 2 buckets for its MLP


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_workers(out_dir: Path, argvs: list[list[str]], timeout_s: float) -> None:
    """Run one ``python -m workbench.jax_worker`` per argv and wait for all of them.

    Raises:
        RuntimeError: a worker exited non-zero (the others are killed at once).
        TimeoutError: not all finished within ``timeout_s`` seconds (all are killed).
        Both messages hold every worker's exit code and output.
    """
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    procs, logs, error = [], [], None
    try:
        for i, argv in enumerate(argvs):
            logs.append(open(out_dir / f"worker{i}.log", "w+b"))
            procs.append(subprocess.Popen([sys.executable, "-m", "workbench.jax_worker", *argv], cwd=REPO, env=env,
                                          stdin=subprocess.DEVNULL, stdout=logs[-1], stderr=subprocess.STDOUT))
        deadline = time.monotonic() + timeout_s
        while error is None:
            codes = [p.poll() for p in procs]
            if all(c == 0 for c in codes):
                return
            failed = [i for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                error = RuntimeError, f"worker(s) {failed} failed"
            elif time.monotonic() > deadline:
                error = TimeoutError, f"workers still running after {timeout_s} s"
            else:
                time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait(timeout=30)
        outputs = []
        for i, (p, log) in enumerate(zip(procs, logs)):
            log.seek(0)
            outputs.append(f"--- worker {i} (exit {p.returncode}) ---\n{log.read().decode(errors='replace')[-4000:]}")
            log.close()
    if error is not None:
        raise error[0](error[1] + "\n" + "\n".join(outputs))


def worker_argvs(out_dir: Path, num_processes: int = 2, extra: list[list[str]] | None = None) -> list[list[str]]:
    common = ["--coordinator", f"127.0.0.1:{free_port()}", "--num-processes", str(num_processes), "--steps", str(STEPS)]
    extra = extra or [[] for _ in range(num_processes)]
    return [common + ["--process-id", str(i), "--out", str(out_dir / f"rank{i}.json"), *extra[i]]
            for i in range(num_processes)]


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
    argvs = worker_argvs(tmp_path)
    launch_workers(tmp_path, argvs, timeout_s=120)
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


def test_a_failing_worker_stops_the_run_and_reports_its_output(tmp_path):
    """Worker 1 dies at once (bad argument); worker 0, waiting for it at the coordinator, is killed."""
    argvs = worker_argvs(tmp_path, extra=[[], ["--steps", "three"]])
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"(?s)worker\(s\) \[1\] failed.*exit 2.*invalid int value: 'three'"):
        launch_workers(tmp_path, argvs, timeout_s=120)
    assert time.monotonic() - start < 30


def test_a_hung_run_times_out_and_kills_every_worker(tmp_path):
    """Only one of two processes starts: the other never joins, so the run must time out, not hang."""
    argv = worker_argvs(tmp_path)[:1]
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"(?s)still running after 3 s.*worker 0 \(exit -9\)"):
        launch_workers(tmp_path, argv, timeout_s=3)
    assert time.monotonic() - start < 30
