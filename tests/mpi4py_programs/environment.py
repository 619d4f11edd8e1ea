"""The MPI environment: init state, threads, timers, processor name, COMM_SELF, errors, rc."""

import mpi4py
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
row = {}

row["init"] = (MPI.Is_initialized(), MPI.Is_finalized(), MPI.Query_thread() == MPI.THREAD_MULTIPLE,
               MPI.Is_thread_main(), isinstance(mpi4py.rc.initialize, bool),
               MPI.Get_version() >= (3, 1))
t0 = MPI.Wtime()
t1 = MPI.Wtime()
row["timers"] = (isinstance(t0, float), t1 >= t0, 0 < MPI.Wtick() < 1)
name = MPI.Get_processor_name()
names = comm.allgather(name)
row["processor"] = (isinstance(name, str) and len(name) > 0, len(set(names)))

# COMM_SELF: a world of one
me = np.array([rank + 5], dtype="i")
out = np.zeros(1, dtype="i")
MPI.COMM_SELF.Allreduce([me, MPI.INT], [out, MPI.INT])
row["self"] = (MPI.COMM_SELF.Get_rank(), MPI.COMM_SELF.Get_size(), int(out[0]),
               MPI.COMM_SELF.bcast("mine"), MPI.COMM_SELF.allgather(rank))

# predefined datatypes: sizes and extents
row["types"] = [(t.Get_size(), t.Get_extent()[1]) for t in
                (MPI.CHAR, MPI.SHORT, MPI.INT, MPI.LONG_LONG, MPI.FLOAT, MPI.DOUBLE, MPI.BYTE,
                 MPI.C_BOOL, MPI.INT64_T, MPI.UINT16_T, MPI.C_DOUBLE_COMPLEX, MPI.DOUBLE_INT,
                 MPI.TWOINT, MPI.INTEGER, MPI.REAL, MPI.DOUBLE_PRECISION)]

# error classes: MPI.Exception from MPI-level misuse, with its class and string
errors = []
for action in (MPI.COMM_NULL.Get_rank, MPI.COMM_WORLD.Free, MPI.SUM.Free, MPI.DOUBLE.Free,
               lambda: comm.Get_group().Incl([size + 3]), lambda: comm.Get_attr(12345)):
    try:
        action()
        errors.append("no error")
    except MPI.Exception as exc:
        errors.append((exc.Get_error_class() == MPI.Get_error_class(exc.Get_error_code()),
                       isinstance(exc.Get_error_string(), str),
                       {MPI.ERR_COMM: "ERR_COMM", MPI.ERR_OP: "ERR_OP", MPI.ERR_TYPE: "ERR_TYPE",
                        MPI.ERR_RANK: "ERR_RANK", MPI.ERR_KEYVAL: "ERR_KEYVAL",
                        }.get(exc.Get_error_class(), exc.Get_error_class())))
row["errors"] = errors
row["error_string"] = MPI.Get_error_string(MPI.SUCCESS) != MPI.Get_error_string(MPI.ERR_RANK)
row["attrs"] = (comm.Get_attr(MPI.TAG_UB) >= 32767, comm.Get_errhandler() == MPI.ERRORS_RETURN)
row["parent"] = MPI.Comm.Get_parent() == MPI.COMM_NULL
row["dims"] = [MPI.Compute_dims(n, d) for n, d in ((12, 2), (16, 2), (6, 3), (7, 2), (24, 3),
                                                    (30, [0, 3, 0]), (size, 2))]
info = MPI.Info.Create()
info.Set("key", "value")
row["info"] = (info.Get("key"), info.Get_nkeys(), MPI.INFO_NULL == MPI.INFO_NULL)
info.Free()

rows = comm.gather(row, root=0)
if rank == 0:
    assert rows is not None
    for r, entry in enumerate(rows):
        print(r, entry)
