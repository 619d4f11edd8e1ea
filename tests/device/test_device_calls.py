"""Collectives on device buffers through the communicator (the thread tier, 1 to 3 ranks): the
device table's checks (:mod:`ringworld.collective.device_calls`), the plane's check beside the
GPU work (:mod:`ringworld.device.plane`), and what a call does where there is no GPU or no NCCL.

No GPU is used, and none is needed. The device buffers are fakes whose memory is never touched:

- :class:`Interface` has only ``__cuda_array_interface__`` and a made-up pointer. It does not say
  which GPU holds it, so a call that passes every check asks CUDA (``cudaPointerGetAttributes``)
  and, with no driver, stops there with DeviceUnavailable;
- :class:`Handmade` is a DLPack producer whose capsule (built with ctypes) says CUDA device 0.
  Its device is known, so its calls pass every local check without CUDA; they reach the plane's
  check (the host allgather of every rank's record), where a refusal or a mismatch is found
  before any NCCL communicator is made.

Every refusal is made twice in a row and followed by a host allreduce on the same communicator,
which must give the right sum: a refused device call leaves the communicator usable. Where an
outcome depends on the installation, the test says which and computes what to expect.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from dlpack_support import Managed, capsule_new

import ringworld
from ringworld.collective import device_calls
from ringworld.device import buffers, cuda, nccl, plane
from ringworld.device.buffers import DeviceArray
from ringworld.errors import DeviceUnavailable
from ringworld.testing import run_threads

pytestmark = pytest.mark.timeout(60)

SIZES = [1, 2, 3]
FAKE_PTR = 0x7F0000000000  # a made-up device address: described, never dereferenced
HOST = "is in host memory, and the call's other buffers are on a GPU"
NCCL_OPS = "NCCL reduces with SUM, PROD, MAX, MIN, AVG"
NCCL_TYPES = "NCCL types: int8, uint8, int32"
INSTALL = "pip install 'ringworld[nccl-cu12]'"

device_stream = plane.device_stream  # ringworld.device_stream


# ---------------------------------------------------------------------- fake device buffers
class Interface:
    """A CUDA array of "another library": only ``__cuda_array_interface__``, memory made up."""

    def __init__(self, n: int = 4, typestr: str = "<f4", *, ptr: int = FAKE_PTR,
                 readonly: bool = False, stream: int | None = None) -> None:
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": typestr,
                                         "data": (ptr, readonly), "version": 3,
                                         "strides": None, "stream": stream}


_NAME = ctypes.create_string_buffer(b"dltensor")
_DL_TYPES = {"float32": (2, 32), "float64": (2, 64), "int16": (0, 16), "int32": (0, 32)}


class Handmade:
    """A DLPack producer of made-up CUDA memory on ``gpu``; its capsules (no destructor)
    point into it, and the description holds it. ``asked``: each ``__dlpack__`` call's
    keywords (the stream the producer is asked to order its work before)."""

    def __init__(self, n: int = 4, dtype: str = "float32", *, gpu: int = 0,
                 ptr: int = FAKE_PTR) -> None:
        self._shape = (ctypes.c_int64 * 1)(n)
        self._managed = Managed()
        t = self._managed.dl_tensor
        t.data = ptr
        t.device.device_type, t.device.device_id = buffers.DL_CUDA, gpu
        t.ndim = 1
        t.dtype.code, t.dtype.bits = _DL_TYPES[dtype]
        t.dtype.lanes = 1
        t.shape = self._shape
        self._gpu = gpu
        self.asked: list[dict[str, Any]] = []

    def __dlpack__(self, **kwargs: Any) -> Any:
        self.asked.append(kwargs)
        return capsule_new(ctypes.addressof(self._managed), ctypes.cast(_NAME, ctypes.c_char_p),
                            None)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (buffers.DL_CUDA, self._gpu)


class Unexportable:
    """A CUDA DLPack object whose export fails the DLPack way (BufferError)."""

    def __dlpack__(self, **kwargs: Any) -> Any:
        raise BufferError("cannot export this array (read-only)")

    def __dlpack_device__(self) -> tuple[int, int]:
        return (buffers.DL_CUDA, 0)


# ---------------------------------------------------------------------- what to expect here
def _nccl_loads() -> bool:
    try:
        nccl.load()
    except DeviceUnavailable:
        return False
    return True


def _no_device() -> bool:
    """No usable CUDA device (no driver, no GPU or no cuda-bindings): ``probe()`` says 0."""
    return cuda.probe()[0] == 0


def outcome(call: Callable[[], Any]) -> str:
    """``call()``'s result as text: "ok", or the error's type and message."""
    try:
        call()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def refused_twice(comm: ringworld.Communicator, label: str, call: Callable[[], Any],
                  error: str, text: str) -> list[str]:
    """``call()`` raises ``error`` with ``text`` in its message, twice in a row; then a host
    allreduce on ``comm`` gives the right sum. The problems found, as text."""
    problems = []
    for attempt in (1, 2):
        got = outcome(call)
        if not got.startswith(f"{error}: ") or text not in got:
            problems.append(f"rank {comm.rank} {label} (try {attempt}): expected {error} with "
                            f"{text!r}, got {got}")
    problems.extend(host_sum(comm, label))
    return problems


def host_sum(comm: ringworld.Communicator, label: str) -> list[str]:
    out = np.zeros(3)
    try:
        comm.allreduce(np.full(3, comm.rank + 1.0), out)
    except Exception as exc:
        return [f"rank {comm.rank} after {label}: host allreduce raised {exc!r}"]
    want = comm.size * (comm.size + 1) / 2
    return [] if np.array_equal(out, np.full(3, want)) else [
        f"rank {comm.rank} after {label}: host allreduce gave {out}, not {want}"]


def run(size: int, fn: Callable[[ringworld.Communicator], list[str]]) -> None:
    results = run_threads(size, fn, timeout=30)
    assert [p for problems in results for p in problems] == []


# ---------------------------------------------------------------------- (a) host beside device
@pytest.mark.parametrize("size", SIZES)
def test_host_buffer_beside_a_device_buffer(size: int) -> None:
    def fn(comm: ringworld.Communicator) -> list[str]:
        p = comm.size
        cases: list[tuple[str, Callable[[], Any]]] = [
            ("allreduce host recvbuf", lambda: comm.allreduce(Interface(), np.zeros(4, "f4"))),
            ("allreduce host sendbuf", lambda: comm.allreduce(np.zeros(4, "f4"), Interface())),
            ("iallreduce host recvbuf",
             lambda: comm.iallreduce(Interface(), np.zeros(4, "f4"))),
            ("allgather", lambda: comm.allgather(Interface(2), np.zeros(2 * p, "f4"))),
            ("allgather host sendbuf",
             lambda: comm.allgather(np.zeros(2, "f4"), Interface(2 * p))),
            ("reduce_scatter_block",
             lambda: comm.reduce_scatter_block(Interface(2 * p), np.zeros(2, "f4"))),
            ("alltoall", lambda: comm.alltoall(Interface(3 * p), np.zeros(3 * p, "f4"))),
            ("alltoall DLPack", lambda: comm.alltoall(Handmade(3 * p), np.zeros(3 * p, "f4"))),
        ]
        problems: list[str] = []
        for label, call in cases:
            problems += refused_twice(comm, label, call, "TypeError", HOST)
        return problems

    run(size, fn)


@pytest.mark.parametrize("size", SIZES)
def test_gather_host_buffer_at_the_root(size: int) -> None:
    """The root gives a host sendbuf beside its device recvbuf; the other ranks' recvbuf does
    not matter, and their device sendbuf is fine. The root raises the TypeError; the others
    learn of it in the plane's check (MismatchError naming the root), or, where NCCL is not
    installed, stop at that first (DeviceUnavailable: install it)."""
    others = ("MismatchError", f"rank {size - 1} refused its part") if _nccl_loads() else (
        "DeviceUnavailable", INSTALL)

    def fn(comm: ringworld.Communicator) -> list[str]:
        p, root = comm.size, comm.size - 1
        problems: list[str] = []
        for recvbuf in (None, np.zeros(1)):  # off the root, recvbuf is not looked at
            if comm.rank == root:
                problems += refused_twice(
                    comm, "gather at the root",
                    lambda: comm.gather(np.zeros(2, "f4"), Handmade(2 * p), root),
                    "TypeError", "gather: sendbuf " + HOST)
            else:
                problems += refused_twice(comm, "gather off the root",
                                          lambda r=recvbuf: comm.gather(Handmade(2), r, root),
                                          *others)
        return problems

    run(size, fn)


# ---------------------------------------------------------------------- (b) ops NCCL lacks
@pytest.mark.parametrize("size", SIZES)
def test_ops_nccl_lacks(size: int) -> None:
    mine = ringworld.Op.create(lambda a, b: a + b, commutative=True, name="mine")
    posing = ringworld.Op.create(lambda a, b: a + b, commutative=True, name="sum")

    def fn(comm: ringworld.Communicator) -> list[str]:
        p = comm.size
        problems: list[str] = []
        for op, name in ((mine, "'mine'"), (posing, "'sum (user-defined)'"),
                         (ringworld.BAND, "'band'"), (ringworld.LAND, "'land'")):
            dtype = "<i4" if op is ringworld.BAND else "<f4"
            cases: list[tuple[str, Callable[[], Any]]] = [
                ("allreduce", lambda op=op, t=dtype: comm.allreduce(Interface(4, t),
                                                                    Interface(4, t), op)),
                ("allreduce in place", lambda op=op, t=dtype: comm.allreduce(
                    ringworld.IN_PLACE, Handmade(4, "int32" if t == "<i4" else "float32"), op)),
                ("reduce", lambda op=op, t=dtype: comm.reduce(Interface(4, t), Interface(4, t),
                                                              op, 0)),
                ("reduce_scatter_block", lambda op=op, t=dtype: comm.reduce_scatter_block(
                    Interface(2 * p, t), Interface(2, t), op)),
            ]
            for label, call in cases:
                problems += refused_twice(comm, f"{label} {name}", call, "TypeError",
                                          f"op {name} cannot reduce device buffers: {NCCL_OPS}")
        return problems

    run(size, fn)


# ---------------------------------------------------------------------- (c) types NCCL lacks
@pytest.mark.parametrize("size", SIZES)
def test_types_nccl_lacks(size: int) -> None:
    def fn(comm: ringworld.Communicator) -> list[str]:
        problems: list[str] = []
        for typestr, name in (("<i2", "int16"), ("<u2", "uint16"), ("|b1", "bool")):
            problems += refused_twice(
                comm, f"allreduce {name}",
                lambda t=typestr: comm.allreduce(Interface(4, t), Interface(4, t)),
                "TypeError", f"recvbuf has elements of {name}, which NCCL cannot move")
            problems += refused_twice(
                comm, f"allreduce {name} (names NCCL's types)",
                lambda t=typestr: comm.allreduce(Interface(4, t), Interface(4, t)),
                "TypeError", NCCL_TYPES)
        problems += refused_twice(
            comm, "allreduce DLPack int16",
            lambda: comm.allreduce(Handmade(4, "int16"), Handmade(4, "int16")),
            "TypeError", NCCL_TYPES)
        # complex: refused by the description itself, before NCCL's types are consulted
        problems += refused_twice(
            comm, "allreduce complex64",
            lambda: comm.allreduce(Interface(4, "<c8"), Interface(4, "<c8")),
            "TypeError", "element type '<c8' cannot move on the device")
        return problems

    run(size, fn)


@pytest.mark.parametrize("size", SIZES)
def test_other_local_refusals(size: int) -> None:
    """The host table's checks, on device buffers: types, counts, read-only, two GPUs."""
    def fn(comm: ringworld.Communicator) -> list[str]:
        p = comm.size
        cases: list[tuple[str, Callable[[], Any], str, str]] = [
            ("dtypes differ", lambda: comm.allreduce(Interface(4, "<f4"), Interface(4, "<f8")),
             "TypeError", "sendbuf has dtype float32 but recvbuf has dtype float64"),
            ("counts differ", lambda: comm.allreduce(Interface(8), Interface(4)),
             "ValueError", "recvbuf"),
            ("read-only recvbuf",
             lambda: comm.allreduce(Interface(4), Interface(4, readonly=True)),
             "TypeError", "allreduce: recvbuf is read-only"),
            ("two GPUs", lambda: comm.allreduce(Handmade(gpu=1), Handmade(gpu=0)),
             "TypeError", "sendbuf is on GPU 1 and recvbuf on GPU 0"),
            ("allgather blocks", lambda: comm.allgather(Interface(3), Interface(3 * p + 1)),
             "ValueError", "recvbuf"),
            ("ROCm memory",
             lambda: comm.allreduce(RocmLike(), Interface()), "TypeError",
             "DLPack device type 10; device calls take CUDA memory"),
        ]
        problems: list[str] = []
        for label, call, error, text in cases:
            problems += refused_twice(comm, label, call, error, text)
        return problems

    run(size, fn)


