"""Architecture presets: parameter shapes of published models, built from their configs.

Each preset is an :class:`~workbench.core.architecture.ArchitectureConfig`; its spec is built
by :func:`~workbench.core.hf_config.spec_from_hf_config` from the ``config.json`` dict the
preset stands for, the builder user configs go through too, so there is one source of shapes.

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
from dataclasses import replace

from workbench.core.architecture import FAMILIES, ArchitectureConfig, is_expert_param, layer_index
from workbench.core.hf_config import spec_from_hf_config
from workbench.core.specs import ModelSpec, canonical_dtype

__all__ = ["FAMILIES", "ArchitectureConfig", "PRESETS", "build_spec", "get_preset", "is_expert_param", "layer_index",
           "list_presets", "tiny_config"]


@functools.lru_cache(maxsize=64)
def _build(config: ArchitectureConfig, dtype: str) -> ModelSpec:
    return spec_from_hf_config(config.to_hf_config(), dtype=dtype, name=config.name)


def build_spec(config: ArchitectureConfig, dtype: object = "bfloat16") -> ModelSpec:
    """The parameter spec of ``config``, every array in ``dtype``.

    Built by :func:`~workbench.core.hf_config.spec_from_hf_config` from
    :meth:`ArchitectureConfig.to_hf_config`: presets and user configs share one builder of shapes.

    Args:
        config: The architecture.
        dtype: Element type of every parameter (any name :func:`canonical_dtype` accepts).

    Returns:
        A :class:`ModelSpec` named ``config.name``; ``num_params`` is in elements,
        ``nbytes`` in bytes. Specs are immutable and cached per ``(config, dtype)``.

    Raises:
        ValueError: on an unknown dtype, or a config the builder cannot build (naming the field).
    """
    return _build(config, canonical_dtype(dtype))


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
    return replace(draft, published_num_params=build_spec(draft).num_params)


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
