"""JAX's persistent compilation cache on the workbench's ranks: where it lives, how it is refused, and that a
second run of a spec reads its steps back and stores the same record as the first, which compiled them."""

import json
import os
from pathlib import Path

import pytest

from workbench.adapters.jax.compile_cache import CACHE_ENV, compile_cache_dir, enable_compile_cache
from workbench.launch.plan import plan_launch
from workbench.ranks.shared_compile import (COMPILED, LOADED, STEP_CACHED, compile_folder, compile_step, program_digest,
                                            step_cache_file)
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
    assert cached[0]["compile_cache"]["hits"] + cached[0]["compile_cache"]["misses"] >= 3  # the step and its helpers
    # rank 0 read every program back (the first run stored them); JAX writes only process 0's entries. Rank 1
    # loaded the step rank 0 compiled in the first run; in the second, rank 0's was read back from JAX's cache
    # (not shareable), so rank 1 loaded the first run's executable from the step cache instead of compiling.
    assert cached[0]["compile_cache"]["misses"] == 0, cached[0]["compile_cache"]
    assert [r["step_program"] for r in _ranks(first, run_id)] == [COMPILED, LOADED]
    assert [r["step_program"] for r in cached] == [COMPILED, STEP_CACHED]
    assert _losses(second, run_id) == _losses(first, run_id)
    for a, b in zip(_ranks(first, run_id), cached):  # the executable read back is the one compiled
        assert a["compiled_collectives"] == b["compiled_collectives"]
        assert a["compiled_memory"] == b["compiled_memory"]
        assert a["collective_path"] == b["collective_path"]


def _lowered(width: int = 8):
    import jax
    import jax.numpy as jnp

    def f(w, x):
        return jnp.tanh(x @ w).sum(), x @ w

    args = (jnp.arange(width * width, dtype=jnp.float32).reshape(width, width) / width**2, jnp.ones((4, width)))
    return jax.jit(f, donate_argnums=1).lower(*args), args


def test_a_rank_loads_rank_0s_executable_of_its_own_program_and_it_computes_what_its_own_compile_does(tmp_path,
                                                                                                    monkeypatch):
    import jax
    import numpy as np

    monkeypatch.setenv(CACHE_ENV, f"{tmp_path}-cache")  # its step cache its own, not the session's

    lowered, (w, x) = _lowered()
    text = lowered.as_text()
    one = jax.devices()[:1]
    first, how = compile_step(lowered, text, 0, tmp_path, one)
    assert how == COMPILED and sorted(p.name for p in tmp_path.iterdir()) == ["step.digest", "step.executable"]
    loaded, how = compile_step(lowered, text, 1, tmp_path, one)
    assert how == LOADED
    own = lowered.compile()
    want = jax.device_get(own(w, x.copy()))
    for got in (jax.device_get(loaded(w, x.copy())), jax.device_get(first(w, x.copy()))):
        assert all(np.array_equal(a, b) for a, b in zip(got, want))
    # the same HLO; only the stack frames JAX appends for the source lines (which file lowered it) may differ
    assert loaded.as_text().split("\nFileNames")[0] == own.as_text().split("\nFileNames")[0]
    assert loaded.memory_analysis().temp_size_in_bytes == own.memory_analysis().temp_size_in_bytes
    other, other_args = _lowered(16)  # another program than rank 0's: compiled, never rank 0's executable run
    compiled, how = compile_step(other, other.as_text(), 1, tmp_path, one)
    assert how == COMPILED and compiled(*other_args)[1].shape == (4, 16)
    assert compile_step(lowered, text, 1, None)[1] == COMPILED  # no folder (ranks on other hosts): compiled
    with pytest.raises(ValueError, match="must name the program's devices"):
        compile_step(lowered, text, 1, tmp_path)
    tmp_path.chmod(0o755)  # a folder others may read is refused before anything is loaded from it
    with pytest.raises(PermissionError, match="this user alone"):
        compile_step(lowered, text, 1, tmp_path, one)


