"""Pieces of the launcher that need no processes: line splitting, reports, exit codes, cleanup."""

from __future__ import annotations

import io
import os
from collections import deque

import pytest

from ringworld.launch import job
from ringworld.launch.procset import MAX_LINE_BYTES, JobResult, RankExit, _Pipe, _Sink
from ringworld.launch.report import failure_report, job_exit_code, recovery_exit_code


def pipe(prefix: bytes = b"", tail: deque[bytes] | None = None) -> tuple[_Pipe, io.BytesIO]:
    out = io.BytesIO()
    return _Pipe(0, 3, _Sink(out), prefix, tail), out


def test_whole_lines_only_until_finish() -> None:
    p, out = pipe()
    p.feed(b"ab")
    p.feed(b"c\nde")
    assert out.getvalue() == b"abc\n"
    p.feed(b"f\ng")
    assert out.getvalue() == b"abc\ndef\n"
    p.finish()
    assert out.getvalue() == b"abc\ndef\ng"


def test_tagged_lines_and_a_final_partial_line() -> None:
    p, out = pipe(b"[3] ")
    p.feed(b"one\ntw")
    p.feed(b"o\n\nthree")
    p.finish()
    assert out.getvalue() == b"[3] one\n[3] two\n[3] \n[3] three\n"


def test_overlong_line_is_forwarded_in_pieces_with_one_tag() -> None:
    p, out = pipe(b"[3] ")
    p.feed(b"x" * (MAX_LINE_BYTES + 10))
    assert out.getvalue() == b"[3] " + b"x" * (MAX_LINE_BYTES + 10)
    p.feed(b"yy\nz")
    p.finish()
    assert out.getvalue() == b"[3] " + b"x" * (MAX_LINE_BYTES + 10) + b"yy\n[3] z\n"


def test_tail_keeps_the_last_lines_joined_across_chunks() -> None:
    tail: deque[bytes] = deque(maxlen=3)
    p, _ = pipe(tail=tail)
    p.feed(b"l1\nl2\nl")
    p.feed(b"3\nl4\nl5 no newline")
    p.finish()
    assert list(tail) == [b"l3", b"l4", b"l5 no newline"]


def test_sink_survives_a_closed_reader() -> None:
    class Broken(io.BytesIO):
        def write(self, data) -> int:  # type: ignore[override]
            raise BrokenPipeError

    sink = _Sink(Broken())
    sink.write(b"x")
    sink.write(b"y")  # no exception: output is dropped once the reader is gone
    sink.flush()


def test_sink_writes_everything_to_a_stream_that_takes_part_of_each_write() -> None:
    """An unbuffered stdout (PYTHONUNBUFFERED: a raw FileIO) takes what one write(2) takes; a
    pipe whose reader lags, or a signal during the call, leaves the rest, and a non-blocking
    one may take nothing (None). Lines were lost that way (a 3-rank job printing 18 MB lost
    11 lines of 6000 in 3 runs of 15); every byte must arrive, in order."""

    class Stingy(io.RawIOBase):
        def __init__(self) -> None:
            self.got = bytearray()
            self.calls = 0

        def writable(self) -> bool:
            return True

        def write(self, data) -> int | None:  # type: ignore[override]
            self.calls += 1
            if self.calls % 3 == 0:
                return None  # full for now
            if self.calls % 5 == 0:  # as a buffered stream over a non-blocking pipe says it
                take = bytes(data[:100])
                self.got += take
                raise BlockingIOError(11, "full", len(take))
            take = bytes(data[: 1 + self.calls % 7 * 1000])
            self.got += take
            return len(take)

    raw = Stingy()
    sink = _Sink(raw)  # type: ignore[arg-type]
    lines = [str(k % 10).encode() * 3000 + b"\n" for k in range(20)]
    for line in lines:
        sink.write(line)
    assert bytes(raw.got) == b"".join(lines)
    assert raw.calls > 2 * len(lines)  # the stream really took part of most writes


def test_sink_decodes_for_text_streams() -> None:
    out = io.StringIO()
    sink = _Sink(out)
    sink.write(b"caf\xc3\xa9 \xff\n")
    assert out.getvalue() == "café \ufffd\n"


def result(*exits: RankExit, root: int | None = None, interrupted: int | None = None,
           tails: dict[int, tuple[str, ...]] | None = None) -> JobResult:
    cause = next((e for e in exits if e.rank == root), None)
    return JobResult(exits, cause, interrupted, tails or {})


def test_report_names_the_root_cause_and_the_others() -> None:
    r = result(RankExit(0, 100, -15, True), RankExit(1, 101, 3, False),
               RankExit(2, 102, 1, False), RankExit(3, 103, 0, False),
               root=1, tails={1: ("Traceback", "ValueError: x")})
    text = failure_report(r, "abcd1234", size=5)
    assert text.splitlines() == [
        "ringworld: job abcd1234 failed: rank 1 (pid 101) exited with code 3",
        "ringworld: other ranks: rank 0 stopped by ringworld; rank 2 exited with code 1; "
        "rank 3 had finished; 1 never started",
        "ringworld: last 2 stderr lines of rank 1:",
        "  | Traceback",
        "  | ValueError: x",
    ]
    assert job_exit_code(r) == 3


def test_report_for_a_signal_death_without_stderr() -> None:
    r = result(RankExit(0, 7, -9, False), root=0)
    text = failure_report(r, "j", size=1)
    assert text.splitlines() == [
        "ringworld: job j failed: rank 0 (pid 7) killed by SIGKILL",
        "ringworld: rank 0 wrote nothing to stderr",
    ]
    assert job_exit_code(r) == 137


