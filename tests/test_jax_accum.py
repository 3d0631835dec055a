"""Gradient accumulation in the JAX steps: G micro-batches per step, synced every micro-batch or once.

Single process, 8 emulated CPU devices (``conftest.py``), N=4 unless stated. Every mode of
every strategy must equal the one large-batch step (G=1) on the same global batch; its
collective counts must be those in the lowered program (the micro-batch loop is unrolled,
so a per-micro-batch collective appears G times in the text); and XLA's memory plan of
both modes is measured. One test trains through the real engines (two processes).
"""


import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh

from workbench.adapters.jax.accum import compiled_program_counts, program_counts
from workbench.adapters.jax.fsdp import make_ddp_step, make_fsdp_step
from workbench.adapters.jax.zero3 import make_zero3_step
from workbench.models.jax_mlp import build_problem, mlp_loss
from workbench.strategies import StepShape, get_strategy

from programs.jax_fsdp_check import make_optimizer

N, STEPS, CAP, MAX_NORM = 4, 3, 600, 0.3  # CAP: 3 buckets of the MLP; MAX_NORM: clipping active
STRATEGIES = ("ddp", "fsdp-row", "fsdp-flat", "zero3-reshard", "zero3-keep")


def mesh_1d(n=N):
    return Mesh(np.array(jax.devices()[:n]), ("fsdp",))


def problem():
    params, batch = build_problem(0, 32, (8, 16, 16, 8))  # 32 rows: 8 per device, micro-batches of 4 or 2
    return jax.tree_util.tree_map(jnp.asarray, (params, batch))


def unit_fns():
    return [lambda p, b: jnp.tanh(b[0] @ p["w"] + p["b"]), lambda p, h: jnp.tanh(h @ p["w"] + p["b"]),
            lambda p, h: h @ p["w"] + p["b"]]


def unit_loss(h, batch):
    return jnp.mean((h - batch[1]) ** 2)


_STEPS: dict = {}  # (strategy, G, defer_sync) -> its step on the 1-D mesh, compiled once for every test here


def build(strategy, num_microbatches, defer_sync, mesh=None):
    """(step, params, opt_state, batch) ready to run, params and batch placed as the step takes them (so its
    first call compiles the program every later call runs); ZeRO-3's params are its sharded rows. On the 1-D
    mesh a step is made once per (strategy, G, defer_sync) and shared by the tests: each compiles the program
    once, where the equality test and the program test compiled it again."""
    params, batch = problem()
    key = (strategy, num_microbatches, defer_sync)
    if mesh is not None or key not in _STEPS:
        step = make_step(strategy, num_microbatches, defer_sync, params, mesh or mesh_1d())
        if mesh is not None:
            return place(step, strategy, params, batch)
        _STEPS[key] = step
    return place(_STEPS[key], strategy, params, batch)


def make_step(strategy, num_microbatches, defer_sync, params, mesh):
    opt, kw = make_optimizer("adamw"), dict(num_microbatches=num_microbatches, defer_sync=defer_sync, max_norm=MAX_NORM)
    if strategy == "ddp":
        return make_ddp_step(mlp_loss, params, opt, mesh, **kw)
    if strategy.startswith("fsdp"):
        return make_fsdp_step(mlp_loss, params, opt, mesh, layout=strategy[5:], communication_size=CAP, **kw)
    units = [params["l0"], params["l1"], params["l2"]]
    return make_zero3_step(unit_fns(), unit_loss, units, opt, mesh, reshard_after_forward=strategy == "zero3-reshard",
                           **kw)


def place(step, strategy, params, batch):
    if strategy.startswith("zero3"):
        sharded, state = step.init([params["l0"], params["l1"], params["l2"]])
        return step, sharded, state, jax.device_put(batch, step.batch_sharding)
    p = jax.device_put(params, step.param_sharding)  # DDP too: unplaced, its first call compiled a second program
    return step, p, step.init(p), jax.device_put(batch, step.batch_sharding)


def train(strategy, num_microbatches, defer_sync):
    """Final full params (flat list) and per-step (loss, grad_norm) after STEPS AdamW steps."""
    step, p, state, batch = build(strategy, num_microbatches, defer_sync)
    metrics = []
    for _ in range(STEPS):
        p, state, m = step.step(p, state, batch)
        metrics.append((float(m["loss"]), float(m["grad_norm"])))
        assert m["num_collectives"] == step.num_collectives
    full = step.unshard(p) if strategy.startswith("zero3") else p
    return [np.asarray(a, np.float64) for a in jax.tree_util.tree_leaves(full)], np.array(metrics)


_REFERENCES: dict = {}


