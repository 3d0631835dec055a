"""The shipped example: the token file script and the tiny MLP factories (examples/), the same model in MLX and
JAX (same parameter paths, shapes and count by spec_from_mlx / spec_from_nnx, same loss and gradients)."""

from __future__ import annotations

import hashlib
import importlib
import math
import sys

import numpy as np
import pytest

from workbench.core.paths import REPO_ROOT
from workbench.models.tokens import load_token_file, sample_batch

TOKENS = REPO_ROOT / "examples" / "data" / "markov_v256.bin"
NUM_PARAMS = 256 * 32 + 64 * 32 + 64 + 32 * 64 + 32 + 256 * 32  # embed, fc1, fc2, head


@pytest.fixture(scope="module")
def example():
    return importlib.import_module("examples.tiny_mlp_lm")


@pytest.fixture(scope="module")
def batch(example):
    data = load_token_file(TOKENS, vocab_size=example.VOCAB_SIZE)
    b = sample_batch(data, step=0, global_batch=4, seq_len=16, seed=0)
    return b[:, :-1], b[:, 1:]


def make_token_file():
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    try:
        return importlib.import_module("make_token_file")
    finally:
        sys.path.pop(0)


def test_the_committed_token_file_is_what_the_script_writes(tmp_path):
    script = make_token_file()
    assert script.main(["--out", str(tmp_path / "t.bin")]) == 0
    assert (tmp_path / "t.bin").read_bytes() == TOKENS.read_bytes()
    data = load_token_file(TOKENS, vocab_size=256)
    assert (data.layout, data.dtype, len(data)) == ("raw", "uint16", 65536)
    assert hashlib.sha256(TOKENS.read_bytes()).hexdigest().startswith("475869117a2a8f0c")


def test_the_script_tokenises_text_by_bytes(tmp_path):
    (tmp_path / "notes.txt").write_text("hello, workbench\n")
    assert make_token_file().main(["--text", str(tmp_path / "notes.txt"), "--out", str(tmp_path / "n.npy")]) == 0
    data = load_token_file(tmp_path / "n.npy", vocab_size=256)
    assert bytes(np.asarray(data.tokens, dtype=np.uint8)) == b"hello, workbench\n" and data.dtype == "uint16"


def test_both_factories_describe_the_same_parameters(example):
    from workbench.adapters.jax.base import spec_from_nnx
    from workbench.adapters.mlx.base import spec_from_mlx

    mlx_spec = spec_from_mlx(example.mlx_factory()[0])
    jax_spec = spec_from_nnx(example.jax_factory()[0])
    assert mlx_spec.num_params == jax_spec.num_params == NUM_PARAMS == 20_576
    shapes = {p: tuple(s) for p, s in example.param_shapes().items()}
    assert {p.path: p.shape for p in mlx_spec} == {p.path: p.shape for p in jax_spec} == shapes
    assert {p.dtype for p in mlx_spec} == {p.dtype for p in jax_spec} == {"float32"}


def test_one_forward_and_loss_agree_across_frameworks(example, batch):
    import jax
    import jax.numpy as jnp
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    inputs, targets = batch
    mlx_model, mlx_loss = example.mlx_factory()
    loss_m, grads_m = nn.value_and_grad(mlx_model, mlx_loss)(mlx_model, mx.array(inputs), mx.array(targets))
    assert mlx_model(mx.array(inputs)).shape == (4, 16, 256)

    jax_model, jax_loss = example.jax_factory()
    params = example.jax_params(jax_model)
    loss_j, grads_j = jax.value_and_grad(jax_loss)(params, (jnp.asarray(inputs), jnp.asarray(targets)))
    assert jax_model(jnp.asarray(inputs)).shape == (4, 16, 256)

    assert math.log(256) - 1 < float(loss_m) < math.log(256) + 3
    np.testing.assert_allclose(float(loss_m), float(loss_j), rtol=1e-5)
    for path, g in tree_flatten(grads_m):
        np.testing.assert_allclose(np.array(g), np.asarray(grads_j[path]), rtol=1e-4, atol=1e-6, err_msg=path)


def test_a_seed_is_one_model_in_both_frameworks(example):
    a, b = example.init_params(0), example.init_params(1)
    assert all(np.array_equal(x, y) for x, y in zip(a.values(), example.init_params(0).values()))
    assert not np.array_equal(a["embed.weight"], b["embed.weight"])
    jax_model, _ = example.jax_factory(seed=1)
    np.testing.assert_array_equal(np.asarray(example.jax_params(jax_model)["fc1.weight"]), b["fc1.weight"])
