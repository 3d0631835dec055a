"""The JAX training loop's resident step (issue 30): :class:`workbench.adapters.jax.resident.ResidentStep`.

``workbench.ranks.train_jax`` runs every step through it: FSDP on its bucket buffers
(``FsdpStep.step_buckets``, donated), DDP and ZeRO-3 on their pytree. One process, emulated CPU devices;
the real two-process runs are checked in ``test_resident_train_jax``.
"""

import jax
import numpy as np
import optax
import pytest
from jax.sharding import Mesh

from workbench.adapters.jax.fsdp import make_ddp_step, make_fsdp_step
from workbench.adapters.jax.resident import ResidentStep
from workbench.models.jax_mlp import build_problem, mlp_loss

CAP, STEPS, N = 600, 3, 4
DIMS = (8, 16, 16, 3)  # flat: the last bucket is padded


def leaves(tree):
    return [np.asarray(a) for a in jax.tree_util.tree_leaves(tree)]


@pytest.mark.parametrize("layout,g,defer", [("row", 1, True), ("flat", 2, True), ("flat", 2, False)],
                         ids=["row", "flat-G2-deferred", "flat-G2-per-micro"])
def test_the_loop_runs_fsdp_on_donated_buckets_and_equals_the_pytree_step_and_ddp(layout, g, defer):
    params, batch = build_problem(0, 32, DIMS if layout == "flat" else (8, 16, 16, 8))
    mesh, opt = Mesh(np.array(jax.devices()[:N]), ("fsdp",)), optax.adamw(1e-2, weight_decay=1e-2)
    accum = dict(num_microbatches=g, defer_sync=defer, max_norm=0.3)
    fsdp = make_fsdp_step(mlp_loss, params, opt, mesh, layout=layout, communication_size=CAP, **accum)
    ddp = make_ddp_step(mlp_loss, params, opt, mesh, **accum)
    p, batch = jax.device_put(params, fsdp.param_sharding), jax.device_put(batch, fsdp.batch_sharding)
    run, ref = ResidentStep(fsdp), ResidentStep(ddp)
    assert (run.bucketed, ref.bucketed) == (True, False)
    resident, state = run.enter(p), fsdp.init(p)
    assert [b.shape for b in resident] == [(N * bk.chunk_elems,) for bk in fsdp.packed_buckets]
    assert "all_to_all" in run.lower(resident, state, batch).as_text()
    tree, tree_state = p, fsdp.init(p)
    dp, dp_state = ref.enter(p), ddp.init(p)
    # the same step, bound to its compiled program as train_jax binds it (compiled here, or loaded from rank 0's)
    bound = ResidentStep(make_fsdp_step(mlp_loss, params, opt, mesh, layout=layout, communication_size=CAP, **accum))
    held, held_state = bound.enter(p), bound.step.init(p)
    jitted = bound.step._step_buckets
    bound.bind(bound.lower(held, held_state, batch).compile())
    assert dp is p  # DDP's resident form is its pytree
    for _ in range(STEPS):
        before = resident
        resident, state, m = run(resident, state, batch)
        assert all(b.is_deleted() for b in before)  # donated: XLA wrote the next buffers into them
        previous = held
        held, held_state, mb = bound(held, held_state, batch)
        assert all(b.is_deleted() for b in previous) and mb["num_collectives"] == m["num_collectives"]
        assert [np.asarray(b).tobytes() for b in held] == [np.asarray(b).tobytes() for b in resident]
        tree, tree_state, mt = fsdp.step(tree, tree_state, batch)
        dp, dp_state, md = ref(dp, dp_state, batch)
        assert (float(m["loss"]), float(m["grad_norm"])) == (float(mt["loss"]), float(mt["grad_norm"]))
        np.testing.assert_allclose(float(m["loss"]), float(md["loss"]), rtol=1e-6)
    for a, t, d in zip(leaves(run.params(resident)), leaves(tree), leaves(dp)):
        np.testing.assert_array_equal(a, t)  # bit-identical to the pytree step
        np.testing.assert_allclose(a, d, rtol=1e-5, atol=1e-6)  # and DDP's within test_jax_fsdp's tolerance
    assert not any(b.is_deleted() for b in resident)  # reading the parameters out keeps the buffers
    assert jitted._cache_size() == 0  # the bound step never called (so never compiled again) the jitted one
