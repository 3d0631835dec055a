"""Communication estimates: traffic per strategy, nccl-tests bandwidths, alpha-beta fit, compute-bound tokens."""

import numpy as np
import pytest

from workbench import ModelSpec, plan_buckets, plan_shards
from workbench.core.presets import get_preset
from workbench.estimate.comm import (
    DEVICE_PRESETS,
    AlphaBeta,
    DeviceSpec,
    algbw,
    bus_factor,
    busbw,
    estimate_comm,
    fit_alpha_beta,
    ring_steps,
    tokens_per_device_compute_bound,
)


@pytest.fixture
def plan():
    return plan_buckets(get_preset("tiny-llama", "float32"), 2**16)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ddp_bytes_are_twice_fsdp_reduce_scatter(plan, n):
    ddp, fsdp = estimate_comm(plan, "ddp", n), estimate_comm(plan, "fsdp", n)
    assert ddp.rank_bytes == pytest.approx(2 * fsdp.bytes_of("reduce_scatter"))
    assert ddp.rank_bytes == pytest.approx(fsdp.rank_bytes)  # 2 Psi either way (ZeRO paper Sec. 7)
    assert ddp.rank_bytes == pytest.approx(2 * (n - 1) / n * plan.spec.nbytes)
    assert ddp.num_collectives == plan.num_buckets and fsdp.num_collectives == 2 * plan.num_buckets


def test_zero3_moves_3_psi_or_2_psi(plan):
    fsdp = estimate_comm(plan, "fsdp", 8)
    assert estimate_comm(plan, "zero3", 8).rank_bytes == pytest.approx(1.5 * fsdp.rank_bytes)
    assert estimate_comm(plan, "zero3", 8).num_collectives == 3 * plan.num_buckets
    assert estimate_comm(plan, "zero3", 8, reshard_after_forward=False).rank_bytes == pytest.approx(fsdp.rank_bytes)


def test_hsdp_adds_replica_all_reduce_of_the_shard(plan):
    hsdp = estimate_comm(plan, "hsdp", 4, num_replicas=2)
    assert hsdp.bytes_of("all_reduce") == pytest.approx(2 * (2 - 1) / 2 * plan.spec.nbytes / 4)
    with pytest.raises(ValueError, match="num_replicas"):
        estimate_comm(plan, "fsdp", 4, num_replicas=2)


def test_shard_plan_counts_padding_and_greedy_broadcasts():
    spec = ModelSpec.from_shapes({"a": (7,), "b": (5,)})
    flat = plan_shards(plan_buckets(spec, 2**20), 4, "flat")  # 12 elements in 4 chunks of 3: no padding
    assert estimate_comm(flat, "fsdp").bytes_of("all_gather") == pytest.approx(3 / 4 * 12 * 4)
    odd = plan_shards(plan_buckets(ModelSpec.from_shapes({"a": (7,)}), 2**20), 4, "flat")  # 7 -> padded to 8
    assert estimate_comm(odd, "fsdp").bytes_of("reduce_scatter") == pytest.approx(3 / 4 * 8 * 4)
    greedy = plan_shards(plan_buckets(spec, 0), 2, "greedy")
    est = estimate_comm(greedy, "zero1")
    assert est.bytes_of("broadcast") == spec.nbytes and est.num_collectives == 2 + 2
    with pytest.raises(ValueError, match="layout"):
        estimate_comm(greedy, "zero3")
    with pytest.raises(ValueError, match="num_shards"):
        estimate_comm(flat, "fsdp", 2)


def test_bad_input_names_the_knob(plan):
    with pytest.raises(ValueError, match="num_shards"):
        estimate_comm(plan, "ddp")
    with pytest.raises(ValueError, match="num_shards"):
        estimate_comm(plan, "ddp", 0)
    with pytest.raises(ValueError, match="strategy"):
        estimate_comm(plan, "pipeline", 2)
    with pytest.raises(ValueError, match="kind"):
        bus_factor("all_to_all", 4)


def test_nccl_tests_conventions():
    assert bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert bus_factor("all_gather", 8) == bus_factor("reduce_scatter", 8) == pytest.approx(0.875)
    assert algbw(1e9, 0.01) == pytest.approx(1e11)
    assert busbw("all_reduce", 1e9, 0.01, 8) == pytest.approx(1.75e11)
    assert ring_steps("all_reduce", 8) == 14 and ring_steps("all_gather", 8) == 7
    with pytest.raises(ValueError, match="time_s"):
        algbw(1.0, 0.0)


def test_alpha_beta_predict_and_fit_recovers_constants():
    true = AlphaBeta(alpha_s=5e-6, beta_bytes_per_s=4e11)
    sizes = np.logspace(3, 9, 13)
    steps = np.full(13, 14)
    assert true.predict_s(4e11, 2) == pytest.approx(1.0 + 1e-5)
    fit = fit_alpha_beta(sizes, true.predict_s(sizes, steps), steps)
    assert fit.alpha_s == pytest.approx(5e-6, rel=1e-6)
    assert fit.beta_bytes_per_s == pytest.approx(4e11, rel=1e-6)
    rng = np.random.default_rng(0)
    noisy = fit_alpha_beta(sizes, true.predict_s(sizes, 14) * rng.normal(1, 0.01, 13), 14)
    assert noisy.beta_bytes_per_s == pytest.approx(4e11, rel=0.05)
    with pytest.raises(ValueError, match="at least 2"):
        fit_alpha_beta([1e6], [1e-3])
    with pytest.raises(ValueError, match="times_s"):
        fit_alpha_beta([1e6, 2e6], [1e-3])
    with pytest.raises(ValueError, match="beta_bytes_per_s"):
        AlphaBeta(0.0, 0.0)


def test_comm_estimate_time_uses_steps_and_bytes(plan):
    link = AlphaBeta(1e-5, 1e11)
    est = estimate_comm(plan, "ddp", 4)
    assert est.predict_s(link) == pytest.approx(plan.num_buckets * 6 * 1e-5 + est.rank_bytes / 1e11)


def test_compute_bound_tokens_h100_near_2200():
    h100 = DEVICE_PRESETS["h100"]
    assert tokens_per_device_compute_bound(h100) == pytest.approx(2200, rel=0.02)
    assert tokens_per_device_compute_bound(h100.flops_per_s, h100.link_bytes_per_s) == tokens_per_device_compute_bound(h100)
    assert tokens_per_device_compute_bound(h100, num_devices=8) == pytest.approx(7 / 8 * 2198, rel=1e-3)
    assert tokens_per_device_compute_bound(DEVICE_PRESETS["b200"]) == pytest.approx(2500)
    mine = DeviceSpec("my-gpu", 100e12, 50e9)
    assert tokens_per_device_compute_bound(mine, bytes_per_param=4) == pytest.approx(4000)
    with pytest.raises(ValueError, match="link_bytes_per_s"):
        tokens_per_device_compute_bound(1e15, 0.0)
    with pytest.raises(ValueError, match="flops_per_s"):
        DeviceSpec("bad", -1.0, 1e9)
