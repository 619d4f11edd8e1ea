"""Run under mpiexec: every native API call on the MPI backend, checked against numpy.

``python mpi_rank_checks.py mpi`` under mpiexec uses the MPI backend; without the argument
(under ``ringworld run``) the same checks run on the native backend.

Data is unique per element (a function of rank and index, small integers so float sums are
exact). Each rank prints ``CHECKS OK <rank> <count>`` at the end; any failure raises, which
fails the rank (and mpiexec's exit status).
"""

from __future__ import annotations

import sys

import numpy as np

import ringworld
from ringworld import IN_PLACE, Op

comm = ringworld.init(backend=sys.argv[1] if len(sys.argv) > 1 else None)
r, p = comm.rank, comm.size
checks = 0


def data(rank: int, n: int, dtype: str = "f8") -> np.ndarray:
    return (np.arange(n) * 7 + rank * 100 + 1).astype(dtype)


def check(got: object, want: object, what: str) -> None:
    global checks
    if not np.array_equal(np.asarray(got), np.asarray(want)):
        raise AssertionError(f"rank {r}: {what}: got {got!r}, want {want!r}")
    checks += 1


on_mpi = type(comm).__name__ == "MpiComm"
assert on_mpi == (sys.argv[1:] == ["mpi"]), (type(comm), sys.argv)
assert on_mpi == ("mpi4py" in sys.modules)
check(comm.world_ranks, list(range(p)), "world_ranks")

# ---------------------------------------------------------------- point to point
right, left = (r + 1) % p, (r - 1) % p
got = np.empty(5, dtype=np.int64)
st = comm.sendrecv(data(r, 5, "i8"), right, got, left, sendtag=3, recvtag=3)
check(got, data(left, 5, "i8"), "sendrecv")
check((st.source, st.tag, st.nbytes), (left, 3, 40), "sendrecv status")
req = comm.irecv(got, source=ringworld.ANY_SOURCE, tag=ringworld.ANY_TAG)
comm.isend(data(r, 5, "i8") * 2, right, tag=9).wait()
st = req.wait(timeout=30)
check(got, data(left, 5, "i8") * 2, "isend/irecv")
check(st.tag, 9, "irecv tag")
# irecv; isend; wait the send first: must not deadlock (1 MiB: MPI's rendezvous protocol)
big_in = np.empty(1 << 17)
big_req = comm.irecv(big_in, left, 6)
comm.isend(data(r, 1 << 17), right, 6).wait()
big_req.wait()
check(big_in, data(left, 1 << 17), "irecv before a waited isend")
if p > 1:  # under MPI a blocking send to oneself may wait for its receive
    comm.send(np.arange(3.0), right, 8)
    check(comm.recv(np.empty(3), left, 8).nbytes, 24, "send then recv")
# ordering between posted receives: two receives from one source, same tag
a, b = np.empty(2), np.empty(2)
ra, rb = comm.irecv(a, left, 4), comm.irecv(b, left, 4)
comm.send(np.array([1.0, r]), right, 4)
comm.send(np.array([2.0, r]), right, 4)
ringworld.wait_all([rb, ra], timeout=30)
check((a, b), ([1.0, left], [2.0, left]), "receive order")
# truncation leaves the buffer untouched
small = np.full(2, -1.0)
comm.send(np.arange(4.0), right, 5)
try:
    comm.recv(small, left, 5)
except ringworld.TruncationError as exc:
    check((exc.message_bytes, exc.buffer_bytes), (32, 16), "truncation sizes")
    check(small, [-1.0, -1.0], "truncated buffer untouched")
else:
    raise AssertionError("no TruncationError")
# a receive that times out raises Timeout and is withdrawn
try:
    comm.recv(small, left, 77, timeout=0.2)
except ringworld.Timeout:
    checks += 1
else:
    raise AssertionError("no Timeout")
