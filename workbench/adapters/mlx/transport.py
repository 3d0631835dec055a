"""How MLX ranks exchange gradient rows: the reduce-scatter transports, the all-gather, HSDP groups.

MLX's CPU backends (ring, MPI) have no ``sum_scatter``: :func:`ring_reduce_scatter` is the workbench's
ring over send/recv (at two ranks, one all_gather exchange). :func:`has_sum_scatter` probes the backend
once per process. The FSDP step's buckets go through :func:`reduce_scatter_bucket` and :func:`gather_bucket`:
in pieces on a host with too few cores for the ring's polling socket threads.
"""

from __future__ import annotations

import functools
import os
from collections import Counter
from typing import Any, Callable

import mlx.core as mx

from workbench.core.checks import as_whole
from workbench.core.envvars import RING_PIECE_BYTES, ring_piece_bytes

REDUCE_SCATTER_TRANSPORTS = ("auto", "sum_scatter", "ring", "send_recv", "all_sum")


_SUM_SCATTER_SUPPORT: list[bool] = []  # one process, one backend: probed once


def has_sum_scatter(group: mx.distributed.Group) -> bool:
    """Whether the process's backend implements ``sum_scatter`` (probed once per process).

    A process runs one backend, so the answer holds for all its groups (``init()`` returns
    a new ``Group`` object on every call, so groups make poor cache keys). Ring and MPI
    raise before any byte is sent ("[ring] sum_scatter not supported."), on every rank
    alike, so the probe is safe to run collectively.
    """
    if not _SUM_SCATTER_SUPPORT:
        try:
            mx.eval(mx.distributed.sum_scatter(mx.zeros((group.size(),)), group=group))
            _SUM_SCATTER_SUPPORT.append(True)
        except RuntimeError:
            _SUM_SCATTER_SUPPORT.append(False)
    return _SUM_SCATTER_SUPPORT[0]


def resolve_transport(group: mx.distributed.Group, transport: str = "auto") -> str:
    """The reduce-scatter transport ``transport`` names on this group: ``"auto"`` is ``"sum_scatter"``
    where the backend has it, else the workbench's ``"ring"`` (on 4 CPU ring ranks its send/recv ring
    reduce-scattered a 24 MiB bucket in 171-218 ms against 300-440 ms for ``all_sum`` and a slice,
    measured); any other name is returned as it is."""
    if transport != "auto":
        return transport
    return "sum_scatter" if group.size() > 1 and has_sum_scatter(group) else "ring"


