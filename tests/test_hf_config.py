"""Tests for workbench.core.hf_config: ModelSpecs from real published Hugging Face config.json files.

The configs are read from tests/data/hf_configs (sources in SOURCES.md there). The published parameter
counts are written here by hand, never read from the module or the data folder, so a wrong builder fails.
"""

from __future__ import annotations

import ast
import json
import math
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

from workbench.core.hf_config import SUPPORTED_MODEL_TYPES, fill_defaults, load_hf_config, spec_from_hf_config
from workbench.core.presets import get_preset, is_expert_param, layer_index

DATA = Path(__file__).parent / "data" / "hf_configs"
EMBEDDINGS = {"model.embed_tokens.weight", "lm_head.weight", "transformer.wte.weight", "transformer.wpe.weight"}
B, M = 1_000_000_000, 1_000_000


@dataclass(frozen=True)
class Published:
    """A published figure: ``value`` elements, given to ``unit`` (1 for an exact count).

    ``how``: ``"round"`` (nearest unit) or ``"truncate"`` (cut to the unit, e.g. Llama 3.2's "1.23B"
    for 1.2358B). ``what``: ``"total"`` or ``"non_embedding"`` (total less token/position embeddings and
    an untied LM head), as the source states it.
    """

    value: int
    unit: int
    source: str
    how: str = "round"
    what: str = "total"


def _exact(value: int, source: str, what: str = "total") -> Published:
    return Published(value, 1, source, what=what)


# file -> (model_type, [published figures]); see tests/data/hf_configs/SOURCES.md for every source.
PUBLISHED: dict[str, tuple[str, list[Published]]] = {
    "llama2_7b.json": ("llama", [
        Published(7 * B, B, "model card '7B'"),
        _exact(6_738_415_616, "all-params count printed by transformers/PEFT for meta-llama/Llama-2-7b-hf")]),
    "llama3_8b.json": ("llama", [
        Published(8 * B, B, "model card '8B'"),
        _exact(8_030_261_248, "safetensors index total_size 16,060,522,496 B / 2 (bf16)")]),
    "llama3_1_8b.json": ("llama", [
        Published(8 * B, B, "model card '8B'"),
        _exact(8_030_261_248, "safetensors metadata of a Llama-3.1-8B listing")]),
    "llama3_2_1b.json": ("llama", [Published(1_230 * M, 10 * M, "model card '1B (1.23B)'", how="truncate")]),
    "mistral_7b_v0_1.json": ("mistral", [
        Published(7 * B, B, "model card '7 billion parameters'"),
        _exact(7_241_732_096, "count transformers reports for mistralai/Mistral-7B-v0.1 (public logs)")]),
    "mixtral_8x7b_v0_1.json": ("mixtral", [
        Published(46_700 * M, 100 * M, "Mistral AI release blog '46.7B total parameters'"),
        _exact(46_702_792_704, "HF API safetensors.total of Mixtral-8x7B(-Instruct)-v0.1")]),
    "qwen2_5_0_5b.json": ("qwen2", [
        Published(490 * M, 10 * M, "model card 'Number of Parameters: 0.49B'"),
        Published(360 * M, 10 * M, "model card 'Non-Embedding: 0.36B'", what="non_embedding")]),
    "qwen3_0_6b.json": ("qwen3", [
        Published(600 * M, 100 * M, "model card 'Number of Parameters: 0.6B'"),
        Published(440 * M, 10 * M, "model card 'Non-Embedding: 0.44B'", what="non_embedding")]),
    "qwen3_30b_a3b.json": ("qwen3_moe", [
        Published(30_500 * M, 100 * M, "model card '30.5B total parameters'"),
        Published(29_900 * M, 100 * M, "model card 'Non-Embedding: 29.9B'", what="non_embedding"),
        _exact(30_532_122_624, "GGUF general.parameter_count of Qwen3-30B-A3B")]),
    "gemma2_2b.json": ("gemma2", [
        _exact(2_024_517_888, "Gemma 2 technical report: non-embedding parameters of the 2B model",
               what="non_embedding")]),
    "gemma3_1b_it.json": ("gemma3_text", [
        Published(1 * B, B, "Gemma 3 technical report Table 1: 1B"),
        Published(698 * M, M, "Gemma 3 technical report Table 1: 698M non-embedding", what="non_embedding")]),
    "phi3_mini_4k_instruct.json": ("phi3", [Published(3_800 * M, 100 * M, "model card '3.8B parameters'")]),
    "gpt2.json": ("gpt2", [
        Published(124 * M, M, "model card '124M parameters'"),
        _exact(124_439_808, "sum of GPT2LMHeadModel.parameters() (lm_head tied)")]),
    # The main model only: the card's 671B excludes the multi-token-prediction module (see include_mtp).
    "deepseek_v3.json": ("deepseek_v3", [Published(671 * B, B, "model card '671B total parameters'")]),
    "deepseek_v2_lite.json": ("deepseek_v2", [
        Published(15_700 * M, 100 * M, "model card and arXiv:2405.04434: '15.7B total parameters'")]),
    "kimi_k2_instruct.json": ("kimi_k2", [Published(1_000 * B, 1_000 * B, "model card 'Total Parameters 1T'")]),
    # The language model of the multimodal config (its sparse text_config), without the vision tower.
    "gemma3_4b_it.json": ("gemma3_text", [
        Published(3_209 * M, M, "Gemma 3 technical report Table 1: 4B, 3,209M non-embedding", what="non_embedding")]),
}
#: Fixtures whose language model is a sub-config (file -> its key), built in the file's torch_dtype.
TEXT_CONFIG = {"gemma3_4b_it.json": "text_config"}

