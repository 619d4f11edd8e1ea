"""``ringworld info``, the GPU listing it shares with ``ringworld topo``, and topo's GPU section.

Nothing here depends on this machine's hardware: GPUs come from a fake ``nvidia-smi`` first on
PATH or a fake ``pynvml`` module, and the real ones are hidden (an empty PATH, no pynvml). The
truths checked on the optional packages (NCCL, cuda-bindings, mpi4py, torch) hold whether or
not they are installed.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import stat
import sys
import types
from pathlib import Path

import pytest

import ringworld
from ringworld.device import gpus, info_cli
from ringworld.launch import cli

pytestmark = pytest.mark.timeout(60)

ITEMS = ("ringworld", "python", "shm", "tcp", "nccl", "cuda", "gpus", "mpi", "torch")

# `nvidia-smi topo -m` in the real format (tabs, ANSI underline around the header): the first
# four GPUs of the DGX-1 sample in tests/topology/test_model.py, and its NIC
SMI_TOPO = (
    "\t\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tCPU Affinity\tNUMA Affinity\x1b[0m\n"
    "GPU0\t X \tNV1\tNV1\tNV2\tPIX\t0-1\t0\n"
    "GPU1\tNV1\t X \tNV2\tNV1\tPIX\t0-1\t0\n"
    "GPU2\tNV1\tNV2\t X \tSYS\tPHB\t0-1\t0\n"
    "GPU3\tNV2\tNV1\tSYS\t X \tPHB\t0-1\t0\n"
    "NIC0\tPIX\tPIX\tPHB\tPHB\t X \t\t\n"
    "\nLegend:\n\n  X    = Self\n  NV#  = Connection traversing a bonded set of # NVLinks\n"
    "\nNIC Legend:\n\n  NIC0: mlx5_0\n"
)
SMI_QUERY = (
    "0, Tesla V100-SXM2-32GB, 32768 MiB, GPU-11111111-2222-3333-4444-555555555555\n"
    "1, Tesla V100-SXM2-32GB, 32768 MiB, GPU-66666666-7777-8888-9999-000000000000\n"
    "2, Tesla V100-SXM2-32GB, 32768 MiB, GPU-aaaaaaaa-7777-8888-9999-000000000000\n"
    "3, Tesla V100-SXM2-32GB, 32768 MiB, GPU-bbbbbbbb-7777-8888-9999-000000000000\n"
)


@pytest.fixture
def no_gpu_tools(monkeypatch, tmp_path):
    """No pynvml and no nvidia-smi, whatever this machine has."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError


def fake_smi(monkeypatch, tmp_path: Path, query: str, topo: str = "", status: int = 0) -> Path:
    """A ``nvidia-smi`` first on PATH printing ``topo`` for ``topo -m`` and ``query`` for
    anything else (shell builtins only), exiting ``status``; pynvml hidden."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "query.txt").write_text(query)
    (bin_dir / "topo.txt").write_text(topo)
    script = bin_dir / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f'dir="{bin_dir}"\n'
        'if [ "$1" = topo ]; then f="$dir/topo.txt"; else f="$dir/query.txt"; fi\n'
        "while IFS= read -r line; do printf '%s\\n' \"$line\"; done < \"$f\"\n"
        f"exit {status}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setitem(sys.modules, "pynvml", None)
    return script


def fake_pynvml(monkeypatch, bus_ids: list[str], nvlinks: dict[int, list[str]],
                level: int = 50) -> types.ModuleType:
    """A ``pynvml`` with GPUs at ``bus_ids``; GPU i's enabled NVLinks lead to the bus ids
    ``nvlinks[i]``; every pair's common ancestor is ``level``."""
    m = types.ModuleType("pynvml")
    state = {"init": 0}

    class NVMLError(Exception):
        pass

    def link(h, n):
        if n >= len(nvlinks.get(h, [])):
            raise NVMLError("Not Supported")
        return 1

    m.NVMLError = NVMLError
    m.NVML_NVLINK_MAX_LINKS = 18
    m.nvmlInit = lambda: state.__setitem__("init", state["init"] + 1)
    m.nvmlShutdown = lambda: state.__setitem__("init", state["init"] - 1)
    m.nvmlDeviceGetCount = lambda: len(bus_ids)
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetName = lambda h: b"NVIDIA H200"  # bytes, as older releases return
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=141 << 30)
    m.nvmlDeviceGetUUID = lambda h: f"GPU-{h:08d}"
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=bus_ids[h])
    m.nvmlDeviceGetNvLinkState = link
    m.nvmlDeviceGetNvLinkRemotePciInfo = (
        lambda h, n: types.SimpleNamespace(busId=nvlinks[h][n]))
    m.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: level
    m.state = state
    monkeypatch.setitem(sys.modules, "pynvml", m)
    return m


