"""Process-wide start-up and shut-down: ``init()``, ``world()``, ``finalize()``.

``init()`` reads the configuration the launcher left in the environment, meets the other ranks
through the job's authenticated store, builds the transport and returns the world communicator.
Outside a launched job it returns a world of size 1 (like MPI's singleton init), so scripts also
run as plain ``python script.py``.
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from ringworld import backends as _backends
from ringworld import config as _config
from ringworld.collective.communicator import Communicator
from ringworld.comm.engine import WORLD_CONTEXT, Engine, usable_cpus
from ringworld.comm.monitor import Monitor
from ringworld.errors import (
    BootstrapError,
    ConfigError,
    MismatchError,
    PeerFailure,
    RingworldError,
    StoreError,
)
from ringworld.other_launchers import AgentStore
from ringworld.store.base import Store
from ringworld.transport.base import Transport
from ringworld.tuning.select import job_selector

if TYPE_CHECKING:
    from ringworld.store.tcp import TCPStoreServer

_lock = threading.Lock()
_world: Communicator | None = None
_engine: Engine | None = None
_store: Store | None = None
_monitor: Monitor | None = None
_finalized = False
_trace_solo = False  # tracing a singleton (not launched): finalize writes the trace itself
_trace_by_ranks = False  # no `ringworld run` to merge the parts: the last rank to leave does
_server: TCPStoreServer | None = None  # the job store rank 0 serves when no launcher does
_leave_count = 0  # ranks that say goodbye through that store before rank 0 stops serving it
LEAVE_TIMEOUT = 30.0
BOOTSTRAP_TIMEOUT = 60.0
# under real torchrun, a rank that finds rank 0's port in the agent's store: seconds one try at
# that port may take (an entry from an earlier attempt names a port nobody serves now), and
# between tries
AGENT_TRY = 1.0
AGENT_RETRY = 0.05


def _connect_store(cfg: _config.Config, timeout: float = BOOTSTRAP_TIMEOUT) -> Store:
    from ringworld.store.tcp import TCPStore

    assert cfg.store_addr is not None
    host, sep, port = cfg.store_addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"RINGWORLD_STORE={cfg.store_addr!r} must be host:port")
    return TCPStore(host.strip("[]"), int(port), cfg.secret, timeout=timeout)


def _make_transport(cfg: _config.Config, kind: str, store: Store,
                    peers: list[int] | None = None, local: dict[int, int] | None = None
                    ) -> Transport:
    """The transport ``kind`` to ``peers`` (None: every other rank); ``local``: the pids of
    the ranks on this host (a TCP transport's waits look where those run)."""
    if kind == "tcp":
        from ringworld.transport.tcp import TcpTransport

        tcp = TcpTransport.create(cfg.rank, cfg.size, store, cfg.secret,
                                  bind=_bind_address(cfg), timeout=BOOTSTRAP_TIMEOUT,
                                  checksum=cfg.tcp_checksum, peers=peers)
        tcp.watch_local(local or {})
        return tcp
    from ringworld.transport.shm import ShmTransport

    return ShmTransport.create(cfg.rank, cfg.size, store, cfg.job_id,
                               ring_bytes=cfg.shm_ring_bytes, eager_bytes=cfg.eager_bytes,
                               timeout=BOOTSTRAP_TIMEOUT, peers=peers,
                               single_copy=cfg.shm_single_copy)


def _host_label(cfg: _config.Config) -> str:
    """Which host this rank is on: RINGWORLD_HOST (set by the launcher), else name and boot."""
    if cfg.host:
        return cfg.host
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    return f"{socket.gethostname()}/{boot}"


def _build_routes(cfg: _config.Config, kind: str, store: Store
                  ) -> tuple[list[Transport | None], str, list[str], list[int]]:
    """Each peer's transport: shared memory to ranks on this host, TCP to the others ("auto"),
    or one transport for all. Returns (routes, the world's kind, every rank's host label,
    every rank's usable CPUs). Collective: every rank publishes its CPU count and host label
    and reads the others'.
    """
    store.set(f"host/{cfg.rank}", f"{usable_cpus()} {os.getpid()} {_host_label(cfg)}".encode())
    seen = [store.get(f"host/{r}", BOOTSTRAP_TIMEOUT).decode().split(" ", 2)
            for r in range(cfg.size)]
    cpus = [int(c) for c, _, _ in seen]
    hosts = [h for _, _, h in seen]
    route: list[Transport | None] = [None] * cfg.size
    local = [r for r in range(cfg.size) if hosts[r] == hosts[cfg.rank]]
    remote = [r for r in range(cfg.size) if hosts[r] != hosts[cfg.rank]]
    if kind == "auto" and not remote:
        kind = "shm"
    elif kind == "auto" and len(local) == 1:
        kind = "tcp"
    if kind != "auto":
        t = _make_transport(cfg, kind, store,
                            local={r: int(seen[r][1]) for r in local if r != cfg.rank})
        for r in range(cfg.size):
            if r != cfg.rank:
                route[r] = t
        return route, kind, hosts, cpus
    # several hosts, and peers on this one: shared memory here, TCP to the rest
    shm = _make_transport(cfg, "shm", store, peers=local)
    try:
        tcp = _make_transport(cfg, "tcp", store, peers=remote)
    except BaseException:
        shm.close()
        raise
    for r in local:
        if r != cfg.rank:
            route[r] = shm
    for r in remote:
        route[r] = tcp
    return route, "tcp", hosts, cpus


def _meet(cfg: _config.Config, kind: str, store: Store | None
          ) -> tuple[list[Transport | None], str, list[str], list[int]]:
    """The world's routes as :func:`_build_routes` gives them, for a world of one too (no
    store needed); a transport that cannot be set up is a BootstrapError."""
    if cfg.size == 1 or store is None:
        return [None] * cfg.size, "shm" if kind == "auto" else kind, [_host_label(cfg)], \
            [usable_cpus()]
    try:
        return _build_routes(cfg, kind, store)
    except OSError as exc:
        raise BootstrapError(f"rank {cfg.rank}: {kind} transport set-up failed: {exc}") from exc


def _world_of(engine: Engine, cfg: _config.Config, kind: str) -> Communicator:
    """The world communicator over ``engine``, with the job's selector."""
    selector = job_selector(cfg.tuning_file, cfg.algorithms, cfg.tuner)
    return Communicator(engine, range(cfg.size), WORLD_CONTEXT, "world", selector, kind)


def _bind_address(cfg: _config.Config) -> str:
    """The address this rank's TCP listener binds: RINGWORLD_IFACE's, RINGWORLD_BIND, else
    this host's address on the route to the job store when that is not on loopback.

    Raises:
        ConfigError: RINGWORLD_IFACE names no interface with an IPv4 address.
    """
    from ringworld._sockutil import iface_address, route_address

    if cfg.iface:
        try:
            return iface_address(cfg.iface)
        except ValueError as exc:
            raise ConfigError(f"RINGWORLD_IFACE={cfg.iface!r}: {exc}") from None
    if cfg.bind not in ("127.0.0.1", "localhost", ""):
        return cfg.bind
    host, _, port = (cfg.store_addr or "").rpartition(":")
    host = host.strip("[]")
    if host and not host.startswith("127.") and host not in ("::1", "localhost"):
        try:
            return route_address(host, int(port))
        except (OSError, ValueError):
            pass
    return cfg.bind


def init(*, transport: str | None = None, timeout: float | None = None,
         backend: str | None = None) -> Communicator:
    """Start this rank's communication and return the world communicator; idempotent.

    ``backend`` ("native", "mpi") overrides ``RINGWORLD_BACKEND``; "mpi" runs every call over
    mpi4py (:mod:`ringworld.backends.mpi`; ``transport`` is then ignored). Ranks started by
    torchrun, srun or mpiexec (no ``ringworld run``) are detected: rank 0 serves the job store
    (:mod:`ringworld.other_launchers` says where).

    ``transport`` ("auto", "shm", "tcp") overrides ``RINGWORLD_TRANSPORT``; ``timeout`` sets
    the default timeout of blocking calls (overrides ``RINGWORLD_TIMEOUT``). Collective: every
    rank of the job must call it. Cost: a few store round trips and one connection or shared
    segment per peer.

    Raises:
        ConfigError: the environment is inconsistent or an argument is invalid.
        BootstrapError: the ranks could not meet (store unreachable, peer missing, no shm).
        RuntimeError: called after ``finalize()``.
    """
    global _world, _engine, _store
    with _lock:
        if _world is not None:
            return _world
        if _finalized:
            raise RuntimeError("ringworld.init() called after finalize(); a process runs one job")
        if transport is not None and transport not in _config.TRANSPORTS:
            raise ValueError(f"transport={transport!r} must be one of {_config.TRANSPORTS}")
        if timeout is not None and not timeout > 0:  # also NaN
            raise ValueError(f"timeout={timeout!r} must be positive or None")
        name = _config.backend_from_env(backend)
        if name != "native":
            _world = _start_backend(name, timeout)
            atexit.register(_finalize_at_exit)
            return _world
        cfg = _config.from_env()
        kind = transport or cfg.transport
        store: Store | None = None
        try:
            if cfg.size > 1:
                store, cfg = _rendezvous(cfg)
            route, kind, hosts, cpus = _meet(cfg, kind, store)
        except RingworldError:
            if store is not None:
                store.close()
            raise
        except OSError as exc:  # meeting the store
            if store is not None:
                store.close()
            raise BootstrapError(f"rank {cfg.rank}: {kind} transport set-up failed: {exc}") \
                from exc
        engine = Engine(cfg.rank, cfg.size, route, timeout if timeout is not None else cfg.timeout,
                        hosts=hosts, cpus=cpus)
        if store is not None and cfg.liveness_timeout > 0:
            _start_monitor(engine, cfg)
        _engine = engine
        _store = store
        _world = _world_of(engine, cfg, kind)
        if cfg.trace:
            _start_trace(cfg)
        atexit.register(_finalize_at_exit)
        return _world


def _start_backend(name: str, timeout: float | None) -> Communicator:
    """The world communicator of backend ``name`` (rank and size come from the backend; it
    provides the native Communicator's interface, see :mod:`ringworld.backends`)."""
    cfg = _config.from_env(detect_launcher=False)
    return _backends.start_world(name, timeout if timeout is not None else cfg.timeout,
                                 expect_size=cfg.size)


def _rendezvous(cfg: _config.Config) -> tuple[Store, _config.Config]:
    """Connect to the job store. Without ``ringworld run`` (``cfg.serve_store``) rank 0 serves
    it first, and rank 0 draws this run's job id (``<derived id>.<random>``), so reruns and
    concurrent jobs never share shared-memory names; the returned config carries it. Under
    real torchrun rank 0 serves on a free port and says which through the agent's store.

    Raises:
        BootstrapError: rank 0 cannot listen at the rendezvous address (port taken), or the
            store (or torchrun's agent store) cannot be reached.
        ConfigError: the secret is too short for the address.
    """
    global _server, _leave_count
    if not cfg.serve_store:
        return _connect_store(cfg), cfg
    if cfg.rank == 0:
        _server = _serve_store(cfg)
    store: Store | None = None
    try:
        if cfg.agent_store is not None:  # real torchrun: rank 0's port goes through its agent
            store, cfg, job_id = _through_agent(cfg, AgentStore(cfg.agent_store,
                                                                BOOTSTRAP_TIMEOUT))
        else:
            store = _connect_store(cfg)
            if cfg.rank == 0:
                store.set("rw/boot/job", f"{cfg.job_id}.{os.urandom(4).hex()}".encode())
            job_id = store.get("rw/boot/job", BOOTSTRAP_TIMEOUT).decode()
    except BaseException:
        if store is not None:
            store.close()
        _stop_serving()
        raise
    _leave_count = cfg.size
    return store, cfg._replace(job_id=job_id)


def _through_agent(cfg: _config.Config, agent: AgentStore
                   ) -> tuple[Store, _config.Config, str]:
    """Under real torchrun: rank 0 (serving on a port the kernel chose) draws the job id's
    nonce, puts the id in its store and publishes port and nonce in the agent's store; the
    others read them there and keep the first store they reach whose job id carries that
    nonce. An entry left by an earlier attempt of the job (the agent's store outlives its
    workers) names a port nobody serves now, or another job's store: they try again until
    rank 0's entry replaces it, for at most BOOTSTRAP_TIMEOUT s.

    Returns (the store, the config with its address, the job id).
    Raises: BootstrapError (no store of this attempt answered in time), StoreError.
    """
    key = f"ringworld/store/{cfg.job_id}"
    host = (cfg.store_addr or "").rpartition(":")[0]
    if _server is not None:  # rank 0
        nonce = os.urandom(4).hex()
        port = _server.address[1]
        cfg = cfg._replace(store_addr=f"{host}:{port}")
        store = _connect_store(cfg)
        try:
            store.set("rw/boot/job", f"{cfg.job_id}.{nonce}".encode())
            agent.publish(key, port, nonce)
        except BaseException:
            store.close()
            raise
        return store, cfg, f"{cfg.job_id}.{nonce}"
    deadline = time.monotonic() + BOOTSTRAP_TIMEOUT
    tried = ""
    while True:
        port, nonce = agent.read(key, deadline - time.monotonic())
        found = cfg._replace(store_addr=f"{host}:{port}")
        want = f"{found.job_id}.{nonce}"
        reached: Store | None = None
        try:
            reached = _connect_store(found, min(AGENT_TRY,
                                                max(0.1, deadline - time.monotonic())))
            job = reached.get("rw/boot/job", AGENT_TRY).decode()
            if job == want:
                return reached, found, job
            tried = f"port {port}: another job's store"
        except RingworldError as exc:
            tried = f"port {port}: {exc}"
        if reached is not None:
            reached.close()
        if time.monotonic() >= deadline:
            raise BootstrapError(
                f"rank {cfg.rank}: no job store of this attempt answered at the ports torchrun's "
                f"agent store at {agent.agent} named within {BOOTSTRAP_TIMEOUT:g} s (rank 0 "
                f"publishes its port there; the last tried: {tried})")
        time.sleep(AGENT_RETRY)


def _serve_store(cfg: _config.Config) -> TCPStoreServer:
    from ringworld.store.tcp import TCPStoreServer

    assert cfg.store_addr is not None
    host, _, port = cfg.store_addr.rpartition(":")
    if not port.isdigit():
        raise ConfigError(f"the job store address {cfg.store_addr!r} must be host:port")
    try:
        server = TCPStoreServer(cfg.secret, host=host.strip("[]"), port=int(port))
    except ValueError as exc:
        raise ConfigError(f"rank 0 cannot serve the job store at {cfg.store_addr}: {exc}") \
            from None
    try:
        server.start()
    except StoreError as exc:
        raise BootstrapError(
            f"rank 0 ({cfg.launcher}) cannot serve the job store at {cfg.store_addr}: {exc}; "
            "choose a free port with MASTER_PORT (or RINGWORLD_STORE=host:port)") from exc
    return server


def _leave(store: Store, engine: Engine | None) -> None:
    """Say this rank is done with the job store; rank 0, which serves it, first waits (at
    most :data:`LEAVE_TIMEOUT` s) until every rank that is not known dead has said so."""
    try:
        left = store.add("rw/boot/left", 1)
        deadline = time.monotonic() + LEAVE_TIMEOUT
        while _server is not None and time.monotonic() < deadline:
            dead = len(engine.dead) if engine is not None else 0
            if left + dead >= _leave_count:
                break
            time.sleep(0.05)
            left = store.add("rw/boot/left", 0)
    except RingworldError:
        pass  # the store is gone: nothing left to wait for


def _stop_serving() -> None:
    global _server, _leave_count
    if _server is not None:
        _server.close()
    _server = None
    _leave_count = 0


def _start_monitor(engine: Engine, cfg: _config.Config) -> None:
    """Heartbeats on a store connection of their own (RINGWORLD_LIVENESS_TIMEOUT, 0: off)."""
    global _monitor
    # its requests time out within the liveness timeout: a rank cut off from the job finds out
    # as soon as the others declare it failed, and its waits raise (see Engine.lose)
    _monitor = Monitor.attach(engine, lambda: _connect_store(
        cfg, max(cfg.liveness_timeout, 1.0) if cfg.liveness_timeout > 0 else BOOTSTRAP_TIMEOUT),
        cfg.liveness_timeout)
    _note_crashes(engine)


def _note_crashes(engine: Engine) -> None:
    """Keep the exception that ends the program, for the note this rank leaves as it exits:
    peers waiting for it then say it crashed, and with what, not that it finalized."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        engine.crashed = f"{kind.__name__}: {value}"
        if isinstance(value, PeerFailure):  # the crash came from another rank's failure
            engine.crashed_peer = value.rank
        previous(kind, value, tb)

    sys.excepthook = hook


def _start_trace(cfg: _config.Config) -> None:
    """Record this rank's calls (RINGWORLD_TRACE); a bad path is a ConfigError now."""
    global _trace_solo, _trace_by_ranks
    from ringworld.trace import recorder

    assert cfg.trace is not None
    try:
        recorder.enable(cfg.trace, cfg.rank)
    except OSError as exc:
        raise ConfigError(f"RINGWORLD_TRACE={cfg.trace!r}: cannot write the trace: {exc}") \
            from exc
    _trace_solo = not cfg.launched
    _trace_by_ranks = cfg.serve_store  # torchrun, srun, mpiexec: no ringworld launcher merges


def _merge_when_last(store: Store, path: str, size: int) -> None:
    """Count this rank out of the trace (its part is flushed); the last of ``size`` writes the
    merged file. A rank that dies never counts out: its job's parts stay for ``ringworld trace
    merge``. Cost: one store round trip."""
    from ringworld.trace import merge

    try:
        if store.add("rw/trace/left", 1) == size:
            merge.merge(path)
    except (RingworldError, OSError) as exc:  # the store or the file: the parts stay
        sys.stderr.write(f"ringworld: trace parts of {path} left unmerged: {exc} (run "
                         f"`ringworld trace merge {path}`)\n")


class OwnWorld:
    """A world built over a store someone else hands over (:func:`world_over`), apart from the
    process's :func:`init` world: its communicator, and :meth:`close` for its resources."""

    def __init__(self, comm: Communicator, engine: Engine, monitor: Monitor | None,
                 store: Store, trace: str | None = None) -> None:
        self.comm, self._engine, self._monitor = comm, engine, monitor
        self._store, self._trace = store, trace
        self._closed = False

    def close(self) -> str | None:
        """Stop its monitor and close its transports; idempotent. Returns what the exit check
        found (a collective message no call took: ranks disagreed), else None."""
        if self._closed:
            return None
        self._closed = True
        problem = self._engine.exit_check()
        if self._trace is not None:
            from ringworld.trace import recorder

            recorder.disable()  # this rank's part is complete
            _merge_when_last(self._store, self._trace, self.comm.size)
        if self._monitor is not None:
            self._monitor.stop(exiting=True)
        self._engine.close()
        return problem


_OWN_SETTINGS_SKIP = ("RINGWORLD_RANK", "RINGWORLD_SIZE", "RINGWORLD_STORE", "RINGWORLD_JOB_ID",
                      "RINGWORLD_SECRET_FD")


def world_over(store: Store, rank: int, size: int, *, timeout: float | None = None,
               connect: Any = None, reach: str | None = None) -> OwnWorld:
    """A world of ``size`` ranks met through ``store`` (torch's, for instance), this process
    being ``rank``: not the process's :func:`init` world, so several can come and go. Rank 0
    draws the job id and the secret that authenticates TCP peers, and publishes them in the
    store: the store's own protection is the job's (as for Gloo). Transports as for
    :func:`init` (shared memory on one host, TCP between hosts); settings from the
    ``RINGWORLD_*`` variables; the TCP listener binds this host's address on the route to
    ``reach`` (``host:port`` every rank reaches, such as torch's TCPStore) unless those say
    otherwise. ``connect()`` gives the liveness monitor a store connection of its own (None:
    no monitor; peers' deaths are then found by the transports and timeouts). Collective over
    the ``size`` ranks.

    Raises:
        BootstrapError: the ranks could not meet.  ConfigError: a malformed setting.
    """
    env = {k: v for k, v in os.environ.items()
           if k.startswith("RINGWORLD_") and k not in _OWN_SETTINGS_SKIP}
    cfg = _config.from_env(env, detect_launcher=False)
    if rank == 0:
        store.set("rw/own/job", f"{os.getpid()}.{os.urandom(6).hex()}".encode())
        store.set("rw/own/secret", os.urandom(32).hex().encode())
    job = store.get("rw/own/job", BOOTSTRAP_TIMEOUT).decode()
    secret = bytes.fromhex(store.get("rw/own/secret", BOOTSTRAP_TIMEOUT).decode())
    cfg = cfg._replace(rank=rank, size=size, job_id=f"own{job}", secret=secret,
                       store_addr=reach)
    route, kind, hosts, cpus = _meet(cfg, cfg.transport, store)
    engine = Engine(rank, size, route, timeout if timeout is not None else cfg.timeout,
                    hosts=hosts, cpus=cpus)
    monitor = None
    if connect is not None and size > 1 and cfg.liveness_timeout > 0:
        monitor = Monitor.attach(engine, connect, cfg.liveness_timeout)
    comm = _world_of(engine, cfg, kind)
    trace = None
    if cfg.trace:  # RINGWORLD_TRACE: recorded here, merged by the last rank to close
        from ringworld.trace import recorder

        trace = recorder.enable(cfg.trace, rank).path
    return OwnWorld(comm, engine, monitor, store, trace)


def world() -> Communicator:
    """The world communicator, calling :func:`init` first if needed."""
    return _world if _world is not None else init()


def initialized() -> bool:
    """Whether :func:`init` has run (and :func:`finalize` has not)."""
    return _world is not None


def finalized() -> bool:
    """Whether :func:`finalize` has run."""
    return _finalized


def finalize() -> None:
    """Close this rank's transports and store connection; idempotent, also run at exit.

    Messages this rank sent eagerly stay readable by their receivers after it exits; a rank
    that still waits for this one gets a PeerFailure instead of hanging.

    Raises:
        MismatchError: a collective message arrived that no call of this rank took (ranks
            disagreed on a call that left none of them waiting); everything is closed first.
    """
    global _world, _engine, _store, _finalized, _monitor
    problem = None
    with _lock:
        if _engine is not None and not _finalized:
            problem = _engine.exit_check()
        if _world is not None:
            _stop_trace()
        if _monitor is not None:
            _monitor.stop(exiting=True)
            _monitor = None
        if _store is not None and _leave_count:
            _leave(_store, _engine)
        if _engine is not None:
            _engine.close()
        if _store is not None:
            _store.close()
        _stop_serving()
        _world = _engine = _store = None
        _finalized = True
    if problem is not None:
        raise MismatchError(problem)


def _finalize_at_exit() -> None:
    """:func:`finalize` at interpreter exit: a mismatch it finds makes the exit status 1 (the
    program's results may be wrong on some rank), with the mismatch on stderr."""
    try:
        finalize()
    except MismatchError as exc:
        sys.stdout.flush()
        sys.stderr.write(f"ringworld: {exc}\n")
        sys.stderr.flush()
        os._exit(1)


def _stop_trace() -> None:
    """Flush this rank's trace part; a singleton also writes the merged trace file."""
    import sys

    recorder = sys.modules.get("ringworld.trace.recorder")
    if recorder is None:
        return
    rec = recorder.recorder()
    if rec is None:
        return
    recorder.disable()
    if _trace_solo:
        from ringworld.trace import merge

        merge.merge(rec.path)
    elif _trace_by_ranks and _store is not None and _world is not None:
        _merge_when_last(_store, rec.path, _world.size)