# Shape fields of each published config, written here from the config.json, so a changed fixture fails.
CONFIG_NUMBERS: dict[str, dict[str, object]] = {
    "llama2_7b.json": dict(vocab_size=32000, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                           num_key_value_heads=32, intermediate_size=11008, tie_word_embeddings=False),
    "llama3_8b.json": dict(vocab_size=128256, hidden_size=4096, num_hidden_layers=32, num_key_value_heads=8,
                           intermediate_size=14336, tie_word_embeddings=False),
    "llama3_1_8b.json": dict(vocab_size=128256, hidden_size=4096, num_hidden_layers=32, num_key_value_heads=8,
                             intermediate_size=14336, tie_word_embeddings=False),
    "llama3_2_1b.json": dict(vocab_size=128256, hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                             num_key_value_heads=8, head_dim=64, intermediate_size=8192, tie_word_embeddings=True),
    "mistral_7b_v0_1.json": dict(vocab_size=32000, hidden_size=4096, num_hidden_layers=32, num_key_value_heads=8,
                                 intermediate_size=14336, tie_word_embeddings=False),
    "mixtral_8x7b_v0_1.json": dict(vocab_size=32000, hidden_size=4096, num_hidden_layers=32, num_local_experts=8,
                                   intermediate_size=14336, tie_word_embeddings=False),
    "qwen2_5_0_5b.json": dict(vocab_size=151936, hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                              num_key_value_heads=2, intermediate_size=4864, tie_word_embeddings=True),
    "qwen3_0_6b.json": dict(vocab_size=151936, hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                            num_key_value_heads=8, head_dim=128, intermediate_size=3072, tie_word_embeddings=True),
    "qwen3_30b_a3b.json": dict(vocab_size=151936, hidden_size=2048, num_hidden_layers=48, num_attention_heads=32,
                               num_key_value_heads=4, head_dim=128, num_experts=128, moe_intermediate_size=768,
                               decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False),
    "gemma2_2b.json": dict(vocab_size=256000, hidden_size=2304, num_hidden_layers=26, num_attention_heads=8,
                           num_key_value_heads=4, head_dim=256, intermediate_size=9216),
    "gemma3_1b_it.json": dict(vocab_size=262144, hidden_size=1152, num_hidden_layers=26, num_attention_heads=4,
                              num_key_value_heads=1, head_dim=256, intermediate_size=6912),
    "phi3_mini_4k_instruct.json": dict(vocab_size=32064, hidden_size=3072, num_hidden_layers=32,
                                       num_key_value_heads=32, intermediate_size=8192, tie_word_embeddings=False),
    "gpt2.json": dict(vocab_size=50257, n_embd=768, n_layer=12, n_head=12, n_positions=1024),
    "deepseek_v3.json": dict(vocab_size=129280, hidden_size=7168, num_hidden_layers=61, num_attention_heads=128,
                             q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                             v_head_dim=128, first_k_dense_replace=3, n_routed_experts=256, n_shared_experts=1,
                             moe_intermediate_size=2048, intermediate_size=18432, num_nextn_predict_layers=1),
    "deepseek_v2_lite.json": dict(vocab_size=102400, hidden_size=2048, num_hidden_layers=27, num_attention_heads=16,
                                  q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                                  v_head_dim=128, first_k_dense_replace=1, moe_layer_freq=1, n_routed_experts=64,
                                  n_shared_experts=2, moe_intermediate_size=1408, intermediate_size=10944,
                                  topk_method="greedy", tie_word_embeddings=False),
    "kimi_k2_instruct.json": dict(vocab_size=163840, hidden_size=7168, num_hidden_layers=61, num_attention_heads=64,
                                  q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                                  v_head_dim=128, first_k_dense_replace=1, n_routed_experts=384, n_shared_experts=1,
                                  moe_intermediate_size=2048, intermediate_size=18432, num_nextn_predict_layers=0,
                                  topk_method="noaux_tc", tie_word_embeddings=False),
    # Sparse as published: the heads, head_dim and vocab_size are left to Gemma3TextConfig's defaults.
    "gemma3_4b_it.json": dict(hidden_size=2560, intermediate_size=10240, num_hidden_layers=34, vocab_size=None,
                              num_attention_heads=None, num_key_value_heads=None, head_dim=None),
}

_SPECS: dict[tuple, object] = {}
#: A value for config(): drop the field.
_DROP = object()


