"""From ``fsdp_apply_gradients`` to ``fully_shard``: what each of a user's settings becomes.

MLX shipped ``mlx.nn.fsdp_apply_gradients`` (PR #3130; ``dp_group`` for HSDP from #3194) in 0.31.x and
0.32.0; PR #3768 removed it and first shipped in 0.32.1, which has ``mlx.nn.fully_shard`` and
``mlx.nn.utils.clip_grad_norm_sharded`` instead. The workbench keeps its own
:func:`workbench.adapters.mlx.fsdp.fsdp_apply_gradients` (the seed's API, and the only sharded-optimizer
step for MLX's CPU backends). :func:`migration_note` turns the settings a user passed to it into records
saying what ``fully_shard`` does instead and which knobs no longer exist.

Pure: standard library only; given a spec and N it also counts the collectives on both sides.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.core.buckets import plan_buckets
from workbench.core.checks import byte_count
from workbench.core.fully_shard_plan import check_fully_shard, plan_fully_shard
from workbench.core.specs import ModelSpec
from workbench.core.units import MiB, format_bytes

#: Which MLX releases have which FSDP API: ``(first, last)``; ``None``: still there.
MLX_FSDP_APIS = {"fsdp_apply_gradients": ("0.31", "0.32.0"), "fully_shard": ("0.32.1", None),
                 "clip_grad_norm_sharded": ("0.32.1", None)}
#: The settings of ``fsdp_apply_gradients`` (MLX's and the workbench's) a note understands, and their defaults.
SETTINGS = {"fsdp_group": None, "dp_group": None, "communication_size": 32 * MiB, "communication_stream": None,
            "max_norm": None, "layout": "row", "reduce_scatter": "auto"}


@dataclass(frozen=True, kw_only=True)
class MigrationRecord:
    """One setting and its fate.

    Attributes:
        knob: The ``fsdp_apply_gradients`` argument.
        value: What the user passed (``repr``), or the default.
        status: ``"same"`` (another name, same meaning), ``"replaced"`` (another call does it),
            ``"gone"`` (no counterpart) or ``"default"`` (not set and nothing to do).
        instead: What ``fully_shard`` does instead, in one or two sentences.
    """

    knob: str
    value: str
    status: str
    instead: str


@dataclass(frozen=True, kw_only=True)
class MigrationNote:
    """Records in :data:`SETTINGS` order, plus the step as a whole."""

    records: tuple[MigrationRecord, ...]

    @property
    def gone(self) -> list[str]:
        """Knobs the user set that ``fully_shard`` has no counterpart for."""
        return [r.knob for r in self.records if r.status == "gone"]

    @property
    def text(self) -> str:
        """The note as Markdown lines."""
        return "\n".join(f"- `{r.knob}={r.value}` ({r.status}): {r.instead}" for r in self.records)


def _collectives(spec: ModelSpec, n: int, cap: int) -> str:
    buckets = plan_buckets(spec, cap)
    plan = plan_fully_shard(spec, n)
    unit = plan.largest_unit
    return (f" For {spec.name!r} over {n} ranks: {buckets.num_buckets} bucket(s) under {format_bytes(cap)} gave "
            f"{buckets.num_buckets} reduce-scatter(s) and all-gather(s) per step; fully_shard with one unit per block "
            f"gives {len(plan.units)} of each, the largest {unit.name!r} at {format_bytes(unit.gathered_bytes)}.")


def migration_note(settings: dict, *, spec: ModelSpec | None = None, num_shards: int | None = None) -> MigrationNote:
    """What ``fully_shard`` does in place of each of ``settings``.

    Args:
        settings: Keyword arguments a user passed to ``fsdp_apply_gradients`` (keys of :data:`SETTINGS`;
            groups may be given as any non-``None`` stand-in, e.g. ``"dp"``).
        spec: The model, to count collectives on both sides (with ``num_shards``).
        num_shards: N, the FSDP group size.

    Raises:
        ValueError: an unknown setting (naming it and the known ones), or a malformed ``communication_size``.
    """
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise ValueError(f"Unknown fsdp_apply_gradients setting(s) {unknown}; known: {', '.join(SETTINGS)}.")
    s = {**SETTINGS, **settings}
    cap = byte_count("communication_size", s["communication_size"])
    given = set(settings)
    out = []

    def add(knob, status, instead):
        if knob not in given and status != "same":
            status = "default"
        out.append(MigrationRecord(knob=knob, value=repr(s[knob]), status=status, instead=instead))

    add("fsdp_group", "same", "fully_shard(module, group=...) shards over this group (default: the global group).")
    if s["dp_group"] is None:
        add("dp_group", "gone", "No replicas: fully_shard shards over one group.")
    else:
        add("dp_group", "gone", "fully_shard has no replica group (no HSDP). Shard over the FSDP group, then average "
            "the sharded gradients across replicas yourself: nn.average_gradients(grads, group=dp_group), one "
            "all_sum of 1/N of the model per step (the workbench's own fsdp_apply_gradients still takes dp_group).")
    extra = _collectives(spec, num_shards, cap) if spec is not None and num_shards else ""
    add("communication_size", "gone", "No buckets: each wrapped module is one unit, gathered by one all_gather in "
        "forward and reduce-scattered by one sum_scatter in backward. Wrap larger or smaller modules to change "
        "the message size." + extra)
    add("communication_stream", "gone", "Collectives run on the default stream.")
    if s["max_norm"] is None:
        add("max_norm", "gone", "No clipping asked for.")
    else:
        add("max_norm", "replaced", f"grads, norm = mlx.nn.utils.clip_grad_norm_sharded(grads, max_norm={s['max_norm']!r}, "
            "group=group) between value_and_grad and optimizer.update: one all_sum of the squared shard norms. "
            "Wrap the root too: parameters no unit holds keep full, un-averaged gradients on every rank, which "
            "the sharded norm would count N times. It sums squares in the gradients' dtype (the workbench's step "
            "accumulates in float32).")
    refused = ""
    if spec is not None and num_shards:
        num = len(check_fully_shard(spec, num_shards))
        refused = f" Here {num} of {len(spec)} parameters of {spec.name!r} would be refused over {num_shards} ranks."
    if s["layout"] == "row":
        add("layout", "same", "fully_shard stores rows along axis 0 (rank r: rows r*d0/N to (r+1)*d0/N), row r "
            "of reshape(N, -1) when N divides axis 0; it needs axis 0 divisible by N, not only the size." + refused)
    else:
        add("layout", "gone", f"No {s['layout']!r} layout and no padding: a parameter whose axis 0 N does not "
            "divide is refused (workbench.core.fully_shard_plan.check_fully_shard lists them before a run)." + refused)
    if s["reduce_scatter"] in ("auto", "sum_scatter"):
        add("reduce_scatter", "same", "fully_shard always calls mx.distributed.sum_scatter (NCCL, JACCL); on ring "
            "and MPI run the step inside workbench.adapters.mlx.fully_shard.supply_sum_scatter(group).")
    else:
        add("reduce_scatter", "gone", f"No transport choice: fully_shard calls sum_scatter; supply_sum_scatter(group) "
            f"supplies the workbench ring on ring and MPI ({s['reduce_scatter']!r} is not available there).")
    out.append(MigrationRecord(knob="(the step)", value="fsdp_apply_gradients(grads, params, optimizer, ...)",
                               status="replaced", instead=(
        "Wrap each block, then the root, with fully_shard once; each step: loss, grads = nn.value_and_grad(model, "
        "loss_fn)(...); optimizer.update(model, grads). Parameters and optimizer state are this rank's 1/N; the "
        "full weights exist only gathered, from a unit's forward until its backward (fsdp_apply_gradients kept "
        "them whole and returned them updated).")))
    return MigrationNote(records=tuple(out))
