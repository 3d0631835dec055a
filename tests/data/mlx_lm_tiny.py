"""Factories of two tiny mlx-lm models built from configs (tests/test_mlx_lm_runs.py): a Llama-3.2-style and a
Qwen3-style ``config.json`` with the published files' fields (tests/data/hf_configs/llama3_2_1b.json,
qwen3_0_6b.json), their shape fields made small: 2 layers, width 64, 4 heads of 16, 2 KV heads, MLP 128,
256 tokens (examples/data/markov_v256.bin's vocabulary)."""

from pathlib import Path

from workbench.models.mlx_lm_config import mlx_lm_factory

HERE = Path(__file__).resolve().parent


def llama_factory(seed: int = 0):
    return mlx_lm_factory(HERE / "mlx_lm_tiny_llama.json", seed=seed)


def qwen3_factory(seed: int = 0):
    return mlx_lm_factory(HERE / "mlx_lm_tiny_qwen3.json", seed=seed)
