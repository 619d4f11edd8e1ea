"""``ringworld info``: what this installation can use, and why not what it cannot.

``ringworld info [--json]``: one line per item: Ringworld's and Python's versions; the shm
transport (``/dev/shm`` exists and a segment can be created there); tcp (always: loopback);
NCCL (the library's version and path, the nccl4py binding's version); CUDA (the driver's,
runtime's and cuda-bindings' versions, the devices it sees); the GPUs (through nvidia-ml-py,
else ``nvidia-smi``); mpi4py in this interpreter and ``RINGWORLD_MPI_PYTHON``; torch. Each
unavailable item says why. ``--json`` prints the same as a JSON object, one key per item, each
with ``available`` and ``reason``.

Cost: loading NCCL's binding and the CUDA runtime binding when installed (well under a second),
at most one ``nvidia-smi`` run (10 s timeout). Neither mpi4py nor torch is imported.

Exit status 0: it is a report (an unavailable item is not a failure).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import mmap
import os
import platform
import secrets
import sys
from typing import Any

#: where the shm transport puts its segments
SHM_DIR = "/dev/shm"


def _importable(name: str) -> bool:
    """Whether ``name`` can be imported here, without importing it."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package that fails, a broken __spec__
        return False


def shm_info(directory: str = SHM_DIR) -> dict[str, Any]:
    """Whether a shared-memory segment can be created, mapped and unlinked in ``directory``."""
    out: dict[str, Any] = {"available": False, "path": directory, "free_bytes": None,
                           "reason": ""}
    if not os.path.isdir(directory):
        out["reason"] = f"{directory} does not exist"
        return out
    path = os.path.join(directory, f"ringworld-info-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except OSError as exc:
        out["reason"] = f"cannot create a segment in {directory} ({exc.strerror})"
        return out
    try:
        os.ftruncate(fd, mmap.PAGESIZE)
        with mmap.mmap(fd, mmap.PAGESIZE) as mm:
            mm[0] = 1
    except OSError as exc:
        out["reason"] = f"cannot map a segment in {directory} ({exc.strerror})"
    else:
        out["available"] = True
    finally:
        os.close(fd)
        try:
            os.unlink(path)
        except OSError as exc:
            out["available"] = False
            out["reason"] = f"cannot unlink a segment in {directory} ({exc.strerror})"
    try:
        st = os.statvfs(directory)
        out["free_bytes"] = st.f_bavail * st.f_frsize
    except OSError:
        pass
    return out


def nccl_info() -> dict[str, Any]:
    """NCCL's library and binding, from :func:`ringworld.device.nccl.library`."""
    from ringworld.device import nccl

    lib = nccl.library()
    return {"available": lib.available, "version": lib.version, "path": lib.path,
            "nccl4py": lib.binding, "reason": lib.reason}


def cuda_info() -> dict[str, Any]:
    """The CUDA driver's, runtime's and cuda-bindings' versions, and the devices CUDA sees."""
    from ringworld.device import cuda
    from ringworld.errors import DeviceUnavailable

    versions: dict[str, str | None] = {"driver": None, "runtime": None, "cuda-bindings": None}
    with contextlib.suppress(ImportError, DeviceUnavailable):  # metadata without the module
        versions.update(cuda.versions())
    devices, reason = cuda.probe()
    return {"available": devices > 0, "devices": devices, **versions, "reason": reason}


def gpus_info() -> dict[str, Any]:
    """The GPUs, from :func:`ringworld.device.gpus.list_gpus`."""
    from ringworld.device.gpus import list_gpus

    gpus, reason = list_gpus()
    return {"available": bool(gpus), "count": len(gpus), "devices": gpus, "reason": reason}


def mpi_info() -> dict[str, Any]:
    """Whether mpi4py is importable here (not importing it) and RINGWORLD_MPI_PYTHON."""
    has = _importable("mpi4py")
    mpi_python = os.environ.get("RINGWORLD_MPI_PYTHON") or None
    reason = "" if has else "mpi4py is not installed in this Python"
    if not has and mpi_python is None:
        reason += " and RINGWORLD_MPI_PYTHON is not set"
    return {"available": has, "mpi4py": has, "mpi_python": mpi_python, "reason": reason}


def torch_info() -> dict[str, Any]:
    """Whether torch is importable here (not importing it: that takes seconds)."""
    has = _importable("torch")
    return {"available": has, "reason": "" if has else "torch is not installed in this Python"}


def collect() -> dict[str, Any]:
    """Everything ``ringworld info`` reports, one key per item. Never raises for a missing
    package, driver or device: the item says why it is unavailable."""
    import ringworld

    return {
        "ringworld": {"available": True, "version": ringworld.__version__,
                      "path": os.path.dirname(os.path.abspath(ringworld.__file__)),
                      "reason": ""},
        "python": {"available": True, "version": platform.python_version(),
                   "executable": sys.executable, "reason": ""},
        "shm": shm_info(),
        "tcp": {"available": True, "reason": "",
                "detail": "loopback always; other hosts over any interface they can reach"},
        "nccl": nccl_info(),
        "cuda": cuda_info(),
        "gpus": gpus_info(),
        "mpi": mpi_info(),
        "torch": torch_info(),
    }


def _cuda_versions(item: dict[str, Any]) -> str:
    return ", ".join(f"{k} {item[k] or '-'}" for k in ("driver", "runtime", "cuda-bindings"))


def _detail(key: str, item: dict[str, Any]) -> str:
    """The text after the yes/no of ``key``'s line."""
    if key == "shm":
        free = item["free_bytes"]
        return f"{item['path']}" + (f" ({free / 2**30:.1f} GiB free)" if free is not None else "")
    if key == "tcp":
        return str(item["detail"])
    if key == "nccl":
        binding = f" (nccl4py {item['nccl4py']})" if item["nccl4py"] else ""
        return f"{item['version']}  {item['path'] or '?'}{binding}"
    if key == "cuda":
        return f"{item['devices']} device(s); {_cuda_versions(item)}"
    if key == "gpus":
        via = item["devices"][0]["via"] if item["devices"] else "?"
        return f"{item['count']} (via {via})"
    if key == "mpi":
        mpi_python = item["mpi_python"]
        return "mpi4py importable" + (f"; RINGWORLD_MPI_PYTHON={mpi_python}"
                                      if mpi_python else "")
    return ""


def format_text(info: dict[str, Any]) -> list[str]:
    """``info`` (from :func:`collect`) as the command's lines."""
    lines = [f"{'ringworld':<10}{info['ringworld']['version']}  {info['ringworld']['path']}",
             f"{'python':<10}{info['python']['version']}  {info['python']['executable']}"]
    for key, item in info.items():
        if key in ("ringworld", "python"):
            continue
        if item["available"]:
            lines.append(f"{key:<10}{'yes':<5}{_detail(key, item)}")
        else:
            why = item["reason"]
            if key == "cuda" and item["cuda-bindings"]:  # the versions say what is missing
                why += f" ({_cuda_versions(item)})"
            if key == "mpi" and item["mpi_python"]:
                why += f"; RINGWORLD_MPI_PYTHON={item['mpi_python']}"
            lines.append(f"{key:<10}{'no':<5}{why}")
        if key == "gpus":
            for g in item["devices"]:
                mem = f"{g['memory_mib']} MiB" if g["memory_mib"] is not None else "? MiB"
                lines.append(f"{'':<15}GPU{g['index']:<3} {g['name']}  {mem}"
                             + (f"  {g['uuid']}" if g["uuid"] else ""))
    return lines


def run_info(args: argparse.Namespace) -> int:
    """Handle ``ringworld info``."""
    info = collect()
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        for line in format_text(info):
            print(line)
    return 0


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``info`` on the top-level parser."""
    p = subparsers.add_parser("info", help="what this installation can use (shm, tcp, NCCL, "
                              "CUDA, GPUs, mpi4py, torch) and why not",
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print JSON instead of lines")
    p.set_defaults(func=run_info)
