"""Runtime configuration: the only module that reads ``RINGWORLD_*`` environment variables.

Variables (all optional; the launcher sets the first five for every rank):

``RINGWORLD_RANK`` / ``RINGWORLD_SIZE``  this rank and the world size.
``RINGWORLD_STORE``       ``host:port`` of the rendezvous store.
``RINGWORLD_JOB_ID``      a job-unique name used for shared-memory segments.
``RINGWORLD_SECRET_FD``   a file descriptor to read the job secret from (hex, one line);
                          ``RINGWORLD_SECRET`` (hex) is accepted where an fd cannot be passed.
``RINGWORLD_TRANSPORT``   ``auto`` (default), ``shm`` or ``tcp``.
``RINGWORLD_TIMEOUT``     default timeout in seconds for blocking calls (default: none).
``RINGWORLD_BIND``        address TCP listeners bind to (default ``127.0.0.1``).
``RINGWORLD_TCP_CHECKSUM`` ``1``: a CRC-32 on every TCP frame catches corruption in transit.
``RINGWORLD_SHM_RING_BYTES``  bytes per shared-memory ring (default: sized from the world).
``RINGWORLD_EAGER_BYTES`` largest message sent without a rendezvous handshake.
``RINGWORLD_SHM_SINGLE_COPY`` ``0``: large shared-memory messages stream through the rings (two
                          copies) instead of being read straight from the sender (one copy).
``RINGWORLD_ALGORITHMS``  forced collective algorithms, e.g. ``allreduce:ring,bcast:binomial``.
``RINGWORLD_TUNING_FILE`` a JSON file of cost-model constants from ``ringworld tune`` or
                          ``ringworld calibrate --fit --save``.
``RINGWORLD_TUNER``       how algorithms are costed: ``simulate`` (default: their schedules run
                          through the topology simulator, up to 8 ranks) or ``formula``
                          (closed forms only).
``RINGWORLD_BACKEND``     ``native`` (default) or ``mpi`` (run over mpi4py, see
                          :mod:`ringworld.backends.mpi`).
``RINGWORLD_SECRET_FILE`` a file holding the hex job secret (mode 600), for jobs started by
                          other launchers.

Without ``RINGWORLD_RANK``/``RINGWORLD_SIZE`` (the contract of ``ringworld run``, which wins),
a rank started by torchrun, srun or mpiexec is recognised by
:func:`ringworld.other_launchers.detect`; rank 0 then serves the job store at
``RINGWORLD_STORE`` if set, else at the launcher's rendezvous address (see
:mod:`ringworld.other_launchers`). The job secret is, in order: ``RINGWORLD_SECRET_FD``,
``RINGWORLD_SECRET``, ``RINGWORLD_SECRET_FILE``; with none of them and a loopback rendezvous
(one host), the per-user secret ``~/.config/ringworld/secret`` (created on
first use); a rendezvous other hosts can reach needs one of the three (same on every host).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NamedTuple

from ringworld import other_launchers as launchers
from ringworld.auth import is_loopback
from ringworld.errors import ConfigError

TRANSPORTS = ("auto", "shm", "tcp")
DEFAULT_EAGER_BYTES = 131072  # RINGWORLD_EAGER_BYTES when unset
BACKENDS = ("native", "mpi")


class Config(NamedTuple):
    """Frozen runtime settings for one rank (a NamedTuple: importing dataclasses costs every
    process ~20 ms of start-up)."""

    rank: int = 0
    size: int = 1
    store_addr: str | None = None
    job_id: str = ""
    secret: bytes = b""
    transport: str = "auto"
    timeout: float | None = None
    bind: str = "127.0.0.1"
    shm_ring_bytes: int | None = None
    eager_bytes: int = 131072
    shm_single_copy: bool = True
    algorithms: tuple[tuple[str, str], ...] = ()
    tuning_file: str | None = None
    tuner: str = "simulate"
    trace: str | None = None
    liveness_timeout: float = 20.0
    tcp_checksum: bool = False
    launcher: str = ""  # "" (ringworld run, or none), "torchrun", "slurm", "mpich", "openmpi"
    local_rank: int = 0
    serve_store: bool = False  # rank 0 serves the job store at store_addr (no ringworld run)
    agent_store: str | None = None  # torchrun's agent store, where rank 0 publishes its port
    host: str | None = None  # RINGWORLD_HOST: the label of this rank's host (launcher-set)
    iface: str | None = None  # RINGWORLD_IFACE: the network interface TCP listens on

    @property
    def launched(self) -> bool:
        """Whether this process is part of a multi-rank job (a store to rendezvous with)."""
        return self.store_addr is not None


def _int(env: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None


def _flag(env: Mapping[str, str], name: str) -> bool:
    raw = (env.get(name) or "0").strip().lower()
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}={raw!r} must be 1 or 0")


def _read_secret(env: Mapping[str, str]) -> bytes:
    fd = _int(env, "RINGWORLD_SECRET_FD", None)
    text: str | None = None
    if fd is not None:
        try:
            with os.fdopen(fd, "r", closefd=True) as f:
                text = f.readline().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read the job secret from RINGWORLD_SECRET_FD={fd}") from exc
    elif env.get("RINGWORLD_SECRET"):
        text = env["RINGWORLD_SECRET"].strip()
    if text is None:
        return b""
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise ConfigError("the job secret is not valid hex") from None


def from_env(env: Mapping[str, str] | None = None, *, detect_launcher: bool = True) -> Config:
    """Build the configuration from the environment.

    Reads (and closes) ``RINGWORLD_SECRET_FD`` if set, so call it once per process.
    ``detect_launcher=False`` ignores torchrun/srun/mpiexec variables (the MPI backend takes
    rank and size from MPI itself). A detected launcher's job without a secret may create
    the per-user secret file.

    Raises:
        ConfigError: a variable is malformed or the set is inconsistent.
    """
    e = os.environ if env is None else env
    launch = None
    if detect_launcher and not (e.get("RINGWORLD_RANK") or e.get("RINGWORLD_SIZE")):
        launch = launchers.detect(e)
    rank, size = _rank_and_size(e, launch)
    transport = e.get("RINGWORLD_TRANSPORT", "auto") or "auto"
    if transport not in TRANSPORTS:
        raise ConfigError(f"RINGWORLD_TRANSPORT={transport!r} must be one of {TRANSPORTS}")
    timeout = _timeout(e)
    liveness = _liveness_timeout(e)
    store_addr, secret = _store_and_secret(e, launch, size)
    eager = _int(e, "RINGWORLD_EAGER_BYTES", DEFAULT_EAGER_BYTES)
    assert eager is not None
    algorithms = parse_algorithms(e.get("RINGWORLD_ALGORITHMS", ""))
    if eager < 0:
        raise ConfigError(f"RINGWORLD_EAGER_BYTES={eager} must be >= 0")
    tuner = e.get("RINGWORLD_TUNER", "").strip() or "simulate"
    if tuner not in ("simulate", "formula"):
        raise ConfigError(f"RINGWORLD_TUNER={tuner!r} must be 'simulate' or 'formula'")
    return Config(
        rank=rank,
        size=size,
        store_addr=store_addr,
        job_id=e.get("RINGWORLD_JOB_ID", "") or (
            f"solo{os.getpid()}" if launch is None else launch.job_hint),
        secret=secret,
        transport=transport,
        timeout=timeout,
        bind=e.get("RINGWORLD_BIND", "127.0.0.1") or "127.0.0.1",
        shm_ring_bytes=_int(e, "RINGWORLD_SHM_RING_BYTES", None),
        eager_bytes=eager,
        shm_single_copy=e.get("RINGWORLD_SHM_SINGLE_COPY", "1").strip() != "0",
        algorithms=algorithms,
        tuning_file=e.get("RINGWORLD_TUNING_FILE") or None,
        tuner=tuner,
        trace=e.get("RINGWORLD_TRACE") or None,
        liveness_timeout=liveness,
        tcp_checksum=_flag(e, "RINGWORLD_TCP_CHECKSUM"),
        launcher="" if launch is None else launch.launcher,
        local_rank=0 if launch is None else launch.local_rank,
        serve_store=launch is not None and launch.size > 1,
        agent_store=None if launch is None or e.get("RINGWORLD_STORE") else launch.agent_store,
        host=e.get("RINGWORLD_HOST") or None,
        iface=e.get("RINGWORLD_IFACE") or None,
    )


def _rank_and_size(e: Mapping[str, str], launch: launchers.Launch | None) -> tuple[int, int]:
    """This rank and the world size: from ``RINGWORLD_RANK``/``SIZE``, else the launcher's."""
    rank = _int(e, "RINGWORLD_RANK", 0) if launch is None else launch.rank
    size = _int(e, "RINGWORLD_SIZE", 1) if launch is None else launch.size
    assert rank is not None and size is not None
    if size < 1:
        raise ConfigError(f"RINGWORLD_SIZE={size} must be at least 1")
    if not 0 <= rank < size:
        raise ConfigError(f"RINGWORLD_RANK={rank} is outside 0..{size - 1}")
    return rank, size


