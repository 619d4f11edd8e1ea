"""Rank-side bodies of the torch backend tests (they run inside ranks forked by run_processes).

Every job starts the default group with ``init_method="ringworld://"``, runs its checks and
returns a list of one-line failures (empty: all good), so one job covers many calls and still
names exactly which went wrong. Data is a function of (contributing rank, index): different on
every rank and element, small integers so float sums are exact in any order.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

import ringworld

#: Timeout of the process group's operations inside a rank: a hang fails as a Timeout.
PG_TIMEOUT_S = 60
R = dist.ReduceOp


def data(rank: int, n: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    """Rank- and index-dependent values in 1..11 (no two neighbours equal, never constant)."""
    i = torch.arange(n, dtype=torch.int64)
    return ((i * 7 + rank * 3 + salt) % 11 + 1).to(dtype)


@contextmanager
def world() -> Iterator[tuple[int, int]]:
    """The default ringworld group for the body of a job: yields (rank, size), then tears down."""
    import datetime

    import ringworld.torch  # noqa: F401 - registers the backend

    torch.set_num_threads(1)
    dist.init_process_group("ringworld", init_method="ringworld://",
                            timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
    try:
        yield dist.get_rank(), dist.get_world_size()
    finally:
        dist.destroy_process_group()


class Checks:
    """Collects failures: ``same(what, got, expected)`` records a line when they differ."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.failures: list[str] = []

    def same(self, what: str, got: Any, expected: Any) -> None:
        if isinstance(got, torch.Tensor):
            ok = got.dtype == expected.dtype and torch.equal(got, expected)
        else:
            ok = got == expected
        if not ok:
            self.failures.append(f"rank {self.rank}: {what}: got {got!r}, expected {expected!r}")


# ------------------------------------------------------------------------ reductions
_REFERENCE: dict[Any, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    R.SUM: torch.add, R.PRODUCT: torch.mul, R.MIN: torch.minimum, R.MAX: torch.maximum,
    R.BAND: torch.bitwise_and, R.BOR: torch.bitwise_or, R.BXOR: torch.bitwise_xor,
}
#: (op, dtypes) exercised by the allreduce matrix.
REDUCTIONS = [
    (R.SUM, (torch.float32, torch.float64, torch.int64, torch.int8, torch.bfloat16,
             torch.float16)),
    (R.AVG, (torch.float32, torch.int32)),
    (R.PRODUCT, (torch.float64, torch.int64)),
    (R.MIN, (torch.float32, torch.int16)),
    (R.MAX, (torch.float32, torch.uint8)),
    (R.BAND, (torch.int64, torch.uint8)),
    (R.BOR, (torch.int32, torch.bool)),
    (R.BXOR, (torch.int64,)),
]


