"""Buffers from other array libraries, adopted as numpy arrays without a copy.

Every call that takes a buffer (point-to-point, the collectives, ``ringworld.MPI``) accepts,
besides numpy arrays and buffer-protocol objects: any DLPack object in host memory (torch CPU
tensors, JAX and CuPy host arrays, ...: ``numpy.from_dlpack``) and any object with
``__array_interface__``. The array shares the object's memory, so results land in it.

Memory on a device (a DLPack device other than the CPU, or ``__cuda_array_interface__``) is
refused with :class:`DeviceBuffer`, which names the device: device buffers are for a device
plane (NCCL), which takes them before they reach these host paths.

Cost: one attribute probe for objects that are neither; ``from_dlpack`` is about a microsecond.
"""

from __future__ import annotations

from typing import Any

#: DLPack device types whose memory the CPU reads directly (CPU, CUDA host, ROCm host)
_HOST_DEVICES = frozenset({1, 3, 11})
_DEVICE_NAMES = {2: "CUDA", 4: "OpenCL", 7: "Vulkan", 8: "Metal", 9: "VPI", 10: "ROCm",
                 13: "CUDA managed", 14: "oneAPI"}


class DeviceBuffer(TypeError):
    """A buffer in device memory reached a host path. ``device`` is (DLPack type, index)."""

    def __init__(self, message: str, device: tuple[int, int]) -> None:
        super().__init__(message)
        self.device = device


def is_foreign(buf: Any) -> bool:
    """Whether ``buf`` is an array of another library that :func:`host_array` can adopt (or
    must refuse as device memory). Cost: up to three attribute probes."""
    return (hasattr(buf, "__dlpack__") or hasattr(buf, "__array_interface__")
            or hasattr(buf, "__cuda_array_interface__"))


def host_array(buf: Any, name: str) -> Any:
    """``buf`` as a numpy array sharing its memory, or None if it is no foreign array.

    Raises:
        DeviceBuffer: ``buf`` lives in device memory (the device is named).
        TypeError: the library will not export it (a tensor that requires grad: detach it),
            or numpy has no dtype for it (bfloat16, float8: view it as same-sized ints).
    """
    dlpack_device = getattr(buf, "__dlpack_device__", None)
    if dlpack_device is not None and hasattr(buf, "__dlpack__"):
        kind, index = (int(v) for v in dlpack_device())
        if kind not in _HOST_DEVICES:
            where = _DEVICE_NAMES.get(kind, f"DLPack device type {kind}")
            raise DeviceBuffer(f"{name} is in {where} memory (device {index}); device buffers "
                               f"need the GPU plane, and this call runs on host memory: pass a "
                               f"host (CPU) array or tensor", (kind, index))
        import numpy as np

        try:
            return np.from_dlpack(buf)
        except BufferError as exc:  # e.g. torch: "Can't export tensors that require gradient"
            raise TypeError(f"{name} ({type(buf).__name__}) cannot be shared: {exc}") from None
        except (RuntimeError, TypeError, ValueError) as exc:
            raise TypeError(f"{name} ({type(buf).__name__}) has no numpy equivalent ({exc}); a "
                            "dtype numpy lacks (bfloat16, float8) can move as same-sized "
                            "integers: pass a view of it as int16 or uint8") from None
    if hasattr(buf, "__cuda_array_interface__"):
        raise DeviceBuffer(f"{name} is in CUDA memory (it has __cuda_array_interface__); device "
                           "buffers need the GPU plane, and this call runs on host memory",
                           (2, -1))
    if hasattr(buf, "__array_interface__"):
        import numpy as np

        return np.asarray(buf)
    return None
