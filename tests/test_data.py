"""Markov-chain token data: the chain is a valid chain, its entropy rate is the loss floor, batches are reproducible."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.models.data import MarkovChain, entropy_rate_nats, make_markov_chain, rank_slice, sample_batch


@pytest.mark.parametrize("vocab_size, concentration", [(2, 1.0), (16, 0.1), (64, 0.5), (1500, 0.1)])
def test_chain_is_row_stochastic_and_stationary(vocab_size, concentration):
    chain = make_markov_chain(vocab_size, seed=3, concentration=concentration)
    p, pi = chain.transition, chain.stationary
    assert p.shape == (vocab_size, vocab_size) and p.dtype == np.float64
    assert np.all(p > 0)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-12)
    assert pi.shape == (vocab_size,) and np.all(pi >= 0)
    assert pi.sum() == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(pi @ p, pi, atol=1e-12)
    assert not p.flags.writeable and not pi.flags.writeable


def test_same_seed_same_chain_and_entropy_ordering():
    a, b = make_markov_chain(32, seed=7), make_markov_chain(32, seed=7)
    np.testing.assert_array_equal(a.transition, b.transition)
    assert not np.array_equal(a.transition, make_markov_chain(32, seed=8).transition)
    peaky = entropy_rate_nats(make_markov_chain(32, seed=0, concentration=0.05))
    flat = entropy_rate_nats(make_markov_chain(32, seed=0, concentration=10.0))
    assert 0 < peaky < flat < np.log(32)


def test_entropy_rate_of_a_known_chain():
    # Two states that switch with probability q: H = binary entropy of q.
    q = 0.2
    p = np.array([[1 - q, q], [q, 1 - q]])
    chain = MarkovChain(2, 0, 1.0, p, np.array([0.5, 0.5]))
    assert entropy_rate_nats(chain) == pytest.approx(-(q * np.log(q) + (1 - q) * np.log(1 - q)))


@pytest.mark.parametrize("concentration", [0.1, 1.0])
def test_entropy_rate_matches_monte_carlo(concentration):
    chain = make_markov_chain(32, seed=1, concentration=concentration)
    batch = sample_batch(chain, 0, 64, 4000, seed=5)
    nll = -np.log(chain.transition[batch[:, :-1], batch[:, 1:]])
    assert nll.mean() == pytest.approx(entropy_rate_nats(chain), rel=0.02)


def test_empirical_transitions_approach_p():
    chain = make_markov_chain(8, seed=2, concentration=1.0)
    batch = sample_batch(chain, 0, 64, 5000)
    counts = np.zeros((8, 8))
    np.add.at(counts, (batch[:, :-1].ravel(), batch[:, 1:].ravel()), 1)
    rows = counts.sum(axis=1)
    assert np.all(rows > 1000)
    np.testing.assert_allclose(counts / rows[:, None], chain.transition, atol=0.015)
    # The first tokens follow the stationary distribution.
    first = np.bincount(sample_batch(chain, 1, 20000, 1)[:, 0], minlength=8) / 20000
    np.testing.assert_allclose(first, chain.stationary, atol=0.015)


def test_batch_shape_dtype_and_determinism():
    chain = make_markov_chain(50, seed=0)
    batch = sample_batch(chain, 3, 8, 16, seed=1)
    assert batch.shape == (8, 17) and batch.dtype == np.int32
    assert batch.min() >= 0 and batch.max() < 50
    np.testing.assert_array_equal(batch, sample_batch(chain, 3, 8, 16, seed=1))
    np.testing.assert_array_equal(batch, sample_batch(make_markov_chain(50, seed=0), 3, 8, 16, seed=1))
    assert not np.array_equal(batch, sample_batch(chain, 4, 8, 16, seed=1))
    assert not np.array_equal(batch, sample_batch(chain, 3, 8, 16, seed=2))


def test_sampled_transitions_are_possible_under_a_sparse_chain():
    # Hand-built chain with zeros: the sampler must never take a zero-probability transition.
    p = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.5, 0.0, 0.5]])
    pi = np.array([0.25, 0.25, 0.5])
    chain = MarkovChain(3, 0, 1.0, p, pi)
    batch = sample_batch(chain, 0, 32, 200)
    assert np.all(p[batch[:, :-1], batch[:, 1:]] > 0)


@settings(max_examples=50, deadline=None)
@given(num_ranks=st.integers(1, 8), per_rank=st.integers(1, 5), seq_len=st.integers(1, 6))
def test_rank_slices_tile_the_global_batch(num_ranks, per_rank, seq_len):
    chain = make_markov_chain(10, seed=0)
    batch = sample_batch(chain, 0, num_ranks * per_rank, seq_len)
    slices = [rank_slice(batch, r, num_ranks) for r in range(num_ranks)]
    assert all(s.shape == (per_rank, seq_len + 1) for s in slices)
    np.testing.assert_array_equal(np.concatenate(slices), batch)


def test_errors_name_the_field():
    chain = make_markov_chain(10, seed=0)
    batch = sample_batch(chain, 0, 6, 4)
    with pytest.raises(ValueError, match=r"global_batch=6 .*num_ranks=4"):
        rank_slice(batch, 0, 4)
    with pytest.raises(ValueError, match="rank"):
        rank_slice(batch, 3, 3)
    with pytest.raises(ValueError, match="num_ranks"):
        rank_slice(batch, 0, 0)
    with pytest.raises(ValueError, match="vocab_size"):
        make_markov_chain(1)
    with pytest.raises(ValueError, match="concentration"):
        make_markov_chain(4, concentration=0.0)
    for kwargs, name in [({"step": -1}, "step"), ({"global_batch": 0}, "global_batch"), ({"seq_len": 0}, "seq_len")]:
        args = {"step": 0, "global_batch": 2, "seq_len": 3, **kwargs}
        with pytest.raises(ValueError, match=name):
            sample_batch(chain, **args)
    with pytest.raises(ValueError, match="seed"):
        sample_batch(chain, 0, 2, 3, seed=-1)
    p = np.full((3, 3), 1 / 3)
    with pytest.raises(ValueError, match="transition rows"):
        MarkovChain(3, 0, 1.0, p * 1.1, np.full(3, 1 / 3))
    with pytest.raises(ValueError, match="stationary is not stationary"):
        MarkovChain(3, 0, 1.0, np.array([[0, 1, 0], [0, 0, 1], [1, 0, 0.0]]), np.array([0.5, 0.5, 0.0]))
    with pytest.raises(ValueError, match="stationary must sum to 1"):
        MarkovChain(3, 0, 1.0, p, np.full(3, 0.5))
