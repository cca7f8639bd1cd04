"""Human units for one-line findings (GiB, MiB, ms, index lists)."""

from __future__ import annotations

from collections.abc import Iterable


def gib(nbytes: float) -> str:
    """Bytes as GiB with one decimal: '79.6 GiB'."""
    return f"{nbytes / 2**30:.1f} GiB"


def size(nbytes: float) -> str:
    """Bytes as MiB below 1 GiB, else GiB."""
    return f"{nbytes / 2**20:.0f} MiB" if nbytes < 2**30 else gib(nbytes)


def ms(seconds: float) -> str:
    """Seconds as milliseconds with two significant decimals."""
    return f"{seconds * 1e3:.2f} ms"


def indices(items: Iterable[int]) -> str:
    """[0, 1, 3] -> '0,1,3' (the --gpu-ids spelling)."""
    return ",".join(str(i) for i in items)
