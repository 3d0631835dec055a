"""The bucket-size advisor: its predicted sync time is the alpha-beta sum over the planned buckets, and
it recommends the knee (the smallest size within the tolerance of the least predicted time)."""

import pytest

from workbench.core.specs import ModelSpec, ParamSpec
from workbench.core.units import MiB
from workbench.estimate.advisor import default_sizes, predict_sync_curve, recommend_communication_size
from workbench.estimate.comm import AlphaBeta

# Eight 1 MiB fp32 arrays: at 1 MiB one bucket each, at 4 MiB four per bucket, at 8 MiB one bucket.
SPEC = ModelSpec("eight", tuple(ParamSpec(f"w{i}", (512, 512)) for i in range(8)))
LINK = AlphaBeta(alpha_s=1e-3, beta_bytes_per_s=1e9)
LINKS = {"reduce_scatter": LINK, "all_gather": LINK, "all_reduce": LINK}


@pytest.mark.parametrize("n", [2, 4])
def test_fsdp_sync_is_each_buckets_latency_plus_the_bytes(n):
    curve = predict_sync_curve(SPEC, n, LINKS, sizes=[MiB, 4 * MiB, 8 * MiB])
    assert [p.num_buckets for p in curve] == [8, 2, 1]
    for p in curve:
        # per bucket: a reduce-scatter and an all-gather, N - 1 ring steps each; bytes: V (N-1)/N each
        want = p.num_buckets * 2 * (n - 1) * 1e-3 + 2 * (8 * MiB) * (n - 1) / n / 1e9
        assert p.predicted_sync_s == pytest.approx(want, rel=1e-12)


def test_ddp_prices_one_all_reduce_per_bucket():
    (p,) = predict_sync_curve(SPEC, 2, LINKS, sizes=[4 * MiB], strategy="ddp")
    assert p.predicted_sync_s == pytest.approx(2 * 2 * 1e-3 + 2 * (8 * MiB) * 0.5 / 1e9)


def test_recommends_the_knee_not_the_largest_bucket():
    # 1 ms per ring step, 8.39 ms of bytes: 1 bucket 10.39 ms, 2 buckets 12.39 (+19%), 8 buckets 24.39
    advice = recommend_communication_size(SPEC, 2, LINKS, sizes=[MiB, 4 * MiB, 8 * MiB])
    assert advice.communication_size == 8 * MiB and advice.num_buckets == 1
    loose = recommend_communication_size(SPEC, 2, LINKS, sizes=[MiB, 4 * MiB, 8 * MiB], tolerance=0.2)
    assert loose.communication_size == 4 * MiB  # within 20% of the least: the smaller bucket wins
    free = {k: AlphaBeta(0.0, 1e9) for k in LINKS}  # no latency: every size costs the same bytes
    assert recommend_communication_size(SPEC, 2, free, sizes=[MiB, 8 * MiB]).communication_size == MiB


def test_per_bucket_cost_and_base_time_add_to_the_prediction():
    plain, costly = (predict_sync_curve(SPEC, 2, LINKS, sizes=[MiB], per_bucket_s=c, base_s=0.5)[0]
                     for c in (0.0, 0.01))
    assert costly.predicted_sync_s - plain.predicted_sync_s == pytest.approx(8 * 0.01)
    assert costly.predicted_step_s == pytest.approx(0.5 + costly.predicted_sync_s)


def test_reads_fit_links_keys_and_names_a_missing_link():
    fitted = {("mlx", "reduce_scatter"): LINK, ("mlx", "all_gather"): LINK, ("jax", "all_gather"): AlphaBeta(1.0, 1.0)}
    assert predict_sync_curve(SPEC, 2, fitted, sizes=[MiB]) == predict_sync_curve(SPEC, 2, LINKS, sizes=[MiB])
    with pytest.raises(ValueError, match="jax reduce_scatter"):
        predict_sync_curve(SPEC, 2, fitted, sizes=[MiB], framework="jax")


def test_default_sizes_end_with_one_bucket_and_bad_knobs_are_named():
    sizes = default_sizes(SPEC)
    assert sizes[0] == 256 * 1024 and sizes[-1] == 8 * MiB and all(b == 2 * a for a, b in zip(sizes, sizes[1:]))
    assert recommend_communication_size(SPEC, 2, LINKS).curve[-1].num_buckets == 1
    for kw, match in (({"num_shards": 0}, "num_shards"), ({"strategy": "zero3"}, "strategy"),
                      ({"sizes": [0]}, "sizes"), ({"per_bucket_s": -1.0}, "per_bucket_s")):
        args = {"num_shards": 2, **kw}
        with pytest.raises(ValueError, match=match):
            predict_sync_curve(SPEC, args.pop("num_shards"), LINKS, **args)
    with pytest.raises(ValueError, match="tolerance"):
        recommend_communication_size(SPEC, 2, LINKS, tolerance=-0.1)


def test_a_sweeps_cost_per_bucket_is_fitted_beside_its_constant():
    from workbench.estimate.advisor import fit_bucket_costs

    buckets = [26, 13, 4, 1]
    base, per = fit_bucket_costs(buckets, [0.5 + 0.002 * b for b in buckets])
    assert base == pytest.approx(0.5) and per == pytest.approx(0.002)
    # steps that fall as buckets are added (noise) or one bucket count: no cost per bucket, the median
    assert fit_bucket_costs(buckets, [0.5 - 0.001 * b for b in buckets]) == (pytest.approx(0.4915), 0.0)
    assert fit_bucket_costs([4, 4], [0.3, 0.5]) == (pytest.approx(0.4), 0.0)
    # a line crossing below 0 at no buckets: through the origin instead, never a negative constant
    base, per = fit_bucket_costs([2, 4], [0.001, 0.009])
    assert base == 0.0 and per == pytest.approx((2 * 0.001 + 4 * 0.009) / 20)
    with pytest.raises(ValueError, match="2 bucket counts against 1 residuals"):
        fit_bucket_costs([1, 2], [0.1])
    with pytest.raises(ValueError, match=r"residuals \[0.1, nan\] are not all finite"):
        fit_bucket_costs([1, 2], [0.1, float("nan")])
