"""Persistent requests (``Send_init``/``Recv_init`` + ``Start``) and combined send-receive
requests (``Isendrecv``).

A persistent request is made once and started many times. Between starts it is *inactive*:
waiting on or testing it completes at once with an empty status, and unlike a plain request it
stays non-null after a completion is handed out, until ``Free()``. Each ``Start`` begins the
operation afresh with the arguments given at creation (so the buffer is read or written then).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

import ringworld
from ringworld.mpi._exception import ERR_REQUEST, Exception
from ringworld.mpi._request import Request

Starter = Callable[[], Request]


class Prequest(Request):
    """A persistent request; ``Start()`` begins its operation again."""

    __slots__ = ("_starter",)

    def __init__(self) -> None:
        super().__init__()
        self._starter: Starter | None = None

    @classmethod
    def _persistent(cls, starter: Starter) -> Prequest:
        request = cls()
        request._starter = starter
        return request

    def __bool__(self) -> bool:
        return self._starter is not None

    def __repr__(self) -> str:
        active = self._native is not None or self._done is not None
        state = "null" if self._starter is None else "active" if active else "inactive"
        return f"<MPI.Prequest {state}>"

    def Start(self) -> None:
        """Begin the operation.

        Raises:
            MPI.Exception: the request is null, freed, or still active.
        """
        if self._starter is None:
            raise Exception(ERR_REQUEST, "Start: the persistent request is null or freed")
        if self._native is not None or self._done is not None:
            raise Exception(ERR_REQUEST, "Start: the persistent request is still active; "
                            "complete it with Wait or Test first")
        started = self._starter()
        self._native, self._kind, self._done = started._native, started._kind, started._done

    @classmethod
    def Startall(cls, requests: Sequence[Prequest]) -> None:
        """``Start`` every request, in order."""
        for request in requests:
            request.Start()

    def Free(self) -> None:
        """Make the request null; an operation in flight still runs to completion."""
        super().Free()
        self._starter = None


class SendRecvRequest(ringworld.Request[Any]):
    """A native request made of a send and a receive: done when both are; its result is the
    receive's status. ``keep`` holds memory the send reads (a copy, for the replace forms).
    """

    __slots__ = ("_keep", "_recv", "_send")

    def __init__(self, send: ringworld.Request[Any], recv: ringworld.Request[Any],
                 keep: object = None) -> None:
        super().__init__(recv._engine)
        self._send = send
        self._recv = recv
        self._keep = keep

    @property
    def done(self) -> bool:
        return self._send.done and self._recv.done

    def _value(self) -> Any:
        self._send.wait()
        status = self._recv.wait()
        self.status = self._recv.status
        return status

    def describe(self) -> str:
        return f"Isendrecv({self._send.describe()}, {self._recv.describe()})"

    def depends(self, dead: Collection[int]) -> int | None:
        rank = self._send.depends(dead)
        return rank if rank is not None else self._recv.depends(dead)
