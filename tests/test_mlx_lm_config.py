"""A third-party model from its config, in one process: mlx-lm's own classes built from a config.json (no
weights), their parameters those the workbench's shape builder counts, the blocks a fully sharded run wraps,
and the extras that install it (mlx-lm; cuda)."""

import json
import sys
import tomllib
from pathlib import Path

import numpy as np
import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from packaging.requirements import Requirement

from workbench.adapters.mlx.base import spec_from_mlx
from workbench.core.hf_config import spec_from_hf_config
from workbench.core.paths import REPO_ROOT
from workbench.models.init import LMConfig, lm_config_from_hf
from workbench.models.mlx_lm_config import build_mlx_lm, mlx_lm_class_name, mlx_lm_factory
from workbench.ranks.user_model import block_units

DATA = Path(__file__).parent / "data"
HF = DATA / "hf_configs"
TINY = {"llama": DATA / "mlx_lm_tiny_llama.json", "qwen3": DATA / "mlx_lm_tiny_qwen3.json"}


def shrunk(file, **shape):
    """A published config with its shape fields made small (the rest as published)."""
    return {**json.loads((HF / file).read_text()), **shape}


SMALL = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
             vocab_size=256)


@pytest.mark.parametrize("name", sorted(TINY))
def test_the_model_is_mlx_lms_own_class_with_the_shapes_the_workbench_counts(name):
    model, loss_fn = mlx_lm_factory(TINY[name], seed=3)
    assert type(model).__module__ == f"mlx_lm.models.{name}" and type(model).__name__ == "Model"
    built = spec_from_mlx(model)
    counted = spec_from_hf_config(TINY[name], dtype="float32")
    assert {p.path: p.shape for p in built} == {p.path: p.shape for p in counted}  # path for path, shape for shape
    assert {p.dtype for p in built} == {"float32"}
    tokens = mx.array(np.random.default_rng(0).integers(0, 256, (2, 129)), dtype=mx.int32)
    loss = loss_fn(model, tokens[:, :-1], tokens[:, 1:]).item()
    logits = np.array(model(tokens[:, :-1]).astype(mx.float32), dtype=np.float64)  # (2, 128, 256)
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    picked = np.take_along_axis(logp, np.array(tokens[:, 1:])[..., None], -1)
    assert logits.shape == (2, 128, 256) and loss == pytest.approx(-picked.mean(), rel=1e-5)  # mean CE, nats
    again, _ = mlx_lm_factory(TINY[name], seed=3)
    other, _ = mlx_lm_factory(TINY[name], seed=4)
    w = "model.layers.0.mlp.up_proj.weight"
    first, same, different = (np.array(dict(tree_flatten(m.parameters()))[w]) for m in (model, again, other))
    assert np.array_equal(first, same) and not np.array_equal(first, different)  # the seed decides the weights


@pytest.mark.parametrize("file,shape,cls", [
    ("mistral_7b_v0_1.json", SMALL, "mlx_lm.models.llama.Model"),  # MODEL_REMAPPING: mistral -> llama
    ("kimi_k2_instruct.json", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, vocab_size=256,
                                   intermediate_size=128, moe_intermediate_size=32, n_routed_experts=4,
                                   num_experts_per_tok=2, n_group=1, topk_group=1, q_lora_rank=32, kv_lora_rank=16,
                                   qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, first_k_dense_replace=1),
     "mlx_lm.models.deepseek_v3.Model"),  # kimi_k2 -> deepseek_v3, as the shape builder maps it
])
def test_remapped_model_types_build_the_class_mlx_lm_loads_and_the_shapes_agree(file, shape, cls):
    config = shrunk(file, **shape)
    config.pop("quantization_config", None)  # the shapes of the bf16 model it trains as
    assert mlx_lm_class_name(config) == cls
    built, counted = spec_from_mlx(build_mlx_lm(config)), spec_from_hf_config(config, dtype="float32")
    if cls.endswith("llama.Model"):
        assert {p.path: p.shape for p in built} == {p.path: p.shape for p in counted}
    else:  # mlx-lm stacks the experts (switch_mlp) and splits kv_b_proj (embed_q, unembed_out): other arrays
        assert built.num_params == counted.num_params


def test_a_config_mlx_lm_cannot_build_is_refused_naming_the_file_and_the_field(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(TINY["llama"].read_text()), "model_type": "no_such_arch"}))
    with pytest.raises(ValueError, match=rf"{path}: field 'model_type' = 'no_such_arch' is not an architecture"):
        build_mlx_lm(path)
    with pytest.raises(ValueError, match=r"config dict: field 'model_type' must name an mlx-lm architecture"):
        build_mlx_lm({"model_type": "../llama"})
    lacking = json.loads(TINY["qwen3"].read_text())
    del lacking["num_key_value_heads"]
    with pytest.raises(ValueError, match=r"field 'num_key_value_heads' is required by mlx_lm.models.qwen3.ModelArgs"):
        build_mlx_lm(lacking)
    with pytest.raises(ValueError, match=r"no such config file"):
        build_mlx_lm(tmp_path / "missing.json")


