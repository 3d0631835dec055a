"""Hostile and careless config files and specs (issue 24, items 13-15): every one fails fast with a
ValueError naming the field and the file, and valid published configs still build.

One process; the configs are the published ones in tests/data/hf_configs with one field changed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from workbench.core.checks import MAX_JSON_DEPTH, MAX_NUM_ARRAYS, MAX_NUM_PARAMS, loads_bounded
from workbench.core.hf_config import MAX_CONFIG_BYTES, load_hf_config, spec_from_hf_config
from workbench.core.resolve import resolve_architecture, resolve_spec
from workbench.core.specs import ModelSpec, ParamSpec

DATA = Path(__file__).parent / "data" / "hf_configs"
LLAMA = "llama3_2_1b.json"
#: A llama small enough that thousands of its layers build in well under a second.
TINY = dict(hidden_size=8, intermediate_size=8, num_attention_heads=2, num_key_value_heads=2, head_dim=4,
            vocab_size=16)


def config(file: str, **changes: object) -> dict:
    raw = json.loads((DATA / file).read_text())
    raw.update(changes)
    return raw


def write(tmp_path: Path, raw: object, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(raw))
    return path


# --- item 13: sizes past a stated bound are refused before anything is built -----------------------------

@pytest.mark.parametrize("file,changes,fields", [
    (LLAMA, dict(num_hidden_layers=4097, **TINY), ["'num_hidden_layers'", "4,096"]),
    ("mixtral_8x7b_v0_1.json", dict(num_local_experts=4097, num_hidden_layers=1), ["'num_local_experts'", "4,096"]),
    ("qwen3_30b_a3b.json", dict(num_experts=5000, num_hidden_layers=1), ["'num_experts'"]),
    ("deepseek_v3.json", dict(n_routed_experts=5000, num_hidden_layers=4), ["'n_routed_experts'"]),
    ("gpt2.json", dict(n_layer=5000, torch_dtype="float32"), ["'n_layer'"]),
    # 22 layers of 4,096 experts: each bound holds, the arrays do not (270,556 > 2**18).
    ("mixtral_8x7b_v0_1.json", dict(num_local_experts=4096, num_hidden_layers=22, hidden_size=8, intermediate_size=8,
                                    num_attention_heads=2, num_key_value_heads=2, vocab_size=16),
     ["num_hidden_layers = 22", "num_local_experts = 4,096", f"{MAX_NUM_ARRAYS:,} parameter arrays"]),
    # Every size within bounds, the total past 10**15: a 2**25-token, 2**25-wide embedding alone is 2**50.
    (LLAMA, dict(hidden_size=2**25, vocab_size=2**25, num_attention_heads=2**10, num_key_value_heads=2**10,
                 head_dim=None, intermediate_size=8),
     ["hidden_size = 33,554,432", "vocab_size = 33,554,432", f"more than {MAX_NUM_PARAMS:,}"]),
])
def test_sizes_past_the_bounds_are_refused_naming_the_fields_and_the_file(tmp_path, file, changes, fields):
    path = write(tmp_path, config(file, **changes), file)
    with pytest.raises(ValueError) as err:
        spec_from_hf_config(path)
    assert str(err.value).startswith(f"{path}: "), err.value
    for field in fields:
        assert field in str(err.value), (field, str(err.value))


def test_the_sizes_that_ran_for_minutes_are_refused_at_once(tmp_path):
    """10**6 layers did not finish in 300 s and 10**7 Mixtral experts ran out of memory: a child process
    (so that the old code's hang is a failure here, not a stuck suite) must refuse both within 60 s."""
    layers = write(tmp_path, config(LLAMA, num_hidden_layers=10**6), "layers.json")
    experts = write(tmp_path, config("mixtral_8x7b_v0_1.json", num_local_experts=10**7), "experts.json")
    code = textwrap.dedent("""
        import resource, sys
        try:  # a regression must not take the machine's memory with it
            resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, resource.getrlimit(resource.RLIMIT_AS)[1]))
        except (ValueError, OSError):
            pass
        from workbench.core.hf_config import spec_from_hf_config
        for path in sys.argv[1:]:
            try:
                spec_from_hf_config(path)
            except ValueError as err:
                print(err)
            else:
                print(path, "built")
    """)
    out = subprocess.run([sys.executable, "-c", code, str(layers), str(experts)], capture_output=True, text=True,
                         timeout=60)
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and len(lines) == 2, out.stderr
    assert lines[0].startswith(f"{layers}: field 'num_hidden_layers' must be an integer from 1 to 4,096"), lines
    assert lines[1].startswith(f"{experts}: field 'num_local_experts' must be an integer from 1 to 4,096"), lines


def test_the_largest_accepted_sizes_still_build():
    spec = spec_from_hf_config(config(LLAMA, num_hidden_layers=4096, **TINY))
    assert len(spec) == 4096 * 9 + 2 and spec.paths[-2] == "model.layers.4095.post_attention_layernorm.weight"
    assert spec.num_params == 16 * 8 + 4096 * (4 * 8 * 8 + 3 * 8 * 8 + 2 * 8) + 8


# --- item 14: a spec's totals are exact, and a total past int64 is refused -------------------------------

def test_model_spec_totals_past_int64_are_refused_not_wrapped_negative():
    # Each array is 2**62 bytes (within int64); three of them wrapped the old int64 sum to -4.6e18.
    huge = tuple(ParamSpec(f"layers.{i}.w", (2**60,), "float32") for i in range(3))
    with pytest.raises(ValueError, match=r"ModelSpec 'huge' holds 13,835,058,055,282,163,712 bytes in 3 parameters: "
                                         r"the total does not fit in int64"):
        ModelSpec("huge", huge)
    with pytest.raises(ValueError, match="does not fit in int64"):
        ModelSpec("just over", (ParamSpec("a", (2**60,), "float32"), ParamSpec("b", (2**62,), "uint8")))


def test_model_spec_totals_are_exact_python_ints_up_to_the_int64_limit():
    spec = ModelSpec("top", (ParamSpec("a", (2**60,), "float32"), ParamSpec("b", (2**62 - 1,), "uint8")))
    assert spec.nbytes == 2**63 - 1 and type(spec.nbytes) is int
    assert spec.num_params == 2**60 + 2**62 - 1 and type(spec.num_params) is int
    assert [p.nbytes for p in spec] == [2**62, 2**62 - 1]


# --- item 15: malformed fields name the field and the file ----------------------------------------------

@pytest.mark.parametrize("changes,field,says", [
    ({"model_type": ["llama"]}, "model_type", "must be a string"),           # was TypeError: unhashable
    ({"model_type": 5}, "model_type", "must be a string"),
    ({"architectures": 5}, "architectures", "must be a list of strings"),  # was a bare TypeError
    ({"architectures": "LlamaForCausalLM"}, "architectures", "got 'LlamaForCausalLM'"),  # was read letter by letter
    ({"architectures": [5]}, "architectures", "must be a list of strings"),
    ({"layer_types": "full_attention"}, "layer_types", "must be a list of strings"),
    ({"torch_dtype": ["bfloat16"]}, "torch_dtype", "must be a dtype name"),
    ({"_name_or_path": ["x"]}, "_name_or_path", "must be a string"),        # was taken as the name "['x']"
    ({"hidden_size": 10**30}, "hidden_size", "got 1000000000000000000000000000000"),  # was a ParamSpec error
    ({"hidden_size": True}, "hidden_size", "got True"),
    ({"hidden_size": 2048.5}, "hidden_size", "got 2048.5"),
    ({"hidden_size": 2048.0}, "hidden_size", "got 2048.0"),
    ({"hidden_size": "2048"}, "hidden_size", "got '2048'"),
    ({"hidden_size": float("nan")}, "hidden_size", "got nan"),
    ({"num_hidden_layers": -16}, "num_hidden_layers", "got -16"),
    ({"vocab_size": None}, "vocab_size", "is required and absent"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings", "must be true or false"),
])
def test_malformed_field_types_name_the_field_and_the_file(tmp_path, changes, field, says):
    path = write(tmp_path, config(LLAMA, **changes), "odd.json")
    with pytest.raises(ValueError) as err:
        spec_from_hf_config(path)
    message = str(err.value)
    assert message.startswith(f"{path}: field '{field}' ") and says in message, message


@pytest.mark.parametrize("file,changes,field", [
    ("qwen3_30b_a3b.json", {"mlp_only_layers": "1"}, "mlp_only_layers"),
    ("qwen3_30b_a3b.json", {"mlp_only_layers": [1, True]}, "mlp_only_layers"),
    ("deepseek_v3.json", {"topk_method": ["noaux_tc"]}, "topk_method"),
])
def test_malformed_family_fields_name_the_field_and_the_file(tmp_path, file, changes, field):
    path = write(tmp_path, config(file, **changes), "odd.json")
    with pytest.raises(ValueError, match=rf"^{path}: field '{field}' "):
        spec_from_hf_config(path)


def test_hostile_json_names_the_field_and_the_file(tmp_path):
    text = json.dumps(config(LLAMA))
    cases = {
        # was RecursionError, naming no file
        "deep.json": (text[:-1] + ', "quirk": ' + "[" * 100_000 + "]" * 100_000 + "}",
                      f"field 'quirk' is nested deeper than {MAX_JSON_DEPTH} levels"),
        # was "Exceeds the limit (4300 digits)", naming neither field nor file
        "digits.json": (text.replace('"vocab_size": 128256', '"vocab_size": ' + "9" * 5000),
                        "field 'vocab_size' holds a 5,000-digit integer"),
        "nested_digits.json": (text[:-1] + ', "quirk": {"factor": [1, ' + "9" * 200 + "]}}",
                               "field 'quirk.factor[1]' holds a 200-digit integer"),
        # was silently the last value
        "twice.json": (text[:-1] + ', "vocab_size": 16}', "field 'vocab_size' appears twice"),
        "top_deep.json": ("[" * 100 + "]" * 100, "the JSON is nested deeper"),
        # was read whole (16 MiB of padding in a field the builder never reads)
        "big.json": (text[:-1] + ', "padding": "' + "x" * MAX_CONFIG_BYTES + '"}', f"larger than {MAX_CONFIG_BYTES:,}"),
    }
    for name, (content, says) in cases.items():
        (tmp_path / name).write_text(content)
        with pytest.raises(ValueError) as err:
            spec_from_hf_config(tmp_path / name)
        assert str(err.value).startswith(f"{tmp_path / name}: ") and says in str(err.value), (name, str(err.value))
    with pytest.raises(ValueError, match=r"^model: .*deep\.json: field 'quirk' is nested"):
        resolve_architecture(tmp_path / "deep.json")  # the architecture path reads the file the same way


def test_a_config_dict_with_an_unprintable_integer_names_the_field():
    for field in ("head_dim", "_name_or_path"):
        with pytest.raises(ValueError, match=rf"^config dict: field '{field}' .*16,610-bit integer"):
            spec_from_hf_config(config(LLAMA, **{field: 10**5000}))  # its repr raised "Exceeds the limit"


def test_brackets_inside_strings_do_not_count_as_nesting_and_published_configs_load_unchanged():
    assert loads_bounded('{"a": "' + "[{" * 100 + '", "b": [[1]]}', "f.json") == {"a": "[{" * 100, "b": [[1]]}
    assert loads_bounded('{"a": -' + "9" * 100 + "}")["a"] == -int("9" * 100)
    for path in sorted(DATA.glob("*.json")):
        assert load_hf_config(path) == (json.loads(path.read_text()), str(path))


def test_a_path_the_system_cannot_look_up_is_a_value_error_not_an_oserror():
    long_name = "config" * 1000 + ".json"  # past NAME_MAX: is_file() raised OSError ENAMETOOLONG
    with pytest.raises(ValueError, match=r"^'configconfig.*\.json': cannot be read \(File name too long\)"):
        spec_from_hf_config(long_name)
    for resolve in (resolve_spec, resolve_architecture):
        with pytest.raises(ValueError, match=r"^model: 'configconfig.*' cannot be read"):
            resolve(long_name)
