"""MLX's resident FSDP state (issue 30) in one process: a group of one, where every question but the
collectives' can be answered. The real ranks are in test_resident_mlx."""

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_map, tree_unflatten

import workbench.adapters.mlx.fsdp as fsdp_module
import workbench.adapters.mlx.resident as resident_module
import workbench.adapters.mlx.rows as rows_module
from workbench.adapters.mlx.accum import make_trainer, split_microbatches
from workbench.adapters.mlx.fsdp import apply_gradient_shards, fsdp_apply_gradients, shard_gradients
from workbench.adapters.mlx.resident import ResidentFsdp
from workbench.adapters.mlx.rows import get_plan
from workbench.models.init import LMConfig, init_lm_params
from workbench.models.mlx_lm import MLXLM, lm_loss, load_params
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


# ------------------------------------------------------------------ the training runs' trainer (make_trainer)

SMALL = LMConfig(vocab_size=32, seq_len=8, dim=16, num_layers=1, num_heads=2, mlp_dim=32)


def lm_batch(step):
    tokens = np.random.default_rng(100 + step).integers(0, SMALL.vocab_size, (4, SMALL.seq_len + 1))
    return mx.array(tokens[:, :-1]), mx.array(tokens[:, 1:])


def reference_step(model, opt, batch, g, defer, layout):
    """The stateless FSDP step the trainer ran before issue 30: fsdp_apply_gradients on the G micro-batches'
    mean gradient (deferred), or each micro-batch reduce-scattered and apply_gradient_shards once."""
    value_and_grad, group = nn.value_and_grad(model, lm_loss), mx.distributed.init()
    params = model.trainable_parameters()
    plan, per_micro, acc = get_plan(tree_flatten(params), 512, 1, layout), g > 1 and not defer, None
    for micro in split_microbatches(batch, g):
        _, grads = value_and_grad(model, *micro)
        part = shard_gradients(tree_flatten(grads), plan, group) if per_micro else grads
        acc = part if acc is None else tree_map(mx.add, acc, part)
    if per_micro:
        updated, norm = apply_gradient_shards({k: v / g for k, v in acc.items()}, tree_flatten(params), plan, opt,
                                              group, 1.0)
        model.update(tree_unflatten(updated))
    else:
        acc = tree_map(lambda a: a / g, acc) if g > 1 else acc
        new, norm = fsdp_apply_gradients(acc, params, opt, communication_size=512, max_norm=1.0, layout=layout)
        model.update(new)
    mx.eval(model.parameters(), opt.state)
    return norm


def same_bits(a, b):
    return all(mx.array_equal(x, y).item() for (_, x), (_, y) in zip(tree_flatten(a), tree_flatten(b)))


@pytest.mark.parametrize("strategy, g, defer", [("fsdp-row", 1, True), ("fsdp-flat", 2, True),
                                               ("fsdp-row", 2, False), ("fsdp-flat", 2, False)])
def test_the_runs_trainer_keeps_the_state_resident_and_equals_the_stateless_step(strategy, g, defer, monkeypatch):
    """make_trainer's FSDP (what train_mlx runs) cuts each bucket's parameter row once, at its first step, and
    keeps it (and the optimizer state) for the run: bit for bit the stateless fsdp_apply_gradients step, for G=1
    and G=2 both modes. A model changed from outside is cut again, not stepped on stale shards."""
    cut = []
    original = rows_module.bucket_row
    for module in (resident_module, fsdp_module):  # the resident state's cut and the stateless step's
        monkeypatch.setattr(module, "bucket_row", lambda *a: cut.append(a[3]) or original(*a))
    layout = strategy.split("-")[1]
    model, ref = (load_params(MLXLM(SMALL), init_lm_params(SMALL, seed=3)) for _ in range(2))
    trainer = make_trainer(model, optim.AdamW(1e-2), strategy=strategy, num_microbatches=g, defer_sync=defer,
                           communication_size=512, max_norm=1.0)
    ref_opt, cuts = optim.AdamW(1e-2), []
    num_buckets = get_plan(tree_flatten(model.trainable_parameters()), 512, 1, layout).buckets.num_buckets
    for step in range(4):
        if step == 3:  # changed from outside: the next step cuts the rows of the model's new arrays
            halved = tree_map(lambda a: a * 0.5, ref.parameters())
            model.update(halved), ref.update(tree_map(lambda a: a * 1, halved))
        _, norm = trainer.step(lm_loss, *lm_batch(step))
        cuts.append(list(cut)), cut.clear()
        assert norm.item() == reference_step(ref, ref_opt, lm_batch(step), g, defer, layout).item()
        assert same_bits(model.parameters(), ref.parameters()), step
        cut.clear()
    assert num_buckets >= 2 and cuts == [list(range(num_buckets)), [], [], list(range(num_buckets))]
    assert sorted(trainer.optimizer.state) == sorted(ref_opt.state)  # one state per bucket, the same keys


def test_a_group_of_one_reads_its_parameters_from_the_master_shards():
    """At rest between steps the trainer holds the parameters and the AdamW state, and at N = 1 nothing more: the
    gathered bucket is the master shard itself and the parameters are views of it, as the memory model's rows
    say (the master shard is counted from N = 2 on, where the 2-rank runs of tests/test_validation.py hold it)."""
    import gc

    from workbench.adapters.mlx.base import spec_from_mlx
    from workbench.estimate.memory import estimate_memory
    from workbench.strategies import get_strategy

    cfg = LMConfig(vocab_size=256, seq_len=16, dim=128, num_layers=2, num_heads=4, mlp_dim=512)
    for layout in ("row", "flat"):
        gc.collect()
        before = mx.get_active_memory()
        model = load_params(MLXLM(cfg), init_lm_params(cfg, seed=3))
        trainer = make_trainer(model, optim.AdamW(1e-3), strategy=f"fsdp-{layout}", communication_size=2**18,
                               max_norm=1.0)
        for step in range(2):
            tokens = np.random.default_rng(step).integers(0, cfg.vocab_size, (2, cfg.seq_len + 1))
            trainer.step(lm_loss, mx.array(tokens[:, :-1]), mx.array(tokens[:, 1:]))
        del tokens
        gc.collect()
        rest = mx.get_active_memory() - before
        copies = get_strategy(f"fsdp-{layout}").implementation("mlx").update_copies
        knobs = dict(param_dtype="float32", master_dtype=None, optimizer="adamw", update_copies=copies)
        one, two = (estimate_memory(spec_from_mlx(model.parameters()), f"fsdp-{layout}", n, **knobs) for n in (1, 2))
        assert one["master_weights"] == 0 and two["master_weights"] == two["parameters"] // 2 > 2**19
        assert rest == pytest.approx(one["parameters"] + one["optimizer_state"], rel=0.02), layout
        del model, trainer
