"""The GPUs of this machine and the links between them, for ``ringworld info`` and ``topo``.

:func:`list_gpus` asks NVML through nvidia-ml-py (``import pynvml``) when it is installed and
its library initialises, else ``nvidia-smi --query-gpu``; :func:`gpu_links` asks NVML for each
pair's common PCIe ancestor and NVLink lanes, else reads the ``nvidia-smi topo -m`` matrix with
:func:`ringworld.topology.discover.parse_smi_topo`. Neither needs the CUDA runtime, NCCL or a
working GPU: each says why it found nothing instead of raising.

Cost: NVML's init and a few calls per GPU (milliseconds), or one ``nvidia-smi`` run (10 s
timeout); nothing when neither is present.
"""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
import warnings
from typing import Any

#: how long an ``nvidia-smi`` run may take
SMI_TIMEOUT = 10.0
#: the query :func:`list_gpus` gives ``nvidia-smi``
SMI_QUERY = "--query-gpu=index,name,memory.total,uuid"
#: NVML's nvmlGpuTopologyLevel_t as the letters of ``nvidia-smi topo -m``
NVML_LEVELS = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


def _text(value: Any) -> str:
    """NVML strings are bytes in older nvidia-ml-py releases."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _pynvml() -> tuple[Any, str]:
    """(pynvml initialised, '') or (None, why not). Call ``nvmlShutdown`` when done."""
    try:
        with warnings.catch_warnings():  # the old "pynvml" package warns that it is deprecated
            warnings.simplefilter("ignore")
            pynvml = importlib.import_module("pynvml")
    except ImportError:
        return None, "pynvml (nvidia-ml-py) is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        return None, f"NVML does not initialise ({_text(exc) or type(exc).__name__})"
    return pynvml, ""


def _nvml_gpus(nvml: Any) -> list[dict[str, Any]]:
    gpus: list[dict[str, Any]] = []
    for i in range(int(nvml.nvmlDeviceGetCount())):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        gpu: dict[str, Any] = {"index": i, "name": _text(nvml.nvmlDeviceGetName(h)),
                               "memory_mib": int(nvml.nvmlDeviceGetMemoryInfo(h).total) >> 20,
                               "uuid": None}
        try:
            gpu["uuid"] = _text(nvml.nvmlDeviceGetUUID(h))
        except Exception:
            gpu["uuid"] = None
        gpus.append(gpu)
    return gpus


def _run_smi(args: list[str], timeout: float) -> tuple[str | None, str]:
    """(stdout, '') of ``nvidia-smi ARGS``, or (None, why it gave nothing)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None, "nvidia-smi is not on PATH"
    try:
        proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired:
        return None, f"nvidia-smi did not answer within {timeout:g} s"
    except OSError as exc:
        return None, f"nvidia-smi does not run ({exc.strerror or exc})"
    if proc.returncode != 0:
        said = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        return None, (f"nvidia-smi failed (exit status {proc.returncode})"
                      + (f": {said[0].strip()}" if said else ""))
    return proc.stdout, ""


def _mib(text: str) -> int | None:
    m = re.match(r"\s*(\d+)", text)
    return int(m.group(1)) if m else None


def parse_smi_gpus(text: str) -> list[dict[str, Any]]:
    """GPUs from ``nvidia-smi --query-gpu=index,name,memory.total[,uuid] --format=csv,noheader``
    (``0, NVIDIA H200, 143771 MiB, GPU-...``); lines that are not such rows are skipped."""
    gpus: list[dict[str, Any]] = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 3 or not cells[0].isdigit():
            continue
        uuid: str | None = None
        if len(cells) >= 4 and cells[-1].startswith(("GPU-", "MIG-")):
            uuid = cells.pop()
        gpus.append({"index": int(cells[0]), "name": ", ".join(cells[1:-1]),
                     "memory_mib": _mib(cells[-1]), "uuid": uuid})
    return gpus


