"""Language-model data: synthetic token walks and byte-level text files.

Both datasets return (x [seq_len], y [seq_len]) int64 with y = x shifted by
one token, and both are pure functions of the index (exact resume).
"""

from __future__ import annotations

import codecs
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from musubi.contract.errors import ConfigError
from musubi.data.synthetic_classification import CLASS_STREAM, TRAIN_STREAM, sample_seed

#: Probability that a synthetic token is replaced by a uniformly random one.
NOISE_P = 0.1

#: Byte-level text files larger than this are refused (1 GiB; tokenise bigger corpora offline).
MAX_TEXT_BYTES = 1 << 30

#: Vocabulary of byte-level text: one token per byte value.
BYTE_VOCAB = 256

_UTF8_CHUNK = 16 << 20  # bytes read per step of the UTF-8 check


def token_cycle(vocab: int, seed: int) -> torch.Tensor:
    """A random permutation [vocab] fixed by the seed: token cycle[k] is followed by cycle[k+1]."""
    g = torch.Generator().manual_seed(sample_seed(seed, CLASS_STREAM, 1))
    return torch.randperm(vocab, generator=g)


def _walk(
    cycle: torch.Tensor, start: torch.Tensor, noise_u: torch.Tensor, noise_tok: torch.Tensor
) -> torch.Tensor:
    """Tokens [B,L] walking the cycle from `start` [B], with positions where noise_u < NOISE_P replaced."""
    vocab = cycle.numel()
    length = noise_u.shape[-1]
    pos = (start[:, None] + torch.arange(length, device=start.device)) % vocab  # [B,L]
    return torch.where(noise_u < NOISE_P, noise_tok, cycle[pos])


class SyntheticTokens(Dataset):
    """Sample i: a noisy walk along a fixed random token cycle -> (x [seq_len], y [seq_len])."""

    def __init__(self, size: int, seq_len: int, vocab: int, seed: int = 0, stream: int = TRAIN_STREAM):
        self.size = size
        self.seq_len = seq_len
        self.vocab = vocab
        self.seed = seed
        self.stream = stream
        self.cycle = token_cycle(vocab, seed)  # [vocab], shared by train and val

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < self.size:
            raise IndexError(f"index {index} out of range for {self.size} samples")
        g = torch.Generator().manual_seed(sample_seed(self.seed, self.stream, index))
        n = self.seq_len + 1
        start = torch.randint(self.vocab, (1,), generator=g)
        noise_u = torch.rand(1, n, generator=g)
        noise_tok = torch.randint(self.vocab, (1, n), generator=g)
        tokens = _walk(self.cycle, start, noise_u, noise_tok)[0]  # [seq_len+1]
        return tokens[:-1], tokens[1:]


def device_batch(
    batch_size: int,
    seq_len: int,
    vocab: int,
    device: torch.device,
    generator: torch.Generator,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x [B,seq_len], y [B,seq_len]) generated on `device`; `generator` must live on that device."""
    cycle = token_cycle(vocab, seed).to(device)
    n = seq_len + 1
    start = torch.randint(vocab, (batch_size,), device=device, generator=generator)
    noise_u = torch.rand(batch_size, n, device=device, generator=generator)
    noise_tok = torch.randint(vocab, (batch_size, n), device=device, generator=generator)
    tokens = _walk(cycle, start, noise_u, noise_tok)  # [B,seq_len+1]
    return tokens[:, :-1], tokens[:, 1:]


def check_utf8(path: str | Path) -> None:
    """Raise ConfigError unless the file is valid UTF-8 (read in chunks, nothing kept)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with open(path, "rb") as f:
        while chunk := f.read(_UTF8_CHUNK):
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as e:
                raise ConfigError(
                    f"{path}: not UTF-8 text (bad byte near offset {offset + e.start}); convert it to UTF-8"
                ) from None
            offset += len(chunk)
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            raise ConfigError(
                f"{path}: not UTF-8 text (truncated last character); convert it to UTF-8"
            ) from None


class ByteTextDataset(Dataset):
    """Byte tokens of a text file; sample i is bytes [i*(L+1), (i+1)*(L+1)) -> (x [L], y [L])."""

    def __init__(self, path: str | Path, seq_len: int, max_bytes: int = MAX_TEXT_BYTES):
        self.path = Path(path)
        self.seq_len = seq_len
        if not self.path.is_file():
            raise ConfigError(
                f"{self.path}: no such text file; give data.train.path / data.val.path of a UTF-8 file"
            )
        nbytes = self.path.stat().st_size
        if nbytes == 0:
            raise ConfigError(f"{self.path}: empty file; an lm text file needs at least {seq_len + 1} bytes")
        if nbytes > max_bytes:
            raise ConfigError(
                f"{self.path}: {nbytes} bytes, more than the {max_bytes}-byte limit; split or tokenise it offline"
            )
        self.nbytes = nbytes
        self.count = nbytes // (seq_len + 1)
        if self.count == 0:
            raise ConfigError(
                f"{self.path}: {nbytes} bytes, shorter than one sample of seq_len+1 = {seq_len + 1}; "
                "lower data.seq_len or give more text"
            )
        # Opened lazily in each process: a memmap shares the page cache between ranks and
        # loader workers, and pickling the dataset must not copy the file into every worker.
        self._tokens: np.memmap | None = None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_tokens"] = None
        return state

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < self.count:
            raise IndexError(f"index {index} out of range for {self.count} samples")
        if self._tokens is None:
            self._tokens = np.memmap(self.path, dtype=np.uint8, mode="r", shape=(self.nbytes,))
        n = self.seq_len + 1
        window = torch.from_numpy(self._tokens[index * n : (index + 1) * n].astype(np.int64))  # [L+1]
        return window[:-1], window[1:]
