"""A v-call's block that a rank sends shorter than its receiver expects (the two ranks gave
different counts for it: counts no rank states whole) fails the receiver with ShortMessageError
on the message path too, naming the sender and both sizes, where it used to leave the missing
elements as they were. Ranks that wait for the failed rank's part fail instead of hanging; no
rank returns data that its own counts do not give; the communicator works afterwards.

(The shared windows check the counts themselves: test_coll_vector_shm.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ringworld
from ringworld.testing import run_threads

pytestmark = pytest.mark.timeout(120)

N = 3  # every block's length, but rank 1's own idea of one of them (SHORT)
SHORT = 2


def _counts(coll: str, r: int, p: int) -> list[int]:
    """The counts this rank passes: as every other rank sees them, but for the one block
    (sent by rank 1, or to it by the root) that its sender thinks is SHORT elements."""
    c = [N] * p
    if coll in ("gatherv", "allgatherv") and r == 1:
        c[1] = SHORT  # rank 1 sends less than the others (the root) expect of it
    elif coll == "scatterv" and r == 0:
        c[1] = SHORT  # the root sends rank 1 less than it expects
    elif coll == "alltoallv" and r == 1:
        c[0] = SHORT  # rank 1's sendcounts: less to rank 0 than rank 0 expects
    return c


def _call(comm: Any, coll: str, alg: str | None) -> tuple[str, Any]:
    """Make the call; return ("ok", what arrived) or (error type, text)."""
    r, p = comm.rank, comm.size
    c = _counts(coll, r, p)
    d = list(np.cumsum([0, *c[:-1]]))
    kw: dict[str, Any] = {"algorithm": alg, "timeout": 20}
    try:
        if coll == "gatherv":
            send = np.arange(c[r], dtype=np.float64) + 100 * r
            recv = np.full(sum(c), -1.0) if r == 0 else None
            comm.gatherv(send, recv, counts=c if r == 0 else None,
                         displs=d if r == 0 else None, root=0, **kw)
            got = recv
        elif coll == "scatterv":
            send = np.arange(sum(c), dtype=np.float64) if r == 0 else None
            recv = np.full(N, -1.0)
            comm.scatterv(send, recv, counts=c if r == 0 else None,
                          displs=d if r == 0 else None, root=0, **kw)
            got = recv
        elif coll == "allgatherv":
            recv = np.full(sum(c), -1.0)
            comm.allgatherv(np.arange(c[r], dtype=np.float64) + 100 * r, recv, c, d, **kw)
            got = recv
        else:  # alltoallv: block i of rank r's send is 100 r + 10 i + k
            send = np.concatenate([np.arange(c[i]) + 100 * r + 10 * i for i in range(p)])
            recv = np.full(N * p, -1.0)
            comm.alltoallv(send.astype(np.float64), recv, c, [N] * p, **kw)
            got = recv
    except ringworld.RingworldError as exc:
        return type(exc).__name__, str(exc)
    return "ok", None if got is None else got.tolist()


def _expected(coll: str, r: int, p: int) -> list[float] | None:
    """What a call that returns gives this rank by its own counts (None: no result)."""
    c = _counts(coll, r, p)
    if coll == "gatherv":
        return [100.0 * i + k for i in range(p) for k in range(c[i])] if r == 0 else None
    if coll == "scatterv":  # where the root's counts place this rank's block
        at = sum(_counts(coll, 0, p)[:r])
        return [float(at + k) for k in range(N)]
    if coll == "allgatherv":
        return [100.0 * i + k for i in range(p) for k in range(c[i])]
    return [100.0 * i + 10 * r + k for i in range(p) for k in range(N)]


def _program(comm: Any, coll: str, alg: str | None) -> tuple[tuple[str, Any], list[float]]:
    out = _call(comm, coll, alg)
    nxt = np.empty(4)
    comm.allreduce(np.arange(4.0) + comm.rank, nxt, timeout=20)
    return out, nxt.tolist()


# (collective, algorithm, the ranks a short block reaches for sure, and from whom)
CASES = [("gatherv", "linear"), ("scatterv", "linear"), ("allgatherv", "linear"),
         ("allgatherv", "ring"), ("alltoallv", "linear"), ("alltoallv", "pairwise")]


def _short_at(coll: str, alg: str, p: int) -> tuple[list[int], int]:
    if coll == "scatterv":
        return [1], 0
    if coll == "allgatherv":
        return ([2 % p] if alg == "ring" else [i for i in range(p) if i != 1]), 1
    return [0], 1


@pytest.mark.parametrize("p", [2, 3, 5])
@pytest.mark.parametrize(("coll", "alg"), CASES)
def test_a_short_block_fails_its_receiver_and_no_rank_returns_wrong_data(
        coll: str, alg: str, p: int) -> None:
    results = run_threads(p, _program, coll, alg)
    short, sender = _short_at(coll, alg, p)
    for r, ((kind, what), nxt) in enumerate(results):
        if r in short:
            assert kind == "ShortMessageError", (r, kind, what)
            assert what.startswith(f"{coll} ({alg}, "), what  # names the call...
            assert f"(rank {r} of {p}): rank {sender} sent {SHORT * 8} bytes where this rank " \
                   f"expects {N * 8}: the ranks gave different counts" in what  # ...and sizes
        elif kind == "ok":
            assert what == _expected(coll, r, p), (r, what)
        else:  # waited for a failed rank's part: fails naming it, not a timeout
            assert kind in ("CommBroken", "ShortMessageError"), (r, kind, what)
        sum_ = float(sum(range(p)))
        assert nxt == [p * k + sum_ for k in range(4)], (r, nxt)  # the communicator works on


def test_blocks_of_the_expected_length_still_pass() -> None:
    """The exact-length rule leaves correct calls alone (zero-length blocks included)."""
    def prog(comm: Any) -> list[float]:
        r, p = comm.rank, comm.size
        c = [0, 1, 2][:p]
        recv = np.full(sum(c), -1.0)
        comm.allgatherv(np.arange(c[r], dtype=np.float64) + 10 * r, recv, c, None,
                        algorithm="ring", timeout=20)
        return recv.tolist()

    assert run_threads(3, prog) == [[10.0, 20.0, 21.0]] * 3


PROGRAM = """
import sys
import numpy as np
import ringworld