def reference(strategy):
    if strategy not in _REFERENCES:
        _REFERENCES[strategy] = train(strategy, 1, True)
    return _REFERENCES[strategy]


@pytest.mark.parametrize("defer_sync", [True, False], ids=["deferred", "per-micro"])
@pytest.mark.parametrize("num_microbatches", [2, 4])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_accumulation_equals_one_large_batch_step(strategy, num_microbatches, defer_sync):
    ref_params, ref_metrics = reference(strategy)
    params, metrics = train(strategy, num_microbatches, defer_sync)
    err = max(float(np.abs(a - e).max()) for a, e in zip(params, ref_params))
    print(f"{strategy} G={num_microbatches} defer_sync={defer_sync}: max |param - large batch| = {err:.1e}")
    for a, e in zip(params, ref_params):
        np.testing.assert_allclose(a, e, rtol=0, atol=1e-5)
    np.testing.assert_allclose(metrics, ref_metrics, rtol=1e-5)  # loss: mean over micro-batches and ranks
    assert (ref_metrics[:, 1] > MAX_NORM).any(), "clipping must be active"
    assert not np.allclose(params[0], np.asarray(jax.tree_util.tree_leaves(problem()[0])[0]))


def test_hsdp_per_micro_batch_sync_equals_one_large_batch_step():
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("replica", "fsdp"))
    params, batch = problem()
    results = {}
    for g, defer in [(1, True), (2, False), (2, True)]:
        step = make_fsdp_step(mlp_loss, params, make_optimizer("adamw"), mesh, dp_axis="replica", communication_size=CAP,
                              max_norm=MAX_NORM, num_microbatches=g, defer_sync=defer)
        p = jax.device_put(params, step.param_sharding)
        state, b = step.init(p), jax.device_put(batch, step.batch_sharding)
        nb = step.plan.buckets.num_buckets
        assert step.collective_counts == {"all_reduce": 1 + nb * step.num_syncs, "reduce_scatter": nb * step.num_syncs,
                                          "all_gather": nb}
        counted = program_counts(step.lower(p, state, b).as_text())
        assert counted == {**step.collective_counts, "all_reduce": step.collective_counts["all_reduce"] + 1}  # + loss
        for _ in range(STEPS):
            p, state, _ = step.step(p, state, b)
        results[g, defer] = jax.tree_util.tree_leaves(p)
    for key in [(2, False), (2, True)]:
        for a, e in zip(results[key], results[1, True]):
            np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=0, atol=1e-5, err_msg=str(key))


def expected_counts(strategy, step, num_microbatches, defer_sync):
    """The model: per step, syncs = G with per-micro-batch sync, else 1; +1 all-reduce for the clipping norm."""
    syncs = 1 if defer_sync else num_microbatches
    if strategy == "ddp":
        return {"all_reduce": syncs * len(step.spec), "reduce_scatter": 0, "all_gather": 0}
    if strategy.startswith("fsdp"):
        nb = step.plan.buckets.num_buckets
        return {"all_reduce": 1, "reduce_scatter": syncs * nb, "all_gather": nb}
    nb = sum(p.buckets.num_buckets for p in step.plans)
    deferred = defer_sync and num_microbatches > 1  # gather once, keep the weights for every micro-batch
    gathers = nb if deferred else num_microbatches * nb * (2 if strategy == "zero3-reshard" else 1)
    return {"all_reduce": 1, "reduce_scatter": syncs * nb, "all_gather": gathers}


