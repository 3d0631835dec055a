"""One rank of a JAX training run: the JAX twin of :func:`workbench.ranks.train_mlx.train_mlx`.

:func:`train_jax` runs in one process with one CPU device (the launch plan's environment,
:func:`workbench.launch.plan.plan_launch`); cross-process collectives go through gloo over the
coordinator's interface. Every process builds the same weights
(:func:`~workbench.models.init.init_lm_params`) and the same global NumPy batch each step
(:func:`~workbench.models.data.sample_batch`); the global batch array is sharded by rows over the
mesh ``("fsdp",)`` (HSDP: ``("replica", "fsdp")``), so process r holds exactly ``rank_slice(batch, r, N)``, and one
jitted ``shard_map`` step per strategy does the rest:

* ``ddp`` -- :func:`~workbench.adapters.jax.fsdp.make_ddp_step` (gradients ``pmean``-ed);
* ``fsdp-row`` / ``fsdp-flat`` -- :func:`~workbench.adapters.jax.fsdp.make_fsdp_step` with that layout and
  ``spec.communication_size`` (a reduce-scatter and an ``all_gather`` per bucket, cut in the model's order), run on
  its resident bucket buffers (:class:`~workbench.adapters.jax.resident.ResidentStep`: no per-step packing, donated);
* ``hsdp-row`` -- the same step on a ``("replica", "fsdp")`` mesh: rows within a replica group, summed across;
* ``fsdp-full`` -- ZeRO-3, :func:`~workbench.adapters.jax.zero3.make_zero3_step` over the
  unit chain of :func:`lm_units` (embedding, each block, final norm + head).

With ``spec.num_microbatches`` = G > 1 every step accumulates gradients over G micro-batches of each
rank's rows, synchronised once (``spec.defer_sync``) or every micro-batch (:mod:`workbench.adapters.jax.accum`).

Loss scope: the JAX steps return the *global* mean loss (every rank records the same value), whereas MLX rows
hold each rank's local-slice mean. JAX rows therefore carry ``"loss_scope": "global"`` (MLX rows have no such
key: local). With equal slices the mean of the MLX ranks' losses is the global loss, so
``groupby("step").loss.mean()`` compares the two frameworks directly.
"""

from __future__ import annotations

import gc
import os
import time
from typing import Any, Callable

import numpy as np

__all__ = ["init_distributed", "lm_units", "make_optimizer", "train_jax"]


def init_distributed(timeout_s: int = 120) -> tuple[int, int]:
    """Initialise ``jax.distributed`` from ``WORKBENCH_*`` variables, once per process.

    Reads ``WORKBENCH_COORDINATOR`` (``host:port``, process 0 hosts it),
    ``WORKBENCH_NUM_PROCESSES``, ``WORKBENCH_PROCESS_ID`` and ``WORKBENCH_BACKEND``
    (``gloo``, the default, or ``default``). With gloo, CPU collectives are switched to
    gloo and gloo is bound to the coordinator's host
    (:func:`~workbench.adapters.jax.distributed.bind_gloo_to`). If this process is already initialised
    (a second run on the same engine), nothing is re-initialised.

    Returns:
        ``(process_id, num_processes)`` as JAX sees them.

    Raises:
        RuntimeError: a variable is missing, or the process was initialised for another
            world than the variables describe.
    """
    import jax

    from workbench.adapters.jax.distributed import initialize_jax

    try:
        coordinator = os.environ["WORKBENCH_COORDINATOR"]
        num_processes = int(os.environ["WORKBENCH_NUM_PROCESSES"])
        process_id = int(os.environ["WORKBENCH_PROCESS_ID"])
    except (KeyError, ValueError) as err:
        raise RuntimeError(f"JAX rank environment incomplete or malformed ({err!r}); "
                           "start ranks from workbench.launch.plan.plan_launch(framework='jax').") from None
    if not jax.distributed.is_initialized():
        initialize_jax(coordinator, num_processes, process_id,
                       backend=os.environ.get("WORKBENCH_BACKEND", "gloo"), timeout_s=timeout_s)
    if (jax.process_index(), jax.process_count()) != (process_id, num_processes):
        raise RuntimeError(f"jax.distributed is initialised as process {jax.process_index()} of {jax.process_count()}, "
                           f"but this rank's environment says {process_id} of {num_processes}.")
    return process_id, num_processes


def _cross_entropy(logits: Any, targets: Any) -> Any:
    """Mean next-token cross-entropy in fp32: :func:`~workbench.models.jax_lm.lm_loss_fn` from logits."""
    import jax
    import jax.numpy as jnp

    logits = logits.astype(jnp.float32)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - picked)


