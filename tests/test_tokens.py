"""Token files (workbench.models.tokens): real files on disk in every format, deterministic batches per (step,
rank) across processes, rank slices tiling the global batch, and errors that name the file."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from workbench.models.data import rank_slice
from workbench.models.tokens import load_token_file, sample_batch, sample_rank_batch

RNG = np.random.default_rng(7)
U16 = RNG.integers(0, 50257, size=5000).astype(np.uint16)
U32 = RNG.integers(0, 128256, size=3000).astype(np.uint32)


def write_llmc(path, tokens, magic, version):
    header = np.zeros(256, dtype="<i4")
    header[:3] = magic, version, len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())


@pytest.fixture
def files(tmp_path):
    paths = {"u16": tmp_path / "train.bin", "u32": tmp_path / "train32.bin", "npy": tmp_path / "train.npy",
             "llmc16": tmp_path / "fineweb_train_000001.bin", "llmc32": tmp_path / "llama_train.bin"}
    U16.tofile(paths["u16"])
    U32.tofile(paths["u32"])
    np.save(paths["npy"], U32)
    write_llmc(paths["llmc16"], U16, 20240520, 1)
    write_llmc(paths["llmc32"], U32, 20240801, 7)
    return paths


def test_every_format_maps_the_tokens_written(files):
    cases = {"u16": ({}, U16, "raw"), "u32": ({"dtype": "uint32"}, U32, "raw"), "npy": ({}, U32, "npy"),
             "llmc16": ({}, U16, "llm.c"), "llmc32": ({}, U32, "llm.c")}
    for key, (kwargs, expected, layout) in cases.items():
        f = load_token_file(files[key], **kwargs)
        assert isinstance(f.tokens, np.memmap), key
        assert f.layout == layout and f.dtype == expected.dtype.name and len(f) == len(expected), key
        np.testing.assert_array_equal(f.tokens, expected)
        assert not f.tokens.flags.writeable


def test_a_batch_is_windows_of_the_file(files):
    f = load_token_file(files["u16"], vocab_size=50257)
    batch = sample_batch(f, step=3, global_batch=8, seq_len=16, seed=1)
    assert batch.shape == (8, 17) and batch.dtype == np.int32
    text = U16.astype(np.int64)
    for row in batch:  # every row is a contiguous slice of the file
        starts = np.flatnonzero(text[: len(text) - 16] == row[0])
        assert any(np.array_equal(text[s:s + 17], row) for s in starts)
    assert np.array_equal(batch, sample_batch(f, 3, 8, 16, seed=1))
    assert not np.array_equal(batch, sample_batch(f, 4, 8, 16, seed=1))
    assert not np.array_equal(batch, sample_batch(f, 3, 8, 16, seed=2))
    # the same tokens as an array, or as another format, give the same batch
    assert np.array_equal(batch, sample_batch(U16, 3, 8, 16, seed=1))
    assert np.array_equal(batch, sample_batch(load_token_file(files["llmc16"]), 3, 8, 16, seed=1))


def test_a_window_as_long_as_the_file_is_the_file():
    tokens = np.arange(10, dtype=np.uint16)
    batch = sample_batch(tokens, 0, 4, 9)
    assert (batch == np.arange(10)).all()


@pytest.mark.parametrize("num_ranks", [1, 2, 4, 8])
def test_rank_slices_tile_the_global_batch(files, num_ranks):
    f = load_token_file(files["u32"], dtype="uint32")
    full = sample_batch(f, 5, 8, 12, seed=3)
    parts = [sample_rank_batch(f, 5, 8, 12, rank=r, num_ranks=num_ranks, seed=3) for r in range(num_ranks)]
    for r, part in enumerate(parts):
        assert np.array_equal(part, rank_slice(full, r, num_ranks))
    assert np.array_equal(np.concatenate(parts), full)
    with pytest.raises(ValueError, match="not divisible"):
        sample_rank_batch(f, 0, 8, 12, rank=0, num_ranks=3)


def test_a_fresh_process_draws_the_same_batch(files):
    code = ("import sys, numpy as np\n"
            "from workbench.models.tokens import load_token_file, sample_rank_batch\n"
            "f = load_token_file(sys.argv[1], vocab_size=50257)\n"
            "np.save(sys.argv[2], sample_rank_batch(f, 11, 8, 32, rank=1, num_ranks=2, seed=4))\n")
    out = files["u16"].parent / "rank1.npy"
    subprocess.run([sys.executable, "-c", code, str(files["u16"]), str(out)], check=True, timeout=120)
    here = rank_slice(sample_batch(load_token_file(files["u16"]), 11, 8, 32, seed=4), 1, 2)
    assert np.array_equal(np.load(out), here)


def test_errors_name_the_file(files, tmp_path):
    with pytest.raises(ValueError, match=r"nope\.bin: no such token file"):
        load_token_file(tmp_path / "nope.bin")
    (tmp_path / "empty.bin").write_bytes(b"")
    with pytest.raises(ValueError, match=r"empty\.bin: the token file is empty"):
        load_token_file(tmp_path / "empty.bin")
    (tmp_path / "odd.bin").write_bytes(b"\x01\x00\x02")
    with pytest.raises(ValueError, match=r"odd\.bin: 3 bytes is not a whole number of uint16 tokens"):
        load_token_file(tmp_path / "odd.bin")
    with pytest.raises(ValueError, match=r"train\.npy: dtype='uint16' was given, but the file's npy header says uint32"):
        load_token_file(files["npy"], dtype="uint16")
    with pytest.raises(ValueError, match="dtype must be one of"):
        load_token_file(files["u16"], dtype="int8")
    np.save(tmp_path / "grid.npy", np.zeros((2, 3), dtype=np.int32))
    with pytest.raises(ValueError, match=r"grid\.npy: a token \.npy must be a 1-D integer array"):
        load_token_file(tmp_path / "grid.npy")


def test_a_vocabulary_smaller_than_the_data_names_the_first_offending_index(files, tmp_path):
    first = int(np.argmax(U16 >= 1000))
    with pytest.raises(ValueError, match=rf"train\.bin: token {U16[first]} at index {first} >= vocab_size 1000"):
        load_token_file(files["u16"], vocab_size=1000)
    np.save(tmp_path / "neg.npy", np.array([3, 1, -2, 4], dtype=np.int32))
    with pytest.raises(ValueError, match=r"neg\.npy: token -2 at index 2 is negative"):
        load_token_file(tmp_path / "neg.npy")
    assert load_token_file(files["u16"], vocab_size=50257).vocab_size == 50257


def test_a_file_shorter_than_one_window_names_the_file(files):
    f = load_token_file(files["u16"])
    with pytest.raises(ValueError, match=r"train\.bin: holds 5000 tokens, fewer than one window of seq_len \+ 1 = 5001"):
        sample_batch(f, 0, 2, 5000)
    for kwargs, name in ((dict(step=-1), "step"), (dict(global_batch=0), "global_batch"), (dict(seq_len=0), "seq_len"),
                         (dict(seed=-1), "seed")):
        args = dict(step=0, global_batch=2, seq_len=4, seed=0) | kwargs
        with pytest.raises(ValueError, match=name):
            sample_batch(f, args["step"], args["global_batch"], args["seq_len"], seed=args["seed"])


def test_a_file_with_an_llmc_magic_must_match_its_header_or_is_refused_naming_the_file(tmp_path):
    """Issue 24, item 7: an llm.c file 4 bytes short was read as raw uint16, header and all, and trained on."""
    whole = tmp_path / "whole.bin"
    write_llmc(whole, U16, 20240520, 1)
    data = whole.read_bytes()
    cases = {"short.bin": (data[:-4], r"short\.bin: its llm\.c header announces 5000 uint16 tokens, 11024 bytes .* "
                                      r"holds 11020 bytes \(-4\)"),
             "padded.bin": (data + b"\0\0", r"padded\.bin: .* holds 11026 bytes \(\+2\)"),
             "stub.bin": (data[:512], r"stub\.bin: starts with the llm\.c magic 20240520 but holds 512 bytes"),
             "version.bin": (data[:4] + np.int32(7).tobytes() + data[8:], r"version\.bin: .* says version 7")}
    for name, (content, match) in cases.items():
        (tmp_path / name).write_bytes(content)
        for dtype in (None, "uint16"):  # an explicit dtype does not make a damaged header raw
            with pytest.raises(ValueError, match=match):
                load_token_file(tmp_path / name, dtype=dtype)


def test_a_dtype_the_tokens_contradict_is_refused_naming_the_file_and_the_dtype(files):
    """Issue 24, item 7: uint32 tokens read as uint16 (every second token 0), or uint16 read as uint32."""
    with pytest.raises(ValueError, match=r"train32\.bin: read as uint16, 100% of every second token is below 4 .* "
                                         r"pass dtype='uint32'"):
        load_token_file(files["u32"])
    small = files["u32"].parent / "bytes32.bin"  # byte tokens in uint32: as uint16 all in range, half of them 0
    (U32 % 256).astype(np.uint32).tofile(small)
    with pytest.raises(ValueError, match=r"bytes32\.bin: read as uint16.* pass dtype='uint32'"):
        load_token_file(small, vocab_size=256)
    with pytest.raises(ValueError, match=r"train\.bin: read as uint32, 100% of its first 2500 tokens are >= vocab_size "
                                         r"50257, but 100% fit read as uint16; pass dtype='uint16'"):
        load_token_file(files["u16"], dtype="uint32", vocab_size=50257)
    assert len(load_token_file(files["u32"], dtype="uint32", vocab_size=128256)) == len(U32)  # the right dtype


def test_a_batch_outside_the_vocabulary_is_refused_naming_where_and_the_step():
    from workbench.models.tokens import check_batch_tokens

    check_batch_tokens(np.array([[0, 255]]), 256, where="f.bin", step=3)
    with pytest.raises(ValueError, match=r"f\.bin: step 3's batch holds token 65535, outside model\['vocab_size'\]"):
        check_batch_tokens(np.array([[0, 65535]]), 256, where="f.bin", step=3)
