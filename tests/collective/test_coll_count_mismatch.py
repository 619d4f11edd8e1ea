"""Ranks that disagree on a v-call's counts on the message path fail, where they used to
return with a block's last elements left as they were, or wait for good. A block sent shorter
than its receiver expects (gatherv, scatterv, alltoallv: counts no rank states whole) fails the
receiver with ShortMessageError naming the sender and both sizes; ranks that wait for the
failed rank's part fail instead of hanging; no rank returns data that its own counts do not
give; the communicator works afterwards. allgatherv's and reduce_scatter's counts, which every
rank passes whole, are in the call's signature: every rank fails with MismatchError showing
both. A block one side counts as empty sends no message: the rank waiting for it is found by
the monitor (the sender went on to a later call) and every rank fails with MismatchError.

(The shared windows check the counts themselves: test_coll_vector_shm.py.)"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ringworld
from ringworld.testing import run_processes, run_threads

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


CASES = [("gatherv", "linear"), ("scatterv", "linear"), ("alltoallv", "linear"),
         ("alltoallv", "pairwise")]


def _short_at(coll: str) -> tuple[int, int]:
    """The rank a short block reaches, and the rank that sends it."""
    return (1, 0) if coll == "scatterv" else (0, 1)


@pytest.mark.parametrize("p", [2, 3, 5])
@pytest.mark.parametrize(("coll", "alg"), CASES)
def test_a_short_block_fails_its_receiver_and_no_rank_returns_wrong_data(
        coll: str, alg: str, p: int) -> None:
    results = run_threads(p, _program, coll, alg)
    short, sender = _short_at(coll)
    for r, ((kind, what), nxt) in enumerate(results):
        if r == short:
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


@pytest.mark.parametrize("transport", ["tcp", "shm"])
@pytest.mark.parametrize(("coll", "alg"), CASES)
def test_a_short_block_taken_from_the_stream_fails_its_receiver_too(
        coll: str, alg: str, transport: str) -> None:
    """As processes: a blocking call takes its small blocks straight from the transport
    (CollectiveRequest._start_taking), and a block of another length is left to the path that
    reports it, the receiver's buffer untouched."""
    results = run_processes(3, _program, coll, alg, transport=transport, timeout=60)
    short, _ = _short_at(coll)
    for r, ((kind, what), nxt) in enumerate(results):
        if r == short:
            assert kind == "ShortMessageError", (r, kind, what)
        elif kind == "ok":
            assert what == _expected(coll, r, 3), (r, what)
        else:
            assert kind in ("CommBroken", "ShortMessageError"), (r, kind, what)
        assert nxt == [3 * k + 3.0 for k in range(4)], (r, nxt)


def _long(comm: Any, alg: str) -> str:
    r, p = comm.rank, comm.size
    sc = [N + 1 if (r == 1 and i == 0) else N for i in range(p)]  # rank 1: one more to 0
    try:
        comm.alltoallv(np.ones(sum(sc)), np.empty(N * p), sc, [N] * p, algorithm=alg,
                       timeout=20)
    except ringworld.RingworldError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "ok"


@pytest.mark.parametrize("alg", ["linear", "pairwise"])
def test_a_long_block_is_a_truncation_naming_the_call(alg: str) -> None:
    out = run_threads(3, _long, alg)
    assert out[0].startswith(f"TruncationError: alltoallv ({alg}, "), out
    assert out[0].endswith("#0 on world (rank 0 of 3): message truncated: incoming message has "
                           "32 bytes but the receive buffer holds only 24 bytes (from rank 1)")
    assert all(o == "ok" or o.startswith("CommBroken: ") for o in out[1:]), out


def _whole(comm: Any, coll: str, alg: str) -> list[str]:
    """Rank 1 passes other counts than the rest; the call's and the next call's outcomes."""
    r, p = comm.rank, comm.size
    c = [N] * p
    if r == 1:
        c[p - 1] = SHORT
    out = []
    for step in range(2):
        try:
            if step:
                comm.allreduce(np.ones(2), np.empty(2), timeout=20)
            elif coll == "allgatherv":
                comm.allgatherv(np.arange(c[r], dtype=np.float64), np.empty(sum(c)), c, None,
                                algorithm=alg, timeout=20)
            else:
                comm.reduce_scatter(np.arange(sum(c), dtype=np.float64), np.empty(c[r]), c,
                                    algorithm=alg, timeout=20)
            out.append("ok")
        except ringworld.MismatchError as exc:
            out.append(str(exc))
    return out


