"""Architecture presets: parameter shapes of published models, built from their configs.

Only shapes: no weights are read and nothing is downloaded (standard library and
NumPy only). Every preset follows the Hugging Face ``transformers`` checkpoint:
the same parameter paths, the same shapes (``nn.Linear`` weights are
``(out_features, in_features)``; GPT-2's ``Conv1D`` weights are
``(in_features, out_features)``, as in the checkpoint), and the order of
``model.named_parameters()``, i.e. the order in which each module's ``__init__``
assigns its submodules. That order is what a gradient-bucketing planner walks.

Tied embeddings are one array (the embedding); buffers (rotary ``inv_freq``,
GPT-2's causal ``attn.bias`` masks) are not parameters and are left out.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace

from workbench.core.specs import ModelSpec, ParamSpec, canonical_dtype

__all__ = ["ArchitectureConfig", "PRESETS", "build_spec", "get_preset", "is_expert_param", "layer_index",
           "list_presets", "tiny_config"]

#: Families :func:`build_spec` knows, with whether they are mixture-of-experts.
FAMILIES: dict[str, bool] = {"gpt2": False, "llama": False, "qwen3": False, "mixtral": True, "qwen3-moe": True}

_LAYER_RE = re.compile(r"(?:^|\.)(?:h|layers)\.(\d+)\.")
_EXPERT_RE = re.compile(r"(?:^|\.)experts\.\d+\.")


@dataclass(frozen=True, kw_only=True)
class ArchitectureConfig:
    """The shape-relevant part of a model's published config.

    Attributes:
        name: Registry key and spec name, e.g. ``"llama-3-8b"``.
        family: One of :data:`FAMILIES` (``"gpt2"``, ``"llama"``, ``"qwen3"``,
            ``"mixtral"``, ``"qwen3-moe"``); picks the module layout.
        vocab_size: Vocabulary size (tokens).
        hidden_size: Model width (elements per token).
        num_layers: Number of transformer blocks.
        num_heads: Query heads per block.
        num_kv_heads: Key/value heads per block (grouped-query attention).
        head_dim: Elements per attention head.
        intermediate_size: Dense MLP width (elements); Mixtral's per-expert width.
        tie_embeddings: Whether the LM head reuses the token embedding.
        num_experts: Routed experts per block (0 for dense models).
        moe_intermediate_size: Per-expert MLP width for ``"qwen3-moe"`` (elements).
        max_position_embeddings: Context length (tokens); sizes GPT-2's ``wpe``.
        published_num_params: The published parameter count (elements).
        source: Where ``published_num_params`` comes from.

    Raises:
        ValueError: on an invalid field; the message names the field.
    """

    name: str
    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    tie_embeddings: bool
    num_experts: int = 0
    moe_intermediate_size: int = 0
    max_position_embeddings: int = 0
    published_num_params: int
    source: str

    def __post_init__(self) -> None:
        for field_name in ("name", "source"):
            value = getattr(self, field_name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"ArchitectureConfig.{field_name} must be a non-empty string, got {value!r}.")
        if self.family not in FAMILIES:
            raise ValueError(f"ArchitectureConfig.family must be one of {sorted(FAMILIES)}, got {self.family!r}.")
        if not isinstance(self.tie_embeddings, bool):
            raise ValueError(f"ArchitectureConfig.tie_embeddings must be a bool, got {self.tie_embeddings!r}.")
        positive = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                    "intermediate_size", "published_num_params")
        for field_name in positive + ("num_experts", "moe_intermediate_size", "max_position_embeddings"):
            value = getattr(self, field_name)
            if not isinstance(value, int) or isinstance(value, bool) or value < (1 if field_name in positive else 0):
                kind = "a positive" if field_name in positive else "a non-negative"
                raise ValueError(f"ArchitectureConfig.{field_name} must be {kind} int, got {value!r}.")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"ArchitectureConfig.num_kv_heads ({self.num_kv_heads}) must divide "
                             f"num_heads ({self.num_heads}).")
        moe = FAMILIES[self.family]
        if moe and self.num_experts < 1:
            raise ValueError(f"ArchitectureConfig.num_experts must be >= 1 for family {self.family!r}.")
        if not moe and self.num_experts:
            raise ValueError(f"ArchitectureConfig.num_experts must be 0 for dense family {self.family!r}.")
        if self.family == "qwen3-moe" and self.moe_intermediate_size < 1:
            raise ValueError("ArchitectureConfig.moe_intermediate_size must be >= 1 for family 'qwen3-moe'.")
        if self.family == "gpt2":
            if self.max_position_embeddings < 1:
                raise ValueError("ArchitectureConfig.max_position_embeddings must be >= 1 for family 'gpt2'.")
            if self.num_heads * self.head_dim != self.hidden_size or self.num_kv_heads != self.num_heads:
                raise ValueError("ArchitectureConfig.head_dim: gpt2 needs num_heads * head_dim == hidden_size "
                                 "and num_kv_heads == num_heads.")
            if not self.tie_embeddings:
                raise ValueError("ArchitectureConfig.tie_embeddings must be True for family 'gpt2'.")

    @property
    def is_moe(self) -> bool:
        """Whether the blocks route tokens to experts."""
        return FAMILIES[self.family]


def _gpt2_block(c: ArchitectureConfig, p: str) -> list[tuple[str, tuple[int, ...]]]:
    # GPT2Block: ln_1, attn (c_attn, c_proj), ln_2, mlp (c_fc, c_proj); Conv1D weight is (in, out).
    d, f = c.hidden_size, c.intermediate_size
    return [(p + "ln_1.weight", (d,)), (p + "ln_1.bias", (d,)),
            (p + "attn.c_attn.weight", (d, 3 * d)), (p + "attn.c_attn.bias", (3 * d,)),
            (p + "attn.c_proj.weight", (d, d)), (p + "attn.c_proj.bias", (d,)),
            (p + "ln_2.weight", (d,)), (p + "ln_2.bias", (d,)),
            (p + "mlp.c_fc.weight", (d, f)), (p + "mlp.c_fc.bias", (f,)),
            (p + "mlp.c_proj.weight", (f, d)), (p + "mlp.c_proj.bias", (d,))]


def _glu(p: str, names: tuple[str, str, str], d: int, f: int) -> list[tuple[str, tuple[int, ...]]]:
    """A gated MLP in HF order: gate (f, d), up (f, d), down (d, f); Mixtral's w1, w2, w3 reorder these."""
    shapes = {"gate_proj": (f, d), "up_proj": (f, d), "down_proj": (d, f), "w1": (f, d), "w2": (d, f), "w3": (f, d)}
    return [(f"{p}{n}.weight", shapes[n]) for n in names]


