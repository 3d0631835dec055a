"""Step time predicted from a model's profile, in one process (issue 26): the pure predictor against hand-computed
terms, each term moving the total as it should, and a run's prediction from its strategy record and links."""

import pandas as pd
import pytest

from workbench.estimate.comm import AlphaBeta
from workbench.estimate.step_time import (
    TERMS,
    StepTimePrediction,
    collective_seconds,
    cpu_slowdown,
    off_term,
    predict_step_time,
    rank_update_bytes,
    relative_slowdown,
)
from workbench.runs.estimate import predict_run_step_time, run_model_spec, run_step_shape, step_time_validation
from workbench.runs.profile import profile_from_measurements, profile_key_fields
from workbench.runs.spec import RunSpec
from workbench.runs.store import RunStore
from workbench.runs.tables import load_runs
from workbench.strategies import Collective, get_strategy

#: Links with round numbers: alpha per ring step (s), beta (bytes/s).
LINKS = {"all_reduce": AlphaBeta(1e-3, 1e6), "reduce_scatter": AlphaBeta(2e-3, 2e6), "all_gather": AlphaBeta(3e-3, 4e6)}
LM = dict(vocab_size=64, seq_len=32, dim=64, num_layers=2, num_heads=4, mlp_dim=128)


def test_each_term_is_what_the_hand_computes():
    # 2 all-reduces of 1000 bytes in all over 2 ranks: each rank sends 2 (N-1)/N x 1000 = 1000 bytes in
    # 2 x 2 (N-1) = 4 ring steps: 4 x 1 ms + 1000 B / 1 MB/s = 5 ms.
    collectives = [Collective("all_reduce", 2, 1000.0, 2)]
    p = predict_step_time(compute_s_per_microbatch=0.1, num_microbatches=3, update_s_per_param_byte=1e-9,
                          update_param_bytes=4000, collectives=collectives, links=LINKS, buckets_synced=2,
                          per_bucket_s=0.01)
    assert p.compute_s == pytest.approx(0.3) and p.update_s == pytest.approx(4e-6)
    assert p.comm_s == pytest.approx(5e-3) and p.per_bucket_s == pytest.approx(0.02)
    assert p.total_s == pytest.approx(0.3 + 4e-6 + 5e-3 + 0.02) and p.num_collectives == 2
    d = p.to_dict()
    assert d["total_s"] == pytest.approx(p.total_s) and d["comm_by_kind"] == {"all_reduce": pytest.approx(5e-3)}
    assert [p.term_s(t) for t in TERMS] == [p.compute_s, p.update_s, p.comm_s, p.per_bucket_s, p.overhead_s]
    assert p.overhead_s == 0  # no trainer step measured: no overhead


def test_each_term_moves_the_total_and_only_its_own():
    base = dict(compute_s_per_microbatch=0.1, num_microbatches=1, update_s_per_param_byte=1e-9,
                update_param_bytes=1000, collectives=[Collective("reduce_scatter", 1, 4000.0, 4)], links=LINKS,
                buckets_synced=1, per_bucket_s=0.001)
    p0 = predict_step_time(**base)
    moved = {"compute": dict(num_microbatches=2), "update": dict(update_param_bytes=3000),
             "collectives": dict(collectives=[Collective("reduce_scatter", 2, 8000.0, 4)]),
             "per_bucket": dict(buckets_synced=3)}
    for term, change in moved.items():
        p = predict_step_time(**{**base, **change})
        assert p.term_s(term) > p0.term_s(term) and p.total_s - p0.total_s == pytest.approx(
            p.term_s(term) - p0.term_s(term)), term
        assert all(p.term_s(t) == p0.term_s(t) for t in TERMS if t != term), term
    # reduce-scatter of 4000 bytes over 4 ranks: 3/4 x 4000 = 3000 bytes in 3 steps: 6 ms + 1.5 ms
    assert p0.comm_s == pytest.approx(7.5e-3)