def lm_units(config) -> tuple[list[Callable], Callable, list[list[str]]]:
    """The LM of :mod:`workbench.models.jax_lm` as a ZeRO-3 unit chain.

    Units: the embeddings (``embed``, ``pos_embed``), each transformer block
    (``layers.{i}.*``), the final norm with the head. With ``tie_embeddings`` the head
    reuses the embedding, which a chain cannot split, so the whole model is one unit.
    Batches are ``(inputs, targets)``; each unit gets a ``{dotted path: array}`` dict.

    Returns:
        ``(apply_units, loss_fn, unit_paths)`` for
        :func:`~workbench.adapters.jax.zero3.make_zero3_step` (and
        :func:`~workbench.adapters.jax.zero3.chain_units`); ``unit_paths[u]`` lists
        unit u's parameter paths.
    """
    from workbench.models.init import lm_param_shapes
    from workbench.models.jax_lm import block, lm_logits_fn, rms_norm

    def loss_fn(logits, batch):
        return _cross_entropy(logits, batch[1])

    if config.tie_embeddings:
        return [lambda p, batch: lm_logits_fn(p, batch[0], config=config)], loss_fn, [list(lm_param_shapes(config))]

    def embed(p, batch):
        inputs = batch[0]
        return p["embed.weight"][inputs] + p["pos_embed.weight"][: inputs.shape[1]]

    def head(p, h):
        return rms_norm(h, p["norm.weight"]) @ p["head.weight"].T

    layers = [lambda p, h, prefix=f"layers.{i}.": block(p, prefix, h, config.num_heads) for i in range(config.num_layers)]
    shapes = list(lm_param_shapes(config))
    paths = ([["embed.weight", "pos_embed.weight"]]
             + [[k for k in shapes if k.startswith(f"layers.{i}.")] for i in range(config.num_layers)]
             + [["norm.weight", "head.weight"]])
    return [embed, *layers, head], loss_fn, paths


def make_optimizer(spec) -> Any:
    """``optax.adamw(lr, weight_decay=spec.weight_decay)`` (MLX ``AdamW`` with bias correction:
    same betas, eps and decoupled decay) or ``optax.sgd(lr)``."""
    from workbench.adapters.jax.base import make_optimizer as make_jax_optimizer

    return make_jax_optimizer(spec.optimizer, spec.learning_rate, weight_decay=spec.weight_decay)


def observed_collective_path(program_text: str, num_ranks: int) -> str:
    """The gradient collective a lowered step really contains: "all_to_all" (the FSDP step's reduce-scatter
    on CPU), "psum_scatter", "psum" or "none"."""
    if num_ranks == 1:
        return "none"
    if "all_to_all" in program_text:
        return "all_to_all"
    if "reduce_scatter" in program_text:
        return "psum_scatter"
    return "psum" if "all_reduce" in program_text else "none"


