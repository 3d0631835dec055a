"""MLX's own ``fully_shard`` on every backend: the ``sum_scatter`` it needs, supplied for one block.

``mlx.nn.fully_shard`` (mlx >= 0.32.1) reduce-scatters each unit's gradients in a custom VJP,
``mx.distributed.sum_scatter(local_full, group=group) / N``, and only NCCL and JACCL have that
collective: ring raises "[ring] sum_scatter not supported.", MPI "[mpi] sum_scatter not yet implemented."
How it is called decides the patch: the VJP (``gather_vjp`` in ``mlx/nn/layers/distributed.py``)
looks up ``mx.distributed.sum_scatter`` through that module's global ``mx`` each time it runs, and
it runs while ``value_and_grad`` builds the backward graph (not at import, not at ``mx.eval``).
So :func:`supply_sum_scatter` rebinds that one module global, for the block only, to a view of
``mlx.core`` whose ``distributed.sum_scatter`` is the workbench's CPU reduce-scatter
(:func:`~workbench.adapters.mlx.transport.ring_reduce_scatter`); ``mlx.core`` itself is not touched,
so any other caller of ``sum_scatter`` (the user's code, the workbench's own transports) still gets
the backend's answer. On exit, error or not, the module's ``mx`` is ``mlx.core`` again. A graph built
inside the block keeps the supplied collectives wherever it is evaluated. Where the launch gathers in pieces
(:data:`~workbench.core.envvars.RING_PIECE_ENV`: a host whose ring ranks outnumber half its cores), the view's
``all_gather`` is :func:`~workbench.adapters.mlx.transport.gather_lazy` too: MLX's ring splits a call of 512 KiB or
more over two socket threads per rank that poll a core each, and on 2 cores with 2 ranks each unit's gather and
exchange met a 4 ms scheduler tick (the 3-block test LM's step: 66 ms, 42-48 in pieces).

:func:`check_sum_scatter` is the pre-run check: every rank reduce-scatters a known matrix through the
same lookup ``fully_shard`` uses, bounded in time. Without the shim on ring or MPI it raises
:class:`SumScatterMissing` on every rank at once, naming ``sum_scatter`` and the backend. On mlx 0.32.4
on Linux the backend's error reaches the caller (measured, 2 and 4 ring ranks, 2 MPI ranks); on macOS
MLX #4285 reports it lost on the stream thread and every rank waiting at 0% CPU, so a probe that does
not return within ``timeout_s`` ends the process with the same message rather than wait forever.
"""

from __future__ import annotations

import numbers
import os
import re
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import mlx.core as mx
import mlx.nn as nn
import mlx.nn.layers.distributed as mlx_distributed
from mlx.utils import tree_flatten

from workbench.adapters.mlx.base import spec_from_mlx
from workbench.adapters.mlx.transport import gather_lazy, has_sum_scatter, ring_reduce_scatter, ring_transport
from workbench.core.fully_shard_plan import ROOT, check_fully_shard, plan_fully_shard

#: Exit status of a rank whose ``sum_scatter`` probe never returned (MLX #4285).
PROBE_TIMEOUT_EXIT = 75
_LOCK = threading.Lock()


class SumScatterMissing(RuntimeError):
    """The backend has no ``sum_scatter`` and none is supplied; ``backend`` names it."""

    def __init__(self, message: str, backend: str):
        super().__init__(message)
        self.backend = backend


@dataclass
class SumScatterSupply:
    """What :func:`supply_sum_scatter` did: ``supplied`` (False where the backend has its own),
    ``backend``, the ring's way of moving rows, and ``num_calls`` (reduce-scatters built in the block)."""

    backend: str
    supplied: bool
    transport: str | None = None
    num_calls: int = 0
    last: Any = field(default=None, repr=False)


class _View:
    """A module's attributes, some replaced: ``getattr`` falls through to ``base``."""

    def __init__(self, base: Any, **replaced: Any):
        self.__dict__.update(replaced, _base=base)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


def backend_name(error: BaseException | None = None) -> str:
    """The backend a rank runs: from MLX's error (``"[ring] ..."``), else ``WORKBENCH_BACKEND``, else ``"this"``."""
    match = re.match(r"\[(\w+)\]", str(error or ""))
    return match.group(1) if match else os.environ.get("WORKBENCH_BACKEND", "this")


