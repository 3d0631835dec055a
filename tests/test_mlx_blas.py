"""MLX's CPU ranks on OpenBLAS (workbench.adapters.mlx.blas): the launch plan preloads the shim on this machine
only, a bad choice is refused naming the variable, and a process given the plan's environment computes MLX's
float32 and complex64 products (plain and transposed) as numpy does, and says which BLAS it ran."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.adapters.mlx.blas import BLAS_ENV, SHIM_NAME, blas_choice, expected_blas, mlx_rank_env
from workbench.launch.plan import plan_launch


def test_a_bad_choice_is_refused_naming_the_variable_before_any_rank_starts(monkeypatch):
    monkeypatch.setenv(BLAS_ENV, "mkl")
    with pytest.raises(ValueError, match=r"\$WORKBENCH_MLX_BLAS='mkl': choose one of openblas, reference"):
        plan_launch(2, framework="mlx")
    plan_launch(2, framework="jax")  # JAX ranks never read it


def test_the_reference_choice_and_remote_hosts_preload_nothing(monkeypatch):
    remote = plan_launch(2, framework="mlx", host="10.0.0.2", ports=[5000, 5001])  # not this machine's file
    assert "LD_PRELOAD" not in remote.rank_env[0]
    monkeypatch.setenv(BLAS_ENV, "reference")
    assert blas_choice() == "reference" and mlx_rank_env() == {} and expected_blas() == "reference"
    assert all("LD_PRELOAD" not in env for env in plan_launch(2, framework="mlx").rank_env)


def test_local_mlx_ranks_preload_the_shim_before_a_preload_already_set(monkeypatch):
    # This machine: Linux, mlx[cpu] with netlib's libblas, scipy-openblas32 and a C compiler (as CI's).
    monkeypatch.delenv(BLAS_ENV, raising=False)  # the default, whatever the developer's shell says
    monkeypatch.setenv("LD_PRELOAD", "/opt/other.so")
    envs = plan_launch(2, framework="mlx").rank_env
    first, *rest = envs[0]["LD_PRELOAD"].split(":")
    assert Path(first).name == SHIM_NAME and Path(first).is_file() and rest == ["/opt/other.so"]
    assert envs[1]["LD_PRELOAD"] == envs[0]["LD_PRELOAD"] and expected_blas().startswith("openblas ")
    assert "LD_PRELOAD" not in plan_launch(2, framework="jax").rank_env[0]


PROBE = """
import json, numpy as np, mlx.core as mx
from workbench.adapters.mlx.blas import blas_in_use
rng = np.random.default_rng(0)
a, b = rng.standard_normal((96, 160)).astype(np.float32), rng.standard_normal((160, 72)).astype(np.float32)
ca = (a + 1j * a[::-1]).astype(np.complex64); cb = (b - 2j * b[::-1]).astype(np.complex64)
at = mx.transpose(mx.array(a.T.copy()))  # a transposed operand: the shim passes the layout flags through
out = {"blas": blas_in_use(),
       "sgemm": float(np.abs(np.array(mx.array(a) @ mx.array(b)) - a.astype(np.float64) @ b).max()),
       "sgemm_t": float(np.abs(np.array(at @ mx.array(b)) - a.astype(np.float64) @ b).max()),
       "cgemm": float(np.abs(np.array(mx.array(ca) @ mx.array(cb)) - ca.astype(np.complex128) @ cb).max())}
print(json.dumps(out))
"""


@pytest.mark.parametrize("choice", ["openblas", "reference"])
def test_a_rank_given_the_plan_computes_as_numpy_does_and_names_its_blas(choice, monkeypatch):
    monkeypatch.setenv(BLAS_ENV, choice)
    env = dict(os.environ)
    rank_env = plan_launch(1, framework="mlx").rank_env[0] if choice == "openblas" else {}
    env.update(rank_env)
    if choice == "reference":
        env.pop("LD_PRELOAD", None)
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["blas"] == (expected_blas() if choice == "openblas" else "reference")
    assert out["sgemm"] < 1e-3 and out["sgemm_t"] < 1e-3 and out["cgemm"] < 1e-3, out  # float32 of sums of 160
