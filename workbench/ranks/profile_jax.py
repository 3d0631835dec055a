"""``python -m workbench.ranks.profile_jax``: measure a JAX model once, on one process (issue 26).

The model is the run's (:func:`~workbench.ranks.user_model.jax_params_and_loss`), its optimizer the run's
(optax, :func:`workbench.adapters.jax.base.make_optimizer`). At each micro-batch size, the jitted
``jax.value_and_grad(loss_fn)`` is compiled for that batch, and two numbers are taken:

* the plan: XLA's ``memory_analysis()`` of the compiled program: outputs + temporaries - aliased, less the
  gradients (the arguments, parameters and batch, are live before it runs);
* the truth: how far one call raises the process's resident high-water mark (``VmHWM``, reset through
  ``/proc/self/clear_refs``, the allocator's free pages released first:
  :func:`~workbench.ranks.profile_probe.rss_above`),
  less the gradients, with every large buffer mapped on its own
  (:func:`~workbench.ranks.profile_probe.map_large_allocations`). XLA on CPU keeps no allocator statistics,
  so this is what the process really touched.

Also timed: forward and backward (seconds, the compiled call), forward alone (its own compiled program: what
a unit-gathering step recomputes in backward), and the jitted optimizer update of the whole
model (seconds). Last, at the smallest size, the rank's own DDP step on a mesh of this one device
(:func:`measure_ddp_step`): what it takes beyond forward, backward and update is the step's overhead. The same
step's truth at the smallest and the largest size gives what XLA schedules of the update beside the backward's
peak (:func:`update_beside_backward`): the one program of forward, backward and update holds more there than
forward and backward alone. Started
by :func:`workbench.launch.profile.profile_model` with the threads a rank will have, as many at once as the
run's ranks per host.
"""

from __future__ import annotations

import gc
import os
import sys
import time

from workbench.ranks.probes import package_versions
from workbench.ranks.profile_probe import (
    GLIBC_MMAP_THRESHOLD_MAX,
    map_large_allocations,
    median,
    profile_main,
    rss_above,
    status_bytes,
    thread_count,
    timed,
    token_batch,
)
from workbench.ranks.user_model import jax_params_and_loss


def _nbytes(tree) -> int:
    import jax

    return int(sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(tree)))


