"""Step time predicted from a model's profile, in one process (issue 26): the pure predictor against hand-computed
terms, each term moving the total as it should, and a run's prediction from its strategy record and links."""

import pytest

from workbench.estimate.comm import AlphaBeta
from workbench.estimate.step_time import (
    TERMS,
    StepTimePrediction,
    collective_seconds,
    predict_step_time,
    rank_update_bytes,
)
from workbench.runs.estimate import predict_run_step_time, run_model_spec, run_step_shape
from workbench.runs.profile import profile_from_measurements, profile_key_fields
from workbench.runs.spec import RunSpec
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
    assert [p.term_s(t) for t in TERMS] == [p.compute_s, p.update_s, p.comm_s, p.per_bucket_s]


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


def profile_of(spec, compute=(0.02, 0.04), update_s=0.004):
    """A profile of ``spec``'s model measured at b = 2 and 4: ``compute`` seconds, ``update_s`` for the model."""
    nbytes = run_model_spec(spec).nbytes
    measured = {"micro_batch_sizes": [2, 4], "activation_samples": [[1000], [2000]],
                "compute_s_samples": [[compute[0]], [compute[1]]], "parameter_bytes": nbytes, "gradient_bytes": nbytes,
                "optimizer_state_bytes": 2 * nbytes, "update_s": update_s, "truth_source": "test",
                "plan_activation_bytes": None, "peak_rss_bytes": 1, "peak_array_bytes": None, "versions": {}}
    return profile_from_measurements(measured, profile_key_fields(spec, 1), cost_s=1.0)


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