def _timeout(e: Mapping[str, str]) -> float | None:
    """``RINGWORLD_TIMEOUT`` in seconds (None: unset)."""
    timeout_raw = e.get("RINGWORLD_TIMEOUT")
    timeout: float | None = None
    if timeout_raw:
        try:
            timeout = float(timeout_raw)
        except ValueError:
            raise ConfigError(f"RINGWORLD_TIMEOUT={timeout_raw!r} is not a number") from None
        if not timeout > 0:  # also NaN
            raise ConfigError(f"RINGWORLD_TIMEOUT={timeout_raw!r} must be positive")
    return timeout


def _liveness_timeout(e: Mapping[str, str]) -> float:
    """``RINGWORLD_LIVENESS_TIMEOUT`` in seconds (default 20; 0 turns heartbeats off)."""
    liveness_raw = e.get("RINGWORLD_LIVENESS_TIMEOUT") or "20"
    try:
        liveness = float(liveness_raw)
    except ValueError:
        raise ConfigError(f"RINGWORLD_LIVENESS_TIMEOUT={liveness_raw!r} is not a number of "
                          "seconds") from None
    if not liveness >= 0 or liveness == float("inf"):
        raise ConfigError(f"RINGWORLD_LIVENESS_TIMEOUT={liveness_raw!r} must be a finite "
                          "number of seconds, or 0 to turn heartbeats off")
    return liveness


