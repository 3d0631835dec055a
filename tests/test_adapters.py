"""Adapters realise the core's plan on real frameworks; the core imports neither framework."""

import subprocess
import sys

import mlx.core as mx
import mlx.nn as mlx_nn
import mlx.nn.utils as mlx_utils
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx.utils import tree_flatten

from workbench import plan_buckets, plan_shards
from workbench.adapters.jax.base import spec_from_jax, spec_from_nnx
from workbench.adapters.mlx.base import spec_from_mlx

MLX_DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}


@st.composite
def mlx_trees(draw):
    dtype = MLX_DTYPES[draw(st.sampled_from(list(MLX_DTYPES)))]
    num_layers = draw(st.integers(1, 6))
    layers = []
    for _ in range(num_layers):
        layer = {}
        for name in draw(st.lists(st.sampled_from(["w", "b", "norm", "proj"]), min_size=1, max_size=4, unique=True)):
            shape = tuple(draw(st.lists(st.integers(1, 40), min_size=1, max_size=3)))
            layer[name] = mx.zeros(shape, dtype=dtype)
        layers.append(layer)
    return {"embed": mx.zeros((draw(st.integers(1, 64)), 8), dtype=dtype), "layers": layers}


@settings(max_examples=150, deadline=None)
@given(tree=mlx_trees(), cap=st.sampled_from([-1, 0, 1, 64, 500, 2_000, 10_000, 10**9]))
def test_mlx_policy_equals_mlx_group_by_size_on_random_trees(tree, cap):
    flat = tree_flatten(tree)
    keys, _, sizes, dtypes = mlx_utils._extract_info(flat)
    expected = mlx_utils._group_by_size(keys, sizes, dtypes[0].size, cap)
    spec = spec_from_mlx(tree)
    assert spec.paths == keys
    plan = plan_buckets(spec, cap)
    assert [plan.bucket(b).tolist() for b in range(plan.num_buckets)] == expected


def test_spec_from_mlx_module_uses_trainable_parameters_in_flatten_order():
    model = mlx_nn.Sequential(mlx_nn.Linear(6, 8), mlx_nn.LayerNorm(8), mlx_nn.Linear(8, 4, bias=False))
    model.layers[1].freeze()
    spec = spec_from_mlx(model)
    assert spec.paths == ["layers.0.weight", "layers.0.bias", "layers.2.weight"]
    assert [p.shape for p in spec] == [(8, 6), (8,), (4, 8)]
    assert spec.num_params == sum(v.size for _, v in tree_flatten(model.trainable_parameters()))
    assert len(spec_from_mlx(model, trainable_only=False)) == 5


def test_row_plan_matches_mlx_reshape_of_each_array():
    """Rank r's row slice of an array is exactly row r of ``x.reshape(N, -1)`` in MLX."""
    tree = {"a": mx.arange(24, dtype=mx.float32).reshape(4, 6), "b": mx.arange(8, dtype=mx.float32)}
    spec = spec_from_mlx(tree)
    plan = plan_shards(plan_buckets(spec, 0), 4, "row")
    flat = dict(tree_flatten(tree))
    for r in range(4):
        for s in plan.rank_slices(r):
            want = np.array(flat[s.path].reshape(4, -1)[r])
            got = np.array(flat[s.path].reshape(-1)[s.start : s.stop])
            np.testing.assert_array_equal(got, want)


def test_spec_from_jax_does_not_allocate():
    import jax
    import jax.numpy as jnp

    def init():  # 2 x 40 GB in fp32 if it were allocated
        return {"big": jnp.zeros((100_000, 100_000)), "head": [jnp.zeros((100_000, 100_000), jnp.bfloat16)]}

    spec = spec_from_jax(init, name="huge")
    assert spec.paths == ["big", "head.0"]
    assert spec.num_params == 2 * 10**10
    assert [p.dtype for p in spec] == ["float32", "bfloat16"]
    assert spec_from_jax(jax.eval_shape(init)).paths == spec.paths


def test_spec_from_nnx_module_and_factory():
    import jax.numpy as jnp
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.proj = nnx.Linear(4, 8, rngs=rngs)
            self.layers = nnx.List([nnx.Linear(8, 8, param_dtype=jnp.bfloat16, rngs=rngs) for _ in range(2)])

    spec = spec_from_nnx(lambda: Block(nnx.Rngs(0)))
    assert spec.name == "Block"
    assert spec.paths == ["layers.0.bias", "layers.0.kernel", "layers.1.bias", "layers.1.kernel", "proj.bias", "proj.kernel"]
    assert spec.num_params == 2 * (8 * 8 + 8) + 4 * 8 + 8
    assert spec_from_nnx(Block(nnx.Rngs(0))).paths == spec.paths


def test_import_workbench_without_mlx_or_jax():
    code = (
        "import sys\n"
        "for m in ('mlx', 'mlx.core', 'jax', 'flax', 'optax'): sys.modules[m] = None\n"
        "import workbench, workbench.core.presets\n"
        "from workbench import plan_buckets, plan_shards\n"
        "p = plan_shards(plan_buckets(workbench.core.presets.get_preset('gpt2')), 8, 'flat')\n"
        "print(p.buckets.num_buckets)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) > 1