def make_hsdp_groups(fsdp_size: int, world: mx.distributed.Group | None = None):
    """Split the world into ``(fsdp_group, dp_group)``: shard within blocks of ``fsdp_size`` ranks.

    Rank r shards with ranks ``r // fsdp_size * fsdp_size ...`` and replicates with the
    ranks holding the same shard index in the other blocks.

    Raises:
        ValueError: if ``fsdp_size`` does not divide the world size.
        RuntimeError: if the backend cannot split groups (ring), naming it.
    """
    world = world or mx.distributed.init()
    n, r = world.size(), world.rank()
    if as_whole(fsdp_size) is None or as_whole(fsdp_size) < 1 or n % as_whole(fsdp_size):
        raise ValueError(f"fsdp_size must be a positive divisor of the world size {n}, got {fsdp_size!r}.")
    fsdp_size = as_whole(fsdp_size)
    try:
        fsdp = world.split(r // fsdp_size, r % fsdp_size)
        dp = world.split(r % fsdp_size, r // fsdp_size)
    except RuntimeError as err:
        backend = os.environ.get("WORKBENCH_BACKEND", "this")
        raise RuntimeError(
            f"HSDP needs Group.split, which the {backend} backend does not support ({err}). "
            "Use the NCCL or MPI backend for HSDP, or JAX's 2-D mesh."
        ) from err
    return fsdp, dp


@functools.lru_cache(maxsize=1)
def ring_streams() -> tuple:
    """Two streams of the default device: sends on one, receives on the other (made once)."""
    device = mx.default_device()
    return mx.new_stream(device), mx.new_stream(device)


def ring_reduce_scatter(row: Callable[[int], mx.array], group: mx.distributed.Group, stream: Any = None, *,
                        exchange_at_two: bool = True) -> mx.array:
    """Sum a bucket over the group; return this rank's row of the sum.

    ``row(k)`` gives this rank's local row k of the bucket (1-D, the elements rank k owns),
    so only the rows being sent are ever materialised. A ring of N - 1 steps: at step k
    rank r sends its partial sum of row ``r - k - 1`` to rank r + 1 and adds the partial sum
    of row ``r - k - 2`` received from rank r - 1, so each rank sends ``(N - 1) * c``
    elements in all, the ideal. The ring backend's ``send`` waits for the matching ``recv``:
    with both on one stream every rank would wait in its send, so sends and receives go on
    two streams and each hop runs both directions at once. With two ranks the one hop is an
    ``all_gather`` of the row the other rank owns (same bytes, MLX's faster transport).
    ``stream`` (the caller's communication stream) carries the sends when given. The result
    is lazy, like every MLX collective. ``exchange_at_two=False`` keeps send/recv at two ranks.
    """
    n, r = group.size(), group.rank()
    if n == 1:
        return row(0)
    if n == 2 and exchange_at_two:
        # Two ranks: the ring is one exchange of the row the other rank owns. MLX's
        # all_gather moves it ~4x faster than send/recv on the ring backend (12.8 vs 53 ms
        # for 16 MiB here), for the same (N - 1) / N of the bucket per rank.
        theirs = gather_lazy(row(1 - r), group, stream)
        return row(r) + theirs.reshape(2, -1)[1 - r]
    send_stream, recv_stream = ring_streams()
    send_stream = stream or send_stream
    right, left = (r + 1) % n, (r - 1) % n
    acc = row((r - 1) % n)
    for k in range(n - 1):
        sent = mx.distributed.send(acc, right, group=group, stream=send_stream)
        got = mx.distributed.recv_like(acc, left, group=group, stream=recv_stream)
        acc = row((r - k - 2) % n) + mx.depends(got, sent)
    return acc


def reduce_scatter(rows: Callable[[int], mx.array] | mx.array, group: mx.distributed.Group, transport: str,
                   stream: Any) -> mx.array:
    """This rank's row of the sum over ranks, by ``transport`` (one of :data:`REDUCE_SCATTER_TRANSPORTS` but
    ``"auto"``). ``rows`` is the local ``(N, c)`` matrix whose row k is the local row k, or a function
    ``row(k)`` giving each 1-D row of the same length (only the rows the transport needs are built)."""
    n = group.size()
    matrix = rows if isinstance(rows, mx.array) else None
    row = (lambda k: matrix[k]) if matrix is not None else rows
    if n == 1:
        return row(0)
    if transport in ("ring", "send_recv"):
        return ring_reduce_scatter(row, group, stream, exchange_at_two=transport == "ring")
    if matrix is None:
        matrix = mx.stack([row(k) for k in range(n)])
    if transport == "sum_scatter":
        return mx.distributed.sum_scatter(matrix, group=group, stream=stream)[0]
    return mx.distributed.all_sum(matrix, group=group, stream=stream)[group.rank()]


#: MLX's ring backend splits an ``all_gather`` of at least this many bytes over both sockets of a neighbour pair
#: (``min_send_size`` 256 KiB per piece, ``mlx/distributed/ring/ring.cpp``), and each socket's thread polls
#: without sleeping while its receive waits: two spinning threads per rank. A launch's pieces are at most half.
RING_SPLIT_BYTES = 2 * RING_PIECE_BYTES


def all_gather(shard: mx.array, group: mx.distributed.Group, stream: Any) -> mx.array:
    """``(N * c,)``: every rank's 1-D shard, in rank order (lazy, as every MLX collective): MLX's one call."""
    if group.size() == 1:
        return shard
    return mx.distributed.all_gather(shard, group=group, stream=stream)


def gather_lazy(x: mx.array, group: mx.distributed.Group, stream: Any = None) -> mx.array:
    """``mx.distributed.all_gather(x)``, lazy (for graphs built whole: MLX's ``fully_shard`` within
    :func:`~workbench.adapters.mlx.fully_shard.supply_sum_scatter`, the ZeRO-3 step, the 2-rank exchange of
    :func:`ring_reduce_scatter`), in pieces of ``x`` flattened where :func:`_pieces` says, concatenated. On 2 cores
    with 2 ring ranks, MLX's fully_shard step of the 3-block test LM (units of 1.8 MB) took 66 ms in one call a
    unit, 42-48 in pieces; its peak 25.2 and 24.9 MiB."""
    n, flat = group.size(), x.reshape(-1)
    piece = _pieces(flat) if n > 1 else 0
    if not piece:
        return mx.distributed.all_gather(x, group=group, stream=stream)
    parts = [got for _, got in _gathered_pieces(flat, piece, group, stream)]
    return mx.concatenate(parts, axis=1).reshape((n * x.shape[0],) + tuple(x.shape[1:]))


def _pieces(part: mx.array) -> int:
    """Elements per piece for gathering ``part`` (0: one call): where the launch set :data:`RING_PIECE_ENV` and
    ``part`` is as big as MLX's ring splits over two sockets."""
    piece = ring_piece_bytes() // part.itemsize
    return piece if piece and part.nbytes >= RING_SPLIT_BYTES and part.ndim == 1 else 0


def _gathered_pieces(part: mx.array, piece: int, group: mx.distributed.Group, stream: Any):
    """``(start, (N, m) rows)`` for each ``piece`` elements of the 1-D ``part`` from ``start``, all-gathered in turn
    (lazy: the eager callers write each into place and evaluate it before asking for the next; :func:`gather_lazy`
    concatenates them all)."""
    for i in range(0, part.size, piece):
        yield i, mx.distributed.all_gather(part[i:i + piece], group=group, stream=stream).reshape(group.size(), -1)


def gather_bucket(shard: mx.array, group: mx.distributed.Group, stream: Any) -> mx.array:
    """:func:`all_gather` of an evaluated bucket shard for the FSDP step, evaluated.

    Where the launch set :data:`RING_PIECE_ENV` (a host whose ranks, two polling socket threads each, outnumber
    its cores) and the shard is :data:`RING_SPLIT_BYTES` or more, it is gathered in pieces under that, one socket
    thread polling per rank, each piece evaluated and its rows written into place in the result (MLX updates a
    buffer it alone holds in place: a 2 MiB shard's gather rose 5.0 MiB above the live arrays, 4.0 in one call;
    left lazy and concatenated, the pieces held the whole model's backward once). On 2 cores with 2 ring ranks a
    512 KiB all_gather took 0.13-0.2 ms, or 3.8-4.0 ms (a whole scheduler tick) for runs of 25 and more calls in
    a row, while a 256 KiB one took 0.06-0.3 ms every time (300 calls, 3 launches each, measured).
    """
    n, c, piece = group.size(), shard.size, _pieces(shard)
    if n == 1 or not piece:
        out = all_gather(shard, group, stream)
        mx.eval(out)
        return out
    out = mx.zeros((n * c,), dtype=shard.dtype)
    for i, got in _gathered_pieces(shard, piece, group, stream):
        for k in range(n):
            out[k * c + i:k * c + i + got.shape[1]] = got[k]
        mx.eval(out)
    return out


def reduce_scatter_bucket(matrix: mx.array, group: mx.distributed.Group, transport: str, stream: Any) -> mx.array:
    """:func:`reduce_scatter` of an evaluated ``(N, c)`` bucket matrix for the FSDP step, evaluated.

    At two ranks on the ring the exchange of the other rank's row is in pieces where :func:`gather_bucket`
    gathers in pieces: each piece summed as it arrives, written into place and evaluated (less memory than one
    call, which holds both rows gathered: 6.75 MiB against 10.0 for 2 MiB rows)."""
    r = group.rank()
    theirs = matrix[1 - r] if group.size() == 2 and transport == "ring" else None
    piece = 0 if theirs is None else _pieces(theirs)
    if not piece:
        out = reduce_scatter(matrix, group, transport, stream)
        mx.eval(out)
        return out
    out, mine = mx.zeros(theirs.shape, dtype=theirs.dtype), matrix[r]
    for i, got in _gathered_pieces(theirs, piece, group, stream):
        out[i:i + got.shape[1]] = mine[i:i + got.shape[1]] + got[1 - r]
        mx.eval(out)
    return out


class Collectives:
    """One step's collectives in one chain, counted: ``counts`` by kind, ``bytes_sent`` per rank."""

    def __init__(self, group: mx.distributed.Group, transport: str):
        self.group, self.transport, self.last = group, transport, None
        self.counts, self.bytes_sent = Counter(), Counter()

    def _after(self, x: mx.array) -> mx.array:
        return x if self.last is None else mx.depends(x, self.last)

    def _chain(self, out: mx.array, kind: str | None = None, sent: int = 0) -> mx.array:
        """``out`` as the chain's last link, counted as one ``kind`` sending ``sent`` bytes (a group of one: none).
        The chain holds a token of it: holding the output itself would keep its buffer alive."""
        self.last = out[:1] * 0
        if kind is not None:
            self.counts[kind] += 1
            self.bytes_sent[kind] += sent
        return out

    def all_gather(self, row: mx.array) -> mx.array:
        """``(N * c,)``: every rank's 1-D row, in rank order."""
        n = self.group.size()
        if n == 1:  # a copy in the chain, as a ring's: the profile's ZeRO-3 step on one rank frees as 2 ranks do
            return self._chain(self._after(row) + 0)
        return self._chain(gather_lazy(self._after(row), self.group), "all_gather", (n - 1) * row.nbytes)

    def reduce_scatter(self, row: Callable[[int], mx.array]) -> mx.array:
        """This rank's row of the sum over ranks; ``row(k)`` is the local row k."""
        n = self.group.size()
        if n == 1:
            return self._chain(self._after(row(0)) + 0)
        out = reduce_scatter(lambda k: self._after(row(k)), self.group, self.transport, None)
        return self._chain(out, "reduce_scatter", (2 if self.transport == "all_sum" else 1) * (n - 1) * out.nbytes)

    def take(self) -> dict:
        """Counts and bytes since the last call (then reset, with the chain)."""
        out = {f"num_{k}s": v for k, v in self.counts.items()}
        out.update((f"{k}_bytes_sent", v) for k, v in self.bytes_sent.items())
        self.counts.clear()
        self.bytes_sent.clear()
        self.last = None
        return out


def ring_transport(transport: str, num_ranks: int) -> str | None:
    """How the workbench ring moves a reduce-scatter (as ``fsdp_apply_gradients`` reports it), else ``None``."""
    if transport not in ("ring", "send_recv") or num_ranks < 2:
        return None
    return "all_gather exchange" if num_ranks == 2 and transport == "ring" else "send/recv"
