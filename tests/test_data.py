"""Markov-chain token data: the chain is a valid chain, its entropy rate is the loss floor, batches are reproducible;
above DENSE_MAX_VOCAB the chain is sparse, linear in the vocabulary, and the dense chains' batches are unchanged."""

import hashlib
import time
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.models import data
from workbench.models.data import (DENSE_MAX_VOCAB, SPARSE_SUCCESSORS, MarkovChain, SparseMarkovChain,
                                   entropy_rate_nats, make_markov_chain, rank_slice, sample_batch)


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


# Digests of sample_batch(chain, step, 8, 64, seed=seed) for steps 0 and 7 (int32, little-endian) and the entropy
# rates, from the dense-only implementation before the sparse chain (commit 1da3040): the vocabularies the notebooks,
# tests and presets train on (64: DEFAULT_MODEL; 256: notebook 07's example file; 512: VALIDATION_MODEL; 4096:
# notebook 05's full-size sweep, the largest) must give the same batches and loss floors. 512 takes the
# linear-solve path (the eigendecomposition path when the digests were taken), 1500 and 4096 power iteration.
DENSE_DIGESTS = [
    (2, 0, 1.0, "0cc8c6a30284470384737099a3e501d771930c3dc86536124ae13cb38659e87a", 0.5360523326769999),
    (16, 3, 0.1, "8746e41e292f20b560801487760bf3f6b78b72c7c8038367386dcddcdc8f9be1", 1.249217389347888),
    (64, 0, 0.1, "e9a06118eb25296d5354f01981188b1c9d6e3e986d263eb593415c8ad830343b", 2.3492197544378337),
    (256, 0, 0.1, "fb871a48e6d58139f908cd2a8ddc2a6f4baac5d389482e5ab7567a0e1ce35f06", 3.6768254131437867),
    (512, 0, 0.1, "3d14b2638ae798cb6ff1a60a53785a4837a4bdb2a836e9bc7459ab6a770bdda0", 4.364385724656785),
    (1500, 1, 0.5, "35ea6428ae2b54a9f73d95cc054fd94dbb6eee0e591fa379c238a90b852d4910", 6.585035975146905),
    (4096, 0, 0.1, "1591ef2fe0702fd0237d000c3a169c8e068c7b45ebe6ee7d4b1fad30197b2f95", 6.439345570443577),
]


@pytest.mark.parametrize("vocab_size, seed, concentration, digest, entropy_rate", DENSE_DIGESTS)
def test_dense_chains_batches_are_unchanged(vocab_size, seed, concentration, digest, entropy_rate):
    assert vocab_size <= DENSE_MAX_VOCAB
    chain = make_markov_chain(vocab_size, seed=seed, concentration=concentration)
    assert isinstance(chain, MarkovChain) and chain.transition.shape == (vocab_size, vocab_size)
    h = hashlib.sha256()
    for step in (0, 7):
        h.update(np.ascontiguousarray(sample_batch(chain, step, 8, 64, seed=seed), dtype="<i4").tobytes())
    assert h.hexdigest() == digest
    assert entropy_rate_nats(chain) == pytest.approx(entropy_rate, rel=1e-12)


def _pi_times_p(chain):
    """pi P by np.add.at over the sparse rows (not the module's bincount)."""
    out = np.zeros(chain.vocab_size)
    np.add.at(out, chain.successors.ravel(), (chain.stationary[:, None] * chain.probabilities).ravel())
    return out


@pytest.fixture(scope="module")
def sparse_32768():
    """The chain at V = 32768 (seed 5), with its build's CPU seconds (not wall: other processes share the
    machine) and tracemalloc peak in MB."""
    tracemalloc.start()
    start = time.process_time()
    chain = make_markov_chain(32768, seed=5, concentration=0.1)
    seconds = time.process_time() - start
    peak_mb = tracemalloc.get_traced_memory()[1] / 1e6
    tracemalloc.stop()
    return chain, seconds, peak_mb


def test_sparse_chain_builds_in_linear_time_and_memory(sparse_32768):
    # The dense chain at this size took 63 s and 35.6 GB of RSS on a 16-core host (its tracemalloc peak grows as 32 V^2
    # bytes: 0.54 GB at 4096, 34 GB at 32768); the sparse one about 1 CPU second and 79 MB.
    chain, seconds, peak_mb = sparse_32768
    assert isinstance(chain, SparseMarkovChain)
    assert seconds < 10, f"{seconds:.1f} CPU s to build the V=32768 chain"
    assert peak_mb < 150, f"{peak_mb:.0f} MB peak to build the V=32768 chain"
    held = chain.successors.nbytes + chain.probabilities.nbytes + chain.stationary.nbytes
    assert held < 30e6


def test_sparse_chain_is_an_irreducible_stochastic_chain(sparse_32768):
    chain = sparse_32768[0]
    v, k = 32768, SPARSE_SUCCESSORS
    s, p, pi = chain.successors, chain.probabilities, chain.stationary
    assert s.shape == p.shape == (v, k) and s.dtype == np.int32 and p.dtype == np.float64
    assert s.min() >= 0 and s.max() < v
    ordered = np.sort(s, axis=1)
    assert np.all(ordered[:, 1:] != ordered[:, :-1]), "a row lists a successor twice"
    rows = np.arange(v)[:, None]
    # The self-loop (aperiodic) and the next token (the cycle 0 -> 1 -> ... -> V-1 -> 0: irreducible), with P > 0.
    assert np.all((s == rows).sum(axis=1) == 1) and np.all((s == (rows + 1) % v).sum(axis=1) == 1)
    assert np.all(chain.transition_probability(np.arange(v), (np.arange(v) + 1) % v) > 0)
    assert np.all(p > 0)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-12)
    assert pi.shape == (v,) and np.all(pi >= 0) and pi.sum() == pytest.approx(1.0, abs=1e-12)
    assert np.abs(_pi_times_p(chain) - pi).sum() < 1e-8
    assert not (s.flags.writeable or p.flags.writeable or pi.flags.writeable)
    h = entropy_rate_nats(chain)
    assert h == pytest.approx(-(pi * (p * np.log(p)).sum(axis=1)).sum(), rel=1e-12)
    assert 0 < h < np.log(k)


