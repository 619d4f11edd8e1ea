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
(:func:`agent_store_port`). The mpiexec rule needs the ranks of a host to be children of one
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
        hint = (f"{name}{host}{port}{env.get('TORCHELASTIC_RUN_ID', '')}."
                f"{env.get('TORCHELASTIC_RESTART_COUNT', '')}")
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


def agent_store_port(agent: str, key: str, port: int | None, timeout: float) -> int:
    """Under real torchrun: publish ``port`` (rank 0, where it serves Ringworld's job store)
    at ``key`` in the agent's torch store at ``agent`` ("host:port"), or, with ``port`` None,
    wait at most ``timeout`` s for rank 0 to publish it; return the port.

    The agent's store only carries the port: Ringworld's store still authenticates every
    client with the job secret. Needs torch (torchrun's own Python has it).

    Raises:
        BootstrapError: torch is missing, the agent's store cannot be reached, or rank 0 did
            not publish the port in time.
    Cost: one TCP connection to the agent's store (and torch's import if not yet imported).
    """
    from datetime import timedelta

    host, _, agent_port = agent.rpartition(":")
    try:
        from torch.distributed import TCPStore
    except ImportError as exc:
        raise BootstrapError(
            f"torchrun started this rank with its agent's store at {agent}, where Ringworld's "
            f"rank 0 says which port it serves the job store on, but torch does not import "
            f"here ({exc}); set RINGWORLD_STORE=host:port (a free port on rank 0's host) "
            "instead") from None
    what = "publish" if port is not None else "read"
    try:
        store = TCPStore(host.strip("[]"), int(agent_port), is_master=False,
                         timeout=timedelta(seconds=timeout), wait_for_workers=False)
        if port is not None:
            store.set(key, str(port))
            return port
        raw = store.get(key)
    except Exception as exc:  # torch's DistStoreError and friends (RuntimeError subclasses)
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if port is None and "imeout" in why:
            why = f"rank 0 did not publish it within {timeout:g} s (did it reach init?)"
        raise BootstrapError(
            f"cannot {what} the port of Ringworld's job store in torchrun's agent store at "
            f"{agent}: {why}") from None
    text = bytes(raw).decode("ascii", "replace")
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise BootstrapError(f"torchrun's agent store at {agent} holds {text[:40]!r} at {key}, "
                             "not the port of Ringworld's job store")
    return int(text)


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