class RocmLike(Handmade):
    def __dlpack_device__(self) -> tuple[int, int]:
        return (10, 0)


# ---------------------------------------------------------------------- (d) prefix reductions
@pytest.mark.parametrize("size", SIZES)
def test_scan_and_exscan_refused(size: int) -> None:
    """Device scans reduce the prefix with torch's or CuPy's kernels; other device arrays (and
    AVG) are refused on every rank, before anything runs."""
    def fn(comm: ringworld.Communicator) -> list[str]:
        problems: list[str] = []
        for coll in ("scan", "exscan", "iscan", "iexscan"):
            method = getattr(comm, coll)
            name = coll.removeprefix("i")
            problems += refused_twice(comm, coll, lambda m=method: m(Interface(), Interface()),
                                      "TypeError", f"{name} of device buffers needs torch CUDA "
                                      "tensors or CuPy arrays")
            problems += refused_twice(comm, coll,
                                      lambda m=method: m(Interface(), Interface(), "avg"),
                                      "TypeError", f"{name} has no AVG")
        return problems

    run(size, fn)


# ---------------------------------------------------------------------- (e) no usable device
@pytest.mark.parametrize("size", SIZES)
def test_no_device_every_rank_unavailable(size: int) -> None:
    if not _no_device():
        pytest.skip("this machine has a CUDA device (the fake pointer would be looked up)")
    if not _nccl_loads():
        pytest.skip("NCCL is not installed here (that case: test_without_nccl4py)")

    def fn(comm: ringworld.Communicator) -> list[str]:
        return (refused_twice(comm, "allreduce", lambda: comm.allreduce(Interface(),
                                                                        Interface()),
                              "DeviceUnavailable", "no usable CUDA device")
                + refused_twice(comm, "bcast int16",  # moved as bytes: any type will do
                                lambda: comm.bcast(Interface(4, "<i2"), 0),
                                "DeviceUnavailable", "cudaPointerGetAttributes"))

    run(size, fn)


