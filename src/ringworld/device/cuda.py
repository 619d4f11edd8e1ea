"""The little of the CUDA runtime the device plane needs: devices, the current device, events.

Through NVIDIA's ``cuda-bindings`` (``cuda.bindings.runtime``), which the ``nccl-cu12``/
``nccl-cu13`` extras install. Every call returns CUDA's error as :class:`DeviceError` (or
:class:`DeviceUnavailable` when there is no driver or no device), named.

Cost: the first use imports the binding (tens of milliseconds); an event record or query is one
C call (about a microsecond).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ringworld.errors import DeviceError, DeviceUnavailable

INSTALL = ("pip install 'ringworld[nccl-cu12]' (CUDA 12 drivers) or "
           "'ringworld[nccl-cu13]' (CUDA 13), which bring cuda-bindings")

_rt: Any = None

#: CUDA errors that mean "no usable GPU here" rather than a failed call
_NO_DEVICE = frozenset({"cudaErrorInsufficientDriver", "cudaErrorNoDevice",
                        "cudaErrorInitializationError", "cudaErrorCompatNotSupportedOnDevice",
                        "cudaErrorSystemDriverMismatch"})


def runtime() -> Any:
    """``cuda.bindings.runtime``. Raises: DeviceUnavailable (cuda-bindings not installed)."""
    global _rt
    if _rt is None:
        try:
            from cuda.bindings import runtime as rt
        except ImportError as exc:
            raise DeviceUnavailable(f"device buffers need the CUDA runtime binding "
                                    f"(cuda-bindings), which is not installed ({exc}); "
                                    f"install it with {INSTALL}") from None
        _rt = rt
    return _rt


def _call(what: str, fn: Any, *args: Any) -> Any:
    """``fn(*args)`` of the runtime binding, its (error, value...) tuple checked."""
    out = fn(*args)
    err, rest = out[0], out[1:]
    if int(err) != 0:
        name = getattr(err, "name", str(int(err)))
        text = runtime().cudaGetErrorString(err)[1]
        message = text.decode() if isinstance(text, bytes) else str(text)
        if name in _NO_DEVICE:
            raise DeviceUnavailable(f"{what}: no usable CUDA device here: {message} ({name})")
        raise DeviceError(f"{what}: CUDA: {message} ({name})")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


def device_count() -> int:
    """How many CUDA devices this process sees. Raises: DeviceUnavailable (none usable)."""
    return int(_call("cudaGetDeviceCount", runtime().cudaGetDeviceCount))


def probe() -> tuple[int, str]:
    """(devices visible, why none is usable: '' if some are). Never raises."""
    try:
        return device_count(), ""
    except (DeviceUnavailable, DeviceError) as exc:
        return 0, str(exc)


def versions() -> dict[str, str | None]:
    """The CUDA driver's and runtime's versions ("12.9"), and cuda-bindings', where known."""
    out: dict[str, str | None] = {"driver": None, "runtime": None, "cuda-bindings": None}
    try:
        out["cuda-bindings"] = importlib.metadata.version("cuda-bindings")
    except importlib.metadata.PackageNotFoundError:
        return out
    rt = runtime()
    for key, fn in (("driver", rt.cudaDriverGetVersion), ("runtime", rt.cudaRuntimeGetVersion)):
        try:
            v = int(_call(key, fn))
        except (DeviceError, DeviceUnavailable):
            continue
        if v:  # 0: no driver
            out[key] = f"{v // 1000}.{v % 1000 // 10}"
    return out


def current_device() -> int:
    """The calling thread's current device. Raises: DeviceUnavailable, DeviceError."""
    return int(_call("cudaGetDevice", runtime().cudaGetDevice))


def set_device(index: int) -> None:
    """Make ``index`` the calling thread's current device. Raises: DeviceError."""
    _call(f"cudaSetDevice({index})", runtime().cudaSetDevice, index)


@contextmanager
def on(index: int) -> Iterator[None]:
    """Run the block with ``index`` as the current device, restoring the previous one."""
    before = current_device()
    if before == index:
        yield
        return
    set_device(index)
    try:
        yield
    finally:
        set_device(before)


