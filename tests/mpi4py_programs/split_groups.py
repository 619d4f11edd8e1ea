"""Communicators and groups: Split (with keys), Dup, groups, Create, Create_group, Compare."""

import numpy as np
from mpi4py import MPI

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
row = {}

# odd/even halves, ranked in reverse order of world rank
half = world.Split(color=rank % 2, key=-rank)
total = np.zeros(1, dtype="i")
half.Allreduce([np.array([rank], dtype="i"), MPI.INT], [total, MPI.INT], op=MPI.SUM)
row["half"] = (half.Get_rank(), half.Get_size(), int(total[0]))

# a split where rank 0 opts out
sub = world.Split(MPI.UNDEFINED if rank == 0 else 1, rank)
row["without_0"] = None if sub == MPI.COMM_NULL else (sub.Get_rank(), sub.Get_size())

# Dup: same group, separate traffic, congruent
dup = world.Dup()
row["dup"] = (dup.Get_rank(), world.Compare(dup) == MPI.CONGRUENT,
              world.Compare(world) == MPI.IDENT, world.Compare(half) == MPI.UNEQUAL)
if size > 1:
    if rank == 0:
        dup.send("on dup", dest=1, tag=7)
        world.send("on world", dest=1, tag=7)
    elif rank == 1:
        row["dup_msgs"] = (world.recv(source=0, tag=7), dup.recv(source=0, tag=7))

# groups: Incl / Excl / Range_incl / Translate_ranks / set operations
group = world.Get_group()
evens = group.Incl(list(range(0, size, 2)))
odds = group.Excl(list(range(0, size, 2)))
firsts = group.Range_incl([(0, size - 1, 3)])
row["groups"] = (evens.Get_size(), evens.Get_rank() if rank % 2 == 0 else None,
                 odds.Get_rank() == MPI.UNDEFINED if rank % 2 == 0 else odds.Get_rank(),
                 firsts.Get_size(),
                 MPI.Group.Translate_ranks(evens, list(range(evens.Get_size())), group),
                 MPI.Group.Union(evens, odds).Get_size(),
                 MPI.Group.Intersection(evens, odds).Get_size(),
                 MPI.Group.Difference(group, evens).Get_size(),
                 MPI.Group.Compare(group, MPI.Group.Union(evens, odds)))

# Create (collective over world) and Create_group (collective over the group only)
ecomm = world.Create(evens)
row["create"] = None if ecomm == MPI.COMM_NULL else (ecomm.Get_rank(), ecomm.Get_size(),
                                                     ecomm.allgather(rank))
if rank % 2 == 1:
    ocomm = world.Create_group(odds, tag=5)
    row["create_group"] = (ocomm.Get_rank(), ocomm.Get_size(), ocomm.allreduce(rank))
    ocomm.Free()
row["freed"] = False
half.Free()
row["freed"] = half == MPI.COMM_NULL
for g in (evens, odds, firsts, group):
    g.Free()
dup.Free()

rows = world.gather(row, root=0)
if rank == 0:
    assert rows is not None
    for r, entry in enumerate(rows):
        print(r, entry)
