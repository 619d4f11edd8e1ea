"""Discover the machine this runs on: cores and NUMA nodes from /sys, GPUs from nvidia-smi.

:func:`discover` reads ``<sysfs>/devices/system/cpu/online`` and, per NUMA node,
``<sysfs>/devices/system/node/node<N>/cpulist`` (one node with every online CPU when the node
directory is absent, as in some containers), then asks ``nvidia-smi topo -m`` for GPUs, NICs and
the links between them when the tool exists. Nothing here needs a GPU or root: a missing file
or tool only adds a note. ``sysfs`` is a parameter so that tests run on fake trees.

The result is a host of ``numa<N>`` (kind ``cpu``) devices joined by ``smp`` links, ``core<N>``
devices on them (``mem`` links), and, from nvidia-smi, ``gpu<N>``/``nic<N>`` devices under
``pcie<N>`` switches (GPUs reported ``PIX`` to each other share one) plus ``nvlink`` links with
the reported lane count. Ranks are the GPUs when there are any, else the cores.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ringworld.topology.model import Device, Link, Topology, build
from ringworld.topology.presets import NVLINK2, PCIE3_X16, PCIE_LAT, QPI

MEM_BANDWIDTH = 20e9   # bytes/s between a core and its node's memory, each way (nominal)
NVLINK_LANE = NVLINK2  # bytes/s per NVLink lane each way (V100; nvidia-smi does not say)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(slots=True)
class Discovery:
    """What :func:`discover` found, and what it could not find (``notes``)."""

    topology: Topology
    cores: int
    numa_nodes: int
    gpus: int
    notes: list[str] = field(default_factory=list)


def parse_cpulist(text: str) -> list[int]:
    """``0-3,8,10-11`` -> [0, 1, 2, 3, 8, 10, 11].

    Raises:
        ValueError: not a CPU list.
    """
    out: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        a, b = int(lo), int(hi) if hi else int(lo)
        if b < a:
            raise ValueError(f"bad CPU range {part!r}")
        out.extend(range(a, b + 1))
    return out


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def read_cpus(sysfs: Path, notes: list[str]) -> dict[int, list[int]]:
    """NUMA node -> its online CPUs, from ``sysfs`` (one node 0 when nodes are not exposed)."""
    online_text = _read(sysfs / "devices/system/cpu/online")
    online: list[int] | None = None
    if online_text is not None:
        try:
            online = parse_cpulist(online_text)
        except ValueError:
            notes.append(f"unreadable {sysfs}/devices/system/cpu/online: {online_text!r}")
    nodes: dict[int, list[int]] = {}
    node_dir = sysfs / "devices/system/node"
    if node_dir.is_dir():
        for entry in sorted(node_dir.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
            text = _read(entry / "cpulist")
            if text is None:
                continue
            try:
                cpus = parse_cpulist(text)
            except ValueError:
                notes.append(f"unreadable {entry}/cpulist: {text!r}")
                continue
            if online is not None:
                cpus = [c for c in cpus if c in set(online)]
            nodes[int(entry.name[4:])] = cpus
    if not nodes:
        if online is None:
            count = os.cpu_count() or 1
            notes.append(f"no CPU list under {sysfs}; assuming {count} CPUs (os.cpu_count)")
            online = list(range(count))
        else:
            notes.append(f"no NUMA nodes under {node_dir}; one node holds every CPU")
        nodes[0] = online
    return nodes


@dataclass(slots=True)
class SmiTopo:
    """``nvidia-smi topo -m`` as a matrix: device names and the relation of each pair."""

    names: list[str]
    relation: dict[tuple[str, str], str]
    numa: dict[str, int]


def parse_smi_topo(text: str) -> SmiTopo:
    """Parse the matrix printed by ``nvidia-smi topo -m`` (tabs, optional ANSI underlines).

    Rows and columns named ``GPU<N>``, ``NIC<N>`` or ``mlx5_<N>`` (older versions) are kept;
    the ``NUMA Affinity`` column, when present, gives each GPU's node.

    Raises:
        ValueError: no matrix header with GPU columns was found.
    """
    lines = [_ANSI.sub("", ln).rstrip("\n") for ln in text.splitlines()]
    header_at = next((i for i, ln in enumerate(lines) if re.search(r"\tGPU0\b", ln)), None)
    if header_at is None:
        raise ValueError("no nvidia-smi topology matrix (no GPU0 column)")
    cols = [c.strip() for c in lines[header_at].split("\t")][1:]
    dev_cols = [c for c in cols if re.fullmatch(r"GPU\d+|NIC\d+|mlx\d+_\d+", c)]
    numa_col = cols.index("NUMA Affinity") if "NUMA Affinity" in cols else None
    relation: dict[tuple[str, str], str] = {}
    numa: dict[str, int] = {}
    names: list[str] = []
    for ln in lines[header_at + 1:]:
        if not ln.strip():
            break
        cells = [c.strip() for c in ln.split("\t")]
        row, vals = cells[0], cells[1:]
        if row not in dev_cols:
            continue
        names.append(row)
        for col, val in zip(cols, vals, strict=False):
            if col in dev_cols and col != row:
                relation[(row, col)] = val
        if numa_col is not None and numa_col < len(vals) and vals[numa_col].isdigit():
            numa[row] = int(vals[numa_col])
    return SmiTopo(names, relation, numa)


def smi_devices(smi: SmiTopo, host: str, numa_ids: list[int]
                ) -> tuple[list[Device], list[Link]]:
    """GPU, NIC and PCIe-switch devices and their links from a parsed matrix.

    Devices reported ``PIX`` to each other share one PCIe switch; each switch hangs off the
    NUMA node of its first device (node 0 when unknown); ``NV<k>`` adds an NVLink of k lanes.
    """
    parent = {name: name for name in smi.names}

    def find(x: str) -> str:
        while parent[x] != x:
            x = parent[x]
        return x

    for (a, b), rel in smi.relation.items():
        if rel == "PIX" and a in parent and b in parent:
            parent[find(a)] = find(b)
    roots: dict[str, int] = {}
    group = {name: roots.setdefault(find(name), len(roots)) for name in smi.names}
    devs: list[Device] = []
    links: list[Link] = []
    seen_switch: set[int] = set()
    gpu_i = nic_i = 0
    ids: dict[str, str] = {}
    for name in smi.names:
        g = group[name]
        node = smi.numa.get(name, numa_ids[0] if numa_ids else 0)
        if node not in numa_ids:
            node = numa_ids[0] if numa_ids else 0
        if g not in seen_switch:
            seen_switch.add(g)
            devs.append(Device(f"pcie{g}", "pcie", host, "PCIe switch"))
            links.append(Link(f"pcie{g}", f"numa{node}", "pcie", PCIE3_X16, PCIE_LAT))
        if name.startswith("GPU"):
            ident = f"gpu{gpu_i}"
            gpu_i += 1
            devs.append(Device(ident, "gpu", host, name))
        else:
            ident = f"nic{nic_i}"
            nic_i += 1
            devs.append(Device(ident, "nic", host, name))
        ids[name] = ident
        links.append(Link(ident, f"pcie{g}", "pcie", PCIE3_X16, PCIE_LAT))
    for (a, b), rel in smi.relation.items():
        m = re.fullmatch(r"NV(\d+)", rel)
        if m and a < b and a in ids and b in ids:
            lanes = int(m.group(1))
            links.append(Link(ids[a], ids[b], "nvlink", lanes * NVLINK_LANE, 0.7e-6, lanes))
    return devs, links


def run_nvidia_smi(timeout: float = 10.0) -> str | None:
    """The output of ``nvidia-smi topo -m``, or None when the tool is absent or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True,
                              timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def discover(sysfs: str | Path = "/sys", *,
             nvidia_smi: Callable[[], str | None] = run_nvidia_smi,
             host: str | None = None) -> Discovery:
    """Describe this machine as a :class:`Topology` of one host.

    Never raises for a missing or odd /sys or a missing nvidia-smi: it records a note instead.
    Cost: a few small file reads and at most one ``nvidia-smi`` run (10 s timeout).
    """
    notes: list[str] = []
    host = host or socket.gethostname() or "localhost"
    nodes = read_cpus(Path(sysfs), notes)
    devs: list[Device] = []
    links: list[Link] = []
    node_ids = sorted(nodes)
    for n in node_ids:
        devs.append(Device(f"numa{n}", "cpu", host, f"NUMA node {n}"))
    for i, a in enumerate(node_ids):
        for b in node_ids[i + 1:]:
            links.append(Link(f"numa{a}", f"numa{b}", "smp", QPI, 1e-7))
    cores = 0
    for n in node_ids:
        for c in nodes[n]:
            devs.append(Device(f"core{c}", "core", host, f"CPU {c}"))
            links.append(Link(f"core{c}", f"numa{n}", "mem", MEM_BANDWIDTH, 0.0))
            cores += 1
    gpus = 0
    text = nvidia_smi()
    if text is None:
        notes.append("no GPUs: nvidia-smi is absent or failed")
    else:
        try:
            smi = parse_smi_topo(text)
        except ValueError as exc:
            notes.append(f"no GPUs: {exc}")
        else:
            gdevs, glinks = smi_devices(smi, host, node_ids)
            devs += gdevs
            links += glinks
            gpus = sum(1 for d in gdevs if d.kind == "gpu")
    topo = build(f"local:{host}", devs, links)
    return Discovery(topo, cores, len(node_ids), gpus, notes)
