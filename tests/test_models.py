"""The reference LM: one NumPy init, the same loss and gradients in MLX and JAX."""

import functools
import math

import jax
import jax.numpy as jnp
import mlx.core as mx
import mlx.nn as mlx_nn
import numpy as np
import pytest
from flax import nnx
from mlx.utils import tree_flatten

from workbench.adapters.jax.base import spec_from_nnx
from workbench.adapters.mlx.base import spec_from_mlx
from workbench.models import LMConfig, init_lm_params, jax_lm, jax_nnx, lm_param_shapes, mlx_lm, num_params

CONFIG = LMConfig(vocab_size=64, seq_len=16, dim=32, num_layers=2, num_heads=4, mlp_dim=64)
# One layer: on CPU, XLA compiles of a gradient take seconds per layer.
TIED = LMConfig(vocab_size=64, seq_len=16, dim=32, num_layers=1, num_heads=4, mlp_dim=64, tie_embeddings=True)
BATCH = 4


def _batch(config, seed=1, length=None):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, config.vocab_size, (BATCH, (length or config.seq_len) + 1), dtype=np.int32)
    return tokens[:, :-1], tokens[:, 1:]


def _mlx_model(config, seed=0):
    return mlx_lm.load_params(mlx_lm.MLXLM(config), init_lm_params(config, seed))


def _mlx_loss_and_grads(model, inputs, targets):
    loss, grads = mlx_nn.value_and_grad(model, mlx_lm.lm_loss)(model, mx.array(inputs), mx.array(targets))
    return float(loss), {k: np.array(v) for k, v in tree_flatten(grads)}


@functools.cache
def _jax_value_and_grad(config):
    return jax.jit(jax.value_and_grad(jax_lm.make_loss_fn(config)))


def _jax_loss_and_grads(params, inputs, targets, config):
    loss, grads = _jax_value_and_grad(config)(params, (jnp.asarray(inputs), jnp.asarray(targets)))
    return float(loss), {k: np.asarray(grads[k]) for k in params}  # jax returns dicts in sorted key order


def test_mlx_paths_are_init_paths_in_order():
    config = LMConfig(vocab_size=64, seq_len=16, dim=32, num_layers=11, num_heads=4, mlp_dim=64)
    model = mlx_lm.MLXLM(config)
    expected = list(init_lm_params(config, 0))
    assert [p for p, _ in tree_flatten(model.trainable_parameters())] == expected
    assert [p.path for p in spec_from_mlx(model).params] == expected
    assert list(lm_param_shapes(config)) == expected
    assert expected[:3] == ["embed.weight", "pos_embed.weight", "layers.0.attn_norm.weight"]
    assert expected[-2:] == ["norm.weight", "head.weight"]


def test_tied_model_has_no_head():
    assert "head.weight" not in init_lm_params(TIED, 0)
    assert [p for p, _ in tree_flatten(mlx_lm.MLXLM(TIED).trainable_parameters())] == list(init_lm_params(TIED, 0))


def test_jax_module_holds_init_params():
    model = jax_nnx.JaxLM(CONFIG, seed=3)
    init = init_lm_params(CONFIG, 3)
    flat = jax_nnx.params_from_model(model)
    assert list(flat) == list(init)
    assert all(np.array_equal(np.asarray(flat[k]), init[k]) for k in init)
    assert {p.path for p in spec_from_nnx(model).params} == set(init)
    jax_nnx.load_params(model, init_lm_params(CONFIG, 4))
    assert np.array_equal(np.asarray(jax_nnx.params_from_model(model)["head.weight"]), init_lm_params(CONFIG, 4)["head.weight"])


def test_load_params_rejects_wrong_dicts():
    init = init_lm_params(CONFIG, 0)
    with pytest.raises(ValueError, match="head.weight"):
        jax_nnx.load_params(jax_nnx.JaxLM(CONFIG), {k: v for k, v in init.items() if k != "head.weight"})
    with pytest.raises(ValueError, match="norm.weight"):
        jax_nnx.load_params(jax_nnx.JaxLM(CONFIG), {**init, "norm.weight": np.ones(7, np.float32)})
    with pytest.raises(ValueError):
        mlx_lm.load_params(mlx_lm.MLXLM(CONFIG), {k: v for k, v in init.items() if k != "head.weight"})


def test_num_params_and_sizes():
    v, t, d, f, n = 64, 16, 32, 64, 2
    assert num_params(CONFIG) == 2 * v * d + t * d + n * (2 * d + 4 * d * d + 2 * d * f) + d
    assert num_params(TIED) == num_params(CONFIG) - v * d - (2 * d + 4 * d * d + 2 * d * f)
    params = init_lm_params(CONFIG, 0)
    assert num_params(CONFIG) == sum(a.size for a in params.values())
    assert num_params(CONFIG) == sum(a.size for _, a in tree_flatten(mlx_lm.MLXLM(CONFIG).parameters()))
    assert all(a.size % 8 == 0 and a.dtype == np.float32 for a in params.values())  # row layout up to 8 ranks


def test_init_is_seeded():
    a, b, c = init_lm_params(CONFIG, 0), init_lm_params(CONFIG, 0), init_lm_params(CONFIG, 1)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["embed.weight"], c["embed.weight"])
    assert np.all(a["norm.weight"] == 1)
    assert abs(a["embed.weight"].std() - 0.02) < 0.002


