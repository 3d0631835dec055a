"""Every test's markers, by module, and a check that a test left unmarked stays in this one process.

Markers (registered in ``pyproject.toml``):

* ``process``: starts other processes (ranks, engines, kernels, a build, a server, a probe interpreter).
* ``browser``: drives Chromium.
* ``rig``: needs the multi-host rig (network namespaces, sshd, Slurm; root).
* ``network``: opens sockets (binds on 127.0.0.1, or asks the package index).

The fast inner loop, ``python3 -m pytest -m "not process and not browser and not rig" -q``, runs the
tests that need nothing but this process. A module takes its markers from :data:`MODULE_MARKERS`
(``tests/test_markers.py`` fails on a test module missing from it); a test named in
:data:`TEST_MARKERS` takes that entry's markers instead of its module's. nbval's notebook items are
``process`` (each runs a kernel). While a test not marked ``process`` runs (setup to teardown), starting a
process (``subprocess``, ``os.fork``/``exec``/``spawn``/``system``) fails its teardown with
:class:`UnmarkedProcessError` naming the test, so a new test that starts processes cannot stay in the fast loop.

Also :func:`shared_runs`: a run that several modules train with the same spec is trained once a session, and a
run a notebook's sweep will run under nbval is stored in that notebook's run store too (:data:`NBVAL_SWEEPS`), so
nbval, which runs after the tests, finds it done instead of training it again. And one JAX compilation cache for
the session (:func:`pytest_configure`): a step compiled once is read back by every later run of it.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import os
import resource
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path

import pytest

PROCESS, BROWSER, RIG, NETWORK = "process", "browser", "rig", "network"
ENGINES = (PROCESS, NETWORK)  # ipyparallel's controller and engines talk over 127.0.0.1

#: Markers of every test module under tests/, by module name (the path under tests/, without ``.py``).
MODULE_MARKERS: dict[str, tuple[str, ...]] = {
    "test_accumulation": (),
    "test_adapters": (),
    "test_advisor": (),
    "test_architecture": (),
    "test_browser": (BROWSER, *ENGINES),
    "test_build": ENGINES,
    "test_build_inputs": ENGINES,
    "test_cli_errors": (PROCESS,),
    "test_compile_cache": (),
    "test_cluster_profile": ENGINES,
    "test_collectives": ENGINES,
    "test_comm": (),
    "test_config_inputs": (),
    "test_cross_framework": (),
    "test_data": (),
    "test_deck_findings": (),
    "test_driver_faults": ENGINES,
    "test_engine_death": ENGINES,
    "test_engine_pool": ENGINES,
    "test_engines": ENGINES,
    "test_examples": (),
    "test_explorer_export": (PROCESS,),
    "test_explorer_layout": (),
    "test_factory_seed": ENGINES,
    "test_figure_checks": (),
    "test_figures": (),
    "test_formatting": (),
    "test_fully_shard": ENGINES,
    "test_fully_shard_record": (),
    "test_fully_shard_runs": ENGINES,
    "test_fully_shard_study": (),
    "test_hf_config": (),
    "test_hosts_input": (),
    "test_hosts_rig": (RIG, *ENGINES),
    "test_input_checks": (),
    "test_jax_accum": (),
    "test_jax_fsdp": (),
    "test_jax_multiprocess": ENGINES,
    "test_jax_resident_buckets": (),
    "test_labsave": (),
    "test_launcher_injection": (RIG, *ENGINES),
    "test_markers": (),
    "test_memory": (),
    "test_memory_view": (),
    "test_mlx_blas": (),
    "test_mlx_fsdp": ENGINES,
    "test_mlx_hsdp_mpi": ENGINES,
    "test_mlx_lm_config": (),
    "test_mlx_lm_runs": ENGINES,
    "test_mlx_ring": (),
    "test_mlx_peak_memory": ENGINES,
    "test_mlx_zero3": ENGINES,
    "test_models": (),
    "test_moe": (),
    "test_multihost": (RIG, *ENGINES),
    "test_multihost_slurm": (RIG, *ENGINES),
    "test_nbtools": ENGINES,
    "test_newest_versions": ENGINES,
    "test_notebook_checks": (),
    "test_notebook_hosts": (),
    "test_packaging": (),
    "test_plan_advisor": (),
    "test_plan_validate": ENGINES,
    "test_planners": (),
    "test_preset_shapes": (),
    "test_presets": (),
    "test_profile": (),
    "test_profile_runs": ENGINES,
    "test_progress_view": (),
    "test_rank_fingerprint": ENGINES,
    "test_rank_programs_are_product": (),
    "test_readme": (),
    "test_readme_commands": (PROCESS,),
    "test_readme_mlx_api": (),
    "test_resolve": (),
    "test_runs_view": (),
    "test_runstore": (),
    "test_slides": (),
    "test_step_time": (),
    "test_step_timing_workers": ENGINES,
    "test_store_faults": (),
    "test_stored_outputs": (),
    "test_sweep": (),
    "test_tokens": (),
    "test_train_jax": ENGINES,
    "test_resident_train_jax": ENGINES,
    "test_resident_jax": (),
    "test_resident_mlx": ENGINES,
    "test_resident_mlx_local": (),
    "test_training": ENGINES,
    "test_user_model_runs": ENGINES,
    "test_validation": ENGINES,
    "test_whole_numbers": (),
    "test_widgets": (),
    "test_widgets_sync": (),
    "test_wrong_data": ENGINES,
    "test_your_model_study": (),
}

#: Tests whose markers differ from their module's, as ``module::function`` (every parametrisation).
TEST_MARKERS: dict[str, tuple[str, ...]] = {
    # a probe interpreter or a shell beside one-process tests
    "test_adapters::test_import_workbench_without_mlx_or_jax": (PROCESS,),
    "test_mlx_blas::test_a_rank_given_the_plan_computes_as_numpy_does_and_names_its_blas": (PROCESS,),
    "test_architecture::test_the_public_api_imports_from_the_package_and_loads_frameworks_lazily": (PROCESS,),
    "test_config_inputs::test_the_sizes_that_ran_for_minutes_are_refused_at_once": (PROCESS,),
    "test_hf_config::test_no_framework_is_imported": (PROCESS,),
    "test_packaging::test_fresh_check_runs_the_readme_commands_verbatim": (PROCESS,),
    "test_packaging::test_a_failed_apt_get_still_runs_the_tests": (PROCESS,),
    "test_runstore::test_concurrent_appends_from_two_processes_never_interleave": (PROCESS,),
    "test_store_faults::test_a_second_writer_is_refused_naming_the_run_and_the_owner": (PROCESS,),
    "test_store_faults::test_a_run_whose_owner_died_is_marked_failed_and_redone_in_a_fresh_attempt": (PROCESS,),
    "test_store_faults::test_rows_a_stray_writer_of_an_earlier_attempt_appends_are_never_read": (PROCESS,),
    "test_tokens::test_a_fresh_process_draws_the_same_batch": (PROCESS,),
    # a kernel, engines or ranks beside one-process tests
    "test_compile_cache::test_a_second_run_reads_every_compiled_program_back_and_stores_the_same_record": ENGINES,
    "test_jax_accum::test_two_engines_train_fsdp_with_per_micro_batch_sync_like_one_large_batch": ENGINES,
    "test_labsave::test_refresh_stores_notebooks_as_lab_saves_them": ENGINES,
    "test_labsave::test_every_figure_gets_a_png_snapshot_once_and_nothing_else_changes": (PROCESS, BROWSER),
    "test_slides::test_export_embeds_plotlyjs_once_in_the_head_and_loads_nothing_remote": ENGINES,
    "test_slides::test_export_keeps_widgets_the_vendored_renderer_draws_and_drops_the_others": ENGINES,
    "test_slides::test_export_copies_exactly_the_assets_it_references": ENGINES,
    "test_slides::test_export_without_widgets_copies_no_widget_renderer": ENGINES,
    "test_slides::test_an_output_that_loads_from_a_cdn_is_refused_naming_the_notebook": ENGINES,
    # one-process tests in modules that start engines or ranks
    "test_build::test_progress_printer_lines_and_status": (),
    "test_build::test_sweep_clock_estimates_from_the_pace_of_steps": (),
    "test_build::test_a_terminal_gets_one_status_line_with_a_bar": (),
    "test_build::test_all_done_means_every_run_stored_and_done": (),
    "test_collectives::test_fit_recovers_known_constants": (),
    "test_collectives::test_bad_benchmark_knobs_name_the_field": (),
    "test_collectives::test_mlx_benchmark_calls_back_to_back_unless_the_ranks_outnumber_the_cores": (),
    "test_driver_faults::test_run_training_knobs_are_refused_before_anything_starts_naming_the_knob": (),
    "test_engine_death::test_last_words_drop_ipyparallel_chatter_and_fold_a_long_crash_stack": (),
    "test_engine_death::test_describe_exit_names_the_signal_or_the_code": (),
    "test_engine_death::test_an_engine_started_through_ssh_is_neither_waited_for_nor_read_as_a_local_one": (),
    "test_engine_pool::test_a_sweep_checks_a_model_factory_once_for_what_the_check_depends_on": (),
    "test_engines::test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range": (NETWORK,),
    "test_factory_seed::test_a_factory_drawing_from_global_generators_builds_the_same_weights_every_call": (),
    "test_factory_seed::test_a_stalled_start_is_told_by_phase_and_a_stalled_step_stays_a_hung_collective": (),
    "test_fully_shard::test_units_are_the_blocks_plus_the_root_and_tile_the_model": (),
    "test_fully_shard::test_named_units_nest_innermost_first_and_compute_dtype_and_microbatches_count": (),
    "test_fully_shard::test_bad_units_are_refused_by_name": (),
    "test_fully_shard::test_readiness_lists_every_indivisible_parameter_of_published_configs": (),
    "test_fully_shard::test_readiness_names_scalars_and_quantized_layers": (),
    "test_fully_shard::test_migration_note_says_what_each_setting_becomes": (),
    "test_fully_shard::test_migration_note_counts_collectives_on_both_sides": (),
    "test_fully_shard::test_the_api_table_matches_the_installed_mlx": (),
    "test_fully_shard::test_the_trainer_over_one_rank_is_a_plain_step_and_refuses_deferred_sync": (),
    "test_fully_shard::test_a_group_of_one_needs_no_sum_scatter_and_changes_nothing": (),
    "test_mlx_fsdp::test_group_of_one_equals_a_plain_optimizer_step": (),
    "test_mlx_fsdp::test_clipping_returns_the_norm_before_clipping_and_keeps_bf16": (),
    "test_mlx_fsdp::test_an_empty_tree_comes_back_as_the_same_kind_of_tree": (),
    "test_mlx_fsdp::test_an_optimizer_that_returns_its_input_tree_works": (),
    "test_mlx_fsdp::test_bad_input_names_the_path": (),
    "test_mlx_fsdp::test_optimizer_state_bytes_counts_the_moments": (),
    "test_mlx_fsdp::test_mixed_dtypes_keep_their_own_buckets_and_dtypes": (),
    "test_mlx_fsdp::test_launch_plans_wire_each_backend": (),
    "test_mlx_fsdp::test_rows_follow_the_plan_they_are_given_even_when_plans_come_and_go": (),
    "test_mlx_fsdp::test_caches_are_bounded_and_can_be_cleared": (),
    "test_mlx_fsdp::test_bucket_matrix_rows_are_the_plans_rows": (),
    "test_mlx_fsdp::test_step_knobs_that_would_corrupt_the_update_are_refused_naming_them": (),
    "test_mlx_zero3::test_group_of_one_with_nested_units_and_micro_batches_equals_a_plain_step": (),
    "test_mlx_zero3::test_knobs_are_checked_by_name": (),
    "test_rank_fingerprint::test_first_mismatch_names_the_first_field_and_every_rank_that_differs": (),
    "test_train_jax::test_the_collective_path_is_read_from_the_lowered_program": (),
    "test_training::test_bad_specs_are_refused_before_any_engine_starts": (),
    "test_training::test_a_port_clash_is_told_apart_from_other_failures": (),
    "test_training::test_ranks_of_two_launches_that_drew_a_port_alike_are_told_apart_and_relaunched": (),
    "test_user_model_runs::test_old_specs_keep_their_run_ids_and_a_changed_model_source_is_a_new_run": (),
    "test_user_model_runs::test_bad_user_inputs_are_refused_naming_the_field": (),
    "test_validation::test_estimate_follows_the_framework_and_strategy": (),
    "test_wrong_data::test_position_and_segment_tables_are_not_the_token_table": (),
}

TESTS = Path(__file__).resolve().parent
#: Audit events that start a process (Python's audit events table).
SPAWN_EVENTS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system",
                          "os.exec"})


class UnmarkedProcessError(RuntimeError):
    """A test not marked ``process`` started a process."""


def module_name(path: Path) -> str | None:
    """A test file's key in :data:`MODULE_MARKERS` (its path under tests/ without ``.py``); None elsewhere."""
    try:
        return path.resolve().relative_to(TESTS).with_suffix("").as_posix()
    except ValueError:
        return None