def _decoder_block(c: ArchitectureConfig, p: str) -> list[tuple[str, tuple[int, ...]]]:
    # Llama/Qwen3/Mixtral decoder layer: self_attn, mlp (or block_sparse_moe), input_layernorm,
    # post_attention_layernorm. Attention: q, k, v, o, then q_norm, k_norm for Qwen3 (no biases).
    d, q, kv = c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    out = [(p + "self_attn.q_proj.weight", (q, d)), (p + "self_attn.k_proj.weight", (kv, d)),
           (p + "self_attn.v_proj.weight", (kv, d)), (p + "self_attn.o_proj.weight", (d, q))]
    if c.family in ("qwen3", "qwen3-moe"):
        out += [(p + "self_attn.q_norm.weight", (c.head_dim,)), (p + "self_attn.k_norm.weight", (c.head_dim,))]
    if c.family == "mixtral":  # MixtralSparseMoeBlock: gate (router), then experts w1, w2, w3
        out.append((p + "block_sparse_moe.gate.weight", (c.num_experts, d)))
        for e in range(c.num_experts):
            out += _glu(f"{p}block_sparse_moe.experts.{e}.", ("w1", "w2", "w3"), d, c.intermediate_size)
    elif c.family == "qwen3-moe":  # Qwen3MoeSparseMoeBlock: gate (router), then experts
        out.append((p + "mlp.gate.weight", (c.num_experts, d)))
        for e in range(c.num_experts):
            out += _glu(f"{p}mlp.experts.{e}.", ("gate_proj", "up_proj", "down_proj"), d, c.moe_intermediate_size)
    else:
        out += _glu(p + "mlp.", ("gate_proj", "up_proj", "down_proj"), d, c.intermediate_size)
    return out + [(p + "input_layernorm.weight", (d,)), (p + "post_attention_layernorm.weight", (d,))]


