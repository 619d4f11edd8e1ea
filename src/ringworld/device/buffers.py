"""Device buffers described: pointer, elements, type, device and the stream their data is on.

:func:`describe` reads any object in CUDA memory without importing its library:

- torch tensors (``data_ptr()``, ``dtype``, ``device``; bfloat16 and float8 included);
- ``__cuda_array_interface__`` (CuPy, Numba, PyCUDA, torch): shape, typestr, data, strides and,
  from version 3, the stream the producer's work is on;
- DLPack (``__dlpack__``/``__dlpack_device__``: JAX, cuda.core, CuPy...): the capsule's
  ``DLTensor`` is read with ctypes and the capsule is held for as long as the description, so
  the memory stays alive and is released the producer's way when it goes.

Only contiguous buffers are taken (NCCL moves flat ranges); element names are numpy's where
numpy has the type, else ``bfloat16``, ``float8_e4m3fn``, ``float8_e5m2``.

Streams (:func:`stream_handle`) are ints (CUDA's handles: 0 the default stream, 1 legacy, 2 per
thread), a torch or CuPy stream object, or anything with ``__cuda_stream__``.

Cost: a few attribute reads and, for DLPack, one capsule export (about a microsecond).
"""

from __future__ import annotations

import ctypes
import math
import sys
from typing import Any, NamedTuple

#: DLPack device types (dlpack.h)
DL_CPU, DL_CUDA, DL_CUDA_HOST, DL_CUDA_MANAGED = 1, 2, 3, 13

#: DLPack type codes (kDLInt, kDLUInt, kDLFloat, kDLBfloat, the float8 codes of DLPack 1.1)
_DL_NAMES = {(0, 8): "int8", (0, 16): "int16", (0, 32): "int32", (0, 64): "int64",
             (1, 8): "uint8", (1, 16): "uint16", (1, 32): "uint32", (1, 64): "uint64",
             (2, 16): "float16", (2, 32): "float32", (2, 64): "float64",
             (4, 16): "bfloat16", (6, 8): "bool", (10, 8): "float8_e4m3fn",
             (12, 8): "float8_e5m2"}

#: torch's dtype names (``str(tensor.dtype)`` without ``torch.``) as element names
_TORCH_NAMES = {"float": "float32", "double": "float64", "half": "float16", "long": "int64",
                "int": "int32", "short": "int16", "bool": "bool"}


class DeviceArray(NamedTuple):
    """One contiguous buffer in device memory. ``keep`` holds what keeps the memory alive
    (the object, or its DLPack capsule); ``stream`` is the producer's stream where it says one
    (CUDA array interface version 3, the library's current stream for torch), else None;
    ``device`` is -1 where the object does not say (the CUDA array interface: the plane asks
    CUDA which device the pointer is on)."""

    ptr: int
    elements: int
    dtype: str
    itemsize: int
    device: int
    readonly: bool
    stream: int | None
    keep: Any

    @property
    def nbytes(self) -> int:
        return self.elements * self.itemsize

    @property
    def size(self) -> int:
        """Elements (numpy's name, so the host's count checks apply)."""
        return self.elements

    def at(self, index: int) -> int:
        """The address of element ``index``."""
        return self.ptr + index * self.itemsize


