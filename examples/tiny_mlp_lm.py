"""A tiny next-token MLP over byte tokens, in MLX and in JAX (flax NNX), with the same weights.

The model: embed the current token, add an MLP of it (``tanh``, the same in both frameworks), and read
the logits of the next token through an untied head. It sees one token of context, so it learns the
bigram statistics of its data: enough to show a loss curve, and small enough (20,576 parameters) to train
in seconds on CPU.

Parameters, by dotted path, the same in both frameworks (``(out, in)`` matrices, as ``mlx.nn.Linear``)::

    embed.weight (256, 32)   fc1.weight (64, 32)   fc1.bias (64,)
    fc2.weight (32, 64)      fc2.bias (32,)        head.weight (256, 32)

Both factories load :func:`init_params` (NumPy, seeded), so one seed gives one model in both.

Factories, the contract a run's ``"module:function"`` names:

* :func:`mlx_factory` -> ``(model, loss_fn)``: an ``mlx.nn.Module`` and
  ``loss_fn(model, inputs, targets) -> scalar``, for ``mlx.nn.value_and_grad(model, loss_fn)``.
* :func:`jax_factory` -> ``(model, loss_fn)``: an ``nnx.Module`` holding the parameters at the same paths,
  and ``loss_fn(params, (inputs, targets)) -> scalar`` on the flat ``{dotted path: array}`` dict
  (:func:`jax_params`), the signature of the workbench's JAX DDP and FSDP steps.

``inputs`` and ``targets`` are ``(B, T)`` int tokens, ``batch[:, :-1]`` and ``batch[:, 1:]`` of a
:func:`workbench.models.tokens.sample_batch` batch; the loss is mean cross-entropy in nats per token, fp32.
"""

from __future__ import annotations

import numpy as np

VOCAB_SIZE = 256  # byte-level tokens, as scripts/make_token_file.py writes them
WIDTH = 32
HIDDEN = 64


def param_shapes() -> dict[str, tuple[int, ...]]:
    """``{dotted path: shape}`` of every parameter, in the order :func:`init_params` draws them."""
    return {"embed.weight": (VOCAB_SIZE, WIDTH), "fc1.weight": (HIDDEN, WIDTH), "fc1.bias": (HIDDEN,),
            "fc2.weight": (WIDTH, HIDDEN), "fc2.bias": (WIDTH,), "head.weight": (VOCAB_SIZE, WIDTH)}


def init_params(seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded float32 weights: normal with std ``1 / sqrt(fan_in)`` (embedding: 1), zero biases."""
    rng = np.random.default_rng(seed)
    out = {}
    for path, shape in param_shapes().items():
        if path.endswith(".bias"):
            out[path] = np.zeros(shape, np.float32)
        else:
            scale = 1.0 if path == "embed.weight" else shape[-1] ** -0.5
            out[path] = (rng.standard_normal(shape) * scale).astype(np.float32)
    return out


def mlx_factory(seed: int = 0):
    """``(model, loss_fn)`` in MLX; see the module docstring."""
    import mlx.core as mx
    import mlx.nn as nn

    class TinyMLPLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB_SIZE, WIDTH)
            self.fc1 = nn.Linear(WIDTH, HIDDEN)
            self.fc2 = nn.Linear(HIDDEN, WIDTH)
            self.head = nn.Linear(WIDTH, VOCAB_SIZE, bias=False)

        def __call__(self, inputs: mx.array) -> mx.array:
            x = self.embed(inputs)
            x = x + self.fc2(mx.tanh(self.fc1(x)))
            return self.head(x)

    def loss_fn(model: TinyMLPLM, inputs: mx.array, targets: mx.array) -> mx.array:
        logits = model(inputs).astype(mx.float32)
        picked = mx.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
        return mx.mean(mx.logsumexp(logits, axis=-1) - picked)

    model = TinyMLPLM()
    model.load_weights([(path, mx.array(value)) for path, value in init_params(seed).items()], strict=True)
    mx.eval(model.parameters())
    return model, loss_fn


def jax_apply(params, inputs):
    """Logits ``(B, T, VOCAB_SIZE)`` from the flat parameter dict and ``(B, T)`` int tokens."""
    import jax.numpy as jnp

    x = params["embed.weight"][inputs]
    h = jnp.tanh(x @ params["fc1.weight"].T + params["fc1.bias"])
    x = x + h @ params["fc2.weight"].T + params["fc2.bias"]
    return x @ params["head.weight"].T


def jax_loss(params, batch):
    """Mean next-token cross-entropy in fp32: ``loss_fn(params, (inputs, targets))``."""
    import jax
    import jax.numpy as jnp

    inputs, targets = batch
    logits = jax_apply(params, inputs).astype(jnp.float32)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - picked)


def jax_params(model) -> dict:
    """The NNX module's parameters as the flat ``{dotted path: array}`` dict :func:`jax_loss` takes."""
    return {path: getattr(getattr(model, path.split(".")[0]), path.split(".")[1])[...] for path in param_shapes()}


def jax_factory(seed: int = 0):
    """``(model, loss_fn)`` in JAX: a flax NNX module and :func:`jax_loss`; see the module docstring."""
    import jax.numpy as jnp
    from flax import nnx

    class Linear(nnx.Module):
        def __init__(self, weight: np.ndarray, bias: np.ndarray | None = None) -> None:
            self.weight = nnx.Param(jnp.asarray(weight))
            if bias is not None:
                self.bias = nnx.Param(jnp.asarray(bias))

    class TinyMLPLM(nnx.Module):
        def __init__(self, p: dict[str, np.ndarray]) -> None:
            self.embed = Linear(p["embed.weight"])
            self.fc1 = Linear(p["fc1.weight"], p["fc1.bias"])
            self.fc2 = Linear(p["fc2.weight"], p["fc2.bias"])
            self.head = Linear(p["head.weight"])

        def __call__(self, inputs):
            return jax_apply(jax_params(self), inputs)

    return TinyMLPLM(init_params(seed)), jax_loss