def test_links_are_read_per_framework_and_a_missing_one_is_named():
    fitted = {("mlx", "all_gather"): AlphaBeta(0.0, 1e6), ("jax", "all_gather"): AlphaBeta(0.0, 2e6)}
    c = [Collective("all_gather", 1, 2000.0, 2)]
    assert collective_seconds(c, fitted, "jax") == {"all_gather": pytest.approx(1000 / 2e6)}
    with pytest.raises(ValueError, match="no fitted link for mlx reduce_scatter"):
        collective_seconds([Collective("reduce_scatter", 1, 8.0, 2)], fitted, "mlx")
    with pytest.raises(ValueError, match="links=None"):
        predict_step_time(compute_s_per_microbatch=0.1, num_microbatches=1, update_s_per_param_byte=0.0,
                          update_param_bytes=0, collectives=c)
    for bad in (dict(num_microbatches=0), dict(compute_s_per_microbatch=-1.0), dict(per_bucket_s=float("nan"))):
        kw = dict(compute_s_per_microbatch=0.1, num_microbatches=1, update_s_per_param_byte=0.0, update_param_bytes=0)
        with pytest.raises(ValueError, match=next(iter(bad))):
            predict_step_time(**{**kw, **bad})
    assert rank_update_bytes(10, 4, True) == 3 and rank_update_bytes(10, 4, False) == 10


def profile_of(spec, compute=(0.02, 0.04), update_s=0.004, forward=None, cores=None, step=None, co_runners=1):
    """A profile of ``spec``'s model measured at b = 2 and 4 with 1 thread: ``compute`` (and ``forward``, and the
    trainer's ``step``) seconds, ``update_s`` for the model, on ``cores`` CPUs, by ``co_runners`` processes at once."""
    nbytes = run_model_spec(spec).nbytes
    measured = {"micro_batch_sizes": [2, 4], "activation_samples": [[1000], [2000]],
                "compute_s_samples": [[compute[0]], [compute[1]]], "parameter_bytes": nbytes, "gradient_bytes": nbytes,
                "optimizer_state_bytes": 2 * nbytes, "update_s": update_s, "truth_source": "test",
                "plan_activation_bytes": None, "peak_rss_bytes": 1, "peak_array_bytes": None, "versions": {},
                "forward_s_samples": None if forward is None else [[forward[0]], [forward[1]]], "cores": cores,
                "step_s_samples": None if step is None else list(step), "co_runners": co_runners,
                "step_bare_s_samples": None if step is None else [compute[0]] * len(step),
                "step_update_s_samples": None if step is None else [update_s] * len(step)}
    return profile_from_measurements(measured, profile_key_fields(spec, 1, co_runners), cost_s=1.0)


def test_a_runs_prediction_follows_its_strategy_record():
    ddp = RunSpec(framework="mlx", strategy="ddp", num_ranks=2, global_batch=8, model=LM, communication_size=65536)
    profile = profile_of(ddp)
    nbytes = run_model_spec(ddp).nbytes
    p = predict_run_step_time(ddp, profile, LINKS)
    assert p.compute_s == pytest.approx(0.04)  # b = 8 / 2 = 4 sequences: the profile's 40 ms
    assert p.update_s == pytest.approx(0.004)  # DDP updates the whole model
    buckets = run_step_shape(ddp).sync_bytes
    alone = sum(LINKS["all_reduce"].predict_s(b, 2) for b in buckets)  # each bucket: 2 (N-1) steps, V bytes sent
    assert p.comm_s == pytest.approx(alone)  # DDP's gradients are whole: its norm needs no collective
    assert sum(buckets) == nbytes and p.per_bucket_s == 0
    row = predict_run_step_time(RunSpec(**{**ddp.to_dict(), "strategy": "fsdp-row"}), profile, LINKS,
                                per_bucket_s=0.001)
    assert row.update_s == pytest.approx(0.004 * rank_update_bytes(nbytes, 2, True) / nbytes)  # its half
    assert row.comm_by_kind["all_reduce"] == pytest.approx(2e-3)  # MLX's norm of the shards: 2 (N-1) steps, no bytes
    assert row.per_bucket_s == pytest.approx(0.001 * len(buckets))
    accum = dict(ddp.to_dict(), strategy="fsdp-row", global_batch=16, num_microbatches=2)
    deferred, every = (predict_run_step_time(dict(accum, defer_sync=d), profile, LINKS) for d in (True, False))
    assert deferred.compute_s == pytest.approx(0.08)  # G = 2 micro-batches of 4
    assert every.comm_by_kind["reduce_scatter"] == pytest.approx(2 * deferred.comm_by_kind["reduce_scatter"])
    assert every.comm_by_kind["all_gather"] == pytest.approx(deferred.comm_by_kind["all_gather"])
    full = predict_run_step_time(RunSpec(**{**ddp.to_dict(), "strategy": "fsdp-full"}), profile, LINKS)
    counts = get_strategy("fsdp-full").collective_counts(run_step_shape(RunSpec(**{**ddp.to_dict(),
                                                                                  "strategy": "fsdp-full"})))
    assert full.num_collectives == sum(counts.values()) and full.per_bucket_s == 0
    # JAX's ZeRO-3 as XLA compiles it: each of the LM's units gathered once (8 asked, 4 run: test_jax_accum)
    jax = dict(ddp.to_dict(), framework="jax", strategy="fsdp-full", max_norm=1.0)
    compiled = predict_run_step_time(jax, profile_of(RunSpec(**jax)), {("jax", k): v for k, v in LINKS.items()})
    asked = get_strategy("fsdp-full").collective_counts(run_step_shape(jax))
    assert asked["all_gather"] == 2 * asked["reduce_scatter"] == 8
    assert compiled.num_collectives == asked["reduce_scatter"] * 2 + asked["all_reduce"] == 9


