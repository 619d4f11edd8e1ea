"""Routes between devices: which directed link resources a message crosses.

Every duplex link is two resources (one per direction) with the link's bandwidth; every rank
device with a finite ``engine`` adds one half-duplex resource that all its sends and receives
share (between two cores of one host only the receiver's: see :meth:`Router.with_engines`).
A route is the widest path (largest bottleneck bandwidth, then lowest latency), never through
a core or GPU other than its ends, with ties broken by a hash of the source so that equal-cost
paths of a fat tree spread over its spine switches (ECMP).

Routing scales as two levels: within a host the search covers that host's devices only; between
hosts a route is source -> best NIC of its host -> the network (devices without a host, plus
NICs) -> best NIC of the destination's host -> destination, each part cached. Cost: one
Dijkstra over a host per device pair, one over the network per source NIC.
"""

from __future__ import annotations

import heapq
import math
from typing import NamedTuple

from ringworld.topology.model import ENDPOINT_KINDS, Topology, TopologyError


class Route(NamedTuple):
    """Resources crossed (ids into :attr:`Router.capacity`), total latency, bottleneck."""

    resources: tuple[int, ...]
    latency: float
    bottleneck: float


class Router:
    """Routes on one topology (cached); resources 0..2L-1 are link directions, then engines."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self.index = {d.id: i for i, d in enumerate(topo.devices)}
        n = len(topo.devices)
        self.kinds = [d.kind for d in topo.devices]
        self.host = [d.host for d in topo.devices]
        # adjacency: (neighbour, resource id of the direction leaving this node, bw, latency)
        self.adj: list[list[tuple[int, int, float, float]]] = [[] for _ in range(n)]
        self.capacity: list[float] = []
        self.link_of: list[int] = []  # resource -> link index (engines: -1)
        for li, ln in enumerate(topo.links):
            a, b = self.index[ln.a], self.index[ln.b]
            self.adj[a].append((b, len(self.capacity), ln.bandwidth, ln.latency))
            self.capacity.append(ln.bandwidth)
            self.link_of.append(li)
            self.adj[b].append((a, len(self.capacity), ln.bandwidth, ln.latency))
            self.capacity.append(ln.bandwidth)
            self.link_of.append(li)
        self.engine: dict[int, int] = {}
        for i, d in enumerate(topo.devices):
            if d.kind in ENDPOINT_KINDS and math.isfinite(d.params().engine):
                self.engine[i] = len(self.capacity)
                self.capacity.append(d.params().engine)
                self.link_of.append(-1)
        self.nics: dict[str | None, list[int]] = {}
        for i, d in enumerate(topo.devices):
            if d.kind == "nic":
                self.nics.setdefault(d.host, []).append(i)
        self._pairs: dict[tuple[int, int], Route] = {}
        self._local: dict[tuple[int, int], Route | None] = {}
        self._net: dict[int, dict[int, Route]] = {}
        self._best_nic: dict[int, tuple[int, Route] | None] = {}

    # ---------------------------------------------------------------------------- searches
    def _search(self, src: int, allowed: set[str | None] | None, stop: int | None,
                network: bool = False) -> dict[int, Route]:
        """Widest-then-shortest routes from ``src`` to every node reachable through nodes
        whose host is in ``allowed`` (all when None); stops early at ``stop``. ``network``:
        NICs of any host are reachable but do not forward."""
        best: dict[int, tuple[float, float]] = {src: (-math.inf, 0.0)}
        prev: dict[int, tuple[int, int]] = {}
        done: dict[int, Route] = {}
        salt = (src * 2654435761) & 0xFFFFFFFF
        heap: list[tuple[float, float, int, int]] = [(-math.inf, 0.0, 0, src)]
        while heap:
            nbw, lat, _, u = heapq.heappop(heap)
            if u in done:
                continue
            res: list[int] = []
            v = u
            while v != src:
                pv, rid = prev[v]
                res.append(rid)
                v = pv
            res.reverse()
            done[u] = Route(tuple(res), lat, -nbw if u != src else math.inf)
            if u == stop:
                break
            if u != src and (self.kinds[u] in ENDPOINT_KINDS
                             or (network and self.kinds[u] == "nic")):
                continue  # endpoints (and NICs of other hosts) never forward
            for v, rid, bw, ln_lat in self.adj[u]:
                if v in done or (allowed is not None and self.host[v] not in allowed
                                 and not (network and self.kinds[v] == "nic")):
                    continue
                key = (-min(-nbw, bw), lat + ln_lat)
                old = best.get(v)
                if old is None or key < old:
                    best[v] = key
                    prev[v] = (u, rid)
                    tie = ((salt ^ (v * 40503)) * 2654435761) & 0xFFFFFFFF
                    heapq.heappush(heap, (key[0], key[1], tie, v))
        return done

    def _within(self, a: int, b: int) -> Route | None:
        key = (a, b)
        if key not in self._local:
            found = self._search(a, {self.host[a]}, b).get(b)
            self._local[key] = found
        return self._local[key]

    def _nic_for(self, dev: int) -> tuple[int, Route] | None:
        if dev not in self._best_nic:
            best: tuple[int, Route] | None = None
            nics = self.nics.get(self.host[dev], [])
            # rail spreading: among equally good NICs, devices take them in turn
            order = sorted(range(len(nics)), key=lambda k: (k - dev) % max(1, len(nics)))
            for k in order:
                r = self._within(dev, nics[k]) if nics[k] != dev else Route((), 0.0, math.inf)
                if r is not None and (best is None or (-r.bottleneck, r.latency)
                                      < (-best[1].bottleneck, best[1].latency)):
                    best = (nics[k], r)
            self._best_nic[dev] = best
        return self._best_nic[dev]

    def _network(self, nic: int) -> dict[int, Route]:
        if nic not in self._net:
            self._net[nic] = self._search(nic, {None}, None, network=True)
        return self._net[nic]

    # ------------------------------------------------------------------------------ public
    def route(self, a: str, b: str) -> Route:
        """The route from device ``a`` to device ``b`` (no resources when a == b).

        Raises:
            TopologyError: unknown devices, or no path between them.
        """
        ia, ib = self.index.get(a), self.index.get(b)
        if ia is None or ib is None:
            raise TopologyError(f"no device {a if ia is None else b!r} in {self.topo.name!r}")
        key = (ia, ib)
        found = self._pairs.get(key)
        if found is None:
            found = self._compute(ia, ib)
            self._pairs[key] = found
        return found

    def _compute(self, ia: int, ib: int) -> Route:
        if ia == ib:
            return Route((), 0.0, math.inf)
        found: Route | None = None
        if self.host[ia] == self.host[ib]:
            found = self._within(ia, ib)
        else:
            na, nb = self._nic_for(ia), self._nic_for(ib)
            if na is not None and nb is not None:
                mid = self._network(na[0]).get(nb[0])
                if mid is not None:
                    last = self._within(nb[0], ib)
                    if last is not None:
                        parts = (na[1], mid, last)
                        found = Route(tuple(r for p in parts for r in p.resources),
                                      sum(p.latency for p in parts),
                                      min(p.bottleneck for p in parts))
        if found is None:  # no host structure to exploit: search the whole graph
            found = self._search(ia, None, ib).get(ib)
        if found is None:
            raise TopologyError(f"no path from {self.topo.devices[ia].id!r} to "
                                f"{self.topo.devices[ib].id!r} in {self.topo.name!r}")
        return found

    def path(self, a: str, b: str) -> list[str]:
        """The devices a route from ``a`` to ``b`` visits, in order (for display)."""
        r = self.route(a, b)
        out = [a]
        for rid in r.resources:
            li = self.link_of[rid]
            ln = self.topo.links[li]
            out.append(ln.b if ln.a == out[-1] else ln.a)
        return out

    def with_engines(self, a: str, b: str) -> Route:
        """The route plus the engine resources of both ends (each once).

        Between two CPU cores of one host only the receiver's: over shared memory the
        receiver copies a large message straight out of the sender's memory, and the sender
        does nothing meanwhile (so an exchange costs each rank one copy, as one-way traffic).
        """
        r = self.route(a, b)
        ia, ib = self.index[a], self.index[b]
        da, db = self.topo.devices[ia], self.topo.devices[ib]
        ends = (ib,) if da.kind == db.kind == "core" and da.host == db.host else (ia, ib)
        extra = [self.engine[i] for i in dict.fromkeys(ends) if i in self.engine]
        if not extra:
            return r
        caps = [r.bottleneck] + [self.capacity[e] for e in extra]
        return Route(r.resources + tuple(extra), r.latency, min(caps))