def test_interrupted_and_successful_jobs() -> None:
    stopped = result(RankExit(0, 7, -2, True), RankExit(1, 8, 0, True), interrupted=2)
    assert failure_report(stopped, "j", 2) == (
        "ringworld: job j interrupted by SIGINT; stopped all ranks\n")
    assert job_exit_code(stopped) == 130
    fine = result(RankExit(0, 7, 0, False), RankExit(1, 8, 0, False))
    assert failure_report(fine, "j", 2) == ""
    assert job_exit_code(fine) == 0


HUNG = "no heartbeat for 3.0 s (liveness timeout 3 s; ...), found by rank 0"


def test_report_names_the_rank_that_stopped_responding_and_its_consequences() -> None:
    r = result(RankExit(0, 100, 1, False, secondary=True), RankExit(1, 101, -9, True,
               unresponsive=HUNG), RankExit(2, 102, 1, False, secondary=True),
               RankExit(3, 103, -15, True), RankExit(4, 104, 5, False), root=1)
    assert failure_report(r, "j", size=5).splitlines() == [
        f"ringworld: job j failed: rank 1 (pid 101) stopped responding: {HUNG}",
        "ringworld: other ranks: rank 3 stopped by ringworld; rank 4 exited with code 5; "
        "ranks 0, 2 exited with code 1 because of it (peer failure)",
        "ringworld: rank 1 wrote nothing to stderr",
    ]
    assert job_exit_code(r) == 1  # rank 0's: rank 1 was killed by the launcher
    alone = result(RankExit(0, 100, 0, False), RankExit(1, 101, -9, True, unresponsive=HUNG),
                   root=1)
    assert job_exit_code(alone) == 1


def test_recovery_counts_ranks_that_stopped_responding_as_lost() -> None:
    r = result(RankExit(0, 100, -9, False), RankExit(1, 101, -9, True, unresponsive=HUNG),
               RankExit(2, 102, 0, False), root=0)
    assert recovery_exit_code(r) == 0
    assert "rank 1 stopped responding" in failure_report(r, "j", 3, recovery=True)
    lost = result(RankExit(0, 100, -9, True, unresponsive=HUNG), root=0)
    assert recovery_exit_code(lost) == 1
    assert failure_report(lost, "j", 1, recovery=True).startswith(
        f"ringworld: job j lost rank 0 (pid 100): stopped responding: {HUNG}; the other ranks")


def test_the_launcher_reads_the_ranks_the_monitors_declared() -> None:
    from ringworld.launch.liveness import JobFailures
    from ringworld.store.records import publish_failure
    from ringworld.store.tcp import TCPStore, TCPStoreServer

    secret = os.urandom(32)
    with TCPStoreServer(secret) as server:
        host, port = server.start()
        with TCPStore(host, port, secret, timeout=5) as rank, \
                JobFailures(f"{host}:{port}", secret) as launcher:
            assert launcher.unresponsive() == {}
            launcher.tell(RankExit(3, 77, 2, False))  # an exit: not a rank that stopped responding
            publish_failure(rank, 2, "not responding: no heartbeat for 4.0 s (x)", 0)
            publish_failure(rank, 1, "connection reset", 0)  # found dead, not unresponsive
            publish_failure(rank, 2, "not responding: no heartbeat for 5.0 s (x)", 3)
            publish_failure(rank, 0, "not responding: no heartbeat for 6.0 s (y)", 1)
            assert launcher.unresponsive() == {
                2: "no heartbeat for 4.0 s (x), found by rank 0",
                0: "no heartbeat for 6.0 s (y), found by rank 1",
            }
            assert list(launcher.unresponsive()) == [2, 0]  # first declared first


def test_remove_shm_segments_only_touches_this_job(tmp_path) -> None:
    for name in ("ringworld-aa11-0", "ringworld-aa11-1-ring", "ringworld-aa111-0",
                 "ringworld-bb22-0", "other"):
        (tmp_path / name).write_bytes(b"")
    removed = job.remove_shm_segments("aa11", shm_dir=str(tmp_path))
    assert sorted(removed) == ["ringworld-aa11-0", "ringworld-aa11-1-ring"]
    assert sorted(os.listdir(tmp_path)) == ["other", "ringworld-aa111-0", "ringworld-bb22-0"]


@pytest.mark.parametrize("bad", ["", "*", "a/b", "../x", "a b"])
def test_remove_shm_segments_rejects_unsafe_ids(bad: str) -> None:
    with pytest.raises(ValueError, match="job_id"):
        job.remove_shm_segments(bad)


def test_rank_env_replaces_inherited_contract_variables() -> None:
    base = {"PATH": "/bin", "RINGWORLD_RANK": "9", "RINGWORLD_SECRET": "ff",
            "RINGWORLD_SECRET_FD": "5", "RINGWORLD_TRANSPORT": "tcp",
            "RINGWORLD_EAGER_BYTES": "10"}
    env = job.rank_env(base, rank=1, size=2, store="h:1", job_id="j1")
    assert env == {"PATH": "/bin", "RINGWORLD_RANK": "1", "RINGWORLD_SIZE": "2",
                   "RINGWORLD_STORE": "h:1", "RINGWORLD_JOB_ID": "j1",
                   "RINGWORLD_TRANSPORT": "tcp", "RINGWORLD_EAGER_BYTES": "10"}
    env = job.rank_env(base, rank=0, size=2, store="h:1", job_id="j1", transport="shm", timeout=3)
    assert env["RINGWORLD_TRANSPORT"] == "shm" and env["RINGWORLD_TIMEOUT"] == "3.0"


def test_job_ids_and_secrets_are_fresh() -> None:
    assert len({job.new_job_id() for _ in range(100)}) == 100
    secrets = {job.new_secret() for _ in range(10)}
    assert len(secrets) == 10 and all(len(s) == 32 for s in secrets)
