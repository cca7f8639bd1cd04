"""Which free GPUs a job gets: the best-linked group, leaving the best groups for the jobs still queued.

The link-cost model: a pair of GPUs costs 1/GB/s of its link class
(musubi.topology.model: NV# < PIX < PXB < PHB < NODE < SYS). A group's cost is
(bottleneck, total): its most expensive pair first (a ring all-reduce runs at
the speed of its slowest hop), then the sum over all pairs. A k-GPU job gets a
group of the lowest cost among the free GPUs. Among groups of equal cost (every
single GPU; any pair on an NVSwitch) the choice that hurts the queue least wins:
the multi-GPU jobs still queued are placed greedily, in queue order, on what
would be left, and the choice whose leftovers give them the cheapest groups
wins; then the one that keeps the most link bandwidth among the free GPUs left
(a single job takes the GPU whose NVLink partner is busy, not half of a free
pair). Without a topology the lowest free GPUs are taken.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import combinations
from math import comb

from musubi.topology.model import NodeTopology, link_gbps

#: Above this many candidate groups the search is greedy (machines of more than ~16 GPUs).
EXHAUSTIVE_LIMIT = 5000
#: Queued multi-GPU jobs looked at when breaking ties (the next ones matter most).
LOOKAHEAD = 8

Cost = tuple[float, float]

_WORDS = {"PIX": "one PCIe switch", "PXB": "PCIe switches, no host bridge", "PHB": "through a CPU host bridge",
          "NODE": "across host bridges of one NUMA node", "SYS": "across CPU sockets"}


def describe(link: str | None) -> str:
    """A link word for people: 'NV18 (18 NVLinks)', 'PIX (one PCIe switch)'."""
    if link is None:
        return "unknown link"
    if link.startswith("NV"):
        return f"{link} ({link[2:]} NVLinks)"
    return f"{link} ({_WORDS.get(link, 'PCIe')})"


def group_cost(topo: NodeTopology, gpus: Iterable[int]) -> Cost:
    """(bottleneck pair cost, sum of pair costs) of a GPU group; (0, 0) for one GPU. Rounded: ties are ties."""
    g = sorted(gpus)
    costs = [topo.cost(a, b) for a, b in combinations(g, 2)]
    if not costs:
        return (0.0, 0.0)
    return (round(max(costs), 9), round(sum(costs), 9))


def worst_link(topo: NodeTopology, gpus: Iterable[int]) -> str | None:
    """The slowest link inside a group (None for one GPU)."""
    pairs = list(combinations(sorted(gpus), 2))
    if not pairs:
        return None
    return min((topo.link(a, b) for a, b in pairs), key=link_gbps)


def _greedy(topo: NodeTopology, pool: Sequence[int], k: int) -> list[tuple[int, ...]]:
    """One group per seed GPU, grown by the GPU that raises the cost least (big machines)."""
    out = []
    for seed in pool:
        group = [seed]
        while len(group) < k:
            nxt = min((g for g in pool if g not in group), key=lambda g: (group_cost(topo, [*group, g]), g))
            group.append(nxt)
        out.append(tuple(sorted(group)))
    return sorted(set(out))


def candidates(topo: NodeTopology, pool: Sequence[int], k: int) -> list[tuple[int, ...]]:
    """Every k-GPU group of the pool (or the greedy ones when there are too many)."""
    pool = sorted(pool)
    if comb(len(pool), k) <= EXHAUSTIVE_LIMIT:
        return list(combinations(pool, k))
    return _greedy(topo, pool, k)


def best_group(topo: NodeTopology, pool: Sequence[int], k: int) -> tuple[int, ...]:
    """The k GPUs of the pool with the lowest group cost (lowest indices among equals)."""
    return min(candidates(topo, pool, k), key=lambda g: (group_cost(topo, g), g))


def _queue_cost(topo: NodeTopology, pool: set[int], queued: Sequence[int]) -> Cost:
    """Total cost of the queued multi-GPU jobs placed greedily, in order, on `pool` (those that fit)."""
    bottleneck = total = 0.0
    left = set(pool)
    for m in queued:
        if m <= len(left):
            g = best_group(topo, sorted(left), m)
            b, t = group_cost(topo, g)
            bottleneck, total = bottleneck + b, total + t
            left -= set(g)
    return (round(bottleneck, 9), round(total, 9))


def _kept_bandwidth(topo: NodeTopology, pool: set[int]) -> float:
    """Sum of link GB/s over every pair of the GPUs left free (more is a better-connected remainder)."""
    return sum(link_gbps(topo.link(a, b)) for a, b in combinations(sorted(pool), 2))


@dataclass(frozen=True)
class Choice:
    """The GPUs a job gets and why (logged and kept in fleet.json)."""

    gpus: tuple[int, ...]
    reason: str


def choose(topo: NodeTopology | None, free: Sequence[int], k: int, queued: Sequence[tuple[str, int]] = ()) -> Choice:
    """The k free GPUs for a job; `queued`: (name, GPUs) of the jobs behind it in the queue, in order."""
    free = sorted(free)
    if k > len(free):
        raise ValueError(f"{k} GPUs asked, {len(free)} free")
    known = topo is not None and set(free) <= set(topo.gpu_indices)
    if not known or k == len(free):
        why = "all free GPUs" if k == len(free) else "no topology known: the lowest free GPUs"
        chosen = tuple(free[:k])
        if known and k > 1:
            why += f"; worst link {describe(worst_link(topo, chosen))}"  # type: ignore[arg-type]
        return Choice(chosen, why)
    assert topo is not None
    multi = [(n, m) for n, m in queued if m > 1][:LOOKAHEAD]
    sizes = [m for _, m in multi]
    groups = candidates(topo, free, k)
    own = {g: group_cost(topo, g) for g in groups}
    best_own = min(own.values())
    tied = [g for g in groups if own[g] == best_own]

    def key(g: tuple[int, ...]) -> tuple:
        left = set(free) - set(g)
        return (_queue_cost(topo, left, sizes), -round(_kept_bandwidth(topo, left), 6), g)

    chosen = min(tied, key=key) if len(tied) > 1 else tied[0]
    parts = []
    if k > 1:
        parts.append(f"best-linked {k} of free {','.join(map(str, free))}: worst link "
                     f"{describe(worst_link(topo, chosen))}")
    else:
        parts.append(f"1 of free {','.join(map(str, free))}")
    if len(tied) > 1:
        left = sorted(set(free) - set(chosen))
        nxt = next(((n, m) for n, m in multi if m <= len(left)), None)
        if nxt is not None:
            g = best_group(topo, left, nxt[1])
            parts.append(f"leaves {','.join(map(str, g))} ({describe(worst_link(topo, g))}) for queued "
                         f"{nxt[0]} ({nxt[1]} GPUs)")
        elif k == 1 and left:
            parts.append("the GPU least linked to the other free GPUs")
    return Choice(chosen, "; ".join(parts))
