"""The error a rank raises when it finds, in the shared windows, that another rank left a call
(see :meth:`ringworld.algorithms.shm_arena.Arena.abandon`)."""

from __future__ import annotations

from ringworld.errors import CommBroken, CommError, MismatchError, PeerFailure


def peer_left(how: int, first: int, text: str, what: str, seq: int) -> CommError:
    """The error of a rank that finds that world rank ``first`` left call ``seq`` with
    ``text``: a MismatchError where that was one (``how`` 1), a PeerFailure naming the failed
    rank where a rank left because ``first`` failed (``how`` 3), else CommBroken. It carries
    (how, first, text) for :meth:`Arena.abandon`, which passes the first failure on."""
    exc: CommError
    if how == 3:
        exc = PeerFailure(first, f"{text}; while waiting for {what} (a rank left it so)")
    else:
        kind = MismatchError if how == 1 else CommBroken
        exc = kind(f"{what}: world rank {first} left call #{seq} of this communicator with "
                   f"{text}")
    setattr(exc, "first_failure", (how, first, text))  # noqa: B010 (no such field in the class)
    return exc
