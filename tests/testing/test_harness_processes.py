"""run_processes: results, failures, timeouts and cleanup of the forked-process harness."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from ringworld.testing import RankFailed, run_processes

pytestmark = pytest.mark.timeout(120)
TRANSPORTS = ["shm", "tcp"]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def pids_printed(out: str) -> list[int]:
    # Unbuffered children may interleave their writes within a line: match, don't split.
    return [int(p) for p in re.findall(r"pid (\d+)", out)]


def ring_exchange(comm, base: int):
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    comm.send_obj({"from": comm.rank, "value": base * 100 + comm.rank}, dest=right, tag=5)
    got = comm.recv_obj(source=left, tag=5)
    return comm.rank, comm.size, got, os.getpid()


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("size", [1, 2, 5])
def test_results_come_back_in_rank_order(size: int, transport: str) -> None:
    results = run_processes(size, ring_exchange, 7, transport=transport, timeout=60)
    assert [r[:3] for r in results] == [
        (k, size, {"from": (k - 1) % size, "value": 700 + (k - 1) % size}) for k in range(size)
    ]
    pids = [r[3] for r in results]
    assert len(set(pids)) == size and os.getpid() not in pids
    assert not any(alive(p) for p in pids)


def read_env(comm):
    keys = ("RINGWORLD_RANK", "RINGWORLD_SIZE", "RINGWORLD_JOB_ID", "RINGWORLD_TRANSPORT",
            "RINGWORLD_SECRET_FD", "RW_TEST_EXTRA")
    return {k: os.environ.get(k) for k in keys} | {"secret": len(os.environ["RINGWORLD_SECRET"])}


def test_children_get_the_job_environment_and_extra_env(monkeypatch) -> None:
    monkeypatch.setenv("RINGWORLD_SECRET_FD", "999")  # a stale inherited value must not leak in
    envs = run_processes(3, read_env, transport="tcp", env={"RW_TEST_EXTRA": "x1"})
    assert [e["RINGWORLD_RANK"] for e in envs] == ["0", "1", "2"]
    assert {e["RINGWORLD_SIZE"] for e in envs} == {"3"}
    assert len({e["RINGWORLD_JOB_ID"] for e in envs}) == 1
    assert {(e["RINGWORLD_TRANSPORT"], e["RINGWORLD_SECRET_FD"], e["RW_TEST_EXTRA"], e["secret"])
            for e in envs} == {("tcp", None, "x1", 64)}
    assert "RINGWORLD_SECRET" not in os.environ


def big_result(comm, nbytes: int) -> bytes:
    return bytes([comm.rank]) * nbytes


def test_results_larger_than_a_pipe_buffer() -> None:
    results = run_processes(3, big_result, 3_000_000)
    assert [len(r) for r in results] == [3_000_000] * 3
    assert [r[-1] for r in results] == [0, 1, 2]


def fail_on_rank(comm, bad: int):
    pid = os.getpid()
    print(f"pid {pid}", flush=True)
    if comm.rank == bad:
        time.sleep(0.2)
        raise ValueError(f"boom on rank {comm.rank}")
    comm.recv_obj(source=bad, tag=1, timeout=100)  # blocked until the harness kills us


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_first_exception_raises_rank_failed_and_kills_the_rest(capfd, transport: str) -> None:
    start = time.monotonic()
    with pytest.raises(RankFailed) as info:
        run_processes(4, fail_on_rank, 2, transport=transport, timeout=60)
    assert time.monotonic() - start < 20
    assert info.value.rank == 2
    assert "ValueError: boom on rank 2" in info.value.detail
    assert "in fail_on_rank" in str(info.value)
    assert str(info.value).startswith("rank 2 failed:\n")
    pids = pids_printed(capfd.readouterr().out)
    assert len(pids) == 4
    assert not any(alive(p) for p in pids)


def sigkill_rank_1(comm):
    if comm.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    comm.recv_obj(source=1, tag=1, timeout=100)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_rank_killed_by_a_signal(transport: str) -> None:
    with pytest.raises(RankFailed) as info:
        run_processes(3, sigkill_rank_1, transport=transport, timeout=60)
    assert info.value.rank == 1
    assert "killed by SIGKILL before reporting a result" in info.value.detail


def exit_quietly(comm):
    if comm.rank == 0:
        os._exit(0)
    return comm.rank


def test_rank_exiting_without_a_result() -> None:
    with pytest.raises(RankFailed) as info:
        run_processes(2, exit_quietly)
    assert info.value.rank == 0
    assert "exited with code 0 before reporting a result" in info.value.detail


def hang_on_rank(comm, slow: tuple[int, ...]):
    print(f"pid {os.getpid()}", flush=True)
    if comm.rank in slow:
        time.sleep(100)
    return comm.rank


def test_timeout_names_the_unfinished_ranks_and_cleans_up(capfd) -> None:
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"rank\(s\) 1, 3 of 4 had not finished after 1.5 s"):
        run_processes(4, hang_on_rank, (1, 3), timeout=1.5)
    assert 1.4 < time.monotonic() - start < 15
    pids = pids_printed(capfd.readouterr().out)
    assert len(pids) == 4 and not any(alive(p) for p in pids)


def unpicklable(comm):
    return lambda: comm.rank


def test_unpicklable_result_is_a_rank_failure() -> None:
    with pytest.raises(RankFailed, match=r"(?i)can't pickle"):
        run_processes(2, unpicklable)


def leave_shm_file(comm, fail: bool) -> str:
    job = os.environ["RINGWORLD_JOB_ID"]
    open(f"/dev/shm/ringworld-{job}-{comm.rank}-test", "w").close()
    print(f"job {job}", flush=True)
    if fail and comm.rank == 1:
        raise RuntimeError("leaving a mess")
    return job


@pytest.mark.parametrize("fail", [False, True])
def test_shm_leftovers_are_removed(capfd, fail: bool) -> None:
    if fail:
        with pytest.raises(RankFailed):
            run_processes(2, leave_shm_file, fail)
    else:
        run_processes(2, leave_shm_file, fail)
    job = re.findall(r"job ([0-9a-f]+)", capfd.readouterr().out)[0]
    assert [n for n in os.listdir("/dev/shm") if n.startswith(f"ringworld-{job}-")] == []


def store_address(comm) -> str:
    return os.environ["RINGWORLD_STORE"]


def test_store_is_closed_afterwards() -> None:
    host, port = run_processes(1, store_address)[0].rsplit(":", 1)
    with pytest.raises(ConnectionRefusedError), socket.create_connection((host, int(port)), 2):
        pass


FLUSH_SCRIPT = """
import sys
from ringworld.testing import run_processes