def fixture_raw(file: str) -> dict:
    """The dict the builder is given for a fixture: the file's, or its language model's (TEXT_CONFIG)."""
    raw = json.loads((DATA / file).read_text())
    return raw[TEXT_CONFIG[file]] if file in TEXT_CONFIG else raw


def spec(file: str, **kwargs):
    """The builder's spec of a fixture; configs without torch_dtype (gemma2, gpt2) get bfloat16, a
    sub-config its file's torch_dtype."""
    key = (file, tuple(sorted(kwargs.items())))
    if key not in _SPECS:
        raw = json.loads((DATA / file).read_text())
        if "torch_dtype" not in raw and "dtype" not in kwargs:
            kwargs["dtype"] = "bfloat16"
        if file in TEXT_CONFIG:
            _SPECS[key] = spec_from_hf_config(raw[TEXT_CONFIG[file]], **{"dtype": raw["torch_dtype"], **kwargs})
        else:
            _SPECS[key] = spec_from_hf_config(DATA / file, **kwargs)
    return _SPECS[key]


def config(file: str, **changes: object) -> dict:
    """A fixture's dict with ``changes`` applied (``_DROP`` removes a field)."""
    raw = json.loads((DATA / file).read_text())
    raw.update(changes)
    return {k: v for k, v in raw.items() if v is not _DROP}


def non_embedding(s) -> int:
    return s.num_params - sum(p.size for p in s if p.path in EMBEDDINGS)


def shapes(s) -> dict[str, tuple[int, ...]]:
    return {p.path: p.shape for p in s}


def test_every_listed_model_type_is_supported_and_tested():
    listed = {"llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "gemma2", "gemma3_text", "phi3",
              "gpt2", "deepseek_v2", "deepseek_v3", "kimi_k2"}
    assert listed <= set(SUPPORTED_MODEL_TYPES)
    assert {model_type for model_type, _ in PUBLISHED.values()} == listed
    assert set(PUBLISHED) == {p.name for p in DATA.glob("*.json")} == set(CONFIG_NUMBERS)
    assert set(SUPPORTED_MODEL_TYPES) == listed


@pytest.mark.parametrize("file", sorted(CONFIG_NUMBERS))
def test_fixture_holds_the_published_config_numbers(file):
    raw = fixture_raw(file)
    assert raw["model_type"] == PUBLISHED[file][0]
    assert {k: raw.get(k) for k in CONFIG_NUMBERS[file]} == CONFIG_NUMBERS[file]


@pytest.mark.parametrize("file,figure", [(f, p) for f, (_, figs) in PUBLISHED.items() for p in figs],
                         ids=lambda x: x if isinstance(x, str) else f"{x.what}-{x.value}-unit{x.unit}")