def test_a_profile_of_another_model_is_refused_naming_the_field():
    spec = RunSpec(framework="mlx", num_ranks=2, global_batch=8, model=LM)
    other = RunSpec(framework="mlx", num_ranks=2, global_batch=8, model=dict(LM, seq_len=16))
    with pytest.raises(ValueError, match="seq_len: 16, not 32"):
        predict_run_step_time(spec, profile_of(other), LINKS)
    with pytest.raises(ValueError, match="framework: 'jax', not 'mlx'"):
        predict_run_step_time(spec, profile_of(RunSpec(**{**spec.to_dict(), "framework": "jax"})), LINKS)


def test_the_prediction_is_a_frozen_record():
    p = StepTimePrediction(compute_s=1.0, update_s=0.0, comm_s=0.5, per_bucket_s=0.0)
    with pytest.raises(AttributeError):
        p.compute_s = 2.0
    assert p.total_s == 1.5 and p.to_dict()["comm_by_kind"] == {}


def test_the_forward_is_added_again_where_units_reshard_after_forward():
    spec = dict(RunSpec(framework="mlx", strategy="fsdp-full", num_ranks=2, global_batch=8, model=LM).to_dict())
    profile = profile_of(RunSpec(**spec), forward=(0.005, 0.01))
    resharding = predict_run_step_time(spec, profile, LINKS)
    assert resharding.compute_s == pytest.approx(0.04 + 0.01)  # b = 4: backward 40 ms, its forward again 10 ms
    kept = predict_run_step_time(dict(spec, global_batch=16, num_microbatches=2), profile, LINKS)
    assert kept.compute_s == pytest.approx(2 * 0.04)  # deferred sync keeps the units gathered: nothing recomputed
    row = predict_run_step_time(dict(spec, strategy="fsdp-row"), profile, LINKS)
    assert row.compute_s == pytest.approx(0.04)


def test_ranks_that_share_the_cores_compute_slower_than_the_profile_alone():
    assert cpu_slowdown(4, 1, 2) == 2.0 and cpu_slowdown(2, 1, 2) == 1.0 and cpu_slowdown(4, None, 2) == 1.0
    spec = RunSpec(framework="mlx", strategy="fsdp-row", num_ranks=4, global_batch=16, model=LM)
    profile = profile_of(spec, cores=2)  # measured with 1 thread on a 2-core machine
    four = predict_run_step_time(spec, profile, LINKS)
    assert four.compute_s == pytest.approx(2 * 0.04)  # 4 ranks of 1 thread on 2 cores: each at half speed
    assert predict_run_step_time(spec, profile, LINKS, ranks_per_host=2).compute_s == pytest.approx(0.04)