comm = ringworld.init()
r = comm.rank
c = [3, 2, 3] if r == 1 else [3, 3, 3]
recv = np.full(sum(c), -1.0)
try:
    comm.allgatherv(np.arange(c[r], dtype=np.float64) + 100 * r, recv, c, None, timeout=20)
    print(f"rank {r}: ok {recv.tolist()}", flush=True)
except ringworld.RingworldError as exc:
    print(f"rank {r}: {type(exc).__name__}: {exc}", flush=True)
nxt = np.empty(2)
comm.allreduce(np.ones(2), nxt, timeout=20)
print(f"next {r}: {nxt.tolist()}", flush=True)
"""


def test_over_tcp_the_default_path_fails_the_call_too(tmp_path: Path) -> None:
    """Ranks over TCP take the message path by default: no rank returns a block with its last
    element missing."""
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    r = subprocess.run([sys.executable, "-m", "ringworld", "run", "-n", "3", "--transport",
                        "tcp", str(prog)], capture_output=True, text=True, timeout=100,
                       check=False, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = dict(line.split(": ", 1) for line in r.stdout.splitlines() if ": " in line)
    assert "ShortMessageError" in r.stdout, r.stdout
    assert "rank 1 sent 16 bytes where this rank expects 24" in r.stdout, r.stdout
    for rank in range(3):
        got = lines[f"rank {rank}"]
        if got.startswith("ok"):  # only rank 1 may return: by its own counts it is whole
            assert rank == 1 and got == "ok [0.0, 1.0, 2.0, 100.0, 101.0, 200.0, 201.0, 202.0]"
        assert lines[f"next {rank}"] == "[3.0, 3.0]", r.stdout
