"""The topology model: devices, links between them, and which devices hold the ranks.

A topology is data (NCCL's XML dump/load, here JSON): :class:`Device` nodes of a few kinds,
:class:`Link` edges with a bandwidth (bytes/s in each direction) and a latency (seconds), and
``ranks``, the device of each rank in rank order (a device may hold several ranks). The JSON
format, written by :func:`dump` and read by :func:`load`, is documented in ``docs/topology.md``::

    {"format": "ringworld-topology", "version": 1, "name": "seed-pcie-4gpu",
     "devices": [{"id": "gpu0", "kind": "gpu", "host": "node0"}, ...],
     "links": [{"a": "gpu0", "b": "pcie0", "kind": "pcie", "bandwidth": 12e9,
                "latency": 1e-6, "count": 1}, ...],
     "ranks": ["gpu0", "gpu1", "gpu2", "gpu3"]}

Device kinds: ``host`` (a whole machine seen as one node), ``cpu`` (a socket or NUMA node),
``core``, ``gpu``, ``nic``, ``pcie`` (a PCIe switch or root complex), ``nvswitch`` and
``switch`` (a network switch). Ranks live on ``core`` and ``gpu`` devices, which never forward
other devices' traffic. A device may carry the simulator's per-rank constants (``overhead``,
``message``, ``engine``, ``reduce_rate``, ``copy_rate``, ``rendezvous``, ``eager``); unset ones
come from :data:`KIND_PARAMS`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ringworld.config import DEFAULT_EAGER_BYTES

FORMAT = "ringworld-topology"
VERSION = 1

DEVICE_KINDS = ("host", "cpu", "core", "gpu", "nic", "pcie", "nvswitch", "switch")
ENDPOINT_KINDS = frozenset({"core", "gpu"})  # hold ranks; never forward others' traffic
LINK_KINDS = ("pcie", "nvlink", "smp", "mem", "net")


class TopologyError(ValueError):
    """A topology is malformed, names an unknown device, or two devices have no path."""


@dataclass(frozen=True, slots=True)
class Params:
    """What one rank costs on its device, in the simulator.

    ``overhead``: seconds before a step's messages are posted (software, kernel launch);
    ``message``: seconds per extra message in a step; ``engine``: bytes/s the device can send
    plus receive in total (``inf``: limited by links only; a CPU rank copies every byte it
    moves through shared memory itself); ``reduce_rate``/``copy_rate``: bytes/s of local work;
    ``rendezvous``: seconds added to a message of more than ``eager`` bytes (the handshake of a
    large message), charged by its sender's constants.
    """

    overhead: float
    message: float
    engine: float
    reduce_rate: float
    copy_rate: float
    rendezvous: float = 0.0
    eager: float = math.inf


PARAM_FIELDS = tuple(f.name for f in fields(Params))

KIND_PARAMS: dict[str, Params] = {
    # a Python rank on a CPU core: the reference machine's measured shared-memory constants
    # (ringworld.tuning.estimate.core_params of tuning.constants.DEFAULTS["shm"]; a test keeps
    # the two equal; ringworld calibrate measures this machine's)
    "core": Params(overhead=51e-6, message=15e-6, engine=4.3e9 / 2, reduce_rate=4.5e9,
                   copy_rate=4.4e9, rendezvous=0.0, eager=DEFAULT_EAGER_BYTES),
    # a GPU driven by a kernel per step (NCCL-like): launch overhead, HBM-speed local work
    "gpu": Params(5e-6, 1e-6, math.inf, 400e9, 400e9),
}


@dataclass(frozen=True, slots=True)
class Device:
    """A node of the topology; the optional fields override :data:`KIND_PARAMS`."""

    id: str
    kind: str
    host: str | None = None
    label: str = ""
    overhead: float | None = None
    message: float | None = None
    engine: float | None = None
    reduce_rate: float | None = None
    copy_rate: float | None = None
    rendezvous: float | None = None
    eager: float | None = None

    def params(self) -> Params:
        """This device's simulator constants (its own, else its kind's, else a core's)."""
        base = KIND_PARAMS.get(self.kind, KIND_PARAMS["core"])
        own = {n: getattr(self, n) for n in PARAM_FIELDS}
        return replace(base, **{n: v for n, v in own.items() if v is not None})