def markers_of(path: Path, function: str) -> tuple[str, ...]:
    """The markers of test ``function`` in ``path``: a notebook is ``process``; an unlisted module is too."""
    if path.suffix == ".ipynb":
        return (PROCESS,)
    module = module_name(path)
    if module is None:
        return ()
    if f"{module}::{function}" in TEST_MARKERS:
        return TEST_MARKERS[f"{module}::{function}"]
    return MODULE_MARKERS.get(module, (PROCESS,))  # unlisted: out of the fast loop, and test_markers fails


#: Under pytest-xdist (``scripts/test.sh``: ``-n 2 --dist loadfile --no-loadscope-reorder``, which keeps this order) each module, and each notebook, runs whole on
#: one worker, in order (a notebook's cells share one kernel). Files start longest first (here: a fresh clone's
#: seconds, 2 cores), so the longest is not the last to start; the modules that train through :func:`shared_runs`
#: (whose runs, profiles and benchmarks notebooks 03, 05 and 07 take: :data:`NBVAL_SWEEPS`, :data:`NBVAL_BENCHMARKS`) start
#: early and those notebooks last, so that the other worker is not still training a run when a sweep reaches it. (``--dist loadgroup`` would group the
#: rig's modules, but xdist 3.8 cannot set its groups on pytest 9's test ids; rigs are built under a global
#: lock with their own names and subnets, so the workers' rigs coexist.)
FIRST_FILES = ("notebooks/06_gradient_accumulation.ipynb", "tests/test_browser.py", "tests/test_profile_runs.py",
               "tests/test_validation.py", "tests/test_collectives.py", "tests/test_fully_shard_runs.py",
               "tests/test_train_jax.py", "tests/test_resident_train_jax.py", "tests/test_jax_accum.py",
               "tests/test_multihost.py", "notebooks/04_convergence.ipynb", "tests/test_mlx_lm_runs.py",
               "tests/test_build.py", "tests/test_training.py")
