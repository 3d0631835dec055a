"""MLX's resident FSDP state (issue 30) in one process: a group of one, where every question but the
collectives' can be answered. The real ranks are in test_resident_mlx."""

import mlx.core as mx
import mlx.optimizers as optim
import pytest
from mlx.utils import tree_flatten, tree_map

import workbench.adapters.mlx.resident as resident_module
import workbench.adapters.mlx.rows as rows_module
from workbench.adapters.mlx.fsdp import fsdp_apply_gradients
from workbench.adapters.mlx.resident import ResidentFsdp
from workbench.models.mlx_mlp import build_params, mlp_loss

DIMS, STEPS = (8, 16, 16, 3), 3


def problem(step):
    key = mx.random.key(step)
    return mx.random.normal((4, DIMS[0]), key=key), mx.random.normal((4, DIMS[-1]), key=mx.random.split(key)[0])


@pytest.mark.parametrize("layout", ["row", "flat"])
def test_the_resident_step_cuts_no_parameter_rows_and_equals_fsdp_apply_gradients(layout, monkeypatch):
    cut = []
    original = rows_module.bucket_row
    monkeypatch.setattr(resident_module, "bucket_row", lambda *a: cut.append(a[3]) or original(*a))
    params = build_params(DIMS, seed=3, dtype=mx.float32)
    ref, opt, ref_opt = params, optim.AdamW(1e-2), optim.AdamW(1e-2)
    res = ResidentFsdp(params, opt, communication_size=256, layout=layout, max_norm=0.5)
    num_buckets = res.plan.buckets.num_buckets
    assert num_buckets >= 2 and cut == list(range(num_buckets))  # each bucket's row cut once, at the start
    for step in range(STEPS):
        x, y = problem(step)
        _, grads = mx.value_and_grad(mlp_loss)(res.parameters(), x, y)
        new, norm = res.step(grads)
        ref, ref_norm = fsdp_apply_gradients(grads, ref, ref_opt, communication_size=256, layout=layout, max_norm=0.5)
        assert norm.item() == ref_norm.item()
    assert cut == list(range(num_buckets))  # and never again: the master shards stay resident
    for (path, a), (_, b) in zip(tree_flatten(new), tree_flatten(ref)):
        assert mx.array_equal(a, b).item(), path
    buckets = sorted(k for k in opt.state if k.isdigit())
    assert buckets == sorted(k for k in ref_opt.state if k.isdigit()) == sorted(res.shards)  # a state per bucket


def test_bad_input_is_refused_naming_it():
    params = build_params(DIMS, seed=3, dtype=mx.float32)
    with pytest.raises(ValueError, match="Unknown layout 'rows'"):
        ResidentFsdp(params, optim.SGD(0.1), layout="rows")
    with pytest.raises(ValueError, match="non-empty parameter tree"):
        ResidentFsdp({}, optim.SGD(0.1))
    res = ResidentFsdp(params, optim.SGD(0.1))
    with pytest.raises(ValueError, match=r"Gradient 'layers.0.weight' has shape \(1,\)"):
        res.step(tree_map(lambda a: mx.zeros((1,)), params))