def _store_and_secret(e: Mapping[str, str], launch: launchers.Launch | None,
                      size: int) -> tuple[str | None, bytes]:
    """The store's address (``RINGWORLD_STORE``, else the launcher's rendezvous) and the job
    secret (reading and closing ``RINGWORLD_SECRET_FD`` if set)."""
    store_addr = e.get("RINGWORLD_STORE") or None
    if launch is not None and store_addr is None and launch.size > 1:
        if launch.host is None or launch.port is None:
            raise launchers.missing_rendezvous(launch)
        host = f"[{launch.host}]" if ":" in launch.host else launch.host
        store_addr = f"{host}:{launch.port}"
    if size > 1 and store_addr is None:
        raise ConfigError(
            f"RINGWORLD_SIZE={size} but RINGWORLD_STORE is not set: start the job with "
            "`ringworld run -n N ...`"
        )
    secret = _read_secret(e)
    if launch is not None and store_addr is not None and not secret:
        secret = _launcher_secret(e, store_addr)
    if store_addr is not None and not secret:
        raise ConfigError("RINGWORLD_STORE is set but no job secret was given "
                          "(RINGWORLD_SECRET_FD or RINGWORLD_SECRET)")
    return store_addr, secret


def _launcher_secret(env: Mapping[str, str], store_addr: str) -> bytes:
    """The secret of a job without ``ringworld run`` (none came through an fd or the env)."""
    path = env.get("RINGWORLD_SECRET_FILE") or None
    if path is not None:
        return launchers.read_secret_file(path)
    host = store_addr.rpartition(":")[0].strip("[]")
    if not is_loopback(host):
        raise ConfigError(
            f"the job store would be served at {store_addr}, which other hosts can reach, but "
            "no job secret is set: give every rank the same secret with RINGWORLD_SECRET_FILE "
            "(a file of mode 600 holding hex, e.g. `python -c 'import secrets; "
            "print(secrets.token_hex(32))' > f`) or RINGWORLD_SECRET (hex)")
    return launchers.user_secret(launchers.default_secret_file(env))


def backend_from_env(backend: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """``backend`` if given, else ``RINGWORLD_BACKEND`` (default ``native``), checked.

    Raises:
        ValueError: ``backend`` is not one of :data:`BACKENDS`.
        ConfigError: ``RINGWORLD_BACKEND`` is not one of :data:`BACKENDS`.
    """
    if backend is not None:
        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r} must be one of {BACKENDS}")
        return backend
    e = os.environ if env is None else env
    name = (e.get("RINGWORLD_BACKEND") or "native").strip().lower()
    if name not in BACKENDS:
        raise ConfigError(f"RINGWORLD_BACKEND={name!r} must be one of {BACKENDS}")
    return name


def parse_algorithms(text: str, name: str = "RINGWORLD_ALGORITHMS") -> tuple[tuple[str, str], ...]:
    """Parse ``collective:algorithm`` pairs separated by commas (names are checked on use).

    Raises:
        ConfigError: an entry is not of the form ``collective:algorithm``.
    """
    out = []
    for raw in text.replace(";", ",").split(","):
        item = raw.strip()
        if not item:
            continue
        coll, sep, algo = item.replace("=", ":").partition(":")
        if not sep or not coll.strip() or not algo.strip():
            raise ConfigError(f"{name}: {item!r} must look like collective:algorithm, "
                              "e.g. allreduce:ring")
        out.append((coll.strip().lower(), algo.strip().lower()))
    return tuple(out)
