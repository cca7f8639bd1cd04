"""Which free GPUs a job gets: the best joint choice for it and the jobs still queued behind it.

The link-cost model: a pair of GPUs costs 1/GB/s of its link class
(musubi.topology.model: NV# < PIX < PXB < PHB < NODE < SYS). A group's cost is
(bottleneck, total): its most expensive pair first (a ring all-reduce runs at
the speed of its slowest hop), then the sum over all pairs. A fleet's cost is
the sum of its jobs' bottlenecks, then of their totals.

A k-GPU job gets the group that minimises the fleet cost of itself plus the
multi-GPU jobs queued behind it (up to LOOKAHEAD of them), placed as the packer
would place them: those that fit in what this job leaves start now, on their
best joint placement (exhaustive search on machines of this size, greedy past
JOINT_BUDGET groups); those that do not fit wait for the GPUs running jobs will
release, and are placed greedily on those plus what is left. So a
higher-priority small job may take a slightly worse pair to keep a queued
larger job on one socket. Among choices of equal fleet cost: the group on the
fewest NUMA nodes (then nearest to the fewest NICs), then the one that keeps the
most link bandwidth among the free GPUs left (a single job takes the GPU whose
NVLink partner is busy, not half of a free pair), then the lowest indices.
Without a topology the lowest free GPUs are taken.
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
#: Groups the exact joint search of the queue's lookahead may try per decision before it goes greedy.
JOINT_BUDGET = 20000
#: Candidate groups whose effect on the queue is simulated (all of them on machines of up to 8 GPUs).
SIM_LIMIT = 128

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


_TABLES: dict[int, tuple[NodeTopology, dict[tuple[int, int], float], dict[int, int | None]]] = {}


def _tables(topo: NodeTopology) -> tuple[dict[tuple[int, int], float], dict[int, int | None]]:
    """Pair costs and NUMA nodes of a topology, computed once (the search asks for them millions of times)."""
    hit = _TABLES.get(id(topo))
    if hit is None or hit[0] is not topo:
        if len(_TABLES) > 8:
            _TABLES.clear()
        idx = topo.gpu_indices
        costs = {(a, b): topo.cost(a, b) for a, b in combinations(sorted(idx), 2)}
        hit = _TABLES[id(topo)] = (topo, costs, {g: topo.numa_of(g) for g in idx})
    return hit[1], hit[2]


def group_cost(topo: NodeTopology, gpus: Iterable[int]) -> Cost:
    """(bottleneck pair cost, sum of pair costs) of a GPU group; (0, 0) for one GPU. Rounded: ties are ties."""
    g = sorted(gpus)
    table = _tables(topo)[0]
    costs = [table[p] if p in table else topo.cost(*p) for p in combinations(g, 2)]
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


def _numa_spread(topo: NodeTopology, gpus: Iterable[int]) -> int:
    """How many NUMA nodes a group spans (unknown nodes count as one each)."""
    numa = _tables(topo)[1]
    nodes = [numa.get(g) for g in gpus]
    return len({n for n in nodes if n is not None}) + sum(1 for n in nodes if n is None)


def _nic_spread(topo: NodeTopology, gpus: Iterable[int]) -> int:
    """How many distinct nearest-NIC sets a group touches (0 without NICs): fewer keeps a job's traffic on one NIC."""
    sets = {tuple(topo.nearest_nics(g)) for g in gpus}
    sets.discard(())
    return len(sets)


def _best_in(topo: NodeTopology, pool: Sequence[int], m: int, memo: dict | None = None) -> tuple[int, ...]:
    """The group a queued job would get from `pool`: lowest cost, then fewest NUMA nodes, then lowest indices."""
    key = ("best", frozenset(pool), m)
    if memo is not None and key in memo:
        return memo[key]
    got = min(candidates(topo, pool, m), key=lambda g: (group_cost(topo, g), _numa_spread(topo, g), g))
    if memo is not None:
        memo[key] = got
    return got


