"""What one job needs besides its processes: an id, a secret, the store, and cleanup afterwards.

Shared by ``ringworld run`` and :func:`ringworld.testing.run_processes`, so both give ranks the same
environment (see ``docs/architecture.md``, "Rank start-up contract").
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from types import TracebackType

SHM_DIR = "/dev/shm"
SHM_PREFIX = "ringworld-"

#: Variables of the start-up contract; inherited values are replaced, never mixed in.
CONTRACT_VARS = (
    "RINGWORLD_RANK",
    "RINGWORLD_SIZE",
    "RINGWORLD_STORE",
    "RINGWORLD_JOB_ID",
    "RINGWORLD_SECRET_FD",
    "RINGWORLD_SECRET",
)

_JOB_ID = re.compile(r"[A-Za-z0-9_.]+")
_WILDCARDS = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}


def new_job_id() -> str:
    """A short random hex id (8 characters), unique enough for concurrent jobs on one host."""
    return os.urandom(4).hex()


def new_secret() -> bytes:
    """A fresh 32-byte job secret."""
    return os.urandom(32)


def remove_shm_segments(job_id: str, shm_dir: str = SHM_DIR) -> list[str]:
    """Unlink every ``<shm_dir>/ringworld-<job_id>-*`` file; return the names removed.

    Raises:
        ValueError: ``job_id`` is empty or has characters other than letters, digits, ``_.``.
    Cost: one directory listing.
    """
    if not _JOB_ID.fullmatch(job_id):
        raise ValueError(f"job_id={job_id!r} must be letters, digits, '_' or '.' (at least one)")
    prefix = f"{SHM_PREFIX}{job_id}-"
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return []
    removed = []
    for name in names:
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join(shm_dir, name))
            except OSError:
                continue
            removed.append(name)
    return removed


class JobStore:
    """The job's authenticated TCP store, served from a daemon thread of this process.

    Use as a context manager; ``address`` is the ``host:port`` ranks connect to (a wildcard bind
    address is replaced by loopback). ``bind`` of ``""`` means loopback; any other host needs the
    job secret (:func:`ringworld.auth.listen_host`).

    Raises:
        ValueError: ``secret`` is empty, or too short for a non-loopback ``bind``.
        StoreError: (on enter) the address cannot be listened on (``OSError`` for a name that
            won't resolve).
    """

    def __init__(self, secret: bytes, bind: str = "127.0.0.1") -> None:
        from ringworld.store.tcp import TCPStoreServer

        self._server = TCPStoreServer(secret, host=bind, port=0)
        self.address = ""

    def __enter__(self) -> JobStore:
        host, port = self._server.start()
        host = _WILDCARDS.get(host, host)
        self.address = f"{host}:{port}"
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.close()


def rank_env(
    base: Mapping[str, str],
    *,
    rank: int,
    size: int,
    store: str,
    job_id: str,
    transport: str | None = None,
    timeout: float | None = None,
) -> dict[str, str]:
    """The environment of one rank: ``base`` without inherited contract variables, plus this job's.

    The secret is not included; the caller adds ``RINGWORLD_SECRET_FD`` (launcher) or
    ``RINGWORLD_SECRET`` (forked test ranks). ``transport``/``timeout`` of ``None`` keep ``base``'s.
    """
    env = {k: v for k, v in base.items() if k not in CONTRACT_VARS}
    env["RINGWORLD_RANK"] = str(rank)
    env["RINGWORLD_SIZE"] = str(size)
    env["RINGWORLD_STORE"] = store
    env["RINGWORLD_JOB_ID"] = job_id
    if transport is not None:
        env["RINGWORLD_TRANSPORT"] = transport
    if timeout is not None:
        env["RINGWORLD_TIMEOUT"] = repr(float(timeout))
    return env


#: The directory holding the stand-in ``mpi4py`` package (``ringworld/mpi/shim``), found without
#: importing anything.
SHIM_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mpi",
                        "shim")


def with_mpi4py_shim(base: Mapping[str, str], shim_dir: str = SHIM_DIR) -> dict[str, str]:
    """``base`` with ``shim_dir`` first on ``PYTHONPATH``, so ranks import the stand-in mpi4py.

    The entry goes first, ahead of any inherited entries and of site-packages, so a real
    mpi4py installed there is shadowed for this job only. Idempotent. Cost: a string join.
    """
    env = dict(base)
    inherited = env.get("PYTHONPATH", "")
    rest = [p for p in inherited.split(os.pathsep) if p != shim_dir] if inherited else []
    env["PYTHONPATH"] = os.pathsep.join([shim_dir, *rest])
    return env
