"""Launcher detection without processes: the variables torchrun, srun and mpiexec set."""

from __future__ import annotations

import os
import socket
import stat
import threading
from pathlib import Path

import pytest

from ringworld import config
from ringworld import other_launchers as launchers
from ringworld.errors import BootstrapError, ConfigError

SECRET = "ab" * 32


def torchrun(rank: int, size: int = 4, **extra: str) -> dict[str, str]:
    env = {"RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(rank % 2),
           "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29400"}
    env.update(extra)
    return env


def slurm(rank: int, size: int = 6, **extra: str) -> dict[str, str]:
    env = {"SLURM_PROCID": str(rank), "SLURM_NTASKS": str(size), "SLURM_LOCALID": str(rank % 3),
           "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_NODELIST": "gpu[01-09]",
           "SLURM_JOB_ID": "123456", "SLURM_STEP_ID": "2", "SLURM_STEP_NUM_NODES": "2"}
    env.update(extra)
    return env


def test_torchrun_variables() -> None:
    got = launchers.detect(torchrun(3))
    assert got is not None
    assert (got.launcher, got.rank, got.size, got.local_rank) == ("torchrun", 3, 4, 1)
    assert (got.host, got.port) == ("127.0.0.1", 29400)
    assert got.agent_store is None
    # real torchrun: its agent's torch store holds MASTER_PORT; rank 0 takes a free port (0)
    # and publishes it there
    agent = launchers.detect(torchrun(0, TORCHELASTIC_USE_AGENT_STORE="True"))
    assert agent is not None and (agent.port, agent.agent_store) == (0, "127.0.0.1:29400")
    cfg = config.from_env(torchrun(0, TORCHELASTIC_USE_AGENT_STORE="True"))
    assert (cfg.store_addr, cfg.agent_store) == ("127.0.0.1:0", "127.0.0.1:29400")
    # RINGWORLD_STORE overrides the launcher's rendezvous, the agent's store included
    cfg = config.from_env(torchrun(0, TORCHELASTIC_USE_AGENT_STORE="True",
                                   RINGWORLD_STORE="127.0.0.1:5000"))
    assert (cfg.store_addr, cfg.agent_store) == ("127.0.0.1:5000", None)


def test_agent_store_carries_rank0s_port_and_says_what_went_wrong() -> None:
    dist = pytest.importorskip("torch.distributed", reason="the agent's store is torch's")
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    agent = launchers.AgentStore(f"127.0.0.1:{master.port}", 5.0)
    agent.publish("rw/a", 4321, "c0ffee")  # rank 0
    assert agent.read("rw/a", 5.0) == (4321, "c0ffee")  # the others
    with pytest.raises(BootstrapError, match=r"rank 0 did not publish it within 0\.5 s"):
        agent.read("rw/never", 0.5)
    for bad in ("http", "4321", "70000 ab"):
        master.set("rw/bad", bad)
        with pytest.raises(BootstrapError, match=f"holds b'{bad}' at rw/bad, not the port"):
            agent.read("rw/bad", 5.0)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        gone = f"127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(BootstrapError, match=f"cannot reach torchrun's agent store at {gone}"):
        launchers.AgentStore(gone, 0.5)


def test_torchrun_without_master_is_an_error_naming_the_variables() -> None:
    env = torchrun(1)
    del env["MASTER_PORT"]
    with pytest.raises(ConfigError, match="MASTER_ADDR and MASTER_PORT"):
        config.from_env(env)


def test_slurm_step_rendezvous_is_the_first_node_and_a_port_from_job_and_step() -> None:
    got = launchers.detect(slurm(4))
    assert got is not None
    assert (got.launcher, got.rank, got.size, got.local_rank) == ("slurm", 4, 6, 1)
    assert got.host == "gpu07"
    assert got.port == 10000 + (123456 * 100 + 2) % 20000 == launchers.slurm_port(123456, 2)
    one_node = launchers.detect(slurm(1, SLURM_STEP_NUM_NODES="1"))
    assert one_node is not None and one_node.host == "127.0.0.1"
    other = launchers.detect(slurm(1, SLURM_STEP_ID="3"))
    assert other is not None and other.port != got.port and other.job_hint != got.job_hint
    # the step's own task count wins over the allocation's
    assert launchers.detect(slurm(1, SLURM_STEP_NUM_TASKS="2")).size == 2  # type: ignore[union-attr]


def test_slurm_batch_script_is_not_a_rank() -> None:
    env = slurm(0)
    del env["SLURM_STEP_ID"]
    assert launchers.detect(env) is None
    assert config.from_env({**env}).size == 1


def test_master_variables_override_the_slurm_rule() -> None:
    got = launchers.detect(slurm(2, MASTER_ADDR="10.1.2.3", MASTER_PORT="4444"))
    assert got is not None and (got.host, got.port) == ("10.1.2.3", 4444)


@pytest.mark.parametrize(("text", "hosts"), [
    ("n1", ["n1"]),
    ("n[01-03,7],gpu1", ["n01", "n02", "n03", "n7", "gpu1"]),
    ("a[8-10]-ib", ["a8-ib", "a9-ib", "a10-ib"]),
    ("x[009-011]", ["x009", "x010", "x011"]),
])
def test_nodelist_expansion(text: str, hosts: list[str]) -> None:
    assert launchers.expand_nodelist(text) == hosts


