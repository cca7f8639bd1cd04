"""LM data: synthetic token determinism and structure, byte-level text windows and their errors."""

from __future__ import annotations

import pickle

import pytest
import torch

from musubi.contract.errors import ConfigError
from musubi.data import text


def test_synthetic_tokens_are_a_pure_function_of_seed_and_index() -> None:
    a = text.SyntheticTokens(size=8, seq_len=16, vocab=50, seed=3)
    b = text.SyntheticTokens(size=8, seq_len=16, vocab=50, seed=3)
    torch.manual_seed(123)  # the global RNG must play no part
    x1, y1 = a[5]
    torch.manual_seed(999)
    x2, y2 = b[5]
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert x1.shape == y1.shape == (16,) and x1.dtype == torch.int64
    assert not torch.equal(a[4][0], a[5][0])
    assert not torch.equal(text.SyntheticTokens(8, 16, 50, seed=4)[5][0], x1)
    val = text.SyntheticTokens(8, 16, 50, seed=3, stream=2)
    assert not torch.equal(val[5][0], x1)


def test_synthetic_tokens_shift_range_and_structure() -> None:
    ds = text.SyntheticTokens(size=64, seq_len=32, vocab=40, seed=0)
    cycle = ds.cycle
    nxt = torch.empty_like(cycle)
    nxt[cycle] = cycle.roll(-1)  # nxt[token] = the token the walk visits after it
    follows = total = 0
    for i in range(len(ds)):
        x, y = ds[i]
        assert torch.equal(x[1:], y[:-1])  # y is x shifted by one
        assert int(x.min()) >= 0 and int(x.max()) < 40
        follows += int((nxt[x] == y).sum())
        total += y.numel()
    # Learnable: ~(1 - p)^2 of the next tokens follow the cycle; random would be 1/40.
    assert follows / total > 0.7
    with pytest.raises(IndexError):
        ds[64]


def test_device_batch_shapes_and_generator() -> None:
    g = torch.Generator().manual_seed(0)
    x, y = text.device_batch(4, 10, 30, torch.device("cpu"), g)
    assert x.shape == y.shape == (4, 10)
    assert torch.equal(x[:, 1:], y[:, :-1])
    g2 = torch.Generator().manual_seed(0)
    assert torch.equal(text.device_batch(4, 10, 30, torch.device("cpu"), g2)[0], x)


def test_byte_text_windows(tmp_path) -> None:
    data = "héllo wörld, bytes! " * 5  # multi-byte characters: tokens are bytes, not characters
    raw = data.encode("utf-8")
    path = tmp_path / "corpus.txt"
    path.write_bytes(raw)
    ds = text.ByteTextDataset(path, seq_len=7)
    assert len(ds) == len(raw) // 8
    for i in range(len(ds)):
        x, y = ds[i]
        window = torch.tensor(list(raw[i * 8 : (i + 1) * 8]))
        assert torch.equal(x, window[:-1]) and torch.equal(y, window[1:])
        assert x.dtype == torch.int64
    with pytest.raises(IndexError):
        ds[len(ds)]
    # Pickles without the memmap (loader workers reopen it) and reads the same.
    ds[0]
    clone = pickle.loads(pickle.dumps(ds))
    assert clone._tokens is None
    assert torch.equal(clone[2][0], ds[2][0])


def test_byte_text_errors(tmp_path) -> None:
    with pytest.raises(ConfigError, match="no such text file"):
        text.ByteTextDataset(tmp_path / "missing.txt", 8)
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(ConfigError, match="empty"):
        text.ByteTextDataset(empty, 8)
    short = tmp_path / "short.txt"
    short.write_bytes(b"abcdefgh")  # 8 bytes < seq_len + 1
    with pytest.raises(ConfigError, match="seq_len"):
        text.ByteTextDataset(short, 8)
    big = tmp_path / "big.txt"
    big.write_bytes(b"a" * 100)
    with pytest.raises(ConfigError, match="limit"):
        text.ByteTextDataset(big, 8, max_bytes=50)


def test_check_utf8(tmp_path) -> None:
    good = tmp_path / "good.txt"
    good.write_text("ünïcode ✓", encoding="utf-8")
    text.check_utf8(good)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok then \xff\xfe")
    with pytest.raises(ConfigError, match="offset 8"):
        text.check_utf8(bad)
    cut = tmp_path / "cut.txt"
    cut.write_bytes("✓".encode()[:2])
    with pytest.raises(ConfigError, match="truncated"):
        text.check_utf8(cut)