def measure_jax(spec, sizes: list[int], repeats: int, ready=None) -> dict:
    """The profile's measurements of ``spec``'s JAX model (plain data; see the module docstring); ``ready()`` is
    called before the first measurement (to start with the other profiling processes)."""
    import jax
    import jax.numpy as jnp
    import optax

    from workbench.adapters.jax.base import make_optimizer

    host_params, loss_fn = jax_params_and_loss(spec)
    params = {k: jnp.asarray(v) for k, v in host_params.items()}
    del host_params
    opt = make_optimizer(spec.optimizer, spec.learning_rate, weight_decay=spec.weight_decay)
    state = opt.init(params)
    grad_fn = jax.jit(jax.value_and_grad(loss_fn))
    forward_fn = jax.jit(loss_fn)

    @jax.jit
    def update(grads, state, params):
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    param_bytes, state_bytes = _nbytes(params), _nbytes(state)
    if ready is not None:
        ready()
    map_large_allocations()  # before any large buffer: each gets pages of its own, and the mark sees them
    programs, planned, mesh_planned, activation, peak_rss = {}, [], [], [], 0
    for b in sizes:
        batch = tuple(jnp.asarray(a) for a in token_batch(spec, b))
        compiled = grad_fn.lower(params, batch).compile()
        stats = compiled.memory_analysis()
        loss, grads = jax.block_until_ready(compiled(params, batch))  # the first call: not measured
        gradient_bytes = _nbytes(grads)
        del loss, grads
        planned.append(plan_bytes(stats, gradient_bytes))
        mesh_planned.append(mesh_plan_bytes(loss_fn, params, batch, gradient_bytes))
        samples = []
        for _ in range(repeats):
            gc.collect()
            peak_rss = max(peak_rss, status_bytes("VmHWM") or 0)
            above, out = rss_above(lambda: jax.block_until_ready(compiled(params, batch)))
            samples.append(None if above is None else int(above - gradient_bytes))
            del out
        activation.append(samples)
        programs[b] = compiled, batch
    map_large_allocations(GLIBC_MMAP_THRESHOLD_MAX)  # the times with the heap reuse of glibc's own default
    compute, forward, update_s = [], [], []
    for b in sizes:
        compiled, batch = programs[b]
        loss, grads = jax.block_until_ready(compiled(params, batch))  # warm: not timed
        if not update_s:  # the update, once compiled, timed on these gradients
            jax.block_until_ready(update(grads, state, params))
            for _ in range(repeats):
                t0 = time.perf_counter()
                jax.block_until_ready(update(grads, state, params))
                update_s.append(time.perf_counter() - t0)
        del loss, grads
        seconds = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(compiled(params, batch))
            seconds.append(time.perf_counter() - t0)
        compute.append(seconds)
        jax.block_until_ready(forward_fn(params, batch))  # compiled: not timed
        forward.append(timed(lambda: jax.block_until_ready(forward_fn(params, batch)), repeats))
    compiled, batch = programs[sizes[0]]  # the step at the smallest size: its overhead does not grow with b
    step, bare, step_update, at_smallest, _ = measure_ddp_step(
        spec, params, loss_fn, batch, repeats, bare=lambda: jax.block_until_ready(compiled(params, batch)),
        update=lambda g: jax.block_until_ready(update(g, state, params)))
    truth = all(s is not None for row in activation for s in row)
    beside = None
    if truth and len(sizes) > 1:
        largest, rows = programs[sizes[-1]]
        *_, at_largest, backward = measure_ddp_step(spec, params, loss_fn, rows, 0,
                                                    bare=lambda: jax.block_until_ready(largest(params, rows)))
        beside = update_beside_backward(at_smallest, at_largest, backward)
    return {"framework": "jax", "threads": thread_count(), "cores": os.cpu_count(), "micro_batch_sizes": list(sizes),
            "parameter_bytes": param_bytes, "gradient_bytes": param_bytes, "optimizer_state_bytes": state_bytes,
            # where the high-water mark cannot be reset, the plan stands in for the truth (and says so)
            "activation_samples": activation if truth else [[p] for p in planned],
            "compute_s_samples": compute, "forward_s_samples": forward, "update_s": median(update_s),
            "step_s_samples": step, "step_bare_s_samples": bare, "step_update_s_samples": step_update,
            "update_beside_backward_bytes": beside,
            "truth_source": "VmHWM above VmRSS (clear_refs), less the gradients" if truth else
            "XLA memory_analysis (the process's high-water mark could not be reset)",
            "plan_activation_bytes": planned, "mesh_plan_activation_bytes": mesh_planned, "peak_array_bytes": None,
            "peak_rss_bytes": max(peak_rss, status_bytes("VmHWM") or 0), "versions": package_versions()}


def mesh_plan_bytes(loss_fn, params, batch, gradient_bytes: int) -> int | None:
    """XLA's plan per device, less the gradients, of forward and backward on a mesh of two devices each taking
    ``batch``, as a rank of a run of two or more compiles its step (compiled, never run); None with one device.
    XLA's CPU compiler plans that program apart from the one-device one: a Qwen3-shaped LM at 8 sequences of 128
    plans 20.6 MiB a device on 2 or 4 devices, with or without the gradients' mean, against 24.6 on one."""
    import jax
    import numpy as np

    devices = jax.devices()
    if len(devices) < 2:
        return None

    def local(p, rows):
        loss, grads = jax.value_and_grad(loss_fn)(p, rows)
        return loss[None], jax.tree_util.tree_map(lambda a: a[None], grads)

    mesh = jax.sharding.Mesh(np.array(devices[:2]), ("ranks",))
    spec = jax.sharding.PartitionSpec
    program = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(spec(), spec("ranks")),
                                    out_specs=(spec("ranks"), spec("ranks")), check_vma=False))
    shapes = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), params)
    rows = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct((2 * a.shape[0], *a.shape[1:]), a.dtype), batch)
    return plan_bytes(program.lower(shapes, rows).compile().memory_analysis(), gradient_bytes)


