"""Tests for workbench.core.presets: shapes, order and counts of published architectures."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.core.presets import (
    PRESETS,
    ArchitectureConfig,
    build_spec,
    get_preset,
    is_expert_param,
    layer_index,
    list_presets,
    tiny_config,
)

# Published parameter counts, hard-coded here (not read from the module) so a wrong config fails.
PUBLISHED = {
    # GPT2LMHeadModel.parameters() sum (lm_head tied). HF safetensors says 137,022,720 = this + 12 causal-mask
    # buffers h.{i}.attn.bias of 1024*1024 elements each, which are not parameters.
    "gpt2": 124_439_808,
    # meta-llama/Meta-Llama-3-8B model.safetensors.index.json total_size 16,060,522,496 bytes / 2 (bf16);
    # HF API safetensors.total of meta-llama/Llama-3.1-8B.
    "llama-3-8b": 8_030_261_248,
    # HF API safetensors.total of meta-llama/Llama-3.1-70B and Llama-3.3-70B-Instruct (same shapes as Llama-3-70B).
    "llama-3-70b": 70_553_706_496,
    # HF API safetensors.total of Qwen/Qwen3-4B; GGUF general.parameter_count of Qwen3-4B.
    "qwen3-4b": 4_022_468_096,
    # HF API safetensors.total of mistralai/Mixtral-8x7B-Instruct-v0.1; KerasHub mixtral_8_7b_en "params".
    "mixtral-8x7b": 46_702_792_704,
    # GGUF general.parameter_count of Qwen3-30B-A3B; sum of the HF checkpoint's safetensors shapes.
    "qwen3-30b-a3b": 30_532_122_624,
}
REAL = sorted(PUBLISHED)

LLAMA_LAYER = ["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
               "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
               "input_layernorm.weight", "post_attention_layernorm.weight"]
GPT2_LAYER = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
              "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
              "mlp.c_proj.weight", "mlp.c_proj.bias"]


def shape_of(spec, path):
    return {p.path: p.shape for p in spec}[path]


def layer_paths(spec, i):
    return [p.path for p in spec if layer_index(p.path) == i]


def llama_formula(v, d, n_layers, n_heads, n_kv, hd, ffn, tied, qk_norm=False):
    """Closed-form Llama/Qwen3 count, independent of the builder."""
    attn = d * n_heads * hd * 2 + d * n_kv * hd * 2 + (2 * hd if qk_norm else 0)
    return v * d * (1 if tied else 2) + n_layers * (attn + 3 * d * ffn + 2 * d) + d


# ---------------------------------------------------------------- counts ---

@pytest.mark.parametrize("name", REAL)
def test_num_params_equals_published_figure(name):
    spec = get_preset(name)
    assert PRESETS[name].published_num_params == PUBLISHED[name]
    assert spec.num_params == PUBLISHED[name]


def test_counts_match_closed_form():
    assert llama_formula(128256, 4096, 32, 32, 8, 128, 14336, False) == PUBLISHED["llama-3-8b"]
    assert llama_formula(128256, 8192, 80, 64, 8, 128, 28672, False) == PUBLISHED["llama-3-70b"]
    assert llama_formula(151936, 2560, 36, 32, 8, 128, 9728, True, qk_norm=True) == PUBLISHED["qwen3-4b"]
    # GPT-2: wte + wpe + 12 * (2 LN + c_attn + c_proj + 2 LN + c_fc + c_proj) + ln_f
    d = 768
    block = 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + 2 * d + (d * 4 * d + 4 * d) + (4 * d * d + d)
    assert 50257 * d + 1024 * d + 12 * block + 2 * d == PUBLISHED["gpt2"]


def test_every_preset_source_is_recorded():
    for name in list_presets():
        assert PRESETS[name].source.strip()


def test_tiny_presets_count_themselves():
    for name in ("tiny-llama", "tiny-moe"):
        config = PRESETS[name]
        assert config.source == "synthetic"
        assert get_preset(name).num_params == config.published_num_params
    assert get_preset("tiny-llama").num_params == llama_formula(256, 64, 2, 4, 2, 16, 128, False) == 106_816


@settings(max_examples=30, deadline=None)
@given(v=st.integers(1, 300), heads_kv=st.sampled_from([(1, 1), (4, 2), (4, 4), (6, 3)]),
       hd=st.integers(1, 16), layers=st.integers(1, 4), ffn=st.integers(1, 64), tied=st.booleans())
def test_tiny_config_count_matches_formula(v, heads_kv, hd, layers, ffn, tied):
    heads, kv = heads_kv
    d = heads * hd
    config = tiny_config(vocab_size=v, hidden_size=d, num_layers=layers, num_heads=heads, num_kv_heads=kv,
                         head_dim=hd, intermediate_size=ffn, tie_embeddings=tied)
    expected = llama_formula(v, d, layers, heads, kv, hd, ffn, tied)
    assert config.published_num_params == expected
    assert build_spec(config).num_params == expected


# ---------------------------------------------------------- order, shapes ---

@pytest.mark.parametrize("name", list_presets())
def test_paths_unique_and_layers_uniform(name):
    spec = get_preset(name)
    config = PRESETS[name]
    assert len(set(spec.paths)) == len(spec)
    per_layer = [0] * config.num_layers
    for p in spec:
        i = layer_index(p.path)
        if i is not None:
            per_layer[i] += p.size
    assert len(set(per_layer)) == 1 and per_layer[0] > 0
    # layers appear contiguously and in increasing order
    indices = [layer_index(p) for p in spec.paths if layer_index(p) is not None]
    assert indices == sorted(indices)


@pytest.mark.parametrize("name", [n for n in REAL if n != "gpt2"])
def test_decoder_order_starts_with_embedding_ends_with_head(name):
    spec, config = get_preset(name), PRESETS[name]
    assert spec.paths[0] == "model.embed_tokens.weight"
    assert shape_of(spec, "model.embed_tokens.weight") == (config.vocab_size, config.hidden_size)
    if config.tie_embeddings:
        assert spec.paths[-1] == "model.norm.weight"
        assert "lm_head.weight" not in spec.paths
    else:
        assert spec.paths[-2:] == ["model.norm.weight", "lm_head.weight"]
        assert shape_of(spec, "lm_head.weight") == (config.vocab_size, config.hidden_size)
    non_layer = [p for p in spec.paths if layer_index(p) is None]
    assert non_layer == ["model.embed_tokens.weight", "model.norm.weight"] + (
        [] if config.tie_embeddings else ["lm_head.weight"])


def test_llama_layer_order_and_shapes():
    spec = get_preset("llama-3-8b")
    assert layer_paths(spec, 5) == [f"model.layers.5.{s}" for s in LLAMA_LAYER]
    assert shape_of(spec, "model.layers.0.self_attn.q_proj.weight") == (4096, 4096)
    assert shape_of(spec, "model.layers.0.self_attn.k_proj.weight") == (1024, 4096)
    assert shape_of(spec, "model.layers.0.self_attn.o_proj.weight") == (4096, 4096)
    assert shape_of(spec, "model.layers.0.mlp.gate_proj.weight") == (14336, 4096)
    assert shape_of(spec, "model.layers.0.mlp.down_proj.weight") == (4096, 14336)
    assert shape_of(get_preset("llama-3-70b"), "model.layers.79.self_attn.k_proj.weight") == (1024, 8192)


def test_qwen3_has_qk_norm_after_o_proj_and_tied_head():
    spec = get_preset("qwen3-4b")
    expected = LLAMA_LAYER[:4] + ["self_attn.q_norm.weight", "self_attn.k_norm.weight"] + LLAMA_LAYER[4:]
    assert layer_paths(spec, 0) == [f"model.layers.0.{s}" for s in expected]
    assert shape_of(spec, "model.layers.0.self_attn.q_norm.weight") == (128,)
    assert shape_of(spec, "model.layers.0.self_attn.q_proj.weight") == (4096, 2560)
    assert not any(p.endswith(".bias") for p in spec.paths)


def test_gpt2_order_and_conv1d_shapes():
    spec = get_preset("gpt2")
    assert spec.paths[:2] == ["transformer.wte.weight", "transformer.wpe.weight"]
    assert spec.paths[-2:] == ["transformer.ln_f.weight", "transformer.ln_f.bias"]
    assert layer_paths(spec, 11) == [f"transformer.h.11.{s}" for s in GPT2_LAYER]
    assert shape_of(spec, "transformer.wte.weight") == (50257, 768)
    assert shape_of(spec, "transformer.wpe.weight") == (1024, 768)
    assert shape_of(spec, "transformer.h.0.attn.c_attn.weight") == (768, 2304)  # Conv1D: (in, out)
    assert shape_of(spec, "transformer.h.0.mlp.c_fc.weight") == (768, 3072)
    assert shape_of(spec, "transformer.h.0.mlp.c_proj.weight") == (3072, 768)
    assert "lm_head.weight" not in spec.paths and not any(p.endswith(".attn.bias") for p in spec.paths)


@pytest.mark.parametrize("dtype,itemsize,canonical", [("bfloat16", 2, "bfloat16"), ("fp32", 4, "float32"),
                                                      ("float8_e4m3fn", 1, "float8_e4m3fn")])
def test_dtype_applied(dtype, itemsize, canonical):
    spec = get_preset("qwen3-4b", dtype=dtype)
    assert {p.dtype for p in spec} == {canonical}
    assert spec.nbytes == itemsize * PUBLISHED["qwen3-4b"]


def test_default_dtype_is_bfloat16_and_bad_dtype_rejected():
    assert {p.dtype for p in get_preset("gpt2")} == {"bfloat16"}
    assert get_preset("llama-3-8b").nbytes == 16_060_522_496  # the HF index's total_size in bytes
    with pytest.raises(ValueError, match="float7"):
        get_preset("gpt2", dtype="float7")


# ------------------------------------------------------------------ experts ---

def test_mixtral_experts():
    spec = get_preset("mixtral-8x7b")
    experts = [p for p in spec if is_expert_param(p.path)]
    assert len(experts) == 32 * 8 * 3
    layer0 = layer_paths(spec, 0)
    router = "model.layers.0.block_sparse_moe.gate.weight"
    assert layer0[4] == router and shape_of(spec, router) == (8, 4096)
    assert not is_expert_param(router)
    assert layer0[5:8] == [f"model.layers.0.block_sparse_moe.experts.0.{w}.weight" for w in ("w1", "w2", "w3")]
    assert shape_of(spec, "model.layers.0.block_sparse_moe.experts.7.w1.weight") == (14336, 4096)
    assert shape_of(spec, "model.layers.0.block_sparse_moe.experts.7.w2.weight") == (4096, 14336)
    assert layer0[-2:] == ["model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight"]
    assert sum(p.size for p in experts) == 32 * 8 * 3 * 4096 * 14336


def test_qwen3_moe_experts():
    spec = get_preset("qwen3-30b-a3b")
    experts = [p for p in spec if is_expert_param(p.path)]
    assert len(experts) == 48 * 128 * 3
    router = "model.layers.47.mlp.gate.weight"
    assert shape_of(spec, router) == (128, 2048) and not is_expert_param(router)
    layer = layer_paths(spec, 47)
    assert layer[4:6] == ["model.layers.47.self_attn.q_norm.weight", "model.layers.47.self_attn.k_norm.weight"]
    assert layer[6] == router
    assert layer[7:10] == [f"model.layers.47.mlp.experts.0.{w}.weight" for w in ("gate_proj", "up_proj", "down_proj")]
    assert shape_of(spec, "model.layers.0.mlp.experts.127.down_proj.weight") == (2048, 768)
    assert shape_of(spec, "model.layers.0.self_attn.q_proj.weight") == (4096, 2048)
    assert shape_of(spec, "model.layers.0.self_attn.k_proj.weight") == (512, 2048)


def test_dense_models_have_no_expert_params():
    for name in ("gpt2", "llama-3-8b", "qwen3-4b", "tiny-llama"):
        assert not any(is_expert_param(p) for p in get_preset(name).paths)
    assert sum(is_expert_param(p) for p in get_preset("tiny-moe").paths) == 2 * 4 * 3


# ------------------------------------------------------- helpers, registry ---

@pytest.mark.parametrize("path,expected", [
    ("model.layers.0.self_attn.q_proj.weight", 0),
    ("model.layers.31.mlp.down_proj.weight", 31),
    ("model.layers.12.block_sparse_moe.experts.7.w2.weight", 12),
    ("transformer.h.11.ln_1.bias", 11),
    ("h.3.attn.c_attn.weight", 3),
    ("model.embed_tokens.weight", None),
    ("model.norm.weight", None),
    ("lm_head.weight", None),
    ("transformer.wte.weight", None),
    ("transformer.ln_f.weight", None),
    ("model.layers_extra.2.weight", None),
])
def test_layer_index(path, expected):
    assert layer_index(path) == expected


def test_unknown_preset_names_it_and_lists_known():
    with pytest.raises(ValueError) as err:
        get_preset("nope")
    assert "nope" in str(err.value) and "llama-3-8b" in str(err.value)


def test_registry_contents():
    assert set(list_presets()) == set(PUBLISHED) | {"tiny-llama", "tiny-moe"}
    assert list_presets() == sorted(list_presets())
    for name in list_presets():
        assert PRESETS[name].name == name and get_preset(name).name == name


def test_build_all_presets_twice_gives_equal_specs():
    for name in list_presets():
        assert build_spec(PRESETS[name]) == get_preset(name)
        # Every layer 0..L-1 holds the same number of arrays, and a few arrays (embedding, final norm,
        # head) sit outside the layers.
        paths = get_preset(name).paths
        per_layer = Counter(layer_index(p) for p in paths if layer_index(p) is not None)
        assert sorted(per_layer) == list(range(PRESETS[name].num_layers)), name
        assert len(set(per_layer.values())) == 1, name
        assert 1 <= len(paths) - sum(per_layer.values()) <= 4, name


# -------------------------------------------------------------- validation ---

def test_config_is_keyword_only_and_frozen():
    with pytest.raises(TypeError):
        ArchitectureConfig("x", "llama")  # type: ignore[misc]
    config = tiny_config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.hidden_size = 1  # type: ignore[misc]


@pytest.mark.parametrize("overrides,field", [
    (dict(family="bert"), "family"),
    (dict(hidden_size=0), "hidden_size"),
    (dict(num_layers=-1), "num_layers"),
    (dict(vocab_size=2.5), "vocab_size"),
    (dict(num_kv_heads=3), "num_kv_heads"),
    (dict(num_experts=4), "num_experts"),
    (dict(family="mixtral"), "num_experts"),
    (dict(family="qwen3-moe", num_experts=4), "moe_intermediate_size"),
    (dict(tie_embeddings=1), "tie_embeddings"),
    (dict(source=""), "source"),
    (dict(name=""), "name"),
    (dict(published_num_params=0), "published_num_params"),
    (dict(family="gpt2"), "max_position_embeddings"),
])
def test_invalid_config_names_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        tiny_config(**overrides)


def test_tiny_config_overrides():
    config = tiny_config(num_layers=3, name="t3")
    assert config.num_layers == 3 and config.name == "t3"
    assert len({layer_index(p) for p in build_spec(config).paths} - {None}) == 3
    assert tiny_config(published_num_params=7).published_num_params == 7
