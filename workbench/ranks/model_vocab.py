"""Does a user's model hold the vocabulary its run declares? A token past an embedding's rows makes an
engine read out of bounds (a crash or garbage), not an error, so the driver checks before any engine
starts (:func:`check_model_vocab`, called by :func:`workbench.ranks.user_model.user_model_spec`).
"""

from __future__ import annotations

from typing import Iterable

#: Module names of a token embedding, and of an output head (a top-level module), in common model code.
EMBED_NAMES = ("embed", "embed_tokens", "embedding", "tok_embeddings", "token_embedding", "wte", "word_embeddings")
HEAD_NAMES = ("head", "lm_head", "output", "unembed")


def _is_position_table(path: str) -> bool:
    return any(w in path for w in ("pos", "position")) or path.split(".")[-2:-1] == ["wpe"]


def vocab_tables(model, params: Iterable[tuple[str, tuple[int, ...]]]) -> dict[str, tuple[str, int]]:
    """``{path: (what, tokens)}`` of the model's token embeddings and output head: MLX ``nn.Embedding``
    (and quantized) and NNX ``nnx.Embed`` modules, and 2-D parameters named as in :data:`EMBED_NAMES`
    (rows) or :data:`HEAD_NAMES` (outputs: a ``kernel`` is ``(in, out)``, a ``weight`` ``(out, in)``).
    Position tables (``pos``, ``position``, ``wpe`` in the path) are not token tables."""
    found: dict[str, tuple[str, int]] = {}
    if hasattr(model, "named_modules"):  # MLX
        for name, module in model.named_modules():
            if type(module).__name__ in ("Embedding", "QuantizedEmbedding"):
                rows = getattr(module, "num_embeddings", None) or module.weight.shape[0]
                found[f"{name}.weight" if name else "weight"] = ("token embedding", int(rows))
    else:  # NNX
        from flax import nnx

        for path, node in nnx.iter_graph(model):
            if isinstance(node, nnx.Embed):
                found[".".join(map(str, (*path, "embedding")))] = ("token embedding", int(node.num_embeddings))
    for path, shape in params:
        parts = path.split(".")
        if len(shape) != 2 or len(parts) < 2 or path in found:
            continue
        if parts[-2] in EMBED_NAMES and parts[-1] in ("weight", "embedding"):
            found[path] = ("token embedding", int(shape[0]))
        elif len(parts) == 2 and parts[0] in HEAD_NAMES and parts[1] in ("weight", "kernel"):
            found[path] = ("output head", int(shape[-1] if parts[1] == "kernel" else shape[0]))
    return {path: table for path, table in found.items() if not _is_position_table(path)}


def check_model_vocab(spec, model, params: Iterable[tuple[str, tuple[int, ...]]]) -> None:
    """The model's token table (its largest embedding) and each output head must hold ``model['vocab_size']``
    tokens (more is padding); a smaller embedding (segments, types) is not the token table.

    Raises:
        ValueError: naming ``RunSpec.model['vocab_size']``, both numbers and the parameter: a token past an
            embedding's rows makes an engine read out of bounds (a crash or garbage), not an error.
    """
    vocab_size, tables = spec.model["vocab_size"], vocab_tables(model, params)
    embeds = sorted((tokens, path) for path, (what, tokens) in tables.items() if what == "token embedding")
    short = [(path, what, tokens) for path, (what, tokens) in tables.items() if what == "output head"]
    for path, what, tokens in ([(embeds[-1][1], "token embedding", embeds[-1][0])] if embeds else []) + short:
        if tokens < vocab_size:
            raise ValueError(f"RunSpec.model['vocab_size']={vocab_size}: the model of {spec.model_factory} holds "
                             f"{tokens} tokens in its {what} '{path}', fewer than vocab_size (a token >= {tokens} "
                             f"would index past it); declare model['vocab_size'] <= {tokens}, or build the model for "
                             f"{vocab_size} tokens")


__all__ = ["EMBED_NAMES", "HEAD_NAMES", "check_model_vocab", "vocab_tables"]
