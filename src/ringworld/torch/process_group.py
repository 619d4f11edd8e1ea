"""``ProcessGroupRingworld``: torch.distributed's process group over a Ringworld communicator.

Each method checks its arguments on the calling thread (bad input raises there, at once),
takes zero-copy numpy views of the tensors, and queues the Ringworld call on the worker
(:mod:`ringworld.torch._worker`); it returns a :class:`~ringworld.torch.work.Work` at once.
Collectives run in call order, as torch requires of every rank; their buffers must not be
touched until the work is done. Point-to-point operations only start on the worker and
complete in the background, so ``irecv`` before ``send`` works as with Gloo.

Copies happen only where torch's argument lists do not map onto one Ringworld buffer: a list
of output tensors that are not back to back in memory (allgather, gather), a list of input
tensors (reduce_scatter, scatter), coalesced allreduce (one flat buffer for all tensors), and
reductions of dtypes numpy lacks (bfloat16: reduced in float32).
"""

from __future__ import annotations

import atexit
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ringworld.collective.communicator import Communicator
from ringworld.collective.markers import IN_PLACE
from ringworld.comm.requests import ANY_SOURCE, TAG_UB
from ringworld.torch import _convert as cv
from ringworld.torch import gpu
from ringworld.torch._worker import Worker
from ringworld.torch.work import Work

BACKEND_NAME = "ringworld"
Tensors = Sequence[torch.Tensor]


