"""The seed's programs through the real launcher: exact output, every start-up form."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from launch_util import EXAMPLES, TRANSPORTS, ringworld, script

pytestmark = pytest.mark.timeout(120)


def hello_lines(n: int) -> list[str]:
    return [f"We have {n} processes."] + [f"Process {r} reporting for duty." for r in range(1, n)]


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_hello_prints_exactly_the_seed_output(n: int, transport: str) -> None:
    r = ringworld("run", "-n", str(n), "--transport", transport,
                  sys.executable, str(EXAMPLES / "hello.py"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == hello_lines(n)
    assert r.stderr == ""


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_p2p_prints_the_received_message(transport: str) -> None:
    r = ringworld("run", "-n", "2", "--transport", transport, str(EXAMPLES / "p2p.py"))
    assert r.returncode == 0, r.stderr
    assert r.stdout == "received :Hello, there:\n"


def test_console_script_and_python_m_agree() -> None:
    exe = os.path.join(os.path.dirname(sys.executable), "ringworld")
    r = subprocess.run([exe, "run", "-n", "4", sys.executable, str(EXAMPLES / "hello.py")],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                       check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == hello_lines(4)


def test_dash_m_runs_a_module_with_its_arguments(tmp_path) -> None:
    script(tmp_path, """
        import sys, ringworld
        comm = ringworld.init()
        comm.barrier()
        print(f"{comm.rank}/{comm.size} {sys.argv[1:]}")
        ringworld.finalize()
    """, name="rwmod.py")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    r = ringworld("run", "-n", "2", "-m", "rwmod", "-n", "7", "--tag-output", env=env)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == [
        "0/2 ['-n', '7', '--tag-output']",
        "1/2 ['-n', '7', '--tag-output']",
    ]


def test_dash_c_runs_code_with_its_arguments() -> None:
    r = ringworld("run", "-n", "3", "-c",
                  "import ringworld, sys; c = ringworld.init(); c.barrier(); "
                  "print(c.rank, sys.argv[1:]); ringworld.finalize()", "a", "-b")
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == [f"{k} ['a', '-b']" for k in range(3)]


def test_py_file_runs_with_this_python(tmp_path) -> None:
    prog = script(tmp_path, """
        import os, sys
        print(os.environ["RINGWORLD_RANK"], sys.executable == os.environ["EXPECTED"], sys.argv[1:])
    """)
    env = dict(os.environ, EXPECTED=sys.executable)
    r = ringworld("run", "-n", "2", str(prog), "x", env=env)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == ["0 True ['x']", "1 True ['x']"]


def test_any_executable_and_double_dash() -> None:
    r = ringworld("run", "-n", "2", "--", "sh", "-c", 'echo "rank $RINGWORLD_RANK"')
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == ["rank 0", "rank 1"]


def test_runs_from_another_directory(tmp_path) -> None:
    r = ringworld("run", "-n", "2", "python", str(EXAMPLES / "hello.py"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == hello_lines(2)