def reduced(op: Any, size: int, n: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    """What reducing ``data(r, n, dtype, salt)`` over ranks 0..size-1 with ``op`` gives."""
    if dtype == torch.bool:
        parts = [data(r, n, torch.int64, salt) % 2 == 0 for r in range(size)]
    else:
        parts = [data(r, n, torch.int64 if op != R.AVG else torch.float64, salt)
                 for r in range(size)]
    if op == R.AVG:
        total = sum(parts[1:], parts[0])
        if dtype.is_floating_point:
            return (total / size).to(dtype)
        return torch.div(total, size, rounding_mode="trunc").to(dtype)
    acc = parts[0]
    for x in parts[1:]:
        acc = _REFERENCE[op](acc, x)
    return acc.to(dtype)


def own(rank: int, n: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    """This rank's input for the reductions (bool: the even positions of ``data``)."""
    if dtype == torch.bool:
        return data(rank, n, torch.int64, salt) % 2 == 0
    return data(rank, n, dtype, salt)


def reductions_job(comm: ringworld.Communicator) -> list[str]:
    """allreduce for every (op, dtype) of REDUCTIONS, async and sync; reduce and
    allreduce_coalesced; reduce_scatter in list and tensor forms."""
    with world() as (rank, size):
        c = Checks(rank)
        n = 37
        for op, dtypes in REDUCTIONS:
            for dtype in dtypes:
                t = own(rank, n, dtype)
                dist.all_reduce(t, op=op)
                c.same(f"allreduce {op} {dtype}", t, reduced(op, size, n, dtype))
        # several in flight at once, completed in reverse order
        ts = [own(rank, n + k, torch.float32, salt=k) for k in range(4)]
        works = [dist.all_reduce(t, async_op=True) for t in ts]
        for w in reversed(works):
            w.wait()
        for k, t in enumerate(ts):
            c.same(f"async allreduce #{k}", t, reduced(R.SUM, size, n + k, torch.float32, k))
        for root in range(size):
            t = own(rank, n, torch.int64, salt=root)
            dist.reduce(t, dst=root, op=R.MAX)
            expected = (reduced(R.MAX, size, n, torch.int64, root) if rank == root
                        else own(rank, n, torch.int64, salt=root))
            c.same(f"reduce MAX root {root}", t, expected)
        parts = [own(rank, k + 3, torch.float64, salt=k) for k in range(3)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch deprecates the coalesced API
            dist.all_reduce_coalesced(parts, op=R.SUM)
        for k, t in enumerate(parts):
            c.same(f"allreduce_coalesced [{k}]", t, reduced(R.SUM, size, k + 3, torch.float64, k))
        # reduce_scatter (list of uneven inputs) and the tensor form
        sizes = [j + 2 for j in range(size)]
        ins = [own(rank, sizes[j], torch.int64, salt=j) for j in range(size)]
        out = torch.full((sizes[rank],), -1, dtype=torch.int64)
        dist.reduce_scatter(out, ins, op=R.SUM)
        c.same("reduce_scatter", out, reduced(R.SUM, size, sizes[rank], torch.int64, rank))
        whole = own(rank, 5 * size, torch.float32)
        out = torch.full((5,), -1.0)
        dist.reduce_scatter_single(out, whole, op=R.SUM)
        c.same("reduce_scatter_single", out,
               reduced(R.SUM, size, 5 * size, torch.float32)[5 * rank: 5 * rank + 5])
        out = torch.full((5,), -1.0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            dist.reduce_scatter_tensor(out, whole, op=R.AVG)
        c.same("reduce_scatter_tensor AVG", out,
               reduced(R.AVG, size, 5 * size, torch.float32)[5 * rank: 5 * rank + 5])
        return c.failures


# ------------------------------------------------------------------------ data movement
def movement_job(comm: ringworld.Communicator) -> list[str]:
    """broadcast from every root, allgather (list, uneven, into-tensor forms), gather, scatter,
    alltoall (list and single, even and split), barrier."""
    with world() as (rank, size):
        c = Checks(rank)
        for root in range(size):
            for dtype in (torch.float32, torch.bfloat16, torch.int64):
                t = data(rank, 19, dtype, salt=root) if rank == root else torch.zeros(19,
                                                                                      dtype=dtype)
                dist.broadcast(t, src=root)
                c.same(f"broadcast root {root} {dtype}", t, data(root, 19, dtype, salt=root))
        # allgather into separate tensors, then into chunks of one tensor (no copy path)
        outs = [torch.zeros(3, 2, dtype=torch.int32) for _ in range(size)]
        dist.all_gather(outs, data(rank, 6, torch.int32).view(3, 2))
        for j in range(size):
            c.same(f"all_gather [{j}]", outs[j], data(j, 6, torch.int32).view(3, 2))
        big = torch.zeros(size * 4)
        dist.all_gather(list(big.chunk(size)), data(rank, 4, torch.float32))
        c.same("all_gather chunks", big, torch.cat([data(j, 4, torch.float32)
                                                    for j in range(size)]))
        uneven = [torch.zeros(j + 1) for j in range(size)]
        dist.all_gather(uneven, data(rank, rank + 1, torch.float32))
        for j in range(size):
            c.same(f"all_gather uneven [{j}]", uneven[j], data(j, j + 1, torch.float32))
        expected = torch.cat([data(j, 5, torch.float64) for j in range(size)])
        out = torch.zeros(5 * size, dtype=torch.float64)
        dist.all_gather_single(out, data(rank, 5, torch.float64))
        c.same("all_gather_single", out, expected)
        out = torch.zeros(5 * size, dtype=torch.float64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            dist.all_gather_into_tensor(out, data(rank, 5, torch.float64))
        c.same("all_gather_into_tensor", out, expected)
        for root in range(size):
            lst = [torch.zeros(3) for _ in range(size)] if rank == root else None
            dist.gather(data(rank, 3, torch.float32, salt=root), lst, dst=root)
            if lst is not None:
                for j in range(size):
                    c.same(f"gather root {root} [{j}]", lst[j], data(j, 3, torch.float32, root))
            got = torch.zeros(4, dtype=torch.int64)
            src = [data(j, 4, torch.int64, salt=root) for j in range(size)]
            dist.scatter(got, src if rank == root else None, src=root)
            c.same(f"scatter root {root}", got, data(rank, 4, torch.int64, salt=root))
        # alltoall: block (i -> j) has j + i + 1 elements, value data(i * size + j, ...)
        ins = [data(rank * size + j, j + rank + 1, torch.float32) for j in range(size)]
        outs = [torch.zeros(rank + i + 1) for i in range(size)]
        dist.all_to_all(outs, ins)
        for i in range(size):
            c.same(f"all_to_all from {i}", outs[i], data(i * size + rank, rank + i + 1,
                                                         torch.float32))
        src = torch.cat([data(rank * size + j, 2, torch.int64) for j in range(size)]).view(-1, 2)
        out = torch.zeros(size, 2, dtype=torch.int64)
        dist.all_to_all_single(out, src)
        c.same("all_to_all_single", out,
               torch.cat([data(i * size + rank, 2, torch.int64) for i in range(size)]).view(-1, 2))
        # rows split unevenly: rank i sends j + 1 rows of width 3 to rank j
        in_splits = [j + 1 for j in range(size)]
        out_splits = [rank + 1] * size
        src = torch.cat([data(rank * size + j, 3 * (j + 1), torch.float32)
                         for j in range(size)]).view(-1, 3)
        out = torch.zeros(sum(out_splits), 3)
        dist.all_to_all_single(out, src, out_splits, in_splits)
        c.same("all_to_all_single split", out,
               torch.cat([data(i * size + rank, 3 * (rank + 1), torch.float32)
                          for i in range(size)]).view(-1, 3))
        dist.barrier()
        w = dist.barrier(async_op=True)
        w.wait()
        c.same("barrier completed", w.is_completed(), True)
        return c.failures


# ------------------------------------------------------------------------ futures and p2p
def futures_job(comm: ringworld.Communicator) -> list[str]:
    """get_future with then-chains, Work state, and a collective issued from a callback."""
    with world() as (rank, size):
        c = Checks(rank)
        t = own(rank, 8, torch.float32)
        w = dist.all_reduce(t, async_op=True)
        fut = w.get_future().then(lambda f: f.value()[0] * 2)
        c.same("future then", fut.wait(), reduced(R.SUM, size, 8, torch.float32) * 2)
        c.same("work is_completed", w.is_completed(), True)
        c.same("work is_success", w.is_success(), True)
        # a callback (run on the backend's thread) that starts another collective and waits
        t2 = own(rank, 8, torch.float64, salt=1)

        def again(f: torch.futures.Future[Any]) -> torch.Tensor:
            dist.all_reduce(t2)
            return f.value()[0]

        out = dist.all_reduce(own(rank, 8, torch.float32, 2), async_op=True).get_future()
        c.same("callback result", out.then(again).wait(),
               reduced(R.SUM, size, 8, torch.float32, 2))
        c.same("collective in callback", t2, reduced(R.SUM, size, 8, torch.float64, 1))
        # a failing op: the error reaches wait() and the future
        bad = torch.zeros(4, 2).t()  # not contiguous: refused at the call
        try:
            dist.all_reduce(bad)
            c.failures.append(f"rank {rank}: non-contiguous tensor was accepted")
        except ValueError as exc:
            c.same("non-contiguous message", "contiguous" in str(exc), True)
        return c.failures


def p2p_job(comm: ringworld.Communicator) -> list[str]:
    """send/recv around a ring (irecv posted before send), isend/irecv with tags, a receive
    from any source, and a large message."""
    with world() as (rank, size):
        c = Checks(rank)
        if size == 1:
            return c.failures
        right, left = (rank + 1) % size, (rank - 1) % size
        got = torch.zeros(10)
        req = dist.irecv(got, src=left)
        dist.send(data(rank, 10, torch.float32), dst=right)
        req.wait()
        c.same("ring recv", got, data(left, 10, torch.float32))
        # two tags, received in the opposite order to sending
        a, b = torch.zeros(3, dtype=torch.int64), torch.zeros(3, dtype=torch.int64)
        s1 = dist.isend(data(rank, 3, torch.int64, 1), dst=right, tag=1)
        s2 = dist.isend(data(rank, 3, torch.int64, 2), dst=right, tag=2)
        r2 = dist.irecv(b, src=left, tag=2)
        r1 = dist.irecv(a, src=left, tag=1)
        for w in (r2, r1, s1, s2):
            w.wait()
        c.same("tag 1", a, data(left, 3, torch.int64, 1))
        c.same("tag 2", b, data(left, 3, torch.int64, 2))
        got = torch.zeros(4, dtype=torch.float64)
        ops = [dist.P2POp(dist.irecv, got, left),
               dist.P2POp(dist.isend, data(rank, 4, torch.float64, 3), right)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        c.same("batch_isend_irecv", got, data(left, 4, torch.float64, 3))
        # every rank but 0 sends to 0, which receives from any source
        if rank == 0:
            seen = set()
            for _ in range(size - 1):
                x = torch.zeros(2, dtype=torch.int64)
                src = dist.recv(x, tag=5)
                c.same(f"any-source data from {src}", x, data(src, 2, torch.int64))
                seen.add(src)
            c.same("any-source senders", seen, set(range(1, size)))
        else:
            dist.send(data(rank, 2, torch.int64), dst=0, tag=5)
        big = 3 << 20  # elements (12 MiB of float32): more than the transport's rings hold
        if rank == 0:
            dist.send(data(0, big, torch.float32), dst=size - 1)
        elif rank == size - 1:
            x = torch.zeros(big)
            dist.recv(x, src=0)
            c.same("large message", x, data(0, big, torch.float32))
        dist.barrier()
        return c.failures


def subgroup_job(comm: ringworld.Communicator) -> list[str]:
    """new_group over some ranks (ringworld backend) and over all (gloo), beside the default."""
    with world() as (rank, size):
        c = Checks(rank)
        members = list(range(0, size, 2))  # 0, 2, ...
        g = dist.new_group(members)
        if rank in members:
            t = own(rank, 6, torch.int64)
            dist.all_reduce(t, group=g)
            expected = sum((own(r, 6, torch.int64) for r in members[1:]), own(0, 6, torch.int64))
            c.same("subgroup allreduce", t, expected)
            c.same("subgroup rank", dist.get_rank(g), members.index(rank))
        t = own(rank, 6, torch.int64)
        dist.all_reduce(t)  # the default group still works after the subgroup's traffic
        c.same("default after subgroup", t, reduced(R.SUM, size, 6, torch.int64))
        gloo = dist.new_group(backend="gloo")
        t = own(rank, 6, torch.float32)
        dist.all_reduce(t, group=gloo)
        c.same("gloo beside ringworld", t, reduced(R.SUM, size, 6, torch.float32))
        return c.failures


def mismatch_job(comm: ringworld.Communicator, world_size: int) -> str:
    """init_process_group with a world_size that disagrees with Ringworld's: the error text."""
    import ringworld.torch  # noqa: F401

    try:
        dist.init_process_group("ringworld", init_method="ringworld://",
                                world_size=world_size, rank=comm.rank)
    except ValueError as exc:
        return str(exc)
    dist.destroy_process_group()
    return "no error"


# ------------------------------------------------------------------------ DDP
def train(group: Any, steps: int, hook: str | None = None) -> list[torch.Tensor]:
    """A small MLP trained with DDP over ``group`` (None: the default) from seed 0; the
    parameters after ``steps`` SGD steps. Each rank draws its own batches (seeded by rank).
    ``hook`` names one of torch's default DDP communication hooks (futures chained with then)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    # small buckets: several allreduces per step, overlapping the backward pass
    ddp = DistributedDataParallel(model, process_group=group, bucket_cap_mb=0.001)
    if hook is not None:
        ddp.register_comm_hook(group, getattr(default_hooks, hook))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(1000 + dist.get_rank())
    for _ in range(steps):
        x = torch.randn(16, 8, generator=gen)
        y = torch.randn(16, 4, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def ddp_job(comm: ringworld.Communicator, steps: int, hook: str | None = None) -> dict[str, Any]:
    """Train the same model with DDP on ringworld and on Gloo; compare the final weights."""
    with world():
        on_ringworld = train(None, steps, hook)
        gloo = dist.new_group(backend="gloo")
        on_gloo = train(gloo, steps, hook)
        start = train_start()
        return {
            "identical": all(torch.equal(a, b) for a, b in zip(on_ringworld, on_gloo,
                                                                strict=True)),
            "max_diff": max(float((a - b).abs().max()) for a, b in zip(on_ringworld, on_gloo,
                                                                        strict=True)),
            "moved": min(float((a - s).abs().max()) for a, s in zip(on_ringworld, start,
                                                                     strict=True)),
            "weights": [a.tolist() for a in on_ringworld],
        }


def train_start() -> list[torch.Tensor]:
    """The parameters the model of :func:`train` starts from."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    return [p.detach().clone() for p in model.parameters()]


def leaver_job(comm: ringworld.Communicator) -> str:
    """The last rank leaves after init; the others' allreduce must fail naming it, not hang.
    Returns the error's type and message (or "left" / "no error")."""
    import time

    with world() as (rank, size):
        if rank == size - 1:
            return "left"
        time.sleep(0.5)
        t = torch.ones(1000)
        try:
            dist.all_reduce(t)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return "no error"