@dataclass(frozen=True, slots=True)
class Link:
    """A duplex link: ``bandwidth`` bytes/s each way, ``latency`` s; ``count`` parallel lanes
    (NVLinks between a GPU pair) already included in ``bandwidth``."""

    a: str
    b: str
    kind: str
    bandwidth: float
    latency: float = 0.0
    count: int = 1


@dataclass(frozen=True, slots=True)
class Topology:
    """Devices, links and the device of each rank; checked on construction.

    Raises:
        TopologyError: unknown kinds, duplicate ids, links to unknown devices, bad numbers, or
            ranks on devices that are not cores or GPUs.
    """

    name: str
    devices: tuple[Device, ...]
    links: tuple[Link, ...]
    ranks: tuple[str, ...]
    by_id: Mapping[str, Device] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_id: dict[str, Device] = {}
        for d in self.devices:
            if d.kind not in DEVICE_KINDS:
                raise TopologyError(f"device {d.id!r}: kind {d.kind!r} is not one of "
                                    f"{', '.join(DEVICE_KINDS)}")
            if d.id in by_id:
                raise TopologyError(f"device id {d.id!r} appears twice")
            for f in ("overhead", "message", "engine", "reduce_rate", "copy_rate"):
                v = getattr(d, f)
                if v is not None and not v >= 0:
                    raise TopologyError(f"device {d.id!r}: {f}={v} must be >= 0")
            by_id[d.id] = d
        for ln in self.links:
            for end in (ln.a, ln.b):
                if end not in by_id:
                    raise TopologyError(f"link {ln.a}-{ln.b}: unknown device {end!r}")
            if ln.a == ln.b:
                raise TopologyError(f"link {ln.a}-{ln.b} joins a device to itself")
            if ln.kind not in LINK_KINDS:
                raise TopologyError(f"link {ln.a}-{ln.b}: kind {ln.kind!r} is not one of "
                                    f"{', '.join(LINK_KINDS)}")
            if not ln.bandwidth > 0 or not ln.latency >= 0 or ln.count < 1:
                raise TopologyError(f"link {ln.a}-{ln.b}: bandwidth {ln.bandwidth} must be > 0,"
                                    f" latency {ln.latency} >= 0, count {ln.count} >= 1")
        for r in self.ranks:
            if r not in by_id:
                raise TopologyError(f"rank on unknown device {r!r}")
            if by_id[r].kind not in ENDPOINT_KINDS:
                raise TopologyError(f"rank on device {r!r} of kind {by_id[r].kind!r}; ranks "
                                    "live on cores and GPUs")
        object.__setattr__(self, "by_id", by_id)

    @property
    def size(self) -> int:
        """Number of ranks."""
        return len(self.ranks)

    def device(self, ident: str) -> Device:
        """The device ``ident``.

        Raises:
            TopologyError: no such device.
        """
        try:
            return self.by_id[ident]
        except KeyError:
            raise TopologyError(f"no device {ident!r} in topology {self.name!r}") from None

    def hosts(self) -> list[str | None]:
        """The host of each rank, in rank order."""
        return [self.by_id[r].host for r in self.ranks]

    def with_ranks(self, n: int) -> Topology:
        """The same machine with ``n`` ranks: the first n rank devices, reused round-robin
        when n exceeds them (ranks then share a device).

        Raises:
            TopologyError: n < 1 or the topology has no rank devices.
        """
        if n < 1:
            raise TopologyError(f"ranks={n} must be at least 1")
        if not self.ranks:
            raise TopologyError(f"topology {self.name!r} has no rank devices")
        ranks = tuple(self.ranks[i % len(self.ranks)] for i in range(n))
        return replace(self, ranks=ranks)

    def with_params(self, kind: str, params: Params) -> Topology:
        """A copy where every device of ``kind`` carries ``params`` (e.g. calibrated ones)."""
        devices = tuple(replace(d, **{n: getattr(params, n) for n in PARAM_FIELDS})
                        if d.kind == kind else d for d in self.devices)
        return replace(self, devices=devices)

    def summary(self) -> str:
        """A few lines: devices by kind, links by kind, ranks by host."""
        kinds: dict[str, int] = {}
        for d in self.devices:
            kinds[d.kind] = kinds.get(d.kind, 0) + 1
        lk: dict[str, list[float]] = {}
        for ln in self.links:
            lk.setdefault(ln.kind, []).append(ln.bandwidth)
        hosts = set(self.hosts())
        lines = [f"topology {self.name}: {self.size} ranks on {len(hosts)} host(s)",
                 "  devices: " + ", ".join(f"{n} {k}" for k, n in kinds.items())]
        for k, bws in lk.items():
            lines.append(f"  {k} links: {len(bws)}, {min(bws) / 1e9:.3g}..{max(bws) / 1e9:.3g}"
                         " GB/s each way")
        return "\n".join(lines)