@pytest.mark.parametrize("p", [2, 3, 5])
@pytest.mark.parametrize(("coll", "alg"), [("allgatherv", "linear"), ("allgatherv", "ring"),
                                           ("reduce_scatter", "ring"),
                                           ("reduce_scatter", "pairwise")])
def test_counts_every_rank_passes_whole_are_in_the_signature(coll: str, alg: str,
                                                             p: int) -> None:
    mine = [N] * p
    other = [*mine[:-1], SHORT]
    for r, out in enumerate(run_threads(p, _whole, coll, alg)):
        for line in out:  # the call and the next one (the collective sequence broke)
            assert line.startswith("collective mismatch on world, call #0: "), (r, line)
            assert f"{coll}(algorithm={alg}, count={mine}," in line, (r, line)
            assert f"{coll}(algorithm={alg}, count={other}," in line, (r, line)


def test_a_long_list_of_counts_is_shown_by_its_head_and_checksum() -> None:
    def prog(comm: Any) -> str:
        c = [1] * 9 if comm.rank else [1] * 8 + [2]
        try:
            comm.allgatherv(np.ones(c[comm.rank]), np.empty(sum(c)), c, None, algorithm="ring",
                            timeout=20)
        except ringworld.MismatchError as exc:
            return str(exc)
        return "ok"

    for line in run_threads(9, prog):
        assert "count=[1, 1, 1, 1, 1, 1, 1, 1, ... (9 counts, crc " in line, line
        assert len(set(re.findall(r"crc ([0-9a-f]{8})\)", line))) == 2, line  # they differ


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