LAST_FILES = ("notebooks/07_your_model.ipynb", "notebooks/03_memory_math.ipynb",
              "notebooks/05_step_time_and_comm_size.ipynb")


def start_rank(path: Path) -> int:
    """Where the file ``path`` starts in the run: :data:`FIRST_FILES` in their order, then the rest, then
    :data:`LAST_FILES`."""
    name = path.resolve().relative_to(TESTS.parent).as_posix() if path.resolve().is_relative_to(TESTS.parent) else ""
    if name in FIRST_FILES:
        return FIRST_FILES.index(name)
    return len(FIRST_FILES) + 1 + LAST_FILES.index(name) if name in LAST_FILES else len(FIRST_FILES)


_jax_cache: list[str] = []  # the JAX compilation cache this process made for the session (it removes it)


def pytest_configure(config):
    """One JAX compilation cache for the session (every xdist worker, every rank and notebook kernel they start
    inherit the variable), empty at its start like a fresh machine's, and never the developer's own
    ``~/.cache/workbench/jax``; a ``WORKBENCH_JAX_CACHE`` already set (``off`` to compile every time) is kept."""
    from workbench.adapters.jax.compile_cache import CACHE_ENV

    if not os.environ.get(CACHE_ENV):
        os.environ[CACHE_ENV] = tempfile.mkdtemp(prefix="workbench-jax-cache-")
        _jax_cache.append(os.environ[CACHE_ENV])
    # The workers share the machine's cores, so a rank's OpenBLAS gets one thread (launch.plan.thread_env keeps a
    # variable already set): a second thread busy-waits between products, and beside other workers' ranks a 1-rank
    # MLX run's two threads burnt 5x the CPU of one for the same products (the suite took 19 min 19 s against 14:45).
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # MLX's OpenBLAS shim (workbench.adapters.mlx.blas) is compiled, once per machine, here rather than by the
    # first test that plans an MLX launch, which may be a one-process test (no compiler process allowed there).
    from workbench.adapters.mlx.blas import mlx_rank_env

    mlx_rank_env()  # nothing to build where $WORKBENCH_MLX_BLAS says reference


