"""The shared windows' header (``algorithms.shm_arena``): every use of a header word has words
of its own, whatever the number of ranks up to MAX_RANKS (a stream's counter read where a
failure's text lies would let a root overwrite data a rank has not taken yet)."""

from __future__ import annotations

from ringworld.algorithms import shm_arena as arena
from ringworld.algorithms import shm_collectives as coll
from ringworld.algorithms import shm_failure as failure
from ringworld.algorithms import shm_race as race


def test_header_words_do_not_overlap() -> None:
    uses = {  # what: (first word, how many)
        "sync counter": (0, 1),
        "call numbers": (arena.SEQ_WORD, 2),
        "failed": (arena.FAILED, 1),
        "failed from": (arena.FAILED_FROM, 1),
        "refused kind": (arena.REFUSED_KIND, 1),
        "signatures": (8, 4),
        "placement": (12, 2),
        "progress": (arena.PROGRESS, 2),
        "race picks": (race.RACE_WORD, 6),
        "refusing": (arena.REFUSING, 1),
        "eager done": (arena.EAGER_DONE, 1),
        "published buffers, verdict, mailbox": (24, 4),
        "stream": (28, 4),
        "eager stamps": (arena.EAGER_STAMP, arena.EAGER_RING),
        "failure text": (failure.FAILED_TEXT, failure.FAILED_TEXT_BYTES // 8),
        "consumed": (coll.CONSUMED, arena.MAX_RANKS),
    }
    seen: dict[int, str] = {}
    for name, (first, count) in uses.items():
        for w in range(first, first + count):
            assert w not in seen, f"header word {w}: {seen[w]} and {name}"
            seen[w] = name
    assert max(seen) < arena.HEADER // 8