def plan_bytes(stats, gradient_bytes: int) -> int | None:
    """A compiled forward and backward's ``memory_analysis()``: its outputs and temporaries, less what aliases its
    arguments and the gradients it returns (the estimate's states); None where XLA gave no analysis."""
    if stats is None:
        return None
    return int(stats.output_size_in_bytes + stats.temp_size_in_bytes - stats.alias_size_in_bytes - gradient_bytes)


#: The fewest trainer steps timed (each beside a bare forward and backward and an update): the overhead is a small
#: difference.
MIN_STEP_REPEATS = 5


#: The step's rise at the largest size must pass its rise at the smallest by this share before the backward is
#: taken to set it: below, the update set both, and what it holds beside the backward is not seen.
BACKWARD_SETS_PEAK = 1.05


def update_beside_backward(at_smallest: int | None, at_largest: int | None, backward: int | None) -> int | None:
    """Bytes the whole step holds at its peak beyond ``backward`` (forward and backward alone: activations and
    gradients, read the same way) at the largest size, where the backward sets the step's peak; 0 where the update
    set it at both sizes (its copies are the estimate's ``step`` rows); None where a truth was not read."""
    if at_smallest is None or at_largest is None or backward is None:
        return None
    if at_largest <= BACKWARD_SETS_PEAK * at_smallest:
        return 0
    return max(0, at_largest - backward)


def measure_ddp_step(spec, params, loss_fn, batch, repeats: int, *, bare, update=None) -> tuple:
    """``(step, bare, update, rise, bare_rise)``: seconds of each of ``max(repeats, MIN_STEP_REPEATS)`` steps of the
    rank's DDP step (:func:`~workbench.adapters.jax.fsdp.make_ddp_step` on a mesh of this one device, as
    :mod:`workbench.ranks.train_jax` runs and times it), right after ``bare()`` (the compiled forward and
    backward) and ``update(grads)`` (the optimizer's), in threes, so that a change in the machine's load hits all
    alike; none where ``repeats`` is 0. ``rise``: how far the step after the one that compiled raised the
    process's resident mark above its arguments, as a rank reads its truth; ``bare_rise``: the same of ``bare()``
    just before it, under the same allocator settings (both None where the mark cannot be read)."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from workbench.adapters.jax.base import make_optimizer
    from workbench.adapters.jax.fsdp import make_ddp_step
    from workbench.adapters.jax.resident import ResidentStep

    mesh = Mesh(np.array(jax.devices()[:1]), ("fsdp",))
    p = jax.device_put(params, NamedSharding(mesh, P()))
    opt = make_optimizer(spec.optimizer, spec.learning_rate, weight_decay=spec.weight_decay)
    run = ResidentStep(make_ddp_step(loss_fn, p, opt, mesh, max_norm=spec.max_norm))
    p, state = run.enter(p), run.step.init(p)
    rows = jax.device_put(batch, NamedSharding(mesh, P("fsdp")))

    def one_step():
        nonlocal p, state
        p, state, metrics = run(p, state, rows)
        jax.block_until_ready((p, state, metrics["loss"], metrics["grad_norm"]))

    one_step()  # compiles: not timed
    gc.collect()
    bare_rise, _ = rss_above(bare)
    gc.collect()
    rise, _ = rss_above(one_step)
    step, bare_s, update_s = [], [], []
    for _ in range(max(repeats, MIN_STEP_REPEATS) if repeats else 0):
        t0 = time.perf_counter()
        _, grads = bare()
        bare_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        update(grads)
        update_s.append(time.perf_counter() - t0)
        del grads
        t0 = time.perf_counter()
        one_step()
        step.append(time.perf_counter() - t0)
    return step, bare_s, update_s, rise, bare_rise


def main(argv: list[str] | None = None) -> int:
    return profile_main(argv, "JAX", measure_jax)


if __name__ == "__main__":
    sys.exit(main())