def test_a_rank_loads_an_earlier_runs_step_from_the_step_cache_where_rank_0_read_its_own_from_jaxs(tmp_path,
                                                                                                     monkeypatch):
    import jax
    import numpy as np

    from workbench.ranks import shared_compile

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    lowered, (w, x) = _lowered()
    text, one = lowered.as_text(), jax.devices()[:1]
    digest = program_digest(text, [d.id for d in one])
    for name in ("first", "second"):
        (tmp_path / name).mkdir(mode=0o700)
    assert compile_step(lowered, text, 0, tmp_path / "first", one)[1] == COMPILED  # a fresh compile: kept
    kept = step_cache_file(digest)
    assert kept.parent == tmp_path / "cache" / "steps" and kept.exists()
    assert kept.read_bytes()[32:] == (tmp_path / "first" / "step.executable").read_bytes()  # behind its sha256
    assert (kept.parent.stat().st_mode & 0o077) == 0  # this user's alone
    # a later run: rank 0 read its step back from JAX's cache, which it cannot share
    (tmp_path / "second" / "step.digest").write_text(digest)
    (tmp_path / "second" / "step.unshared").write_text("rank 0 read its step from the compile cache")
    loaded, how = compile_step(lowered, text, 1, tmp_path / "second", one)
    assert how == STEP_CACHED
    want = jax.device_get(lowered.compile()(w, x.copy()))
    assert all(np.array_equal(a, b) for a, b in zip(jax.device_get(loaded(w, x.copy())), want))
    kept.write_bytes(b"not an executable")  # unreadable: compiled, and the fresh compile kept
    assert compile_step(lowered, text, 1, tmp_path / "second", one)[1] == COMPILED
    assert kept.read_bytes() != b"not an executable"
    assert compile_step(lowered, text, 1, tmp_path / "second", one)[1] == STEP_CACHED
    damaged = bytearray(kept.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF  # one flipped byte: its sha256 no longer matches, so it is never loaded
    kept.write_bytes(bytes(damaged))
    assert compile_step(lowered, text, 1, tmp_path / "second", one)[1] == COMPILED
    assert compile_step(lowered, text, 1, tmp_path / "second", one)[1] == STEP_CACHED
    # compiled otherwise, another program: other $XLA_FLAGS or another JAX option (a compile option JAX derives)
    flags = os.environ.get("XLA_FLAGS", "")
    monkeypatch.setenv("XLA_FLAGS", f"{flags} --xla_cpu_enable_fast_math=false")
    assert program_digest(text, [d.id for d in one]) != digest
    monkeypatch.setenv("XLA_FLAGS", flags)
    effort = jax.config.values["jax_exec_time_optimization_effort"]
    try:
        jax.config.update("jax_exec_time_optimization_effort", 0.5)
        assert program_digest(text, [d.id for d in one]) != digest
    finally:
        jax.config.update("jax_exec_time_optimization_effort", effort)
    assert program_digest(text, [d.id for d in one]) == digest
    monkeypatch.setattr(shared_compile, "_machine", lambda: None)  # a CPU /proc/cpuinfo does not name: no cache
    assert step_cache_file(digest) is None
    monkeypatch.undo()
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    kept.parent.chmod(0o755)  # a folder others may read: nothing read or kept there
    assert step_cache_file(digest) is None
    assert compile_step(lowered, text, 1, tmp_path / "second", one)[1] == COMPILED
    kept.parent.chmod(0o700)
    monkeypatch.setattr(shared_compile, "STEP_CACHE_BYTES", 1)  # bounded: the least recently used out
    other, _ = _lowered(16)
    other_digest = program_digest(other.as_text(), [d.id for d in one])
    shared_compile._keep(other.compile(), step_cache_file(other_digest))
    assert [p.name for p in kept.parent.iterdir()] == [step_cache_file(other_digest).name]
    monkeypatch.setenv(CACHE_ENV, "off")
    assert step_cache_file(digest) is None


def test_rank_0s_failed_compile_fails_the_others_at_once_and_a_silent_rank_0_is_bounded(tmp_path, monkeypatch):
    import jax

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))  # "program" is not the lowered text: kept apart

    class Broken:
        def compile(self):
            raise RuntimeError("no memory for the step")

    lowered, _ = _lowered()
    one = jax.devices()[:1]
    for name in ("a", "b"):
        (tmp_path / name).mkdir(mode=0o700)
    with pytest.raises(RuntimeError, match="no memory for the step"):
        compile_step(Broken(), "program", 0, tmp_path / "a", one)
    with pytest.raises(RuntimeError, match="rank 0 could not compile the step: RuntimeError: no memory for the step"):
        compile_step(lowered, "program", 1, tmp_path / "a", one, wait_s=60)
    with pytest.raises(TimeoutError, match=r"rank 0 wrote neither .* within 0.2 s \(waited for .*step.digest\)"):
        compile_step(lowered, "program", 1, tmp_path / "b", one, wait_s=0.2)
    (tmp_path / "b" / "step.digest").write_text(program_digest("program", [d.id for d in one]))
    with pytest.raises(TimeoutError, match=r"waited for .*step.executable"):  # one bound for both waits
        compile_step(lowered, "program", 1, tmp_path / "b", one, wait_s=0.2)
    (tmp_path / "b" / "step.unshared").write_text("not serializable")  # rank 0 could not serialize: each compiles
    assert compile_step(lowered, "program", 1, tmp_path / "b", one, wait_s=60)[1] == COMPILED


def test_a_program_that_cannot_be_serialized_is_compiled_by_each_rank(tmp_path):
    import jax
    import jax.numpy as jnp

    def noisy(x):
        jax.debug.print("x sums to {}", x.sum())  # a host callback: JAX cannot pickle it
        return x * 2

    lowered, one = jax.jit(noisy).lower(jnp.ones(4)), jax.devices()[:1]
    compiled, how = compile_step(lowered, lowered.as_text(), 0, tmp_path, one)
    assert how == COMPILED and (tmp_path / "step.unshared").exists() and not (tmp_path / "step.executable").exists()
    assert "pickle" in (tmp_path / "step.unshared").read_text().lower()
    compiled, how = compile_step(lowered, lowered.as_text(), 1, tmp_path, one, wait_s=60)
    assert how == COMPILED and float(compiled(jnp.ones(4)).sum()) == 8.0


def test_only_a_jax_run_of_several_ranks_all_on_this_machine_shares_a_folder():
    for args in (("mlx", 2, True), ("jax", 1, True), ("jax", 2, False)):
        with compile_folder(*args) as folder:
            assert folder is None, args
    with compile_folder("jax", 2, True) as folder:
        assert Path(folder).is_dir() and (Path(folder).stat().st_mode & 0o077) == 0  # this user's only
    assert not Path(folder).exists()
