"""A small causal-attention LM, in MLX and in JAX, with the same weights: a user's model the workbench did not write.

Two pre-norm transformer blocks (width 96, 4 heads, MLP 384), learned positions, an untied head over a
vocabulary of 384, sequences of 128 tokens: the model of issue 26, whose activations (the ``(B, H, T, T)``
attention scores, the logits) are most of a rank's peak. Attention is written out (scores, causal mask,
softmax, weighted values), as a user would write it, so every intermediate is an array the backward keeps.

Parameters, by dotted path, the same in both frameworks (``(out, in)`` matrices, as ``mlx.nn.Linear``)::

    embed.weight (384, 96)  pos.weight (128, 96)
    blocks.<i>.ln1.{weight,bias} (96,)  blocks.<i>.attn.{q,k,v,o}.weight (96, 96)
    blocks.<i>.ln2.{weight,bias} (96,)  blocks.<i>.fc1.weight (384, 96) .bias (384,)
    blocks.<i>.fc2.weight (96, 384) .bias (96,)  ln_f.{weight,bias} (96,)  head.weight (384, 96)

Factories, the contract of :mod:`examples.tiny_mlp_lm`: :func:`mlx_factory` and :func:`jax_factory`
return ``(model, loss_fn)``; the loss is mean next-token cross-entropy in nats, fp32.
"""

from __future__ import annotations

import math

import numpy as np

VOCAB_SIZE = 384
SEQ_LEN = 128
WIDTH = 96
NUM_HEADS = 4
HIDDEN = 384
NUM_BLOCKS = 2
LN_EPS = 1e-5


def param_shapes() -> dict[str, tuple[int, ...]]:
    """``{dotted path: shape}`` of every parameter, in the order :func:`init_params` draws them."""
    shapes = {"embed.weight": (VOCAB_SIZE, WIDTH), "pos.weight": (SEQ_LEN, WIDTH)}
    for i in range(NUM_BLOCKS):
        b = f"blocks.{i}."
        shapes.update({b + "ln1.weight": (WIDTH,), b + "ln1.bias": (WIDTH,),
                       **{f"{b}attn.{n}.weight": (WIDTH, WIDTH) for n in "qkvo"},
                       b + "ln2.weight": (WIDTH,), b + "ln2.bias": (WIDTH,),
                       b + "fc1.weight": (HIDDEN, WIDTH), b + "fc1.bias": (HIDDEN,),
                       b + "fc2.weight": (WIDTH, HIDDEN), b + "fc2.bias": (WIDTH,)})
    shapes.update({"ln_f.weight": (WIDTH,), "ln_f.bias": (WIDTH,), "head.weight": (VOCAB_SIZE, WIDTH)})
    return shapes