@pytest.mark.parametrize("size", SIZES)
def test_no_device_agreed_call_stops_at_making_nccl(size: int) -> None:
    """Buffers that say their GPU pass every check without CUDA, and every rank agrees: the
    plane goes on to make its NCCL communicator, and stops where CUDA is asked for the
    current device (DeviceUnavailable on every rank, the communicator still usable)."""
    if not _no_device():
        pytest.skip("this machine has a CUDA device (the fake pointer would reach NCCL)")
    if not _nccl_loads():
        pytest.skip("NCCL is not installed here")

    def fn(comm: ringworld.Communicator) -> list[str]:
        return refused_twice(comm, "allreduce", lambda: comm.allreduce(Handmade(), Handmade()),
                             "DeviceUnavailable", "cudaGetDevice: no usable CUDA device")

    run(size, fn)


# ---------------------------------------------------------------------- (f) no nccl4py
@pytest.fixture
def without_nccl4py(monkeypatch: pytest.MonkeyPatch) -> None:
    """nccl4py as if not installed: its import fails; the binding is loaded afresh (and the
    state before is restored after)."""
    monkeypatch.setitem(sys.modules, "nccl", None)
    monkeypatch.setitem(sys.modules, "nccl.bindings", None)
    monkeypatch.setattr(nccl, "_binding", None)
    monkeypatch.setattr(nccl, "_load_error", None)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.usefixtures("without_nccl4py")
