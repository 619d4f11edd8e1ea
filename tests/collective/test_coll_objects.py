"""Object collectives (``bcast_obj`` ... ``exscan_obj``) over real processes.

Every world size over both transports: values of many kinds (numpy arrays inside, bytes past
the eager limit, nested containers), every root, built-in ops by object and by name, MAXLOC /
MINLOC on (value, index) tuples with ties, and non-commutative reductions (string and list
concatenation, a user op created non-commutative) that must come out in rank order.
"""

from __future__ import annotations

import functools
import operator
from typing import Any

import numpy as np
import pytest
from coll_support import WAIT, values

import ringworld
from ringworld import Communicator, Op
from ringworld.testing import run_processes

SIZES = [1, 2, 3, 4, 5, 8]
TRANSPORTS = ["shm", "tcp"]

CONCAT = Op.create(lambda a, b: a + b, commutative=False, name="concat")
#: Affine maps (m, c) mod 97 composed left to right: associative, not commutative.
COMPOSE = Op.create(lambda a, b: (a[0] * b[0] % 97, (a[1] * b[0] + b[1]) % 97),
                    commutative=False, name="compose")


def same(a: Any, b: Any) -> bool:
    """Deep equality that compares numpy arrays by dtype and content."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and a.shape == b.shape and np.array_equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return (type(a) is type(b) and len(a) == len(b)
                and all(same(x, y) for x, y in zip(a, b, strict=True)))
    return bool(a == b) and type(a) is type(b)


def value(who: int) -> dict[str, Any]:
    """A value of many kinds, different for every ``who``."""
    return {"who": who, "name": f"r{who}", "arr": values(who, 1000 + who, np.dtype(np.float64)),
            "big": bytes([who % 256]) * 200_000, "none": None,
            "nested": [(who, -who), {who, who + 1}, [values(who, 3, np.dtype(np.int8))]]}


def _objects(comm: Communicator) -> list[str]:
    p, r = comm.size, comm.rank
    fails: list[str] = []

    def expect(what: str, got: Any, want: Any) -> None:
        if not same(got, want):
            fails.append(f"{what} (rank {r} of {p}): got {got!r:.200}, want {want!r:.200}")

    for root in sorted({0, p // 2, p - 1}):
        mine = value(r)
        got = comm.bcast_obj(mine if r == root else None, root, timeout=WAIT)
        expect(f"bcast_obj root={root}", got, value(root))
        if r == root and got is not mine:
            fails.append(f"bcast_obj root={root}: the root did not get its own object back")
        gathered = comm.gather_obj(value(r), root, timeout=WAIT)
        expect(f"gather_obj root={root}", gathered,
               [value(i) for i in range(p)] if r == root else None)
        items = [value(100 + i) for i in range(p)] if r == root else None
        expect(f"scatter_obj root={root}", comm.scatter_obj(items, root, timeout=WAIT),
               value(100 + r))
        expect(f"reduce_obj(sum) root={root}", comm.reduce_obj(r + 1, ringworld.SUM, root),
               p * (p + 1) // 2 if r == root else None)
        expect(f"reduce_obj(concat) root={root}", comm.reduce_obj(f"<{r}>", CONCAT, root),
               "".join(f"<{i}>" for i in range(p)) if r == root else None)

    expect("allgather_obj", comm.allgather_obj(value(r), timeout=WAIT),
           [value(i) for i in range(p)])
    expect("alltoall_obj", comm.alltoall_obj([(r, j, "x" * j) for j in range(p)], timeout=WAIT),
           [(i, r, "x" * r) for i in range(p)])
    expect("alltoall_obj of arrays", comm.alltoall_obj(
        [values(r * 64 + j, 50_000, np.dtype(np.int32)) for j in range(p)]),
        [values(i * 64 + r, 50_000, np.dtype(np.int32)) for i in range(p)])

    for name, op, make, fn in REDUCTIONS:
        def ref(ranks: range, make: Any = make, fn: Any = fn) -> Any:
            return functools.reduce(fn, [make(i, p) for i in ranks])
        mine_v = make(r, p)
        expect(f"allreduce_obj({name})", comm.allreduce_obj(mine_v, op, timeout=WAIT),
               ref(range(p)))
        if name in SCANNED:
            expect(f"scan_obj({name})", comm.scan_obj(mine_v, op, timeout=WAIT),
                   ref(range(r + 1)))
            expect(f"exscan_obj({name})", comm.exscan_obj(mine_v, op, timeout=WAIT),
                   ref(range(r)) if r else None)
    # the object and buffer collectives share the sequence numbers: still in step
    out = np.empty(2, np.int64)
    comm.allreduce(np.array([r, 1]), out, timeout=WAIT)
    expect("allreduce after the object collectives", out.tolist(), [p * (p - 1) // 2, p])
    return fails


def _loc(is_max: bool) -> Any:
    def combine(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
        if a[0] != b[0]:
            return a if (a[0] > b[0]) == is_max else b
        return a if a[1] <= b[1] else b
    return combine


#: (name, op, value of rank i in a world of p, reference combine(left, right)).
REDUCTIONS: list[tuple[str, Any, Any, Any]] = [
    ("sum", ringworld.SUM, lambda i, p: i * 3 + 1, operator.add),
    ("sum by name", "sum", lambda i, p: i * 3 + 1, operator.add),
    ("prod", ringworld.PROD, lambda i, p: i % 3 + 1, operator.mul),
    ("max", ringworld.MAX, lambda i, p: i * 5 % 7, max),
    ("min by name", "MIN", lambda i, p: i * 5 % 7 - 3, min),
    ("land", ringworld.LAND, lambda i, p: i != 1, lambda a, b: a and b),
    ("lor", ringworld.LOR, lambda i, p: i == p - 1, lambda a, b: a or b),
    ("lxor", ringworld.LXOR, lambda i, p: i % 2 == 0, operator.ne),
    ("band", ringworld.BAND, lambda i, p: 0xFF ^ (1 << i), operator.and_),
    ("bor", ringworld.BOR, lambda i, p: 1 << i, operator.or_),
    ("bxor", ringworld.BXOR, lambda i, p: i * 3, operator.xor),
    ("maxloc with ties", ringworld.MAXLOC, lambda i, p: (i % 2, p - i), _loc(True)),
    ("minloc with ties", ringworld.MINLOC, lambda i, p: ((i + 1) % 2, i // 2), _loc(False)),
    ("sum of lists (concatenation in rank order)", ringworld.SUM, lambda i, p: [i, -i],
     operator.add),
    ("sum of arrays", ringworld.SUM, lambda i, p: values(i, 70_000, np.dtype(np.int64)),
     operator.add),
    ("non-commutative concat", CONCAT, lambda i, p: f"[{i}]", operator.add),
    ("non-commutative compose", COMPOSE, lambda i, p: (i * 7 % 97 + 1, i * 13 % 97),
     lambda a, b: (a[0] * b[0] % 97, (a[1] * b[0] + b[1]) % 97)),
]
#: The reductions also run as scan_obj / exscan_obj (order matters for most of them).
SCANNED = frozenset({"sum", "min by name", "maxloc with ties", "sum of lists (concatenation in "
                     "rank order)", "sum of arrays", "non-commutative concat",
                     "non-commutative compose"})


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"p{s}")
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_object_collectives(transport: str, size: int) -> None:
    out = run_processes(size, _objects, transport=transport, timeout=100)
    failures = [f for fails in out for f in fails]
    assert not failures, "\n".join(failures[:40])
