"""NCCL through NVIDIA's binding: loading it, what this installation has, errors as Ringworld's.

The plane uses ``nccl4py``'s low-level module (``nccl.bindings.nccl``): its calls take raw device
pointers, counts and NCCL's enum values, so a call costs one C call and none of the high-level
module's per-call buffer resolution (which imports torch and CuPy to look at every buffer).
The library itself comes from ``nvidia-nccl-cu12``/``-cu13`` (or any ``libnccl.so.2`` that the
binding finds).

Cost: the first :func:`load` imports the binding (about 0.2 s); later calls are a global read.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from typing import Any

from ringworld.errors import DeviceError, DeviceUnavailable

INSTALL = ("pip install 'ringworld[nccl-cu12]' (CUDA 12 drivers) or "
           "'ringworld[nccl-cu13]' (CUDA 13)")

#: NCCL's ncclDataType_t by element name (the names of :mod:`ringworld.device.buffers`)
DTYPES: dict[str, int] = {
    "int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5,
    "float16": 6, "float32": 7, "float64": 8, "bfloat16": 9,
    "float8_e4m3fn": 10, "float8_e5m2": 11,
}
#: NCCL versions that first had a data type (older libraries reject it)
DTYPE_SINCE = {"bfloat16": (2, 10, 0), "float8_e4m3fn": (2, 24, 0), "float8_e5m2": (2, 24, 0)}
#: NCCL's ncclRedOp_t by Ringworld op name
OPS: dict[str, int] = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}

_binding: Any = None
_load_error: str | None = None


def load() -> Any:
    """The binding module (``nccl.bindings.nccl``), its library loaded.

    Raises:
        DeviceUnavailable: nccl4py is not installed, or it finds no NCCL library; the message
            says how to install them.
    """
    global _binding, _load_error
    if _binding is not None:
        return _binding
    if _load_error is None:
        try:
            from nccl.bindings import nccl as binding

            binding.get_version()  # loads libnccl.so.2: a missing library fails here
        except ImportError as exc:
            _load_error = (f"the NCCL binding (nccl4py) is not installed ({exc}); "
                           f"install it with {INSTALL}")
        except Exception as exc:  # the binding's loader raises its own types
            _load_error = (f"nccl4py found no NCCL library ({type(exc).__name__}: {exc}); "
                           f"install one with {INSTALL}")
        else:
            _binding = binding
            return binding
    raise DeviceUnavailable(f"device buffers need NCCL: {_load_error}")


def decode_version(code: int) -> tuple[int, int, int]:
    """NCCL's version integer (``ncclGetVersion``) as (major, minor, patch)."""
    if code >= 10000:  # 2.9 and later: major*10000 + minor*100 + patch
        return code // 10000, code % 10000 // 100, code % 100
    return code // 1000, code % 1000 // 100, code % 100


@dataclass(frozen=True)
class Library:
    """What this installation has of NCCL. ``reason`` says why it is unusable ('' if usable)."""

    available: bool
    version: str | None = None
    path: str | None = None
    binding: str | None = None
    reason: str = ""


def library() -> Library:
    """This installation's NCCL: the binding's version, the library's version and path, or
    why there is none. Loads the binding (see :func:`load`); no GPU needed."""
    try:
        binding_version: str | None = importlib.metadata.version("nccl4py")
    except importlib.metadata.PackageNotFoundError:
        binding_version = None
    try:
        b = load()
    except DeviceUnavailable as exc:
        return Library(False, binding=binding_version, reason=str(exc))
    version = ".".join(map(str, decode_version(int(b.get_version()))))
    path: str | None = None
    try:
        path = str(b.get_library_path())
    except Exception:  # older bindings have no get_library_path
        path = None
    return Library(True, version, path, binding_version)


def version() -> tuple[int, int, int]:
    """The loaded library's version. Raises: DeviceUnavailable."""
    return decode_version(int(load().get_version()))


def dtype(name: str, what: str) -> int:
    """NCCL's data type for elements named ``name`` (see :mod:`ringworld.device.buffers`).

    Raises:
        TypeError: NCCL has no such type, or this library is older than the type.
    """
    code = DTYPES.get(name)
    if code is None:
        raise TypeError(f"{what} has elements of {name}, which NCCL cannot move or reduce; "
                        f"NCCL types: {', '.join(DTYPES)} (view other data as uint8 to move "
                        "it)")
    since = DTYPE_SINCE.get(name)
    if since is not None and version() < since:
        have = ".".join(map(str, version()))
        raise TypeError(f"{what}: {name} needs NCCL {'.'.join(map(str, since))} or newer, and "
                        f"this library is {have}")
    return code


def op(name: str) -> int:
    """NCCL's reduction for a Ringworld op name.

    Raises:
        TypeError: not one of NCCL's (user-defined ops cannot run on device buffers).
    """
    code = OPS.get(name)
    if code is None:
        raise TypeError(f"op {name!r} cannot reduce device buffers: NCCL reduces with "
                        f"{', '.join(s.upper() for s in OPS)}; a user-defined or logical op "
                        "needs host buffers (copy the data to the host for it)")
    return code


def error(exc: BaseException, what: str) -> DeviceError:
    """``exc`` (the binding's NCCLError) as a :class:`DeviceError` naming the call."""
    code = getattr(exc, "status", None)
    return DeviceError(f"{what}: NCCL: {exc}", int(code) if code is not None else None)


def check(what: str, fn: Any, *args: Any) -> Any:
    """``fn(*args)``, the binding's error raised as :class:`DeviceError` naming ``what``."""
    try:
        return fn(*args)
    except Exception as exc:
        if type(exc).__name__ == "NCCLError":
            raise error(exc, what) from exc
        raise
