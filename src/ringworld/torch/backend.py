"""Registration with torch.distributed: the backend creator and the ``ringworld://`` rendezvous.

``ringworld://`` (the ``init_method`` for jobs started by ``ringworld run``) takes rank and world
size from the Ringworld world and gives torch a shared ``TCPStore`` (rank 0 serves it on a free
port and tells the others over Ringworld), so Gloo groups and store-based torch features work
beside the Ringworld backend. Under ``ringworld run``, a ``rank``/``world_size`` given to
``init_process_group`` must agree with the Ringworld world.

Without ``ringworld run`` (``mp.spawn`` with ``file://`` or ``tcp://``, torchrun with
``env://``, ``store=``), the default group's ranks meet through the store torch hands the
backend, as Gloo's do: :func:`ringworld.runtime.world_over` builds a world of their own over it
(shared memory on one host, TCP between hosts), closed again by ``destroy_process_group``, so
init, destroy and init again in one process works.

Every group gets a communicator of its own: the default group a ``dup`` of the Ringworld world
(or the world built over torch's store), a subgroup (``new_group``) one over its members, whose
context id the members agree on through the group's store (non-members never take part, as
torch does not call them).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlparse

import torch.distributed as dist

import ringworld
from ringworld import runtime
from ringworld.collective.communicator import Communicator
from ringworld.errors import StoreError
from ringworld.torch._worker import worker
from ringworld.torch.process_group import BACKEND_NAME, ProcessGroupRingworld
from ringworld.torch.store import TorchStore, store_address

SCHEME = "ringworld"
_registered = False
_base: Communicator | None = None  # the world the current default group's subgroups come from


def register() -> None:
    """Register the ``ringworld`` backend and the ``ringworld://`` rendezvous; idempotent.

    ``import ringworld.torch`` calls it. Cost: no communication.
    """
    global _registered
    if _registered:
        return
    dist.Backend.register_backend(BACKEND_NAME, create, extended_api=True,
                               devices=["cpu", "cuda"])
    with contextlib.suppress(RuntimeError):  # an earlier copy of this module (reload) did
        dist.register_rendezvous_handler(SCHEME, rendezvous)
    _registered = True


def _world_mismatch(what: str, torch_value: int, world: Communicator) -> ValueError:
    return ValueError(
        f"ringworld backend: torch {what}={torch_value} but this process is rank {world.rank} "
        f"of a Ringworld world of {world.size}; start the job with `ringworld run -n N` and "
        f"leave rank/world_size unset (or equal to Ringworld's)"
    )


def rendezvous(url: str, timeout: timedelta = timedelta(minutes=30),
               **_: Any) -> Iterator[tuple[dist.Store, int, int]]:
    """torch's rendezvous handler for ``ringworld://``: yields (store, rank, world_size) once.

    Raises:
        ValueError: a ``rank``/``world_size`` in the URL that disagrees with the world.
        RuntimeError: asked to rendezvous again (a Ringworld world is fixed).
    """
    query = {k: v[-1] for k, v in parse_qs(urlparse(url).query).items()}
    store, rank, size = worker().call(lambda: _meet(query, timeout))
    yield store, rank, size
    raise RuntimeError("ringworld:// cannot rendezvous again: the Ringworld world is fixed")


def _meet(query: dict[str, str], timeout: timedelta) -> tuple[dist.Store, int, int]:
    """On the worker: check the world against ``query``, start and share the TCPStore."""
    world = ringworld.init()
    for key, mine in (("rank", world.rank), ("world_size", world.size)):
        if key in query and int(query[key]) != mine:
            raise _world_mismatch(key, int(query[key]), world)
    host = "127.0.0.1"
    if world.size > 1 and len(set(world.allgather_obj(socket.gethostname()))) > 1:
        host = socket.getfqdn()
    store: dist.TCPStore | None = None
    if world.rank == 0:
        store = dist.TCPStore(host, 0, world.size, is_master=True, timeout=timeout,
                              wait_for_workers=False)
    host, port = world.bcast_obj((host, store.port if store is not None else 0), root=0)
    if store is None:
        store = dist.TCPStore(host, port, world.size, is_master=False, timeout=timeout)
    return store, world.rank, world.size


def create(opts: Any, _backend_options: Any = None) -> ProcessGroupRingworld:
    """torch's backend creator (extended API): the process group of one torch group.

    Raises:
        ValueError: the default group's rank/size differ from the Ringworld world's (under
            ``ringworld run``), or a subgroup's ranks are not ranks of it.
        BootstrapError: the ranks could not meet through torch's store.
    """
    w = worker()
    seconds = opts.timeout.total_seconds() if opts.timeout is not None else 0.0
    timeout = seconds if seconds > 0 else None
    ranks = [int(r) for r in opts.global_ranks_in_group]
    rank, size = int(opts.group_rank), int(opts.group_size)
    if not ranks:
        comm, own = w.call(lambda: _default(rank, size, opts.store, timeout))
        return ProcessGroupRingworld(comm, w, timeout, own.close if own is not None else None)
    comm = w.call(lambda: _subgroup(ranks, rank, size, opts.store))
    return ProcessGroupRingworld(comm, w, timeout)


def _default(rank: int, size: int, store: Any, timeout: float | None
             ) -> tuple[Communicator, runtime.OwnWorld | None]:
    """On the worker: the default group's communicator, and the world built for it if any."""
    global _base
    launched = os.environ.get("RINGWORLD_STORE")  # under ringworld run
    if launched or (ringworld.initialized() and (ringworld.init().size > 1 or size == 1)):
        world = ringworld.init()
        if rank != world.rank:
            raise _world_mismatch("rank", rank, world)
        if size != world.size:
            raise _world_mismatch("world_size", size, world)
        _base = world
        return world.dup(name="torch"), None
    ts = TorchStore.for_group(store, size)
    try:
        ts.clone().close()  # the liveness monitor needs a connection of its own
        connect: Any = ts.clone
    except StoreError:
        connect = None
    own = runtime.world_over(ts, rank, size, timeout=timeout, connect=connect,
                             reach=store_address(store))
    atexit.register(own.close)
    _base = own.comm
    return own.comm, own


def _subgroup(ranks: list[int], rank: int, size: int, store: Any) -> Communicator:
    """On the worker: the communicator of a torch subgroup (see the module docstring)."""
    world = _base if _base is not None else ringworld.init()
    if len(ranks) != size or not 0 <= rank < size or ranks[rank] != world.rank:
        raise ValueError(f"ringworld backend: group ranks {ranks} (this rank {rank}) do not "
                         f"match Ringworld world rank {world.rank}")
    if any(not 0 <= r < world.size for r in ranks) or len(set(ranks)) != len(ranks):
        raise ValueError(f"ringworld backend: group ranks {ranks} must be distinct ranks of "
                         f"the Ringworld world (0..{world.size - 1})")
    engine = world._engine  # contexts are agreed through the store, not collectively
    store.set(f"ringworld-context/{rank}", str(engine.next_context))
    ctx = max(int(store.get(f"ringworld-context/{r}")) for r in range(size))
    engine.reserve_contexts(ctx)
    return world._derive(ranks, ctx, f"torch.group{ranks}")
