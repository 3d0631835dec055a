"""JAX's persistent compilation cache on the workbench's ranks: where it lives, how it is refused, and that a
second run of a spec reads its steps back and stores the same record as the first, which compiled them."""

import json
from pathlib import Path

import pytest

from workbench.adapters.jax.compile_cache import CACHE_ENV, compile_cache_dir, enable_compile_cache
from workbench.launch.plan import plan_launch
from workbench.runs.spec import RunSpec

TINY = dict(vocab_size=32, seq_len=8, dim=16, num_layers=1, num_heads=2, mlp_dim=32)


def test_the_cache_folder_is_the_variables_else_the_workbench_cache_in_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert compile_cache_dir({}) == tmp_path / ".cache" / "workbench" / "jax"
    assert compile_cache_dir({CACHE_ENV: "  "}) == tmp_path / ".cache" / "workbench" / "jax"
    assert compile_cache_dir({CACHE_ENV: str(tmp_path / "c")}) == tmp_path / "c"
    assert compile_cache_dir({CACHE_ENV: "~/c"}) == tmp_path / "c"
    for off in ("off", "OFF", "0", "none", "false"):
        assert compile_cache_dir({CACHE_ENV: off}) is None
        assert enable_compile_cache({CACHE_ENV: off}) is None  # JAX is left as it is


@pytest.mark.parametrize("value, says", [("relative/cache", "must be an absolute folder"), ("<file>", "is a file")])
def test_a_bad_cache_variable_is_refused_by_the_launch_plan_naming_it(tmp_path, monkeypatch, value, says):
    (tmp_path / "f").write_text("x")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "f") if value == "<file>" else value)
    with pytest.raises(ValueError, match=rf"\$WORKBENCH_JAX_CACHE=.*{says}"):
        plan_launch(2, framework="jax", ports=[1])
    assert plan_launch(2, framework="mlx", ports=[1, 2]).num_ranks == 2  # MLX compiles nothing: not read


def _ranks(root: Path, run_id: str) -> list[dict]:
    return json.loads((root / run_id / "record.json").read_text())["summary"]["ranks"]


def _losses(root: Path, run_id: str) -> list[float]:
    return [json.loads(line)["loss"] for line in (root / run_id / "steps.jsonl").read_text().splitlines()]


def test_a_second_run_reads_every_compiled_program_back_and_stores_the_same_record(tmp_path):
    from workbench.launch.driver import run_training

    spec = RunSpec(framework="jax", strategy="fsdp-row", num_ranks=2, steps=2, global_batch=4, model=TINY,
                   num_microbatches=2, defer_sync=False, data_seed=7)
    first, second = tmp_path / "first", tmp_path / "second"
    for root in (first, second):
        assert run_training(spec, root).status == "done"
    run_id = next(p.name for p in first.iterdir() if p.is_dir())
    cached = _ranks(second, run_id)
    for rank in cached:
        assert rank["compile_cache"]["folder"] == str(compile_cache_dir())
        assert rank["compile_cache"]["hits"] + rank["compile_cache"]["misses"] >= 3  # the step and its helpers
    # rank 0 read every program back (the first run stored them); JAX writes only process 0's entries
    assert cached[0]["compile_cache"]["misses"] == 0, cached[0]["compile_cache"]
    assert _losses(second, run_id) == _losses(first, run_id)
    for a, b in zip(_ranks(first, run_id), cached):  # the executable read back is the one compiled
        assert a["compiled_collectives"] == b["compiled_collectives"]
        assert a["compiled_memory"] == b["compiled_memory"]
        assert a["collective_path"] == b["collective_path"]
