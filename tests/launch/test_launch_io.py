"""Output forwarding, stdin, and the environment the launcher gives each rank."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from launch_util import LAUNCHER, TRANSPORTS, ringworld, script

pytestmark = pytest.mark.timeout(120)


def buffered_env() -> dict[str, str]:
    """This environment without PYTHONUNBUFFERED (the launcher should add it for its ranks)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_tag_output_prefixes_stdout_and_stderr_lines(tmp_path, transport: str) -> None:
    prog = script(tmp_path, """
        import sys, ringworld
        comm = ringworld.init()
        comm.barrier()
        print(f"out {comm.rank}")
        print(f"err {comm.rank}", file=sys.stderr)
        print("tail", end="")
        ringworld.finalize()
    """)
    r = ringworld("run", "-n", "3", "--tag-output", "--transport", transport, str(prog))
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == sorted(
        [f"[{k}] out {k}" for k in range(3)] + [f"[{k}] tail" for k in range(3)]
    )
    assert sorted(r.stderr.splitlines()) == [f"[{k}] err {k}" for k in range(3)]


def test_without_tag_output_bytes_pass_unchanged(tmp_path) -> None:
    prog = script(tmp_path, """
        import sys
        sys.stdout.buffer.write(b"caf\\xc3\\xa9 \\xff raw\\r\\nno newline at end")
    """)
    r = subprocess.run([*LAUNCHER, "run", "-n", "1", str(prog)], capture_output=True,
                       stdin=subprocess.DEVNULL, timeout=60, check=False)
    assert r.returncode == 0
    assert r.stdout == b"caf\xc3\xa9 \xff raw\r\nno newline at end"


def test_lines_of_different_ranks_never_interleave(tmp_path) -> None:
    prog = script(tmp_path, """
        import os, sys
        rank = os.environ["RINGWORLD_RANK"]
        line = (rank * 3000)[:3000]
        for i in range(2000):
            # several writes per line: the launcher must still forward whole lines
            sys.stdout.write(line[:1000]); sys.stdout.write(line[1000:]); sys.stdout.write("\\n")
    """)
    r = ringworld("run", "-n", "3", str(prog), timeout=90)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 6000
    for k in range(3):
        assert lines.count(str(k) * 3000) == 2000


def test_very_long_line_without_newline_is_forwarded(tmp_path) -> None:
    prog = script(tmp_path, "import sys; sys.stdout.write('x' * 1_000_000)\n")
    r = ringworld("run", "-n", "1", "--tag-output", str(prog))
    assert r.returncode == 0
    assert r.stdout.startswith("[0] xxx")
    assert r.stdout.count("x") == 1_000_000
    assert r.stdout.endswith("x\n")


def test_stdin_goes_to_rank_0_only(tmp_path) -> None:
    prog = script(tmp_path, """
        import os, sys
        data = sys.stdin.read()
        print(os.environ["RINGWORLD_RANK"], repr(data))
    """)
    r = ringworld("run", "-n", "3", str(prog), input="line one\nline two\n")
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == [
        "0 'line one\\nline two\\n'", "1 ''", "2 ''",
    ]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_stdin_read_by_rank_0_and_shared(tmp_path, transport: str) -> None:
    prog = script(tmp_path, """
        import sys, ringworld
        comm = ringworld.init()
        if comm.rank == 0:
            words = sys.stdin.read().split()
            for dest in range(1, comm.size):
                comm.send_obj(words[dest], dest=dest, tag=1)
        else:
            print(comm.rank, comm.recv_obj(source=0, tag=1))
        ringworld.finalize()
    """)
    r = ringworld("run", "-n", "3", "--transport", transport, str(prog), input="zero one two")
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == ["1 one", "2 two"]


def test_rank_environment_follows_the_contract(tmp_path) -> None:
    prog = script(tmp_path, """
        import os
        e = os.environ
        print(e["RINGWORLD_RANK"], e["RINGWORLD_SIZE"], e["RINGWORLD_STORE"], e["RINGWORLD_JOB_ID"],
              e["RINGWORLD_TRANSPORT"], e["RINGWORLD_TIMEOUT"], e.get("PYTHONUNBUFFERED"))
    """)
    r = ringworld("run", "-n", "4", "--transport", "tcp", "--timeout", "7.5", str(prog),
                  env=buffered_env())
    assert r.returncode == 0, r.stderr
    rows = sorted(line.split() for line in r.stdout.splitlines())
    assert [row[:2] for row in rows] == [[str(k), "4"] for k in range(4)]
    assert len({row[2] for row in rows}) == 1
    assert re.fullmatch(r"127\.0\.0\.1:\d+", rows[0][2])
    assert len({row[3] for row in rows}) == 1
    assert re.fullmatch(r"[0-9a-f]{8}", rows[0][3])
    assert {tuple(row[4:]) for row in rows} == {("tcp", "7.5", "1")}


def test_secret_comes_through_a_pipe_fd_only(tmp_path) -> None:
    prog = script(tmp_path, """
        import os, sys
        fd = int(os.environ["RINGWORLD_SECRET_FD"])
        secret = os.read(fd, 1000).decode()
        assert secret.endswith("\\n") and len(secret) == 65, repr(secret)
        int(secret, 16)
        with open("/proc/self/cmdline", "rb") as f:
            cmdline = f.read()
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            cmdline += f.read()
        leaked = secret.strip() in (cmdline.decode() + str(dict(os.environ)))
        has_env_secret = "RINGWORLD_SECRET" in os.environ
        print(os.environ["RINGWORLD_RANK"], secret.strip(), has_env_secret, leaked)
    """)
    r = ringworld("run", "-n", "2", str(prog), env={"RINGWORLD_SECRET": "00" * 32,
                                                     "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    rows = sorted(line.split() for line in r.stdout.splitlines())
    assert [row[0] for row in rows] == ["0", "1"]
    assert rows[0][1] == rows[1][1] != "00" * 32  # one secret per job, not an inherited one
    assert {tuple(row[2:]) for row in rows} == {("False", "False")}
    again = ringworld("run", "-n", "1", str(prog))
    assert again.stdout.split()[1] != rows[0][1]  # fresh per job


def test_python_output_is_unbuffered_and_ordered(tmp_path) -> None:
    # Output printed before a crash must not be lost in a block buffer.
    prog = script(tmp_path, """
        import os, signal
        print("before the crash")
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    r = ringworld("run", "-n", "1", str(prog), env=buffered_env())
    assert r.returncode == 137
    assert r.stdout == "before the crash\n"
