"""NCCL and the CUDA runtime as this installation has them (:mod:`ringworld.device.nccl`,
:mod:`ringworld.device.cuda`): the real binding (nccl4py) and library, the codes Ringworld
sends them checked against the binding's own enums, and NCCL's and CUDA's errors as Ringworld's.

No mocks: every call reaches the real library. Nothing needs a GPU; the tests of what happens
without one run only where ``cuda.probe()`` finds none (and skip elsewhere), and the tests of
the binding skip where nccl4py or cuda-bindings is not installed. Hiding a package is done by
``sys.modules`` (an import of it then fails as if it were not installed).
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import re
import sys
from typing import Any

import pytest

from ringworld.device import cuda, nccl
from ringworld.errors import DeviceError, DeviceUnavailable

pytestmark = pytest.mark.timeout(60)

#: the binding's names for Ringworld's element names and ops
ENUM_TYPES = {"int8": "Int8", "uint8": "Uint8", "int32": "Int32", "uint32": "Uint32",
              "int64": "Int64", "uint64": "Uint64", "float16": "Float16", "float32": "Float32",
              "float64": "Float64", "bfloat16": "Bfloat16", "float8_e4m3fn": "Float8e4m3",
              "float8_e5m2": "Float8e5m2"}
ENUM_OPS = {"sum": "Sum", "prod": "Prod", "max": "Max", "min": "Min", "avg": "Avg"}


@pytest.fixture
def binding() -> Any:
    """The real binding, its library loaded (skips where there is none)."""
    pytest.importorskip("nccl.bindings.nccl", reason="nccl4py is not installed")
    try:
        return nccl.load()
    except DeviceUnavailable as exc:
        pytest.skip(f"no NCCL library: {exc}")


@pytest.fixture
def runtime() -> Any:
    return pytest.importorskip("cuda.bindings.runtime", reason="cuda-bindings is not installed")


@pytest.fixture
def no_device(runtime: Any) -> str:
    """Why CUDA has no usable device here (skips where it has one)."""
    count, reason = cuda.probe()
    if count:
        pytest.skip(f"this machine has {count} CUDA device(s)")
    return reason


def _driver_present() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


# ---------------------------------------------------------------------- the binding and library
def test_load_returns_the_binding(binding: Any) -> None:
    import nccl.bindings.nccl as module

    assert binding is module
    assert nccl.load() is binding  # later calls: the same module, no new import
    assert nccl.version() == nccl.decode_version(int(binding.get_version()))


def test_library_says_what_is_installed(binding: Any) -> None:
    lib = nccl.library()
    assert lib.available is True
    assert lib.reason == ""
    assert lib.version == ".".join(map(str, nccl.decode_version(int(binding.get_version()))))
    assert lib.binding == importlib.metadata.version("nccl4py")
    assert lib.path is not None
    assert os.path.exists(lib.path)
    for package in ("nvidia-nccl-cu12", "nvidia-nccl-cu13"):
        try:
            dist = importlib.metadata.distribution(package)
        except importlib.metadata.PackageNotFoundError:
            continue
        files = {os.path.realpath(str(dist.locate_file(f))) for f in dist.files or ()
                 if "libnccl.so" in str(f)}
        if os.path.realpath(lib.path) in files:  # the library loaded is this package's
            numbers = re.match(r"(\d+)\.(\d+)\.(\d+)", dist.version)
            assert numbers is not None, dist.version
            assert lib.version == ".".join(numbers.groups()), (package, dist.version)


def test_unique_ids(binding: Any) -> None:
    first, second = bytes(binding.get_unique_id()), bytes(binding.get_unique_id())
    assert len(first) == len(second) == 128
    assert first != second
    # the plane's round trip of an id through the host communicator
    assert bytes(binding.UniqueId.from_buffer(bytearray(first))) == first


def test_decode_version() -> None:
    assert nccl.decode_version(23203) == (2, 32, 3)
    assert nccl.decode_version(21903) == (2, 19, 3)
    assert nccl.decode_version(20900) == (2, 9, 0)  # 2.9: the first of the new encoding
    assert nccl.decode_version(2708) == (2, 7, 8)  # before 2.9: major*1000 + minor*100 + patch
    assert nccl.decode_version(2408) == (2, 4, 8)


def test_codes_match_the_binding(binding: Any) -> None:
    assert set(ENUM_TYPES) == set(nccl.DTYPES)
    for name, enum in ENUM_TYPES.items():
        assert nccl.DTYPES[name] == int(getattr(binding.DataType, enum)), name
        assert nccl.dtype(name, "buf") == nccl.DTYPES[name]  # this library is new enough
    assert set(ENUM_OPS) == set(nccl.OPS)
    for name, enum in ENUM_OPS.items():
        assert nccl.OPS[name] == int(getattr(binding.RedOp, enum)), name
        assert nccl.op(name) == nccl.OPS[name]
    # the plane reads these results of ncclCommGetAsyncError as numbers
    assert int(binding.Result.Success) == 0
    assert int(binding.Result.InProgress) == 7


@pytest.mark.parametrize("name", ["int16", "uint16", "complex64", "complex128", "bool", "object"])
def test_dtype_refuses_what_nccl_lacks(name: str) -> None:
    with pytest.raises(TypeError, match=f"buf has elements of {name}, which NCCL cannot") as info:
        nccl.dtype(name, "buf")
    assert "NCCL types: int8, uint8, int32" in str(info.value)
    assert "float8_e5m2" in str(info.value)


@pytest.mark.parametrize("name", ["band", "bor", "lxor", "maxloc", "mine"])
def test_op_refuses_what_nccl_lacks(name: str) -> None:
    with pytest.raises(TypeError, match=f"op '{name}' cannot reduce device buffers: NCCL "
                                        "reduces with SUM, PROD, MAX, MIN, AVG"):
        nccl.op(name)


# ---------------------------------------------------------------------- NCCL's errors
def test_failed_init_without_a_device(binding: Any, no_device: str) -> None:
    with pytest.raises(DeviceError, match=r"^making: NCCL: ") as info:
        nccl.check("making", binding.comm_init_rank_config, 1, binding.get_unique_id(), 0,
                   binding.Config().ptr)
    assert isinstance(info.value.code, int)
    assert info.value.code != 0
    assert type(info.value.__cause__).__name__ == "NCCLError"


def test_null_communicator_is_an_invalid_argument(binding: Any) -> None:
    with pytest.raises(DeviceError, match=r"^allreduce: NCCL: .*invalid argument") as info:
        nccl.check("allreduce", binding.all_reduce, 1, 1, 1, 7, 0, binding.Comm(0), 0)
    assert info.value.code == 4  # ncclInvalidArgument
    assert info.value.code == int(binding.Result.InvalidArgument)


def test_check_passes_results_and_other_errors_through() -> None:
    assert nccl.check("add", lambda a, b: a + b, 2, 3) == 5
    with pytest.raises(ZeroDivisionError):
        nccl.check("divide", lambda: 1 // 0)


def test_error_without_a_status() -> None:
    e = nccl.error(RuntimeError("lost"), "bcast")
    assert isinstance(e, DeviceError)
    assert str(e) == "bcast: NCCL: lost"
    assert e.code is None


def test_no_binding_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nccl", None)  # `import nccl...` fails: not installed
    monkeypatch.setitem(sys.modules, "nccl.bindings", None)
    monkeypatch.setattr(nccl, "_binding", None)
    monkeypatch.setattr(nccl, "_load_error", None)
    with pytest.raises(DeviceUnavailable, match=r"nccl4py.*not installed") as info:
        nccl.load()
    assert "pip install 'ringworld[nccl-cu12]'" in str(info.value)
    with pytest.raises(DeviceUnavailable) as again:
        nccl.load()
    assert str(again.value) == str(info.value)  # the failure is kept: no second import
    lib = nccl.library()
    assert lib.available is False
    assert lib.version is None
    assert lib.path is None
    assert "pip install 'ringworld[nccl-cu12]'" in lib.reason


# ---------------------------------------------------------------------- CUDA
def test_probe_without_a_device(no_device: str) -> None:
    assert cuda.probe() == (0, no_device)
    assert "no usable CUDA device" in no_device
    if not _driver_present():
        assert "driver" in no_device.lower()  # no driver: the reason names it


def test_calls_without_a_device(no_device: str) -> None:
    with pytest.raises(DeviceUnavailable, match="cudaGetDeviceCount: no usable CUDA device"):
        cuda.device_count()
    with pytest.raises(DeviceUnavailable, match="cudaGetDevice: no usable CUDA device"):
        cuda.current_device()
    with pytest.raises(DeviceUnavailable, match="cudaPointerGetAttributes"):
        cuda.pointer_device(0x7F0000000000)


def test_versions(runtime: Any) -> None:
    v = cuda.versions()
    assert v["cuda-bindings"] == importlib.metadata.version("cuda-bindings")
    assert v["runtime"] is not None
    assert re.fullmatch(r"\d+\.\d+", v["runtime"])
    if not _driver_present():
        assert v["driver"] is None


def test_no_runtime_binding_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cuda", None)
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    monkeypatch.setattr(cuda, "_rt", None)
    with pytest.raises(DeviceUnavailable, match=r"cuda-bindings.*not installed") as info:
        cuda.runtime()
    assert "pip install 'ringworld[nccl-cu12]'" in str(info.value)
    count, reason = cuda.probe()  # never raises
    assert count == 0
    assert "cuda-bindings" in reason