def test_without_nccl4py(size: int) -> None:
    def fn(comm: ringworld.Communicator) -> list[str]:
        return (refused_twice(comm, "allreduce", lambda: comm.allreduce(Interface(),
                                                                        Interface()),
                              "DeviceUnavailable", INSTALL)
                + refused_twice(comm, "allreduce DLPack",
                                lambda: comm.allreduce(Handmade(), Handmade()),
                                "DeviceUnavailable", "nccl4py) is not installed")
                # the local checks come first, NCCL or not
                + refused_twice(comm, "host beside device",
                                lambda: comm.allreduce(Interface(), np.zeros(4, "f4")),
                                "TypeError", HOST))

    run(size, fn)


# ---------------------------------------------------------------------- (h) one rank refuses
@pytest.mark.parametrize("size", SIZES)
def test_one_rank_refuses_interface_buffers(size: int) -> None:
    """Rank 0 passes a host recvbuf beside its device sendbuf; the others pass two device
    buffers. Rank 0 raises TypeError. The others' buffers do not say their GPU, so they ask
    CUDA before anything goes to the other ranks, and raise what that gives. Every rank's
    error is its own, and none waits on another.

    Here (no driver): rank 0 TypeError, the others DeviceUnavailable ("no usable CUDA
    device"). Without nccl4py: the others DeviceUnavailable (install it). With a GPU: the
    others DeviceError (CUDA's answer for the made-up pointer: not CUDA memory)."""
    if not _nccl_loads():
        others = ("DeviceUnavailable", INSTALL)
    elif _no_device():
        others = ("DeviceUnavailable", "cudaPointerGetAttributes: no usable CUDA device")
    else:
        others = ("DeviceError", "")

    def fn(comm: ringworld.Communicator) -> list[str]:
        if comm.rank == 0:
            return refused_twice(comm, "rank 0", lambda: comm.allreduce(Interface(),
                                                                        np.zeros(4, "f4")),
                                 "TypeError", "allreduce: recvbuf " + HOST)
        return refused_twice(comm, "the others",
                             lambda: comm.allreduce(Interface(), Interface()), *others)

    run(size, fn)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("refuser", ["first", "last"])
