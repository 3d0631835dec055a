"""MLX's own ``test_fsdp_peak_memory`` (mlx v0.32.0, ``python/tests/nccl_test_distributed.py``) on the
workbench's step, on real ring processes: FSDP's peak strictly below DDP's, at 2 and 4 ranks, both layouts (one launch
for both). The body runs in tests/programs/mlx_peak_memory.py, as MLX wrote it."""

import pytest

from workbench.launch.plan import plan_launch
from workbench.launch.local_run import run_worker

from programs import rank_env


@pytest.mark.parametrize("n", [2, 4], ids=["2-ranks", "4-ranks"])
def test_fsdp_peak_memory(tmp_path, n):
    ranks = run_worker(plan_launch(n, framework="mlx", backend="ring", env=rank_env()), "programs.mlx_peak_memory", tmp_path,
                       "--layouts", "row,flat", timeout_s=240, workdir=tmp_path / "logs")
    assert [r["size"] for r in ranks] == [n] * n
    for r in ranks:
        assert set(r["fsdp_peak_memory"]) == {"row", "flat"}, r
        assert all(fsdp < r["ddp_peak_memory"] for fsdp in r["fsdp_peak_memory"].values()), r
    print({layout: round(ranks[0]["fsdp_peak_memory"][layout] / ranks[0]["ddp_peak_memory"], 3) for layout in ("row", "flat")})
