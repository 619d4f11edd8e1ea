"""Device buffers described (:mod:`ringworld.device.buffers`) from real objects: numpy's own
DLPack capsules read without consuming them, host arrays and tensors told apart from device
ones, ``__cuda_array_interface__`` dictionaries, DLPack objects that claim a device, and stream
arguments.

Nothing here needs a GPU, a CUDA driver or NCCL: the CUDA objects are fakes that are described
and never dereferenced (their pointers are made up), and the CUDA DLPack capsules are built with
ctypes in DLPack's own layout.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import pytest
from dlpack_support import Managed, capsule_new

from ringworld.device import buffers
from ringworld.device.buffers import DeviceArray

pytestmark = pytest.mark.timeout(30)

FAKE_PTR = 0x7F0000000000  # a made-up device address: described, never dereferenced

INTS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
FLOATS = ("float16", "float32", "float64")


# ---------------------------------------------------------------------- DLPack, built by hand
_NAMES = {name: ctypes.create_string_buffer(name) for name in (b"dltensor", b"other")}


class Handmade:
    """A DLPack producer of made-up memory: its capsule (no destructor) points into this
    object, so a test holds the object for as long as it reads the capsule."""

    def __init__(self, shape: tuple[int, ...] = (4,), *, ptr: int = FAKE_PTR,
                 device: tuple[int, int] = (buffers.DL_CUDA, 0), code: int = 2, bits: int = 32,
                 lanes: int = 1, strides: tuple[int, ...] | None = None, byte_offset: int = 0,
                 says: tuple[int, int] | None = None, name: bytes = b"dltensor") -> None:
        self._shape = (ctypes.c_int64 * max(1, len(shape)))(*shape)
        self._strides = None if strides is None else (ctypes.c_int64 * len(strides))(*strides)
        self._managed = Managed()
        t = self._managed.dl_tensor
        t.data = ptr
        t.device.device_type, t.device.device_id = device
        t.ndim = len(shape)
        t.dtype.code, t.dtype.bits, t.dtype.lanes = code, bits, lanes
        t.shape = self._shape
        if self._strides is not None:
            t.strides = self._strides
        t.byte_offset = byte_offset
        self._says = device if says is None else says
        self._name = name
        self.asked: list[dict[str, Any]] = []  # the keyword arguments of each __dlpack__ call

    def capsule(self) -> Any:
        return capsule_new(ctypes.addressof(self._managed),
                            ctypes.cast(_NAMES[self._name], ctypes.c_char_p), None)

    def __dlpack__(self, **kwargs: Any) -> Any:
        self.asked.append(kwargs)
        return self.capsule()

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._says


class Claims:
    """A DLPack object that says ``device`` but exports ``array``'s (numpy's, host) capsule."""

    def __init__(self, array: np.ndarray, device: tuple[int, int]) -> None:
        self._a, self._device = array, device

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._a.__dlpack__()  # numpy takes no stream

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._device


class CAI:
    """An object exposing only ``__cuda_array_interface__``."""

    def __init__(self, **cai: Any) -> None:
        self.__cuda_array_interface__ = cai


def cai(shape: tuple[int, ...] = (4,), typestr: str = "<f4", **extra: Any) -> CAI:
    d: dict[str, Any] = {"shape": shape, "typestr": typestr, "data": (FAKE_PTR, False),
                         "version": 3, "strides": None, "stream": None}
    d.update(extra)
    return CAI(**d)


# ---------------------------------------------------------------------- numpy's own capsules
@pytest.mark.parametrize("name", INTS + FLOATS + ("bool",))
def test_numpy_capsule_element_types(name: str) -> None:
    a = np.arange(12).astype(name).reshape(3, 4)
    c = buffers.read_capsule(a.__dlpack__(), "a")
    assert c.dtype == np.dtype(name).name == name
    assert c.itemsize == a.itemsize
    assert c.shape == (3, 4)
    assert c.ptr == a.ctypes.data
    assert (c.device_type, c.device_id) == (buffers.DL_CPU, 0)
    assert c.contiguous


@pytest.mark.parametrize(("make", "shape"), [
    (lambda: np.arange(10, dtype=np.float64)[1:], (9,)),
    (lambda: np.arange(10, dtype=np.uint16)[2:], (8,)),
    (lambda: np.arange(24, dtype=np.int32).reshape(4, 6)[1:], (3, 6)),
    (lambda: np.arange(24, dtype=np.int8).reshape(4, 6)[3:, :], (1, 6)),
    (lambda: np.array(2.5), ()),
])
def test_numpy_capsule_pointer_of_views(make: Any, shape: tuple[int, ...]) -> None:
    a = make()
    c = buffers.read_capsule(a.__dlpack__(), "a")
    assert c.ptr == a.ctypes.data  # data + byte_offset: the view's first element
    assert c.shape == shape == a.shape
    assert c.contiguous


def _strided(shape: tuple[int, ...], strides: tuple[int, ...]) -> np.ndarray:
    return np.lib.stride_tricks.as_strided(np.zeros(64), shape, strides)


@pytest.mark.parametrize(("make", "contiguous"), [
    (lambda: np.zeros((4, 6))[:, ::2], False),
    (lambda: np.zeros((4, 6)).T, False),
    (lambda: np.zeros(8)[::2], False),
    (lambda: np.zeros((4, 6))[::-1], False),
    (lambda: np.zeros((4, 6))[:, 2:3], False),  # a column: extent 1 last, but rows apart
    (lambda: np.zeros((3, 0)), True),
    (lambda: np.zeros((4, 6))[:0, ::2], True),  # size 0: strided or not, nothing to move
    (lambda: np.zeros((4, 6))[::5], True),  # shape (1, 6), stride 240 on the extent-1 dim
    (lambda: _strided((2, 1, 3), (24, 56, 8)), True),  # an odd stride (7 elements), extent 1
    (lambda: _strided((1, 1), (808, 8)), True),
])
def test_numpy_capsule_contiguity(make: Any, contiguous: bool) -> None:
    a = make()
    c = buffers.read_capsule(a.__dlpack__(), "a")
    assert c.contiguous is contiguous
    assert c.contiguous == a.flags.c_contiguous  # numpy's own rule agrees
    assert c.shape == a.shape


def test_capsule_not_consumed_and_reread() -> None:
    a = np.arange(5, dtype=np.int64)
    capsule = a.__dlpack__()
    first = buffers.read_capsule(capsule, "a")
    assert buffers.read_capsule(capsule, "a") == first  # reading does not consume it
    assert np.from_dlpack(a)[4] == 4


def test_read_capsule_refuses_what_it_cannot_read() -> None:
    with pytest.raises(TypeError, match="not an unconsumed DLPack capsule"):
        buffers.read_capsule(b"not a capsule", "x")
    with pytest.raises(TypeError, match="x: __dlpack__"):
        buffers.read_capsule(Handmade(name=b"other").capsule(), "x")  # another capsule name
    with pytest.raises(TypeError, match="not an unconsumed"):  # DLPack 1.x: a versioned one
        buffers.read_capsule(np.zeros(3).__dlpack__(max_version=(1, 0)), "x")
    with pytest.raises(TypeError, match=r"code 5, 64 bits"):  # numpy's complex64
        buffers.read_capsule(np.zeros(3, np.complex64).__dlpack__(), "x")
    lanes, odd = Handmade(lanes=4), Handmade(bits=24)  # held: their capsules point into them
    with pytest.raises(TypeError, match=r"4 lanes"):
        buffers.read_capsule(lanes.capsule(), "x")
    with pytest.raises(TypeError, match=r"code 2, 24 bits"):
        buffers.read_capsule(odd.capsule(), "x")


def test_handmade_capsule_fields() -> None:
    h = Handmade((2, 3), device=(buffers.DL_CUDA, 3), code=4, bits=16, strides=(3, 1),
                 byte_offset=64)
    c = buffers.read_capsule(h.capsule(), "h")
    assert c == buffers.Capsule(FAKE_PTR + 64, buffers.DL_CUDA, 3, "bfloat16", 2, (2, 3), True)
    for (code, bits), name in {(10, 8): "float8_e4m3fn", (12, 8): "float8_e5m2",
                               (6, 8): "bool", (1, 64): "uint64"}.items():
        typed = Handmade(code=code, bits=bits)
        assert buffers.read_capsule(typed.capsule(), "h").dtype == name
    strided = Handmade((2, 3), strides=(1, 2))
    assert not buffers.read_capsule(strided.capsule(), "h").contiguous


# ---------------------------------------------------------------------- host objects
def test_host_numpy_is_not_described() -> None:
    for a in (np.zeros(3), np.zeros((2, 2), np.int16)[:, ::2], np.array(1.0)):
        assert buffers.describe(a, "a") is None
        assert buffers.is_device(a) is False
    assert buffers.describe(Claims(np.zeros(3), (buffers.DL_CPU, 0)), "a") is None
    assert buffers.describe(Claims(np.zeros(3), (buffers.DL_CUDA_HOST, 0)), "a") is None
    assert buffers.describe(b"bytes", "a") is None
    assert buffers.describe(object(), "a") is None
    assert buffers.describe(None, "a") is None


def test_host_torch_tensor_is_not_described() -> None:
    torch = pytest.importorskip("torch")
    t = torch.arange(6, dtype=torch.int16)
    assert buffers.describe(t, "t") is None
    assert buffers.is_device(t) is False
    c = buffers.read_capsule(torch.utils.dlpack.to_dlpack(t[2:]), "t")  # torch's own capsule
    assert (c.ptr, c.dtype, c.itemsize, c.shape) == (t[2:].data_ptr(), "int16", 2, (4,))


# ---------------------------------------------------------------------- CUDA array interface
def test_interface_parsed() -> None:
    obj = cai((2, 3), "<i8", stream=5, data=(FAKE_PTR + 16, True))
    a = buffers.describe(obj, "buf")
    assert a is not None
    assert (a.ptr, a.elements, a.dtype, a.itemsize, a.nbytes, a.readonly, a.stream, a.device) \
        == (FAKE_PTR + 16, 6, "int64", 8, 48, True, 5, -1)
    assert a.size == 6
    assert a.keep is obj  # the object keeps its memory alive
    b = buffers.describe(cai((7,), "<f2", version=2), "buf")  # version 2: stream None
    assert b is not None
    assert (b.elements, b.dtype, b.itemsize, b.readonly, b.stream) == (7, "float16", 2, False, None)
    d = {"shape": (3,), "typestr": "|u1", "data": (FAKE_PTR, False), "version": 3}
    c = buffers.describe(CAI(**d), "buf")  # no strides, no stream keys at all
    assert c is not None
    assert (c.elements, c.dtype, c.stream, c.device) == (3, "uint8", None, -1)


@pytest.mark.parametrize(("typestr", "name"), [
    ("|i1", "int8"), ("<i2", "int16"), ("<i4", "int32"), ("<i8", "int64"), ("|u1", "uint8"),
    ("<u2", "uint16"), ("<u4", "uint32"), ("<u8", "uint64"), ("<f2", "float16"),
    ("<f4", "float32"), ("<f8", "float64"), ("|b1", "bool"),
])
def test_interface_element_types(typestr: str, name: str) -> None:
    a = buffers.describe(cai((5,), typestr), "buf")
    assert a is not None
    assert (a.dtype, a.itemsize, a.nbytes) == (name, np.dtype(name).itemsize,
                                              5 * np.dtype(name).itemsize)


def test_interface_empty_and_scalar() -> None:
    a = buffers.describe(cai((0, 4), data=(0, False)), "buf")
    assert a is not None
    assert (a.ptr, a.elements, a.nbytes) == (0, 0, 0)
    s = buffers.describe(cai(()), "buf")
    assert s is not None
    assert s.elements == 1


@pytest.mark.parametrize(("shape", "strides"), [
    ((2, 3), (12, 4)), ((4,), (4,)), ((3, 1), (4, 4)), ((3, 1), (4, 100)), ((1, 5), (999, 4)),
    ((0, 3), (7, 4)), ((2, 0), (4, 4)),
])
def test_interface_c_contiguous_strides_accepted(shape: tuple[int, ...],
                                                  strides: tuple[int, ...]) -> None:
    a = buffers.describe(cai(shape, "<f4", strides=strides), "buf")
    assert a is not None
    assert a.elements == int(np.prod(shape))


@pytest.mark.parametrize(("shape", "strides"), [
    ((2, 3), (4, 8)), ((4,), (8,)), ((2, 3), (16, 4)), ((3,), (-4,)), ((2, 2), (8, 8)),
])
def test_interface_strided_refused(shape: tuple[int, ...], strides: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="buf must be contiguous"):
        buffers.describe(cai(shape, "<f4", strides=strides), "buf")


@pytest.mark.parametrize("typestr", ["<c8", "<c16", ">i4", ">f8", "|O", "<M8[s]", "|V4", "<U1"])
def test_interface_element_types_refused(typestr: str) -> None:
    with pytest.raises(TypeError, match="cannot move on the device"):
        buffers.describe(cai((4,), typestr), "buf")


@pytest.mark.parametrize("broken", [
    {"shape": (4,), "typestr": "<f4", "version": 3},  # no data
    {"data": (FAKE_PTR, False), "typestr": "<f4", "version": 3},  # no shape
    {"shape": (4,), "data": (FAKE_PTR, False), "version": 3},  # no typestr
    {"shape": (4,), "typestr": "<f4", "data": FAKE_PTR, "version": 3},  # data not a pair
    {"shape": (4,), "typestr": "<f4", "data": None, "version": 3},
    {"shape": (4,), "typestr": "nonsense", "data": (FAKE_PTR, False), "version": 3},
    {"shape": "four", "typestr": "<f4", "data": (FAKE_PTR, False), "version": 3},
])
def test_interface_malformed(broken: dict[str, Any]) -> None:
    with pytest.raises(TypeError, match="buf: malformed __cuda_array_interface__"):
        buffers.describe(CAI(**broken), "buf")


def test_interface_mask_refused() -> None:
    with pytest.raises(TypeError, match="masked"):
        buffers.describe(cai(mask=CAI(shape=(4,), typestr="|b1", data=(FAKE_PTR, False))), "buf")
    assert buffers.describe(cai(mask=None), "buf") is not None


# ---------------------------------------------------------------------- DLPack claiming a device
def test_dlpack_cuda_capsule_described() -> None:
    h = Handmade((2, 4), device=(buffers.DL_CUDA, 1), code=0, bits=16, byte_offset=8)
    a = buffers.describe(h, "buf", stream=9)
    assert a is not None
    assert (a.ptr, a.elements, a.dtype, a.itemsize, a.device, a.readonly, a.stream) \
        == (FAKE_PTR + 8, 8, "int16", 2, 1, False, None)
    assert a.keep[0] is h  # the object and its capsule are held
    assert h.asked == [{"stream": 9}]  # the producer orders its work before the call's stream
    buffers.describe(h, "buf")
    assert h.asked[-1] == {"stream": 1}  # no stream: the legacy default stream (DLPack's 1)
    m = buffers.describe(Handmade(device=(buffers.DL_CUDA_MANAGED, 0)), "buf")
    assert m is not None
    assert m.device == 0


def test_dlpack_strided_device_capsule_refused() -> None:
    with pytest.raises(ValueError, match="buf must be contiguous"):
        buffers.describe(Handmade((2, 3), strides=(1, 2)), "buf")


def test_dlpack_device_mismatch_refused() -> None:
    fake = Claims(np.zeros(3, np.float32), (buffers.DL_CUDA, 0))
    with pytest.raises(TypeError, match=r"says device \(2, 0\) but its capsule holds memory "
                                        r"of device \(1, 0\)"):
        buffers.describe(fake, "buf")
    other_gpu = Handmade(device=(buffers.DL_CUDA, 1), says=(buffers.DL_CUDA, 0))
    with pytest.raises(TypeError, match=r"\(2, 1\)"):
        buffers.describe(other_gpu, "buf")


@pytest.mark.parametrize("kind", [4, 7, 8, 10, 14])  # OpenCL, Vulkan, Metal, ROCm, oneAPI
def test_dlpack_other_devices_refused(kind: int) -> None:
    with pytest.raises(TypeError, match=f"DLPack device type {kind}; device calls take CUDA"):
        buffers.describe(Handmade(device=(kind, 0)), "buf")


def test_dlpack_element_type_refused() -> None:
    with pytest.raises(TypeError, match="buf has a DLPack element type"):
        buffers.describe(Handmade(code=5, bits=64), "buf")  # complex64 on a GPU


# ---------------------------------------------------------------------- is_device
def test_is_device_each_kind() -> None:
    class Raising:
        def __dlpack__(self) -> Any:
            raise BufferError

        def __dlpack_device__(self) -> tuple[int, int]:
            raise RuntimeError("no device")

    assert buffers.is_device(cai()) is True
    assert buffers.is_device(Handmade()) is True
    assert buffers.is_device(Handmade(device=(10, 0))) is True  # device memory, if not CUDA
    assert buffers.is_device(Handmade(device=(buffers.DL_CUDA_MANAGED, 0))) is True
    assert buffers.is_device(Claims(np.zeros(2), (buffers.DL_CPU, 0))) is False
    assert buffers.is_device(Claims(np.zeros(2), (buffers.DL_CUDA_HOST, 0))) is False
    assert buffers.is_device(np.zeros(2)) is False
    assert buffers.is_device(memoryview(b"ab")) is False
    assert buffers.is_device(None) is False
    assert buffers.is_device(Raising()) is False  # never raises


# ---------------------------------------------------------------------- streams
def test_stream_handle_forms() -> None:
    class Torchish:
        cuda_stream = 0x55

    class Cupyish:
        ptr = 0x66

    class Protocol:
        def __cuda_stream__(self) -> tuple[int, int]:
            return (0, 0x77)

    assert buffers.stream_handle(0) == 0
    assert buffers.stream_handle(2) == 2
    assert buffers.stream_handle(0x7F00DEAD) == 0x7F00DEAD
    assert buffers.stream_handle(Torchish()) == 0x55
    assert buffers.stream_handle(Cupyish()) == 0x66
    assert buffers.stream_handle(Protocol()) == 0x77


@pytest.mark.parametrize("bad", [-1, -7, True, False, 1.0, "1", None, object(), [1]])
def test_stream_handle_refuses(bad: Any) -> None:
    with pytest.raises(TypeError, match="stream must be a CUDA stream"):
        buffers.stream_handle(bad)


def test_current_stream() -> None:
    a = DeviceArray(FAKE_PTR, 4, "float32", 4, 0, False, None, object())
    assert buffers.current_stream(a) == 0
    assert buffers.current_stream(a._replace(stream=12)) == 12


# ---------------------------------------------------------------------- DeviceArray
def test_device_array_at() -> None:
    a = DeviceArray(FAKE_PTR, 10, "float64", 8, 0, False, None, None)
    assert a.at(0) == FAKE_PTR
    assert a.at(1) == FAKE_PTR + 8
    assert a.at(10) == FAKE_PTR + 80  # one past the end: where a block after it starts
    assert (a.nbytes, a.size) == (80, 10)
    h = DeviceArray(FAKE_PTR + 2, 3, "float16", 2, 1, True, 4, None)
    assert [h.at(i) for i in range(3)] == [FAKE_PTR + 2, FAKE_PTR + 4, FAKE_PTR + 6]
    assert h.nbytes == 6


class _RefusingInterface:
    """What torch does for a CUDA tensor that requires grad, which a subclass defined outside
    torch's modules reaches: the interface property raises RuntimeError."""

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        raise RuntimeError("Can't get __cuda_array_interface__ on Variable that requires grad")


def test_is_device_never_raises_on_a_refusing_interface() -> None:
    assert buffers.is_device(_RefusingInterface()) in (True, False)