def _joint(topo: NodeTopology, pool: frozenset[int], sizes: tuple[int, ...], memo: dict,
           budget: list[int]) -> tuple[Cost, tuple[tuple[int, ...], ...]] | None:
    """The cheapest joint placement of jobs of `sizes` on `pool` (sum of bottlenecks, then of totals), by
    exhaustive search; None when the search would pass its budget (then the caller goes greedy)."""
    if not sizes:
        return (0.0, 0.0), ()
    key = (pool, sizes)
    if key in memo:
        return memo[key]
    best: tuple[Cost, tuple[tuple[int, ...], ...]] | None = None
    for g in candidates(topo, sorted(pool), sizes[0]):
        budget[0] -= 1
        if budget[0] < 0:
            return None
        rest = _joint(topo, pool - set(g), sizes[1:], memo, budget)
        if rest is None:
            return None
        b, t = group_cost(topo, g)
        c = (round(b + rest[0][0], 9), round(t + rest[0][1], 9))
        if best is None or c < best[0]:
            best = (c, (g, *rest[1]))
    memo[key] = best
    return best


def _simulate(topo: NodeTopology, left: set[int], later: set[int], queued: Sequence[tuple[str, int]],
              memo: dict, budget: list[int]) -> tuple[Cost, list[tuple[str, tuple[int, ...]]]]:
    """The queued multi-GPU jobs placed as the packer would: those that fit start now on `left`, in order
    (their best joint placement, found exhaustively on small machines, else greedily); the rest later, on what
    is then left plus the GPUs running jobs will release (`later`), greedily. Their summed cost."""
    now_jobs, waiting, room = [], [], len(left)
    for name, m in queued:
        if m <= room:
            now_jobs.append((name, m))
            room -= m
        else:
            waiting.append((name, m))
    placed: list[tuple[str, tuple[int, ...]]] = []
    exact = _joint(topo, frozenset(left), tuple(m for _, m in now_jobs), memo, budget) if budget[0] > 0 else None
    now = set(left)
    if exact is not None:
        placed += [(name, g) for (name, _), g in zip(now_jobs, exact[1], strict=True)]
        for g in exact[1]:
            now -= set(g)
    else:
        for name, m in now_jobs:
            g = _best_in(topo, sorted(now), m, memo)
            now -= set(g)
            placed.append((name, g))
    pool = now | later
    for name, m in waiting:
        if m <= len(pool):
            g = _best_in(topo, sorted(pool), m, memo)
            pool -= set(g)
            placed.append((name, g))
    bottleneck = total = 0.0
    for _, g in placed:
        b, t = group_cost(topo, g)
        bottleneck, total = bottleneck + b, total + t
    return (round(bottleneck, 9), round(total, 9)), placed


def _kept_bandwidth(topo: NodeTopology, pool: set[int]) -> float:
    """Sum of link GB/s over every pair of the GPUs left free (more is a better-connected remainder)."""
    return sum(link_gbps(topo.link(a, b)) for a, b in combinations(sorted(pool), 2))


@dataclass(frozen=True)
class Choice:
    """The GPUs a job gets and why (logged and kept in fleet.json)."""

    gpus: tuple[int, ...]
    reason: str


def _nodes(topo: NodeTopology, gpus: Iterable[int]) -> str:
    nodes = sorted({n for n in (topo.numa_of(g) for g in gpus) if n is not None})
    return ",".join(map(str, nodes))