def _job(tmp_path: Path, program: str, transport: str = "tcp") -> subprocess.CompletedProcess[str]:
    """``program`` run by ``ringworld run -n 3 --transport <transport>``; it must exit 0."""
    prog = tmp_path / "prog.py"
    prog.write_text(program)
    r = subprocess.run([sys.executable, "-m", "ringworld", "run", "-n", "3", "--transport",
                        transport, str(prog)], capture_output=True, text=True, timeout=100,
                       check=False, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


PROGRAM = """
import sys
import numpy as np
import ringworld

comm = ringworld.init()
r = comm.rank
c = [3, 2, 3] if r == 1 else [3, 3, 3]  # rank 1 sends 2 where the root expects 3
recv = np.full(sum(c), -1.0) if r == 0 else None
try:
    comm.gatherv(np.arange(c[r], dtype=np.float64) + 100 * r, recv, c, None, root=0,
                 timeout=20)
    print(f"rank {r}: ok {None if recv is None else recv.tolist()}", flush=True)
except ringworld.RingworldError as exc:
    print(f"rank {r}: {type(exc).__name__}: {exc}", flush=True)
nxt = np.empty(2)
comm.allreduce(np.ones(2), nxt, timeout=20)
print(f"next {r}: {nxt.tolist()}", flush=True)
"""


def test_over_tcp_the_default_path_fails_the_call_too(tmp_path: Path) -> None:
    """Ranks over TCP take the message path by default: a root that expects a longer block
    than rank 1 sends fails naming it, and the job goes on."""
    r = _job(tmp_path, PROGRAM)
    lines = dict(line.split(": ", 1) for line in r.stdout.splitlines() if ": " in line)
    assert lines["rank 1"] == lines["rank 2"] == "ok None", r.stdout
    assert lines["rank 0"].startswith("ShortMessageError: gatherv ("), r.stdout
    assert lines["rank 0"].endswith("(rank 0 of 3): rank 1 sent 16 bytes where this rank "
                                    "expects 24: the ranks gave different counts for the block")
    for rank in range(3):
        assert lines[f"next {rank}"] == "[3.0, 3.0]", r.stdout


def _empty_block(comm: Any, coll: str, unasked: bool = False) -> list[str]:
    """One side of a block counts it as empty, the other not: the receiver expects it and
    the sender sends nothing, or (``unasked``) the receiver counts it as empty and it comes
    anyway (a message its call ends without taking). The call's and the next call's
    outcomes."""
    r, p = comm.rank, comm.size
    out = []
    for step in range(2):
        try:
            if step:
                comm.allreduce(np.ones(2), np.empty(2), timeout=30)
            elif coll == "gatherv":  # rank 1's block: sent empty, or not expected by the root
                c = [0 if i == 1 and unasked else N for i in range(p)]
                send = np.ones(0 if r == 1 and not unasked else N)
                comm.gatherv(send, np.empty(sum(c)) if r == 0 else None, c if r == 0 else None,
                             root=0, algorithm="linear", timeout=30)
            elif coll == "scatterv":  # the root's block to rank 1: empty, or not expected
                c = [0 if i == 1 and not unasked else N for i in range(p)]
                comm.scatterv(np.ones(sum(c)) if r == 0 else None,
                              np.empty(0 if r == 1 and unasked else N), c if r == 0 else None,
                              root=0, algorithm="linear", timeout=30)
            else:  # alltoallv: rank 1 to rank 0, sent empty or not expected
                sc = [0 if (r == 1 and i == 0 and not unasked) else N for i in range(p)]
                rc = [0 if (r == 0 and i == 1 and unasked) else N for i in range(p)]
                comm.alltoallv(np.ones(sum(sc)), np.empty(sum(rc)), sc, rc,
                               algorithm="pairwise", timeout=30)
            out.append("ok")
        except ringworld.RingworldError as exc:
            out.append(f"{type(exc).__name__}: {exc}")
    return out


@pytest.mark.parametrize("p", [2, 3])
@pytest.mark.parametrize("coll", ["gatherv", "scatterv", "alltoallv"])
def test_a_block_one_side_counts_as_empty_fails_every_rank(coll: str, p: int) -> None:
    waiter, sender = (1, 0) if coll == "scatterv" else (0, 1)
    out = run_threads(p, _empty_block, coll)
    want = (f"world rank {waiter} called {coll}(algorithm=", f"but world rank {sender} called "
            f"a call that ended without sending what world rank {waiter} waits for, and went "
            "on to call #1 (the ranks gave different counts, or made different calls)")
    assert out[waiter][0].startswith("MismatchError: collective mismatch on world, call #0: "), out
    for r, lines in enumerate(out):
        for line in lines[1 if r != waiter else 0 :]:  # the next call fails everywhere too
            assert line.startswith("MismatchError: ") and all(w in line for w in want), (r, line)


@pytest.mark.parametrize("p", [2, 3])
@pytest.mark.parametrize("coll", ["gatherv", "scatterv", "alltoallv"])
def test_a_block_its_receiver_counts_as_empty_fails_every_rank_at_the_next_call(
        coll: str, p: int) -> None:
    """The call ends everywhere (no rank waits for the block); the message left over is found
    at the receiver's next call, whether it came during the call or after, and every rank
    fails there. On the shared-memory transport the next call sets up the shared windows: a
    rank whose peer gave up that set-up used to fail with "rank 1 has no window"."""
    receiver, sender = (1, 0) if coll == "scatterv" else (0, 1)
    out = run_threads(p, _empty_block, coll, True)
    call = f"{coll}(algorithm={'pairwise' if coll == 'alltoallv' else 'linear'}"
    either = re.compile(  # found when the call ended (it came after), or at the next call
        rf"collective mismatch on world, call #0: (world rank {receiver} called a call that "
        rf"ended without taking world rank {sender}'s message, but world rank {sender} called "
        rf"{re.escape(call)}|world ranks {receiver} and {sender} both called {re.escape(call)}"
        rf".*, but world rank {receiver} ended it without taking a message world rank {sender} "
        r"sent it "
        r"there \(the ranks gave different counts\))")
    for lines in out:
        assert lines[0] == "ok", out
        assert lines[1].startswith("MismatchError: "), out
        assert either.search(lines[1]), lines[1]


UNASKED = """
import numpy as np
import ringworld

comm = ringworld.init()
r = comm.rank
for step in range(2):
    try:
        if step:
            comm.allreduce(np.ones(2), np.empty(2))
        else:
            comm.scatterv(np.ones(9) if r == 0 else None, np.empty(0 if r == 1 else 3),
                          [3, 3, 3] if r == 0 else None, root=0, algorithm="linear")
        print(f"rank {r} call {step}: ok", flush=True)
    except ringworld.RingworldError as exc:
        print(f"rank {r} call {step}: {type(exc).__name__}: {exc}", flush=True)
"""


def test_over_shm_processes_a_peer_that_gave_up_the_windows_set_up_is_no_transport_error(
        tmp_path: Path) -> None:
    """Rank 1 finds the root's message left over once it has created its window for the next
    call's set-up and passed one barrier: it leaves, taking the window away. The other ranks
    used to fail with "TransportError: cannot open rank 1's shared window"."""
    r = _job(tmp_path, UNASKED, transport="shm")
    for rank in range(3):
        assert f"rank {rank} call 0: ok" in r.stdout, r.stdout
        assert f"rank {rank} call 1: MismatchError: collective mismatch on world, call #0: " \
            in r.stdout, r.stdout
    assert "TransportError" not in r.stdout, r.stdout


def _empty_after_a_long_wait(comm: Any, nonblocking: bool) -> list[str]:
    """Ranks 1 and 2 wait 4.5 s for rank 0 in an allreduce (the monitor's checks of that wait
    space out), then a gatherv to rank 2 whose rank 1 sends nothing where the root expects N:
    blocking, or nonblocking and waited for."""
    r, p = comm.rank, comm.size
    if r == 0:
        time.sleep(4.5)
    comm.allreduce(np.ones(2), np.empty(2), timeout=30)
    out = []
    for step in range(2):
        try:
            if step:
                comm.allreduce(np.ones(2), np.empty(2), timeout=30)
            else:
                args = (np.ones(0 if r == 1 else N), np.empty(N * p) if r == 2 else None,
                        [N] * p if r == 2 else None)
                if nonblocking:
                    req = comm.igatherv(*args, root=2, algorithm="linear")
                    req.wait(timeout=12)
                else:
                    comm.gatherv(*args, root=2, algorithm="linear", timeout=12)
            out.append("ok")
        except ringworld.RingworldError as exc:
            out.append(f"{type(exc).__name__}: {exc}")
    return out


@pytest.mark.parametrize("nonblocking", [False, True])
def test_an_empty_block_is_found_in_a_wait_that_follows_a_long_one(nonblocking: bool) -> None:
    """The monitor judges each wait from its start (it used to keep the doubled spacing of an
    earlier long wait: the first checks came after 8 and 16 s, past this call's timeout), and
    a nonblocking collective's wait too (it used to wait for good)."""
    out = run_threads(3, _empty_after_a_long_wait, nonblocking)
    want = (": world rank 2 called gatherv(algorithm=linear", "but world rank 1 called a call "
            "that ended without sending what world rank 2 waits for, and went on to call #")
    for r, lines in enumerate(out):
        assert len(lines) == 2, out
        for line in lines[1 if r != 2 else 0 :]:
            assert line.startswith("MismatchError: ") and all(w in line for w in want), out


STUCK = """
import numpy as np
import ringworld

comm = ringworld.init()
r = comm.rank
try:
    recv = np.full(9, -1.0) if r == 0 else None
    comm.gatherv(np.ones(0 if r == 1 else 3), recv, [3, 3, 3] if r == 0 else None, root=0)
    comm.allreduce(np.ones(2), np.empty(2))
    print(f"rank {r}: ok", flush=True)
except ringworld.MismatchError as exc:
    print(f"rank {r}: {exc}", flush=True)
"""


def test_over_tcp_an_empty_block_fails_the_job_instead_of_hanging(tmp_path: Path) -> None:
    """No timeout set (the default): the ranks used to wait for good."""
    r = _job(tmp_path, STUCK)
    lines = dict(line.split(": ", 1) for line in r.stdout.splitlines() if ": " in line)
    for rank in range(3):
        assert lines[f"rank {rank}"].startswith("collective mismatch on world, call #0: world "
                                                "rank 0 called gatherv("), r.stdout
        assert "but world rank 1 called a call that ended without sending what world rank 0 " \
               "waits for, and went on to call #1" in lines[f"rank {rank}"], r.stdout


BEHIND = """
import time
import numpy as np
import ringworld

comm = ringworld.init()
r = comm.rank
x = np.ones(4)
comm.allreduce(x, np.empty(4), algorithm="ring")  # each rank's last call: this one
if r == 0:  # a receive while rank 1 is a call ahead is no collective's wait
    got = np.empty(4)
    comm.recv(got, 1, tag=5)
    comm.bcast(x, root=1, algorithm="binomial")
elif r == 1:
    comm.bcast(x, root=1, algorithm="binomial")  # the root's part ends at once
    time.sleep(3)
    comm.send(np.full(4, 7.0), 0, tag=5)
else:
    comm.bcast(x, root=1, algorithm="binomial")
comm.barrier()
time.sleep(1.5)  # no wait at a beat: each monitor compares from a wait's first second again
# rank 2 waits in a ring allgather for what rank 1 forwards once rank 0 (4 s late) sends it;
# rank 1 is a call ahead meanwhile, its allgather in flight: not done with it
out = np.empty(3)
if r == 0:
    time.sleep(4)
if r == 1:
    req = comm.iallgather(np.full(1, 1.0), out, algorithm="ring")
    comm.barrier()
    req.wait()
else:
    comm.allgather(np.full(1, float(r)), out, algorithm="ring")
    comm.barrier()
print(f"rank {r}: ok {out.tolist()}", flush=True)
"""


def test_ranks_a_call_ahead_are_no_mismatch_while_they_may_still_send(tmp_path: Path) -> None:
    r = _job(tmp_path, BEHIND)
    for rank in range(3):
        assert f"rank {rank}: ok [0.0, 1.0, 2.0]" in r.stdout, r.stdout
