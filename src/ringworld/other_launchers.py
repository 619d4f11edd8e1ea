"""Ranks started by launchers other than ``ringworld run``: torchrun, Slurm's srun, mpiexec.

:func:`detect` reads the variables those launchers set (never ``RINGWORLD_*``: that is
:mod:`ringworld.config`'s job, and ``ringworld run``'s contract wins over all of these) and says
who this rank is and where the job can meet. The first launcher whose variables are present wins,
in this order (a torchrun inside an srun step is torchrun; an mpiexec inside an allocation is MPI):

=========  ===========================================  ==========================================
launcher   rank, size, local rank                       rendezvous address when none is given
=========  ===========================================  ==========================================
torchrun   RANK, WORLD_SIZE, LOCAL_RANK                 MASTER_ADDR:MASTER_PORT (required)
openmpi    OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK   127.0.0.1:port(parent pid) if all local
mpich      PMI_RANK, PMI_SIZE, MPI_LOCALRANKID          127.0.0.1:port(parent pid) if all local
slurm      SLURM_PROCID, SLURM_STEP_NUM_TASKS or        first host of SLURM_STEP_NODELIST (else
           SLURM_NTASKS, SLURM_LOCALID (needs            SLURM_NODELIST; 127.0.0.1 for one node):
           SLURM_STEP_ID: a batch script is not a rank)  port 10000 + (job * 100 + step) % 20000
=========  ===========================================  ==========================================

``MASTER_ADDR``/``MASTER_PORT``, when both are set, are the rendezvous for every launcher
(``RINGWORLD_STORE=host:port`` overrides them; see :mod:`ringworld.config`). Rank 0 serves the
store there, as torch does. Under real ``torchrun`` (``TORCHELASTIC_USE_AGENT_STORE=True``) the
agent's own torch store already holds ``MASTER_PORT``: Ringworld's rank 0 serves on a port the
kernel picks and publishes it in the agent's store, where the other ranks read it
(:class:`AgentStore`). The mpiexec rule needs the ranks of a host to be children of one
launcher agent (hydra_pmi_proxy, prted); anything else sets ``MASTER_ADDR``/``MASTER_PORT``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
from collections.abc import Mapping
from typing import NamedTuple

from ringworld.errors import BootstrapError, ConfigError

#: ports derived from a Slurm job/step or a parent pid fall in [PORT_BASE, PORT_BASE + PORT_SPAN),
#: below Linux's default ephemeral range (32768-60999), so they rarely meet a client's port.
PORT_BASE = 10000
PORT_SPAN = 20000
LOOPBACK = "127.0.0.1"
SECRET_BYTES = 32


class Launch(NamedTuple):
    """Who this rank is, according to a foreign launcher, and where its job can meet."""

    launcher: str           # "torchrun", "openmpi", "mpich" or "slurm"
    rank: int
    size: int
    local_rank: int
    host: str | None        # rendezvous host (rank 0 serves the store there), None if unknown
    port: int | None
    job_hint: str           # shared by every rank of the job; becomes the shm job id's prefix
    rank_var: str           # the variable the rank came from (for messages)
    agent_store: str | None = None  # torchrun's agent store "host:port" (port is then 0)


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None


def _port(text: str, name: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise ConfigError(f"{name}={text!r} is not a port number") from None
    if not 0 < port < 65536:
        raise ConfigError(f"{name}={text!r} must be a port in 1..65535")
    return port


def expand_nodelist(text: str) -> list[str]:
    """Slurm's compressed host list as host names: ``n[01-03,7],gpu1`` -> n01 n02 n03 n7 gpu1.

    Raises:
        ConfigError: unbalanced brackets or a malformed range.
    Cost: O(hosts).
    """
    hosts: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]*)\])?([^,\[]*)", text):
        prefix, ranges, suffix = m.group(1), m.group(2), m.group(3)
        if ranges is None:
            hosts.append(prefix + suffix)
            continue
        for part in ranges.split(","):
            lo, sep, hi = part.partition("-")
            if not lo.isdigit() or (sep and not hi.isdigit()):
                raise ConfigError(f"node list {text!r}: bad range {part!r}")
            for i in range(int(lo), int(hi if sep else lo) + 1):
                hosts.append(f"{prefix}{i:0{len(lo)}d}{suffix}")
    if text.count("[") != text.count("]"):
        raise ConfigError(f"node list {text!r} has unbalanced brackets")
    return hosts


def slurm_port(job_id: int, step_id: int) -> int:
    """The store port of a Slurm step: ``PORT_BASE + (job * 100 + step) % PORT_SPAN``."""
    return PORT_BASE + (job_id * 100 + step_id) % PORT_SPAN


def parent_port(ppid: int) -> int:
    """The store port of a single-host mpiexec job: ``PORT_BASE + parent pid % PORT_SPAN``."""
    return PORT_BASE + ppid % PORT_SPAN


def _ids(env: Mapping[str, str]) -> tuple[str, int, int, int, int | None] | None:
    """(launcher, rank, size, local_rank, local_size) of the first launcher present, or None."""
    table = (
        ("torchrun", "RANK", ("WORLD_SIZE",), "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
        ("openmpi", "OMPI_COMM_WORLD_RANK", ("OMPI_COMM_WORLD_SIZE",),
         "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
        ("mpich", "PMI_RANK", ("PMI_SIZE",), "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
        ("slurm", "SLURM_PROCID", ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"), "SLURM_LOCALID",
         ""),
    )
    for name, rank_var, size_vars, local_var, local_size_var in table:
        if not env.get(rank_var, "").strip():
            continue
        if name == "slurm" and not env.get("SLURM_STEP_ID", "").strip():
            continue  # a batch script (step "batch") is not one of the step's tasks
        size_var = next((v for v in size_vars if env.get(v, "").strip()), None)
        if size_var is None:
            raise ConfigError(f"{rank_var} is set ({name}) but {size_vars[0]} is not")
        rank, size = _int(env, rank_var), _int(env, size_var)
        assert rank is not None and size is not None
        if size < 1 or not 0 <= rank < size:
            raise ConfigError(f"{rank_var}={rank} is outside 0..{size - 1} ({size_var}={size})")
        local = _int(env, local_var, 0)
        local_size = _int(env, local_size_var) if local_size_var else None
        if name == "slurm" and _int(env, "SLURM_STEP_NUM_NODES", _int(env, "SLURM_NNODES")) == 1:
            local_size = size
        assert local is not None
        return name, rank, size, local, local_size
    return None


def detect(env: Mapping[str, str], ppid: int | None = None) -> Launch | None:
    """This rank as a foreign launcher describes it, or None when no launcher is present.

    ``ppid`` (default ``os.getppid()``) names the per-host launcher agent for the mpiexec rule.
    ``host``/``port`` are None where no rendezvous address can be derived.

    Raises:
        ConfigError: a launcher's variables are malformed or inconsistent.
    Cost: reads the environment only.
    """
    ids = _ids(env)
    if ids is None:
        return None
    name, rank, size, local, local_size = ids
    host: str | None = None
    port: int | None = None
    hint = name
    agent: str | None = None
    if env.get("MASTER_ADDR", "").strip() and env.get("MASTER_PORT", "").strip():
        host = env["MASTER_ADDR"].strip()
        port = _port(env["MASTER_PORT"].strip(), "MASTER_PORT")
        hint = f"{name}{host}{port}{env.get('TORCHELASTIC_RUN_ID', '')}"
        if name == "torchrun" and env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            # the agent's torch store has MASTER_PORT: rank 0 takes a free port and says which
            agent = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            port = 0
    elif name == "slurm":
        job = _int(env, "SLURM_JOB_ID", 0) or 0
        step_raw = env.get("SLURM_STEP_ID", "0").strip()
        step = int(step_raw) if step_raw.isdigit() else 0
        nodes = expand_nodelist(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_NODELIST", ""))
        if local_size == size:
            host = LOOPBACK
        elif nodes:
            host = nodes[0]
        port = slurm_port(job, step) if host else None
        hint = f"slurm{job}.{step}"
    elif name in ("openmpi", "mpich") and local_size == size:
        parent = os.getppid() if ppid is None else ppid
        host, port = LOOPBACK, parent_port(parent)
        hint = f"{name}{parent}"
    rank_var = {"torchrun": "RANK", "openmpi": "OMPI_COMM_WORLD_RANK", "mpich": "PMI_RANK",
                "slurm": "SLURM_PROCID"}[name]
    return Launch(name, rank, size, local, host, port, job_id_from(hint), rank_var, agent)


def job_id_from(text: str) -> str:
    """A short shm-safe job id (letters and digits) derived from ``text``."""
    return "x" + hashlib.sha256(text.encode()).hexdigest()[:10]


def missing_rendezvous(launch: Launch) -> ConfigError:
    """The error for a launcher-started rank with no rendezvous address: what to set."""
    why = {
        "torchrun": "MASTER_ADDR and MASTER_PORT are not both set",
        "slurm": "neither SLURM_STEP_NODELIST nor SLURM_NODELIST names a host",
        "openmpi": "the ranks span several hosts",
        "mpich": "the ranks span several hosts (or MPI_LOCALNRANKS is not set)",
    }[launch.launcher]
    return ConfigError(
        f"{launch.launcher} started this rank ({launch.rank_var}={launch.rank}, world size "
        f"{launch.size}) but there is no rendezvous address: {why}. Set MASTER_ADDR and "
        "MASTER_PORT (a host every rank can reach, where rank 0 serves the job store), or "
        "RINGWORLD_STORE=host:port, in every rank's environment")


class AgentStore:
    """Under real torchrun: the agent's torch store (``agent``, "host:port"), where Ringworld's
    rank 0 publishes the port of its job store with a nonce, and the other ranks read them.

    The agent's store lives as long as the agent, across restarts of its workers, so an entry
    may be an earlier attempt's: the readers check the nonce against the store they reach (see
    ``runtime``). It carries no secret: Ringworld's store still authenticates every client.
    Needs torch (torchrun's own Python has it). Cost: one TCP connection, and torch's import
    if not yet imported.

    Raises:
        BootstrapError: torch is missing, or the agent's store cannot be reached.
    """

    def __init__(self, agent: str, timeout: float) -> None:
        from datetime import timedelta

        host, _, port = agent.rpartition(":")
        self.agent = agent
        try:
            from torch.distributed import TCPStore
        except ImportError as exc:
            raise BootstrapError(
                f"torchrun started this rank with its agent's store at {agent}, where "
                f"Ringworld's rank 0 says which port it serves the job store on, but torch does "
                f"not import here ({exc}); set RINGWORLD_STORE=host:port (a free port on rank "
                "0's host) instead") from None
        try:
            self._store = TCPStore(host.strip("[]"), int(port), is_master=False,
                                   timeout=timedelta(seconds=timeout), wait_for_workers=False)
        except Exception as exc:  # torch's DistNetworkError and friends (RuntimeErrors)
            raise BootstrapError(f"cannot reach torchrun's agent store at {agent}: "
                                 f"{_first_line(exc)}") from None

    def publish(self, key: str, port: int, nonce: str) -> None:
        """Publish ``port`` and ``nonce`` at ``key`` (rank 0). Raises: BootstrapError."""
        try:
            self._store.set(key, f"{port} {nonce}")
        except Exception as exc:
            raise BootstrapError(f"cannot publish the port of Ringworld's job store in "
                                 f"torchrun's agent store at {self.agent}: "
                                 f"{_first_line(exc)}") from None

    def read(self, key: str, timeout: float) -> tuple[int, str]:
        """(port, nonce) at ``key``, waiting at most ``timeout`` s for rank 0 to publish them.

        Raises:
            BootstrapError: nothing there in time, or not a port and a nonce.
        """
        from datetime import timedelta

        try:
            self._store.set_timeout(timedelta(seconds=max(timeout, 0.001)))
            raw = bytes(self._store.get(key))
        except Exception as exc:
            why = _first_line(exc)
            if "imeout" in why:
                why = f"rank 0 did not publish it within {timeout:g} s (did it reach init?)"
            raise BootstrapError(f"cannot read the port of Ringworld's job store in torchrun's "
                                 f"agent store at {self.agent}: {why}") from None
        port, _, nonce = raw.decode("ascii", "replace").partition(" ")
        if not port.isdigit() or not 0 < int(port) < 65536 or not nonce:
            raise BootstrapError(f"torchrun's agent store at {self.agent} holds {raw[:40]!r} at "
                                 f"{key}, not the port of Ringworld's job store and a nonce")
        return int(port), nonce


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# ------------------------------------------------------------------ the job secret


def default_secret_file(env: Mapping[str, str]) -> str:
    """``$XDG_CONFIG_HOME/ringworld/secret`` (default ``~/.config/ringworld/secret``)."""
    base = env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "ringworld", "secret")


def read_secret_file(path: str, name: str = "RINGWORLD_SECRET_FILE") -> bytes:
    """The hex secret in ``path`` (first line), which only its owner may read or write.

    Raises:
        ConfigError: the file cannot be read, other users can read or write it, it belongs to
            someone else, or it is not hex of at least 16 bytes.
    Cost: one small file read.
    """
    try:
        with open(path, encoding="ascii") as f:
            st = os.fstat(f.fileno())
            text = f.readline().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{name}={path!r}: cannot read the job secret: {exc}") from exc
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"{name}={path!r} is accessible by other users (mode "
                          f"{stat.S_IMODE(st.st_mode):o}); run chmod 600 {path}")
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise ConfigError(f"{name}={path!r} belongs to another user (uid {st.st_uid})")
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        raise ConfigError(f"{name}={path!r} does not hold a hex secret") from None
    if len(secret) < 16:
        raise ConfigError(f"{name}={path!r}: the secret has {len(secret)} bytes, at least 16 "
                          "are needed")
    return secret


def user_secret(path: str) -> bytes:
    """The per-user secret in ``path``, created (mode 600, random 32 bytes) if missing.

    Concurrent first calls (every rank of the first job) agree: the file appears atomically
    (written aside, then hard-linked into place; the loser reads the winner's).

    Raises:
        ConfigError: the file or its directory cannot be created or read, or is unsafe.
    Cost: one small file read; the first time also a write.
    """
    if not os.path.exists(path):
        folder = os.path.dirname(path)
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            tmp = f"{path}.{os.getpid()}.{os.urandom(4).hex()}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, (os.urandom(SECRET_BYTES).hex() + "\n").encode())
            finally:
                os.close(fd)
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass  # another rank won the race
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        except OSError as exc:
            raise ConfigError(f"cannot create the per-user job secret {path!r}: {exc}; set "
                              "RINGWORLD_SECRET_FILE or RINGWORLD_SECRET") from exc
    return read_secret_file(path, "the per-user secret")
