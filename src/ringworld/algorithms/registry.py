"""Every algorithm of every collective, by stable name.

Names are short strings used unchanged in the API (``algorithm="ring"``), the environment
(``RINGWORLD_ALGORITHMS=allreduce:ring``), traces and benchmark output.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import NamedTuple

from ringworld.algorithms import (
    allgather,
    allreduce,
    alltoall,
    barrier,
    bcast,
    gather,
    reduce,
    reduce_scatter,
    scan,
)
from ringworld.algorithms.schedule import Schedule, Spec

SCHEDULE, DIRECT, COMPOSITE = "schedule", "direct", "composite"
SHM = "shm"  # the direct algorithm of every collective that has one
HIERARCHICAL = "hierarchical"  # the composite allreduce


def _no_schedule(spec: Spec) -> Schedule:
    raise TypeError("only schedule algorithms build schedules")


class Algorithm(NamedTuple):
    """An algorithm and what it supports: a schedule builder, or a path of another kind."""

    name: str
    build: Callable[[Spec], Schedule]
    commutative_only: bool = False   # combines in an order other than rank order
    equal_blocks_only: bool = False  # needs the packed, equal-count layout
    kind: str = SCHEDULE
    blocking_only: bool = False      # runs as a blocking call only (direct and composite)


A = Algorithm
REGISTRY: dict[str, dict[str, Algorithm]] = {
    "barrier": {"dissemination": A("dissemination", barrier.dissemination)},
    "bcast": {a.name: a for a in (A("linear", bcast.linear), A("binomial", bcast.binomial),
                                  A("ring", bcast.ring),
                                  A("scatter_allgather", bcast.scatter_allgather))},
    "reduce": {a.name: a for a in (A("linear", reduce.linear), A("binomial", reduce.binomial),
                                   A("ring", reduce.ring, commutative_only=True))},
    "allreduce": {a.name: a for a in (
        A("linear", allreduce.linear), A("recursive_doubling", allreduce.recursive_doubling),
        A("ring", allreduce.ring, commutative_only=True),
        A("rabenseifner", allreduce.rabenseifner, commutative_only=True),
        A("reduce_bcast", allreduce.reduce_bcast))},
    "gather": {a.name: a for a in (A("linear", gather.gather_linear),
                                   A("binomial", gather.gather_binomial))},
    "gatherv": {"linear": A("linear", gather.gatherv_linear)},
    "scatter": {a.name: a for a in (A("linear", gather.scatter_linear),
                                    A("binomial", gather.scatter_binomial))},
    "scatterv": {"linear": A("linear", gather.scatterv_linear)},
    "allgather": {a.name: a for a in (
        A("linear", allgather.linear), A("ring", allgather.ring),
        A("recursive_doubling", allgather.recursive_doubling, equal_blocks_only=True),
        A("bruck", allgather.bruck, equal_blocks_only=True))},
    "allgatherv": {a.name: a for a in (A("linear", allgather.linear),
                                       A("ring", allgather.ring))},
    "alltoall": {a.name: a for a in (A("linear", alltoall.linear),
                                     A("pairwise", alltoall.pairwise),
                                     A("bruck", alltoall.bruck, equal_blocks_only=True))},
    "alltoallv": {a.name: a for a in (A("linear", alltoall.linear),
                                      A("pairwise", alltoall.pairwise))},
    "alltoallw": {"linear": A("linear", alltoall.w_linear),
                  "pairwise": A("pairwise", alltoall.w_pairwise)},
    "reduce_scatter_block": {a.name: a for a in (
        A("ring", reduce_scatter.ring, commutative_only=True),
        A("pairwise", reduce_scatter.pairwise))},
    "reduce_scatter": {a.name: a for a in (
        A("ring", reduce_scatter.ring, commutative_only=True),
        A("pairwise", reduce_scatter.pairwise))},
    "scan": {a.name: a for a in (A("linear", scan.linear),
                                 A("recursive_doubling", scan.recursive_doubling))},
    "exscan": {a.name: a for a in (A("linear", scan.exscan_linear),
                                   A("recursive_doubling", scan.exscan_recursive_doubling))},
}

COLLECTIVES = tuple(REGISTRY)
#: the collectives with a direct (shared-memory) algorithm
DIRECT_COLLECTIVES = ("barrier", "allreduce", "reduce", "bcast", "allgather",
                      "reduce_scatter_block", "alltoall", "gather", "scatter", "scan", "exscan")
#: the v-variants (and reduce_scatter, of per-rank counts) with a shared-memory path: it takes
#: every call whose ranks share memory (their blocks differ by rank, so no rank can choose by
#: size alike with the others), moving the data itself where it fits its slots or where ranks
#: may copy each other's memory (see ``algorithms.shm_vector``)
VECTOR_DIRECT = ("allgatherv", "gatherv", "scatterv", "alltoallv", "reduce_scatter")
_OTHER: dict[str, dict[str, Algorithm]] = {
    c: {SHM: A(SHM, _no_schedule, equal_blocks_only=c not in VECTOR_DIRECT, kind=DIRECT,
               blocking_only=True)}
    for c in DIRECT_COLLECTIVES + VECTOR_DIRECT}
_OTHER["allreduce"][HIERARCHICAL] = A(HIERARCHICAL, _no_schedule, commutative_only=True,
                                      kind=COMPOSITE, blocking_only=True)
#: every algorithm of every collective, of every kind
ALGORITHMS: dict[str, dict[str, Algorithm]] = {c: {**REGISTRY[c], **_OTHER.get(c, {})}
                                               for c in REGISTRY}


def _find(table: dict[str, dict[str, Algorithm]], collective: str, name: str) -> Algorithm:
    algos = table.get(collective)
    if algos is None:
        raise ValueError(f"unknown collective {collective!r}; one of {', '.join(COLLECTIVES)}")
    algo = algos.get(name)
    if algo is None:
        raise ValueError(f"algorithm={name!r} is not an algorithm of {collective}; choose one "
                         f"of {', '.join(algos)}")
    return algo


def algorithm(collective: str, name: str) -> Algorithm:
    """The schedule algorithm ``name`` of ``collective``.

    Raises:
        ValueError: unknown collective or algorithm (the message lists the valid names).
    """
    return _find(REGISTRY, collective, name)


def lookup(collective: str, name: str) -> Algorithm:
    """The algorithm ``name`` of ``collective``, of any kind.

    Raises:
        ValueError: unknown collective or algorithm (the message lists the valid names).
    """
    return _find(ALGORITHMS, collective, name)


@lru_cache(maxsize=4096)
def build(collective: str, name: str, spec: Spec) -> Schedule:
    """The (cached) schedule of ``name`` for ``spec``; schedules are pure, so caching is safe."""
    return algorithm(collective, name).build(spec)
