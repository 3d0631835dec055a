"""What ranks must agree on before a plan is first used, and which field differs when they do not (pure).

Issue 14 found ranks of one FSDP step that differ in ``max_norm``, ``communication_size``, a parameter
or a shape hang, or report success with wrong parameters. Each rank hashes each field of its plan's
fingerprint (parameter paths, shapes and dtypes, layout, ``communication_size``, whether clipping is
on, the group size, ...) to 31 bits; one all-gather of those few integers (the framework's part:
:mod:`workbench.adapters.mlx.agree`) tells every rank which field differs and on which ranks.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

#: Fields exchanged (a fingerprint with more fields compares its first ones).
MAX_FIELDS = 16

#: First integer of every rank's row: a row without it was not a plan (the peer ran another collective).
MARKER = 0x57424B31

#: The environment variable a launch plan gives every rank of one launch, the same random value
#: (:func:`workbench.launch.plan.plan_launch`); its ranks compare it first (the start fingerprint's ``launch``).
LAUNCH_ENV = "WORKBENCH_LAUNCH"
#: What a rank says when a rank of another launch joined its rendezvous: two launches drew a port alike, and a rank
#: of one connected to the other's listener (gRPC's coordinator and MLX's newer sockets set ``SO_REUSEPORT``, so
#: both may listen). A relaunch on fresh ports cures it.
ANOTHER_LAUNCH = "a rank of another launch joined this one"


class RanksDisagree(ValueError):
    """The ranks' plans differ; ``field`` is the first differing field, ``ranks`` those that differ from rank 0."""

    def __init__(self, field: str, ranks: list[int], rank: int, value: Any, *, out_of_step: bool = False):
        if out_of_step:  # a peer ran another collective while this rank compared plans
            message = (f"ranks are out of step: rank {rank} was comparing plans but ranks {ranks} were running "
                       "another collective (a setting such as max_norm or communication_size changed on some ranks "
                       "only after the plan's first step?); every rank must call the step with the same settings.")
        else:
            message = (f"ranks disagree on '{field}' before the first step: ranks {ranks} differ from rank 0 (this is "
                       f"rank {rank}, with {field}={_short(value)}); every rank must build the same plan.")
        super().__init__(message)
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


def fingerprint_row(fingerprint: Mapping[str, Any], group_size: int) -> list[int]:
    """The integers one rank all-gathers: :data:`MARKER`, the group size, the number of fields, then one
    31-bit hash per field, zero-padded to a fixed length (``3 + MAX_FIELDS``), so a rank with other fields
    still gathers as many integers and the exchange itself cannot hang."""
    hashes = field_hashes(fingerprint)[:MAX_FIELDS]
    return [MARKER, int(group_size), len(fingerprint), *hashes, *[0] * (MAX_FIELDS - len(hashes))]


def check_rows(rows: Sequence[Sequence[int]], fingerprint: Mapping[str, Any], rank: int) -> None:
    """Compare every rank's :func:`fingerprint_row` (``rows[r]``), the same way on every rank.

    Raises:
        RanksDisagree: a row lacks the marker (a peer ran another collective: ``out_of_step``), or naming
            the first field that differs and the ranks that differ from rank 0.
    """
    strays = [r for r, row in enumerate(rows) if row[0] != MARKER]
    if strays:
        raise RanksDisagree("the step they are in", strays, rank, "comparing plans", out_of_step=True)
    names = ["group_size", "number of fields", *list(fingerprint)[:MAX_FIELDS]]
    table = [list(row)[1:] for row in rows]
    if names[2:3] == ["launch"]:  # which launch a rank is of, before its group's size (a launch of another size)
        names, table = [names[2], *names[:2], *names[3:]], [[r[2], *r[:2], *r[3:]] for r in table]
    found = first_mismatch(names, table)
    if found is not None:
        name, ranks = found
        raise RanksDisagree(name, ranks, rank, fingerprint.get(name, len(fingerprint)))


def weights_digest(params: Iterable[tuple[str, np.ndarray]]) -> str:
    """sha256 hex digest of ``(path, array)`` pairs (NumPy arrays: each path, shape, dtype and bytes).

    Ranks compare it to show they start from the same weights; it costs one pass over the parameters
    (about a second per GB), once per run.
    """
    digest = hashlib.sha256()
    for path, array in params:
        array = np.ascontiguousarray(array)
        digest.update(f"{path}|{array.shape}|{array.dtype}|".encode())
        digest.update(array.reshape(-1).view(np.uint8))
    return digest.hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 hex digest of a file's bytes, read in chunks (a token file may be larger than memory): the one
    file digest of the workbench (a factory's source, a token file, a vendored asset)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
