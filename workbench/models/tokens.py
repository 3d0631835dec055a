"""Token files in the formats nanoGPT and its descendants write, memory-mapped, and the batches drawn from them.

Formats read by :func:`load_token_file` (nothing is copied into memory):

* ``.npy``: a 1-D integer array, opened with ``np.load(mmap_mode="r")``; its dtype is in its header.
* ``.bin`` with an llm.c header (``karpathy/llm.c`` ``dev/data/data_common.py``, also used by
  modded-nanogpt): 256 int32 values, ``[magic, version, num_tokens, 0...]``, then the tokens:
  magic 20240520 / version 1 means uint16 (GPT-2), 20240801 / version 7 means uint32 (Llama 3).
  A file that starts with one of these magics must match its header exactly (version, and
  ``1024 + num_tokens * itemsize == file size``), else it is refused naming the file.
* any other file: nanoGPT's flat binary, no header (``prepare.py`` writes ``np.uint16`` and
  ``train.py`` reads it with ``np.memmap(..., dtype=np.uint16, mode="r")``). Its dtype cannot be
  read from the file: it is ``uint16`` unless ``dtype="uint32"`` is given. A dtype the tokens
  plainly contradict is refused (:func:`_check_raw_dtype`): uint32 tokens read as uint16 (every
  second token 0: the high halves), or tokens of which most are out of the vocabulary under this
  dtype but within it under the other.

Batches follow the contract of :func:`workbench.models.data.sample_batch`: one global batch per
step, deterministic in ``(seed, step)`` alone, shape ``(global_batch, seq_len + 1)`` int32, inputs
``batch[:, :-1]`` and targets ``batch[:, 1:]``; a data-parallel rank takes
:func:`~workbench.models.data.rank_slice` of it. So DDP and FSDP over any number of ranks train on
the same global batch. Windows start at uniform random offsets, as nanoGPT's ``get_batch`` draws them.

Pure: standard library and NumPy only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from workbench.core.checks import integer
from workbench.models.data import rank_slice

__all__ = ["LLMC_HEADERS", "TokenFile", "check_batch_tokens", "load_token_file", "sample_batch", "sample_rank_batch"]

#: llm.c header magic -> (version, token dtype).
LLMC_HEADERS: dict[int, tuple[int, str]] = {20240520: (1, "uint16"), 20240801: (7, "uint32")}
_HEADER_BYTES = 256 * 4
_RAW_DTYPES = ("uint16", "uint32")
#: Tokens checked against the vocabulary per chunk, so a large file is scanned in bounded memory.
_CHECK_CHUNK = 1 << 24


@dataclass(frozen=True, eq=False)
class TokenFile:
    """A memory-mapped token file.

    Attributes:
        path: The file.
        tokens: 1-D read-only array (a memory map) of the file's tokens.
        layout: ``"npy"``, ``"llm.c"`` or ``"raw"`` (nanoGPT's headerless binary).
        vocab_size: The vocabulary every token was checked against, or ``None``.
    """

    path: Path
    tokens: np.ndarray
    layout: str
    vocab_size: int | None = None

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def dtype(self) -> str:
        """The tokens' dtype name, e.g. ``"uint16"``."""
        return self.tokens.dtype.name


def _llmc_header(path: Path, size: int) -> tuple[int, str] | None:
    """``(num_tokens, dtype)`` if ``path`` starts with an llm.c magic, else ``None``.

    A file that starts with a magic is an llm.c file: its version and size must match its header exactly
    (no raw token file starts with 20240520 or 20240801, which are past every vocabulary).

    Raises:
        ValueError: naming the file, if its header is cut short, its version is not the magic's, or its
            size is not the header's 1024 bytes plus the tokens it announces (a truncated or padded file).
    """
    if size < 4:
        return None
    magic = int(np.fromfile(path, dtype="<i4", count=1)[0])
    if magic not in LLMC_HEADERS:
        return None
    want, dtype = LLMC_HEADERS[magic]
    if size < _HEADER_BYTES:
        raise ValueError(f"{path}: starts with the llm.c magic {magic} but holds {size} bytes, fewer than its "
                         f"{_HEADER_BYTES}-byte header: a truncated llm.c file.")
    version, count = (int(x) for x in np.fromfile(path, dtype="<i4", count=3)[1:])
    if version != want:
        raise ValueError(f"{path}: starts with the llm.c magic {magic}, whose version is {want}, but its header "
                         f"says version {version}: a damaged or unknown llm.c file.")
    expected = _HEADER_BYTES + count * np.dtype(dtype).itemsize
    if count < 0 or expected != size:
        raise ValueError(f"{path}: its llm.c header announces {count} {dtype} tokens, {expected} bytes with the "
                         f"{_HEADER_BYTES}-byte header, but the file holds {size} bytes ({size - expected:+d}): "
                         "a truncated or damaged llm.c file.")
    return count, dtype


def load_token_file(path: str | os.PathLike, *, dtype: str | None = None, vocab_size: int | None = None) -> TokenFile:
    """Open a token file as a read-only memory map (formats in the module docstring).

    Args:
        path: The file: ``.npy``, an llm.c ``.bin``, or a headerless binary.
        dtype: ``"uint16"`` or ``"uint32"``. For a headerless binary, the tokens' dtype (default
            ``"uint16"``, nanoGPT's); for the other formats, a check of the dtype their header states.
        vocab_size: If given, every token must be ``< vocab_size``; the whole file is scanned once.

    Raises:
        ValueError: if the file is missing or empty, its size is not a whole number of tokens, an llm.c
            file does not match its header, the ``.npy`` is not 1-D integer, ``dtype`` disagrees with the
            header or is unknown or is plainly not the file's (a headerless file: :func:`_check_raw_dtype`),
            a token is negative or ``>= vocab_size`` (naming the first offending index); every message
            names the file.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such token file.")
    if dtype is not None and dtype not in _RAW_DTYPES:
        raise ValueError(f"{path}: dtype must be one of {_RAW_DTYPES}, got {dtype!r}.")
    size = path.stat().st_size
    if size == 0:
        raise ValueError(f"{path}: the token file is empty.")
    if path.suffix == ".npy":
        tokens, layout = np.load(path, mmap_mode="r", allow_pickle=False), "npy"
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            raise ValueError(f"{path}: a token .npy must be a 1-D integer array, got {tokens.ndim}-D {tokens.dtype}.")
    elif (header := _llmc_header(path, size)) is not None:
        count, stated = header
        tokens, layout = np.memmap(path, dtype=stated, mode="r", offset=_HEADER_BYTES, shape=(count,)), "llm.c"
    else:
        raw = np.dtype(dtype or "uint16")
        if size % raw.itemsize:
            raise ValueError(f"{path}: {size} bytes is not a whole number of {raw.name} tokens "
                             f"({raw.itemsize} bytes each); is dtype right?")
        tokens, layout = np.memmap(path, dtype=raw, mode="r"), "raw"
    if dtype is not None and layout != "raw" and tokens.dtype.name != dtype:
        raise ValueError(f"{path}: dtype={dtype!r} was given, but the file's {layout} header says {tokens.dtype.name}.")
    if len(tokens) == 0:
        raise ValueError(f"{path}: the token file holds no tokens.")
    if layout == "raw":
        _check_raw_dtype(path, tokens, vocab_size)
    _check_range(path, tokens, vocab_size)
    return TokenFile(path, tokens, layout, vocab_size)


#: Tokens at the start of a headerless file that :func:`_check_raw_dtype` looks at (bounded: 256 KB).
_DTYPE_SAMPLE = 1 << 16


def _check_raw_dtype(path: Path, tokens: np.ndarray, vocab_size: int | None) -> None:
    """Refuse a headerless file's dtype when its first :data:`_DTYPE_SAMPLE` tokens contradict it.

    * uint16 over uint32 data: every second value (the high half of a little-endian uint32 token, below 4
      for any vocabulary under 262,144) is small, while the others are not;
    * with ``vocab_size``: most tokens are ``>= vocab_size`` under this dtype, yet almost all (99%) are
      below it when the same bytes are read as the other dtype.

    Raises:
        ValueError: naming the file, the dtype it was read as, and the one to pass instead.
    """
    sample = np.asarray(tokens[:_DTYPE_SAMPLE])
    sample = sample[: len(sample) - len(sample) % 2]  # whole uint32 tokens under either reading
    if len(sample) < 64:
        return
    other = "uint32" if sample.dtype == np.uint16 else "uint16"
    hint = f"pass dtype='{other}' (RunSpec.data_dtype='{other}')"
    if sample.dtype == np.uint16 and len(tokens) % 2 == 0:
        high, low = float((sample[1::2] < 4).mean()), float((sample[0::2] < 4).mean())
        if high >= 0.9 and low < 0.5:
            raise ValueError(f"{path}: read as uint16, {high:.0%} of every second token is below 4 (but "
                             f"{low:.0%} of the others): these are the high halves of uint32 tokens; {hint}.")
    if vocab_size is not None:
        out = float((sample >= vocab_size).mean())
        fits = float((sample.view(other) < vocab_size).mean())
        if out > 0.5 and fits >= 0.99:
            raise ValueError(f"{path}: read as {sample.dtype.name}, {out:.0%} of its first {len(sample)} tokens are "
                             f">= vocab_size {vocab_size}, but {fits:.0%} fit read as {other}; {hint}.")


def _check_range(path: Path, tokens: np.ndarray, vocab_size: int | None) -> None:
    """Raise naming ``path`` and the first index whose token is negative or ``>= vocab_size``."""
    vocab_size = None if vocab_size is None else integer("vocab_size", vocab_size, low=1)
    if vocab_size is None and tokens.dtype.kind == "u":
        return
    for start in range(0, len(tokens), _CHECK_CHUNK):
        chunk = np.asarray(tokens[start:start + _CHECK_CHUNK])
        bad = (chunk < 0) if vocab_size is None else (chunk < 0) | (chunk >= vocab_size)
        if bad.any():
            i = int(np.argmax(bad))
            limit = "is negative" if vocab_size is None or chunk[i] < 0 else f">= vocab_size {vocab_size}"
            raise ValueError(f"{path}: token {int(chunk[i])} at index {start + i} {limit}.")


def _tokens_of(tokens: TokenFile | np.ndarray) -> tuple[np.ndarray, str]:
    if isinstance(tokens, TokenFile):
        return tokens.tokens, str(tokens.path)
    array = np.asarray(tokens)
    if array.ndim != 1 or array.dtype.kind not in "iu":
        raise ValueError(f"tokens must be a TokenFile or a 1-D integer array, got {array.ndim}-D {array.dtype}.")
    return array, "token array"


def _starts(num_tokens: int, where: str, step: int, global_batch: int, seq_len: int, seed: int) -> np.ndarray:
    """The window starts of one global batch: ``default_rng([seed, step])`` draws ``global_batch`` offsets."""
    for name, value, lo in (("step", step, 0), ("global_batch", global_batch, 1), ("seq_len", seq_len, 1),
                            ("seed", seed, 0)):
        integer(name, value, low=lo)
    window = int(seq_len) + 1
    if num_tokens < window:
        raise ValueError(f"{where}: holds {num_tokens} tokens, fewer than one window of seq_len + 1 = {window}.")
    rng = np.random.default_rng([int(seed), int(step)])
    return rng.integers(0, num_tokens - window + 1, size=int(global_batch))


def _windows(tokens: np.ndarray, starts: np.ndarray, seq_len: int) -> np.ndarray:
    out = np.stack([np.asarray(tokens[s:s + seq_len + 1]) for s in starts])
    if int(out.max()) > np.iinfo(np.int32).max:
        raise ValueError(f"token {int(out.max())} does not fit int32, the dtype batches are returned in.")
    return out.astype(np.int32)


def sample_batch(tokens: TokenFile | np.ndarray, step: int, global_batch: int, seq_len: int, *,
                 seed: int = 0) -> np.ndarray:
    """One global batch of windows from a token file.

    Deterministic in ``(seed, step)`` and the file's contents, in any process: the generator is
    ``numpy.random.default_rng([seed, step])``, and row ``i`` is ``tokens[s_i : s_i + seq_len + 1]``
    for ``s_i`` drawn uniformly from ``[0, len(tokens) - seq_len - 1]``.

    Args:
        tokens: A :class:`TokenFile`, or a 1-D integer array.
        step: Training step (>= 0); each step gets its own batch.
        global_batch: Sequences across all ranks (>= 1).
        seq_len: Model context length in tokens (>= 1).
        seed: Data seed (>= 0).

    Returns:
        int32 array of shape ``(global_batch, seq_len + 1)``.

    Raises:
        ValueError: naming ``step``, ``global_batch``, ``seq_len`` or ``seed`` when out of range, or
            the file when it holds fewer than ``seq_len + 1`` tokens.
    """
    array, where = _tokens_of(tokens)
    return _windows(array, _starts(len(array), where, step, global_batch, seq_len, seed), int(seq_len))


def sample_rank_batch(tokens: TokenFile | np.ndarray, step: int, global_batch: int, seq_len: int, *, rank: int,
                      num_ranks: int, seed: int = 0) -> np.ndarray:
    """This rank's rows of :func:`sample_batch`, reading only those windows from the file.

    Equal to ``rank_slice(sample_batch(tokens, step, global_batch, seq_len, seed=seed), rank, num_ranks)``.

    Raises:
        ValueError: as :func:`sample_batch`, and as :func:`~workbench.models.data.rank_slice` for
            ``rank`` / ``num_ranks``.
    """
    array, where = _tokens_of(tokens)
    starts = rank_slice(_starts(len(array), where, step, global_batch, seq_len, seed), rank, num_ranks)
    return _windows(array, starts, int(seq_len))


def check_batch_tokens(batch: np.ndarray, vocab_size: int, *, where: str, step: int) -> None:
    """Every token of one step's batch must be in ``[0, vocab_size)``: a changed file, not the model, is
    then what fails (an out-of-range token makes an embedding read out of bounds, or a NaN loss).

    Raises:
        ValueError: naming ``where`` (the file), the step and the first offending token.
    """
    low, high = int(batch.min()), int(batch.max())
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(f"{where}: step {step}'s batch holds token {bad}, outside model['vocab_size'] = {vocab_size} "
                         "(the file validated before the run held none: did it change during the run?)")