def list_gpus(timeout: float = SMI_TIMEOUT) -> tuple[list[dict[str, Any]], str]:
    """(the GPUs, why there are none: '' when some were found). Never raises.

    Each GPU is ``{"index", "name", "memory_mib", "uuid", "via"}`` (``uuid`` may be None;
    ``via`` is "pynvml" or "nvidia-smi").
    """
    nvml, why_nvml = _pynvml()
    if nvml is not None:
        try:
            gpus = _nvml_gpus(nvml)
        except Exception as exc:
            why_nvml = f"NVML failed listing GPUs ({_text(exc) or type(exc).__name__})"
        else:
            if gpus:
                return [{**g, "via": "pynvml"} for g in gpus], ""
            why_nvml = "NVML sees no GPUs"
        finally:
            _shutdown(nvml)
    out, why_smi = _run_smi([SMI_QUERY, "--format=csv,noheader"], timeout)
    if out is not None:
        gpus = parse_smi_gpus(out)
        if gpus:
            return [{**g, "via": "nvidia-smi"} for g in gpus], ""
        first = out.strip().splitlines()
        why_smi = "nvidia-smi lists no GPUs" + (f" ({first[0].strip()})" if first else "")
    return [], f"{why_nvml}; {why_smi}"


def _shutdown(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception:
        return


def _bus_id(value: Any) -> str:
    """A PCI bus id in one spelling ('00000000:07:00.0' and '0000:07:00.0' alike)."""
    domain, _, rest = _text(value).strip().lower().partition(":")
    return f"{domain.lstrip('0') or '0'}:{rest}"


def _nvml_links(nvml: Any) -> list[dict[str, Any]]:
    """Each GPU pair's relation (NV<k> when joined by k NVLink lanes, directly or both through
    NVSwitches, else the PCIe letter of their common ancestor)."""
    count = int(nvml.nvmlDeviceGetCount())
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    bus = {_bus_id(nvml.nvmlDeviceGetPciInfo(h).busId): i for i, h in enumerate(handles)}
    lanes: dict[tuple[int, int], int] = {}
    switched = [0] * count  # lanes to something that is not one of the GPUs (an NVSwitch)
    max_links = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))
    for i, h in enumerate(handles):
        for link in range(max_links):
            try:
                if not int(nvml.nvmlDeviceGetNvLinkState(h, link)):
                    continue
                remote = _bus_id(nvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId)
            except Exception:  # NotSupported (no NVLink), InvalidArgument (past the last)
                continue
            j = bus.get(remote)
            if j is None:
                switched[i] += 1
            elif j != i:
                key = (min(i, j), max(i, j))
                lanes[key] = lanes.get(key, 0) + 1
    links: list[dict[str, Any]] = []
    for a in range(count):
        for b in range(a + 1, count):
            # each direct lane is seen from both ends
            n = (lanes.get((a, b), 0) + 1) // 2 or min(switched[a], switched[b])
            try:
                level = int(nvml.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b]))
                pcie = NVML_LEVELS.get(level, str(level))
            except Exception:
                pcie = "?"
            links.append({"a": a, "b": b, "relation": f"NV{n}" if n else pcie, "nvlinks": n,
                          "pcie": pcie, "via": "pynvml"})
    return links


def smi_links(text: str) -> list[dict[str, Any]]:
    """Each GPU pair's relation from an ``nvidia-smi topo -m`` matrix (parsed by
    :func:`ringworld.topology.discover.parse_smi_topo`). Raises: ValueError (no matrix)."""
    from ringworld.topology.discover import parse_smi_topo

    smi = parse_smi_topo(text)
    gpu = {name: int(name[3:]) for name in smi.names if re.fullmatch(r"GPU\d+", name)}
    links: list[dict[str, Any]] = []
    for (x, y), rel in sorted(smi.relation.items(), key=lambda kv: (gpu.get(kv[0][0], -1),
                                                                    gpu.get(kv[0][1], -1))):
        if x in gpu and y in gpu and gpu[x] < gpu[y]:
            m = re.fullmatch(r"NV(\d+)", rel)
            links.append({"a": gpu[x], "b": gpu[y], "relation": rel,
                          "nvlinks": int(m.group(1)) if m else 0, "pcie": None if m else rel,
                          "via": "nvidia-smi"})
    return links