def pytest_unconfigure(config):
    for folder in _jax_cache:
        shutil.rmtree(folder, ignore_errors=True)


def pytest_collection_modifyitems(items):
    for item in items:
        function = getattr(item, "originalname", None) or item.name
        for marker in markers_of(Path(str(item.path)), function):
            item.add_marker(marker)
    items[:] = sorted(items, key=lambda item: start_rank(Path(str(item.path))))  # stable: each file keeps its order


#: Notebooks whose sweeps share the tests' runs: a run :class:`SharedRuns` trains that one of them will run under
#: nbval (same spec, so same run id) is copied into that notebook's run store, where its sweep skips it as done.
#: Each notebook -> the code cells (0-based, among code cells) its sweep's arguments need beyond its precondition and
#: parameter cells (notebook 07's runs are its model's, built in cell 2).
NBVAL_SWEEPS = {"03_memory_math": (), "05_step_time_and_comm_size": (), "07_your_model": (2,)}
#: Notebooks whose collective benchmarks tests share: notebook -> (its store's variable, the benchmarks' sizes').
NBVAL_BENCHMARKS = {"05_step_time_and_comm_size": ("COLLECTIVES", "COLLECTIVE_SIZES")}


def nbval_parameters(notebook: str, *more: str, cells: tuple[int, ...] = ()) -> dict[str, object]:
    """The names ``notebook`` defines in the configuration nbval runs: its precondition and parameter cells, its code
    ``cells`` (indices among code cells), then the code ``more``, executed here in the notebooks' folder as nbval's
    kernel is (``setup()`` giving the settings without touching plotly)."""
    import json

    from workbench.core import paths
    from workbench.publish import notebook as nb_setup

    code_cells = [c for c in json.loads((paths.NOTEBOOK_DIR / f"{notebook}.ipynb").read_text())["cells"]
                  if c["cell_type"] == "code"]
    settings = nb_setup.NotebookSettings(export=False, small=nb_setup.env_flag("WORKBENCH_SMALL"), renderer="",
                                         full=nb_setup.env_flag("WORKBENCH_FULL"))
    setup, nb_setup.setup = nb_setup.setup, lambda: settings
    namespace: dict[str, object] = {"print": lambda *a, **k: None, "display": lambda *a, **k: None}
    try:
        with contextlib.chdir(paths.NOTEBOOK_DIR):  # a notebook's relative paths (its data) are from its folder
            for code in (*("".join(c["source"]) for c in (*code_cells[:2], *(code_cells[i] for i in cells))), *more):
                exec(code, namespace)  # noqa: S102 - the repository's own notebook
    finally:
        nb_setup.setup = setup
    return namespace