def train_jax(spec, handle, compile_folder: str | None = None) -> dict:
    """One rank of a JAX run of ``spec`` (a :class:`~workbench.runs.spec.RunSpec`), appending to ``handle``.

    Every step appends ``{"step", "rank", "loss", "loss_scope": "global", "grad_norm",
    "step_time_s", "peak_rss_bytes", "num_collectives"}``: ``loss`` is the *global* mean
    loss of the step (over ranks and micro-batches; the same on every rank; MLX records
    each rank's local mean, see the module docstring), ``grad_norm`` the norm of the
    averaged gradient before clipping, ``num_collectives`` the gradient-path collectives
    the step issued (G times the buckets' with per-micro-batch sync),
    ``step_time_s`` the wall time of the step until its results are ready (step 0
    excludes compilation, done up front), ``peak_rss_bytes`` the process's peak RSS.

    Returns:
        ``{"rank", "backend", "collective_path" ("all_to_all" for FSDP on CPU, "psum_scatter" for ZeRO-3,
        "psum" for DDP, "none" on one rank), "num_collectives", "collectives" (the same
        per step by kind: ``{"all_reduce", "reduce_scatter", "all_gather"}``, as the step asks
        for them), "compiled_collectives" (those XLA kept in the compiled step: fewer where it
        combines all-reduces or merges repeated gathers), "peak_rss_bytes", "versions", "fingerprint_exchange_s",
        "initial_weights_sha256" (compared before step 0), "step_program" (:data:`~workbench.ranks.shared_compile.COMPILED`
        here, :data:`~workbench.ranks.shared_compile.LOADED` from rank 0's compile, or ``STEP_CACHED`` from an earlier
        run's), "compile_cache" (folder, and this run's compiles read
        back and compiled: on an engine a sweep's pool handed on, helpers its earlier runs compiled are in memory
        and counted by neither)}``
        and ``"compiled_memory"`` (the compiled step's ``memory_analysis()`` in bytes) when XLA reports it.
    """
    from workbench.ranks.phases import PHASE_AGREE, PHASE_COMPILE, PHASE_JOIN, PHASE_MODEL, PHASE_STEP, report_phase
    from workbench.ranks.user_model import agree_on_start, check_finite_loss, jax_params_and_loss, start_fingerprint
    report_phase(handle, PHASE_JOIN)
    rank, size = init_distributed()

    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from workbench.adapters.jax.accum import compiled_program_counts
    from workbench.adapters.jax.distributed import process_mesh, ranks_barrier
    from workbench.adapters.jax.compile_cache import compile_cache_state as cache_state
    from workbench.adapters.jax.resident import ResidentStep
    from workbench.ranks.probes import (jax_device_bytes, jax_measured_memory, package_versions, peak_rss_bytes,
                                        xla_memory_stats)
    from workbench.ranks.profile_probe import step_rss_above
    from workbench.ranks.shared_compile import compile_step

    cache_at_start = cache_state()

    # Devices by process, so that process r's rows of a batch sharded over the data axes are rank_slice(batch, r, N).
    mesh, data_axes = process_mesh(spec.num_replicas)
    replicated, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P(data_axes))
    report_phase(handle, PHASE_MODEL, rank)
    params, loss_fn = jax_params_and_loss(spec)  # the built-in LM, or the user's factory (spec.model_factory)
    fingerprint = start_fingerprint(spec, list(params.items()), size)  # plans and starting weights, compared once
    report_phase(handle, PHASE_AGREE, rank)
    exchange_s = agree_on_start(lambda fp: _exchange(fp, rank, size), fingerprint, spec, rank)
    step, p, state = _build_step(spec, mesh, replicated, params, loss_fn)
    run = ResidentStep(step)  # FSDP: the parameters live in the plan's bucket buffers, donated every step
    p = run.enter(p)
    batch_for_step = _batch_loader(spec, rows)
    _check_batch_rows(batch_for_step(0), spec.global_batch, rank, size)
    report_phase(handle, PHASE_COMPILE, rank)
    lowered = run.lower(p, state, batch_for_step(0))
    program_text = lowered.as_text()
    # compiled before step 0 (a compile error surfaces here), once for the ranks on this machine (compile_folder)
    compiled, step_program = compile_step(lowered, program_text, rank, compile_folder, mesh.devices.flat)
    run.bind(compiled)
    compiled_memory = xla_memory_stats(compiled)
    report_phase(handle, PHASE_STEP, rank)

    def timed_step(p, state, batch):
        t0 = time.perf_counter()
        out = jax.block_until_ready(run(p, state, batch))
        return out, time.perf_counter() - t0

    for i in range(spec.steps):
        batch = batch_for_step(i)
        (p, state, metrics), elapsed = timed_step(p, state, batch)
        loss = float(np.asarray(metrics["loss"].addressable_data(0)))
        handle.append_steps([{
            "step": i, "rank": rank, "loss": loss,
            "loss_scope": "global", "grad_norm": float(np.asarray(metrics["grad_norm"].addressable_data(0))),
            "step_time_s": elapsed, "peak_rss_bytes": peak_rss_bytes(),
            "num_collectives": int(metrics["num_collectives"]),
        }])
        check_finite_loss(loss, i, rank)  # after its row is stored: the record shows it
    # The step's peak, measured on one more step on the last batch, neither timed nor stored (step 0 holds one-off
    # buffers): its arguments + how far it raised VmHWM, each buffer of a page or more in pages of its own
    # meanwhile. Measured on a timed step, with glibc's heap, it read 0.55-0.70 of XLA's plan wherever the step's
    # temporaries reused pages the heap kept (from the third step on), on one rank or both.
    held = jax_device_bytes((p, state, batch))
    gc.collect()  # the last steps' dropped arrays, freed before the mark is reset
    above, (p, state, _) = step_rss_above(lambda: jax.block_until_ready(run(p, state, batch)), ranks_barrier(size))
    truth = None if above is None else held + above
    cache_now = cache_state()
    summary = {"rank": rank, "backend": os.environ.get("WORKBENCH_BACKEND", "gloo"),
               "fingerprint_exchange_s": exchange_s, "initial_weights_sha256": fingerprint["initial_weights"],
               "collective_path": observed_collective_path(program_text, size), "step_program": step_program,
               "measured_memory": jax_measured_memory(p, state, compiled_memory, truth),
               "num_collectives": int(step.num_collectives), "collectives": dict(step.collective_counts),
               "compiled_collectives": compiled_program_counts(compiled.as_text()),
               "peak_rss_bytes": peak_rss_bytes(), "versions": package_versions(),
               "compile_cache": {**cache_now, **{k: cache_now[k] - cache_at_start[k] for k in ("hits", "misses")}}}
    if compiled_memory is not None:
        summary["compiled_memory"] = compiled_memory
    return summary