def _supplied(supply: SumScatterSupply):
    def sum_scatter(x: mx.array, *, group: Any = None, stream: Any = None) -> mx.array:
        """``mx.distributed.sum_scatter`` by the workbench ring: row r of the sum of ``x.reshape(N, -1)``."""
        group = group or mx.distributed.init()
        n = group.size()
        if x.ndim == 0 or x.shape[0] % n:
            raise ValueError(f"sum_scatter: axis 0 of shape {tuple(x.shape)} must be divisible by the group size {n}.")
        rows = x.reshape(n, -1)
        if supply.last is not None:  # one reduce-scatter after another: the ring pairs sends in order
            rows = mx.depends(rows, supply.last)
        out = ring_reduce_scatter(lambda k: rows[k], group, stream)
        supply.last = out[:1] * 0  # a token: holding the output would keep its buffer alive
        supply.num_calls += 1
        return out.reshape((x.shape[0] // n,) + tuple(x.shape[1:]))

    return sum_scatter


def _gather(x: mx.array, *, group: Any = None, stream: Any = None) -> mx.array:
    """``mx.distributed.all_gather`` in pieces where the launch asks for them (one call where it does not)."""
    return gather_lazy(x, group or mx.distributed.init(), stream)


@contextmanager
def supply_sum_scatter(group: Any = None) -> Iterator[SumScatterSupply]:
    """Within the block, MLX's ``fully_shard`` reduce-scatters with the workbench ring where the backend
    has no ``sum_scatter``; outside it nothing changes. Where the backend has one, nothing is replaced.

    Usage, in a user's loop (every rank enters the block alike)::

        for i, block in enumerate(model.layers):
            model.layers[i] = nn.fully_shard(block, group=group)
        model = nn.fully_shard(model, group=group)
        with supply_sum_scatter(group):
            for x, y in batches:
                loss, grads = nn.value_and_grad(model, loss_fn)(model, x, y)
                optimizer.update(model, grads)
                mx.eval(model.parameters(), optimizer.state, loss)

    The backward graph must be built inside the block (``value_and_grad``); evaluating it later is fine.
    At two ranks a reduce-scatter is one ``all_gather`` exchange, beyond that N - 1 send/recv hops,
    each issued after the previous reduce-scatter; the units' all-gathers and the exchanges go in pieces where
    the launch asks for them (:func:`~workbench.adapters.mlx.transport.gather_lazy`). Blocks nest.

    Args:
        group: The group the wrapped modules shard over. Default: the global group.

    Yields:
        A :class:`SumScatterSupply`, counting the reduce-scatters supplied.
    """
    group = group or mx.distributed.init()
    n = group.size()
    native = n == 1 or has_sum_scatter(group)  # probed (once per process) before anything is replaced
    supply = SumScatterSupply(backend=backend_name(), supplied=not native,
                              transport=None if native else ring_transport("ring", n))
    if native:
        yield supply
        return
    with _LOCK:
        before = mlx_distributed.mx
        mlx_distributed.mx = _View(mx, distributed=_View(mx.distributed, sum_scatter=_supplied(supply),
                                                         all_gather=_gather))
    try:
        yield supply
    finally:
        with _LOCK:
            mlx_distributed.mx = before
        supply.last = None


def _probe(group: Any) -> None:
    """Reduce-scatter a known (N, 2) matrix through ``fully_shard``'s lookup and check this rank's row."""
    n, r = group.size(), group.rank()
    x = mx.array([[(r + 1) * (k + 1), -(k + 1)] for k in range(n)], dtype=mx.float32)
    got = mlx_distributed.mx.distributed.sum_scatter(x, group=group).tolist()
    want = [[(r + 1) * n * (n + 1) / 2, -(r + 1) * n]]  # row r of the sum over ranks
    if got != want:
        raise SumScatterMissing(f"sum_scatter on rank {r} of {n} returned {got} for a known matrix, not {want}: the "
                                f"reduce-scatter fully_shard would use on the {backend_name()} backend is wrong.",
                                backend_name())


def check_sum_scatter(group: Any = None, *, timeout_s: float = 120.0) -> str:
    """Before a run: can MLX's ``fully_shard`` reduce-scatter on this group? Call on every rank alike.

    Returns ``"native"`` (the backend has ``sum_scatter``), ``"supplied"`` (inside
    :func:`supply_sum_scatter`) or ``"none needed"`` (one rank).

    Args:
        group: Default: the global group.
        timeout_s: Longest wait for the probe, seconds: it covers the ranks arriving at different times.

    Raises:
        SumScatterMissing: on every rank alike, naming ``sum_scatter`` and the backend, where it has none
            and none is supplied. A probe that does not return within ``timeout_s`` (MLX #4285: the
            backend's error lost on the stream thread) prints the message and ends the process with
            :data:`PROBE_TIMEOUT_EXIT`: a thread stuck inside MLX cannot be interrupted.
    """
    group = group or mx.distributed.init()
    if group.size() == 1:
        return "none needed"
    supplied = mlx_distributed.mx is not mx
    hint = ("run the step inside workbench.adapters.mlx.fully_shard.supply_sum_scatter(group), which supplies the "
            "workbench's CPU ring reduce-scatter for the block")

    def stuck() -> None:
        why = ("the workbench ring supplied for it waits for a rank that did not take part: every rank must enter "
               "supply_sum_scatter and run this check alike" if supplied else
               f"MLX #4285: the backend's error is lost on the stream thread and the ranks wait forever; {hint}")
        sys.stderr.write(f"SumScatterMissing: rank {group.rank()}: the sum_scatter probe on the {backend_name()} "
                         f"backend did not return within {timeout_s:g} s ({why}).\n")
        sys.stderr.flush()
        os._exit(PROBE_TIMEOUT_EXIT)

    watchdog = threading.Timer(timeout_s, stuck)
    watchdog.daemon = True
    watchdog.start()
    try:
        _probe(group)
    except RuntimeError as err:
        if isinstance(err, SumScatterMissing):
            raise
        backend = backend_name(err)
        raise SumScatterMissing(f"MLX's fully_shard reduce-scatters gradients with mx.distributed.sum_scatter in "
                                f"backward, and the {backend} backend has none ({err}); {hint}.", backend) from err
    finally:
        watchdog.cancel()
    return "supplied" if supplied else "native"


def _set_module(model: nn.Module, path: str, module: nn.Module) -> None:
    *head, last = path.split(".")
    parent = model
    for key in head:
        parent = parent[int(key)] if isinstance(parent, list) else parent[key]
    if isinstance(parent, list):
        parent[int(last)] = module
    else:
        parent[last] = module


def fully_shard_units(model: nn.Module, group: Any = None, *, units: list[str] | None = None,
                      compute_dtype: Any = None) -> nn.Module:
    """Wrap ``model`` with MLX's ``fully_shard`` unit by unit, as a user would: each unit (default: every
    transformer block) innermost first, then the root. Returns the new root (use it as the model).

    Raises:
        ValueError: before anything is wrapped, listing every parameter ``fully_shard`` would refuse or
            break (:func:`workbench.core.fully_shard_plan.check_fully_shard`, MLX's wording), or naming a bad unit.
    """
    group = group or mx.distributed.init()
    spec = spec_from_mlx(model, trainable_only=False)
    refused = check_fully_shard(spec, group.size(), units)
    if refused:
        raise ValueError(f"fully_shard over {group.size()} ranks would refuse {len(refused)} parameter(s):\n"
                         + "\n".join(r.message for r in refused))
    for name in plan_fully_shard(spec, group.size(), units=units).wrap_order:
        if name != ROOT:
            modules = dict(model.named_modules())
            _set_module(model, name, _wrap(modules[name], group, compute_dtype))
    return _wrap(model, group, compute_dtype)


def _wrap(module: nn.Module, group: Any, compute_dtype: Any) -> nn.Module:
    """``nn.fully_shard(module)``, carrying a copy of the module's plain attributes (None, numbers, strings) that the
    wrapper lacks: MLX's ``FullyShardedModule`` does not read through to them, and a model may read its blocks'
    (mlx-lm's Llama reads each layer's ``use_sliding`` in its forward: wrapped, every rank failed with
    AttributeError)."""
    wrapper = nn.fully_shard(module, group=group, compute_dtype=compute_dtype)
    if wrapper is not module:
        for key, value in vars(module).items():
            if not key.startswith("_") and (value is None or isinstance(value, (numbers.Number, str))) \
                    and not hasattr(wrapper, key):
                setattr(wrapper, key, value)
    return wrapper


def unwrap_path(model: nn.Module, path: str) -> tuple[str, bool]:
    """A parameter's path in the unwrapped model (each wrapper's ``module.`` dropped), and whether a
    ``FullyShardedModule`` holds it (then it is this rank's rows)."""
    obj, out, sharded = model, [], False
    for key in path.split("."):
        if isinstance(obj, mlx_distributed.FullyShardedModule) and key == "module":
            sharded, obj = True, obj.module
            continue
        obj = obj[int(key)] if isinstance(obj, list) else obj[key]
        out.append(key)
    return ".".join(out), sharded


def full_parameters(model: nn.Module, group: Any = None) -> dict[str, mx.array]:
    """``{unwrapped path: full array}`` of a ``fully_shard``-wrapped model, evaluated: each shard all-gathered
    along axis 0, one all_gather per parameter (for checks and checkpoints, not for the step)."""
    group = group or mx.distributed.init()
    out = {}
    for path, a in tree_flatten(model.parameters()):
        plain, sharded = unwrap_path(model, path)
        out[plain] = mx.distributed.all_gather(a, group=group) if sharded and group.size() > 1 else a
    mx.eval(out)
    return out