def nbval_sweep(notebook: str) -> tuple[Path, dict[str, object]]:
    """The run store and the specs (by run id) of ``notebook``'s sweep under nbval: :func:`nbval_parameters` with
    the statements of its first ``run_sweep`` cell before that call, whose first two arguments are the specs and
    the store."""
    import json

    from workbench.core import paths
    from workbench.runs.store import run_id_for

    sources = ["".join(c["source"]) for c in json.loads((paths.NOTEBOOK_DIR / f"{notebook}.ipynb").read_text())["cells"]
               if c["cell_type"] == "code"]
    sweep = ast.parse(next(s for s in sources if "run_sweep(" in s and "import" not in s))
    at = next(i for i, t in enumerate(sweep.body) if "run_sweep(" in ast.unparse(t))
    call = next(n for n in ast.walk(sweep.body[at]) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "run_sweep")
    namespace = nbval_parameters(notebook, ast.unparse(ast.Module(sweep.body[:at], [])), cells=NBVAL_SWEEPS[notebook])
    specs, store = (eval(ast.unparse(a), namespace) for a in call.args[:2])  # noqa: S307 - as above
    return Path(store), {run_id_for(s.to_dict()): s for s in specs}


def nbval_benchmarks(notebook: str) -> tuple[Path, set[str]]:
    """The store and the run ids of the collective benchmarks ``notebook`` runs under nbval (its frameworks on
    ``NUM_RANKS`` ranks at its sizes, the default kinds and iterations)."""
    from workbench.launch.benchmark import benchmark_spec
    from workbench.runs.store import run_id_for

    store, sizes = NBVAL_BENCHMARKS[notebook]
    names = nbval_parameters(notebook)
    return Path(names[store]), {run_id_for(benchmark_spec(f, names["NUM_RANKS"], names[sizes]))
                                for f in names["FRAMEWORKS"]}