class _DLDevice(ctypes.Structure):
    _fields_ = (("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32))


class _DLDataType(ctypes.Structure):
    _fields_ = (("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16))


class _DLTensor(ctypes.Structure):
    _fields_ = (("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64))


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = (ctypes.py_object, ctypes.c_char_p)
_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.restype = ctypes.c_int
_capsule_valid.argtypes = (ctypes.py_object, ctypes.c_char_p)


def _contiguous(shape: tuple[int, ...], strides: tuple[int, ...] | None, unit: int) -> bool:
    """Whether ``strides`` (in units of ``unit``) lay ``shape`` out C-contiguously (extents of
    1 may have any stride)."""
    if strides is None or math.prod(shape) == 0:
        return True
    expected = unit
    for extent, stride in zip(reversed(shape), reversed(strides), strict=True):
        if extent != 1 and stride != expected:
            return False
        expected *= extent
    return True


class Capsule(NamedTuple):
    """What a legacy DLPack capsule (``"dltensor"``) holds."""

    ptr: int
    device_type: int
    device_id: int
    dtype: str
    itemsize: int
    shape: tuple[int, ...]
    contiguous: bool


def read_capsule(capsule: Any, what: str) -> Capsule:
    """Read the ``DLTensor`` of an unconsumed DLPack capsule without consuming it (the
    capsule keeps the producer's memory alive; the caller holds it as long as it needs that).

    Raises:
        TypeError: not a DLPack capsule, or a type with lanes or a code this does not know.
    """
    if type(capsule).__name__ != "PyCapsule" or not _capsule_valid(capsule, b"dltensor"):
        raise TypeError(f"{what}: __dlpack__() returned {type(capsule).__name__}, not an "
                        "unconsumed DLPack capsule")
    t = _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    code, bits, lanes = t.dtype.code, t.dtype.bits, t.dtype.lanes
    name = _DL_NAMES.get((code, bits))
    if name is None or lanes != 1:
        raise TypeError(f"{what} has a DLPack element type (code {code}, {bits} bits, {lanes} "
                        "lanes) that device calls cannot take")
    itemsize = bits // 8
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = None if not t.strides else tuple(t.strides[i] for i in range(t.ndim))
    return Capsule((t.data or 0) + t.byte_offset, t.device.device_type, t.device.device_id,
                   name, itemsize, shape, _contiguous(shape, strides, 1))


def _torch(obj: Any, what: str) -> DeviceArray | None:
    if not obj.is_cuda:
        return None
    name = str(obj.dtype).removeprefix("torch.")
    name = _TORCH_NAMES.get(name, name)
    if not obj.is_contiguous():
        raise ValueError(f"{what} must be contiguous (a strided CUDA tensor of shape "
                         f"{tuple(obj.shape)}: call .contiguous())")
    index = obj.device.index
    torch = sys.modules["torch"]
    stream = int(torch.cuda.current_stream(index).cuda_stream)
    return DeviceArray(int(obj.data_ptr()), int(obj.numel()), name, int(obj.element_size()),
                       int(index), False, stream, obj)


def _interface(obj: Any, cai: dict[str, Any], what: str) -> DeviceArray:
    import numpy as np

    try:
        shape = tuple(int(n) for n in cai["shape"])
        ptr, readonly = cai["data"]
        dt = np.dtype(cai["typestr"])
    except (KeyError, TypeError, ValueError) as exc:
        raise TypeError(f"{what}: malformed __cuda_array_interface__ ({exc})") from None
    if dt.byteorder == ">" or dt.kind not in "biuf":
        raise TypeError(f"{what}: element type {cai['typestr']!r} cannot move on the device")
    raw = cai.get("strides")
    strides = None if raw is None else tuple(int(v) for v in raw)
    if not _contiguous(shape, strides, dt.itemsize):
        raise ValueError(f"{what} must be contiguous (strides {strides} for shape {shape})")
    if cai.get("mask") is not None:
        raise TypeError(f"{what}: masked CUDA arrays cannot move on the device")
    stream = cai.get("stream")
    # the interface does not say which device: -1, which the plane asks CUDA about
    return DeviceArray(int(ptr or 0), math.prod(shape), dt.name, dt.itemsize, -1,
                       bool(readonly), None if stream is None else int(stream), obj)


def _dlpack(obj: Any, kind: int, index: int, what: str, stream: int | None) -> DeviceArray:
    if kind not in (DL_CUDA, DL_CUDA_MANAGED):
        raise TypeError(f"{what} is in memory of DLPack device type {kind}; device calls take "
                        "CUDA memory")
    try:
        # the stream we will use: the producer orders its work before it (1: legacy default)
        capsule = obj.__dlpack__(stream=stream or 1)
    except (TypeError, RuntimeError, BufferError):  # a producer that takes no stream
        try:
            capsule = obj.__dlpack__()
        except Exception as exc:  # BufferError: DLPack's "cannot export"
            raise TypeError(f"{what} ({type(obj).__name__}) cannot be exported through "
                            f"DLPack: {exc}") from None
    c = read_capsule(capsule, what)
    if (c.device_type, c.device_id) != (kind, index):
        raise TypeError(f"{what}: __dlpack_device__() says device ({kind}, {index}) but its "
                        f"capsule holds memory of device ({c.device_type}, {c.device_id})")
    if not c.contiguous:
        raise ValueError(f"{what} must be contiguous (a strided array of shape {c.shape})")
    return DeviceArray(c.ptr, math.prod(c.shape), c.dtype, c.itemsize, c.device_id, False,
                       None, (obj, capsule))


def describe(obj: Any, what: str, stream: int | None = None) -> DeviceArray | None:
    """``obj`` as a :class:`DeviceArray` if it is in CUDA memory, else None (host memory or
    no array at all). ``stream``: the stream the call will run on (DLPack producers order
    their work before it).

    Raises:
        TypeError: device memory of another kind (ROCm, ...), an element type NCCL cannot
            take, or a malformed interface.
        ValueError: not contiguous.
    """
    module = type(obj).__module__
    if module.startswith("torch") and hasattr(obj, "is_cuda"):
        return _torch(obj, what)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        return _interface(obj, cai, what)
    dev = getattr(obj, "__dlpack_device__", None)
    if dev is not None and hasattr(obj, "__dlpack__"):
        kind, index = (int(v) for v in dev())
        if kind in (DL_CPU, DL_CUDA_HOST):
            return None
        return _dlpack(obj, kind, index, what, stream)
    return None


def is_device(obj: Any) -> bool:
    """Whether ``obj`` is a buffer in device memory (cheap: no description). Never raises."""
    try:
        module = type(obj).__module__
        if module.startswith("torch") and hasattr(obj, "is_cuda"):
            return bool(obj.is_cuda)
        if hasattr(obj, "__cuda_array_interface__"):
            return True
        dev = getattr(obj, "__dlpack_device__", None)
        return dev is not None and int(dev()[0]) not in (DL_CPU, DL_CUDA_HOST)
    except Exception:  # a property that refuses (torch: requires grad): not one we can take
        return False


def stream_handle(stream: Any) -> int:
    """A stream argument as CUDA's handle: an int, a torch stream (``cuda_stream``), a CuPy
    stream (``ptr``) or a ``__cuda_stream__`` object. Raises: TypeError."""
    if isinstance(stream, int) and not isinstance(stream, bool):
        if stream < 0:
            raise TypeError(f"stream must be a CUDA stream handle (>= 0), got {stream}")
        return stream
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        return int(proto()[1])
    for attr in ("cuda_stream", "ptr", "handle"):
        value = getattr(stream, attr, None)
        if isinstance(value, int):
            return value
    raise TypeError(f"stream must be a CUDA stream (an int handle, a torch.cuda.Stream, a "
                    f"cupy.cuda.Stream or a __cuda_stream__ object), got {type(stream).__name__}")


def current_stream(arr: DeviceArray) -> int:
    """The stream a call on ``arr`` runs on when none is given: the array library's current
    stream (torch's, CuPy's) or the producer's (CUDA array interface 3), else 0 (default)."""
    if arr.stream is not None:
        return arr.stream
    module = type(arr.keep).__module__
    if module.startswith("cupy"):
        cupy = sys.modules.get("cupy")
        if cupy is not None:
            return int(cupy.cuda.get_current_stream().ptr)
    return 0