def test_one_rank_refuses_the_others_learn_in_the_check(size: int, refuser: str) -> None:
    """As above with buffers that say their GPU: the others' calls pass every local check,
    and the plane's check (a host allgather of every rank's record) tells them of the
    refusal: MismatchError naming the rank that refused and its error, before any NCCL
    communicator is made, so this holds on any machine with NCCL installed."""
    if not _nccl_loads():
        pytest.skip("NCCL is not installed here: the others stop at loading it")

    def fn(comm: ringworld.Communicator) -> list[str]:
        bad = 0 if refuser == "first" else comm.size - 1
        if comm.rank == bad:
            return refused_twice(comm, "the refuser", lambda: comm.allreduce(Handmade(),
                                                                             np.zeros(4, "f4")),
                                 "TypeError", "allreduce: recvbuf " + HOST)
        return refused_twice(comm, "the others", lambda: comm.allreduce(Handmade(), Handmade()),
                             "MismatchError", f"rank {bad} refused its part (TypeError: "
                                              "allreduce: recvbuf is in host memory")

    run(size, fn)


@pytest.mark.parametrize("size", [2, 3])
def test_ranks_calling_differently_mismatch(size: int) -> None:
    """Every rank's call is fine alone, but they differ (count, op, type, collective): every
    rank raises MismatchError listing each rank's call, and no NCCL work is started."""
    if not _nccl_loads():
        pytest.skip("NCCL is not installed here")

    def fn(comm: ringworld.Communicator) -> list[str]:
        r = comm.rank
        n = 4 if r == 0 else 8
        op = ringworld.SUM if r == 0 else ringworld.MAX
        dtype = "float32" if r == 0 else "float64"
        cases: list[tuple[str, Callable[[], Any], str]] = [
            ("counts", lambda: comm.allreduce(Handmade(n), Handmade(n)), "allreduce n=8 float32"),
            ("ops", lambda: comm.allreduce(Handmade(), Handmade(), op), "op=max"),
            ("types", lambda: comm.allreduce(Handmade(4, dtype), Handmade(4, dtype)),
             "n=4 float64"),
            ("roots", lambda: comm.bcast(Handmade(), 0 if r == 0 else 1), "root=1"),
        ]
        problems: list[str] = []
        for label, call, text in cases:
            problems += refused_twice(comm, label, call, "MismatchError",
                                      "the ranks made different device calls (rank 0: ")
            got = outcome(call)
            if text not in got:
                problems.append(f"rank {r} {label}: {text!r} not in {got}")
            problems += host_sum(comm, label)
        return problems

    run(size, fn)