# --- collect() -------------------------------------------------------------------------------

def test_collect_reports_every_item_with_why(no_gpu_tools) -> None:
    info = info_cli.collect()
    assert tuple(info) == ITEMS
    for key, item in info.items():
        assert isinstance(item["available"], bool), key
        assert isinstance(item["reason"], str), key
        assert bool(item["reason"]) != item["available"], (key, item)
    assert info["ringworld"]["version"] == ringworld.__version__
    assert info["python"]["version"] == platform.python_version()
    assert info["tcp"]["available"] and "loopback" in info["tcp"]["detail"]
    assert info["gpus"] == {"available": False, "count": 0, "devices": [],
                            "reason": info["gpus"]["reason"]}
    assert "pynvml" in info["gpus"]["reason"] and "nvidia-smi" in info["gpus"]["reason"]
    json.dumps(info)  # all of it is JSON


def test_shm_is_usable_where_a_segment_can_be_made(tmp_path) -> None:
    if os.path.isdir("/dev/shm"):
        assert info_cli.shm_info()["available"], info_cli.shm_info()
    here = info_cli.shm_info(str(tmp_path))
    assert here["available"] and here["free_bytes"] > 0
    assert list(tmp_path.iterdir()) == []  # the probe's segment is gone
    missing = info_cli.shm_info(str(tmp_path / "nope"))
    assert not missing["available"] and "does not exist" in missing["reason"]