class Event:
    """A CUDA event (no timing): recorded on a stream after the work it marks; ``done()``
    polls it, ``wait()`` blocks the calling thread until it is reached."""

    __slots__ = ("_event", "_rt")

    def __init__(self) -> None:
        rt = runtime()
        self._rt = rt
        self._event = _call("cudaEventCreateWithFlags", rt.cudaEventCreateWithFlags,
                            rt.cudaEventDisableTiming)

    def record(self, stream: int) -> None:
        """Mark the point ``stream`` has reached. Raises: DeviceError."""
        _call("cudaEventRecord", self._rt.cudaEventRecord, self._event,
              self._rt.cudaStream_t(stream))

    def done(self) -> bool:
        """Whether the work before the record has finished. Raises: DeviceError (a fault)."""
        err = self._rt.cudaEventQuery(self._event)[0]
        if int(err) == 0:
            return True
        if err == self._rt.cudaError_t.cudaErrorNotReady:
            return False
        _call("cudaEventQuery", lambda: (err,))
        return False

    def wait(self) -> None:
        """Block until the work before the record has finished. Raises: DeviceError."""
        _call("cudaEventSynchronize", self._rt.cudaEventSynchronize, self._event)

    def __del__(self) -> None:
        event, rt = getattr(self, "_event", None), getattr(self, "_rt", None)
        if event is not None and rt is not None:
            rt.cudaEventDestroy(event)


def pointer_device(ptr: int) -> int:
    """The device whose memory ``ptr`` points into (managed and host memory: the current
    device). Raises: DeviceError (not a CUDA pointer), DeviceUnavailable."""
    rt = runtime()
    attrs = _call("cudaPointerGetAttributes", rt.cudaPointerGetAttributes, ptr)
    kind = attrs.type
    if kind == rt.cudaMemoryType.cudaMemoryTypeUnregistered:
        raise DeviceError(f"pointer {ptr:#x} is not CUDA memory (the array claims "
                          "__cuda_array_interface__)")
    if kind == rt.cudaMemoryType.cudaMemoryTypeDevice:
        return int(attrs.device)
    return current_device()


def copy(dst: int, src: int, nbytes: int, stream: int) -> None:
    """Enqueue a device-to-device copy of ``nbytes`` on ``stream``. Raises: DeviceError."""
    if nbytes:
        rt = runtime()
        _call("cudaMemcpyAsync", rt.cudaMemcpyAsync, dst, src, nbytes,
              rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice, rt.cudaStream_t(stream))


def scratch(nbytes: int, stream: int) -> int:
    """Device memory of ``nbytes``, allocated in ``stream``'s order; :func:`release` it on the
    same stream after the work that uses it. Raises: DeviceError (out of memory)."""
    rt = runtime()
    return int(_call("cudaMallocAsync", rt.cudaMallocAsync, max(1, nbytes),
                     rt.cudaStream_t(stream)))


def release(ptr: int, stream: int) -> None:
    """Free :func:`scratch` memory once ``stream`` reaches this point. Raises: DeviceError."""
    rt = runtime()
    _call("cudaFreeAsync", rt.cudaFreeAsync, ptr, rt.cudaStream_t(stream))


def local_device(select: bool = True) -> int:
    """This rank's GPU: ``RINGWORLD_DEVICE`` if set, else the local rank (``LOCAL_RANK``, set
    by ``ringworld run`` and torchrun) modulo the GPUs visible, else 0; with ``select`` also
    made the calling thread's current device, so that torch's and CuPy's new arrays land on it.
    Call it before allocating: one process per GPU is what NCCL expects.

    Raises:
        DeviceUnavailable: no driver or device. ValueError: RINGWORLD_DEVICE out of range.
    """
    import os

    count = device_count()
    given = os.environ.get("RINGWORLD_DEVICE", "").strip()
    if given:
        index = int(given)
        if not 0 <= index < count:
            raise ValueError(f"RINGWORLD_DEVICE={given}: this process sees {count} GPU(s)")
    else:
        index = int(os.environ.get("LOCAL_RANK", "0") or 0) % max(1, count)
    if select:
        set_device(index)
    return index