# probe, objects
comm.send_obj({"from": r, "arr": data(r, 3)}, right, tag=11)
st = comm.probe(left, 11, timeout=30)
check(st.source, left, "probe source")
obj = comm.recv_obj(left, 11, timeout=30)
check(obj["from"], left, "send_obj/recv_obj")
check(obj["arr"], data(left, 3), "send_obj/recv_obj array")
ireq = comm.irecv_obj(left, 12)
comm.isend_obj(("x", r), right, 12).wait()
check(ireq.wait(timeout=30), ("x", left), "isend_obj/irecv_obj")
check(comm.sendrecv_obj([r], right, left), [left], "sendrecv_obj")
check(comm.iprobe(left, 999) is None, True, "iprobe none")

# ---------------------------------------------------------------- collectives
n = 7
allx = np.stack([data(q, n) for q in range(p)])
comm.barrier()
comm.ibarrier().wait()
buf = data(r, n) if r == 1 % p else np.zeros(n)
comm.bcast(buf, root=1 % p)
check(buf, data(1 % p, n), "bcast")
buf = np.zeros(n) if r else data(0, n)
comm.ibcast(buf, 0).wait()
check(buf, data(0, n), "ibcast")

out = np.empty(n)
comm.allreduce(data(r, n), out)
check(out, allx.sum(0), "allreduce sum")
for op, ref in ((ringworld.MAX, allx.max(0)), (ringworld.MIN, allx.min(0)),
                (ringworld.PROD, allx.prod(0)), ("sum", allx.sum(0))):
    comm.iallreduce(data(r, n), out, op).wait()
    check(out, ref, f"iallreduce {op}")
ints = np.stack([data(q, n, "i4") for q in range(p)])
o32 = np.empty(n, dtype=np.int32)
comm.allreduce(data(r, n, "i4"), o32, ringworld.BXOR)
check(o32, np.bitwise_xor.reduce(ints, 0), "allreduce bxor")
h = np.empty(n, dtype=np.float16)
comm.allreduce(data(r, n, "f2"), h)
check(h, allx.sum(0).astype(np.float16), "allreduce float16 (numpy op)")
inplace = data(r, n)
comm.allreduce(IN_PLACE, inplace)
check(inplace, allx.sum(0), "allreduce in place")
same = data(r, n)  # one array as both buffers: what IN_PLACE hands the algorithms
comm.allreduce(same, same)
check(same, allx.sum(0), "allreduce of one array as both buffers")
# user op, associative but not commutative: 2x2 matrix product, one matrix per element
mat = np.dtype([("a", "f8"), ("b", "f8"), ("c", "f8"), ("d", "f8")])


