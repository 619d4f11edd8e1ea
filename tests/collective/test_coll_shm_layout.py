"""The shared windows' header (``algorithms.shm_arena``): every use of a header word has words
of its own, whatever the number of ranks up to MAX_RANKS (a stream's counter read where a
failure's text lies would let a root overwrite data a rank has not taken yet)."""

from __future__ import annotations

from ringworld.algorithms import shm_arena as arena
from ringworld.algorithms import shm_collectives as coll
from ringworld.algorithms import shm_race as race


def test_header_words_do_not_overlap() -> None:
    uses = {
        "sync counter": range(1),
        "call numbers": range(arena.SEQ_WORD, arena.SEQ_WORD + 2),
        "failed": range(arena.FAILED, arena.FAILED + 1),
        "failed from": range(arena.FAILED_FROM, arena.FAILED_FROM + 1),
        "refused kind": range(arena.REFUSED_KIND, arena.REFUSED_KIND + 1),
        "signatures": range(8, 12),
        "placement": range(12, 14),
        "progress": range(arena.PROGRESS, arena.PROGRESS + 2),
        "race picks": range(race.RACE_WORD, race.RACE_WORD + 6),
        "refusing": range(arena.REFUSING, arena.REFUSING + 1),
        "eager done": range(arena.EAGER_DONE, arena.EAGER_DONE + 1),
        "published buffers, verdict, mailbox": range(24, 28),
        "stream": range(28, 32),
        "eager stamps": range(arena.EAGER_STAMP, arena.EAGER_STAMP + arena.EAGER_RING),
        "failure text": range(arena.FAILED_TEXT,
                              arena.FAILED_TEXT + arena.FAILED_TEXT_BYTES // 8),
        "consumed": range(coll.CONSUMED, coll.CONSUMED + arena.MAX_RANKS),
    }
    seen: dict[int, str] = {}
    for name, words in uses.items():
        for w in words:
            assert w not in seen, f"header word {w}: {seen[w]} and {name}"
            seen[w] = name
    assert max(seen) < arena.HEADER // 8
