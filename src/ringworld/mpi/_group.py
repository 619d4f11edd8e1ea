"""``MPI.Group``: an ordered set of processes, named by their ranks in ``COMM_WORLD``.

Groups are local objects: building one never communicates. ``comm.Get_group()`` lists the
communicator's processes in rank order; ``Comm.Create(group)`` turns a group back into a
communicator.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Final, Self

from ringworld.mpi._constants import PROC_NULL, UNDEFINED
from ringworld.mpi._exception import ERR_ARG, ERR_GROUP, ERR_RANK, Exception

IDENT: Final = 0  #: same members in the same order (communicators: same context too)
CONGRUENT: Final = 1  #: communicators with the same group but different contexts
SIMILAR: Final = 2  #: same members, different order
UNEQUAL: Final = 3  #: different members


class Group:
    """A group of processes; ``Group()`` is a null group like ``MPI.GROUP_NULL``."""

    __slots__ = ("_me", "_members", "_predefined")

    def __init__(self) -> None:
        self._members: tuple[int, ...] | None = None
        self._me = -1  # this process's world rank, -1 if unknown (only in an empty group)
        self._predefined = False

    @classmethod
    def _make(cls, members: Sequence[int], me: int) -> Self:
        group = cls()
        group._members = tuple(members)
        group._me = me
        return group

    @property
    def _list(self) -> tuple[int, ...]:
        if self._members is None:
            raise Exception(ERR_GROUP, "the group is null (GROUP_NULL or freed)")
        return self._members

    def __bool__(self) -> bool:
        return self._members is not None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Group):
            return NotImplemented
        return self._members == other._members

    __hash__ = None  # type: ignore[assignment]  # a mutable handle, unhashable as in mpi4py

    def __repr__(self) -> str:
        what = "null" if self._members is None else f"of {len(self._members)}"
        return f"<MPI.Group {what}>"

    # -- accessors ------------------------------------------------------------------------

    def Get_size(self) -> int:
        """Return the number of processes in the group."""
        return len(self._list)

    def Get_rank(self) -> int:
        """Return this process's rank in the group, or ``UNDEFINED`` if not a member."""
        members = self._list
        return members.index(self._me) if self._me in members else UNDEFINED

    @property
    def size(self) -> int:
        """The number of processes."""
        return self.Get_size()

    @property
    def rank(self) -> int:
        """This process's rank (``UNDEFINED`` if not a member)."""
        return self.Get_rank()

    def Translate_ranks(
        self, ranks: Sequence[int] | None = None, group: Group | None = None
    ) -> list[int]:
        """Return the ranks in ``group`` (default: ``COMM_WORLD``'s) of ``ranks`` of this group.

        Processes not in ``group`` give ``UNDEFINED``; ``PROC_NULL`` stays ``PROC_NULL``.
        """
        members = self._list
        if group is None:
            import ringworld

            other: tuple[int, ...] = tuple(range(ringworld.world().size))
        else:
            other = group._list
        where = {w: i for i, w in enumerate(other)}
        wanted = range(len(members)) if ranks is None else self._ranks(ranks, "Translate_ranks")
        return [PROC_NULL if r == PROC_NULL else where.get(members[r], UNDEFINED)
                for r in wanted]

    def Compare(self, group: Group) -> int:
        """Return ``IDENT``, ``SIMILAR`` or ``UNEQUAL``."""
        mine, theirs = self._list, group._list
        if mine == theirs:
            return IDENT
        return SIMILAR if sorted(mine) == sorted(theirs) else UNEQUAL

    # -- constructors ---------------------------------------------------------------------

    def _derive(self, members: Sequence[int], other: Group | None = None) -> Self:
        me = self._me if self._me >= 0 or other is None else other._me
        return type(self)._make(members, me)

    def Dup(self) -> Self:
        """Return a copy of the group."""
        return self._derive(self._list)

    @classmethod
    def Union(cls, group1: Group, group2: Group) -> Self:
        """The members of ``group1``, then those of ``group2`` not in ``group1``."""
        first = group1._list
        seen = set(first)
        members = first + tuple(w for w in group2._list if w not in seen)
        me = group1._me if group1._me >= 0 else group2._me
        return cls._make(members, me)

    @classmethod
    def Intersection(cls, group1: Group, group2: Group) -> Self:
        """The members of ``group1`` that are in ``group2``, in ``group1``'s order."""
        other = set(group2._list)
        me = group1._me if group1._me >= 0 else group2._me
        return cls._make([w for w in group1._list if w in other], me)

    Intersect = Intersection

    @classmethod
    def Difference(cls, group1: Group, group2: Group) -> Self:
        """The members of ``group1`` that are not in ``group2``, in ``group1``'s order."""
        other = set(group2._list)
        me = group1._me if group1._me >= 0 else group2._me
        return cls._make([w for w in group1._list if w not in other], me)

    def Incl(self, ranks: Sequence[int]) -> Self:
        """The group of ``ranks`` of this group, in that order."""
        chosen = self._ranks(ranks, "Incl", distinct=True)
        return self._derive([self._list[r] for r in chosen])

    def Excl(self, ranks: Sequence[int]) -> Self:
        """This group without ``ranks``, in the remaining order."""
        dropped = set(self._ranks(ranks, "Excl", distinct=True))
        return self._derive([w for r, w in enumerate(self._list) if r not in dropped])

    def Range_incl(self, ranks: Sequence[tuple[int, int, int]]) -> Self:
        """``Incl`` of the ranks ``first, first+stride, ...`` up to ``last`` of each triple."""
        return self.Incl(self._ranges(ranks, "Range_incl"))

    def Range_excl(self, ranks: Sequence[tuple[int, int, int]]) -> Self:
        """``Excl`` of the ranks ``first, first+stride, ...`` up to ``last`` of each triple."""
        return self.Excl(self._ranges(ranks, "Range_excl"))

    def Free(self) -> None:
        """Free the group, which becomes null; predefined groups cannot be freed."""
        if self._predefined or self._members is None:
            raise Exception(ERR_GROUP, "cannot free a predefined or null group")
        self._members = None

    def free(self) -> None:
        """Free the group unless it is null or predefined."""
        if self and not self._predefined:
            self.Free()

    # -- helpers --------------------------------------------------------------------------

    def _ranks(self, ranks: Sequence[int], where: str, *, distinct: bool = False) -> list[int]:
        n = len(self._list)
        try:
            out = [operator.index(r) for r in ranks]
        except TypeError:
            raise TypeError(f"{where}: ranks must be a sequence of ints, got {ranks!r}") from None
        bad = [r for r in out if not (0 <= r < n or (r == PROC_NULL and not distinct))]
        if bad:
            raise Exception(ERR_RANK, f"{where}: ranks {bad} are not in 0..{n - 1}")
        if distinct and len(set(out)) != len(out):
            raise Exception(ERR_RANK, f"{where}: ranks {out} repeat a rank")
        return out

    @staticmethod
    def _ranges(ranges: Sequence[tuple[int, int, int]], where: str) -> list[int]:
        out: list[int] = []
        for triple in ranges:
            first, last, stride = (operator.index(x) for x in triple)
            if stride == 0 or (last - first) * stride < 0:
                raise Exception(ERR_ARG, f"{where}: range {tuple(triple)} is empty or has "
                                "stride 0")
            out.extend(range(first, last + (1 if stride > 0 else -1), stride))
        return out


def _predefined(group: Group) -> Group:
    group._predefined = True
    return group


GROUP_NULL: Final = _predefined(Group())
GROUP_EMPTY: Final = _predefined(Group._make((), -1))


def group_of(world_ranks: Sequence[int], me: int) -> Group:
    """The group of a communicator whose processes have ``world_ranks`` (``me``: this one)."""
    return Group._make(world_ranks, me)


__all__ = ["CONGRUENT", "GROUP_EMPTY", "GROUP_NULL", "IDENT", "SIMILAR", "UNEQUAL", "Group",
           "group_of"]