def predicted_compiled(strategy, step, num_microbatches, defer_sync, units) -> dict:
    """The collectives the step-time model prices (its strategy record's, as XLA compiles them:
    :meth:`~workbench.strategies.Strategy.compiled_collectives`), by kind. All-reduces are priced as asked: XLA
    compiles them into one op, but its CPU all-reduce runs one collective per operand."""
    if strategy.startswith("zero3"):
        record, n = get_strategy("fsdp-full"), units
        unit_rows = ((1.0, strategy == "zero3-reshard"),) * n
    else:
        record, unit_rows = get_strategy(strategy), None
        n = len(step.spec) if strategy == "ddp" else step.plan.buckets.num_buckets
    shape = StepShape(num_ranks=N, sync_bytes=(1.0,) * n, units=unit_rows, num_microbatches=num_microbatches,
                      defer_sync=defer_sync, reduces_norm=True)
    out = dict.fromkeys(("all_reduce", "reduce_scatter", "all_gather"), 0)
    for c in record.compiled_collectives(shape, "jax"):
        out[c.kind] += c.count
    return out


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_collective_counts_are_those_in_the_lowered_program(strategy):
    """Metric-only reductions (the loss mean: one all-reduce) are in the program but not counted. What XLA keeps is
    what the step-time model prices (:func:`predicted_compiled`)."""
    table = {}
    for g in (1, 2, 4):
        for defer in (True, False):
            step, p, state, batch = build(strategy, g, defer)
            lowered = step.lower(p, state, batch)
            counted = program_counts(lowered.as_text())
            assert step.collective_counts == expected_counts(strategy, step, g, defer), (g, defer)
            assert counted == {**step.collective_counts, "all_reduce": step.collective_counts["all_reduce"] + 1}, (g, defer)
            assert step.num_collectives == sum(step.collective_counts.values())
            table[g, defer] = step.num_collectives
            if g == 4:  # what XLA keeps after its passes (CPU)
                compiled = compiled_program_counts(lowered.compile().as_text())
                print(f"{strategy} G=4 defer_sync={defer}: lowered {counted}, compiled {compiled}")
                # Every micro-batch's gradient is distinct, so no pass may merge its reduce-scatters.
                assert compiled["reduce_scatter"] == counted["reduce_scatter"]
                # All-reduces are combined into one variadic op; ZeRO-3's repeated gathers of the same
                # rows are merged (CSE, once jax.checkpoint's optimization barriers are expanded):
                # on XLA CPU every unit is gathered once per step, whatever the mode.
                assert compiled["all_reduce"] == 1
                units = step.collective_counts["reduce_scatter"] // (1 if defer else g) if strategy.startswith("zero3") else None
                assert compiled["all_gather"] == (units if units is not None else counted["all_gather"]), compiled
                priced = predicted_compiled(strategy, step, g, defer, units)
                assert {k: compiled[k] for k in ("reduce_scatter", "all_gather")} == \
                    {k: priced[k] for k in ("reduce_scatter", "all_gather")}, (g, defer, priced)
    print(strategy, "num_collectives (G, defer_sync):", table)
    for g in (2, 4):  # G times versus once
        if strategy == "ddp":
            assert table[g, False] == g * table[1, True] and table[g, True] == table[1, True]
        assert table[g, False] > table[g, True]
        assert table[1, False] == table[1, True]


def test_xla_memory_plans_of_both_modes_on_a_small_lm():
    """XLA's ``memory_analysis().temp_size_in_bytes`` of the compiled FSDP and ZeRO-3 steps, G=4.

    The model (``workbench.adapters.jax.accum``): deferral keeps an unsharded accumulator (P bytes)
    where per-micro-batch sync keeps 1/N. What XLA's CPU plan of the unrolled loop does: deferral
    costs at most one unsharded gradient over G=1, as the model says; but the G micro-batches are
    independent in the dataflow graph, and XLA interleaves them (each op runs for all G side by side),
    so per-micro-batch sync holds every micro-batch's packed gradient before its reduce-scatter and
    plans *more* temporary memory than deferral. These figures are what train_jax reports as each
    mode's compiled peak.
    """
    from workbench.models.init import LMConfig, init_lm_params, num_params
    from workbench.models.jax_lm import make_loss_fn
    from workbench.ranks.train_jax import lm_units

    cfg = LMConfig(vocab_size=1024, seq_len=8, dim=256, num_layers=1, num_heads=4, mlp_dim=1024)
    grad_bytes = 4 * num_params(cfg)
    params = {k: jnp.asarray(v) for k, v in init_lm_params(cfg, 0).items()}
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (16, cfg.seq_len + 1)), jnp.int32)
    batch, mesh = (tokens[:, :-1], tokens[:, 1:]), mesh_1d()
    fns, loss, paths = lm_units(cfg)
    units = [{k: params[k] for k in ps} for ps in paths]

    def temp_bytes(strategy, g, defer):
        if strategy == "fsdp":
            step = make_fsdp_step(make_loss_fn(cfg), params, optax.adamw(1e-3), mesh, num_microbatches=g, defer_sync=defer)
            p = jax.device_put(params, step.param_sharding)
            state = step.init(p)
        else:
            step = make_zero3_step(fns, loss, units, optax.adamw(1e-3), mesh, num_microbatches=g, defer_sync=defer)
            p, state = step.init(units)
        compiled = step.lower(p, state, jax.device_put(batch, step.batch_sharding)).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    print(f"unsharded gradient: {grad_bytes} B, its 1/N: {grad_bytes // N} B")
    for strategy in ("fsdp", "zero3"):
        one, deferred, per_micro = temp_bytes(strategy, 1, True), temp_bytes(strategy, 4, True), temp_bytes(strategy, 4, False)
        print(f"{strategy} temp bytes: G=1 {one}, G=4 deferred {deferred}, G=4 per-micro {per_micro}")
        assert one <= deferred <= one + grad_bytes, strategy  # the accumulator: at most one unsharded gradient
        assert per_micro - deferred > grad_bytes * (1 - 1 / N), strategy  # XLA's interleaving, not the 1/N accumulator


