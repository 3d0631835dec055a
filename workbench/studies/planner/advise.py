"""The plan advisor (issue 27): for a model, N ranks (or a hosts file) and a memory budget per rank, the plan
that fits and is fastest.

:func:`advise_plan` measures the model once (its profile, cached beside the runs:
:func:`workbench.launch.profile.profile_model`), reads the placement's links from its stored collective
benchmark (or runs one, and says so), lists every runnable plan
(:func:`~workbench.studies.planner.candidates.enumerate_candidates`), prices each with the memory and
step-time models (:func:`workbench.runs.estimate.predict_run_step_time`), and ranks them
(:func:`~workbench.studies.planner.rank.rank_candidates`). Nothing is run that the models rule out:
:func:`workbench.studies.planner.validate.validate_plan` runs the pick, the runner-up and DDP.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from workbench.core.checks import as_whole
from workbench.core.specs import ModelSpec
from workbench.core.units import MiB, format_bytes
from workbench.launch.benchmark import SMALL_SIZES, run_collective_benchmark
from workbench.launch.hosts import busiest_host_ranks, place_ranks, replica_groups
from workbench.launch.profile import profile_model
from workbench.launch.remote import Placement
from workbench.runs.profile import ModelProfile
from workbench.runs.spec import DEFAULT_MODEL, RunSpec
from workbench.strategies import strategies
from workbench.studies.planner.candidates import Candidate, enumerate_candidates, model_of, price_candidate
from workbench.studies.planner.rank import rank_candidates
from workbench.studies.step_time import fit_links, load_collective_benchmarks, placement_label

#: The share of the budget a pick keeps free: the memory model is held to 10% of measured.
SAFETY_MARGIN = 0.10


@dataclass(frozen=True, kw_only=True)
class PlanAdvice:
    """The ranked plans and the pick.

    Attributes:
        candidates: Every plan, ranked (:func:`~workbench.studies.planner.rank.rank_candidates`).
        recommended: The fastest plan that fits with ``safety_margin``, or None when none does.
        memory_bytes: The budget per rank. safety_margin: The share of it kept free.
        links_source: Where the links came from (the stored benchmark's run id and placement, or given).
        profile: The model's measured profile.
        left_out: ``(plan, why)`` for plans the strategy cannot split the model into.
        notes: What the advisor did not price, and why (HSDP is modelled, not run).
        base: The run as asked. model_spec: Its parameters (what the bucket and shard plans cut).
    """

    candidates: tuple[Candidate, ...]
    recommended: Candidate | None
    memory_bytes: int
    safety_margin: float
    links_source: str
    profile: ModelProfile
    left_out: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = ()
    base: RunSpec | None = field(default=None, repr=False)
    model_spec: ModelSpec | None = field(default=None, repr=False)

    @property
    def runner_up(self) -> Candidate | None:
        """The next fitting plan predicted slower than the pick that differs from it in more than its bucket size
        (a plan the models call a tie would prove nothing by its order), else the next fitting plan."""
        pick = self.recommended
        fitting = [c for c in self.candidates if c.fits and c is not pick]
        if pick is None:
            return (fitting or [None])[0]
        key = lambda c: (c.spec.strategy, c.spec.num_microbatches, c.spec.defer_sync)  # noqa: E731
        other = [c for c in fitting if key(c) != key(pick) and c.predicted_step_s > pick.predicted_step_s * 1.001]
        return (other or fitting or [None])[0]

    def to_dict(self) -> dict:
        return {"candidates": [c.to_dict() for c in self.candidates],
                "recommended": None if self.recommended is None else self.recommended.to_dict(),
                "memory_bytes": self.memory_bytes, "safety_margin": self.safety_margin,
                "links_source": self.links_source, "profile_key": self.profile.key,
                "left_out": [list(x) for x in self.left_out], "notes": list(self.notes)}


def base_spec(model: Any, *, num_ranks: int, global_batch: int, seq_len: int | None, framework: str,
              vocab_size: int | None = None, precision: str = "float32", optimizer: str = "adamw",
              steps: int = 10) -> RunSpec:
    """The run as asked, before a plan is chosen: ``model`` is ``"lm"`` (the built-in LM's default size), a dict
    of :class:`~workbench.models.init.LMConfig` fields, or a factory ``"package.module:function"`` (then
    ``vocab_size`` and ``seq_len`` are the tokens it takes).

    Raises:
        ValueError: naming the argument at fault.
    """
    if isinstance(model, str) and model == "lm":
        model = dict(DEFAULT_MODEL)
    common = dict(framework=framework, num_ranks=num_ranks, global_batch=global_batch, precision=precision,
                  optimizer=optimizer, steps=steps)
    if isinstance(model, Mapping):
        fields = dict(model)
        if seq_len is not None:
            fields["seq_len"] = seq_len
        if vocab_size is not None:
            fields["vocab_size"] = vocab_size
        return RunSpec(model=fields, **common)
    if isinstance(model, str) and ":" in model:
        if seq_len is None or vocab_size is None:
            raise ValueError(f"model={model!r}: a factory's run needs seq_len and vocab_size (the tokens its model "
                             "takes; on the command line --seq-len and --vocab-size)")
        return RunSpec(model_factory=model, model={"vocab_size": vocab_size, "seq_len": seq_len}, **common)
    raise ValueError(f"model={model!r}: give 'lm' (the built-in LM), a dict of LMConfig fields, or a factory "
                     "'package.module:function' (a preset or config.json is planned once a factory builds it)")


def benchmark_sizes(model_bytes: int) -> tuple[int, ...]:
    """The benchmark's sizes for a model of ``model_bytes``: 4 KiB by factors of 4 up to the first size that holds
    the model (at least 16 KiB .. 1 MiB, at most the build's 64 MiB): a plan's collectives move no more."""
    sizes = [s for s in SMALL_SIZES if s <= max(model_bytes, MiB)]
    bigger = [s for s in SMALL_SIZES if s > max(model_bytes, MiB)]
    return tuple(sizes + bigger[:1])


def placement_links(runs_root: str | Path, framework: str, num_ranks: int, placement: Placement, *,
                    run_if_missing: bool = True, timeout_s: float = 600.0,
                    sizes_bytes: tuple[int, ...] = SMALL_SIZES) -> tuple[dict, str]:
    """The fitted links of ``placement`` for ``num_ranks`` ranks, and where they came from: the stored collective
    benchmark under ``runs_root`` of that framework, rank count and placement, or one run now over ``sizes_bytes``
    (stored there).

    A benchmark whose times do not grow with size (a loaded machine) is measured again, once or twice, with
    sizes up to 16x larger added, and the links fitted to that new run alone.

    Raises:
        ValueError: no benchmark is stored and ``run_if_missing`` is False (it says what to run); times that still
            do not grow with size (naming the framework and kind).
    """
    label = placement_label(placement.record())
    ran = None  # the run measured here, whose rows alone are fitted
    for attempt in range(3):
        table = load_collective_benchmarks(runs_root)
        table = table[(table.framework == framework) & (table.num_ranks == num_ranks) & (table.placement == label)]
        rows = table if ran is None else table[table.run_id == ran]
        if len(rows):
            try:
                links = fit_links(rows, label)
            except ValueError:
                # times that do not grow with size (load on the cores): measured again up to 16x larger, where
                # bandwidth outweighs the noise (CI once fitted a negative bandwidth to 4 KiB - 1 MiB)
                top = max(int(rows.size_bytes.max()), max(sizes_bytes))
                larger = tuple(s for s in SMALL_SIZES if top < s <= 16 * top)
                if attempt == 2 or not run_if_missing or not larger:
                    raise
                sizes_bytes = (*sizes_bytes, *larger)
            else:
                ids = ", ".join(sorted(set(rows.run_id)))
                how = "stored" if ran is None else "measured now"
                return links, f"{how} collective benchmark {ids} ({framework}, {num_ranks} ranks, {label})"
        elif ran is not None or not run_if_missing:
            break
        ran = run_collective_benchmark(runs_root, framework, num_ranks, sizes_bytes=sizes_bytes, iters=5,
                                       timeout_s=timeout_s, hosts=placement.hosts, launcher=placement.launcher)
    raise ValueError(f"no {framework} collective benchmark of {num_ranks} ranks ({label}) is stored under {runs_root}: "
                     "run workbench.launch.benchmark.run_collective_benchmark for this placement, or give links")


def check_memory(memory_bytes: Any) -> int:
    whole = as_whole(memory_bytes, magnitude=True)
    if whole is None or whole < 1:
        raise ValueError(f"memory_bytes={memory_bytes!r}: a whole number of bytes >= 1 per rank")
    return whole


def advise_plan(model: Any, *, num_ranks: int | None = None, hosts: Any = None, memory_bytes: int,
                global_batch: int, seq_len: int | None = None, framework: str = "mlx", links: Mapping | None = None,
                runs_root: str | Path, vocab_size: int | None = None, precision: str = "float32",
                optimizer: str = "adamw", safety_margin: float = SAFETY_MARGIN, sizes: tuple[int, ...] | None = None,
                launcher: str = "ssh", profile: ModelProfile | None = None, model_shapes: Any = None,
                steps: int = 10, profile_timeout_s: float = 600.0, per_bucket_s: float = 0.0) -> PlanAdvice:
    """The ranked plans of ``model`` on ``num_ranks`` ranks (or the slots of ``hosts``) with ``memory_bytes`` each.

    Args:
        model: ``"lm"``, a dict of LMConfig fields, or a factory ``"package.module:function"`` (:func:`base_spec`).
        num_ranks: N; with ``hosts``, default its slots (the placement gives ranks per host).
        hosts: A hosts file (path or loaded): the runs and the benchmark go there; None: this machine.
        memory_bytes: The budget per rank, bytes.
        global_batch: Sequences per optimizer step, over all ranks.
        seq_len: Tokens per sequence (default the model's).
        framework: ``"mlx"`` or ``"jax"``.
        links: Fitted links (``fit_links``' mapping); default: the placement's stored benchmark, or one run now.
        runs_root: The run store: the profile is cached under it, the benchmark read from (or stored in) it.
        safety_margin: The share of the budget a plan must leave free to fit (>= 0).
        sizes: ``communication_size`` s to try (default the bucket-size advisor's sweep).
        profile, model_shapes: A profile (and a user model's shapes) already at hand, else measured / built.
        per_bucket_s: Seconds each synced bucket costs beyond its collectives (the bucket-size advisor's
            ``per_bucket_s``; 0 prices the buckets by their links' latency only).

    Raises:
        ValueError: a bad argument, naming it.
    """
    memory_bytes = check_memory(memory_bytes)
    if not (isinstance(safety_margin, (int, float)) and 0 <= safety_margin < 10):
        raise ValueError(f"safety_margin={safety_margin!r}: a fraction of the budget >= 0 (0.1 keeps 10% free)")
    placement = Placement.of(hosts, launcher)
    if num_ranks is None:
        if placement.hosts is None:
            raise ValueError("num_ranks: give the number of ranks, or hosts (whose slots give it)")
        num_ranks = placement.hosts.num_slots
    base = base_spec(model, num_ranks=num_ranks, global_batch=global_batch, seq_len=seq_len, framework=framework,
                     vocab_size=vocab_size, precision=precision, optimizer=optimizer, steps=steps)
    if base.model_factory is not None and model_shapes is None:
        from workbench.launch.driver import build_user_model

        model_shapes = build_user_model(base, 300.0)
    shapes = model_of(base, model_shapes)
    # the ranks of the busiest host, as the launch places them (slot order) and sizes their threads; HSDP's replica
    # groups where each host holds an equal share (a shard group per host)
    ranks_at = None if placement.hosts is None else place_ranks(placement.hosts, num_ranks)
    per_host = num_ranks if ranks_at is None else busiest_host_ranks(ranks_at)
    groups = None if ranks_at is None else replica_groups(ranks_at)
    specs, left_out = enumerate_candidates(base, shapes, sizes=sizes, replicas=(groups,) if groups else ())
    if profile is None:
        micro = sorted({s.micro_batch_size for s in specs})
        wanted = tuple(sorted({micro[0], micro[len(micro) // 2], micro[-1]}))
        profile = profile_model(base, runs_root, micro_batch_sizes=wanted if len(wanted) > 1 else None,
                                ranks_per_host=per_host, timeout_s=profile_timeout_s,
                                remote_ranks=placement.hosts is not None)  # a hosts file's are never loopback
    if links is None:
        links, source = placement_links(runs_root, framework, num_ranks, placement,
                                        sizes_bytes=benchmark_sizes(shapes.nbytes))
    else:
        source = "given by the caller"
    from workbench.runs.estimate import predict_run_step_time

    def predict(spec: RunSpec):
        return predict_run_step_time(spec, profile, links, model_shapes=shapes, per_bucket_s=per_bucket_s,
                                     ranks_per_host=per_host)  # across hosts, a host's ranks share its cores

    priced = [price_candidate(s, profile, shapes, memory_bytes=memory_bytes, safety_margin=safety_margin,
                              predict_step=predict) for s in specs]
    ranked = rank_candidates(priced, memory_bytes, safety_margin)
    notes = hybrid_notes(framework, groups, ranks_at, {c.spec.strategy for c in priced})
    pick = ranked[0] if ranked and ranked[0].fits else None
    if pick is None:
        smallest = min(priced, key=lambda c: c.predicted_peak_bytes) if priced else None
        notes.append("no plan fits" + (f": the smallest peak is {format_bytes(smallest.predicted_peak_bytes)} "
                                       f"({smallest.label})" if smallest else ""))
    return PlanAdvice(candidates=tuple(ranked), recommended=pick, memory_bytes=memory_bytes,
                      safety_margin=float(safety_margin), links_source=source, profile=profile,
                      left_out=tuple(left_out), notes=tuple(notes), base=base, model_spec=shapes)


def hybrid_notes(framework: str, groups: int | None, ranks_at: tuple[int, ...] | None, priced: set[str]) -> list[str]:
    """What the advice says of the strategies that shard within a host and replicate across (HSDP): the groups of
    those it priced, and for each other why not (modelled only, not run by ``framework``, or the placement)."""
    notes, why_not = [], {}
    for record in (s for s in strategies() if s.replicas):
        if record.name in priced:
            notes.append(f"{record.name}: {groups} replica groups of {len(ranks_at) // groups} ranks, one per host; its "
                         "collectives within a host and across hosts are priced with this placement's links alike")
            continue
        if not record.frameworks:
            why = "modelled only, no framework runs it"
        elif framework not in record.frameworks:
            why = f"{framework} does not run it"
        elif ranks_at is None or len(set(ranks_at)) < 2:
            why = "one host: nothing to replicate across"
        elif groups is None:
            why = "the hosts do not each hold the same number of ranks, 2 or more"
        else:
            why = "the model does not split over its shard groups"
        why_not.setdefault(why, []).append(record.name)
    notes += [f"{', '.join(names)} (shard within a host, replicate across) not priced: {why}"
              for why, names in why_not.items()]
    return notes
