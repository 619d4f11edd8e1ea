"""Process-wide start-up and shut-down: ``init()``, ``world()``, ``finalize()``.

``init()`` reads the configuration the launcher left in the environment, meets the other ranks
through the job's authenticated store, builds the transport and returns the world communicator.
Outside a launched job it returns a world of size 1 (like MPI's singleton init), so scripts also
run as plain ``python script.py``.
"""

from __future__ import annotations

import atexit
import threading

from ringworld import config as _config
from ringworld.collective.communicator import Communicator
from ringworld.comm.engine import WORLD_CONTEXT, Engine
from ringworld.comm.monitor import Monitor
from ringworld.errors import BootstrapError, ConfigError, RingworldError
from ringworld.store.base import Store
from ringworld.transport.base import Transport
from ringworld.tuning import constants
from ringworld.tuning.select import Selector

_lock = threading.Lock()
_world: Communicator | None = None
_engine: Engine | None = None
_store: Store | None = None
_monitor: Monitor | None = None
_finalized = False
_trace_solo = False  # tracing a singleton (not launched): finalize writes the trace itself
BOOTSTRAP_TIMEOUT = 60.0


def _connect_store(cfg: _config.Config) -> Store:
    from ringworld.store.tcp import TCPStore

    assert cfg.store_addr is not None
    host, sep, port = cfg.store_addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"RINGWORLD_STORE={cfg.store_addr!r} must be host:port")
    return TCPStore(host.strip("[]"), int(port), cfg.secret, timeout=BOOTSTRAP_TIMEOUT)


def _make_transport(cfg: _config.Config, kind: str, store: Store) -> Transport:
    if kind == "tcp":
        from ringworld.transport.tcp import TcpTransport

        return TcpTransport.create(cfg.rank, cfg.size, store, cfg.secret, bind=cfg.bind,
                                   timeout=BOOTSTRAP_TIMEOUT, checksum=cfg.tcp_checksum)
    from ringworld.transport.shm import ShmTransport

    return ShmTransport.create(cfg.rank, cfg.size, store, cfg.job_id,
                               ring_bytes=cfg.shm_ring_bytes, eager_bytes=cfg.eager_bytes,
                               timeout=BOOTSTRAP_TIMEOUT)


def init(*, transport: str | None = None, timeout: float | None = None) -> Communicator:
    """Start this rank's communication and return the world communicator; idempotent.

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
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout={timeout!r} must be positive or None")
        cfg = _config.from_env()
        kind = transport or cfg.transport
        if kind == "auto":
            kind = "shm"
        route: list[Transport | None] = [None] * cfg.size
        store: Store | None = None
        if cfg.size > 1:
            try:
                store = _connect_store(cfg)
                t = _make_transport(cfg, kind, store)
            except RingworldError:
                if store is not None:
                    store.close()
                raise
            except OSError as exc:
                if store is not None:
                    store.close()
                raise BootstrapError(f"rank {cfg.rank}: {kind} transport set-up failed: {exc}") \
                    from exc
            for r in range(cfg.size):
                if r != cfg.rank:
                    route[r] = t
        engine = Engine(cfg.rank, cfg.size, route, timeout if timeout is not None else cfg.timeout)
        if store is not None and cfg.liveness_timeout > 0:
            _start_monitor(engine, cfg)
        _engine = engine
        _store = store
        selector = Selector(constants.load(cfg.tuning_file), cfg.algorithms)
        _world = Communicator(engine, range(cfg.size), WORLD_CONTEXT, "world", selector, kind)
        if cfg.trace:
            _start_trace(cfg)
        atexit.register(finalize)
        return _world


def _start_monitor(engine: Engine, cfg: _config.Config) -> None:
    """Heartbeats on a store connection of their own (RINGWORLD_LIVENESS_TIMEOUT, 0: off)."""
    global _monitor
    monitor = Monitor(engine, lambda: _connect_store(cfg), cfg.liveness_timeout)
    try:
        monitor.start()
    except RingworldError:
        engine.close()
        raise
    engine.explain = monitor.explain
    engine.ft = monitor
    _monitor = monitor


def _start_trace(cfg: _config.Config) -> None:
    """Record this rank's calls (RINGWORLD_TRACE); a bad path is a ConfigError now."""
    global _trace_solo
    from ringworld.trace import recorder

    assert cfg.trace is not None
    try:
        recorder.enable(cfg.trace, cfg.rank)
    except OSError as exc:
        raise ConfigError(f"RINGWORLD_TRACE={cfg.trace!r}: cannot write the trace: {exc}") \
            from exc
    _trace_solo = not cfg.launched


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
    """
    global _world, _engine, _store, _finalized, _monitor
    with _lock:
        if _world is not None:
            _stop_trace()
        if _monitor is not None:
            _monitor.stop(exiting=True)
            _monitor = None
        if _engine is not None:
            _engine.close()
        if _store is not None:
            _store.close()
        _world = _engine = _store = None
        _finalized = True


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