def gpu_links(smi_text: str | None = None,
              timeout: float = SMI_TIMEOUT) -> tuple[list[dict[str, Any]], str]:
    """(each GPU pair's link, why there are none: '' when some were found). Never raises.

    Each link is ``{"a", "b", "relation", "nvlinks", "pcie", "via"}``: GPU indices a < b, the
    relation in ``nvidia-smi topo -m``'s letters (``NV<k>``, ``PIX``, ``PXB``, ``PHB``,
    ``NODE``, ``SYS``), the NVLink lanes, the PCIe relation (None when the matrix only says
    NV<k>). NVML when pynvml works, else ``smi_text`` (the ``nvidia-smi topo -m`` output
    already run, e.g. by :func:`~ringworld.topology.discover.discover`) or a new run.
    """
    nvml, why_nvml = _pynvml()
    if nvml is not None:
        try:
            links = _nvml_links(nvml)
        except Exception as exc:
            why_nvml = f"NVML failed reading links ({_text(exc) or type(exc).__name__})"
        else:
            if links:
                return links, ""
            why_nvml = "NVML sees fewer than two GPUs"
        finally:
            _shutdown(nvml)
    why_smi = ""
    if smi_text is None:
        smi_text, why_smi = _run_smi(["topo", "-m"], timeout)
    if smi_text is not None:
        try:
            links = smi_links(smi_text)
        except ValueError as exc:
            why_smi = f"nvidia-smi topo -m: {exc}"
        else:
            if links:
                return links, ""
            why_smi = "nvidia-smi topo -m shows fewer than two GPUs"
    return [], f"{why_nvml}; {why_smi}"


def topo_lines(smi_text: str | None = None, with_nccl: bool = True) -> list[str]:
    """The ``GPUs:`` section of ``ringworld topo``: each GPU, each pair's link and the NCCL
    library; one line saying why when there are no GPUs (``smi_text``: see :func:`gpu_links`).
    """
    gpus, reason = list_gpus()
    if not gpus:
        return [f"  GPUs: none found: {reason}"]
    lines = [f"GPUs: {len(gpus)} (via {gpus[0]['via']})"]
    for g in gpus:
        mem = f"{g['memory_mib']} MiB" if g["memory_mib"] is not None else "? MiB"
        lines.append(f"  GPU{g['index']:<3} {g['name']}  {mem}"
                     + (f"  {g['uuid']}" if g["uuid"] else ""))
    if len(gpus) > 1:
        links, why = gpu_links(smi_text)
        if links:
            lines.append(f"  links (via {links[0]['via']}):")
            lines += [f"    GPU{ln['a']}-GPU{ln['b']}  {ln['relation']}"
                      + (f" (PCIe {ln['pcie']})" if ln["nvlinks"] and ln["pcie"] else "")
                      for ln in links]
        else:
            lines.append(f"  links: unknown ({why})")
    if with_nccl:
        lines.append(nccl_line())
    return lines


def nccl_line() -> str:
    """``NCCL: 2.32.3 (path, nccl4py 0.6.0)`` or ``NCCL: not installed (why)``."""
    from ringworld.device import nccl

    lib = nccl.library()
    if not lib.available:
        return f"NCCL: not installed ({lib.reason})"
    extra = [x for x in (lib.path, lib.binding and f"nccl4py {lib.binding}") if x]
    return f"NCCL: {lib.version}" + (f" ({', '.join(extra)})" if extra else "")
