"""A model argument takes a preset name, a config.json path or folder, a config dict, an ArchitectureConfig or
a ModelSpec (workbench.core.resolve); errors name the caller's argument."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from workbench.core.presets import PRESETS, get_preset
from workbench.core.resolve import resolve_architecture, resolve_spec
from workbench.estimate.activations import estimate_activation_bytes

DATA = Path(__file__).parent / "data" / "hf_configs"
LLAMA3 = DATA / "llama3_8b.json"


def test_a_preset_name_gives_the_preset():
    assert resolve_spec("llama-3-8b") == get_preset("llama-3-8b")
    assert resolve_spec("gpt2", dtype="fp32") == get_preset("gpt2", "float32")
    assert resolve_architecture("mixtral-8x7b") is PRESETS["mixtral-8x7b"]


def test_a_path_a_folder_and_a_dict_give_the_same_spec(tmp_path):
    folder = tmp_path / "Meta-Llama-3-8B"
    folder.mkdir()
    shutil.copy(LLAMA3, folder / "config.json")
    raw = json.loads(LLAMA3.read_text())
    by_path, by_str, by_folder, by_dict = (resolve_spec(m) for m in (LLAMA3, str(LLAMA3), folder, raw))
    assert by_path.paths == by_folder.paths == by_dict.paths == by_str.paths == get_preset("llama-3-8b").paths
    assert by_path.num_params == 8_030_261_248 and {p.dtype for p in by_path} == {"bfloat16"}
    assert by_folder.name == "Meta-Llama-3-8B"
    assert resolve_spec(raw, dtype="float32").nbytes == 4 * 8_030_261_248


def test_a_spec_and_an_architecture_config_pass_through():
    spec = get_preset("tiny-llama")
    assert resolve_spec(spec) is spec
    assert {p.dtype for p in resolve_spec(spec, dtype="float32")} == {"float32"}
    assert resolve_spec(PRESETS["tiny-moe"]) == get_preset("tiny-moe")
    assert resolve_architecture(PRESETS["tiny-moe"]) is PRESETS["tiny-moe"]


def test_resolve_architecture_maps_hf_fields():
    arch = resolve_architecture(DATA / "qwen2_5_0_5b.json")
    assert (arch.hidden_size, arch.num_heads, arch.num_kv_heads, arch.num_layers, arch.head_dim) == (896, 14, 2, 24, 64)
    assert not arch.is_moe and arch.tie_embeddings
    moe = resolve_architecture(json.loads((DATA / "mixtral_8x7b_v0_1.json").read_text()))
    assert moe.is_moe and moe.num_experts == 8 and moe.intermediate_size == 14336


@pytest.mark.parametrize("model,match", [
    ("llama-9000", r"^model: 'llama-9000' is neither a preset \(known: .*llama-3-8b"),
    ("missing/config.json", r"^model: no such config file 'missing/config.json'"),
    (3, r"^model: expected a preset name, .* got int"),
    ({"model_type": "bert"}, r"^model: config dict: field 'model_type' = 'bert' is not supported"),
])
def test_errors_name_the_argument(model, match):
    with pytest.raises(ValueError, match=match):
        resolve_spec(model)
    with pytest.raises(ValueError, match=match):
        resolve_architecture(model)


def test_errors_name_the_callers_argument_and_the_field(tmp_path):
    with pytest.raises(ValueError, match=r"^spec_or_preset: .*field 'torch_dtype' = 'auto'"):
        resolve_spec({**json.loads(LLAMA3.read_text()), "torch_dtype": "auto"}, argument="spec_or_preset")
    with pytest.raises(ValueError, match=r"^model: the folder .* holds no config.json"):
        resolve_spec(tmp_path)
    with pytest.raises(ValueError, match=r"^model: the ModelSpec 'tiny-llama' holds parameter shapes only"):
        resolve_architecture(get_preset("tiny-llama"))
    broken = json.loads((DATA / "deepseek_v3.json").read_text())
    del broken["intermediate_size"]
    with pytest.raises(ValueError, match=r"^model: config dict: field 'intermediate_size'"):
        resolve_architecture(broken)


def test_activations_take_a_config_wherever_a_preset_went():
    by_name = estimate_activation_bytes(seq_len=128, micro_batch_size=2, config="llama-3-8b")
    assert estimate_activation_bytes(seq_len=128, micro_batch_size=2, config=LLAMA3) == by_name
    assert estimate_activation_bytes(seq_len=128, micro_batch_size=1, config=DATA / "gemma2_2b.json") == \
        int(round(26 * 128 * 2304 * (34 + 5 * 8 * 128 / 2304)))
    with pytest.raises(ValueError, match="^config: 'nope' is neither a preset"):
        estimate_activation_bytes(seq_len=128, micro_batch_size=1, config="nope")
