"""Ranks started without ``ringworld run``: the variables of torchrun, srun and mpiexec set by
hand on processes this test spawns, then the real ``torchrun`` and MPICH ``mpiexec``.

Every rank runs ``rank_prog.py`` (allreduce, bcast, allgather_obj, and ``ringworld.MPI``) and
prints one ``RANKLINE``; each job runs under a hard timeout and is killed on failure. Afterwards
no shared-memory segment of the job is left in /dev/shm.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PROG = Path(__file__).with_name("rank_prog.py")
JOB_TIMEOUT = 120
MPI_PYTHON = os.environ.get("RINGWORLD_MPI_PYTHON", "")
MPIEXEC = os.path.join(os.path.dirname(MPI_PYTHON), "mpiexec") if MPI_PYTHON else ""
# launchers' variables inherited from the environment the tests run in must not leak in
FOREIGN = ("RINGWORLD_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_",
           "SLURM_", "PMI_", "MPI_LOCAL", "OMPI_", "TORCHELASTIC_")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def base_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN)}
    env["PYTHONPATH"] = str(SRC)
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")  # the per-user secret lands here
    env["RINGWORLD_TIMEOUT"] = "60"
    return env


def _shm_names() -> set[str]:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("ringworld-x")}
    except OSError:
        return set()


@pytest.fixture
def shm_clean() -> Iterator[None]:
    before = _shm_names()
    yield
    assert _shm_names() - before == set(), "a job left shared-memory segments behind"


def _spawn(envs: list[dict[str, str]], argv: list[str] | None = None) -> list[str]:
    """Start one process per environment, wait (hard timeout), return their stdouts."""
    procs = [subprocess.Popen(argv or [sys.executable, str(PROG)], env=e, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for e in envs]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=JOB_TIMEOUT)
            assert p.returncode == 0, f"rank exited {p.returncode}:\n{out}\n{err}"
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs


def _check(outs: list[str], size: int) -> None:
    # a launcher may merge the ranks' output without keeping lines whole: find the records
    lines = sorted(m for out in outs for m in re.findall(r"RANKLINE \d+ \d+ \w+ -?\d+ \d+",
                                                          out))
    want = sum(range(1, size + 1))
    assert lines == sorted(f"RANKLINE {r} {size} True {size - 1} {want}" for r in range(size))


def _torchrun_env(base: dict[str, str], size: int, port: int) -> Callable[[int], dict[str, str]]:
    return lambda r: {**base, "RANK": str(r), "WORLD_SIZE": str(size), "LOCAL_RANK": str(r),
                      "LOCAL_WORLD_SIZE": str(size), "MASTER_ADDR": "127.0.0.1",
                      "MASTER_PORT": str(port)}


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("shm_clean")
def test_torchrun_variables_rank0_serves_the_store(base_env: dict[str, str]) -> None:
    make = _torchrun_env(base_env, 3, _free_port())
    _check(_spawn([make(r) for r in range(3)]), 3)


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("shm_clean")
def test_torchrun_variables_over_tcp(base_env: dict[str, str]) -> None:
    make = _torchrun_env({**base_env, "RINGWORLD_TRANSPORT": "tcp"}, 2, _free_port())
    _check(_spawn([make(r) for r in range(2)]), 2)


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("shm_clean")
def test_slurm_variables(base_env: dict[str, str]) -> None:
    job = 7000 + os.getpid() % 1000
    envs = [{**base_env, "SLURM_PROCID": str(r), "SLURM_NTASKS": "3", "SLURM_LOCALID": str(r),
             "SLURM_STEP_NUM_NODES": "1", "SLURM_NODELIST": "localhost", "SLURM_JOB_ID": str(job),
             "SLURM_STEP_ID": "0"} for r in range(3)]
    _check(_spawn(envs), 3)


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("shm_clean")
def test_mpich_variables_on_one_host(base_env: dict[str, str]) -> None:
    # the spawned ranks share this process as parent, as hydra_pmi_proxy's children do
    envs = [{**base_env, "PMI_RANK": str(r), "PMI_SIZE": "2", "MPI_LOCALRANKID": str(r),
             "MPI_LOCALNRANKS": "2", "PMI_HOSTNAME": socket.gethostname()} for r in range(2)]
    _check(_spawn(envs), 2)


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("shm_clean")
def test_openmpi_variables_with_master_address(base_env: dict[str, str]) -> None:
    port = str(_free_port())
    envs = [{**base_env, "OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_SIZE": "2",
             "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port} for r in range(2)]
    _check(_spawn(envs), 2)


@pytest.mark.timeout(120)
def test_port_taken_is_a_clear_bootstrap_error(base_env: dict[str, str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        make = _torchrun_env(base_env, 2, busy.getsockname()[1])
        res = subprocess.run([sys.executable, str(PROG)], env=make(0), capture_output=True,
                             text=True, timeout=JOB_TIMEOUT, check=False)
    assert res.returncode != 0
    assert "BootstrapError" in res.stderr and "MASTER_PORT" in res.stderr, res.stderr


@pytest.mark.timeout(120)
def test_missing_rendezvous_names_the_variable(base_env: dict[str, str]) -> None:
    env = {**base_env, "RANK": "0", "WORLD_SIZE": "2"}
    res = subprocess.run([sys.executable, str(PROG)], env=env, capture_output=True, text=True,
                         timeout=JOB_TIMEOUT, check=False)
    assert res.returncode != 0
    assert "ConfigError" in res.stderr and "MASTER_ADDR and MASTER_PORT" in res.stderr


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("shm_clean")
def test_agent_store_entries_of_an_earlier_attempt_are_passed_over(
        base_env: dict[str, str]) -> None:
    """torchrun's agent store outlives its workers, so rank 1 may first find an entry an
    earlier attempt's rank 0 left: a port nobody serves now, then (the port reused) another
    store that knows the secret, whose job id does not carry the entry's nonce. It passes both
    over and meets this attempt's rank 0."""
    dist = pytest.importorskip("torch.distributed", reason="the agent's store is torch's")
    from ringworld import other_launchers
    from ringworld.store.tcp import TCPStore
    from ringworld.store.tcp_server import TCPStoreServer

    agent = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    make = _torchrun_env({**base_env, "TORCHELASTIC_USE_AGENT_STORE": "True",
                          "TORCHELASTIC_RUN_ID": "again"}, 2, agent.port)
    launch = other_launchers.detect(make(1))
    assert launch is not None
    key = f"ringworld/store/{launch.job_hint}"
    agent.set(key, f"{_free_port()} 0badc0de")  # the earlier attempt's rank 0: gone
    secret = other_launchers.user_secret(other_launchers.default_secret_file(base_env))
    other = TCPStoreServer(secret)
    host, port = other.start()
    procs: list[subprocess.Popen[str]] = []
    try:
        with TCPStore(host, port, secret, timeout=10) as client:
            client.set("rw/boot/job", f"{launch.job_hint}.5eed5eed".encode())  # (not its nonce)
        for r in (1, 0):  # (rank 0's entry, when it comes, is left alone)
            procs.append(subprocess.Popen([sys.executable, str(PROG)], env=make(r), text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE))
            if r == 1:
                time.sleep(1.5)
                agent.set(key, f"{port} 0badc0de")  # (a store that answers: another job's)
                time.sleep(1.5)
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=JOB_TIMEOUT)
            assert p.returncode == 0, f"rank exited {p.returncode}:\n{out}\n{err}"
            outs.append(out)
        _check(outs, 2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        other.close()


def _torchrun_cmd() -> list[str] | None:
    try:
        import torch.distributed.run  # noqa: F401
    except ImportError:
        return None
    return [sys.executable, "-m", "torch.distributed.run"]


@pytest.mark.timeout(400)
@pytest.mark.usefixtures("shm_clean")
def test_real_torchrun(base_env: dict[str, str]) -> None:
    """Real torchrun, with the ports beside MASTER_PORT taken (by outgoing connections, in the
    kernel's ephemeral range, they often are): Ringworld's rank 0 serves on a port of its own
    and says which through the agent's store (it took MASTER_PORT + 1 and failed there)."""
    cmd = _torchrun_cmd()
    if cmd is None:
        pytest.skip("torch is not installed here (pip install torch): no torchrun to run")
    with contextlib.ExitStack() as stack:
        port = 0
        for _ in range(50):
            port = _free_port()
            try:
                for near in (port - 1, port + 1):
                    s = stack.enter_context(socket.socket())
                    s.bind(("127.0.0.1", near))
                    s.listen()
                break
            except OSError:
                stack.close()
        res = subprocess.run([*cmd, "--nproc-per-node", "2", "--master-port", str(port),
                              str(PROG)], env=base_env, capture_output=True, text=True,
                             timeout=JOB_TIMEOUT * 2, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    _check([res.stdout], 2)


@pytest.mark.timeout(400)
@pytest.mark.usefixtures("shm_clean")
def test_real_mpich_mpiexec(base_env: dict[str, str]) -> None:
    if not (MPI_PYTHON and os.access(MPIEXEC, os.X_OK)):
        pytest.skip("RINGWORLD_MPI_PYTHON is not set to a python with mpiexec beside it "
                    "(scripts/install-peers.sh /tmp/peers)")
    res = subprocess.run([MPIEXEC, "-n", "3", MPI_PYTHON, str(PROG)], env=base_env,
                         capture_output=True, text=True, timeout=JOB_TIMEOUT * 2, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    _check([res.stdout], 3)