def say(comm):
    print(f"hello {comm.rank}")  # block-buffered (stdout is a pipe), never flushed by fn

sys.stdout.write("parent-pending ")  # still in the buffer when the children fork
run_processes(3, say)
print("done")
"""


def test_child_output_is_flushed_and_parent_output_not_duplicated() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    r = subprocess.run([sys.executable, "-c", FLUSH_SCRIPT], capture_output=True, text=True,
                       timeout=60, check=False, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("parent-pending ")
    body = r.stdout.removeprefix("parent-pending ").splitlines()
    assert sorted(body[:-1]) == ["hello 0", "hello 1", "hello 2"]
    assert body[-1] == "done"


@pytest.mark.parametrize(("size", "timeout"), [(0, 1.0), (2, 0.0), (2, -1.0)])
def test_bad_arguments(size: int, timeout: float) -> None:
    with pytest.raises(ValueError):
        run_processes(size, store_address, timeout=timeout)


INHERITED_WORLD_SCRIPT = """
import ringworld
from ringworld.testing import run_processes
ringworld.init()  # a singleton world in the parent
try:
    run_processes(2, lambda comm: comm.size)
except RuntimeError as exc:
    print("refused:", exc)
"""


def test_refuses_to_fork_from_a_process_with_a_world() -> None:
    r = subprocess.run([sys.executable, "-c", INHERITED_WORLD_SCRIPT], capture_output=True,
                       text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("refused: run_processes: this process already ran ringworld.init()")
