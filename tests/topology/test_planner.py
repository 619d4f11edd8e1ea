"""Planning on the presets: the seed's plan 1 vs plan 2, DGX-1V NVLink rings, hierarchy."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ringworld.topology import planner, presets, search
from ringworld.topology.sim import Network

pytestmark = pytest.mark.timeout(300)
MiB = 1 << 20


def test_seed_plan1_beats_plan2_with_predicted_times() -> None:
    topo = presets.resolve("seed-pcie-4gpu")
    pl = planner.plan(topo, "bcast", 256 * MiB)
    by = {c.name: c for c in pl.candidates}
    one, two = by["plan1"].time, by["plan2"].time
    assert one < two
    # one message costs t = size / PCIe; plan 1 takes two rounds, plan 2's second round
    # pushes two messages through the same pcie0->cpu0 link
    t = 256 * MiB / presets.PCIE3_X16
    assert one == pytest.approx(2 * t, rel=0.02)
    assert two == pytest.approx(3 * t, rel=0.02)
    text = "\n".join(pl.explain())
    assert "plan2" in text and "share pcie0->cpu0" in text
    # the locality tree is plan 1; the winner is at least as good as plan 1
    assert by["tree(locality)"].time == pytest.approx(one, rel=1e-6)
    assert pl.chosen.time <= one


def test_dgx1v_rings_use_only_nvlink() -> None:
    net = Network(presets.resolve("dgx1v"))
    rings = search.find_rings(net)
    assert len(rings) >= 2
    for order, bottleneck in rings:
        assert sorted(order) == list(range(8))
        assert search.ring_link_kinds(net, order) == {"nvlink"}
        assert bottleneck >= presets.NVLINK2
    assert rings[0][1] == 2 * presets.NVLINK2  # the NV2 ring exists and is found first
    pl = planner.plan(net.topo, "allreduce", 256 * MiB, net=net)
    assert pl.chosen.algorithm == "ring" and pl.chosen.name != "ring"
    plain = next(c for c in pl.candidates if c.name == "ring")
    assert pl.chosen.time < plain.time / 2  # rank-order ring crosses PCIe/QPI


def test_hierarchical_allreduce_wins_on_a_cluster_for_large_messages() -> None:
    topo = presets.resolve("cluster:4:4:100")
    big = planner.plan(topo, "allreduce", 256 * MiB)
    assert big.chosen.name.startswith("hier(")
    flat = next(c for c in big.candidates if c.name == "ring")
    assert big.chosen.time < flat.time
    # a single host has no hierarchical candidate
    one = planner.plan(presets.resolve("cluster:1:8"), "allreduce", 256 * MiB)
    assert not any(c.name.startswith("hier") for c in one.candidates)


def test_small_messages_choose_latency_optimal_schedules() -> None:
    pl = planner.plan(presets.resolve("cluster:4:4"), "allreduce", 64)
    assert pl.chosen.steps_hint <= 2 * 5 + 4
    assert pl.chosen.name in ("recursive_doubling", "rabenseifner", "reduce_bcast",
                              "hier(rabenseifner)")


def test_every_collective_plans_on_every_preset() -> None:
    for spec in ("seed-pcie-4gpu", "dgx1v", "cluster:2:3"):
        for coll in planner.COLLECTIVES:
            pl = planner.plan(presets.resolve(spec), coll, 4 * MiB, root=1)
            assert all(c.error is None for c in pl.candidates), [c.error for c in pl.candidates]
            times = [c.time for c in pl.candidates]
            assert times == sorted(times) and 0 < times[0] < 1
    with pytest.raises(ValueError, match="collective"):
        planner.plan(presets.seed_pcie_4gpu(), "alltoall", MiB)
    with pytest.raises(ValueError, match="root"):
        planner.plan(presets.seed_pcie_4gpu(), "bcast", MiB, root=4)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ringworld", *args], capture_output=True,
                          text=True, timeout=120, check=False)


def test_plan_command_text_and_json(tmp_path) -> None:
    proc = run_cli("plan", "--topology", "seed-pcie-4gpu", "--collective", "bcast", "--size",
                   "64MiB")
    assert proc.returncode == 0, proc.stderr
    assert "plan1" in proc.stdout and "plan2" in proc.stdout and "chosen:" in proc.stdout
    proc = run_cli("plan", "--topology", "dgx1v", "--collective", "allreduce", "--size",
                   "16MiB", "--json")
    doc = json.loads(proc.stdout)
    assert doc["chosen"] == doc["candidates"][0]["name"]
    for cand in doc["candidates"]:
        assert cand["predicted_s"] > 0 and cand["busbw_GBps"] > 0
        rows = cand["transfers"]
        assert rows and all(len(r) == 5 and r[3] <= r[4] for r in rows)
        assert max(r[4] for r in rows) <= cand["predicted_s"] * (1 + 1e-9)
    path = tmp_path / "t.json"
    assert run_cli("topo", "--dump", str(path)).returncode == 0
    assert run_cli("plan", "--topology", str(path), "--size", "1MiB").returncode == 0
    bad = run_cli("plan", "--topology", "nope", "--size", "1MiB")
    assert bad.returncode == 2 and "presets" in bad.stderr


def test_plot_draws_or_says_matplotlib_is_missing(tmp_path) -> None:
    import importlib.util

    out = tmp_path / "p.png"
    proc = run_cli("plan", "--topology", "seed-pcie-4gpu", "--collective", "bcast", "--size",
                   "8MiB", "--plot", str(out))
    if importlib.util.find_spec("matplotlib") is None:
        assert proc.returncode == 2 and "pip install matplotlib" in proc.stderr
        assert not out.exists()
    else:
        assert proc.returncode == 0, proc.stderr
        assert out.read_bytes()[:4] == b"\x89PNG"