def test_the_off_term_is_the_side_the_measurement_points_to():
    p = StepTimePrediction(compute_s=0.08, update_s=0.01, comm_s=0.006, per_bucket_s=0.004)  # 100 ms
    assert off_term(p, 0.105) == (None, "within 10%: measured 105.0 ms, predicted 100.0 ms")
    assert off_term(p, 0.2)[0] == "compute"  # no sync measured: the largest term needs the least correction
    wire = StepTimePrediction(compute_s=0.08, update_s=0.004, comm_s=0.012, per_bucket_s=0.004)  # 100 ms
    assert off_term(wire, 0.2, measured_sync_s=0.12)[0] == "collectives"  # after the backward: the extra 100 ms
    # what the ranks time after the backward holds the update too: 10 ms over 20 predicted points to the update
    assert off_term(StepTimePrediction(compute_s=0.08, update_s=0.015, comm_s=0.003, per_bucket_s=0.002), 0.13,
                    measured_sync_s=0.05)[0] == "update"
    term, why = off_term(p, 0.2, measured_sync_s=0.02)
    assert term == "compute" and "the forward and backward 180.0 against 80.0" in why
    assert off_term(StepTimePrediction(compute_s=0.01, update_s=0.05, comm_s=0.0, per_bucket_s=0.0), 0.2)[0] == "update"


def stored_run(root, spec, step_s, sync_s=None, ranks=2, steps=4):
    """A run in a real store, as the driver leaves it: steps of ``step_s`` (``sync_s``) seconds on every rank."""
    handle = RunStore(root).create(spec.to_dict())
    handle.append_steps([{"step": s, "rank": r, "loss": 1.0, "grad_norm": 0.5, "step_time_s": step_s * (3 if s == 0 else 1),
                          "sync_time_s": sync_s} for s in range(steps) for r in range(ranks)])
    handle.finish({"ranks": [{"rank": r} for r in range(ranks)]})


def test_step_time_validation_sets_the_measured_beside_the_predicted_and_names_the_off_term(tmp_path):
    ddp = RunSpec(framework="mlx", strategy="ddp", num_ranks=2, global_batch=8, model=LM, steps=4)
    row = RunSpec(**{**ddp.to_dict(), "strategy": "fsdp-row"})
    profile = profile_of(ddp)
    predicted = {s.strategy: predict_run_step_time(s, profile, LINKS) for s in (ddp, row)}
    stored_run(tmp_path, ddp, predicted["ddp"].total_s * 1.05, sync_s=predicted["ddp"].total_s - predicted["ddp"].compute_s)
    row_p = predicted["fsdp-row"]  # after its backward, its collectives took 50 ms more than the links say
    sync = row_p.comm_s + row_p.per_bucket_s + row_p.update_s + row_p.overhead_s + 0.05
    stored_run(tmp_path, row, predicted["fsdp-row"].total_s + 0.05, sync_s=sync)
    table = step_time_validation(load_runs(tmp_path), profile, LINKS).set_index("strategy")
    assert table.loc["ddp", "measured_ms"] == pytest.approx(predicted["ddp"].total_s * 1.05e3)  # the first step left out
    assert table.loc["ddp", "predicted_ms"] == pytest.approx(predicted["ddp"].total_s * 1e3)
    assert bool(table.loc["ddp", "within"]) and pd.isna(table.loc["ddp", "off_term"])
    assert not table.loc["fsdp-row", "within"] and table.loc["fsdp-row", "off_term"] == "collectives"
    assert table.loc["fsdp-row", "measured_sync_ms"] == pytest.approx(sync * 1e3)
    assert "after the backward (sync, update) measured" in table.loc["fsdp-row", "why"]


