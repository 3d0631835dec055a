"""Running many specs in one process, each recorded in a :class:`~workbench.runs.store.RunStore`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from workbench.runs.store import RunHandle, RunStore, run_id_for


@dataclass(frozen=True)
class SweepSummary:
    """What :func:`sweep` did, by run id, in spec order.

    Attributes:
        ran: Runs that ran and ended ``"done"``.
        skipped: Runs already done before the sweep.
        failed: ``(run_id, error)`` of runs that ran and ended ``"failed"``.
    """

    ran: tuple[str, ...]
    skipped: tuple[str, ...]
    failed: tuple[tuple[str, str], ...]


def sweep(store: RunStore, specs: Iterable[Mapping[str, Any]],
          run_fn: Callable[[Mapping[str, Any], RunHandle], Mapping[str, Any] | None],
          meta: Mapping[str, Any] | None = None) -> SweepSummary:
    """Run every spec that is not done yet; a failing run is recorded and the sweep goes on.

    ``run_fn(spec, handle)`` appends steps and may call ``handle.finish`` or
    ``handle.fail`` itself; if it returns with the run still ``"running"``, the run
    is finished with the mapping it returned (or ``{}``) as summary. An exception
    fails the run with ``"{type}: {message}"`` and the exception's ``rank``
    attribute, if any; a ``KeyboardInterrupt`` is recorded the same way, then re-raised.
    """
    ran, skipped, failed = [], [], []
    for spec in specs:
        if store.is_done(spec):
            skipped.append(run_id_for(spec))
            continue
        handle = store.create(spec, meta)
        try:
            summary = run_fn(spec, handle)
        except BaseException as err:
            handle.fail(f"{type(err).__name__}: {err}", getattr(err, "rank", None))
            if not isinstance(err, Exception):
                raise
        else:
            if handle.status == "running":
                handle.finish(summary)
        if handle.status == "done":
            ran.append(handle.run_id)
        else:
            failed.append((handle.run_id, handle.record.get("error") or ""))
    return SweepSummary(tuple(ran), tuple(skipped), tuple(failed))
