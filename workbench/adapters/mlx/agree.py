"""Ranks compare their plans over MLX before a plan is first used: one small ``all_gather``.

:func:`check_ranks_agree` is the exchange (the run's rank job calls it once per run);
:func:`agree_once` is what ``fsdp_apply_gradients`` calls on every step: it exchanges only the
first time it meets a (plan, settings) pair on this rank, so the cost per step after that is one
dictionary lookup. A rank that changes a setting on its own *after* its first step is not caught
(it would exchange while its peers do not): the check is for plans built differently, not for
settings flipped mid-run.
"""

from __future__ import annotations

import time
import weakref
from collections import OrderedDict
from typing import Any, Mapping

import mlx.core as mx

from workbench.core.envvars import ring_piece_bytes
from workbench.core.fingerprint import (
    MARKER,
    MAX_FIELDS,
    RanksDisagree,
    check_rows,
    fingerprint_row,
    plan_fingerprint,
)
from workbench.core.shards import ShardPlan

#: (plan, settings) pairs already checked; bounded, least recently used dropped first.
AGREED_CACHE_SIZE = 256

_AGREED: OrderedDict[tuple, weakref.ref] = OrderedDict()


def check_ranks_agree(group: Any, fingerprint: Mapping[str, Any]) -> float:
    """Exchange ``fingerprint`` over the MLX ``group``; returns the seconds the exchange took.

    Raises:
        RanksDisagree: on every rank, naming the first differing field and the ranks involved.
    """
    t0 = time.perf_counter()
    if group.size() == 1:
        return 0.0
    # A fixed-length row (fingerprint_row): a rank with other fields still gathers as many integers,
    # so the exchange itself cannot hang.
    local = mx.array(fingerprint_row(fingerprint, group.size()), dtype=mx.int32)
    table = mx.distributed.all_gather(local[None], group=group)
    mx.eval(table)
    check_rows(table.reshape(group.size(), -1).tolist(), fingerprint, group.rank())
    return time.perf_counter() - t0


def agree_once(group: Any, plan: ShardPlan, params_flat: list[tuple[str, Any]], **settings: Any) -> float | None:
    """Check that every rank of ``group`` has this plan and these settings, the first time only.

    Returns the exchange's seconds the first time, ``None`` when this (plan, settings) pair was
    already checked on this rank. Keyed by the plan's identity (plans are cached by the planner, so a
    training loop meets the same object every step), held by a weak reference so that a new plan at a
    reused ``id`` is checked again.
    """
    if group.size() == 1:
        return None
    key = (id(plan), group.size(), group.rank(), tuple(sorted(settings.items())))
    ref = _AGREED.get(key)
    if ref is not None and ref() is plan:
        _AGREED.move_to_end(key)
        return None
    seconds = check_ranks_agree(group, plan_fingerprint(params_flat, group_size=group.size(), **settings))
    _AGREED[key] = weakref.ref(plan)
    while len(_AGREED) > AGREED_CACHE_SIZE:
        _AGREED.popitem(last=False)
    return seconds


def agree_on_step(group: Any, plan: ShardPlan, params_flat: list[tuple[str, Any]], *, layout: str,
                  communication_size: int, max_norm: float | None, transport: str, replicas: int = 1) -> float | None:
    """:func:`agree_once` with the settings of an FSDP step (the same keys wherever a step is taken, so a
    trainer that checks before calling ``fsdp_apply_gradients`` is not checked twice), and the size of the pieces
    its buckets are gathered in (:func:`~workbench.core.envvars.ring_piece_bytes`)."""
    return agree_once(group, plan, params_flat, layout=layout, communication_size=int(communication_size),
                      clipping=max_norm is not None, reduce_scatter=transport, replicas=int(replicas),
                      gather_piece=ring_piece_bytes())  # ranks gathering in pieces of other sizes would never meet


def forget_agreements() -> None:
    """Forget which plans were checked (the next step of each checks again)."""
    _AGREED.clear()


__all__ = ["MARKER", "MAX_FIELDS", "RanksDisagree", "agree_on_step", "agree_once", "check_ranks_agree", "forget_agreements"]