def test_the_trainers_step_overhead_is_a_term_of_its_own_once_per_step():
    """The profile times the real trainer's step beside its parts; what the step takes beyond them is predicted
    once per step (not per micro-batch), slowed as compute is, and is named where what follows the backward is off."""
    spec = RunSpec(framework="mlx", strategy="ddp", num_ranks=2, global_batch=8, model=LM)
    # steps of 30 and 31 ms at b = 2, after a bare forward and backward of 20 ms and an update of 4 ms: 6.5 ms
    profile = profile_of(spec, step=(0.030, 0.031))
    assert profile.step_overhead_s == pytest.approx(0.0065)
    p = predict_run_step_time(spec, profile, LINKS)
    assert p.overhead_s == pytest.approx(0.0065) and p.term_s("overhead") == p.overhead_s
    assert p.total_s == pytest.approx(p.compute_s + p.update_s + p.comm_s + p.per_bucket_s + 0.0065)
    accum = predict_run_step_time(dict(spec.to_dict(), global_batch=16, num_microbatches=2), profile, LINKS)
    assert accum.overhead_s == pytest.approx(0.0065) and accum.compute_s == pytest.approx(2 * p.compute_s)
    assert predict_run_step_time(spec, profile_of(spec), LINKS).overhead_s == 0  # a profile that did not time it
    slow = predict_run_step_time(dict(spec.to_dict(), num_ranks=4, global_batch=16), profile_of(spec, cores=2,
                                                                                                step=(0.030, 0.031)), LINKS)
    assert slow.overhead_s == pytest.approx(2 * 0.0065)  # 4 ranks of 1 thread on 2 cores: CPU work at half speed
    big = StepTimePrediction(compute_s=0.01, update_s=0.001, comm_s=0.001, per_bucket_s=0.0, overhead_s=0.02)
    assert off_term(big, 0.1, measured_sync_s=0.09)[0] == "overhead"  # the ranks time it after the backward


def test_a_profile_measured_by_as_many_processes_as_ranks_per_host_holds_their_contention():
    spec = RunSpec(framework="mlx", strategy="fsdp-row", num_ranks=4, global_batch=16, model=LM)
    together = profile_of(spec, cores=2, co_runners=4)  # 4 processes of 1 thread on 2 cores measured it
    assert predict_run_step_time(spec, together, LINKS).compute_s == pytest.approx(0.04)  # as measured
    two = predict_run_step_time(spec, together, LINKS, ranks_per_host=2)
    assert two.compute_s == pytest.approx(0.02)  # 2 ranks on 2 cores: each has a core, twice the profile's speed
    assert relative_slowdown(4, 1, 2, co_runners=2) == 2.0 and relative_slowdown(2, 1, 2, co_runners=2) == 1.0
    assert relative_slowdown(4, None, 2, co_runners=4) == 1.0
    with pytest.raises(ValueError, match="co_runners=0"):
        relative_slowdown(2, 1, 2, co_runners=0)
    with pytest.raises(ValueError, match="slowdown=0"):
        predict_step_time(compute_s_per_microbatch=0.1, num_microbatches=1, update_s_per_param_byte=0.0,
                          update_param_bytes=0, slowdown=0)


def test_links_are_fitted_at_one_rank_count_and_a_mixed_table_is_refused_naming_the_counts():
    """4 ranks on 2 cores fitted alpha 5.0 ms per ring step where 2 ranks fitted 39 us (MLX's ranks poll their
    sockets): one fit over both priced the 4-rank steps 2-19x under their measure (issue 26)."""
    from workbench.studies.step_time import fit_links

    truth = {2: AlphaBeta(40e-6, 2e9), 4: AlphaBeta(5e-3, 1e8)}
    rows = [{"framework": "mlx", "kind": "all_gather", "num_ranks": n, "placement": "loopback",
             "rank_bytes": b, "num_steps": n - 1, "time_s": link.predict_s(b, n - 1)}
            for n, link in truth.items() for b in (2.0**k for k in range(12, 23, 2))]
    table = pd.DataFrame(rows)
    for n, link in truth.items():
        fitted = fit_links(table, num_ranks=n)[("mlx", "all_gather")]
        assert fitted.alpha_s == pytest.approx(link.alpha_s, rel=1e-3)
        assert fitted.beta_bytes_per_s == pytest.approx(link.beta_bytes_per_s, rel=1e-3)
    with pytest.raises(ValueError, match=r"\[2, 4\] ranks.*num_ranks"):
        fit_links(table)