def _shapes(c: ArchitectureConfig) -> list[tuple[str, tuple[int, ...]]]:
    """``(path, shape)`` for every parameter of ``c``, in HF ``named_parameters()`` order."""
    d = c.hidden_size
    if c.family == "gpt2":  # GPT2Model: wte, wpe, h, ln_f; lm_head is tied to wte
        out = [("transformer.wte.weight", (c.vocab_size, d)),
               ("transformer.wpe.weight", (c.max_position_embeddings, d))]
        for i in range(c.num_layers):
            out += _gpt2_block(c, f"transformer.h.{i}.")
        return out + [("transformer.ln_f.weight", (d,)), ("transformer.ln_f.bias", (d,))]
    out = [("model.embed_tokens.weight", (c.vocab_size, d))]
    for i in range(c.num_layers):
        out += _decoder_block(c, f"model.layers.{i}.")
    out.append(("model.norm.weight", (d,)))
    if not c.tie_embeddings:
        out.append(("lm_head.weight", (c.vocab_size, d)))
    return out


@functools.lru_cache(maxsize=64)
def _build(config: ArchitectureConfig, dtype: str) -> ModelSpec:
    return ModelSpec(config.name, tuple(ParamSpec(path, shape, dtype) for path, shape in _shapes(config)))


def build_spec(config: ArchitectureConfig, dtype: object = "bfloat16") -> ModelSpec:
    """The parameter spec of ``config``, every array in ``dtype``.

    Args:
        config: The architecture.
        dtype: Element type of every parameter (any name :func:`canonical_dtype` accepts).

    Returns:
        A :class:`ModelSpec` named ``config.name``; ``num_params`` is in elements,
        ``nbytes`` in bytes. Specs are immutable and cached per ``(config, dtype)``.

    Raises:
        ValueError: on an unknown dtype.
    """
    return _build(config, canonical_dtype(dtype))


def layer_index(path: str) -> int | None:
    """The transformer block a parameter path belongs to.

    Args:
        path: e.g. ``"model.layers.3.mlp.up_proj.weight"`` or ``"transformer.h.0.ln_1.bias"``.

    Returns:
        The block index, or ``None`` for embeddings, the final norm and the LM head.
    """
    match = _LAYER_RE.search(path)
    return int(match.group(1)) if match else None


def is_expert_param(path: str) -> bool:
    """Whether ``path`` is a routed-expert weight (``...experts.{e}...``); the router is not."""
    return _EXPERT_RE.search(path) is not None


def tiny_config(**overrides: object) -> ArchitectureConfig:
    """A small Llama-style config for fast tests and demos.

    Defaults: vocab 256, hidden 64, 2 layers, 4 heads, 2 KV heads, head_dim 16,
    MLP 128, untied head; 106,816 parameters. ``published_num_params`` defaults to
    the config's own computed count and ``source`` to ``"synthetic"``.

    Args:
        **overrides: Any :class:`ArchitectureConfig` field.

    Raises:
        ValueError: on an invalid field (see :class:`ArchitectureConfig`).
    """
    fields = dict(name="tiny-llama", family="llama", vocab_size=256, hidden_size=64, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=16, intermediate_size=128, tie_embeddings=False, source="synthetic")
    fields.update(overrides)
    if "published_num_params" in fields:
        return ArchitectureConfig(**fields)
    draft = ArchitectureConfig(**fields, published_num_params=1)
    return replace(draft, published_num_params=sum(ParamSpec(p, s).size for p, s in _shapes(draft)))


