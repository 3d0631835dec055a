"""MLX FSDP with its state resident in the bucket's own layout (issue 30) on real ring ranks.

:class:`~workbench.adapters.mlx.resident.ResidentFsdp` keeps each bucket's master shard and its optimizer
state for the run: after 3 fp32 AdamW steps its parameters are bit for bit ``fsdp_apply_gradients``'
(row and flat, with and without clipping, a padded flat bucket), MLX v0.32.0's own algorithm's at two
ranks, and DDP's within test_mlx_fsdp's tolerance.
"""

import numpy as np
import pytest

from workbench.launch.local_run import run_worker
from workbench.launch.plan import plan_launch

from programs import rank_env


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("resident-mlx")
    return run_worker(plan_launch(2, framework="mlx", backend="ring", env=rank_env()), "programs.resident_mlx_check",
                      out, timeout_s=240, workdir=out / "logs")


def test_the_resident_step_is_fsdp_apply_gradients_bit_for_bit_and_equals_ddp(ranks):
    assert [r["results"][i]["resident"]["params"] for r in ranks for i in range(4)] == \
        [ranks[0]["results"][i]["resident"]["params"] for _ in ranks for i in range(4)]  # every rank alike
    for res in ranks[0]["results"]:
        case, got = res["case"], res["resident"]
        assert got["params"] == res["fsdp"]["params"], case  # identical bits
        assert got["norms"] == res["fsdp"]["norms"], case
        if "mlx_v0320" in res:
            assert got["params"] == res["mlx_v0320"]["params"], case
        for path, want in res["ddp"]["params"].items():
            np.testing.assert_allclose(got["params"][path], want, rtol=1e-6, atol=1e-6 * np.abs(want).max())
        # one master shard and one optimizer state per bucket, c elements each (half of the bucket at 2 ranks)
        shards = got["shards"]
        assert {k: v for k, v in got["state_sizes"].items() if k.split(".")[0] in shards} == \
            {f"{b}.{m}": c for b, c in shards.items() for m in ("m", "v")}, case