def _to_global(tree, sharding):
    """Every process holds the full NumPy data: each takes its pieces of a global array."""
    import jax

    return jax.tree_util.tree_map(
        lambda a: jax.make_array_from_callback(a.shape, sharding, lambda idx, a=a: a[idx]), tree)


def _exchange(fingerprint: dict, rank: int, size: int) -> float:
    """Every process's :func:`~workbench.core.fingerprint.fingerprint_row`, all-gathered (one small
    ``process_allgather``) and compared on each (``RanksDisagree`` on every rank); returns its seconds."""
    from jax.experimental import multihost_utils

    from workbench.core.fingerprint import check_rows, fingerprint_row

    t0 = time.perf_counter()
    if size == 1:
        return 0.0
    table = multihost_utils.process_allgather(np.asarray(fingerprint_row(fingerprint, size), dtype=np.int32))
    check_rows(np.asarray(table).reshape(size, -1).tolist(), fingerprint, rank)
    return time.perf_counter() - t0


def _build_step(spec, mesh, replicated, params: dict, loss_fn: Callable):
    """The step of ``spec.strategy`` with the initial parameters ``params`` placed and its optimizer state:
    ``(step, params, state)``."""
    from workbench.adapters.jax.fsdp import make_ddp_step, make_fsdp_step
    from workbench.adapters.jax.zero3 import make_zero3_step
    from workbench.ranks.user_model import user_units
    from workbench.strategies import get_strategy

    opt = make_optimizer(spec)
    accum = dict(num_microbatches=spec.num_microbatches, defer_sync=spec.defer_sync)
    record = get_strategy(spec.strategy, framework="jax")
    if record.gathers_units:
        apply_units, unit_loss, unit_paths = (lm_units(spec.config) if spec.model_factory is None
                                              else user_units(params, loss_fn))
        units = _to_global([{k: params[k] for k in paths} for paths in unit_paths], replicated)
        step = make_zero3_step(apply_units, unit_loss, units, opt, mesh, max_norm=spec.max_norm, **accum)
        p, state = step.init(units)
        return step, p, state
    p = _to_global(params, replicated)
    if record.family == "data_parallel":
        step = make_ddp_step(loss_fn, p, opt, mesh, max_norm=spec.max_norm, **accum)
    else:
        step = make_fsdp_step(loss_fn, p, opt, mesh, layout=record.layout, order=list(params),
                              dp_axis="replica" if record.replicas else None,
                              max_norm=spec.max_norm, communication_size=spec.communication_size, **accum)
    return step, p, step.init(p)


def _batch_loader(spec, rows):
    """``batch_for_step(i)``: step i's global batch (inputs, targets), sharded by rows over the processes."""
    from workbench.ranks.user_model import global_batches

    global_batch = global_batches(spec)  # Markov chain or spec.data's token file

    def batch_for_step(step_index: int):
        batch = global_batch(step_index)
        return _to_global((np.ascontiguousarray(batch[:, :-1]), np.ascontiguousarray(batch[:, 1:])), rows)

    return batch_for_step


def _check_batch_rows(batch, global_batch_size: int, rank: int, size: int) -> None:
    """This process must hold exactly its ``rank_slice`` of the batch (as the MLX ranks do)."""
    per_rank = global_batch_size // size
    held = sorted({s.index[0].indices(global_batch_size)[:2] for s in batch[0].addressable_shards})
    if (held[0][0], held[-1][1]) != (rank * per_rank, (rank + 1) * per_rank):
        raise RuntimeError(f"rank {rank} holds batch rows {held}, not its rank_slice "
                           f"[{rank * per_rank}, {(rank + 1) * per_rank}); the mesh is not ordered by process.")
