"""``python -m workbench.ranks.profile_mlx``: measure an MLX model once, on one process (issue 26).

The model is the run's (:func:`~workbench.ranks.user_model.mlx_model_and_loss`: the built-in LM or the
user's factory), its optimizer the run's. One update first, so the optimizer state exists as in every step
after a run's first. Then, at each micro-batch size, once and then at least ``max(repeats, MIN_TIMED)`` times (the first
call's seconds left out, as a run's first step is): forward and backward exactly as the
trainers run them (:func:`~workbench.adapters.mlx.accum.accumulate_microbatches`: ``nn.value_and_grad``,
loss and gradients evaluated together), between ``mx.reset_peak_memory()`` and ``mx.get_peak_memory()``.
The activation bytes of a measurement are that peak above the arrays live before it (parameters, optimizer
state, the batch), less the gradients it produced (a run's estimate counts those as a state); where the model
has transformer blocks, also the rise of the ZeRO-3 trainer's step on a group of one (:func:`measure_zero3_step`),
what a step resharding its units after forward and recomputing them holds. Also timed:
forward and backward (seconds), forward alone (what a rank recomputes in backward where
its units reshard after forward), and the optimizer's update of the whole model (seconds, over the parameter
bytes). Last, at the smallest size, the step a rank really runs, timed as :mod:`workbench.ranks.train_mlx` times it: DDP's trainer
(:func:`~workbench.adapters.mlx.accum.make_trainer`, one micro-batch, the run's ``max_norm`` or an infinite one,
as the rank asks) on MLX's group of one, whose collectives do nothing; what it takes beyond forward, backward
and update is the step's overhead (evaluation barriers, tree maps, the norm, the update's calls, Python).
Started by :func:`workbench.launch.profile.profile_model` with the threads a rank will have, as many at once
as the run's ranks per host.
"""

from __future__ import annotations

import gc
import math
import os
import sys
import time

from workbench.ranks.probes import package_versions, peak_rss_bytes, tree_nbytes
from workbench.ranks.profile_probe import (
    median,
    profile_main,
    thread_count,
    timed,
    token_batch,
)
from workbench.ranks.user_model import block_units, mlx_model_and_loss


def measure_mlx(spec, sizes: list[int], repeats: int, ready=None) -> dict:
    """The profile's measurements of ``spec``'s MLX model (plain data; see the module docstring); ``ready(phase)`` is
    called before each phase of measurements (``ready()`` before the first) to start it with the other profiling
    processes."""
    import mlx.core as mx
    import mlx.nn as nn

    from workbench.adapters.mlx.accum import accumulate_microbatches
    from workbench.adapters.mlx.base import make_optimizer
    from workbench.adapters.mlx.fsdp import optimizer_state_bytes

    model, loss_fn = mlx_model_and_loss(spec)
    opt = make_optimizer(spec.optimizer, spec.learning_rate, weight_decay=spec.weight_decay)
    value_and_grad = nn.value_and_grad(model, loss_fn)

    def backward(b: int):
        inputs, targets = (mx.array(a) for a in token_batch(spec, b))
        mx.eval(inputs, targets)
        return lambda: accumulate_microbatches(value_and_grad, model, [(inputs, targets)], None)

    ready = ready or (lambda phase="ready": None)
    ready()
    _, grads, _ = backward(sizes[0])()
    gradient_bytes = tree_nbytes(grads)
    update_s = []
    for _ in range(repeats + 1):  # the first creates the optimizer state: not timed
        t0 = time.perf_counter()
        model.update(opt.apply_gradients(grads, model.trainable_parameters()))
        mx.eval(model.parameters(), opt.state)
        update_s.append(time.perf_counter() - t0)
    del grads
    activation, compute, forward, peak_array = [], [], [], 0
    for b in sizes:
        run, samples, seconds = backward(b), [], []
        ready(f"size{b}")
        # the peak of a small model's backward differs from call to call by whole buffers (a logits-sized one, or
        # none: how far MLX's graph is allocated ahead of what it frees); a run's peak, over all its steps, meets
        # the higher one, so a cheap size is sampled on to MORE_SAMPLES_S, up to MAX_SAMPLES, to meet it too
        # the first call at a size allocates its buffers afresh (MLX's cache holds the last size's): its peak is
        # sampled, its seconds are not, as a run's first step is not (a run of attention at 8 sequences: the first
        # call 94.6-118.8 ms, the next ones 80.9-95.0); at least MIN_TIMED timed, for a median its slow calls do not set
        # Python's collector runs once per size, not before each call: a call right after gc.collect() took 7% longer
        # (its walk of every object leaves the caches cold: 18.8 ms against 17.5 for the 3-block test LM at 2
        # sequences, two processes at once, 30 calls each way, twice), and a rank's steps do not collect between them
        started = time.perf_counter()
        gc.collect()
        while len(seconds) < max(repeats, MIN_TIMED) + 1 or (len(samples) < MAX_SAMPLES
                                                              and time.perf_counter() - started < MORE_SAMPLES_S):
            base = mx.get_active_memory()
            mx.reset_peak_memory()
            t0 = time.perf_counter()
            loss, grads, _ = run()
            seconds.append(time.perf_counter() - t0)
            peak = mx.get_peak_memory()
            peak_array = max(peak_array, peak)
            samples.append(int(peak - base - gradient_bytes))
            del loss, grads
        activation.append(samples)
        compute.append(seconds[1:])
        inputs, targets = (mx.array(a) for a in token_batch(spec, b))
        forward.append(timed(lambda: mx.eval(loss_fn(model, inputs, targets)), repeats))
    ready("step")
    step, bare, step_update = measure_trainer_step(spec, model, loss_fn, opt, sizes[0], repeats)  # not growing with b
    zero3 = measure_zero3_step(spec, sizes, repeats)  # last: it shards a model of its own
    return {"framework": "mlx", "threads": thread_count(), "cores": os.cpu_count(), "micro_batch_sizes": list(sizes),
            "parameter_bytes": tree_nbytes(model.trainable_parameters()), "gradient_bytes": gradient_bytes,
            "optimizer_state_bytes": optimizer_state_bytes(opt), "activation_samples": activation,
            "zero3_rise_samples": zero3,
            "compute_s_samples": compute, "forward_s_samples": forward, "update_s": median(update_s[1:]),
            "step_s_samples": step, "step_bare_s_samples": bare, "step_update_s_samples": step_update,
            "truth_source": "mx.get_peak_memory above the live arrays, less the gradients",
            "plan_activation_bytes": None, "peak_array_bytes": int(peak_array), "peak_rss_bytes": peak_rss_bytes(),
            "versions": package_versions()}


