"""The error a rank raises when it finds, in the shared windows, that another rank left a call
(see :meth:`ringworld.algorithms.shm_arena.Arena.abandon`), and the texts ranks leave each
other in their headers' failure-text words: a failure's, a refusal's, a mismatched call's."""

from __future__ import annotations

import time
from collections.abc import Callable
from os import sched_yield

import numpy as np

from ringworld.errors import CommBroken, CommError, MismatchError, PeerFailure

FAILED_TEXT = 64  # header words 64 ..: the first failure's text (utf-8, FAILED_TEXT_BYTES)
FAILED_TEXT_BYTES = 192
CALL_TEXT_WAIT = 2.0  # seconds a mismatch waits for the other ranks' call texts (call_texts)


def write_text(mine: memoryview, text: str) -> None:
    """Put ``text`` (its first FAILED_TEXT_BYTES, utf-8) in a rank's header words ``mine``."""
    raw = text.encode("utf-8", "replace")[:FAILED_TEXT_BYTES]
    words = np.zeros(FAILED_TEXT_BYTES // 8, dtype="<i8")
    words.view(np.uint8)[: len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    # the first word last: a reader that sees it (a call text's tag) sees the rest (x86
    # stores become visible in program order)
    for i, w in reversed(list(enumerate(words.tolist()))):
        mine[FAILED_TEXT + i] = w


def read_text(words: memoryview) -> str:
    """The text in a rank's header words ``words`` (see :func:`write_text`)."""
    got = np.array([words[FAILED_TEXT + i] for i in range(FAILED_TEXT_BYTES // 8)],
                   dtype="<i8")
    return got.tobytes().rstrip(b"\0").decode("utf-8", "replace")


def call_texts(ctr: list[memoryview], me: int, e: int, text: str,
               wake: Callable[[], None]) -> dict[int, str]:
    """Every rank's call text at sync ``e``, where the ranks' calls differ and all of them are
    at this sync (each raises there): rank ``me`` publishes its own (``text``, its call's
    signature text, tagged with ``e``, in its failure-text words, which no failure holds while
    the ranks are in step), wakes the others and waits up to CALL_TEXT_WAIT seconds for theirs.
    Returns rank -> text; a rank whose text did not come is left out. Cost: the error path's."""
    tag = f"{e}\t"
    write_text(ctr[me], tag + text)
    wake()
    got, left = {me: text}, set(range(len(ctr))) - {me}
    deadline = time.monotonic() + CALL_TEXT_WAIT
    while left and time.monotonic() < deadline:
        for i in sorted(left):
            t = read_text(ctr[i])
            if t.startswith(tag):
                got[i] = t[len(tag):]
                left.discard(i)
        if left:
            sched_yield()
    return got


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