def _installed(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def test_nccl_item_matches_what_is_installed() -> None:
    nccl = info_cli.nccl_info()
    assert nccl["nccl4py"] == _installed("nccl4py")
    if importlib.util.find_spec("nccl") is None:
        assert not nccl["available"] and "nccl4py" in nccl["reason"]
        return
    if not nccl["available"]:  # the binding without a library
        assert "NCCL" in nccl["reason"]
        return
    libs = {_installed("nvidia-nccl-cu12"), _installed("nvidia-nccl-cu13")} - {None}
    assert nccl["version"] in libs or (nccl["path"] and os.path.exists(nccl["path"]))
    assert nccl["reason"] == ""


def test_cuda_item_matches_what_is_installed() -> None:
    cuda = info_cli.cuda_info()
    assert cuda["cuda-bindings"] == _installed("cuda-bindings")
    assert cuda["available"] == (cuda["devices"] > 0)
    if cuda["cuda-bindings"] is None:
        assert not cuda["available"] and "cuda-bindings" in cuda["reason"]
        assert cuda["driver"] is None and cuda["runtime"] is None
    if not cuda["available"]:
        assert cuda["reason"]


def test_mpi_and_torch_are_found_not_imported(monkeypatch) -> None:
    before = {m for m in ("mpi4py", "torch") if m in sys.modules}
    monkeypatch.delenv("RINGWORLD_MPI_PYTHON", raising=False)
    mpi = info_cli.mpi_info()
    torch = info_cli.torch_info()
    assert mpi["available"] == (importlib.util.find_spec("mpi4py") is not None)
    assert torch["available"] == (importlib.util.find_spec("torch") is not None)
    assert mpi["mpi_python"] is None
    if not mpi["available"]:
        assert "RINGWORLD_MPI_PYTHON is not set" in mpi["reason"]
    monkeypatch.setenv("RINGWORLD_MPI_PYTHON", "/opt/mpi/bin/python")
    assert info_cli.mpi_info()["mpi_python"] == "/opt/mpi/bin/python"
    assert {m for m in ("mpi4py", "torch") if m in sys.modules} == before


def test_import_ringworld_imports_nothing_optional() -> None:
    import subprocess

    # some installations import a package at start-up (cuda-bindings' namespace `cuda`, from
    # a .pth file): only what the imports below add counts
    code = ("import sys\nmods = ('nccl', 'cuda', 'cuda.bindings', 'pynvml', 'mpi4py', 'torch')\n"
            "before = {m for m in mods if m in sys.modules}\n"
            "import ringworld, ringworld.device.info_cli, ringworld.device.gpus\n"
            "print(sorted({m for m in mods if m in sys.modules} - before))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=30, check=True)
    assert out.stdout.strip() == "[]"


# --- the command -----------------------------------------------------------------------------

def test_info_json_command(no_gpu_tools, capsys) -> None:
    assert cli.main(["info", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert tuple(doc) == ITEMS
    assert doc["ringworld"]["version"] == ringworld.__version__


def test_info_text_command_has_one_line_per_item(no_gpu_tools, capsys) -> None:
    assert cli.main(["info"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in lines] == list(ITEMS)
    assert lines[3].startswith("tcp       yes  loopback")
    assert lines[6].startswith("gpus      no   ")
    first_detail = {ln[10:15] for ln in lines[2:]}
    assert first_detail <= {"yes  ", "no   "}


def test_info_text_lists_gpus_under_their_line(monkeypatch, tmp_path, capsys) -> None:
    fake_smi(monkeypatch, tmp_path, SMI_QUERY)
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "gpus      yes  4 (via nvidia-smi)" in out
    assert "GPU3   Tesla V100-SXM2-32GB  32768 MiB  GPU-bbbbbbbb" in out


# --- list_gpus -------------------------------------------------------------------------------

def test_list_gpus_parses_nvidia_smi(monkeypatch, tmp_path) -> None:
    fake_smi(monkeypatch, tmp_path,
             "0, NVIDIA H200, 143771 MiB, GPU-0a\n1, NVIDIA H200, 143771 MiB, GPU-1b\n")
    found, reason = gpus.list_gpus()
    assert reason == ""
    assert found == [
        {"index": 0, "name": "NVIDIA H200", "memory_mib": 143771, "uuid": "GPU-0a",
         "via": "nvidia-smi"},
        {"index": 1, "name": "NVIDIA H200", "memory_mib": 143771, "uuid": "GPU-1b",
         "via": "nvidia-smi"},
    ]
    # without the uuid column (older nvidia-smi output), and a name with a comma
    assert gpus.parse_smi_gpus("0, Odd, Name, 16384 MiB\nNo devices\n") == [
        {"index": 0, "name": "Odd, Name", "memory_mib": 16384, "uuid": None}]


def test_list_gpus_says_why_nvidia_smi_failed(monkeypatch, tmp_path) -> None:
    fake_smi(monkeypatch, tmp_path, "NVIDIA-SMI has failed because it couldn't communicate "
             "with the NVIDIA driver.\n", status=9)
    found, reason = gpus.list_gpus()
    assert found == []
    assert "pynvml (nvidia-ml-py) is not installed" in reason
    assert "exit status 9" in reason and "couldn't communicate" in reason


def test_list_gpus_without_any_tool(no_gpu_tools) -> None:
    assert gpus.list_gpus() == (
        [], "pynvml (nvidia-ml-py) is not installed; nvidia-smi is not on PATH")


def test_list_gpus_and_links_through_pynvml(monkeypatch, no_gpu_tools) -> None:
    bus = ["00000000:07:00.0", "00000000:0F:00.0", "00000000:47:00.0"]
    # GPU0-GPU1: two direct lanes (seen from both ends, in another spelling of the bus id);
    # GPU2 has none
    nv = {0: ["0000:0f:00.0", "0000:0f:00.0"], 1: ["0000:07:00.0", "0000:07:00.0"]}
    m = fake_pynvml(monkeypatch, bus, nv, level=40)
    found, reason = gpus.list_gpus()
    assert reason == "" and [g["index"] for g in found] == [0, 1, 2]
    assert found[0] == {"index": 0, "name": "NVIDIA H200", "memory_mib": 141 << 10,
                        "uuid": "GPU-00000000", "via": "pynvml"}
    links, why = gpus.gpu_links()
    assert why == ""
    assert [(ln["a"], ln["b"], ln["relation"], ln["pcie"]) for ln in links] == [
        (0, 1, "NV2", "NODE"), (0, 2, "NODE", "NODE"), (1, 2, "NODE", "NODE")]
    assert m.state["init"] == 0  # every init shut down


def test_links_through_nvswitches(monkeypatch, no_gpu_tools) -> None:
    bus = ["0000:18:00.0", "0000:2a:00.0"]
    switch = "0000:c0:00.0"  # an NVSwitch: not one of the GPUs
    fake_pynvml(monkeypatch, bus, {0: [switch] * 18, 1: [switch] * 18})
    links, _ = gpus.gpu_links()
    assert [(ln["relation"], ln["nvlinks"], ln["pcie"]) for ln in links] == [
        ("NV18", 18, "SYS")]


def test_pynvml_that_does_not_initialise_falls_back_to_nvidia_smi(monkeypatch,
                                                                   tmp_path) -> None:
    fake_smi(monkeypatch, tmp_path, SMI_QUERY, SMI_TOPO)
    m = types.ModuleType("pynvml")

    def fail() -> None:
        raise RuntimeError("NVML Shared Library Not Found")

    m.nvmlInit = fail
    monkeypatch.setitem(sys.modules, "pynvml", m)
    found, _ = gpus.list_gpus()
    assert {g["via"] for g in found} == {"nvidia-smi"} and len(found) == 4
    links, _ = gpus.gpu_links()
    assert {ln["via"] for ln in links} == {"nvidia-smi"}
    _, why = gpus.gpu_links(smi_text="garbage")
    assert "NVML does not initialise (NVML Shared Library Not Found)" in why
    assert "no GPU0 column" in why


# --- ringworld topo --------------------------------------------------------------------------

def fake_sysfs(root: Path) -> Path:
    (root / "devices/system/cpu").mkdir(parents=True)
    (root / "devices/system/cpu/online").write_text("0-1\n")
    (root / "devices/system/node/node0").mkdir(parents=True)
    (root / "devices/system/node/node0/cpulist").write_text("0-1\n")
    return root


def test_smi_links_reads_the_topology_matrix() -> None:
    links = gpus.smi_links(SMI_TOPO)
    assert [(ln["a"], ln["b"], ln["relation"]) for ln in links] == [
        (0, 1, "NV1"), (0, 2, "NV1"), (0, 3, "NV2"), (1, 2, "NV2"), (1, 3, "NV1"),
        (2, 3, "SYS")]
    assert links[-1]["nvlinks"] == 0 and links[-1]["pcie"] == "SYS"
    with pytest.raises(ValueError):
        gpus.smi_links("No devices were found")


def test_topo_prints_gpus_links_and_nccl(monkeypatch, tmp_path, capsys) -> None:
    fake_smi(monkeypatch, tmp_path, SMI_QUERY, SMI_TOPO)
    sysfs = fake_sysfs(tmp_path / "sys")
    assert cli.main(["topo", "--sysfs", str(sysfs)]) == 0
    out = capsys.readouterr().out
    assert "2 cores on 1 NUMA node(s), 4 GPU(s)" in out
    section = out[out.index("GPUs: 4 (via nvidia-smi)"):].splitlines()
    assert section[1].startswith("  GPU0   Tesla V100-SXM2-32GB  32768 MiB  GPU-1111")
    assert section[5] == "  links (via nvidia-smi):"
    assert section[6:12] == ["    GPU0-GPU1  NV1", "    GPU0-GPU2  NV1", "    GPU0-GPU3  NV2",
                             "    GPU1-GPU2  NV2", "    GPU1-GPU3  NV1", "    GPU2-GPU3  SYS"]
    assert section[12].startswith("NCCL: ")
    lib = info_cli.nccl_info()
    if lib["available"]:
        assert section[12].startswith(f"NCCL: {lib['version']}")
    else:
        assert section[12].startswith("NCCL: not installed (")

    assert cli.main(["topo", "--sysfs", str(sysfs), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["gpus"] == 4 and len(doc["gpu_info"]["gpus"]) == 4
    assert len(doc["gpu_info"]["links"]) == 6


def test_topo_without_gpus_adds_one_line(no_gpu_tools, tmp_path, capsys) -> None:
    sysfs = fake_sysfs(tmp_path / "sys")
    assert cli.main(["topo", "--sysfs", str(sysfs)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == ("  GPUs: none found: pynvml (nvidia-ml-py) is not installed; "
                         "nvidia-smi is not on PATH")
    assert sum(ln.strip().startswith("GPUs:") for ln in lines) == 1
    assert not any("NCCL" in ln for ln in lines)
    assert "0 GPU(s)" in lines[-3]