def test_bad_nodelist() -> None:
    with pytest.raises(ConfigError, match="bad range"):
        launchers.expand_nodelist("n[a-b]")


def test_mpich_and_openmpi_on_one_host_meet_on_loopback_by_parent_pid() -> None:
    mpich = {"PMI_RANK": "1", "PMI_SIZE": "3", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "3",
             "PMI_HOSTNAME": "vm"}
    got = launchers.detect(mpich, ppid=4321)
    assert got is not None
    assert (got.launcher, got.rank, got.size, got.host) == ("mpich", 1, 3, "127.0.0.1")
    assert got.port == launchers.parent_port(4321)
    ompi = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
            "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    got = launchers.detect(ompi, ppid=4321)
    assert got is not None and got.launcher == "openmpi" and got.host == "127.0.0.1"


def test_mpiexec_across_hosts_needs_an_address() -> None:
    env = {"PMI_RANK": "0", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}
    with pytest.raises(ConfigError, match=r"PMI_RANK=0.*Set MASTER_ADDR and MASTER_PORT"):
        config.from_env(env)


def test_precedence() -> None:
    both = {**slurm(5), **torchrun(1)}
    assert launchers.detect(both).launcher == "torchrun"  # type: ignore[union-attr]
    mpi_in_slurm = {**slurm(0), "PMI_RANK": "2", "PMI_SIZE": "3", "MPI_LOCALNRANKS": "3"}
    assert launchers.detect(mpi_in_slurm).launcher == "mpich"  # type: ignore[union-attr]
    # ringworld run's contract wins over the torchrun variables it also exports
    ours = {**torchrun(1), "RINGWORLD_RANK": "2", "RINGWORLD_SIZE": "4",
            "RINGWORLD_STORE": "127.0.0.1:5000", "RINGWORLD_SECRET": SECRET,
            "RINGWORLD_JOB_ID": "abc"}
    cfg = config.from_env(ours)
    assert (cfg.rank, cfg.launcher, cfg.serve_store, cfg.job_id) == (2, "", False, "abc")


def test_inconsistent_variables() -> None:
    with pytest.raises(ConfigError, match="outside"):
        launchers.detect({"RANK": "4", "WORLD_SIZE": "4"})
    with pytest.raises(ConfigError, match="WORLD_SIZE"):
        launchers.detect({"RANK": "0"})
    with pytest.raises(ConfigError, match="MASTER_PORT"):
        launchers.detect(torchrun(0, MASTER_PORT="http"))


def test_config_of_a_torchrun_rank(tmp_path: Path) -> None:
    cfg = config.from_env(torchrun(2, XDG_CONFIG_HOME=str(tmp_path)))
    assert (cfg.rank, cfg.size, cfg.local_rank, cfg.launcher) == (2, 4, 0, "torchrun")
    assert cfg.store_addr == "127.0.0.1:29400" and cfg.serve_store
    same = config.from_env(torchrun(0, XDG_CONFIG_HOME=str(tmp_path)))
    assert same.job_id == cfg.job_id and same.secret == cfg.secret  # agreed without talking
    secret_file = tmp_path / "ringworld" / "secret"
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    explicit = config.from_env(torchrun(0, RINGWORLD_SECRET=SECRET,
                                        RINGWORLD_STORE="127.0.0.1:7777"))
    assert explicit.secret == bytes.fromhex(SECRET) and explicit.store_addr == "127.0.0.1:7777"
    single = config.from_env(torchrun(0, 1))
    assert single.size == 1 and not single.serve_store and single.store_addr is None


def test_a_reachable_rendezvous_needs_an_explicit_secret(tmp_path: Path) -> None:
    env = torchrun(0, MASTER_ADDR="10.0.0.5", XDG_CONFIG_HOME=str(tmp_path))
    with pytest.raises(ConfigError, match="RINGWORLD_SECRET_FILE"):
        config.from_env(env)
    path = tmp_path / "job.secret"
    path.write_text(SECRET + "\n")
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        config.from_env({**env, "RINGWORLD_SECRET_FILE": str(path)})
    path.chmod(0o600)
    cfg = config.from_env({**env, "RINGWORLD_SECRET_FILE": str(path)})
    assert cfg.secret == bytes.fromhex(SECRET) and cfg.store_addr == "10.0.0.5:29400"
    path.write_text("abcd\n")
    with pytest.raises(ConfigError, match="at least 16"):
        config.from_env({**env, "RINGWORLD_SECRET_FILE": str(path)})


def test_concurrent_first_use_of_the_user_secret_agrees(tmp_path: Path) -> None:
    path = str(tmp_path / "cfg" / "ringworld" / "secret")
    got: list[bytes] = []
    threads = [threading.Thread(target=lambda: got.append(launchers.user_secret(path)))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(got) == 8 and len(set(got)) == 1 and len(got[0]) == 32
    assert os.listdir(os.path.dirname(path)) == ["secret"]  # no temporary files left


def test_backend_names() -> None:
    assert config.backend_from_env(None, {}) == "native"
    assert config.backend_from_env(None, {"RINGWORLD_BACKEND": "MPI"}) == "mpi"
    assert config.backend_from_env("native", {"RINGWORLD_BACKEND": "mpi"}) == "native"
    with pytest.raises(ConfigError):
        config.backend_from_env(None, {"RINGWORLD_BACKEND": "gloo"})
    with pytest.raises(ValueError, match="backend"):
        config.backend_from_env("gloo", {})