def test_parameter_count_matches_published(file, figure):
    s = spec(file)
    count = s.num_params if figure.what == "total" else non_embedding(s)
    if figure.unit == 1 or figure.how == "truncate":
        assert count // figure.unit * figure.unit == figure.value, (file, count, figure.source)
    else:
        assert (count + figure.unit // 2) // figure.unit * figure.unit == figure.value, (file, count, figure.source)


# The exact counts the builder gives (SOURCES.md arithmetic), where the published figure is rounded.
EXACT_FORMULA = {
    "llama3_2_1b.json": 1_235_814_400, "qwen2_5_0_5b.json": 494_032_768, "qwen3_0_6b.json": 596_049_920,
    "gemma2_2b.json": 2_614_341_888, "gemma3_1b_it.json": 999_885_952, "phi3_mini_4k_instruct.json": 3_821_079_552,
    "deepseek_v3.json": 671_026_419_200, "deepseek_v2_lite.json": 15_706_484_224,
    "kimi_k2_instruct.json": 1_026_408_232_448, "gemma3_4b_it.json": 3_880_263_168,
}


@pytest.mark.parametrize("file", sorted(EXACT_FORMULA))
def test_exact_count_matches_the_sources_arithmetic(file):
    assert spec(file).num_params == EXACT_FORMULA[file]


def test_deepseek_mtp_layer_is_opt_in_and_counted_without_its_embedding_copies():
    main, with_mtp = spec("deepseek_v3.json"), spec("deepseek_v3.json", include_mtp=True)
    # SOURCES.md §14: enorm + hnorm + eh_proj + one MoE decoder layer + shared_head.norm. (README_WEIGHTS
    # says "11.5B unique": the decoder layer alone is 11.51B; with eh_proj it is 11.61B.)
    assert with_mtp.num_params - main.num_params == 11_610_068_224
    extra = [p for p in with_mtp if layer_index(p.path) == 61]
    assert shapes(with_mtp)["model.layers.61.eh_proj.weight"] == (7168, 2 * 7168)
    assert not any("embed_tokens" in p.path or "shared_head.head" in p.path for p in extra)
    assert max(layer_index(p.path) or 0 for p in main) == 60
    with pytest.raises(ValueError, match="include_mtp"):
        spec_from_hf_config(DATA / "llama3_8b.json", include_mtp=True)
    with pytest.raises(ValueError, match="num_nextn_predict_layers"):
        spec_from_hf_config(config("deepseek_v3.json", num_nextn_predict_layers=0), include_mtp=True)


@pytest.mark.parametrize("file,preset", [("gpt2.json", "gpt2"), ("llama3_8b.json", "llama-3-8b"),
                                         ("mixtral_8x7b_v0_1.json", "mixtral-8x7b"),
                                         ("qwen3_30b_a3b.json", "qwen3-30b-a3b")])
def test_same_paths_shapes_and_order_as_the_preset(file, preset):
    built, ref = spec(file), get_preset(preset)
    assert [(p.path, p.shape) for p in built] == [(p.path, p.shape) for p in ref]


# Kimi K2 is left out for time: deepseek_v3's builder, and its size, are covered by deepseek_v3.json.
@pytest.mark.parametrize("file", sorted(set(PUBLISHED) - set(TEXT_CONFIG) - {"kimi_k2_instruct.json"}))
def test_dict_input_equals_path_input(file):
    from_path = spec(file)
    raw = json.loads((DATA / file).read_text())
    kwargs = {} if "torch_dtype" in raw else {"dtype": "bfloat16"}
    from_dict = spec_from_hf_config(raw, name=from_path.name, **kwargs)
    assert from_dict == from_path


def test_folder_input_and_names(tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text((DATA / "qwen3_0_6b.json").read_text())
    s = spec_from_hf_config(folder)
    assert s.name == "my-model" and s.params == spec("qwen3_0_6b.json").params
    assert spec("llama2_7b.json").name == "meta-llama/Llama-2-7b-hf"  # _name_or_path wins
    assert spec_from_hf_config(config("qwen3_0_6b.json")).name == "qwen3"
    assert spec_from_hf_config(DATA / "qwen3_0_6b.json", name="mine").name == "mine"
    assert load_hf_config(DATA / "gpt2.json")[1] == str(DATA / "gpt2.json")


def test_gqa_and_head_dim_shapes():
    llama = shapes(spec("llama3_8b.json"))  # 32 heads, 8 KV heads, head_dim 128
    assert llama["model.layers.0.self_attn.q_proj.weight"] == (4096, 4096)
    assert llama["model.layers.0.self_attn.k_proj.weight"] == (1024, 4096)
    assert llama["model.layers.0.self_attn.v_proj.weight"] == (1024, 4096)
    qwen3 = shapes(spec("qwen3_0_6b.json"))  # head_dim 128 != 1024 / 16
    assert qwen3["model.layers.0.self_attn.q_proj.weight"] == (2048, 1024)
    assert qwen3["model.layers.0.self_attn.o_proj.weight"] == (1024, 2048)
    assert qwen3["model.layers.0.self_attn.k_proj.weight"] == (1024, 1024)
    assert qwen3["model.layers.0.self_attn.q_norm.weight"] == qwen3["model.layers.0.self_attn.k_norm.weight"] == (128,)
    gemma3 = shapes(spec("gemma3_1b_it.json"))  # multi-query: 1 KV head
    assert gemma3["model.layers.0.self_attn.k_proj.weight"] == (256, 1152)
    assert gemma3["model.layers.0.self_attn.k_norm.weight"] == (256,)
    assert gemma3["model.layers.0.post_feedforward_layernorm.weight"] == (1152,)
    assert "model.layers.0.self_attn.q_norm.weight" not in shapes(spec("gemma2_2b.json"))
    assert "model.layers.0.pre_feedforward_layernorm.weight" in shapes(spec("gemma2_2b.json"))
    mha = shapes(spec("llama2_7b.json"))  # no num_key_value_heads grouping: 32 of 32
    assert mha["model.layers.0.self_attn.k_proj.weight"] == (4096, 4096)


def test_biases_fused_and_conv1d_shapes():
    qwen2 = shapes(spec("qwen2_5_0_5b.json"))  # q/k/v biased, o not
    assert qwen2["model.layers.0.self_attn.q_proj.bias"] == (896,)
    assert qwen2["model.layers.0.self_attn.k_proj.bias"] == qwen2["model.layers.0.self_attn.v_proj.bias"] == (128,)
    assert "model.layers.0.self_attn.o_proj.bias" not in qwen2
    assert not any(p.endswith(".bias") for p in shapes(spec("llama3_8b.json")))
    phi3 = shapes(spec("phi3_mini_4k_instruct.json"))
    assert phi3["model.layers.0.self_attn.qkv_proj.weight"] == (3 * 3072, 3072)
    assert phi3["model.layers.0.mlp.gate_up_proj.weight"] == (2 * 8192, 3072)
    gpt2 = shapes(spec("gpt2.json"))
    assert gpt2["transformer.wpe.weight"] == (1024, 768)
    assert gpt2["transformer.h.0.attn.c_attn.weight"] == (768, 2304)  # Conv1D: (in, out)
    assert gpt2["transformer.h.11.mlp.c_proj.weight"] == (3072, 768)
    llama = spec_from_hf_config(config("llama3_8b.json", attention_bias=True, mlp_bias=True))
    extra = llama.num_params - spec("llama3_8b.json").num_params
    assert extra == 32 * ((4096 + 1024 + 1024 + 4096) + (14336 + 14336 + 4096))
    wide = spec_from_hf_config(config("gpt2.json", n_inner=1024), dtype="float32")
    assert shapes(wide)["transformer.h.0.mlp.c_fc.weight"] == (768, 1024)


def test_tied_and_untied_lm_head():
    for file in ("llama3_2_1b.json", "qwen2_5_0_5b.json", "qwen3_0_6b.json", "gemma2_2b.json",
                 "gemma3_1b_it.json", "gpt2.json"):  # gemma and gpt2: tied by their config class default
        assert "lm_head.weight" not in shapes(spec(file)), file
    assert shapes(spec("llama3_8b.json"))["lm_head.weight"] == (128256, 4096)
    assert spec("llama3_8b.json").paths[-1] == "lm_head.weight"
    untied = spec_from_hf_config(config("llama3_2_1b.json", tie_word_embeddings=False))
    assert untied.num_params - spec("llama3_2_1b.json").num_params == 128256 * 2048
    gpt2 = spec_from_hf_config(config("gpt2.json", tie_word_embeddings=False), dtype="float32")
    assert shapes(gpt2)["lm_head.weight"] == (50257, 768)
    gemma = spec_from_hf_config(config("gemma2_2b.json", tie_word_embeddings=False), dtype="bfloat16")
    assert shapes(gemma)["lm_head.weight"] == (256000, 2304)


@pytest.mark.parametrize("file,layers,experts,per_expert,dense_layers", [
    ("mixtral_8x7b_v0_1.json", 32, 8, 3 * 4096 * 14336, 0),
    ("qwen3_30b_a3b.json", 48, 128, 3 * 2048 * 768, 0),
    ("deepseek_v3.json", 58, 256, 3 * 7168 * 2048, 3),
    ("deepseek_v2_lite.json", 26, 64, 3 * 2048 * 1408, 1),
    ("kimi_k2_instruct.json", 60, 384, 3 * 7168 * 2048, 1),
])
def test_routed_experts_are_recognised_by_is_expert_param(file, layers, experts, per_expert, dense_layers):
    s = spec(file)
    expert_params = [p for p in s if is_expert_param(p.path)]
    assert sum(p.size for p in expert_params) == layers * experts * per_expert
    assert all(".experts." in p.path and ".shared_experts." not in p.path for p in expert_params)
    assert not any(is_expert_param(p) for p in s.paths if p.endswith((".gate.weight", ".e_score_correction_bias")))
    assert not any(is_expert_param(p) for p in s.paths if "shared_experts" in p)
    assert not any(is_expert_param(p.path) for p in s if layer_index(p.path) is not None
                   and layer_index(p.path) < dense_layers)
    assert {layer_index(p.path) for p in s} == set(range(layers + dense_layers)) | {None}
    for dense_file in ("llama3_8b.json", "gemma2_2b.json", "gpt2.json", "phi3_mini_4k_instruct.json"):
        assert not any(is_expert_param(p) for p in spec(dense_file).paths)


def test_deepseek_mla_dense_and_shared_expert_shapes():
    s = shapes(spec("deepseek_v3.json"))
    a = "model.layers.0.self_attn."
    assert s[a + "q_a_proj.weight"] == (1536, 7168) and s[a + "q_a_layernorm.weight"] == (1536,)
    assert s[a + "q_b_proj.weight"] == (128 * (128 + 64), 1536)
    assert s[a + "kv_a_proj_with_mqa.weight"] == (512 + 64, 7168) and s[a + "kv_a_layernorm.weight"] == (512,)
    assert s[a + "kv_b_proj.weight"] == (128 * (128 + 128), 512)
    assert s[a + "o_proj.weight"] == (7168, 128 * 128)
    assert s["model.layers.2.mlp.gate_proj.weight"] == (18432, 7168)  # dense (first_k_dense_replace = 3)
    assert "model.layers.3.mlp.gate_proj.weight" not in s
    assert s["model.layers.3.mlp.gate.weight"] == (256, 7168)
    assert s["model.layers.3.mlp.gate.e_score_correction_bias"] == (256,)
    assert s["model.layers.3.mlp.shared_experts.up_proj.weight"] == (2048, 7168)
    assert s["model.layers.60.mlp.experts.255.down_proj.weight"] == (7168, 2048)
    no_lora = shapes(spec_from_hf_config(config("deepseek_v3.json", q_lora_rank=None)))
    assert no_lora[a + "q_proj.weight"] == (128 * 192, 7168) and a + "q_a_proj.weight" not in no_lora


def test_deepseek_v2_lite_mla_without_query_compression_and_its_router():
    s = shapes(spec("deepseek_v2_lite.json"))
    a = "model.layers.0.self_attn."
    assert s[a + "q_proj.weight"] == (16 * (128 + 64), 2048) and a + "q_a_proj.weight" not in s  # q_lora_rank null
    assert s[a + "kv_a_proj_with_mqa.weight"] == (512 + 64, 2048) and s[a + "kv_a_layernorm.weight"] == (512,)
    assert s[a + "kv_b_proj.weight"] == (16 * (128 + 128), 512) and s[a + "o_proj.weight"] == (2048, 16 * 128)
    assert s["model.layers.0.mlp.gate_proj.weight"] == (10944, 2048)  # first_k_dense_replace = 1
    assert s["model.layers.1.mlp.gate.weight"] == (64, 2048)
    assert s["model.layers.26.mlp.experts.63.down_proj.weight"] == (2048, 1408)
    assert s["model.layers.1.mlp.shared_experts.up_proj.weight"] == (2 * 1408, 2048)  # 2 shared experts, one MLP
    assert not any(p.endswith("e_score_correction_bias") for p in s)  # greedy router: weight only
    assert s["lm_head.weight"] == (102400, 2048)
    with pytest.raises(ValueError, match="include_mtp applies to deepseek_v3, kimi_k2 only"):
        spec_from_hf_config(DATA / "deepseek_v2_lite.json", include_mtp=True)


def test_kimi_k2_has_deepseek_v3_shapes_as_mlx_lm_maps_it():
    kimi = config("kimi_k2_instruct.json", num_hidden_layers=3)  # 3 of its 61 layers: the same builder, faster
    as_v3 = spec_from_hf_config({**kimi, "model_type": "deepseek_v3"}, name="k")
    assert as_v3 == spec_from_hf_config(kimi, name="k")  # mlx_lm.utils.MODEL_REMAPPING["kimi_k2"] == "deepseek_v3"
    s = shapes(spec("kimi_k2_instruct.json"))
    assert s["model.layers.0.self_attn.q_b_proj.weight"] == (64 * 192, 1536)
    assert s["model.layers.1.mlp.gate.e_score_correction_bias"] == (384,)
    assert "model.layers.60.mlp.experts.383.up_proj.weight" in s and "model.layers.0.mlp.experts.0.up_proj.weight" \
        not in s


def test_kimi_k2_count_with_its_fp8_scales_is_the_hub_count():
    # The Hub lists moonshotai/Kimi-K2-Instruct at 1026.5B: its safetensors hold, beside the bf16 model's
    # parameters, one float32 scale per 128 x 128 block of each FP8 linear weight (all but the embedding,
    # the LM head and the routers). See SOURCES_issue26.md.
    s = spec("kimi_k2_instruct.json")
    scales = sum(math.ceil(p.shape[0] / 128) * math.ceil(p.shape[1] / 128) for p in s if len(p.shape) == 2
                 and p.path not in EMBEDDINGS and not p.path.endswith("mlp.gate.weight"))
    assert (s.num_params + scales + 50 * M) // (100 * M) == 10_265


@pytest.mark.parametrize("file,layers,moe_layers", [("deepseek_v2_lite.json", 27, range(2, 27, 2)),
                                                    ("deepseek_v3.json", 61, range(4, 61, 2))])
def test_moe_layer_freq_makes_every_kth_layer_sparse_as_deepseek_and_mlx_lm_do(file, layers, moe_layers):
    # mlx-lm's deepseek_v2/v3 and DeepSeek's modeling code: MoE iff i >= first_k_dense_replace and
    # i % moe_layer_freq == 0. Every published config has moe_layer_freq 1.
    s = spec_from_hf_config(config(file, moe_layer_freq=2))
    assert sorted({layer_index(p.path) for p in s if p.path.endswith("mlp.gate.weight")}) == list(moe_layers)
    dense = {layer_index(p) for p in s.paths if p.endswith(".mlp.down_proj.weight")}
    assert dense == set(range(layers)) - set(moe_layers)


def test_gemma3_sparse_text_config_takes_gemma3textconfig_defaults():
    published = json.loads((DATA / "gemma3_4b_it.json").read_text())
    text = published["text_config"]
    s = shapes(spec("gemma3_4b_it.json"))
    assert s["model.embed_tokens.weight"] == (262_208, 2560)  # vocab_size 262,208 (not 262,144 as in 1B)
    assert s["model.layers.0.self_attn.q_proj.weight"] == (8 * 256, 2560)  # 8 heads of head_dim 256
    assert s["model.layers.33.self_attn.k_proj.weight"] == (4 * 256, 2560)  # 4 KV heads
    assert s["model.layers.0.self_attn.q_norm.weight"] == (256,) and "lm_head.weight" not in s  # tied
    assert {p.dtype for p in spec("gemma3_4b_it.json")} == {"bfloat16"}
    explicit = {**text, "vocab_size": 262_208, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256}
    assert spec_from_hf_config(explicit, dtype="bfloat16") == spec("gemma3_4b_it.json")
    assert shapes(spec_from_hf_config({**text, "vocab_size": 1000}, dtype="bf16"))["model.embed_tokens.weight"] \
        == (1000, 2560)  # a field given wins
    with pytest.raises(ValueError, match="field 'num_attention_heads' is required"):
        spec_from_hf_config({**text, "num_attention_heads": None}, dtype="bf16")  # given as null: not filled
    assert fill_defaults(text)["head_dim"] == 256 and "head_dim" not in text
    assert fill_defaults(fixture_raw("llama3_8b.json")) == fixture_raw("llama3_8b.json")
    with pytest.raises(ValueError, match=r"config\['text_config'\], dtype='bfloat16'\): 'gemma3_text', without"):
        spec_from_hf_config(DATA / "gemma3_4b_it.json")
    with pytest.raises(ValueError, match="'gemma3' is not supported; supported"):  # no hint, no TypeError
        spec_from_hf_config({"model_type": "gemma3", "text_config": {"model_type": ["gemma3_text"]}})


def test_a_config_without_a_dtype_is_float32_as_transformers_builds_it_and_says_so():
    # Every published GPT-2 config has no torch_dtype: transformers creates such a model in torch's
    # default dtype, float32 (4.57.6 from_pretrained and from_config, 5.24.0 from_config).
    for file, count in (("gpt2.json", 124_439_808), ("gemma2_2b.json", 2_614_341_888)):
        with pytest.warns(UserWarning, match=rf"{file}: no 'torch_dtype' \(or 'dtype'\), so the parameters are "
                                             "float32, as transformers"):
            s = spec_from_hf_config(DATA / file)
        assert {p.dtype for p in s} == {"float32"} and s.nbytes == 4 * count
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert spec_from_hf_config(DATA / "gpt2.json", dtype="bf16").nbytes == 2 * 124_439_808  # chosen: silent
        assert spec_from_hf_config(DATA / "llama3_8b.json").nbytes == 2 * 8_030_261_248  # its own: silent


def test_qwen3_moe_dense_layers_from_mlp_only_layers_and_sparse_step():
    s = spec_from_hf_config(config("qwen3_30b_a3b.json", mlp_only_layers=[0], decoder_sparse_step=2))
    sh = shapes(s)
    assert sh["model.layers.0.mlp.gate_proj.weight"] == (6144, 2048)  # in mlp_only_layers
    assert sh["model.layers.2.mlp.gate_proj.weight"] == (6144, 2048)  # (2 + 1) % 2 != 0
    assert sh["model.layers.1.mlp.gate.weight"] == (128, 2048) and "model.layers.1.mlp.gate_proj.weight" not in sh


def test_memory_model_reads_the_built_spec():
    from workbench.estimate.activations import largest_unit_params
    from workbench.estimate.memory import estimate_memory

    s = spec("qwen3_30b_a3b.json")
    attn_norms = 2048 * 32 * 128 * 2 + 2 * 2048 * 4 * 128 + 2 * 128 + 2 * 2048
    assert largest_unit_params(s, experts=False) == max(attn_norms + 2048 * 128, 2 * 151936 * 2048 + 2048)
    est = estimate_memory(s, "fsdp", 8, expert_parallel=8)
    assert est is not None


def test_dtype_from_config_keyword_or_error():
    assert {p.dtype for p in spec("llama2_7b.json")} == {"float16"}  # torch_dtype float16
    assert {p.dtype for p in spec_from_hf_config(DATA / "llama2_7b.json", dtype="fp32")} == {"float32"}
    raw = config("llama3_8b.json", torch_dtype=_DROP, dtype="float16")
    assert {p.dtype for p in spec_from_hf_config(raw)} == {"float16"}  # newer transformers write "dtype"
    assert spec_from_hf_config(raw).nbytes == 2 * 8_030_261_248
    with pytest.raises(ValueError, match="'dtype' and 'torch_dtype' disagree"):
        spec_from_hf_config(config("llama3_8b.json", dtype="float32"))
    with pytest.raises(ValueError, match="field 'torch_dtype' = 'auto'"):
        spec_from_hf_config(config("llama3_8b.json", torch_dtype="auto"))


def _write(tmp_path: Path, raw: dict, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(raw))
    return path


def test_unsupported_model_type_names_the_field_and_the_file(tmp_path):
    path = _write(tmp_path, config("llama3_8b.json", model_type="bert"), "bert.json")
    with pytest.raises(ValueError, match=rf"{path.name}: field 'model_type' = 'bert' is not supported") as err:
        spec_from_hf_config(path)
    assert str(path) in str(err.value) and "llama" in str(err.value)
    with pytest.raises(ValueError, match="config dict: field 'model_type' is required"):
        spec_from_hf_config(config("llama3_8b.json", model_type=_DROP))
    multimodal = {"model_type": "gemma3", "text_config": config("gemma3_1b_it.json")}
    with pytest.raises(ValueError, match="text_config"):
        spec_from_hf_config(multimodal)


@pytest.mark.parametrize("file,changes,field", [
    ("llama3_8b.json", {"moe_layer_freq": 2}, "moe_layer_freq"),
    ("deepseek_v2_lite.json", {"num_nextn_predict_layers": 1}, "num_nextn_predict_layers"),
    ("deepseek_v2_lite.json", {"topk_method": "noaux_tc"}, "topk_method"),
    ("kimi_k2_instruct.json", {"topk_method": "greedy"}, "topk_method"),
    ("deepseek_v3.json", {"attention_bias": True}, "attention_bias"),
    ("deepseek_v3.json", {"topk_method": "greedy"}, "topk_method"),
    ("deepseek_v3.json", {"head_dim": 128}, "head_dim"),
    ("mistral_7b_v0_1.json", {"attention_bias": True}, "attention_bias"),
    ("llama3_8b.json", {"kv_lora_rank": 512}, "kv_lora_rank"),
    ("llama3_8b.json", {"num_experts": 8}, "num_experts"),
    ("qwen3_30b_a3b.json", {"shared_expert_intermediate_size": 4096}, "shared_expert_intermediate_size"),
    ("mixtral_8x7b_v0_1.json", {"mlp_bias": True}, "mlp_bias"),
    ("gpt2.json", {"add_cross_attention": True}, "add_cross_attention"),
    ("gpt2.json", {"head_dim": 32}, "head_dim"),
    ("qwen3_0_6b.json", {"layer_types": ["full_attention", "linear_attention"]}, "layer_types"),
    ("llama3_8b.json", {"architectures": ["LlamaForSequenceClassification"]}, "architectures"),
    ("llama3_8b.json", {"vision_config": {"hidden_size": 1024}}, "vision_config"),
])
def test_shape_changing_field_it_cannot_honour_raises_naming_it(tmp_path, file, changes, field):
    path = _write(tmp_path, config(file, **changes), file)
    with pytest.raises(ValueError, match=rf"{path.name}: field '{field}'") as err:
        spec_from_hf_config(path, dtype="bfloat16")
    assert str(path) in str(err.value)


def test_shape_free_fields_are_accepted():
    base = spec("llama3_8b.json").num_params
    relaxed = config("llama3_8b.json", pretraining_tp=4, hidden_act="gelu", sliding_window=1024,
                     rope_scaling={"rope_type": "yarn", "factor": 4.0}, moe_layer_freq=1, num_experts=0)
    assert spec_from_hf_config(relaxed).num_params == base
    assert spec_from_hf_config(config("gemma3_1b_it.json", layer_types=["sliding_attention", "full_attention"]))


@pytest.mark.parametrize("file,changes,field", [
    ("llama3_8b.json", {"hidden_size": _DROP}, "hidden_size"),
    ("llama3_8b.json", {"vocab_size": None}, "vocab_size"),
    ("gpt2.json", {"n_embd": _DROP}, "n_embd"),
    ("deepseek_v3.json", {"kv_lora_rank": _DROP}, "kv_lora_rank"),
    ("qwen3_30b_a3b.json", {"moe_intermediate_size": _DROP}, "moe_intermediate_size"),
    ("mixtral_8x7b_v0_1.json", {"num_local_experts": _DROP}, "num_local_experts"),
])
def test_missing_required_field_raises_naming_it(tmp_path, file, changes, field):
    path = _write(tmp_path, config(file, **changes), file)
    with pytest.raises(ValueError, match=rf"{path.name}: field '{field}' is required"):
        spec_from_hf_config(path, dtype="bfloat16")


@pytest.mark.parametrize("changes,field", [
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"hidden_size": "4096"}, "hidden_size"),
    ({"num_hidden_layers": 0}, "num_hidden_layers"),
    ({"num_attention_heads": True}, "num_attention_heads"),
    ({"tie_word_embeddings": "yes"}, "tie_word_embeddings"),
    ({"hidden_size": 4000, "num_attention_heads": 48, "num_key_value_heads": 8}, "head_dim"),
    ({"mlp_bias": 1}, "mlp_bias"),
])
def test_malformed_field_raises_naming_it(changes, field):
    with pytest.raises(ValueError, match=rf"config dict: field '{field}'"):
        spec_from_hf_config(config("llama3_8b.json", **changes))


