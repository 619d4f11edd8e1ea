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
``RINGWORLD_ALGORITHMS``  forced collective algorithms, e.g. ``allreduce:ring,bcast:binomial``.
``RINGWORLD_TUNING_FILE`` a JSON file of cost-model constants from ``ringworld tune``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ringworld.errors import ConfigError

TRANSPORTS = ("auto", "shm", "tcp")


@dataclass(frozen=True, slots=True)
class Config:
    """Frozen runtime settings for one rank."""

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
    algorithms: tuple[tuple[str, str], ...] = ()
    tuning_file: str | None = None
    trace: str | None = None
    liveness_timeout: float = 20.0
    tcp_checksum: bool = False

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


def from_env(env: Mapping[str, str] | None = None) -> Config:
    """Build the configuration from the environment.

    Reads (and closes) ``RINGWORLD_SECRET_FD`` if set, so call it once per process.

    Raises:
        ConfigError: a variable is malformed or the set is inconsistent.
    """
    e = os.environ if env is None else env
    rank = _int(e, "RINGWORLD_RANK", 0)
    size = _int(e, "RINGWORLD_SIZE", 1)
    assert rank is not None and size is not None
    if size < 1:
        raise ConfigError(f"RINGWORLD_SIZE={size} must be at least 1")
    if not 0 <= rank < size:
        raise ConfigError(f"RINGWORLD_RANK={rank} is outside 0..{size - 1}")
    transport = e.get("RINGWORLD_TRANSPORT", "auto") or "auto"
    if transport not in TRANSPORTS:
        raise ConfigError(f"RINGWORLD_TRANSPORT={transport!r} must be one of {TRANSPORTS}")
    timeout_raw = e.get("RINGWORLD_TIMEOUT")
    timeout: float | None = None
    if timeout_raw:
        try:
            timeout = float(timeout_raw)
        except ValueError:
            raise ConfigError(f"RINGWORLD_TIMEOUT={timeout_raw!r} is not a number") from None
        if timeout <= 0:
            raise ConfigError(f"RINGWORLD_TIMEOUT={timeout_raw!r} must be positive")
    liveness_raw = e.get("RINGWORLD_LIVENESS_TIMEOUT") or "20"
    try:
        liveness = float(liveness_raw)
    except ValueError:
        raise ConfigError(f"RINGWORLD_LIVENESS_TIMEOUT={liveness_raw!r} is not a number of "
                          "seconds") from None
    if not liveness >= 0 or liveness == float("inf"):
        raise ConfigError(f"RINGWORLD_LIVENESS_TIMEOUT={liveness_raw!r} must be a finite "
                          "number of seconds, or 0 to turn heartbeats off")
    store_addr = e.get("RINGWORLD_STORE") or None
    if size > 1 and store_addr is None:
        raise ConfigError(
            f"RINGWORLD_SIZE={size} but RINGWORLD_STORE is not set: start the job with "
            "`ringworld run -n N ...`"
        )
    secret = _read_secret(e)
    if store_addr is not None and not secret:
        raise ConfigError("RINGWORLD_STORE is set but no job secret was given "
                          "(RINGWORLD_SECRET_FD or RINGWORLD_SECRET)")
    eager = _int(e, "RINGWORLD_EAGER_BYTES", 131072)
    assert eager is not None
    algorithms = parse_algorithms(e.get("RINGWORLD_ALGORITHMS", ""))
    if eager < 0:
        raise ConfigError(f"RINGWORLD_EAGER_BYTES={eager} must be >= 0")
    return Config(
        rank=rank,
        size=size,
        store_addr=store_addr,
        job_id=e.get("RINGWORLD_JOB_ID", "") or f"solo{os.getpid()}",
        secret=secret,
        transport=transport,
        timeout=timeout,
        bind=e.get("RINGWORLD_BIND", "127.0.0.1") or "127.0.0.1",
        shm_ring_bytes=_int(e, "RINGWORLD_SHM_RING_BYTES", None),
        eager_bytes=eager,
        algorithms=algorithms,
        tuning_file=e.get("RINGWORLD_TUNING_FILE") or None,
        trace=e.get("RINGWORLD_TRACE") or None,
        liveness_timeout=liveness,
        tcp_checksum=_flag(e, "RINGWORLD_TCP_CHECKSUM"),
    )


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
