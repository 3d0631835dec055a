"""Ranks that disagree fail at once, naming what differs, instead of hanging or silently averaging wrong data.

Issue 14 found ranks of one FSDP step that differ in ``max_norm``, ``communication_size``, a parameter
or a shape hang, or report success with wrong parameters. Before a plan is first used, every rank
hashes each field of its plan's fingerprint (parameter paths, shapes and dtypes, layout,
``communication_size``, whether clipping is on, the group size, ...) to 31 bits, and one
``all_gather`` of those few integers tells every rank which field differs and on which ranks. Once
per run: no cost per step (the exchange's seconds are in each rank's report, ``fingerprint_exchange_s``).
"""

from __future__ import annotations

import hashlib
import time
from typing import Any, Iterable, Mapping, Sequence


class RanksDisagree(ValueError):
    """The ranks' plans differ; ``field`` is the first differing field, ``ranks`` those that differ from rank 0."""

    def __init__(self, field: str, ranks: list[int], rank: int, value: Any):
        super().__init__(f"ranks disagree on '{field}' before the first step: ranks {ranks} differ from rank 0 "
                         f"(this is rank {rank}, with {field}={_short(value)}); every rank must build the same plan.")
        self.field, self.ranks = field, ranks


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def plan_fingerprint(params: Iterable[tuple[str, Any]], *, group_size: int, **settings: Any) -> dict[str, Any]:
    """The fields ranks must agree on, in a fixed order.

    Args:
        params: ``(path, array)`` pairs in flatten order (anything with ``.shape`` and ``.dtype``).
        group_size: Ranks in the group.
        settings: Plan settings (layout, ``communication_size``, clipping on or off, ...); every rank
            must pass the same names.
    """
    params = list(params)
    return {"group_size": group_size, "paths": [p for p, _ in params],
            "shapes": [tuple(int(d) for d in a.shape) for _, a in params],
            "dtypes": [str(a.dtype) for _, a in params], **dict(sorted(settings.items()))}


def field_hashes(fingerprint: Mapping[str, Any]) -> list[int]:
    """One 31-bit hash per field (fits the int32 every backend all-gathers)."""
    return [int(hashlib.sha256(f"{k}={v!r}".encode()).hexdigest()[:8], 16) & 0x7FFFFFFF for k, v in fingerprint.items()]


def first_mismatch(names: Sequence[str], table: Sequence[Sequence[int]]) -> tuple[str, list[int]] | None:
    """The first field whose hash differs between ranks, and the ranks that differ from rank 0 (pure)."""
    for i, name in enumerate(names):
        ranks = [r for r, row in enumerate(table) if row[i] != table[0][i]]
        if ranks:
            return name, ranks
    return None


def check_ranks_agree(group: Any, fingerprint: Mapping[str, Any]) -> float:
    """Exchange ``fingerprint`` over the MLX ``group``; returns the seconds the exchange took.

    Raises:
        RanksDisagree: on every rank, naming the first differing field and the ranks involved.
    """
    import mlx.core as mx

    t0 = time.perf_counter()
    if group.size() == 1:
        return 0.0
    names = list(fingerprint)
    hashes = field_hashes(fingerprint)
    # The group size and the number of fields go first: a rank with other fields still gathers
    # an array of the same length, so the exchange itself cannot hang.
    local = mx.array([group.size(), len(names), *hashes[:16], *[0] * (16 - len(hashes[:16]))], dtype=mx.int32)
    table = mx.distributed.all_gather(local[None], group=group)
    mx.eval(table)
    rows = table.tolist()
    found = first_mismatch(["group_size", "number of fields", *names[:16]], rows)
    if found is not None:
        name, ranks = found
        raise RanksDisagree(name, ranks, group.rank(), fingerprint.get(name, len(names)))
    return time.perf_counter() - t0