@pytest.mark.parametrize(
    "field,kwargs",
    [("vocab_size", {"vocab_size": 0}), ("seq_len", {"seq_len": -1}), ("dim", {"dim": 32.0}),
     ("num_layers", {"num_layers": True}), ("num_heads", {"num_heads": 5}), ("mlp_dim", {"mlp_dim": None}),
     ("tie_embeddings", {"tie_embeddings": 1})],
)
def test_bad_config_names_the_field(field, kwargs):
    base = dict(vocab_size=64, seq_len=16, dim=32, num_layers=2, num_heads=4, mlp_dim=64)
    with pytest.raises(ValueError, match=f"LMConfig.{field}"):
        LMConfig(**{**base, **kwargs})


@pytest.mark.parametrize("config", [CONFIG, TIED], ids=["untied", "tied"])
def test_mlx_and_jax_agree(config):
    inputs, targets = _batch(config)
    mlx_loss, mlx_grads = _mlx_loss_and_grads(_mlx_model(config, seed=7), inputs, targets)
    params = {k: jnp.asarray(v) for k, v in init_lm_params(config, 7).items()}
    jax_loss, jax_grads = _jax_loss_and_grads(params, inputs, targets, config)
    assert abs(mlx_loss - jax_loss) < 1e-5
    assert list(mlx_grads) == list(jax_grads)
    for path, g in mlx_grads.items():
        scale = np.abs(jax_grads[path]).max()
        assert scale > 0, path
        assert np.abs(g - jax_grads[path]).max() <= 1e-4 * scale, path


def test_jax_module_matches_pure_function():
    model = jax_nnx.JaxLM(CONFIG, seed=7)
    inputs, targets = _batch(CONFIG)

    def module_loss(m):
        logits = m(jnp.asarray(inputs)).astype(jnp.float32)
        picked = jnp.take_along_axis(logits, jnp.asarray(targets)[..., None], axis=-1)[..., 0]
        return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - picked)

    loss, grads = nnx.jit(nnx.value_and_grad(module_loss))(model)
    ref_loss, ref_grads = _jax_loss_and_grads(jax_nnx.params_from_model(model), inputs, targets, CONFIG)
    assert float(loss) == pytest.approx(ref_loss, abs=1e-6)
    np.testing.assert_allclose(np.asarray(grads.layers[1].mlp.w_in.weight[...]), ref_grads["layers.1.mlp.w_in.weight"],
                               rtol=1e-5, atol=1e-7)


def test_loss_at_init_is_near_log_vocab():
    inputs, targets = _batch(CONFIG)
    mlx_loss = float(mlx_lm.lm_loss(_mlx_model(CONFIG), mx.array(inputs), mx.array(targets)))
    jax_loss, _ = _jax_loss_and_grads(jax_nnx.params_from_model(jax_nnx.JaxLM(CONFIG)), inputs, targets, CONFIG)
    assert abs(mlx_loss - math.log(CONFIG.vocab_size)) < 0.05
    assert abs(jax_loss - math.log(CONFIG.vocab_size)) < 0.05


def test_causal_in_both_frameworks():
    inputs, _ = _batch(CONFIG, length=12)
    changed = inputs.copy()
    changed[:, 8] = (changed[:, 8] + 1) % CONFIG.vocab_size
    mlx_model = _mlx_model(CONFIG)
    params = jax_nnx.params_from_model(jax_nnx.JaxLM(CONFIG))
    jax_logits = jax.jit(functools.partial(jax_lm.lm_logits_fn, config=CONFIG))
    for logits in (lambda x: np.array(mlx_model(mx.array(x))), lambda x: np.asarray(jax_logits(params, x))):
        before, after = logits(inputs), logits(changed)
        assert before.shape == (BATCH, 12, CONFIG.vocab_size)
        np.testing.assert_array_equal(before[:, :8], after[:, :8])
        assert np.abs(before[:, 8:] - after[:, 8:]).max() > 1e-4


def test_inputs_longer_than_seq_len_raise():
    inputs = np.zeros((1, CONFIG.seq_len + 1), np.int32)
    with pytest.raises(ValueError, match="seq_len"):
        _mlx_model(CONFIG)(mx.array(inputs))
    with pytest.raises(ValueError, match="seq_len"):
        jax_lm.lm_logits_fn(init_lm_params(CONFIG, 0), inputs, config=CONFIG)


def test_one_sgd_step_decreases_loss_in_both():
    lr = 0.5
    inputs, targets = _batch(CONFIG)
    model = _mlx_model(CONFIG)
    loss0, grads = _mlx_loss_and_grads(model, inputs, targets)
    params = init_lm_params(CONFIG, 0)
    mlx_lm.load_params(model, {k: params[k] - lr * grads[k] for k in params})
    loss1 = float(mlx_lm.lm_loss(model, mx.array(inputs), mx.array(targets)))
    jparams = {k: jnp.asarray(v) for k, v in params.items()}
    jloss0, jgrads = _jax_loss_and_grads(jparams, inputs, targets, CONFIG)
    jloss1, _ = _jax_loss_and_grads({k: jparams[k] - lr * jgrads[k] for k in jparams}, inputs, targets, CONFIG)
    assert loss1 < loss0 - 1e-3 and jloss1 < jloss0 - 1e-3
    assert abs(loss1 - jloss1) < 1e-5
