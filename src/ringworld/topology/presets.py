"""Built-in topologies, and :func:`resolve` for ``--topology NAME|FILE``.

``seed-pcie-4gpu``  the seed's example: one CPU root complex, two PCIe switches, GPU0 and GPU1
                    under the first, GPU2 and GPU3 under the second (PCIe 3.0 x16, 12 GB/s).
``dgx1v``           the DGX-1V: 8 V100 in a hybrid cube-mesh of NVLinks (25 GB/s per link per
                    direction, one or two links per pair as ``nvidia-smi topo -m`` shows NV1 and
                    NV2), four PCIe switches with two GPUs and one 100 Gb/s NIC each, two CPUs
                    joined by QPI.
``cluster:H:K[:NIC_GBPS[:INTRA_GBS]]``  H hosts of K GPUs on an NVSwitch (INTRA_GBS GB/s per
                    GPU, default 150), one NIC per host (NIC_GBPS Gb/s, default 100) on one
                    network switch.
``fattree:K[:R[:NIC_GBPS]]``  a k-ary fat tree (K even): K pods of K/2 edge and K/2
                    aggregation switches, (K/2)^2 core switches, K^3/4 hosts of R GPUs (default
                    1) built like a cluster host; every network link NIC_GBPS Gb/s.
``local``           this machine (:func:`ringworld.topology.discover.discover`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ringworld.topology.model import Device, Link, Topology, TopologyError, build, load

GB = 1e9
PCIE3_X16 = 12 * GB      # bytes/s each way, what PCIe 3.0 x16 delivers in practice
PCIE4_X16 = 24 * GB
NVLINK2 = 25 * GB        # one V100 NVLink, each way
QPI = 20 * GB
PCIE_LAT = 1e-6          # per PCIe hop
NVLINK_LAT = 0.7e-6
NET_LAT = 1.5e-6         # per network hop (NIC or switch port)

# DGX-1V NVLink lanes per GPU pair (nvidia-smi topo -m: NV1 = 1, NV2 = 2); each GPU has six
DGX1V_NVLINKS: dict[tuple[int, int], int] = {
    (0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2,
    (1, 2): 2, (1, 3): 1, (1, 5): 2,
    (2, 3): 2, (2, 6): 1,
    (3, 7): 1,
    (4, 5): 1, (4, 6): 1, (4, 7): 2,
    (5, 6): 2, (5, 7): 1,
    (6, 7): 2,
}


def seed_pcie_4gpu() -> Topology:
    """The seed's PCIe tree of four GPUs."""
    devs = [Device("cpu0", "cpu", "node0", "root complex"),
            Device("pcie0", "pcie", "node0", "PCIe switch"),
            Device("pcie1", "pcie", "node0", "PCIe switch")]
    links = [Link("pcie0", "cpu0", "pcie", PCIE3_X16, PCIE_LAT),
             Link("pcie1", "cpu0", "pcie", PCIE3_X16, PCIE_LAT)]
    for g in range(4):
        devs.append(Device(f"gpu{g}", "gpu", "node0", "GPU"))
        links.append(Link(f"gpu{g}", f"pcie{g // 2}", "pcie", PCIE3_X16, PCIE_LAT))
    return build("seed-pcie-4gpu", devs, links)


def dgx1v() -> Topology:
    """The DGX-1V: hybrid cube-mesh NVLink, PCIe tree, two CPUs."""
    h = "dgx1v"
    devs = [Device("cpu0", "cpu", h, "Xeon E5-2698 v4"), Device("cpu1", "cpu", h,
                                                                 "Xeon E5-2698 v4")]
    links = [Link("cpu0", "cpu1", "smp", QPI, 1e-6)]
    for s in range(4):
        devs += [Device(f"pcie{s}", "pcie", h, "PLX PCIe switch"),
                 Device(f"nic{s}", "nic", h, "100 Gb/s EDR InfiniBand")]
        links += [Link(f"pcie{s}", f"cpu{s // 2}", "pcie", PCIE3_X16, PCIE_LAT),
                  Link(f"nic{s}", f"pcie{s}", "pcie", PCIE3_X16, PCIE_LAT)]
    for g in range(8):
        devs.append(Device(f"gpu{g}", "gpu", h, "Tesla V100-SXM2"))
        links.append(Link(f"gpu{g}", f"pcie{g // 2}", "pcie", PCIE3_X16, PCIE_LAT))
    for (a, b), n in DGX1V_NVLINKS.items():
        links.append(Link(f"gpu{a}", f"gpu{b}", "nvlink", n * NVLINK2, NVLINK_LAT, n))
    return build("dgx1v", devs, links)