@pytest.mark.parametrize("size", [2, 3])
def test_v_counts_that_disagree_between_ranks_mismatch(size: int) -> None:
    """The v-collectives' counts are each rank's own, so the records alone agree; the check
    also compares what every rank sends each other with what that one expects, pair by pair.
    A rank sends one element more than the root's counts say (gatherv), or a rank expects
    more than its peer sends (alltoallv): every rank raises MismatchError naming both sides,
    and no NCCL send and receive of different sizes is started."""
    if not _nccl_loads():
        pytest.skip("NCCL is not installed here")

    def fn(comm: ringworld.Communicator) -> list[str]:
        p, r = comm.size, comm.rank
        counts = [i + 1 for i in range(p)]
        mine = counts[r] + (1 if r == p - 1 else 0)
        last = f"rank {p - 1} sends {4 * (p + 1)} bytes to rank 0, which expects {4 * p}"

        def gatherv() -> None:
            if r == 0:
                comm.gatherv(Handmade(mine), Handmade(sum(counts)), counts, root=0)
            else:
                comm.gatherv(Handmade(mine), None, None, root=0)

        # one element each way between every pair, but rank 0 expects two from rank 1
        rc = [2 if (r == 0 and j == 1) else 1 for j in range(p)]

        def alltoallv() -> None:
            comm.alltoallv(Handmade(p), Handmade(sum(rc)), [1] * p, rc)

        problems = refused_twice(comm, "gatherv", gatherv, "MismatchError", last)
        problems += refused_twice(comm, "alltoallv", alltoallv, "MismatchError",
                                  "rank 1 sends 4 bytes to rank 0, which expects 8")
        return problems

    run(size, fn)


def test_an_export_error_reaches_the_other_ranks() -> None:
    """Rank 0's export fails; rank 1's call is fine. Rank 0 should raise (its error), and
    rank 1 learn of it in the check (MismatchError), at once. Now rank 1 waits out its
    timeout (2 s) for a record rank 0 never sent."""
    def fn(comm: ringworld.Communicator) -> list[str]:
        if comm.rank == 0:
            got = outcome(lambda: comm.allreduce(Unexportable(), Handmade(), timeout=2))
            return [] if "cannot export" in got else [f"rank 0: {got}"]
        got = outcome(lambda: comm.allreduce(Handmade(), Handmade(), timeout=2))
        return [] if got.startswith("MismatchError: ") else [f"rank 1: {got[:200]}"]

    if not _nccl_loads():
        pytest.skip("NCCL is not installed here")
    run(2, fn)


# ---------------------------------------------------------------------- (i) streams
class Frame:
    """What device_calls' prepare functions need of a communicator."""

    def __init__(self, size: int = 1, rank: int = 0) -> None:
        self.size, self.rank = size, rank

    def _root(self, root: int) -> int:
        return int(root)


@pytest.fixture
def loaded() -> None:
    if not _nccl_loads():
        pytest.skip("NCCL is not installed here (a prepared call loads it)")