def choose(topo: NodeTopology | None, free: Sequence[int], k: int, queued: Sequence[tuple[str, int]] = (),
           later: Sequence[int] = (), unit: str = "GPU") -> Choice:
    """The k free GPUs for a job.

    `queued`: (name, GPUs) of the jobs behind it in the queue, in order; `later`: GPUs held by running jobs
    (they come back, and queued jobs that do not fit now will be placed on them too); `unit`: what a device is
    called in the reason ("CPU slot" for CPU ranks).
    """
    free = sorted(free)
    if k > len(free):
        raise ValueError(f"{k} GPUs asked, {len(free)} free")
    known = topo is not None and set(free) <= set(topo.gpu_indices)
    if not known or k == len(free):
        why = f"all free {unit}s" if k == len(free) else f"no topology known: the lowest free {unit}s"
        chosen = tuple(free[:k])
        if known and k > 1:
            why += f"; worst link {describe(worst_link(topo, chosen))}"  # type: ignore[arg-type]
        return Choice(chosen, why)
    assert topo is not None
    multi = [(n, m) for n, m in queued if m > 1][:LOOKAHEAD]
    held = set(later) & set(topo.gpu_indices)
    groups = candidates(topo, free, k)
    own = {g: group_cost(topo, g) for g in groups}
    if multi and len(groups) > SIM_LIMIT:  # big machines: the queue is simulated for the best-linked groups only
        groups = sorted(groups, key=lambda g: (own[g], _numa_spread(topo, g), g))[:SIM_LIMIT]
    memo: dict = {}
    budget = [JOINT_BUDGET]
    sim = {g: _simulate(topo, set(free) - set(g), held, multi, memo, budget) for g in groups} if multi else {}

    def fleet(g: tuple[int, ...]) -> Cost:
        """The fleet objective: this job's cost plus the queued jobs' (sum of bottlenecks, then of totals)."""
        q = sim[g][0] if multi else (0.0, 0.0)
        return (round(own[g][0] + q[0], 9), round(own[g][1] + q[1], 9))

    def key(g: tuple[int, ...]) -> tuple:
        left = set(free) - set(g)
        return (fleet(g), _numa_spread(topo, g), _nic_spread(topo, g), -round(_kept_bandwidth(topo, left), 6), g)

    keys = {g: key(g) for g in groups}
    chosen = min(groups, key=keys.__getitem__)
    ck = keys[chosen]
    best_own = min(own.values())
    parts = []
    if k > 1:
        parts.append(f"best-linked {k} of free {','.join(map(str, free))}: worst link "
                     f"{describe(worst_link(topo, chosen))}" if own[chosen] == best_own else
                     f"{k} of free {','.join(map(str, free))}: worst link {describe(worst_link(topo, chosen))}")
    else:
        parts.append(f"1 of free {','.join(map(str, free))}")
    nodes = _nodes(topo, chosen)
    same_fleet = [g for g in groups if keys[g][0] == ck[0]]
    if nodes and k > 1 and any(keys[g][1] > ck[1] for g in same_fleet):
        parts.append(f"on NUMA node {nodes}" if ck[1] == 1 else f"over NUMA nodes {nodes} (fewest possible)")
    if multi:
        plan = sim[chosen][1]
        if own[chosen] != best_own:
            parts.append("not the best-linked group for itself: the queued jobs then get better links "
                         f"(fleet cost {ck[0][0]:.4f} vs {min(fleet(g) for g in groups if own[g] == best_own)[0]:.4f})")
        if plan and len({keys[g][0] for g in groups}) > 1:
            name, g = plan[0]
            m = len(g)
            when = "" if set(g) <= set(free) - set(chosen) else " once running jobs end"
            parts.append(f"leaves {','.join(map(str, g))} ({describe(worst_link(topo, g))}) for queued {name} "
                         f"({m} GPUs){when}")
    tied = [g for g in groups if keys[g][:3] == ck[:3]]
    if k == 1 and len({keys[g][3] for g in tied}) > 1:
        parts.append("the GPU least linked to the other free GPUs (keeps the best-linked ones together)")
    elif len(tied) > 1 and len({keys[g][3] for g in tied}) == 1 and len(parts) == 1:
        parts.append("all candidates equal: lowest indices")
    return Choice(chosen, "; ".join(parts))