def test_step_time_validation_takes_each_runs_links_from_a_function_of_its_spec(tmp_path):
    ddp = RunSpec(framework="mlx", strategy="ddp", num_ranks=2, global_batch=8, model=LM, steps=4)
    profile = profile_of(ddp)
    stored_run(tmp_path, ddp, predict_run_step_time(ddp, profile, LINKS).total_s)
    slow = {kind: AlphaBeta(10 * link.alpha_s, link.beta_bytes_per_s / 10) for kind, link in LINKS.items()}
    asked = []
    table = step_time_validation(load_runs(tmp_path), profile, lambda s: asked.append(s["num_ranks"]) or slow)
    assert asked == [2]
    assert table.predicted_ms.iloc[0] == pytest.approx(predict_run_step_time(ddp, profile, slow).total_s * 1e3)
    assert table.predicted_ms.iloc[0] > step_time_validation(load_runs(tmp_path), profile, LINKS).predicted_ms.iloc[0]


def test_a_miss_that_the_collectives_calls_mean_explains_is_named_theirs():
    """XLA's gloo all-reduce on 2 cores with 2 ranks took 0.2 ms or, in 24-68% of calls, a scheduler slice of
    about 4 ms: links fitted to each call's median leave the stalled calls out, and a step of 20 of them pays them.
    Without a measured sync, the collectives are named where their mean per call closes half the gap or more."""
    p = StepTimePrediction(compute_s=0.003, update_s=0.0005, comm_s=0.002, per_bucket_s=0.0)  # 5.5 ms
    assert off_term(p, 0.032)[0] == "compute"  # the largest term, with nothing to say otherwise
    term, why = off_term(p, 0.032, comm_at_mean_s=0.028)  # priced at the mean: 31.5 ms
    assert term == "collectives" and "2.0 ms at their calls' median, 28.0 ms at their mean" in why
    assert "which predicts 31.5 ms" in why
    assert off_term(p, 0.032, comm_at_mean_s=0.006)[0] == "compute"  # the mean explains too little of the gap
    assert off_term(p, 0.0056, comm_at_mean_s=0.028)[0] is None  # within: nothing to name
    with pytest.raises(ValueError, match="comm_at_mean_s"):
        off_term(p, 0.032, comm_at_mean_s=-1.0)


def test_links_fit_each_calls_median_or_mean_and_a_validation_names_a_stalled_miss(tmp_path):
    from workbench.studies.step_time import fit_links

    typical, stalled = AlphaBeta(40e-6, 2e9), AlphaBeta(0.05, 2e9)
    rows = [{"framework": "mlx", "kind": kind, "num_ranks": 2, "placement": "loopback", "rank_bytes": b,
             "num_steps": 1, "time_s": typical.predict_s(b), "mean_s": stalled.predict_s(b)}
            for kind in LINKS for b in (2.0**k for k in range(12, 23, 2))]
    table = pd.DataFrame(rows)
    assert fit_links(table)[("mlx", "all_reduce")].alpha_s == pytest.approx(40e-6, rel=1e-3)
    mean = fit_links(table, statistic="mean")
    assert mean[("mlx", "all_reduce")].alpha_s == pytest.approx(0.05, rel=1e-3)
    with pytest.raises(ValueError, match="statistic='p90'"):
        fit_links(table, statistic="p90")
    ddp = RunSpec(framework="mlx", strategy="ddp", num_ranks=2, global_batch=8, model=LM, steps=4)
    profile = profile_of(ddp)
    at_mean = predict_run_step_time(ddp, profile, mean, per_bucket_s=0.0)
    stored_run(tmp_path, ddp, at_mean.total_s)  # the steps paid the stalled calls
    table = step_time_validation(load_runs(tmp_path), profile, fit_links(table), mean_links=lambda s: mean)
    row = table.iloc[0]
    assert row.comm_mean_ms == pytest.approx(at_mean.comm_s * 1e3) and row.comm_mean_ms > row.comm_ms
    assert (row.within, row.off_term) == (False, "collectives") and "at their mean" in row.why
    assert pd.isna(step_time_validation(load_runs(tmp_path), profile, LINKS).comm_mean_ms.iloc[0])