def init_params(seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded float32 weights: normal, std ``1 / sqrt(fan_in)`` (embeddings 0.02); norms at 1 and 0, biases 0."""
    rng = np.random.default_rng(seed)
    out = {}
    for path, shape in param_shapes().items():
        if path.endswith(".bias"):
            out[path] = np.zeros(shape, np.float32)
        elif len(shape) == 1:  # a norm's scale
            out[path] = np.ones(shape, np.float32)
        else:
            scale = 0.02 if path.startswith(("embed", "pos")) else shape[-1] ** -0.5
            out[path] = (rng.standard_normal(shape) * scale).astype(np.float32)
    return out


def mlx_factory(seed: int = 0):
    """``(model, loss_fn)`` in MLX; see the module docstring."""
    import mlx.core as mx
    import mlx.nn as nn

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v, self.o = (nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(4))

        def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
            b, t, _ = x.shape
            heads = [f(x).reshape(b, t, NUM_HEADS, -1).transpose(0, 2, 1, 3) for f in (self.q, self.k, self.v)]
            q, k, v = heads
            scores = (q @ k.transpose(0, 1, 3, 2)) * (1 / math.sqrt(WIDTH // NUM_HEADS)) + mask
            out = mx.softmax(scores, axis=-1) @ v
            return self.o(out.transpose(0, 2, 1, 3).reshape(b, t, WIDTH))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(WIDTH, eps=LN_EPS), nn.LayerNorm(WIDTH, eps=LN_EPS)
            self.attn = Attention()
            self.fc1, self.fc2 = nn.Linear(WIDTH, HIDDEN), nn.Linear(HIDDEN, WIDTH)

        def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
            x = x + self.attn(self.ln1(x), mask)
            return x + self.fc2(nn.gelu(self.fc1(self.ln2(x))))

    class TinyAttentionLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.pos = nn.Embedding(VOCAB_SIZE, WIDTH), nn.Embedding(SEQ_LEN, WIDTH)
            self.blocks = [Block() for _ in range(NUM_BLOCKS)]
            self.ln_f, self.head = nn.LayerNorm(WIDTH, eps=LN_EPS), nn.Linear(WIDTH, VOCAB_SIZE, bias=False)

        def __call__(self, inputs: mx.array) -> mx.array:
            t = inputs.shape[1]
            mask = mx.triu(mx.full((t, t), -1e9, dtype=mx.float32), k=1)
            x = self.embed(inputs) + self.pos(mx.arange(t))
            for block in self.blocks:
                x = block(x, mask)
            return self.head(self.ln_f(x))

    def loss_fn(model: TinyAttentionLM, inputs: mx.array, targets: mx.array) -> mx.array:
        logits = model(inputs).astype(mx.float32)
        picked = mx.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
        return mx.mean(mx.logsumexp(logits, axis=-1) - picked)

    model = TinyAttentionLM()
    model.load_weights([(path, mx.array(value)) for path, value in init_params(seed).items()], strict=True)
    mx.eval(model.parameters())
    return model, loss_fn


def _layer_norm(x, weight, bias):
    import jax.numpy as jnp

    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + LN_EPS) * weight + bias


def jax_apply(params, inputs):
    """Logits ``(B, T, VOCAB_SIZE)`` from the flat parameter dict and ``(B, T)`` int tokens."""
    import jax
    import jax.numpy as jnp

    b, t = inputs.shape
    mask = jnp.triu(jnp.full((t, t), -1e9, jnp.float32), k=1)
    x = params["embed.weight"][inputs] + params["pos.weight"][:t]
    for i in range(NUM_BLOCKS):
        p = {k[len(f"blocks.{i}."):]: v for k, v in params.items() if k.startswith(f"blocks.{i}.")}
        h = _layer_norm(x, p["ln1.weight"], p["ln1.bias"])
        q, k, v = (jnp.transpose((h @ p[f"attn.{n}.weight"].T).reshape(b, t, NUM_HEADS, -1), (0, 2, 1, 3))
                   for n in "qkv")
        scores = (q @ jnp.swapaxes(k, -1, -2)) * (1 / math.sqrt(WIDTH // NUM_HEADS)) + mask
        out = jnp.transpose(jax.nn.softmax(scores, axis=-1) @ v, (0, 2, 1, 3)).reshape(b, t, WIDTH)
        x = x + out @ p["attn.o.weight"].T
        h = _layer_norm(x, p["ln2.weight"], p["ln2.bias"])
        hidden = jax.nn.gelu(h @ p["fc1.weight"].T + p["fc1.bias"], approximate=False)
        x = x + hidden @ p["fc2.weight"].T + p["fc2.bias"]
    return _layer_norm(x, params["ln_f.weight"], params["ln_f.bias"]) @ params["head.weight"].T


def jax_loss(params, batch):
    """Mean next-token cross-entropy in fp32: ``loss_fn(params, (inputs, targets))``."""
    import jax
    import jax.numpy as jnp

    inputs, targets = batch
    logits = jax_apply(params, inputs).astype(jnp.float32)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - picked)


def jax_factory(seed: int = 0):
    """``(model, loss_fn)`` in JAX: a flax NNX module holding every parameter at its path, and :func:`jax_loss`."""
    import jax.numpy as jnp
    from flax import nnx

    class Holder(nnx.Module):  # one per path segment, an nnx.Param at each leaf; blocks in an nnx.List
        pass

    root = Holder()
    for path, value in init_params(seed).items():
        node, *parts, leaf = [root, *path.split(".")]
        for part, after in zip(parts, parts[1:] + [leaf]):
            if isinstance(node, nnx.List):
                node = node[int(part)]
                continue
            if not hasattr(node, part):
                setattr(node, part, nnx.List([Holder() for _ in range(NUM_BLOCKS)]) if after.isdigit() else Holder())
            node = getattr(node, part)
        setattr(node, leaf, nnx.Param(jnp.asarray(value)))
    return root, jax_loss
