"""The torch backend's worker thread: tasks run in order, and pending requests keep being tested
while tasks arrive from other threads (no process, no transport: fake requests)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("torch", reason="ringworld.torch needs PyTorch (pip install torch)")

from ringworld.errors import Timeout
from ringworld.torch._worker import Worker


class FakeRequest:
    """Completes on its ``after``-th test, or at once when ``gate`` is set."""

    def __init__(self, after: int, gate: threading.Event | None = None) -> None:
        self.after = after
        self.gate = gate
        self.tests = 0
        self.cancelled = False

    def test(self) -> bool:
        self.tests += 1
        return self.tests >= self.after or (self.gate is not None and self.gate.is_set())

    def wait(self) -> str:
        return f"done after {self.tests} tests"

    def cancel(self) -> bool:
        self.cancelled = True
        return True


@pytest.fixture
def w() -> Iterator[Worker]:
    """A worker of the test's own, stopped (its thread joined) afterwards."""
    worker = Worker()
    yield worker
    worker.stop()


def test_pending_requests_complete_while_tasks_keep_arriving(w: Worker) -> None:
    """Many short waits on the task queue, interleaved with submissions from another thread:
    the pattern in which a worker sleeping on a queue that never woke up hung a whole job."""
    finished: list[int] = []
    ran: list[int] = []
    lock = threading.Lock()
    n = 300

    def start(i: int) -> None:
        ran.append(i)

        def done(result: Any, error: BaseException | None) -> None:
            assert error is None and result.startswith("done")
            with lock:
                finished.append(i)

        # every third request waits for later tasks' polling; the rest finish quickly
        w.watch(FakeRequest(1 + (i % 3) * 40), done, None, f"fake {i}")

    def producer() -> None:
        for i in range(n):
            w.submit(lambda i=i: start(i))
            if i % 7 == 0:
                time.sleep(0.0003)  # let the worker fall into its timed waits

    t = threading.Thread(target=producer)
    t.start()
    t.join(30)
    deadline = time.monotonic() + 30
    while len(finished) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ran == list(range(n)), "tasks ran out of order"
    assert sorted(finished) == list(range(n)), f"{n - len(finished)} requests never completed"


def test_a_request_past_its_deadline_is_cancelled_and_reported(w: Worker) -> None:
    req = FakeRequest(10**9)
    got: list[BaseException | None] = []
    event = threading.Event()

    def done(result: Any, error: BaseException | None) -> None:
        got.append(error)
        event.set()

    w.submit(lambda: w.watch(req, done, 0.05, "stuck receive"))
    assert event.wait(10), "the worker never reported the expired request"
    assert isinstance(got[0], Timeout) and "stuck receive" in str(got[0])
    assert req.cancelled


def test_call_returns_the_result_after_earlier_tasks_and_stop_ends_the_thread() -> None:
    w = Worker()
    order: list[str] = []
    w.submit(lambda: order.append("first"))
    assert w.call(lambda: order.append("second") or len(order)) == 2
    with pytest.raises(ZeroDivisionError):
        w.call(lambda: 1 // 0)
    w.stop()
    assert not w.alive


def test_the_tcp_listener_follows_the_route_to_torchs_store() -> None:
    """world_over binds TCP where the ranks reach torch's TCPStore: its address is found
    under the PrefixStores torch wraps it in (a FileStore has none)."""
    from datetime import timedelta

    import torch.distributed as dist

    from ringworld.torch.store import store_address

    tcp = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=5),
                        wait_for_workers=False)
    wrapped = dist.PrefixStore("default_pg/", dist.PrefixStore("attempt_0/", tcp))
    assert store_address(wrapped) == f"127.0.0.1:{tcp.port}"
    assert store_address(dist.HashStore()) is None