def test_bad_files(tmp_path):
    with pytest.raises(ValueError, match="no such config file"):
        spec_from_hf_config(tmp_path / "absent.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"bad\.json: not valid JSON"):
        spec_from_hf_config(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="JSON list"):
        spec_from_hf_config(_write(tmp_path, [1, 2], "list.json"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="path or a dict"):
        spec_from_hf_config(42)  # type: ignore[arg-type]


def test_no_framework_is_imported():
    root = Path(__file__).resolve().parents[1]
    for module in ("hf_config.py", "hf_families.py", "hf_fields.py", "hf_mla.py"):
        tree = ast.parse((root / "workbench" / "core" / module).read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        assert all(name.split(".")[0] in {"__future__", "json", "os", "pathlib", "collections", "dataclasses",
                                          "functools", "types", "typing", "warnings", "workbench"}
                   for name in imported), (module, imported)
        assert all(name.startswith("workbench.core") for name in imported if name.startswith("workbench")), imported
    code = ("import sys, workbench.core.hf_config as h; h.spec_from_hf_config(sys.argv[1]); "
            "print(sorted(m for m in ('torch', 'jax', 'mlx', 'flax', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, str(DATA / "qwen3_30b_a3b.json")], capture_output=True,
                         text=True, check=True, cwd=root)
    assert out.stdout.strip() == "[]"
