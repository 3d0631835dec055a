"""Write a small deterministic token file for the examples (``examples/data/``), in nanoGPT's format.

Two sources:

* the default: a stream from the workbench's Markov chain (:func:`workbench.models.data.make_markov_chain`
  over 256 tokens), so the loss floor is known (its entropy rate is printed);
* ``--text FILE``: the file's bytes, one token each (byte-level, vocabulary 256), e.g. your own corpus.

The output is a flat binary without header (uint16, or uint32 for a vocabulary over 65,536), as nanoGPT's
``prepare.py`` writes ``train.bin``, or a ``.npy`` if the name ends so. The same arguments give the same
bytes on every machine::

    python3 scripts/make_token_file.py                       # examples/data/markov_v256.bin, 65,536 tokens
    python3 scripts/make_token_file.py --text notes.txt --out examples/data/notes.bin
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from workbench.models.data import entropy_rate_nats, make_markov_chain, sample_batch

DEFAULT_OUT = ROOT / "examples" / "data" / "markov_v256.bin"


def markov_tokens(num_tokens: int, vocab_size: int, seed: int) -> np.ndarray:
    """One stream of ``num_tokens`` tokens from the chain ``make_markov_chain(vocab_size, seed=seed)``."""
    chain = make_markov_chain(vocab_size, seed=seed)
    print(f"Markov chain V={vocab_size}, seed={seed}: entropy rate {entropy_rate_nats(chain):.4f} nats/token")
    return sample_batch(chain, 0, 1, num_tokens - 1, seed=seed)[0]


def text_tokens(path: Path, num_tokens: int | None) -> np.ndarray:
    """The bytes of ``path`` as tokens 0..255 (the first ``num_tokens`` of them, if given)."""
    data = np.frombuffer(path.read_bytes(), dtype=np.uint8)
    return data[:num_tokens] if num_tokens else data


def write_tokens(tokens: np.ndarray, out: Path, vocab_size: int) -> Path:
    """Write ``tokens`` as uint16 (uint32 above 65,536 tokens of vocabulary), raw or ``.npy`` by suffix."""
    dtype = np.uint16 if vocab_size <= 2**16 else np.uint32
    out.parent.mkdir(parents=True, exist_ok=True)
    array = np.ascontiguousarray(tokens, dtype=dtype)
    if out.suffix == ".npy":
        np.save(out, array)
    else:
        array.tofile(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output file (.bin raw, .npy NumPy)")
    parser.add_argument("--text", type=Path, help="tokenise this file's bytes instead of sampling the chain")
    parser.add_argument("--num-tokens", type=int, default=None, help="tokens to write (Markov default 65536)")
    parser.add_argument("--vocab-size", type=int, default=256, help="Markov chain vocabulary (default 256)")
    parser.add_argument("--seed", type=int, default=0, help="Markov chain and sampling seed (default 0)")
    args = parser.parse_args(argv)
    if args.text is not None:
        if not args.text.is_file():
            parser.error(f"--text {args.text}: no such file")
        tokens, vocab = text_tokens(args.text, args.num_tokens), 256
    else:
        tokens, vocab = markov_tokens(args.num_tokens or 65536, args.vocab_size, args.seed), args.vocab_size
    if len(tokens) < 2:
        parser.error(f"only {len(tokens)} tokens: a batch window needs at least 2")
    out = write_tokens(tokens, args.out, vocab)
    print(f"wrote {len(tokens):,} tokens (vocabulary {vocab}) to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