def test_sparse_chain_is_deterministic_and_its_batches_in_range(sparse_32768):
    chain = sparse_32768[0]
    again = make_markov_chain(32768, seed=5, concentration=0.1)
    np.testing.assert_array_equal(chain.successors, again.successors)
    np.testing.assert_array_equal(chain.probabilities, again.probabilities)
    np.testing.assert_array_equal(chain.stationary, again.stationary)
    batch = sample_batch(chain, 3, 16, 128, seed=2)
    assert batch.shape == (16, 129) and batch.dtype == np.int32
    assert batch.min() >= 0 and batch.max() < 32768
    np.testing.assert_array_equal(batch, sample_batch(again, 3, 16, 128, seed=2))
    assert not np.array_equal(batch, sample_batch(chain, 4, 16, 128, seed=2))
    assert np.all(chain.transition_probability(batch[:, :-1], batch[:, 1:]) > 0), "a step off the row's successors"
    other = make_markov_chain(32768, seed=6, concentration=0.1)
    assert not np.array_equal(chain.successors, other.successors)


def test_the_threshold_is_inclusive():
    assert isinstance(make_markov_chain(DENSE_MAX_VOCAB + 1, seed=0), SparseMarkovChain)
    # DENSE_MAX_VOCAB itself is dense: test_dense_chains_batches_are_unchanged builds it.
    assert max(case[0] for case in DENSE_DIGESTS) == DENSE_MAX_VOCAB


@pytest.mark.parametrize("concentration", [0.1, 1.0])
def test_sparse_entropy_rate_matches_monte_carlo(concentration):
    chain = make_markov_chain(8192, seed=1, concentration=concentration)
    batch = sample_batch(chain, 0, 64, 4000, seed=5)
    nll = -np.log(chain.transition_probability(batch[:, :-1], batch[:, 1:]))
    assert nll.mean() == pytest.approx(entropy_rate_nats(chain), rel=0.02)


def test_sparse_sampler_matches_the_dense_one_on_the_same_chain():
    # A chain with zeros, once dense and once as sorted successor lists: the inverse CDF over a row's successors picks
    # the token the dense inverse CDF picks (adding the zeros changes no partial sum), so the batches are identical
    # (and test_empirical_transitions_approach_p's check of the dense sampler holds for the sparse one).
    rng = np.random.default_rng(4)
    v, k = 7, 3
    successors = np.sort(np.stack([np.concatenate([[i, (i + 1) % v], rng.choice(
        [j for j in range(v) if j not in (i, (i + 1) % v)], k - 2, replace=False)]) for i in range(v)]), axis=1)
    probabilities = rng.dirichlet(np.full(k, 0.7), size=v)
    dense = np.zeros((v, v))
    dense[np.arange(v)[:, None], successors] = probabilities
    pi = np.full(v, 1.0 / v)
    for _ in range(5000):
        pi = pi @ dense
    pi /= pi.sum()
    a = MarkovChain(v, 0, 0.7, dense, pi)
    b = SparseMarkovChain(v, 0, 0.7, successors, probabilities, pi)
    np.testing.assert_array_equal(sample_batch(a, 2, 32, 200, seed=1), sample_batch(b, 2, 32, 200, seed=1))
    tokens = np.arange(v)
    np.testing.assert_array_equal(b.transition_probability(tokens[:, None], tokens), dense)
    assert entropy_rate_nats(b) == pytest.approx(entropy_rate_nats(a), rel=1e-12)


def test_sparse_errors_name_the_field_and_the_numbers(monkeypatch):
    chain = make_markov_chain(DENSE_MAX_VOCAB + 1, seed=0)
    v = DENSE_MAX_VOCAB + 1
    with pytest.raises(ValueError, match=rf"vocab_size={v} > DENSE_MAX_VOCAB={DENSE_MAX_VOCAB}.*\({v}, {v}\).*0\.1 GB"):
        chain.transition
    s, p, pi = chain.successors, chain.probabilities, chain.stationary
    with pytest.raises(ValueError, match=r"successors must be integers in \[0, vocab_size=4097\).*in \[1, 4097\]"):
        SparseMarkovChain(4097, 0, 0.1, s + 1, p, pi)
    with pytest.raises(ValueError, match=r"successors must be integers .* shape \(4097, k\), got int32 \(4096, 64\)"):
        SparseMarkovChain(4097, 0, 0.1, s[:-1], p[:-1], pi)
    with pytest.raises(ValueError, match=r"probabilities must have shape \(4097, 64\)"):
        SparseMarkovChain(4097, 0, 0.1, s, p[:, :-1], pi)
    with pytest.raises(ValueError, match="probabilities rows must sum to 1"):
        SparseMarkovChain(4097, 0, 0.1, s, p * 1.1, pi)
    with pytest.raises(ValueError, match="stationary is not stationary"):
        SparseMarkovChain(4097, 0, 0.1, s, p, np.full(4097, 1 / 4097))
    monkeypatch.setattr(data, "_SPARSE_MAX_ITERATIONS", 2)
    with pytest.raises(ValueError, match=r"vocab_size=5000, concentration=0\.1: .*not converge in 2 power-iteration"):
        make_markov_chain(5000, seed=0)
