"""End to end: a traced job writes one valid Chrome/Perfetto trace with every rank's calls."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from ringworld.trace import merge

pytestmark = pytest.mark.timeout(120)

PROGRAM = """
import numpy as np
import ringworld

comm = ringworld.init()
a = np.arange(1001, dtype=np.float64) + comm.rank
b = np.empty_like(a)
comm.allreduce(a, b, algorithm="ring")
comm.bcast(b, root=0, algorithm="binomial")
if comm.rank == 0:
    comm.send(a[:10], 1, tag=5)
    comm.isend(a[:20], 1, tag=6).wait()
elif comm.rank == 1:
    comm.recv(b[:10], 0, tag=5)
    ringworld.wait_all([comm.irecv(b[:20], 0, tag=6)])
comm.allreduce_obj(comm.rank)
sub = comm.split(comm.rank % 2)
sub.barrier(algorithm="dissemination")
comm.iallgather(a[:3], np.empty(3 * comm.size)).wait()
"""


def _run(tmp_path: Path, *args: str, env: dict[str, str] | None = None,
         body: str = PROGRAM) -> subprocess.CompletedProcess[str]:
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent(body))
    return subprocess.run([sys.executable, "-m", "ringworld", "run", *args, str(prog)],
                          capture_output=True, text=True, timeout=90, check=False,
                          stdin=subprocess.DEVNULL, env=env, cwd=tmp_path)


def _load(path: Path) -> list[dict[str, Any]]:
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    for e in events:  # the Chrome trace event format's required fields
        assert isinstance(e["name"], str) and e["ph"] in ("X", "M")
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "X":
            assert isinstance(e["ts"], float) and e["ts"] > 1e15  # µs since the epoch
            assert isinstance(e["dur"], float) and e["dur"] >= 0
    return events


def _calls(events: list[dict[str, Any]], rank: int) -> list[tuple[str, str, dict[str, Any]]]:
    """(the call, its category, its args without ``call``) of each of ``rank``'s slices (a
    buffer collective's slice name also shows bytes and algorithm: see the test below)."""
    return [(e["args"].get("call", e["name"]), e["cat"],
             {k: v for k, v in e["args"].items() if k != "call"})
            for e in events if e["ph"] == "X" and e["pid"] == rank]


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_three_ranks_one_trace(tmp_path: Path, transport: str) -> None:
    out = tmp_path / "trace.json"
    r = _run(tmp_path, "-n", "3", "--transport", transport, "--trace-file", str(out))
    assert r.returncode == 0, r.stderr
    assert f"written to {out}" in r.stderr
    assert not merge.parts(str(out)), "parts are removed after merging"
    events = _load(out)
    assert {e["pid"] for e in events} == {0, 1, 2}
    names = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {"rank 0", "rank 1", "rank 2"}
    for rank in range(3):
        calls = _calls(events, rank)
        coll = [(n, a) for n, c, a in calls if c == "collective"]
        assert ("allreduce", {"comm": "world", "bytes": 8008, "algorithm": "ring"}) in coll
        assert ("bcast", {"comm": "world", "root": 0, "bytes": 8008,
                          "algorithm": "binomial"}) in coll
        assert any(n == "allreduce_obj" for n, _ in coll)
        assert ("barrier", {"comm": f"world.split{rank % 2}",
                            "algorithm": "dissemination"}) in coll
        # a nonblocking collective: its posting and a span until a wait saw it complete
        assert any(n == "iallgather" and c == "post" for n, c, _ in calls)
        assert any(n == "allgather" and c == "request" for n, c, _ in calls)
    calls0 = _calls(events, 0)
    assert ("send", "p2p", {"comm": "world", "dest": 1, "tag": 5, "bytes": 80}) in calls0
    assert ("isend", "post", {"comm": "world", "dest": 1, "tag": 6, "bytes": 160}) in calls0
    calls1 = _calls(events, 1)
    assert ("recv", "p2p", {"comm": "world", "source": 0, "tag": 5, "bytes": 80}) in calls1
    # wait_all's blocking wait says what it waited for (it may complete without waiting)
    waits = [a["for"] for n, c, a in calls1 if c == "wait"]
    assert all(isinstance(w, str) and w for w in waits)
    # the ranks' clocks line up: every rank's allreduce overlaps the others' in time
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in events
             if e["ph"] == "X" and e["args"].get("call") == "allreduce"
             and e["cat"] == "collective"]
    # a collective's slice names its bytes and algorithm
    named = {e["name"] for e in events if e["ph"] == "X" and e["args"].get("call") == "allreduce"}
    assert named == {"allreduce 7.82 KiB ring"}, named  # 8008 B, the algorithm asked for
    assert max(s for s, _ in spans) <= min(e for _, e in spans)