#: The most forward-and-backward samples a size gets when each is quick (see :func:`measure_mlx`), and the seconds
#: per size within which samples go on past ``repeats``: a tiny model's 3 samples missed its peak's higher value
#: (900,756 B in all 3 at 8 sequences, 1,181,728 B in 2 of 3 an hour before), 6 met it every time in 4 profiles.
#: A profile's co-running processes pool theirs (:func:`workbench.launch.profile.merge_co_runners`).
MAX_SAMPLES, MORE_SAMPLES_S = 8, 0.25
#: The fewest forward-and-backward calls timed at a size, after one that is not.
MIN_TIMED = 5


#: The fewest trainer steps timed (each beside a bare forward and backward): the overhead is a small difference.
MIN_STEP_REPEATS = 5


def measure_trainer_step(spec, model, loss_fn, opt, micro_batch_size: int, repeats: int
                         ) -> tuple[list[float], list[float], list[float]]:
    """``(step, bare, update)`` seconds: each of ``max(repeats, MIN_STEP_REPEATS)`` steps of DDP's trainer on
    MLX's group of one over one micro-batch of ``micro_batch_size`` sequences, timed as the rank times its step
    (after one step not timed), right after a bare forward and backward of the same micro-batch and the
    optimizer's update with its gradients (in threes, so that a change in the machine's load hits all alike)."""
    import mlx.core as mx
    import mlx.nn as nn

    from workbench.adapters.mlx.accum import accumulate_microbatches, make_trainer

    os.environ.pop("MLX_HOSTFILE", None)  # as a rank of one: no peers, no backend
    group = mx.distributed.init(strict=False)
    trainer = make_trainer(model, opt, group, strategy="ddp", communication_size=spec.communication_size,
                           max_norm=spec.max_norm if spec.max_norm is not None else math.inf)
    inputs, targets = (mx.array(a) for a in token_batch(spec, micro_batch_size))
    trainer.step(loss_fn, inputs, targets)
    value_and_grad, step, bare, update = nn.value_and_grad(model, loss_fn), [], [], []
    for _ in range(max(repeats, MIN_STEP_REPEATS)):
        t0 = time.perf_counter()
        _, grads, _ = accumulate_microbatches(value_and_grad, model, [(inputs, targets)], None)
        bare.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        model.update(opt.apply_gradients(grads, model.trainable_parameters()))
        mx.eval(model.parameters(), opt.state)
        update.append(time.perf_counter() - t0)
        del grads
        inputs, targets = (mx.array(a) for a in token_batch(spec, micro_batch_size))
        t0 = time.perf_counter()
        trainer.step(loss_fn, inputs, targets)
        step.append(time.perf_counter() - t0)
    return step, bare, update


def measure_zero3_step(spec, sizes: list[int], repeats: int) -> list[list[int]] | None:
    """Per size, how far each of ``repeats`` steps of the ZeRO-3 trainer (each transformer block a unit,
    :func:`~workbench.ranks.user_model.block_units`, resharded after forward and recomputed in backward) raised
    MLX's peak above the arrays live before it, on MLX's group of one, whose collectives copy and keep their order
    as a ring's do (:class:`~workbench.adapters.mlx.transport.Collectives`); None where the model has no blocks.
    A step whose graph orders its collectives frees what one lazy forward and backward keeps: the growth from 1 to
    4 sequences was 0.90-1.03x the 2-rank ring's on four models, one lazy backward's with every block recomputed
    (``nn.utils.checkpoint``) 1.13x (Qwen3) to 1.65x (Llama)."""
    import mlx.core as mx

    from workbench.adapters.mlx.base import make_optimizer
    from workbench.adapters.mlx.zero3_trainer import make_zero3_trainer

    model, loss_fn = mlx_model_and_loss(spec)
    units = block_units(model)
    if not units:
        return None
    os.environ.pop("MLX_HOSTFILE", None)
    trainer = make_zero3_trainer(model, make_optimizer(spec.optimizer, spec.learning_rate,
                                                       weight_decay=spec.weight_decay),
                                 mx.distributed.init(strict=False), units=units, max_norm=math.inf)
    out = []
    for b in sizes:
        inputs, targets = (mx.array(a) for a in token_batch(spec, b))
        trainer.step(loss_fn, inputs, targets)  # the first at this size: not measured
        rises = []
        for _ in range(repeats):
            gc.collect()
            base = mx.get_active_memory()
            mx.reset_peak_memory()
            trainer.step(loss_fn, inputs, targets)
            rises.append(int(mx.get_peak_memory() - base))
        out.append(rises)
    return out


def main(argv: list[str] | None = None) -> int:
    return profile_main(argv, "MLX", measure_mlx)


if __name__ == "__main__":
    sys.exit(main())
