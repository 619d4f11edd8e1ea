"""A collective message queued for a call that this rank then ended without taking is a stray
(a mismatch), found when the rank enters its next signed call (``CallChecks.note_call``). Where
a rank runs ahead, many calls' messages wait queued: each call looks only at the calls entered
since its last look (``_find_left_over``), and looks at the whole queue again where a call open
then (nonblocking, or given up) has closed since. Both find what the whole look finds, across
the sequence numbers' wrap too."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ringworld.comm.engine import Engine
from ringworld.comm.requests import SIG_SHIFT, TAG_UB
from ringworld.transport.base import BufferedIncoming

CTX = 8
SIG = 5


@pytest.fixture
def engine() -> Iterator[Engine]:
    e = Engine(0, 1, [None], 30.0, cpus=[64])
    try:
        yield e
    finally:
        e.close()


def _queue(e: Engine, seq: int) -> None:
    """A message of call ``seq`` arrives with nobody asking for it yet."""
    inc = BufferedIncoming(0, CTX, seq | SIG << SIG_SHIFT, 0, 0)
    inc.mark_complete()
    e.deliver(inc)


def _take(e: Engine, seq: int) -> None:
    """Call ``seq`` takes its queued message (as a posted receive would)."""
    tag = seq | SIG << SIG_SHIFT
    m = next(m for m in e.unexpected[CTX] if m.tag == tag)
    e.unexpected[CTX].remove(m)
    e._unindex(CTX, tag)


def _enter(e: Engine, seq: int) -> list[int]:
    """Enter call ``seq``; the sequence numbers of the strays found."""
    e.note_call(CTX, seq | SIG << SIG_SHIFT)
    return [tag & ((1 << SIG_SHIFT) - 1) for _, tag, _, _ in e.strays]


def test_calls_ahead_are_no_strays_and_a_call_left_is_found_next_call(engine: Engine) -> None:
    base = TAG_UB - 20  # (through the wrap)
    seqs = [(base + k) & TAG_UB for k in range(100)]
    for s in seqs[1:]:
        _queue(engine, s)
    for s in seqs[:50]:
        assert _enter(engine, s) == [], s
        if s != seqs[0]:
            _take(engine, s)
    assert _enter(engine, seqs[50]) == []
    # call seqs[50] ends without taking its message: the next call finds it
    assert _enter(engine, seqs[51]) == [seqs[50]]


def test_a_call_open_meanwhile_is_looked_at_once_it_closes(engine: Engine) -> None:
    for s in range(1, 11):
        _queue(engine, s)
    assert _enter(engine, 1) == []
    _take(engine, 1)
    engine.open_calls[CTX].add(2)  # a nonblocking call, its message not taken yet
    assert _enter(engine, 2) == []
    for s in (3, 4):
        assert _enter(engine, s) == []
        _take(engine, s)
    engine.close_call(CTX, 2)  # it closed without taking it
    assert _enter(engine, 5) == [2]


def test_a_long_gap_looks_at_the_whole_queue(engine: Engine) -> None:
    for s in (1, 2, 300):
        _queue(engine, s)
    assert _enter(engine, 1) == []
    _take(engine, 1)
    assert _enter(engine, 300) == [2]
