"""Searches over a topology: ring orders (NCCL-style), locality orders, broadcast trees.

:func:`find_rings` looks for Hamiltonian cycles over the ranks that maximise the bottleneck
bandwidth: a binary search over the distinct route bandwidths, each threshold tested by a
depth-first search (fastest edges first, a node budget so it always ends). After a ring is
found, the bandwidth it uses is taken off every link direction it crosses, and the next ring is
searched on what is left, as NCCL does; on the DGX-1V this yields the NVLink rings. Worlds of
more than :data:`EXACT_MAX` ranks are searched per host and the hosts chained.

:func:`locality_order` lists the ranks by a depth-first walk of the device graph from the
root's device, widest links first, so that ranks close to each other are adjacent (hosts
contiguous, PCIe switches contiguous). :func:`improve_order` is a swap local search of such an
order against any cost function (the simulator).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from ringworld.topology.sim import Network

EXACT_MAX = 16       # ranks searched as one Hamiltonian-cycle problem
NODE_BUDGET = 200_000


def pair_bandwidth(net: Network, ranks: Sequence[int],
                   remaining: Sequence[float] | None = None) -> list[list[float]]:
    """bw[i][j]: the bottleneck of the route from ranks[i] to ranks[j] (links only), under
    ``remaining`` capacities when given."""
    rt = net.router
    out = []
    for a in ranks:
        row = []
        for b in ranks:
            if a == b:
                row.append(0.0)
                continue
            r = rt.route(net.topo.ranks[a], net.topo.ranks[b])
            caps = [remaining[x] if remaining is not None else rt.capacity[x]
                    for x in r.resources]
            row.append(min(caps) if caps else math.inf)
        out.append(row)
    return out


def _cycle(bw: list[list[float]], t: float, budget: list[int]) -> list[int] | None:
    """A Hamiltonian cycle from node 0 using edges of bandwidth >= t, or None."""
    n = len(bw)
    if n == 1:
        return [0]
    nbrs = [sorted((j for j in range(n) if j != i and bw[i][j] >= t), key=lambda j: -bw[i][j])
            for i in range(n)]
    path = [0]
    used = [False] * n
    used[0] = True

    def dfs() -> bool:
        budget[0] -= 1
        if budget[0] < 0:
            return False
        u = path[-1]
        if len(path) == n:
            return bw[u][0] >= t
        for v in nbrs[u]:
            if not used[v]:
                used[v] = True
                path.append(v)
                if dfs():
                    return True
                path.pop()
                used[v] = False
        return False

    return list(path) if dfs() else None


def best_cycle(bw: list[list[float]]) -> tuple[list[int], float] | None:
    """The cycle with the largest bottleneck found within the budget, and that bottleneck."""
    n = len(bw)
    if n == 1:
        return [0], math.inf
    values = sorted({v for row in bw for v in row if v > 0}, reverse=True)
    lo, hi = 0, len(values) - 1  # find the smallest index (largest t) that works
    found: tuple[list[int], float] | None = None
    while lo <= hi:
        mid = (lo + hi) // 2
        cyc = _cycle(bw, values[mid], [NODE_BUDGET])
        if cyc is not None:
            found = (cyc, min(bw[cyc[i]][cyc[(i + 1) % n]] for i in range(n)))
            hi = mid - 1
        else:
            lo = mid + 1
    return found


def find_rings(net: Network, max_rings: int = 4) -> list[tuple[list[int], float]]:
    """Up to ``max_rings`` rank orders with their bottleneck bandwidths, best first; each
    later ring uses only the bandwidth left by the earlier ones. Cost: exponential in the worst
    case per host, bounded by NODE_BUDGET DFS nodes per threshold."""
    p = net.p
    if p <= EXACT_MAX:
        remaining = list(net.router.capacity)
        rings: list[tuple[list[int], float]] = []
        for _ in range(max_rings):
            bw = pair_bandwidth(net, range(p), remaining)
            got = best_cycle(bw)
            if got is None or not got[1] > 0 or (rings and got[1] < rings[0][1] / 8):
                break
            order, b = got
            rings.append((order, b))
            if p == 1 or math.isinf(b):
                break
            for i in range(p):
                rt = net.router.route(net.topo.ranks[order[i]],
                                      net.topo.ranks[order[(i + 1) % p]])
                for x in rt.resources:
                    remaining[x] = max(0.0, remaining[x] - b)
        return rings
    # large worlds: a ring inside each host, hosts chained in order
    by_host: dict[str | None, list[int]] = {}
    for r, h in enumerate(net.topo.hosts()):
        by_host.setdefault(h, []).append(r)
    chained: list[int] = []
    for members in by_host.values():
        if 2 < len(members) <= EXACT_MAX:
            got = best_cycle(pair_bandwidth(net, members))
            if got is not None:
                chained += [members[i] for i in got[0]]
                continue
        chained += members
    bneck = min(pair_bandwidth_one(net, chained[i], chained[(i + 1) % p]) for i in range(p))
    return [(chained, bneck)]


def pair_bandwidth_one(net: Network, a: int, b: int) -> float:
    """The link bottleneck from rank a to rank b."""
    return net.router.route(net.topo.ranks[a], net.topo.ranks[b]).bottleneck


def ring_link_kinds(net: Network, order: Sequence[int]) -> set[str]:
    """The kinds of every link the ring ``order`` crosses."""
    kinds: set[str] = set()
    p = len(order)
    for i in range(p):
        r = net.router.route(net.topo.ranks[order[i]], net.topo.ranks[order[(i + 1) % p]])
        for x in r.resources:
            li = net.router.link_of[x]
            if li >= 0:
                kinds.add(net.topo.links[li].kind)
    return kinds


def locality_order(net: Network, root: int = 0) -> list[int]:
    """Ranks in depth-first order of the device graph from the root's device (at each device
    its rank-holding neighbours first, then the others, widest links first); the root comes
    first. Cost: O(devices + links)."""
    rt = net.router
    by_dev: dict[int, list[int]] = {}
    for r, d in enumerate(net.topo.ranks):
        by_dev.setdefault(rt.index[d], []).append(r)
    endpoint = set(by_dev)

    def nbrs(u: int) -> list[int]:
        edges = sorted(rt.adj[u], key=lambda e: (e[0] not in endpoint, -e[2], e[0]))
        return [v for v, _, _, _ in edges]

    start = rt.index[net.topo.ranks[root]]
    seen = {start}
    out = sorted(by_dev.get(start, []), key=lambda r: (r != root, r))
    stack = [iter(nbrs(start))]
    while stack:
        v = next(stack[-1], None)
        if v is None:
            stack.pop()
            continue
        if v in seen:
            continue
        seen.add(v)
        out += by_dev.get(v, [])
        stack.append(iter(nbrs(v)))
    placed = set(out)
    return out + [r for r in range(net.p) if r not in placed]


def improve_order(order: Sequence[int], cost: Callable[[list[int]], float],
                  budget: int = 200) -> tuple[list[int], float]:
    """Swap positions 1.. of ``order`` while ``cost`` improves (the root at position 0 stays);
    at most ``budget`` evaluations."""
    best = list(order)
    best_cost = cost(best)
    evals = 1
    improved = True
    while improved and evals < budget:
        improved = False
        for i in range(1, len(best)):
            for j in range(i + 1, len(best)):
                if evals >= budget:
                    break
                trial = list(best)
                trial[i], trial[j] = trial[j], trial[i]
                c = cost(trial)
                evals += 1
                if c < best_cost * (1 - 1e-9):
                    best, best_cost, improved = trial, c, True
    return best, best_cost