@pytest.mark.usefixtures("loaded")
def test_prepared_stream_default_and_in_a_block() -> None:
    send, recv = Handmade(), Handmade()
    p = device_calls.allreduce(Frame(), send, recv, ringworld.SUM)
    assert (p.what, p.record, p.device, p.stream) == ("allreduce", "allreduce n=4 float32 op=sum",
                                                      0, 0)
    assert [a.ptr for a in p.keep] == [FAKE_PTR, FAKE_PTR]
    with device_stream(7) as s:
        assert s == 7
        inside = device_calls.allreduce(Frame(), Handmade(), Handmade(), "max")
        with device_stream(9):
            nested = device_calls.allreduce(Frame(), Handmade(), Handmade(), "sum")
        again = device_calls.allreduce(Frame(), Handmade(), Handmade(), "sum")
    after = device_calls.allreduce(Frame(), Handmade(), Handmade(), "sum")
    assert (inside.stream, nested.stream, again.stream, after.stream) == (7, 9, 7, 0)
    assert inside.record == "allreduce n=4 float32 op=max"
    assert send.asked[-1] == {"stream": 1}  # no stream given: the legacy default stream


@pytest.mark.usefixtures("loaded")
def test_prepared_stream_of_the_producer() -> None:
    """A CUDA array interface (version 3) stream is the call's stream, unless a block gives
    one. (An empty interface buffer has no pointer to look up: the other buffer's GPU.)"""
    recv = Interface(0, ptr=0, stream=5)
    send = Handmade(0)
    p = device_calls.allreduce(Frame(), send, recv, "sum")
    assert (p.stream, p.device) == (5, 0)
    assert send.asked == [{"stream": 5}]  # the DLPack producer orders its work before it
    with device_stream(7):
        q = device_calls.allreduce(Frame(), Handmade(0), Interface(0, ptr=0, stream=5), "sum")
    assert q.stream == 7


@pytest.mark.usefixtures("loaded")
def test_every_dlpack_buffer_exported_on_the_call_stream() -> None:
    send, recv = Handmade(), Handmade()
    with device_stream(7):
        p = device_calls.allreduce(Frame(), send, recv, "sum")
    assert p.stream == 7
    assert send.asked == [{"stream": 7}]
    assert recv.asked == [{"stream": 7}]


@pytest.mark.usefixtures("loaded")
def test_prepared_records() -> None:
    f2 = Frame(2, 1)
    assert device_calls.bcast(f2, Handmade(), 0).record == "bcast n=4 float32 root=0"
    assert device_calls.allgather(f2, Handmade(2), Handmade(4), None, None).record \
        == "allgather n=2 float32"
    assert device_calls.reduce_scatter(f2, Handmade(4), Handmade(2), None, "min").record \
        == "reduce_scatter_block float32 op=min counts=" + device_calls._digest((2, 2))
    assert device_calls.alltoall(f2, Handmade(4), Handmade(4)).record == "alltoall n=2 float32"
    assert device_calls.gather(f2, Handmade(3), None, 0).record == "gather n=3 float32 root=0"
    assert device_calls.reduce(f2, Handmade(), None, ringworld.PROD, 0).record \
        == "reduce n=4 float32 op=prod root=0"


def test_op_names() -> None:
    assert device_calls.op_name(ringworld.SUM) == "sum"
    assert device_calls.op_name(ringworld.MIN) == "min"
    assert device_calls.op_name("MAX") == "max"
    assert device_calls.op_name("avg") == "avg"
    with pytest.raises(TypeError, match=r"op 'prod \(user-defined\)'"):
        device_calls.op_name(ringworld.Op.create(lambda a, b: a * b, name="prod"))
    with pytest.raises(TypeError, match="op 'bor' cannot reduce device buffers"):
        device_calls.op_name(ringworld.BOR)


def test_active_stream() -> None:
    a = DeviceArray(FAKE_PTR, 4, "float32", 4, 0, False, None, object())
    assert plane.active_stream([a]) == 0  # nothing says: the default stream
    assert plane.active_stream([a._replace(stream=3)]) == 3  # the producer's
    with device_stream(7):
        assert plane.active_stream([a]) == 7
        assert plane.active_stream([a._replace(stream=3)]) == 7  # the block's wins
        seen: list[int] = []
        import threading

        t = threading.Thread(target=lambda: seen.append(plane.active_stream([a])))
        t.start()
        t.join(10)
        assert seen == [0]  # the block is this thread's alone
        with pytest.raises(TypeError, match="stream must be a CUDA stream"), device_stream(-1):
            pass
        assert plane.active_stream([a]) == 7  # a refused stream changes nothing
    assert plane.active_stream([a]) == 0