def matmul(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    out["a"] = x["a"] * y["a"] + x["b"] * y["c"]
    out["b"] = x["a"] * y["b"] + x["b"] * y["d"]
    out["c"] = x["c"] * y["a"] + x["d"] * y["c"]
    out["d"] = x["c"] * y["b"] + x["d"] * y["d"]
    return out


def mine_mats(rank: int) -> np.ndarray:
    return np.array([(rank + 1.0, 1.0, 0.0, 1.0), (2.0, 0.0, rank, 1.0)], dtype=mat)


nc = Op.create(matmul, commutative=False)
res = np.empty(2, dtype=mat)
comm.allreduce(mine_mats(r), res, nc)
want_m = mine_mats(0)
for q in range(1, p):
    want_m = matmul(want_m, mine_mats(q))
check(res.tolist(), want_m.tolist(), "non-commutative user op in rank order")
pair = np.dtype([("v", "f8"), ("i", "i4")])
mine = np.array([(float((r * 3) % p), r)], dtype=pair)
best = np.empty(1, dtype=pair)
comm.allreduce(mine, best, ringworld.MAXLOC)
vals = [float((q * 3) % p) for q in range(p)]
check((best["v"][0], best["i"][0]), (max(vals), vals.index(max(vals))), "maxloc")

root = p - 1
rbuf = np.empty(n) if r == root else None
comm.reduce(data(r, n), rbuf, ringworld.SUM, root=root)
if r == root:
    check(rbuf, allx.sum(0), "reduce")
rbuf2 = data(r, n) if r == 0 else None
comm.ireduce(IN_PLACE if r == 0 else data(r, n), rbuf2, "max", 0).wait()
if r == 0:
    check(rbuf2, allx.max(0), "ireduce in place")

blk = np.empty(3)
comm.reduce_scatter_block(data(r, 3 * p), blk)
check(blk, np.stack([data(q, 3 * p) for q in range(p)]).sum(0)[3 * r: 3 * r + 3], "rsb")
counts = [q + 1 for q in range(p)]
rs = np.empty(counts[r])
comm.ireduce_scatter(data(r, sum(counts)), rs, counts).wait()
full = np.stack([data(q, sum(counts)) for q in range(p)]).sum(0)
check(rs, full[sum(counts[:r]): sum(counts[: r + 1])], "ireduce_scatter")

sc = np.empty(n)
comm.scan(data(r, n), sc)
check(sc, allx[: r + 1].sum(0), "scan")
ex = np.full(n, -5.0)
comm.iexscan(data(r, n), ex).wait()
check(ex, np.full(n, -5.0) if r == 0 else allx[:r].sum(0), "exscan (rank 0 untouched)")

g = np.empty(n * p) if r == root else None
comm.gather(data(r, n), g, root=root)
if r == root:
    check(g, allx.reshape(-1), "gather")
gv_counts = [q + 2 for q in range(p)]
gv = np.empty(sum(gv_counts)) if r == 0 else None
comm.igatherv(data(r, gv_counts[r]), gv, gv_counts if r == 0 else None, root=0).wait()
if r == 0:
    check(gv, np.concatenate([data(q, gv_counts[q]) for q in range(p)]), "igatherv")
s = np.empty(n)
comm.scatter(allx.reshape(-1) if r == 0 else None, s, root=0)
check(s, data(r, n), "scatter")
sv = np.empty(gv_counts[r])
src = np.concatenate([data(q, gv_counts[q]) for q in range(p)])
comm.iscatterv(src if r == root else None, sv, gv_counts if r == root else None,
               root=root).wait()
check(sv, data(r, gv_counts[r]), "iscatterv")
ag = np.empty(n * p)
comm.allgather(data(r, n), ag)
check(ag, allx.reshape(-1), "allgather")
agv = np.empty(sum(gv_counts))
comm.iallgatherv(data(r, gv_counts[r]), agv, gv_counts).wait()
check(agv, src, "iallgatherv")
a2a = np.empty(2 * p, dtype=np.int16)
comm.alltoall(data(r, 2 * p, "i2"), a2a)
check(a2a, np.concatenate([data(q, 2 * p, "i2")[2 * r: 2 * r + 2] for q in range(p)]),
      "alltoall")
scounts = [q + 1 for q in range(p)]           # rank r sends q+1 elements to q
rcounts = [r + 1] * p                          # and receives r+1 from everyone
sendv = data(r, sum(scounts))
recvv = np.empty(sum(rcounts))
comm.ialltoallv(sendv, recvv, scounts, rcounts).wait()
want_v = np.concatenate([data(q, sum(scounts))[sum(scounts[:r]): sum(scounts[:r]) + r + 1]
                         for q in range(p)])
check(recvv, want_v, "ialltoallv")
sends = [np.full(q + 1, r * 10 + q, dtype=np.int32) for q in range(p)]
recvs = [np.empty(r + 1, dtype=np.int32) for _ in range(p)]
comm.alltoallw(sends, recvs)
check(np.concatenate(recvs), np.concatenate([np.full(r + 1, q * 10 + r) for q in range(p)]),
      "alltoallw")

# ---------------------------------------------------------------- in place, everywhere MPI has it
ip = np.stack([data(q, 3 * p) for q in range(p)]).sum(0)
b = data(r, 3 * p)
comm.reduce_scatter_block(IN_PLACE, b)
check(b[:3], ip[3 * r: 3 * r + 3], "rsb in place")
b = data(r, sum(counts))
comm.reduce_scatter(IN_PLACE, b, counts)
check(b[: counts[r]], full[sum(counts[:r]): sum(counts[: r + 1])], "reduce_scatter in place")
b = data(r, n)
comm.scan(IN_PLACE, b)
check(b, allx[: r + 1].sum(0), "scan in place")
b = data(r, n)
comm.exscan(IN_PLACE, b)
check(b, data(0, n) if r == 0 else allx[:r].sum(0), "exscan in place (rank 0 untouched)")
b = np.zeros(n * p)
b[r * n: (r + 1) * n] = data(r, n)
comm.allgather(IN_PLACE, b)
check(b, allx.reshape(-1), "allgather in place")
if r == root:
    b = np.zeros(n * p)
    b[r * n: (r + 1) * n] = data(r, n)
    comm.gather(IN_PLACE, b, root=root)
    check(b, allx.reshape(-1), "gather in place")
else:
    comm.gather(data(r, n), None, root=root)
if r == root:
    b = allx.reshape(-1).copy()
    comm.scatter(b, IN_PLACE, root=root)
    check(b, allx.reshape(-1), "scatter in place (the root's block stays)")
else:
    b = np.empty(n)
    comm.scatter(None, b, root=root)
    check(b, data(r, n), "scatter to a rank beside an in-place root")
b = data(r, 2 * p, "i2")
comm.alltoall(IN_PLACE, b)
check(b, np.concatenate([data(q, 2 * p, "i2")[2 * r: 2 * r + 2] for q in range(p)]),
      "alltoall in place")
b = data(r, 2 * p)
comm.alltoallv(IN_PLACE, b, None, [2] * p)
check(b, np.concatenate([data(q, 2 * p)[2 * r: 2 * r + 2] for q in range(p)]),
      "alltoallv in place")

# ---------------------------------------------------------------- objects
check(comm.bcast_obj({"k": r}, root=root), {"k": root}, "bcast_obj")
check(comm.gather_obj(r * 2, root=0), [q * 2 for q in range(p)] if r == 0 else None,
      "gather_obj")
check(comm.scatter_obj([f"s{q}" for q in range(p)] if r == 0 else None, 0), f"s{r}",
      "scatter_obj")
check(comm.allgather_obj(r), list(range(p)), "allgather_obj")
check(comm.alltoall_obj([(r, q) for q in range(p)]), [(q, r) for q in range(p)],
      "alltoall_obj")
check(comm.allreduce_obj(r + 1, ringworld.PROD), np.prod(range(1, p + 1)), "allreduce_obj")
check(comm.reduce_obj([r], "sum", root=0), list(range(p)) if r == 0 else None, "reduce_obj")
check(comm.scan_obj(r), sum(range(r + 1)), "scan_obj")
check(comm.exscan_obj(r) is None if r == 0 else comm.exscan_obj(r) == sum(range(r)), True,
      "exscan_obj")

# ---------------------------------------------------------------- communicators
d = comm.dup()
o = np.empty(1)
d.allreduce(np.array([1.0]), o)
check(o, [p], "dup allreduce")
half = comm.split(r % 2, key=-r)
assert half is not None
members = [q for q in range(p) if q % 2 == r % 2]
check(half.size, len(members), "split size")
check(half.rank, sorted(members, reverse=True).index(r), "split rank by key")
check(half.allgather_obj(r), sorted(members, reverse=True), "split allgather")
none = comm.split(None)
check(none is None, True, "split None")
sub = comm.create([p - 1, 0])
if r in (0, p - 1):
    assert sub is not None
    check(sub.rank, 0 if r == p - 1 else 1, "create order")
    check(sub.world_ranks, [p - 1, 0], "create world_ranks")
    sub.free()
else:
    check(sub is None, True, "create non-member")
me = comm.self_comm()
check(me.allgather_obj("me"), ["me"], "self_comm")
d.free()
try:
    d.barrier()
except ringworld.CommError:
    checks += 1
else:
    raise AssertionError("no CommError after free")
try:
    comm.send(b"x", dest=p)
except ValueError as exc:
    assert "dest" in str(exc)
    checks += 1
if on_mpi:
    check(comm.last_algorithm, "mpi", "last_algorithm")
comm.barrier()
print(f"CHECKS OK {r} {checks}", flush=True)
