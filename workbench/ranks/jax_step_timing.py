"""One process of the JAX step-time benchmark (driven by ``benchmarks/bench_fsdp_step.py --framework jax``).

    python -m workbench.ranks.jax_step_timing --out DIR [--hidden 2048] [--layers 6] [--steps 12]
        [--strategies ddp,fsdp-row,fsdp-flat] [--communication-size BYTES] [--phases]

The JAX twin of :mod:`workbench.ranks.mlx_step_timing`, on the same model size: an MLP
(:mod:`workbench.models.jax_mlp`) of ``--layers`` square ``--hidden`` layers (25.2M parameters by
default), fp32 AdamW, one CPU device per process, collectives over gloo (the launcher's
``WORKBENCH_*`` variables, :func:`workbench.ranks.jax_args.parse_rank_args`). Every strategy is a
jitted step of :mod:`workbench.adapters.jax.fsdp` with its own parameters and optimizer state (FSDP's
on resident bucket buffers, :data:`STRATEGIES`); each
step runs every strategy once, in turn (interleaved), behind a barrier, timed from the call to the
parameters and state being ready (forward, backward, collectives and update are one compiled
program). ``--phases`` adds each step cut into separately compiled parts
(:mod:`workbench.ranks.jax_phases`), timed alone. The first call of each strategy compiles it (a
warm-up step).
Writes ``DIR/rank{r}.json``: per-step seconds, the parameter count, optimizer-state bytes per rank.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from workbench.adapters.jax.distributed import initialize_jax
from workbench.core.units import MiB
from workbench.models.jax_mlp import build_problem, mlp_loss
from workbench.ranks.jax_args import parse_rank_args
from workbench.strategies import get_strategy

#: Timed name -> (registered strategy, reduce-scatter transport of the FSDP step, resident). FSDP runs on
#: resident bucket buffers (``step_buckets``, donated) unless ``-tree`` (``step`` on the pytree: pack and
#: unpack every call); DDP does not donate unless ``-donated``. The defaults use the step's ``"auto"``
#: transport (all-to-all on CPU); ``-rs`` XLA's ``psum_scatter``, for comparison.
STRATEGIES = {"ddp": ("ddp", None, False), "ddp-donated": ("ddp", None, True),
              "fsdp-row": ("fsdp-row", "auto", True), "fsdp-flat": ("fsdp-flat", "auto", True),
              "fsdp-row-tree": ("fsdp-row", "auto", False), "fsdp-flat-tree": ("fsdp-flat", "auto", False),
              "fsdp-row-rs": ("fsdp-row", "psum_scatter", True), "fsdp-flat-rs": ("fsdp-flat", "psum_scatter", True)}
DEFAULT_STRATEGIES = ("ddp", "fsdp-row", "fsdp-flat")


def local_state_bytes(state) -> int:
    """Bytes of this process's pieces of every array in an optimizer state."""
    import jax

    return int(sum(shard.data.nbytes for leaf in jax.tree_util.tree_leaves(state) if hasattr(leaf, "addressable_shards")
                   for shard in leaf.addressable_shards))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES))
    parser.add_argument("--communication-size", type=int, default=32 * MiB, help="FSDP bucket cap in bytes")
    parser.add_argument("--phases", action="store_true", help="also time each strategy's step part by part")
    args = parse_rank_args(argv, parser=parser)
    names = args.strategies.split(",")
    unknown = [s for s in names if s not in STRATEGIES]
    if unknown:
        parser.error(f"--strategies: unknown {unknown}; choose from {', '.join(STRATEGIES)}")

    import jax
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from workbench.adapters.jax.base import make_optimizer
    from workbench.adapters.jax.fsdp import make_ddp_step, make_fsdp_step
    from workbench.ranks.jax_phases import ddp_parts, fsdp_parts, time_parts

    initialize_jax(args.coordinator, args.num_processes, args.process_id, backend=args.backend,
                   timeout_s=args.timeout_s)
    try:
        mesh = Mesh(np.array(jax.devices()), ("fsdp",))
        params, batch = build_problem(args.seed, args.batch, (args.hidden,) * (args.layers + 1))

        def to_global(tree, spec):  # every process holds the full NumPy data: take our pieces
            sharding = NamedSharding(mesh, spec)
            return jax.tree_util.tree_map(lambda a: jax.make_array_from_callback(a.shape, sharding, lambda i: a[i]), tree)

        steps, state, run = {}, {}, {}
        for name in names:
            opt = make_optimizer("adamw", 1e-4, weight_decay=0.01)
            strategy, transport, resident = STRATEGIES[name]
            record = get_strategy(strategy, framework="jax")
            if record.family == "data_parallel":
                steps[name] = make_ddp_step(mlp_loss, params, opt, mesh, donate=resident)
            else:
                steps[name] = make_fsdp_step(mlp_loss, params, opt, mesh, layout=record.layout, reduce_scatter=transport,
                                             communication_size=args.communication_size)
            p = to_global(params, P())
            s = steps[name].init(p)
            fsdp_resident = resident and transport is not None
            state[name] = (steps[name].to_buckets(p) if fsdp_resident else p, s)
            run[name] = steps[name].step_buckets if fsdp_resident else steps[name].step
        b = to_global(batch, P("fsdp"))
        times = {name: [] for name in names}
        parts = {name: ddp_parts(steps[name], mesh) if STRATEGIES[name][1] is None else
                 fsdp_parts(steps[name], mesh, resident=STRATEGIES[name][2]) for name in names} if args.phases else {}
        phases = {name: {} for name in parts}
        for i in range(args.steps):
            for name in names:
                multihost_utils.sync_global_devices(f"step {i} {name}")
                t0 = time.perf_counter()
                p, s, _ = run[name](*state[name], b)
                jax.block_until_ready((p, s))
                times[name].append(time.perf_counter() - t0)
                state[name] = (p, s)
            for name, programs in parts.items():
                part_s = time_parts(programs, *state[name], b, lambda what: multihost_utils.sync_global_devices(
                    f"step {i} {name} {what}"))
                for part, seconds in part_s.items():
                    phases[name].setdefault(part, []).append(seconds)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"rank{jax.process_index()}.json").write_text(json.dumps({
            "rank": jax.process_index(), "size": jax.process_count(), "framework": "jax", "backend": args.backend,
            "num_params": int(sum(a.size for a in jax.tree_util.tree_leaves(params))), "times_s": times,
            "optimizer_state_bytes": {name: local_state_bytes(state[name][1]) for name in names},
            "communication_sizes": [args.communication_size], "jax_version": jax.__version__, "phases_s": phases,
        }))
    finally:
        jax.distributed.shutdown()


if __name__ == "__main__":
    main()