def test_env_variable_and_singleton(tmp_path: Path) -> None:
    out = tmp_path / "solo.json"
    env = {**os.environ, "RINGWORLD_TRACE": str(out)}
    body = "import ringworld\nc = ringworld.init()\nc.barrier()\nc.allreduce_obj(3)\n"
    prog = tmp_path / "solo.py"
    prog.write_text(body)
    r = subprocess.run([sys.executable, str(prog)], capture_output=True, text=True, timeout=60,
                       check=False, env=env)
    assert r.returncode == 0, r.stderr
    events = _load(out)  # a process outside the launcher writes the merged file itself
    assert [n for n, _, _ in _calls(events, 0)] == ["barrier", "allreduce_obj"]
    # and the launcher honours an inherited RINGWORLD_TRACE
    out2 = tmp_path / "env.json"
    r = _run(tmp_path, "-n", "2", env={**os.environ, "RINGWORLD_TRACE": str(out2)})
    assert r.returncode == 0, r.stderr
    assert {e["pid"] for e in _load(out2)} == {0, 1}


def test_failed_job_still_traces_the_call_in_progress(tmp_path: Path) -> None:
    out = tmp_path / "fail.json"
    body = """
    import numpy as np, ringworld
    comm = ringworld.init()
    comm.barrier()
    if comm.rank == 1:
        raise SystemExit(3)
    comm.recv(np.empty(4), 1, tag=1, timeout=20)
    """
    r = _run(tmp_path, "-n", "2", "--trace-file", str(out), body=body)
    assert r.returncode == 3
    events = _load(out)
    # rank 0 either saw the failure or was stopped by the launcher first: recorded either way
    failed = [a for n, c, a in _calls(events, 0) if n == "recv"]
    assert failed
    assert "PeerFailure" in failed[0].get("error", "") \
        or failed[0].get("unfinished") == "killed by SIGTERM"
    assert any(n == "barrier" for n, _, _ in _calls(events, 1))


def test_bad_trace_path_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "no" / "such" / "dir" / "t.json"
    r = _run(tmp_path, "-n", "2", "--trace-file", str(bad),
             body="import ringworld\nringworld.init()\n")
    assert r.returncode != 0
    assert "RINGWORLD_TRACE" in r.stderr and "cannot write the trace" in r.stderr


def test_off_by_default_nothing_is_wrapped(tmp_path: Path) -> None:
    body = ("import ringworld\nfrom ringworld.collective.communicator import Communicator\n"
            "ringworld.init()\n"
            "assert not hasattr(Communicator.allreduce, '__ringworld_traced__')\n"
            "import sys\nassert 'ringworld.trace.recorder' not in sys.modules\n")
    r = _run(tmp_path, "-n", "2", body=body)
    assert r.returncode == 0, r.stderr
    assert not list(tmp_path.glob("*.json*"))


def test_merge_skips_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    good = {"name": "barrier", "ph": "X", "ts": 1.7e15, "dur": 3.0, "pid": 0, "tid": 0}
    (tmp_path / "t.json.rank0").write_text(json.dumps(good) + "\n")
    (tmp_path / "t.json.rank1").write_text(json.dumps({**good, "pid": 1}) + '\n{"name": "ba')
    (tmp_path / "t.json.rankx").write_text("not a part\n")
    assert merge.merge(str(path)) == (2, 2)
    doc = json.loads(path.read_text())
    assert doc["otherData"]["unreadable_lines"] == 1
    assert (tmp_path / "t.json.rankx").exists()
    with pytest.raises(FileNotFoundError, match="no trace parts"):
        merge.merge(str(tmp_path / "none.json"))


def test_trace_merge_command(tmp_path: Path) -> None:
    """`ringworld trace merge PATH` joins parts left behind (and says so when there are none);
    `python -m ringworld.trace.merge PATH` is the same command."""
    out = tmp_path / "left.json"
    for rank in (0, 1):
        event = {"name": "barrier", "ph": "X", "ts": 1.0 + rank, "dur": 1.0, "pid": rank,
                 "tid": 0, "args": {}}
        (tmp_path / f"left.json.rank{rank}").write_text(json.dumps(event) + "\n")
    r = subprocess.run([sys.executable, "-m", "ringworld", "trace", "merge", str(out)],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0 and "merged 2 ranks (2 events)" in r.stdout, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    assert doc["otherData"]["ranks"] == 2 and not merge.parts(str(out))
    r = subprocess.run([sys.executable, "-m", "ringworld.trace.merge", str(out) + ".none"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 1 and "no parts" in r.stderr, r.stdout + r.stderr