# ------------------------------------------------------------------------------------- JSON
_DEVICE_FIELDS = [f.name for f in fields(Device)]


def to_json(topo: Topology) -> dict[str, Any]:
    """The topology as a JSON-ready dict (unset optional fields left out)."""
    devices = []
    for d in topo.devices:
        row: dict[str, Any] = {"id": d.id, "kind": d.kind}
        for name in _DEVICE_FIELDS[2:]:
            v = getattr(d, name)
            if v is not None and v != "":
                row[name] = v
        devices.append(row)
    links = [{"a": ln.a, "b": ln.b, "kind": ln.kind, "bandwidth": ln.bandwidth,
              "latency": ln.latency, "count": ln.count} for ln in topo.links]
    return {"format": FORMAT, "version": VERSION, "name": topo.name, "devices": devices,
            "links": links, "ranks": list(topo.ranks)}


def from_json(doc: Mapping[str, Any]) -> Topology:
    """A topology from :func:`to_json`'s shape.

    Raises:
        TopologyError: wrong format or version, missing or mistyped fields.
    """
    if doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise TopologyError(f"not a {FORMAT} version {VERSION} document (format="
                            f"{doc.get('format')!r}, version={doc.get('version')!r})")
    try:
        devices = tuple(Device(**{k: v for k, v in row.items() if k in _DEVICE_FIELDS})
                        for row in doc["devices"])
        links = tuple(Link(a=str(row["a"]), b=str(row["b"]), kind=str(row["kind"]),
                           bandwidth=float(row["bandwidth"]),
                           latency=float(row.get("latency", 0.0)),
                           count=int(row.get("count", 1))) for row in doc["links"])
        ranks = tuple(str(r) for r in doc.get("ranks", ()))
        name = str(doc.get("name", "unnamed"))
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, TopologyError):
            raise
        raise TopologyError(f"malformed topology document: {exc!r}") from exc
    return Topology(name, devices, links, ranks)


def dump(topo: Topology, path: str | Path) -> None:
    """Write ``topo`` as JSON to ``path``.

    Raises:
        OSError: the file cannot be written.
    """
    Path(path).write_text(json.dumps(to_json(topo), indent=1) + "\n")


def load(path: str | Path) -> Topology:
    """Read a topology JSON file.

    Raises:
        TopologyError: unreadable, not JSON, or not a valid topology.
    """
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise TopologyError(f"{path}: cannot read a topology ({exc})") from exc
    if not isinstance(doc, dict):
        raise TopologyError(f"{path}: a topology is a JSON object")
    return from_json(doc)


def build(name: str, devices: Iterable[Device], links: Iterable[Link],
          ranks: Sequence[str] | None = None) -> Topology:
    """A topology whose ranks are, unless given, its GPUs (else its cores) in device order."""
    devs = tuple(devices)
    if ranks is None:
        gpus = [d.id for d in devs if d.kind == "gpu"]
        ranks = gpus or [d.id for d in devs if d.kind == "core"]
    return Topology(name, devs, tuple(links), tuple(ranks))