def _host(h: str, k: int, intra: float, devs: list[Device], links: list[Link]) -> str:
    """Add one cluster host (K GPUs on an NVSwitch, a PCIe switch, a CPU, a NIC); its NIC id."""
    devs += [Device(f"{h}.cpu", "cpu", h), Device(f"{h}.pcie", "pcie", h),
             Device(f"{h}.nvsw", "nvswitch", h), Device(f"{h}.nic", "nic", h)]
    links += [Link(f"{h}.pcie", f"{h}.cpu", "pcie", PCIE4_X16, PCIE_LAT),
              Link(f"{h}.nic", f"{h}.pcie", "pcie", PCIE4_X16, PCIE_LAT)]
    for g in range(k):
        devs.append(Device(f"{h}.gpu{g}", "gpu", h))
        links += [Link(f"{h}.gpu{g}", f"{h}.nvsw", "nvlink", intra, NVLINK_LAT),
                  Link(f"{h}.gpu{g}", f"{h}.pcie", "pcie", PCIE4_X16, PCIE_LAT)]
    return f"{h}.nic"


def cluster(hosts: int, per_host: int, nic_gbps: float = 100.0,
            intra_gbs: float = 150.0) -> Topology:
    """``hosts`` hosts of ``per_host`` GPUs each, one NIC per host, one network switch.

    Raises:
        TopologyError: a count below 1 or a bandwidth not above 0.
    """
    if hosts < 1 or per_host < 1 or nic_gbps <= 0 or intra_gbs <= 0:
        raise TopologyError(f"cluster:{hosts}:{per_host}:{nic_gbps}:{intra_gbs}: counts must "
                            "be >= 1 and bandwidths > 0")
    devs: list[Device] = [Device("switch", "switch", None, "network switch")]
    links: list[Link] = []
    for i in range(hosts):
        nic = _host(f"h{i}", per_host, intra_gbs * GB, devs, links)
        links.append(Link(nic, "switch", "net", nic_gbps * GB / 8, NET_LAT))
    return build(f"cluster:{hosts}:{per_host}:{nic_gbps:g}:{intra_gbs:g}", devs, links)


def fattree(k: int, per_host: int = 1, nic_gbps: float = 100.0) -> Topology:
    """A k-ary fat tree of k^3/4 hosts with ``per_host`` GPUs each.

    Raises:
        TopologyError: k not even and >= 2, or other counts below 1.
    """
    if k < 2 or k % 2 or per_host < 1 or nic_gbps <= 0:
        raise TopologyError(f"fattree:{k}:{per_host}:{nic_gbps}: k must be even and >= 2, "
                            "ranks per host >= 1, bandwidth > 0")
    half = k // 2
    bw = nic_gbps * GB / 8
    devs: list[Device] = []
    links: list[Link] = []
    for i in range(half):
        for j in range(half):
            devs.append(Device(f"core{i}.{j}", "switch"))
    host = 0
    for pod in range(k):
        for a in range(half):
            devs.append(Device(f"agg{pod}.{a}", "switch"))
            links += [Link(f"agg{pod}.{a}", f"core{a}.{j}", "net", bw, NET_LAT)
                      for j in range(half)]
        for e in range(half):
            devs.append(Device(f"edge{pod}.{e}", "switch"))
            links += [Link(f"edge{pod}.{e}", f"agg{pod}.{a}", "net", bw, NET_LAT)
                      for a in range(half)]
            for _ in range(half):
                nic = _host(f"h{host}", per_host, 150 * GB, devs, links)
                links.append(Link(nic, f"edge{pod}.{e}", "net", bw, NET_LAT))
                host += 1
    return build(f"fattree:{k}:{per_host}:{nic_gbps:g}", devs, links)


PRESETS: dict[str, Callable[[], Topology]] = {"seed-pcie-4gpu": seed_pcie_4gpu, "dgx1v": dgx1v}
PATTERNS = ("cluster:HOSTS:RANKS_PER_HOST[:NIC_GBPS[:INTRA_GBS]]",
            "fattree:K[:RANKS_PER_HOST[:NIC_GBPS]]", "local")


def _numbers(spec: str, parts: list[str], lo: int, hi: int) -> list[float]:
    if not lo <= len(parts) <= hi:
        raise TopologyError(f"--topology {spec!r}: expected {lo} to {hi} numbers after the "
                            f"name; forms: {', '.join(PATTERNS)}")
    try:
        return [float(x) for x in parts]
    except ValueError:
        raise TopologyError(f"--topology {spec!r}: not a number in {parts}") from None


def resolve(spec: str) -> Topology:
    """A preset name, a parameterised preset, ``local``, or a JSON file.

    Raises:
        TopologyError: none of those (the message lists the presets), or a bad file.
    """
    if spec in PRESETS:
        return PRESETS[spec]()
    name, _, rest = spec.partition(":")
    parts = rest.split(":") if rest else []
    if name == "cluster" and rest:
        v = _numbers(spec, parts, 2, 4)
        return cluster(int(v[0]), int(v[1]), *v[2:])
    if name == "fattree" and rest:
        v = _numbers(spec, parts, 1, 3)
        return fattree(int(v[0]), *(int(x) for x in v[1:2]), *v[2:])
    if spec == "local":
        from ringworld.topology.discover import discover

        return discover().topology
    if Path(spec).is_file():
        return load(spec)
    raise TopologyError(f"--topology {spec!r}: no such file or preset; presets: "
                        f"{', '.join(PRESETS)}, {', '.join(PATTERNS)}")