_REAL = [
    # Config: huggingface.co/openai-community/gpt2 config.json (n_layer 12, n_embd 768, n_head 12, vocab 50257,
    # n_positions 1024). Count: sum(p.numel() for p in GPT2LMHeadModel.parameters()) = 124,439,808. The HF
    # safetensors total reads 137,022,720 because the file also stores 12 causal-mask buffers
    # h.{i}.attn.bias of 1x1x1024x1024 (12,582,912 elements), which are not parameters.
    ArchitectureConfig(name="gpt2", family="gpt2", vocab_size=50257, hidden_size=768, num_layers=12, num_heads=12,
                       num_kv_heads=12, head_dim=64, intermediate_size=3072, tie_embeddings=True,
                       max_position_embeddings=1024, published_num_params=124_439_808,
                       source="GPT2LMHeadModel parameter count (tied lm_head); HF safetensors 137,022,720 "
                              "includes 12,582,912 attn.bias mask buffers"),
    # Config: meta-llama/Meta-Llama-3-8B config.json. Count: model.safetensors.index.json total_size
    # 16,060,522,496 bytes in bf16 = 8,030,261,248; HF API safetensors.total of Llama-3.1-8B (same shapes).
    ArchitectureConfig(name="llama-3-8b", family="llama", vocab_size=128256, hidden_size=4096, num_layers=32,
                       num_heads=32, num_kv_heads=8, head_dim=128, intermediate_size=14336, tie_embeddings=False,
                       max_position_embeddings=8192, published_num_params=8_030_261_248,
                       source="HF safetensors index total_size 16,060,522,496 B / 2 (bf16); HF API "
                              "safetensors.total for Llama-3.1-8B"),
    # Config: meta-llama/Meta-Llama-3-70B config.json. Count: HF API safetensors.total of Llama-3.1-70B and
    # Llama-3.3-70B-Instruct (same shapes as Llama-3-70B; only RoPE scaling differs).
    ArchitectureConfig(name="llama-3-70b", family="llama", vocab_size=128256, hidden_size=8192, num_layers=80,
                       num_heads=64, num_kv_heads=8, head_dim=128, intermediate_size=28672, tie_embeddings=False,
                       max_position_embeddings=8192, published_num_params=70_553_706_496,
                       source="HF API safetensors.total for Llama-3.1-70B / Llama-3.3-70B (same shapes)"),
    # Config: Qwen/Qwen3-4B config.json (tie_word_embeddings true, attention_bias false, head_dim 128).
    # Count: HF API safetensors.total of Qwen/Qwen3-4B; GGUF general.parameter_count. No lm_head is stored.
    ArchitectureConfig(name="qwen3-4b", family="qwen3", vocab_size=151936, hidden_size=2560, num_layers=36,
                       num_heads=32, num_kv_heads=8, head_dim=128, intermediate_size=9728, tie_embeddings=True,
                       max_position_embeddings=40960, published_num_params=4_022_468_096,
                       source="HF API safetensors.total for Qwen/Qwen3-4B; GGUF general.parameter_count"),
    # Config: mistralai/Mixtral-8x7B-v0.1 config.json (num_local_experts 8, experts use intermediate_size).
    # Count: HF API safetensors.total of Mixtral-8x7B-Instruct-v0.1; KerasHub mixtral_8_7b_en preset "params".
    ArchitectureConfig(name="mixtral-8x7b", family="mixtral", vocab_size=32000, hidden_size=4096, num_layers=32,
                       num_heads=32, num_kv_heads=8, head_dim=128, intermediate_size=14336, tie_embeddings=False,
                       num_experts=8, max_position_embeddings=32768, published_num_params=46_702_792_704,
                       source="HF API safetensors.total for Mixtral-8x7B(-Instruct)-v0.1; KerasHub preset"),
    # Config: Qwen/Qwen3-30B-A3B config.json (decoder_sparse_step 1, mlp_only_layers [] so every block is
    # sparse; intermediate_size 6144 is unused; no shared expert). Count: GGUF general.parameter_count, and the
    # sum of the HF checkpoint's safetensors shapes.
    ArchitectureConfig(name="qwen3-30b-a3b", family="qwen3-moe", vocab_size=151936, hidden_size=2048,
                       num_layers=48, num_heads=32, num_kv_heads=4, head_dim=128, intermediate_size=6144,
                       tie_embeddings=False, num_experts=128, moe_intermediate_size=768,
                       max_position_embeddings=40960, published_num_params=30_532_122_624,
                       source="GGUF general.parameter_count for Qwen3-30B-A3B; sum of HF safetensors shapes"),
]

#: Every preset by registry key: the published models plus ``tiny-llama`` and ``tiny-moe``.
PRESETS: dict[str, ArchitectureConfig] = {c.name: c for c in _REAL}
PRESETS["tiny-llama"] = tiny_config()
PRESETS["tiny-moe"] = tiny_config(name="tiny-moe", family="mixtral", num_experts=4)


def list_presets() -> list[str]:
    """The registry keys of :data:`PRESETS`, sorted."""
    return sorted(PRESETS)


def get_preset(name: str, dtype: object = "bfloat16") -> ModelSpec:
    """The spec of a registered preset.

    Args:
        name: A key of :data:`PRESETS`, e.g. ``"llama-3-8b"``.
        dtype: Element type of every parameter.

    Raises:
        ValueError: on an unknown name (the message lists the known ones) or dtype.
    """
    if name not in PRESETS:
        raise ValueError(f"Unknown preset {name!r}; known presets: {', '.join(list_presets())}.")
    return build_spec(PRESETS[name], dtype)
