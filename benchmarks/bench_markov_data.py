"""Build time and peak memory of the built-in synthetic data (the Markov chain of
:mod:`workbench.models.data`) at large vocabularies, and one batch's sampling time.

Above ``DENSE_MAX_VOCAB`` (4096) the chain is sparse (64 successors a token), so both grow linearly
in ``V``. Before (a dense ``V x V`` chain), ``V = 32768`` took 63 s and 35.6 GB of RSS on a 16-core
H100 host, and a 152k vocabulary would have needed about 370 GB: ``--dense`` builds the dense chain
at every size given (the code before the sparse chain, unchanged), for that comparison where memory
allows (its peak is about 32 V^2 bytes: 2.1 GB at 8192). Memory is the peak that ``tracemalloc``
sees (NumPy's allocations) while building; CPU seconds are this process's (BLAS threads included),
the figure to compare on a shared machine, where wall seconds vary with the load.

    python3 benchmarks/bench_markov_data.py [--dense] [V ...]
"""

from __future__ import annotations

import sys
import time
import tracemalloc

from workbench.models import data
from workbench.models.data import entropy_rate_nats, make_markov_chain, sample_batch


def measure(vocab_size: int, *, global_batch: int = 32, seq_len: int = 1024) -> dict:
    """Seconds (wall and this process's CPU) and peak MB to build the chain (seed 0, concentration 0.1);
    wall seconds for one batch."""
    tracemalloc.start()
    start, cpu = time.perf_counter(), time.process_time()
    chain = make_markov_chain(vocab_size, seed=0, concentration=0.1)
    build_s, build_cpu_s = time.perf_counter() - start, time.process_time() - cpu
    peak_mb = tracemalloc.get_traced_memory()[1] / 1e6
    tracemalloc.stop()
    start = time.perf_counter()
    sample_batch(chain, 0, global_batch, seq_len)
    return dict(vocab_size=vocab_size, kind="dense" if isinstance(chain, data.MarkovChain) else "sparse",
                build_s=build_s, build_cpu_s=build_cpu_s, peak_mb=peak_mb,
                batch_s=time.perf_counter() - start, entropy_rate=entropy_rate_nats(chain))


def main(argv: list[str]) -> None:
    if "--dense" in argv:
        argv = [a for a in argv if a != "--dense"]
        data.DENSE_MAX_VOCAB = sys.maxsize
    sizes = [int(a) for a in argv] or [4096, 32768, 152064]
    print(f"{'vocab':>8} {'kind':>6} {'build s':>8} {'cpu s':>8} {'peak MB':>8} {'batch s':>8} {'H nats':>7}"
          "   (batch: 32 x 1024 tokens)")
    for v in sizes:
        r = measure(v)
        print(f"{r['vocab_size']:>8} {r['kind']:>6} {r['build_s']:>8.2f} {r['build_cpu_s']:>8.2f} "
              f"{r['peak_mb']:>8.0f} {r['batch_s']:>8.3f} {r['entropy_rate']:>7.3f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