def store_in(store: Path, item: Path) -> None:
    """Copies the run folder (or profile file) ``item`` into ``store`` unless it holds one of that name already (a
    store's own, say a developer's, is never replaced); written beside the store and renamed in, so a reader never
    sees half."""
    if (store / item.name).exists():
        return
    store.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{item.name}-", dir=store.parent))
    if item.is_dir():
        shutil.copytree(item, staging / item.name, ignore=shutil.ignore_patterns(".lock"))
    else:
        shutil.copy2(item, staging / item.name)
    try:
        os.rename(staging / item.name, store / item.name)
    except OSError:  # another session stored it first
        pass
    shutil.rmtree(staging, ignore_errors=True)


class SharedRuns:
    """One run store for the session: a spec that several tests train (the same run id) is trained once, also
    across pytest-xdist's workers, which share ``root`` and take turns on a run by an ``flock`` on its key."""

    def __init__(self, root: Path):
        self.root, self.outcomes = root, {}
        self._wanted: list[tuple[Path, set]] | None = None

    def run(self, spec, root: Path, **kwargs):
        """``spec`` trained by ``run_training`` into the session's store the first time it is asked for (again
        if that run did not finish), its run folder copied into ``root`` so that ``load_runs(root)`` reads it
        beside the caller's own runs; returns the run's first outcome ("done" on every ask). A run first
        trained here that a notebook of :data:`NBVAL_SWEEPS` runs is copied into that notebook's store."""
        from workbench.launch.driver import run_training
        from workbench.runs.store import run_id_for

        key = run_id_for(spec.to_dict())
        if key not in self.outcomes or self.outcomes[key].status != "done":
            with open(self.root / f".{key}.turn", "w") as turn:
                fcntl.flock(turn, fcntl.LOCK_EX)  # another worker training this run: wait for its outcome
                outcome = run_training(spec, self.root, **kwargs)
            if outcome.status == "skipped":  # another worker trained it, done
                outcome = replace(outcome, status="done")
            elif outcome.status == "done":
                self.offer(self.root / key)
            self.outcomes[key] = outcome
        outcome = self.outcomes[key]
        if outcome.status == "done":
            shutil.copytree(self.root / outcome.run_id, Path(root) / outcome.run_id, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns(".lock"))
        return outcome

    def offer(self, run: Path) -> None:
        """Copies the finished run (or benchmark) folder ``run`` into the store of each notebook of
        :data:`NBVAL_SWEEPS` or :data:`NBVAL_BENCHMARKS` that runs it under nbval (:func:`store_in`)."""
        if self._wanted is None:
            try:
                self._wanted = [(store, set(specs)) for store, specs in map(nbval_sweep, NBVAL_SWEEPS)]
                self._wanted += [nbval_benchmarks(name) for name in NBVAL_BENCHMARKS]
            except Exception as e:  # nbval will train the runs itself (and fail there if the notebook is broken)
                warnings.warn(f"notebook sweeps not read, so not shared: {type(e).__name__}: {e}", stacklevel=2)
                self._wanted = []
        for store, run_ids in self._wanted:
            if run.name in run_ids:
                store_in(store, run)