def test_bad_inputs_are_refused_by_name():
    params, batch = problem()
    mesh, units = mesh_1d(), [params["l0"], params["l1"], params["l2"]]
    makers = {"fsdp": lambda **kw: make_fsdp_step(mlp_loss, params, optax.sgd(0.1), mesh, **kw),
              "ddp": lambda **kw: make_ddp_step(mlp_loss, params, optax.sgd(0.1), mesh, **kw),
              "zero3": lambda **kw: make_zero3_step(unit_fns(), unit_loss, units, optax.sgd(0.1), mesh, **kw)}
    for name, make in makers.items():
        for bad in (0, -1, 2.0, True, "2"):
            with pytest.raises(ValueError, match=r"num_microbatches must be an integer >= 1"):
                make(num_microbatches=bad)
        with pytest.raises(ValueError, match=r"defer_sync must be True or False, got 'yes'"):
            make(defer_sync="yes")
        step = make(num_microbatches=3)  # 32 rows: 8 per rank, not 3 micro-batches
        p, state = (step.init(units) if name == "zero3" else (params, step.init(params)))
        with pytest.raises(ValueError, match=r"Batch leaf \[0\] has shape \(32, 8\): each of the 4 ranks' 8 rows "
                                             r"must split into num_microbatches=3"):
            step.step(p, state, batch)
        with pytest.raises(ValueError, match=r"Batch leaf \[0\] has shape \(30, 8\).*divisible by the 4"):
            step.step(p, state, (batch[0][:30], batch[1][:30]))


def test_two_engines_train_fsdp_with_per_micro_batch_sync_like_one_large_batch(tmp_path, shared_runs, engine_pool):
    """Real ipyparallel engines, two JAX processes over gloo: fsdp-row with G=2 per-micro-batch sync
    counts G reduce-scatters per bucket in every step row and matches the G=1 run's losses. The G=1 run is
    tests/test_train_jax.py's fsdp-row run (the same spec), trained once a session."""
    from workbench.launch.driver import run_training
    from workbench.runs.spec import RunSpec
    from workbench.runs.tables import load_runs

    tiny = dict(vocab_size=32, seq_len=16, dim=32, num_layers=1, num_heads=2, mlp_dim=64)
    specs = {g: RunSpec(framework="jax", strategy="fsdp-row", num_ranks=2, steps=4, global_batch=8, model=tiny,
                        num_microbatches=g, defer_sync=False) for g in (1, 2)}
    outcomes = {1: shared_runs.run(specs[1], tmp_path, pool=engine_pool),  # the G=2 run on the same engines
                2: run_training(specs[2], tmp_path, pool=engine_pool)}
    assert {g: o.status for g, o in outcomes.items()} == {1: "done", 2: "done"}, outcomes
    loaded = load_runs(tmp_path)
    assert loaded.problems == []
    curves = {}
    for g, outcome in outcomes.items():
        rows = loaded.steps[loaded.steps.run_id == outcome.run_id]
        ranks = loaded.runs.set_index("run_id").loc[outcome.run_id, "summary.ranks"]
        collectives = ranks[0]["collectives"]
        nb = collectives["all_gather"]  # one all-gather per bucket
        assert collectives == {"all_reduce": 0, "reduce_scatter": g * nb, "all_gather": nb}, collectives
        assert all(r["collectives"] == collectives and r["num_collectives"] == (g + 1) * nb for r in ranks)
        assert sorted(zip(rows.step, rows["rank"])) == [(s, r) for s in range(4) for r in range(2)]
        assert set(rows.num_collectives) == {(g + 1) * nb}
        curves[g] = rows.groupby("step").loss.mean().to_numpy()
    print("losses G=1:", curves[1], "G=2 per-micro:", curves[2])
    np.testing.assert_allclose(curves[2], curves[1], rtol=0, atol=1e-5)
    assert curves[2][-1] < curves[2][0]
    from workbench.studies.accumulation import accumulation_table

    table = accumulation_table(loaded)  # the JAX peak is the rank's truth, XLA's plan beside it, and it is held
    assert list(table.G) == [1, 2] and (table.peak_source == "VmHWM").all() and (table.plan_mib > 0).all()
    assert list(table.peak_within) == [abs(r - 1) <= 0.10 for r in table.peak_ratio], table.peak_ratio
    assert all((c == "") == w and (w or "XLA's plan" in c or "estimate and XLA's plan" in c)
               for c, w in zip(table.peak_cause, table.peak_within)), list(table.peak_cause)
