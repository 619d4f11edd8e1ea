"""The topology model, JSON round trip, presets and discovery (fake /sys trees, nvidia-smi)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ringworld.topology import discover, presets
from ringworld.topology.model import (
    Device,
    Link,
    Topology,
    TopologyError,
    dump,
    from_json,
    load,
    to_json,
)
from ringworld.topology.routes import Router

pytestmark = pytest.mark.timeout(120)

# `nvidia-smi topo -m` as printed on a DGX-1 (V100), tabs as in the real output, with the
# ANSI underline newer drivers put around the header
DGX1_SMI = (
    "\t\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tNIC0\tCPU Affinity\t"
    "NUMA Affinity\x1b[0m\n"
    "GPU0\t X \tNV1\tNV1\tNV2\tNV2\tSYS\tSYS\tSYS\tPIX\t0-19,40-59\t0\n"
    "GPU1\tNV1\t X \tNV2\tNV1\tSYS\tNV2\tSYS\tSYS\tPIX\t0-19,40-59\t0\n"
    "GPU2\tNV1\tNV2\t X \tNV2\tSYS\tSYS\tNV1\tSYS\tPHB\t0-19,40-59\t0\n"
    "GPU3\tNV2\tNV1\tNV2\t X \tSYS\tSYS\tSYS\tNV1\tPHB\t0-19,40-59\t0\n"
    "GPU4\tNV2\tSYS\tSYS\tSYS\t X \tNV1\tNV1\tNV2\tSYS\t20-39,60-79\t1\n"
    "GPU5\tSYS\tNV2\tSYS\tSYS\tNV1\t X \tNV2\tNV1\tSYS\t20-39,60-79\t1\n"
    "GPU6\tSYS\tSYS\tNV1\tSYS\tNV1\tNV2\t X \tNV2\tSYS\t20-39,60-79\t1\n"
    "GPU7\tSYS\tSYS\tSYS\tNV1\tNV2\tNV1\tNV2\t X \tSYS\t20-39,60-79\t1\n"
    "NIC0\tPIX\tPIX\tPHB\tPHB\tSYS\tSYS\tSYS\tSYS\t X \t\t\n"
    "\nLegend:\n\n  X    = Self\n  NV#  = Connection traversing a bonded set of # NVLinks\n"
    "\nNIC Legend:\n\n  NIC0: mlx5_0\n"
)


def fake_sysfs(root: Path, nodes: dict[int, str], online: str | None) -> Path:
    if online is not None:
        (root / "devices/system/cpu").mkdir(parents=True)
        (root / "devices/system/cpu/online").write_text(online + "\n")
    for n, cpus in nodes.items():
        d = root / f"devices/system/node/node{n}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
    return root


def test_every_preset_round_trips_through_json(tmp_path) -> None:
    for spec in ("seed-pcie-4gpu", "dgx1v", "cluster:3:2:200", "fattree:4:2"):
        topo = presets.resolve(spec)
        path = tmp_path / "t.json"
        dump(topo, path)
        again = load(path)
        assert again == topo
        assert to_json(again) == json.loads(path.read_text())
        assert presets.resolve(str(path)) == topo


def test_presets_have_the_documented_shapes() -> None:
    seed = presets.resolve("seed-pcie-4gpu")
    assert seed.ranks == ("gpu0", "gpu1", "gpu2", "gpu3")
    r = Router(seed)
    assert r.path("gpu0", "gpu1") == ["gpu0", "pcie0", "gpu1"]
    assert r.path("gpu1", "gpu2") == ["gpu1", "pcie0", "cpu0", "pcie1", "gpu2"]
    dgx = presets.resolve("dgx1v")
    lanes = dict.fromkeys(range(8), 0)
    for ln in dgx.links:
        if ln.kind == "nvlink":
            for end in (ln.a, ln.b):
                lanes[int(end[3:])] += ln.count
            assert ln.bandwidth == ln.count * presets.NVLINK2
    assert lanes == dict.fromkeys(range(8), 6)  # six NVLinks per V100
    assert sum(1 for ln in dgx.links if ln.kind == "nvlink") == 16
    c = presets.resolve("cluster:5:3:50")
    assert c.size == 15 and len(set(c.hosts())) == 5
    nics = [ln for ln in c.links if ln.kind == "net"]
    assert len(nics) == 5 and all(ln.bandwidth == 50e9 / 8 for ln in nics)
    ft = presets.resolve("fattree:4:2")
    assert ft.size == 4 ** 3 // 4 * 2
    assert sum(1 for d in ft.devices if d.kind == "switch") == 4 * 4 // 4 + 4 * 4


def test_fat_tree_routes_spread_over_core_switches() -> None:
    ft = presets.fattree(8)
    r = Router(ft)
    cores = set()
    for h in range(1, 8):
        path = r.path("h0.gpu0", f"h{h * 16}.gpu0")  # other pods: through a core switch
        cores.update(p for p in path if p.startswith("core"))
        assert len(path) == 11, path
    assert len(cores) > 1


def test_bad_topologies_and_specs_are_rejected(tmp_path) -> None:
    with pytest.raises(TopologyError, match="kind"):
        Topology("x", (Device("a", "toaster"),), (), ())
    with pytest.raises(TopologyError, match="unknown device"):
        Topology("x", (Device("a", "gpu"),), (Link("a", "b", "pcie", 1e9),), ())
    with pytest.raises(TopologyError, match="bandwidth"):
        Topology("x", (Device("a", "gpu"), Device("b", "gpu")),
                 (Link("a", "b", "pcie", 0.0),), ())
    with pytest.raises(TopologyError, match="ranks live on"):
        Topology("x", (Device("s", "switch"),), (), ("s",))
    with pytest.raises(TopologyError, match="format"):
        from_json({"format": "other", "version": 1})
    with pytest.raises(TopologyError, match="presets"):
        presets.resolve("no-such-thing")
    with pytest.raises(TopologyError):
        presets.resolve("cluster:0:4")
    with pytest.raises(TopologyError):
        presets.resolve("fattree:3")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(TopologyError, match="cannot read"):
        load(bad)
    isolated = Topology("x", (Device("a", "gpu"), Device("b", "gpu")), (), ("a", "b"))
    with pytest.raises(TopologyError, match="no path"):
        Router(isolated).route("a", "b")


def test_discovery_reads_a_fake_two_node_sysfs(tmp_path) -> None:
    root = fake_sysfs(tmp_path, {0: "0-3", 1: "4-5,7"}, "0-5,7")
    found = discover.discover(root, nvidia_smi=lambda: None, host="box")
    assert (found.cores, found.numa_nodes, found.gpus) == (7, 2, 0)
    t = found.topology
    assert t.ranks == tuple(f"core{c}" for c in (0, 1, 2, 3, 4, 5, 7))
    assert Router(t).path("core0", "core7") == ["core0", "numa0", "numa1", "core7"]
    assert any("nvidia-smi" in n for n in found.notes)


def test_discovery_degrades_without_numa_or_cpu_files(tmp_path) -> None:
    only_online = discover.discover(fake_sysfs(tmp_path / "a", {}, "0-2"),
                                    nvidia_smi=lambda: None)
    assert only_online.cores == 3 and only_online.numa_nodes == 1
    nothing = discover.discover(tmp_path / "missing", nvidia_smi=lambda: None)
    assert nothing.cores >= 1 and any("os.cpu_count" in n for n in nothing.notes)
    garbage = fake_sysfs(tmp_path / "g", {0: "zz"}, "0-1")
    assert discover.discover(garbage, nvidia_smi=lambda: None).cores == 2


def test_discovery_of_this_machine_matches_its_cpus() -> None:
    import os

    found = discover.discover()
    assert found.cores == len(os.sched_getaffinity(0)) or found.cores == os.cpu_count()
    assert found.topology.size >= 1


def test_nvidia_smi_sample_gives_the_dgx1_nvlink_mesh(tmp_path) -> None:
    root = fake_sysfs(tmp_path, {0: "0-19,40-59", 1: "20-39,60-79"}, "0-79")
    found = discover.discover(root, nvidia_smi=lambda: DGX1_SMI, host="dgx")
    assert found.gpus == 8
    t = found.topology
    assert t.ranks == tuple(f"gpu{i}" for i in range(8))
    lanes = {(ln.a, ln.b): ln.count for ln in t.links if ln.kind == "nvlink"}
    want = {(f"gpu{a}", f"gpu{b}"): n for (a, b), n in presets.DGX1V_NVLINKS.items()}
    assert lanes == want
    r = Router(t)
    assert r.path("gpu0", "gpu1") == ["gpu0", "gpu1"]
    # GPU0 and GPU1 are PIX: one switch, the NIC under it; GPU4 hangs off NUMA node 1
    assert r.path("gpu0", "nic0")[1] == r.path("gpu1", "nic0")[1]
    assert "numa1" in r.path("gpu5", "nic0")
    with pytest.raises(ValueError):
        discover.parse_smi_topo("No devices were found")
    assert discover.discover(root, nvidia_smi=lambda: "garbage").gpus == 0


def test_topo_command_prints_and_dumps(tmp_path) -> None:
    out = tmp_path / "here.json"
    proc = subprocess.run([sys.executable, "-m", "ringworld", "topo", "--dump", str(out)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "cores on" in proc.stdout
    assert load(out).size >= 1
    proc = subprocess.run([sys.executable, "-m", "ringworld", "topo", "--json"],
                          capture_output=True, text=True, timeout=60, check=False)
    doc = json.loads(proc.stdout)
    assert from_json(doc["topology"]).size == doc["gpus"] or doc["cores"]


def test_a_cpu_cores_default_params_are_the_tuning_defaults() -> None:
    """topology/ holds machine data and imports nothing from tuning/: its default CPU-core
    params are written out, and must stay what the tuning defaults make of them."""
    from ringworld.topology.model import KIND_PARAMS
    from ringworld.tuning.constants import DEFAULTS
    from ringworld.tuning.estimate import core_params

    assert KIND_PARAMS["core"] == core_params(DEFAULTS["shm"])