@pytest.fixture(scope="module")
def engine_pool():
    """Engines kept between a module's runs, as a sweep keeps them (:class:`workbench.launch.pool.EnginePool`),
    stopped after the module: a run on them stores what a run on fresh engines stores (test_engine_pool), 3-4 s
    sooner. Pass it as ``pool=`` to ``run_training`` or :meth:`SharedRuns.run`."""
    from workbench.launch.pool import EnginePool

    with EnginePool() as pool:
        yield pool


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory) -> SharedRuns:
    """Runs shared between test modules and with the notebooks' sweeps: test_train_jax's fsdp-row run is
    test_jax_accum's G=1 run; the memory validation's runs (test_validation) are test_fully_shard_runs' DDP run
    and notebooks 03's and 05's runs; test_collectives' benchmarks are notebook 05's (:meth:`SharedRuns.offer`)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):  # one store for every worker: beside their own base folders
        root = tmp_path_factory.getbasetemp().parent / "shared-runs"
        root.mkdir(exist_ok=True)
        return SharedRuns(root)
    return SharedRuns(tmp_path_factory.mktemp("shared-runs"))


_started: dict[str, list[str]] = {}  # while a test not marked `process` runs: its nodeid -> processes it started


def _record_spawn(event, args):
    if _started and event in SPAWN_EVENTS:
        for started in _started.values():
            started.append(f"{event}: {str(args)[:200]}")


sys.addaudithook(_record_spawn)


#: Where each worker appends, per test file it ran, ``worker file first-start last-end`` (seconds since the epoch)
#: when ``$WORKBENCH_TEST_TIMELINE`` names a file: which worker ran what when, how much CPU it took, and how long
#: the run's tail was one or two workers alone (scripts/test_timeline.py reads it).
TIMELINE = os.environ.get("WORKBENCH_TEST_TIMELINE")
_spans: dict[str, list[float]] = {}  # this worker's test files: [first start, last end, CPU seconds]


def _cpu_seconds() -> float:
    """CPU seconds of this worker and of every process it (or a process it started) waited for: ranks, engines,
    controllers, kernels, Chromium; a process still running when its test ends counts where it is reaped."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    if item.get_closest_marker(PROCESS) is None:
        _started[item.nodeid] = []
    start, cpu = time.time(), _cpu_seconds() if TIMELINE else 0.0
    try:
        return (yield)
    finally:
        _started.clear()
        if TIMELINE:
            span = _spans.setdefault(item.location[0], [start, start, 0.0])
            span[1], span[2] = time.time(), span[2] + _cpu_seconds() - cpu


def pytest_sessionfinish(session):
    if TIMELINE and _spans:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(TIMELINE, "a", encoding="utf-8") as out:
            out.write("".join(f"{worker} {name} {a:.2f} {b:.2f} {cpu:.2f}\n" for name, (a, b, cpu) in _spans.items()))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Fails the test's teardown if the test (its setup included) started a process unmarked. Recorded, not
    refused: a process refused inside a library's thread (kaleido's Chromium) hung the test instead. After a
    worker's last test (``nextitem`` None) its session's fixtures are torn down in this teardown too (the
    multi-host rig's, which runs ``ip netns list``): there, what the test started before its teardown is its own."""
    before = None if nextitem is not None else list(_started.get(item.nodeid) or [])
    result = yield
    started = _started.get(item.nodeid) if before is None else before
    if started and item.get_closest_marker(PROCESS) is None:
        raise UnmarkedProcessError(
            f"{item.nodeid} starts a process ({started[0]}) but is not marked 'process': name it in "
            "tests/conftest.py's TEST_MARKERS or its module's MODULE_MARKERS")
    return result

