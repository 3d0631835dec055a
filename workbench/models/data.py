"""Token data with a known loss floor: sequences from a fixed random Markov chain.

A first-order Markov chain over ``V`` tokens has an exactly computable entropy
rate ``H = -sum_i pi_i sum_j P_ij log P_ij`` (Cover & Thomas, *Elements of
Information Theory*, 2nd ed., Theorem 4.2.4). It is the smallest mean
next-token cross-entropy any model can reach on this data, so a convergence
plot can draw it as the loss floor.

Above :data:`DENSE_MAX_VOCAB` tokens the chain is sparse (:class:`SparseMarkovChain`), its memory
and build time linear in ``V``: a dense one at ``V = 32768`` took 63 s and 35 GB (152k tokens: 370 GB).

Pure: standard library and NumPy only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: Weight of the uniform distribution mixed into every Dirichlet row, so every
#: transition has positive probability: the chain is then irreducible and
#: aperiodic and its stationary distribution unique.
UNIFORM_FLOOR = 1e-6

#: Largest vocabulary for which the stationary distribution starts from a dense linear solve (O(V^3 / 3));
#: larger chains use power iteration alone (O(V^2) a step).
_MAX_SOLVE_VOCAB = 1024

#: Largest vocabulary built dense (:class:`MarkovChain`). Why 4096: the largest any stored notebook, test or
#: preset trains on (notebook 05's full sweep; VALIDATION_MODEL: 512), so their batches and floors are
#: unchanged; and the dense build (four V x V float64 arrays: 0.54 GB at 4096) grows as V^2 above it.
DENSE_MAX_VOCAB = 4096
#: Successors per token of a sparse chain (:class:`SparseMarkovChain`); its entropy rate is below log 64.
SPARSE_SUCCESSORS = 64
_SPARSE_MAX_ITERATIONS = 5000  # power-iteration steps for a sparse chain's stationary distribution


def _checked_vocab(vocab_size, concentration) -> int:  # the checks both chains and make_markov_chain make
    if int(vocab_size) < 2:
        raise ValueError(f"vocab_size must be at least 2, got {vocab_size!r}.")
    if not concentration > 0:
        raise ValueError(f"concentration must be > 0, got {concentration!r}.")
    return int(vocab_size)


def _checked_rows(name: str, rows, shape: tuple) -> np.ndarray:
    p = np.array(rows, dtype=np.float64)
    if p.shape != shape:
        raise ValueError(f"{name} must have shape {shape} for vocab_size={shape[0]}, got {p.shape}.")
    if not np.all(np.isfinite(p)) or p.min() < 0:
        raise ValueError(f"{name} must hold finite, non-negative probabilities.")
    if (row_err := float(np.abs(p.sum(axis=1) - 1.0).max())) > 1e-9:
        raise ValueError(f"{name} rows must sum to 1 (worst row is off by {row_err:.3g}).")
    return p


def _freeze(chain, v: int, stationary, times_p, **arrays) -> None:
    """Check ``stationary`` (``times_p(pi)`` is ``pi P``); set it, its CDF and ``arrays``, read-only."""
    pi = np.array(stationary, dtype=np.float64)
    if pi.shape != (v,):
        raise ValueError(f"stationary must have shape ({v},), got {pi.shape}.")
    if not np.all(np.isfinite(pi)) or pi.min() < 0:
        raise ValueError("stationary must be finite and non-negative.")
    if abs(pi.sum() - 1.0) > 1e-9:
        raise ValueError(f"stationary must sum to 1, sums to {pi.sum()!r}.")
    if (residual := float(np.abs(times_p(pi) - pi).sum())) > 1e-8:
        raise ValueError(f"stationary is not stationary: |pi P - pi|_1 = {residual:.3g}.")
    pi_cdf = np.append(np.cumsum(pi)[:-1], 1.0)  # the last 1.0: a uniform draw in [0, 1) lands on a token
    for name, value in (*arrays.items(), ("stationary", pi), ("_stationary_cdf", pi_cdf)):
        value.flags.writeable = False
        object.__setattr__(chain, name, value)
    object.__setattr__(chain, "vocab_size", v)


@dataclass(frozen=True, eq=False)
class MarkovChain:
    """A first-order Markov chain over ``vocab_size`` tokens.

    Build one with :func:`make_markov_chain`; the constructor only validates.

    Attributes:
        vocab_size: Number of tokens ``V`` (at least 2).
        seed: Seed of ``numpy.random.default_rng`` that drew the rows.
        concentration: Dirichlet alpha of every row (> 0). Small alpha gives
            peaky rows and a low entropy rate; alpha = 1 is uniform on the simplex.
        transition: ``(V, V)`` float64, row-stochastic: ``transition[i, j]`` is
            ``P(x_{t+1} = j | x_t = i)``. Read-only.
        stationary: ``(V,)`` float64, non-negative, sums to 1, with
            ``stationary @ transition == stationary``. Read-only.

    Raises:
        ValueError: naming the field that is out of range or malformed.
    """

    vocab_size: int
    seed: int
    concentration: float
    transition: np.ndarray = field(repr=False)
    stationary: np.ndarray = field(repr=False)
    _cdf: np.ndarray = field(init=False, repr=False)
    _stationary_cdf: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        v = _checked_vocab(self.vocab_size, self.concentration)
        p = _checked_rows("transition", self.transition, (v, v))
        cdf = np.cumsum(p, axis=1)
        cdf[:, -1] = 1.0  # so a uniform draw in [0, 1) always lands on a token
        _freeze(self, v, self.stationary, lambda pi: pi @ p, transition=p, _cdf=cdf)


def _sparse_step(successors: np.ndarray, probabilities: np.ndarray, pi: np.ndarray, out=None) -> np.ndarray:
    """``pi P`` for a sparse chain, O(V k), no ``V x V`` array (fastest: intp successors, ``out`` a buffer)."""
    weights = np.multiply(pi[:, None], probabilities, out=out).ravel()
    return np.bincount(successors.ravel(), weights=weights, minlength=len(pi))


@dataclass(frozen=True, eq=False)
class SparseMarkovChain:
    """:class:`MarkovChain` with ``k`` successors a token, ``P[i, successors[i, j]] = probabilities[i, j]``:
    ``(V, k)`` int32 and float64 arrays for ``transition``, which raises ``ValueError`` (it is ``V x V``)."""

    vocab_size: int
    seed: int
    concentration: float
    successors: np.ndarray = field(repr=False)
    probabilities: np.ndarray = field(repr=False)
    stationary: np.ndarray = field(repr=False)
    _stationary_cdf: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        v = _checked_vocab(self.vocab_size, self.concentration)
        s = np.asarray(self.successors)
        if s.ndim != 2 or len(s) != v or s.dtype.kind not in "iu" or s.min() < 0 or s.max() >= v:
            raise ValueError(f"successors must be integers in [0, vocab_size={v}) of shape ({v}, k), got {s.dtype} "
                             f"{s.shape} in [{s.min()}, {s.max()}].")
        p = _checked_rows("probabilities", self.probabilities, s.shape)
        _freeze(self, v, self.stationary, lambda pi: _sparse_step(s, p, pi), successors=s.astype(np.int32),
                probabilities=p)

    @property
    def transition(self) -> np.ndarray:  # not built: V x V is what the sparse chain avoids
        raise ValueError(
            f"transition: a sparse chain (vocab_size={(v := self.vocab_size)} > DENSE_MAX_VOCAB={DENSE_MAX_VOCAB}) has "
            f"no dense ({v}, {v}) matrix (it would take {8 * v * v / 1e9:.1f} GB); read successors and probabilities "
            f"(P[i, successors[i, j]] = probabilities[i, j]) or transition_probability(src, dst).")

    def transition_probability(self, src, dst) -> np.ndarray:
        """``P(x_{t+1} = dst | x_t = src)``, elementwise over broadcastable token arrays (0 off the successors)."""
        return np.where(self.successors[src] == np.asarray(dst)[..., None], self.probabilities[src], 0.0).sum(-1)


def _sparse_chain(v: int, k: int, seed: int, concentration: float, rng: np.random.Generator) -> SparseMarkovChain:
    # Offsets from the row's token: 0, 1, then k - 2 in [2, v), uniform, a repeat in a row redrawn till none.
    offsets = np.concatenate([np.zeros((v, 1), np.int64), np.ones((v, 1), np.int64), rng.integers(2, v, (v, k - 2))], 1)
    offsets.sort(axis=1)
    while (repeat := np.pad(offsets[:, 1:] == offsets[:, :-1], ((0, 0), (1, 0)))).any():
        offsets[repeat] = rng.integers(2, v, size=int(repeat.sum()))
        offsets.sort(axis=1)
    offsets += np.arange(v, dtype=np.int64)[:, None]
    successors = np.remainder(offsets, v, out=offsets)  # intp, for bincount's power iteration
    p = (1.0 - UNIFORM_FLOOR) * rng.dirichlet(np.full(k, concentration), size=v) + UNIFORM_FLOOR / k  # every P > 0
    p /= p.sum(axis=1, keepdims=True)
    pi, buffer = np.full(v, 1.0 / v), np.empty_like(p)
    for _ in range(_SPARSE_MAX_ITERATIONS):  # power iteration: O(v k) a step
        nxt = (x := _sparse_step(successors, p, pi, buffer)) / x.sum()
        change, pi = float(np.abs(nxt - pi).sum()), nxt
        if change < 1e-13:
            del buffer  # before the chain's checks copy the arrays: the build's peak
            return SparseMarkovChain(v, seed, concentration, successors, p, pi)
    raise ValueError(
        f"vocab_size={v}, concentration={concentration!r}: the sparse chain's stationary distribution did not "
        f"converge in {_SPARSE_MAX_ITERATIONS} power-iteration steps (last change {change:.3g}): raise concentration.")


def _stationary(p: np.ndarray) -> np.ndarray:
    """Stationary distribution of row-stochastic ``p``: ``pi (P - I) = 0``, one equation replaced by ``sum(pi) = 1``
    (an LU solve: at V = 512, 0.06 CPU-s where eigenvectors took 0.60, on every rank of every run), polished."""
    v, pi = p.shape[0], np.full(p.shape[0], 1.0 / p.shape[0])
    if v <= _MAX_SOLVE_VOCAB:
        system = p.T - np.eye(v)
        system[-1] = 1.0
        pi = np.linalg.solve(system, np.eye(v)[-1])
        pi = pi / pi.sum()
    # Polish (or, for large V, compute) by power iteration; converges because every P_ij > 0.
    for _ in range(10_000):
        nxt = pi @ p
        nxt /= nxt.sum()
        done = np.abs(nxt - pi).sum() < 1e-15
        pi = nxt
        if done:
            break
    pi = np.clip(pi, 0.0, None)
    return pi / pi.sum()


def make_markov_chain(vocab_size: int, *, seed: int = 0,
                      concentration: float = 0.1) -> MarkovChain | SparseMarkovChain:
    """Draw a random Markov chain: each row ``~ Dirichlet(concentration * ones(V))``.

    Every row is mixed with the uniform distribution at weight
    :data:`UNIFORM_FLOOR` (1e-6), so the chain is ergodic.

    Above :data:`DENSE_MAX_VOCAB`, sparse: row ``i`` has ``k = 64`` entries ``~ Dirichlet(concentration *
    ones(k))`` with the floor, on ``i`` (aperiodic), ``(i + 1) mod V`` (the cycle ``i -> i + 1``: irreducible)
    and 62 distinct tokens drawn uniformly; 79 MB at its peak at ``V = 32768`` (dense: 35 GB).

    Args:
        vocab_size: Number of tokens ``V`` (at least 2).
        seed: Seed for ``numpy.random.default_rng``.
        concentration: Dirichlet alpha per row (> 0). Default 0.1 (peaky rows).

    Returns:
        The chain, with its stationary distribution.

    Raises:
        ValueError: if ``vocab_size`` < 2 or ``concentration`` <= 0, or a sparse chain's stationary
            distribution does not converge (concentration too small), naming both.
    """
    v = _checked_vocab(vocab_size, concentration)
    rng = np.random.default_rng(seed)
    if v > DENSE_MAX_VOCAB:
        return _sparse_chain(v, SPARSE_SUCCESSORS, seed, float(concentration), rng)
    rows = rng.dirichlet(np.full(v, float(concentration)), size=v)
    p = (1.0 - UNIFORM_FLOOR) * rows + UNIFORM_FLOOR / v
    p /= p.sum(axis=1, keepdims=True)
    return MarkovChain(v, seed, float(concentration), p, _stationary(p))


def entropy_rate_nats(chain: MarkovChain | SparseMarkovChain) -> float:
    """Entropy rate ``-sum_i pi_i sum_j P_ij log P_ij`` of the chain, in nats per token.

    This is the minimum achievable mean next-token cross-entropy for a model that
    sees the previous token. For a first-order chain, the next token is
    independent of everything before the previous token, so a model with a longer
    context cannot beat it either: it is the loss floor of any language model
    trained on :func:`sample_batch` (in the limit of many tokens).

    Args:
        chain: The Markov chain.

    Returns:
        Entropy rate in nats (divide by ``log 2`` for bits).
    """
    p = chain.probabilities if isinstance(chain, SparseMarkovChain) else chain.transition
    plogp = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    return float(-(chain.stationary * plogp.sum(axis=1)).sum())


def sample_batch(chain: MarkovChain | SparseMarkovChain, step: int, global_batch: int, seq_len: int, *,
                 seed: int = 0) -> np.ndarray:
    """Sample one global batch of token sequences from the chain.

    Deterministic in ``(chain, step, seed)``: the generator is
    ``numpy.random.default_rng([seed, step])``. The first token of every row is
    drawn from the stationary distribution, so every position is in equilibrium.
    Sampling is vectorised over the batch: one inverse-CDF draw per position.

    Args:
        chain: The Markov chain.
        step: Training step (>= 0); each step gets its own batch.
        global_batch: Number of sequences across all ranks (>= 1).
        seq_len: Model context length in tokens (>= 1).
        seed: Data seed (>= 0), independent of ``chain.seed``.

    Returns:
        int32 array of shape ``(global_batch, seq_len + 1)``; inputs are
        ``batch[:, :-1]`` and targets ``batch[:, 1:]``.

    Raises:
        ValueError: naming ``step``, ``global_batch``, ``seq_len`` or ``seed`` when out of range.
    """
    for name, value, lo in (("step", step, 0), ("global_batch", global_batch, 1), ("seq_len", seq_len, 1), ("seed", seed, 0)):
        if int(value) != value or value < lo:
            raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}.")
    rng = np.random.default_rng([int(seed), int(step)])
    uniforms = rng.random((int(seq_len) + 1, int(global_batch)))
    out = np.empty((int(global_batch), int(seq_len) + 1), dtype=np.int32)
    tokens = np.searchsorted(chain._stationary_cdf, uniforms[0], side="right")
    out[:, 0] = tokens
    for t in range(1, int(seq_len) + 1):
        # Inverse CDF per row: the first token whose cumulative probability exceeds u.
        if isinstance(chain, MarkovChain):
            tokens = (chain._cdf[tokens] <= uniforms[t][:, None]).sum(axis=1)
        else:  # the same over the row's successors (the last if rounding leaves u above all), this step's rows
            j = (np.cumsum(chain.probabilities[tokens], axis=1) <= uniforms[t][:, None]).sum(axis=1)
            tokens = chain.successors[tokens, np.minimum(j, chain.successors.shape[1] - 1)]
        out[:, t] = tokens
    return out


def rank_slice(batch: np.ndarray, rank: int, num_ranks: int) -> np.ndarray:
    """The contiguous share of a global batch that one data-parallel rank trains on.

    Rank ``r`` gets rows ``[r * global_batch // num_ranks, (r + 1) * global_batch // num_ranks)``.

    Args:
        batch: Global batch, shape ``(global_batch, ...)``.
        rank: This rank, ``0 <= rank < num_ranks``.
        num_ranks: Number of data-parallel ranks (>= 1).

    Returns:
        A view of ``batch`` with ``global_batch // num_ranks`` rows.

    Raises:
        ValueError: if ``num_ranks`` < 1, ``rank`` is out of range, or
            ``global_batch`` is not divisible by ``num_ranks``.
    """
    if num_ranks < 1:
        raise ValueError(f"num_ranks must be >= 1, got {num_ranks!r}.")
    if not 0 <= rank < num_ranks:
        raise ValueError(f"rank must be in [0, num_ranks={num_ranks}), got {rank!r}.")
    global_batch = batch.shape[0]
    if global_batch % num_ranks:
        raise ValueError(
            f"global_batch={global_batch} is not divisible by num_ranks={num_ranks}; "
            f"each rank needs the same number of sequences."
        )
    per_rank = global_batch // num_ranks
    return batch[rank * per_rank : (rank + 1) * per_rank]