class ProcessGroupRingworld(dist.ProcessGroup):  # type: ignore[misc]  # torch's: Any to mypy
    """The process group torch gets from ``init_process_group(backend="ringworld")``.

    ``comm`` is this group's own communicator (its traffic never mixes with other groups' or
    the user's). ``timeout`` bounds every blocking step of an operation (None: no bound).
    ``close`` releases the world built for this group, if one was (see ``backend``).
    """

    def __init__(self, comm: Communicator, worker: Worker, timeout: float | None,
                 close: Callable[[], object] | None = None) -> None:
        super().__init__(comm.rank, comm.size)
        self.comm = comm
        self._worker = worker
        self._timeout = timeout
        self._closed = False
        self._close_world = close
        self._group_name = ""
        self._group_desc = ""

    # torch reads a ProcessGroup's name from its first registered backend; this one is its own
    # backend, so it keeps the name torch gives it (DeviceMesh, functional collectives and
    # torch.compile look groups up by name)
    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    @property
    def group_name(self) -> str:
        """The name torch gave this group (``_set_group_name``).

        Raises:
            RuntimeError: torch has not named it yet.
        """
        if not self._group_name:
            raise RuntimeError("ProcessGroup name not set")
        return self._group_name

    def _set_group_desc(self, desc: str) -> None:
        self._group_desc = desc

    @property
    def group_desc(self) -> str:
        """The description torch gave this group."""
        return self._group_desc

    def __repr__(self) -> str:
        return f"<ProcessGroupRingworld rank {self.comm.rank} of {self.comm.size}>"

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        """``"ringworld"``."""
        return BACKEND_NAME

    # ------------------------------------------------------------------ plumbing
    def _seconds(self, opts: Any) -> float | None:
        t = getattr(opts, "timeout", None)
        if isinstance(t, timedelta) and t.total_seconds() > 0:
            return t.total_seconds()
        return self._timeout

    def _queue(self, what: str, outputs: Any, body: Callable[[], None]) -> Work:
        """Queue ``body`` on the worker; its Work completes when it returns or raises."""
        if self._closed:
            raise RuntimeError(f"ringworld {what}: the process group has been shut down")
        work = Work(self._worker, what, outputs)

        def task() -> None:
            try:
                body()
            except BaseException as exc:
                work.finish(exc)
            else:
                work.finish()

        self._submit(what, work, task)
        return work

    def _submit(self, what: str, work: Work, task: Callable[[], None]) -> None:
        """Hand ``task`` to the worker; under torch's profiler, the operation shows as a
        ``ringworld:<what>`` span from the call until its work completes (as Gloo's
        ``gloo:<what>``). Cost without the profiler: one flag read."""
        if not torch.autograd._profiler_enabled():
            self._worker.submit(task)
            return
        with torch.profiler.record_function(f"ringworld:{what}") as span:
            self._worker.submit(task)
            # the span ends on the worker as the work completes; wait() also waits for that,
            # so a profiler stopped right after the call still holds the span
            work.after(span._call_end_callbacks_on_future(work.get_future()))

    def _reduction(self, t: torch.Tensor, op: Any, name: str,
                   run: Callable[[np.ndarray[Any, Any]], None]) -> Callable[[], None]:
        """A body that reduces tensor ``t`` in place with ``run(view)``, then applies AVG.

        dtypes numpy lacks are reduced through a float32 copy (made when the body runs).
        """
        o, avg = cv.reduce_op(op)
        n = self.comm.size
        if cv.has_numpy_dtype(t):
            a = cv.array(t, name)

            def body() -> None:
                run(a)
                if avg:
                    cv.divide(t, n)
        else:
            cv.check(t, name)

            def body() -> None:
                f = t.detach().float()
                run(f.numpy().reshape(-1))
                if avg:
                    f.div_(n)
                t.detach().copy_(f.view(t.shape))

        self._ops_ok(o, t, name)
        return body

    def _ops_ok(self, o: Any, t: torch.Tensor, name: str) -> None:
        if t.is_floating_point() and o.name in ("band", "bor", "bxor"):
            raise TypeError(f"op {o.name.upper()} needs an integer or bool {name}, got {t.dtype}")

    def _rank(self, r: int, name: str) -> int:
        if not 0 <= r < self.comm.size:
            raise ValueError(f"{name}={r} must be a rank of this group (0..{self.comm.size - 1})")
        return int(r)

    # ------------------------------------------------------------------ reductions
    def allreduce(self, tensors: Tensors, opts: Any = None) -> Work:
        """Reduce ``tensors[0]`` across the group, in place (SUM, PRODUCT, MIN, MAX, BAND, BOR,
        BXOR; AVG = SUM then divide). Cost: one Ringworld allreduce."""
        if gpu.on_gpu(tensors):
            return gpu.allreduce(self, tensors, opts)
        t = cv.one(tensors, "tensors")
        op = _op(opts)
        comm, timeout = self.comm, self._seconds(opts)
        o, _ = cv.reduce_op(op)
        body = self._reduction(t, op, "tensors[0]",
                               lambda a: comm.allreduce(IN_PLACE, a, o, timeout=timeout))
        return self._queue("allreduce", list(tensors), body)

    def allreduce_coalesced(self, tensors: Tensors, opts: Any = None) -> Work:
        """Allreduce several tensors of one dtype as one flat buffer (one call, two copies)."""
        if gpu.on_gpu(tensors):
            return gpu.allreduce_coalesced(self, tensors, opts)
        if not tensors:
            return self._queue("allreduce_coalesced", [], lambda: None)
        ts = [cv.check(t, f"tensors[{i}]") for i, t in enumerate(tensors)]
        cv.same_dtype(ts, ts[0].dtype, "tensors")
        op = _op(opts)
        comm, timeout = self.comm, self._seconds(opts)
        o, avg = cv.reduce_op(op)
        self._ops_ok(o, ts[0], "tensors")
        n = comm.size

        def body() -> None:
            flat = torch.cat([t.detach().reshape(-1) for t in ts])
            if not cv.has_numpy_dtype(flat):
                flat = flat.float()
            comm.allreduce(IN_PLACE, flat.numpy(), o, timeout=timeout)
            if avg:
                cv.divide(flat, n)
            cv.unpack(flat, ts)

        return self._queue("allreduce_coalesced", list(tensors), body)

    def reduce(self, tensors: Tensors, opts: Any = None) -> Work:
        """Reduce ``tensors[0]`` of every rank into the root's (``opts.rootRank``), in place."""
        if gpu.on_gpu(tensors):
            return gpu.reduce(self, tensors, opts)
        t = cv.one(tensors, "tensors")
        root = self._rank(int(opts.rootRank) if opts is not None else 0, "root")
        op = _op(opts)
        comm, timeout = self.comm, self._seconds(opts)
        o, _ = cv.reduce_op(op)
        me = comm.rank

        def run(a: np.ndarray[Any, Any]) -> None:
            if me == root:
                comm.reduce(IN_PLACE, a, o, root, timeout=timeout)
            else:
                comm.reduce(a, None, o, root, timeout=timeout)

        if me != root:  # only the root's tensor changes (and is averaged)
            self._ops_ok(o, t, "tensors[0]")
            a = cv.array(t, "tensors[0]") if cv.has_numpy_dtype(t) else None

            def body() -> None:
                run(a if a is not None else t.detach().float().numpy().reshape(-1))

            return self._queue("reduce", list(tensors), body)
        return self._queue("reduce", list(tensors), self._reduction(t, op, "tensors[0]", run))

    def reduce_scatter(self, output_tensors: Tensors, input_tensors: Sequence[Tensors],
                       opts: Any = None) -> Work:
        """Reduce the ranks' ``input_tensors[0]`` lists elementwise; rank i gets entry i."""
        if gpu.on_gpu(output_tensors, *input_tensors):
            if len(input_tensors) != 1 or len(output_tensors) != 1:
                raise ValueError("reduce_scatter takes one output tensor and one input list")
            return gpu.reduce_scatter(self, output_tensors[0], input_tensors[0], opts)
        out = cv.one(output_tensors, "output_tensors")
        if len(input_tensors) != 1:
            raise ValueError(f"input_tensors must hold one list, got {len(input_tensors)}")
        ins = [cv.check(t, f"input_tensors[0][{i}]") for i, t in enumerate(input_tensors[0])]
        self._per_rank(ins, "input_tensors[0]")
        cv.same_dtype(ins, out.dtype, "input_tensors[0]")
        counts = [t.numel() for t in ins]
        if counts[self.comm.rank] != out.numel():
            raise ValueError(f"output has {out.numel()} elements but input_tensors[0]"
                             f"[{self.comm.rank}] has {counts[self.comm.rank]}")
        comm, timeout = self.comm, self._seconds(opts)
        o, _ = cv.reduce_op(_op(opts))
        whole = cv.span(ins)

        def run(a: np.ndarray[Any, Any]) -> None:
            flat = whole if whole is not None else torch.cat([t.detach().reshape(-1)
                                                               for t in ins])
            if not cv.has_numpy_dtype(flat):
                flat = flat.float()
            comm.reduce_scatter(flat.detach().numpy(), a, counts, o, timeout=timeout)

        body = self._reduction(out, _op(opts), "output_tensors[0]", run)
        return self._queue("reduce_scatter", list(output_tensors), body)

    def reduce_scatter_single(self, output: torch.Tensor, input_: torch.Tensor,
                              opts: Any = None) -> Work:
        """Reduce ``input`` (size x output's elements) across ranks; rank i gets block i."""
        if gpu.on_gpu([output, input_]):
            return gpu.reduce_scatter_single(self, output, input_, opts)
        self._blocks(output, input_, "output", "input")
        comm, timeout = self.comm, self._seconds(opts)
        o, _ = cv.reduce_op(_op(opts))
        if cv.has_numpy_dtype(input_):
            src = cv.array(input_, "input")

            def run(a: np.ndarray[Any, Any]) -> None:
                comm.reduce_scatter_block(src, a, o, timeout=timeout)
        else:
            def run(a: np.ndarray[Any, Any]) -> None:
                comm.reduce_scatter_block(input_.detach().float().numpy().reshape(-1), a, o,
                                          timeout=timeout)

        body = self._reduction(output, _op(opts), "output", run)
        return self._queue("reduce_scatter_single", [output], body)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs: Tensors, inputs: Tensors,
                                        opts: Any = None) -> Work:
        """:meth:`reduce_scatter_single` on each pair, in one work."""
        return self._each("reduce_scatter_coalesced", outputs, inputs,
                          lambda o, i: self.reduce_scatter_single(o, i, opts))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # ------------------------------------------------------------------ data movement
    def broadcast(self, tensors: Tensors, opts: Any = None) -> Work:
        """Copy the root's ``tensors[0]`` into every rank's (root: ``opts.rootRank``)."""
        if gpu.on_gpu(tensors):
            return gpu.broadcast(self, tensors, opts)
        t = cv.one(tensors, "tensors")
        root = self._rank(int(opts.rootRank) if opts is not None else 0, "root")
        if opts is not None and int(opts.rootTensor) != 0:
            raise ValueError(f"rootTensor={opts.rootTensor}: only one tensor per rank")
        a = cv.array(t, "tensors[0]")
        comm, timeout = self.comm, self._seconds(opts)
        return self._queue("broadcast", list(tensors),
                           lambda: comm.bcast(a, root, timeout=timeout))

    def allgather(self, output_tensors: Sequence[Tensors], input_tensors: Tensors,
                  opts: Any = None) -> Work:
        """Every rank's ``input_tensors[0]`` into ``output_tensors[0][rank]`` on every rank."""
        if gpu.on_gpu(input_tensors, *output_tensors):
            if len(input_tensors) != 1 or len(output_tensors) != 1:
                raise ValueError("allgather takes one input tensor and one output list")
            return gpu.allgather(self, output_tensors[0], input_tensors[0], opts)
        inp = cv.one(input_tensors, "input_tensors")
        if len(output_tensors) != 1:
            raise ValueError(f"output_tensors must hold one list, got {len(output_tensors)}")
        outs = [cv.check(t, f"output_tensors[0][{i}]") for i, t in enumerate(output_tensors[0])]
        self._per_rank(outs, "output_tensors[0]")
        cv.same_dtype(outs, inp.dtype, "output_tensors[0]")
        counts = [t.numel() for t in outs]
        if counts[self.comm.rank] != inp.numel():
            raise ValueError(f"input has {inp.numel()} elements but output_tensors[0]"
                             f"[{self.comm.rank}] has {counts[self.comm.rank]}")
        src = cv.array(inp, "input_tensors[0]")
        comm, timeout = self.comm, self._seconds(opts)
        whole = cv.span(outs)

        def body() -> None:
            flat = whole if whole is not None else torch.empty(sum(counts), dtype=inp.dtype)
            comm.allgatherv(src, cv.array(flat, "output"), counts, timeout=timeout)
            if whole is None:
                cv.unpack(flat, outs)

        return self._queue("allgather", output_tensors, body)

    def all_gather_single(self, output: torch.Tensor, input_: torch.Tensor,
                          opts: Any = None) -> Work:
        """Every rank's ``input`` into block ``rank`` of ``output`` (size x input's elements)."""
        if gpu.on_gpu([output, input_]):
            return gpu.all_gather_single(self, output, input_, opts)
        self._blocks(input_, output, "input", "output")
        src, dst = cv.array(input_, "input"), cv.array(output, "output")
        comm, timeout = self.comm, self._seconds(opts)
        return self._queue("all_gather_single", [output],
                           lambda: comm.allgather(src, dst, timeout=timeout))

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs: Tensors, inputs: Tensors,
                                    opts: Any = None) -> Work:
        """:meth:`all_gather_single` on each pair, in one work."""
        return self._each("all_gather_coalesced", outputs, inputs,
                          lambda o, i: self.all_gather_single(o, i, opts))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def allgather_coalesced(self, output_lists: Sequence[Tensors], input_tensors: Tensors,
                            opts: Any = None) -> Work:
        """:meth:`allgather` of each input tensor into its list, in one work."""
        return self._each("allgather_coalesced", output_lists, input_tensors,
                          lambda o, i: self.allgather([o], [i], opts))

    def gather(self, output_tensors: Sequence[Tensors], input_tensors: Tensors,
               opts: Any = None) -> Work:
        """Every rank's ``input_tensors[0]`` into the root's ``output_tensors[0]`` list."""
        inp = cv.one(input_tensors, "input_tensors")
        root = self._rank(int(opts.rootRank) if opts is not None else 0, "root")
        src = cv.array(inp, "input_tensors[0]")
        comm, timeout = self.comm, self._seconds(opts)
        if comm.rank != root:
            return self._queue("gather", [], lambda: comm.gatherv(src, None, root=root,
                                                                   timeout=timeout))
        if len(output_tensors) != 1:
            raise ValueError(f"output_tensors must hold one list at the root, "
                             f"got {len(output_tensors)}")
        outs = [cv.check(t, f"output_tensors[0][{i}]") for i, t in enumerate(output_tensors[0])]
        self._per_rank(outs, "output_tensors[0]")
        cv.same_dtype(outs, inp.dtype, "output_tensors[0]")
        counts = [t.numel() for t in outs]
        whole = cv.span(outs)

        def body() -> None:
            flat = whole if whole is not None else torch.empty(sum(counts), dtype=inp.dtype)
            comm.gatherv(src, cv.array(flat, "output"), counts, root=root, timeout=timeout)
            if whole is None:
                cv.unpack(flat, outs)

        return self._queue("gather", output_tensors, body)

    def scatter(self, output_tensors: Tensors, input_tensors: Sequence[Tensors],
                opts: Any = None) -> Work:
        """Entry i of the root's ``input_tensors[0]`` into rank i's ``output_tensors[0]``."""
        out = cv.one(output_tensors, "output_tensors")
        root = self._rank(int(opts.rootRank) if opts is not None else 0, "root")
        dst = cv.array(out, "output_tensors[0]")
        comm, timeout = self.comm, self._seconds(opts)
        if comm.rank != root:
            return self._queue("scatter", list(output_tensors),
                               lambda: comm.scatterv(None, dst, None, root=root,
                                                     timeout=timeout))
        if len(input_tensors) != 1:
            raise ValueError(f"input_tensors must hold one list at the root, "
                             f"got {len(input_tensors)}")
        ins = [cv.check(t, f"input_tensors[0][{i}]") for i, t in enumerate(input_tensors[0])]
        self._per_rank(ins, "input_tensors[0]")
        cv.same_dtype(ins, out.dtype, "input_tensors[0]")
        counts = [t.numel() for t in ins]
        whole = cv.span(ins)

        def body() -> None:
            flat = whole if whole is not None else torch.cat([t.detach().reshape(-1)
                                                               for t in ins])
            comm.scatterv(cv.array(flat, "input"), dst, counts, root=root, timeout=timeout)

        return self._queue("scatter", list(output_tensors), body)

    def alltoall(self, output_tensors: Tensors, input_tensors: Tensors,
                 opts: Any = None) -> Work:
        """``input_tensors[j]`` of rank i into ``output_tensors[i]`` of rank j (no copies)."""
        if gpu.on_gpu(output_tensors, input_tensors):
            return gpu.alltoall(self, output_tensors, input_tensors, opts)
        outs = [cv.check(t, f"output_tensors[{i}]") for i, t in enumerate(output_tensors)]
        ins = [cv.check(t, f"input_tensors[{i}]") for i, t in enumerate(input_tensors)]
        self._per_rank(outs, "output_tensors")
        self._per_rank(ins, "input_tensors")
        if ins:
            cv.same_dtype(outs, ins[0].dtype, "output_tensors")
            cv.same_dtype(ins, ins[0].dtype, "input_tensors")
        sends, recvs = cv.arrays(ins, "input_tensors"), cv.arrays(outs, "output_tensors")
        comm, timeout = self.comm, self._seconds(opts)
        return self._queue("alltoall", list(output_tensors),
                           lambda: comm.alltoallw(sends, recvs, timeout=timeout))

    def all_to_all_single(self, output: torch.Tensor, input_: torch.Tensor,
                          output_split_sizes: Sequence[int], input_split_sizes: Sequence[int],
                          opts: Any = None) -> Work:
        """Rows of ``input`` to every rank, in blocks of ``input_split_sizes`` (dim 0; empty:
        equal blocks); the blocks received land in ``output`` per ``output_split_sizes``."""
        if gpu.on_gpu([output, input_]):
            equal = not output_split_sizes and not input_split_sizes
            return gpu.all_to_all_single(
                self, output, input_,
                None if equal else _split_counts(input_, input_split_sizes, self.comm.size,
                                                 "input"),
                None if equal else _split_counts(output, output_split_sizes, self.comm.size,
                                                 "output"), opts)
        cv.check(output, "output")
        cv.check(input_, "input")
        if output.dtype != input_.dtype:
            raise TypeError(f"output has dtype {output.dtype} but input has {input_.dtype}")
        src, dst = cv.array(input_, "input"), cv.array(output, "output")
        comm, timeout = self.comm, self._seconds(opts)
        if not output_split_sizes and not input_split_sizes:
            if src.size != dst.size or src.size % comm.size:
                raise ValueError(f"input ({src.size} elements) and output ({dst.size}) must be "
                                 f"equal and divide into {comm.size} blocks")
            return self._queue("all_to_all_single", [output],
                               lambda: comm.alltoall(src, dst, timeout=timeout))
        sc = _split_counts(input_, input_split_sizes, comm.size, "input")
        rc = _split_counts(output, output_split_sizes, comm.size, "output")
        return self._queue("all_to_all_single", [output],
                           lambda: comm.alltoallv(src, dst, sc, rc, timeout=timeout))

    alltoall_base = all_to_all_single

    def barrier(self, opts: Any = None) -> Work:
        """Complete once every rank of the group has entered the barrier."""
        comm, timeout = self.comm, self._seconds(opts)
        return self._queue("barrier", [], lambda: comm.barrier(timeout=timeout))

    # ------------------------------------------------------------------ point to point
    def send(self, tensors: Tensors, dst: int, tag: int = 0) -> Work:
        """Send ``tensors[0]`` to rank ``dst`` with ``tag``; done once the buffer is reusable."""
        if gpu.on_gpu(tensors):
            raise gpu.refuse("send")
        t = cv.one(tensors, "tensors")
        dst = self._rank(dst, "dst")
        a = cv.array(t, "tensors[0]")
        tag = _tag(tag)
        return self._p2p("send", list(tensors), lambda: self.comm.isend(a, dst, tag))

    def recv(self, tensors: Tensors, src: int, tag: int = 0) -> Work:
        """Receive into ``tensors[0]`` from rank ``src`` with ``tag``."""
        if gpu.on_gpu(tensors):
            raise gpu.refuse("recv")
        t = cv.one(tensors, "tensors")
        src = self._rank(src, "src")
        a = cv.array(t, "tensors[0]")
        tag = _tag(tag)
        return self._p2p("recv", list(tensors), lambda: self.comm.irecv(a, src, tag))

    def recv_anysource(self, tensors: Tensors, tag: int = 0) -> Work:
        """Receive into ``tensors[0]`` from any rank; ``work._source_rank()`` names it."""
        if gpu.on_gpu(tensors):
            raise gpu.refuse("recv")
        t = cv.one(tensors, "tensors")
        a = cv.array(t, "tensors[0]")
        tag = _tag(tag)
        return self._p2p("recv", list(tensors), lambda: self.comm.irecv(a, ANY_SOURCE, tag))

    def _p2p(self, what: str, outputs: Any, start: Callable[[], Any]) -> Work:
        if self._closed:
            raise RuntimeError(f"ringworld {what}: the process group has been shut down")
        work = Work(self._worker, what, outputs)
        worker, timeout = self._worker, self._timeout

        def done(result: Any, error: BaseException | None) -> None:
            work.finish(error, result.source if result is not None else -1)

        def task() -> None:
            try:
                req = start()
            except BaseException as exc:
                work.finish(exc)
                return
            worker.watch(req, done, timeout, f"{what} on {self.comm.name}")

        self._submit(what, work, task)
        return work

    # ------------------------------------------------------------------ helpers
    def _per_rank(self, ts: Sequence[Any], name: str) -> None:
        if len(ts) != self.comm.size:
            raise ValueError(f"{name} must hold one tensor per rank ({self.comm.size}), "
                             f"got {len(ts)}")

    def _blocks(self, block: torch.Tensor, whole: torch.Tensor, bname: str, wname: str) -> None:
        cv.check(block, bname)
        cv.check(whole, wname)
        if block.dtype != whole.dtype:
            raise TypeError(f"{bname} has dtype {block.dtype} but {wname} has {whole.dtype}")
        if whole.numel() != block.numel() * self.comm.size:
            raise ValueError(f"{wname} has {whole.numel()} elements; expected {self.comm.size} "
                             f"x {block.numel()} ({bname}'s)")

    def _each(self, what: str, outputs: Sequence[Any], inputs: Sequence[Any],
              start: Callable[[Any, Any], Work]) -> Work:
        """Start ``start(out, in)`` per pair; one Work done when all are (the last queued)."""
        if len(outputs) != len(inputs):
            raise ValueError(f"{what}: {len(outputs)} outputs for {len(inputs)} inputs")
        works = [start(o, i) for o, i in zip(outputs, inputs, strict=True)]

        def body() -> None:  # queued after every part: they are done when it runs
            for w in works:
                err = w.exception()
                if err is not None:
                    raise err

        return self._queue(what, list(outputs), body)

    def shutdown(self) -> None:
        """Wait for the queued operations, then release the communicator (destroy_process_group
        calls this). Later operations raise RuntimeError."""
        if self._closed:
            return
        self._closed = True
        close = self._close_world
        if close is None:
            self._worker.call(self.comm.free)
            return
        self._close_world = None
        atexit.unregister(close)
        problem = self._worker.call(close)  # the world built for this group goes with it
        if problem:
            sys.stderr.write(f"ringworld: {problem}\n")

    def abort(self) -> None:
        """Stop accepting operations; those queued still run."""
        self._closed = True


def _op(opts: Any) -> Any:
    return opts.reduceOp if opts is not None else dist.ReduceOp.SUM


def _tag(tag: int) -> int:
    if not 0 <= tag <= TAG_UB:
        raise ValueError(f"tag={tag} must be in 0..{TAG_UB}")
    return int(tag)


def _split_counts(t: torch.Tensor, splits: Sequence[int], size: int, name: str) -> list[int]:
    """Element counts per rank of ``t`` split along dim 0 by ``splits`` (empty: equally)."""
    rows = t.shape[0] if t.dim() else 1
    row = t.numel() // rows if rows else 0
    if not splits:
        if rows % size:
            raise ValueError(f"{name} has {rows} rows, not divisible into {size} equal splits")
        return [rows // size * row] * size
    if len(splits) != size or any(s < 0 for s in splits) or sum(splits) != rows:
        raise ValueError(f"{name}_split_sizes={list(splits)} must be {size} non-negative "
                         f"sizes adding up to {rows} rows")
    return [int(s) * row for s in splits]