def test_a_fully_sharded_run_wraps_the_repeated_blocks_not_the_whole_model():
    sys.path.insert(0, str(REPO_ROOT))
    from examples.tiny_attention_lm import mlx_factory as attention
    from examples.tiny_mlp_lm import mlx_factory as mlp

    assert block_units(build_mlx_lm(TINY["llama"])) == ["model.layers.0", "model.layers.1"]  # nested: mlx-lm's
    assert block_units(attention()[0]) == ["blocks.0", "blocks.1"]  # a user's `blocks`
    assert block_units(mlp()[0]) == []  # no repeated blocks: the model is one unit
    from workbench.models.mlx_lm import MLXLM
    from workbench.models.init import LMConfig

    lm = MLXLM(LMConfig(vocab_size=64, seq_len=8, dim=32, num_layers=3, num_heads=2, mlp_dim=64))
    assert block_units(lm) == ["layers.0", "layers.1", "layers.2"]  # the built-in LM: as shard_model's default
    from mlx.utils import tree_flatten

    from workbench.core.fully_shard_plan import propose_units
    from workbench.core.specs import spec_from_flat

    for model in (build_mlx_lm(TINY["llama"]), attention()[0], mlp()[0], lm):  # what the plan counts, collectives too
        spec = spec_from_flat([(k, v.shape, "float32") for k, v in tree_flatten(model.parameters())], "m")
        assert block_units(model) == propose_units(spec)


def test_the_extras_install_mlx_lm_and_the_cuda_builds():
    optional = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    reqs = {name: [Requirement(x) for x in lines] for name, lines in optional.items()}
    assert "mlx-lm" in optional["all"][0] and "cuda" not in optional["all"][0]  # a CPU machine has no CUDA builds
    cuda = {r.name: r for r in reqs["cuda"]}
    assert cuda["mlx"].extras == {"cuda12"} and cuda["jax"].extras == {"cuda12"}
    mlx_cpu = next(r for r in reqs["mlx"] if r.marker.evaluate({"sys_platform": "linux"}))
    jax = next(r for r in reqs["jax"] if r.name == "jax")
    assert cuda["mlx"].specifier == mlx_cpu.specifier and cuda["jax"].specifier == jax.specifier  # the same releases
    assert {r.name for r in reqs["jax"]} <= set(cuda) and "mlx-lm" in cuda
    mlx_lm = next(r for r in reqs["mlx-lm"] if r.name == "mlx-lm")
    assert ">=" in {s.operator for s in mlx_lm.specifier} and "<" in {s.operator for s in mlx_lm.specifier}
    pins = dict(line.split("==") for line in (REPO_ROOT / "constraints.txt").read_text().splitlines()
                if line and not line.startswith("#"))
    assert mlx_lm.specifier.contains(pins["mlx-lm"]) and pins["mlx"] == pins["mlx-cpu"]  # one MLX, mlx-lm's too


def test_the_workbench_lm_takes_a_configs_shape_for_the_jax_side_of_its_runs(tmp_path):
    """JAX trains no mlx-lm class: its side of a config's runs is the workbench's LM with the config's width, depth,
    heads, MLP width, vocabulary and tied head (tests/test_mlx_lm_runs.py), counted as the workbench counts it."""
    config = lm_config_from_hf(DATA / "mlx_lm_tiny_qwen3.json", seq_len=128)
    assert config == LMConfig(vocab_size=256, seq_len=128, dim=64, num_layers=2, num_heads=4, mlp_dim=128,
                              tie_embeddings=True)
    raw = json.loads((DATA / "mlx_lm_tiny_llama.json").read_text())
    assert lm_config_from_hf({**raw, "tie_word_embeddings": False}, seq_len=32).tie_embeddings is False
    for change, field in (({"hidden_size": None}, "hidden_size"), ({"num_hidden_layers": 2.5}, "num_hidden_layers"),
                          ({"head_dim": 32}, "head_dim"), ({"tie_word_embeddings": "yes"}, "tie_word_embeddings")):
        path = tmp_path / "config.json"
        path.write_text(json.dumps({**raw, **change}))
        with pytest.raises(ValueError, match=rf"^{path}: field '{field}' "):
            lm_config_from_hf(tmp_path, seq_len=32)  # a folder holding config.json, as a local snapshot
    with pytest.raises(ValueError, match="seq_len"):
        lm_config_from_hf(raw, seq_len=0)
    raw_heads = {**raw, "num_attention_heads": 5}
    raw_heads.pop("head_dim", None)
    with pytest.raises(ValueError, match="field 'num_attention_heads' = 5 does not divide hidden_size = 64"):
        lm_config_from_hf(raw_heads, seq_len=32)
    untied = {k: v for k, v in raw.items() if k != "tie_word_embeddings"}  # absent: the config class's default
    assert lm_config_from_hf(untied, seq_len=32).tie_embeddings is False  # LlamaConfig's
