"""State and argument checks shared by the MPI backend's communicator classes."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
from mpi4py import MPI

from ringworld.backends.mpi._requests import Matcher, Poller
from ringworld.collective import buffers as bufs
from ringworld.collective.cache import CallCache
from ringworld.comm.requests import ANY_SOURCE, ANY_TAG, TAG_UB
from ringworld.errors import CommError

C = TypeVar("C", bound=type)
ALGORITHM = "mpi"  # what ``last_algorithm`` says: the MPI library chose


def translating(cls: C) -> C:
    """Wrap the public methods of ``cls`` so an ``MPI.Exception`` becomes a
    :class:`~ringworld.CommError` raised from it (errors translated at the layer boundary)."""
    for name, fn in list(vars(cls).items()):
        if name.startswith("_") or not callable(fn):
            continue

        def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(f)
            def call(*args: Any, **kwargs: Any) -> Any:
                try:
                    return f(*args, **kwargs)
                except MPI.Exception as exc:
                    raise CommError(f"MPI: {exc.Get_error_string()} (in {f.__name__})") \
                        from exc
            return call

        setattr(cls, name, wrap(fn))
    return cls


class Base:
    """One MPI communicator and what every call needs: rank, size, checks, the poller."""

    def __init__(self, comm: Any, poller: Poller, name: str, predefined: bool = False) -> None:
        self._comm = comm
        self._poller = poller
        self._matcher = Matcher(comm)
        poller.matchers.add(self._matcher)
        self._predefined = predefined  # COMM_WORLD / COMM_SELF are never freed
        self._freed = False
        self.name = name
        self.rank: int = comm.Get_rank()
        self.size: int = comm.Get_size()
        self.last_algorithm: str | None = None
        ub = comm.Get_attr(MPI.TAG_UB)
        self._tag_ub = min(TAG_UB, int(ub) if ub is not None else 32767)
        self._world_ranks: tuple[int, ...] | None = None
        self._calls = CallCache()  # the collective table's op checks, as natively

    def __repr__(self) -> str:
        return f"<MpiComm {self.name!r} rank {self.rank} of {self.size}>"

    @property
    def _c(self) -> Any:
        """The MPI communicator; raises CommError after :meth:`free`."""
        if self._freed:
            raise CommError(f"communicator {self.name!r} was freed")
        return self._comm

    @property
    def mpi_comm(self) -> Any:
        """The underlying ``mpi4py.MPI.Comm`` (for calls Ringworld does not wrap)."""
        return self._c

    # ------------------------------------------------------------------ checks
    def _rank_arg(self, value: Any, name: str) -> int:
        if type(value) is not int and not isinstance(value, np.integer):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if not 0 <= int(value) < self.size:
            raise ValueError(f"{name}={value} is not a rank of {self.name!r} "
                             f"(size {self.size})")
        return int(value)

    def _source(self, source: Any) -> int:
        return MPI.ANY_SOURCE if source == ANY_SOURCE else self._rank_arg(source, "source")

    def _send_tag(self, tag: Any) -> int:
        if type(tag) is not int or not 0 <= tag <= self._tag_ub:
            raise ValueError(f"tag={tag!r} must be an int in 0..{self._tag_ub} (the MPI "
                             "library's TAG_UB)")
        return tag

    def _recv_tag(self, tag: Any) -> int:
        if tag == ANY_TAG:
            return int(MPI.ANY_TAG)
        if type(tag) is not int or not 0 <= tag <= self._tag_ub:
            raise ValueError(f"tag={tag!r} must be ANY_TAG or an int in 0..{self._tag_ub}")
        return tag

    def _root(self, root: Any) -> int:
        return self._rank_arg(root, "root")

    @staticmethod
    def _arr(buf: Any, name: str, writable: bool = False) -> bufs.Array:
        return bufs.as_array(buf, name, writable=writable)

    @staticmethod
    def _bytes(a: bufs.Array) -> Any:
        """``[uint8 view, nbytes, MPI.BYTE]``: data moves as bytes."""
        return [a.view(np.uint8), a.nbytes, MPI.BYTE]
