"""Conformance suite for every Store, plus the TCP store's wire and security properties."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator

import pytest

from ringworld.auth import connect_handshake
from ringworld.errors import AuthenticationError, StoreError, StoreTimeout
from ringworld.store import (
    MemoryStore,
    PrefixStore,
    Store,
    TCPStore,
    TCPStoreServer,
    store_barrier,
    wire,
)

SECRET = b"conformance-secret-7f3a"

MakeClient = Callable[[], Store]


@pytest.fixture(params=["memory", "prefix", "tcp", "prefix-over-tcp"])
def make_client(request: pytest.FixtureRequest) -> Iterator[MakeClient]:
    """A factory of clients that all see one backing store; everything is closed afterwards."""
    opened: list[Store] = []
    server: TCPStoreServer | None = None
    if request.param in ("memory", "prefix"):
        shared = MemoryStore()
        opened.append(shared)

        def memory_client() -> Store:
            if request.param == "memory":
                return shared
            view = PrefixStore("job7", shared)
            opened.append(view)
            return view

        factory: MakeClient = memory_client
    else:
        server = TCPStoreServer(SECRET)
        host, port = server.start()

        def tcp_client() -> Store:
            client = TCPStore(host, port, SECRET, timeout=10.0)
            opened.append(client)
            if request.param == "tcp":
                return client
            return PrefixStore("job7", client)

        factory = tcp_client
    try:
        yield factory
    finally:
        for store in reversed(opened):
            store.close()
        if server is not None:
            server.close()


def run_threads(n: int, fn: Callable[[int], object], timeout: float = 30.0) -> list[object]:
    """Run ``fn(i)`` in ``n`` threads; re-raise the first failure; fail if any thread hangs."""
    results: list[object] = [None] * n
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            results[i] = fn(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(deadline - time.monotonic(), 0))
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise errors[0]
    return results


# ------------------------------------------------------------------------- conformance


def test_set_get_overwrite(make_client: MakeClient) -> None:
    s = make_client()
    s.set("alpha", b"\x00\x01binary\xff")
    assert s.get("alpha") == b"\x00\x01binary\xff"
    s.set("alpha", b"second")
    assert s.get("alpha", timeout=1.0) == b"second"
    s.set("empty", b"")
    assert s.get("empty", timeout=0) == b""
    s.set("ключ/ü", bytearray(b"from a bytearray"))
    assert s.get("ключ/ü") == b"from a bytearray"


def test_values_visible_to_other_clients(make_client: MakeClient) -> None:
    a, b = make_client(), make_client()
    a.set("shared", b"v1")
    assert b.get("shared", timeout=5) == b"v1"


def test_large_value_roundtrip(make_client: MakeClient) -> None:
    value = bytes(range(256)) * (8 << 12)  # 8 MiB, every byte position distinct mod 256
    a, b = make_client(), make_client()
    a.set("big", value)
    assert b.get("big", timeout=10) == value


def test_get_blocks_until_set(make_client: MakeClient) -> None:
    waiter, setter = make_client(), make_client()

    def later() -> None:
        time.sleep(0.2)
        setter.set("late", b"here")

    t = threading.Thread(target=later, daemon=True)
    t.start()
    start = time.monotonic()
    assert waiter.get("late", timeout=10) == b"here"
    assert time.monotonic() - start >= 0.15
    t.join(5)


def test_get_timeout_names_key_and_timeout(make_client: MakeClient) -> None:
    s = make_client()
    start = time.monotonic()
    with pytest.raises(StoreTimeout) as info:
        s.get("never-set", timeout=0.3)
    elapsed = time.monotonic() - start
    assert 0.25 <= elapsed < 5
    assert "never-set" in str(info.value)
    assert "0.3" in str(info.value)
    assert isinstance(info.value, TimeoutError)
    with pytest.raises(StoreTimeout):
        s.get("never-set", timeout=0)
    # The client stays usable after a timeout.
    s.set("after", b"ok")
    assert s.get("after") == b"ok"


def test_add_counts_atomically_from_zero(make_client: MakeClient) -> None:
    s = make_client()
    assert s.add("ctr", 5) == 5
    assert s.add("ctr", -2) == 3
    assert s.add("ctr", 0) == 3
    assert s.get("ctr") == b"3"
    s.set("text", b"not a number")
    with pytest.raises(StoreError, match="not an integer"):
        s.add("text", 1)
    assert s.add("ctr", 1) == 4


def test_add_wakes_getters(make_client: MakeClient) -> None:
    waiter, adder = make_client(), make_client()
    t = threading.Timer(0.1, adder.add, args=("woken", 7))
    t.start()
    try:
        assert waiter.get("woken", timeout=10) == b"7"
    finally:
        t.join(5)


def test_wait_for_several_keys(make_client: MakeClient) -> None:
    waiter, setter = make_client(), make_client()
    waiter.wait([], timeout=0)
    setter.set("k1", b"1")
    waiter.wait(["k1"], timeout=0)

    def later() -> None:
        time.sleep(0.1)
        setter.set("k2", b"2")
        time.sleep(0.1)
        setter.set("k3", b"3")

    t = threading.Thread(target=later, daemon=True)
    t.start()
    start = time.monotonic()
    waiter.wait(["k1", "k2", "k3", "k2"], timeout=10)
    assert time.monotonic() - start >= 0.15
    t.join(5)


def test_wait_timeout_names_missing_keys_only(make_client: MakeClient) -> None:
    s = make_client()
    s.set("present", b"x")
    with pytest.raises(StoreTimeout) as info:
        s.wait(["present", "absent-a", "absent-b"], timeout=0.2)
    text = str(info.value)
    assert "absent-a" in text
    assert "absent-b" in text
    assert "present" not in text


def test_concurrent_adds_from_threads(make_client: MakeClient) -> None:
    threads, per_thread = 16, 40
    clients = [make_client() for _ in range(threads)]

    def work(i: int) -> list[int]:
        return [clients[i].add("hits", 1) for _ in range(per_thread)]

    results = run_threads(threads, work)
    seen = sorted(v for r in results for v in r)  # type: ignore[attr-defined]
    assert seen == list(range(1, threads * per_thread + 1))
    assert clients[0].get("hits") == str(threads * per_thread).encode()


def test_one_client_shared_by_threads(make_client: MakeClient) -> None:
    s = make_client()

    def work(i: int) -> None:
        for j in range(30):
            s.set(f"t{i}/{j}", f"{i}:{j}".encode())
            assert s.get(f"t{i}/{j}", timeout=5) == f"{i}:{j}".encode()
            s.add("total", i)

    run_threads(8, work)
    assert s.get("total") == str(30 * sum(range(8))).encode()


def test_blocked_get_does_not_block_other_clients(make_client: MakeClient) -> None:
    blocked, other = make_client(), make_client()
    got: list[bytes] = []
    t = threading.Thread(target=lambda: got.append(blocked.get("gate", timeout=20)), daemon=True)
    t.start()
    time.sleep(0.1)
    start = time.monotonic()
    for i in range(20):
        other.set(f"free{i}", b"x")
        assert other.get(f"free{i}") == b"x"
    assert time.monotonic() - start < 2.0
    other.set("gate", b"open")
    t.join(10)
    assert got == [b"open"]


def test_a_huge_finite_timeout_waits_like_any_other(make_client: MakeClient) -> None:
    """A timeout of 1e17 s is valid (it is >= 0) but past what one sleep can take (time_t):
    the waiter still waits and wakes, and the store, the server included, keeps serving."""
    blocked, other = make_client(), make_client()
    got: list[bytes] = []
    t = threading.Thread(target=lambda: got.append(blocked.get("far", timeout=1e17)),
                         daemon=True)
    t.start()
    time.sleep(0.2)
    other.set("near", b"x")
    assert other.get("near", timeout=1e17) == b"x"
    other.wait(["near"], timeout=1e300)
    other.set("far", b"open")
    t.join(10)
    assert got == [b"open"]


def test_store_barrier_across_threads(make_client: MakeClient) -> None:
    n = 6
    clients = [make_client() for _ in range(n)]
    arrived: list[int] = []

    def work(i: int) -> None:
        arrived.append(i)
        store_barrier(clients[i], "b1", n, timeout=10)
        assert len(arrived) == n

    run_threads(n, work)


def test_bad_arguments(make_client: MakeClient) -> None:
    s = make_client()
    with pytest.raises(ValueError, match="timeout"):
        s.get("k", timeout=-1)
    with pytest.raises(TypeError):
        s.set(3, b"x")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        s.set("", b"x")
    with pytest.raises(TypeError):
        s.add("k", 1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        s.set("k", "text")  # type: ignore[arg-type]


def test_close_is_idempotent_and_final(make_client: MakeClient) -> None:
    s = make_client()
    s.set("k", b"v")
    s.close()
    s.close()
    with pytest.raises(StoreError):
        s.set("k", b"v")
    with pytest.raises(StoreError):
        s.get("k", timeout=0)


# ------------------------------------------------------------------------- memory / prefix


def test_memory_close_wakes_blocked_getter() -> None:
    s = MemoryStore()
    errors: list[BaseException] = []

    def blocked() -> None:
        try:
            s.get("never")
        except StoreError as exc:
            errors.append(exc)

    t = threading.Thread(target=blocked, daemon=True)
    t.start()
    time.sleep(0.1)
    s.close()
    t.join(5)
    assert not t.is_alive()
    assert len(errors) == 1


def test_prefix_scopes_keys() -> None:
    inner = MemoryStore()
    a, b = PrefixStore("a", inner), PrefixStore("b", inner)
    a.set("k", b"from a")
    b.set("k", b"from b")
    assert a.get("k") == b"from a"
    assert b.get("k") == b"from b"
    assert inner.get("a/k") == b"from a"
    assert a.add("n", 2) == 2
    assert b.add("n", 5) == 5
    with pytest.raises(StoreTimeout, match="a/missing"):
        a.get("missing", timeout=0)
    a.close()
    assert b.get("k") == b"from b"  # closing a view leaves the wrapped store open
    with pytest.raises(ValueError):
        PrefixStore("", inner)


# ------------------------------------------------------------------------- TCP specifics


@pytest.fixture
def server() -> Iterator[TCPStoreServer]:
    srv = TCPStoreServer(SECRET)
    srv.start()
    try:
        yield srv
    finally:
        srv.close()


def raw_authenticated(srv: TCPStoreServer) -> socket.socket:
    sock = socket.create_connection(srv.address, timeout=5)
    connect_handshake(sock, SECRET)
    return sock


def assert_closed_by_server(sock: socket.socket) -> None:
    sock.settimeout(5)
    try:
        data = sock.recv(1 << 16)
    except ConnectionResetError:
        return
    assert data == b"", f"expected the server to close the connection, got {data[:40]!r}"


def assert_server_healthy(srv: TCPStoreServer) -> None:
    host, port = srv.address
    with TCPStore(host, port, SECRET, timeout=5) as client:
        client.set("health", b"ok")
        assert client.get("health", timeout=5) == b"ok"


def test_wrong_secret_is_rejected_and_server_survives(server: TCPStoreServer) -> None:
    host, port = server.address
    with pytest.raises(AuthenticationError):
        TCPStore(host, port, b"not-the-secret", timeout=5)
    assert_server_healthy(server)


def test_garbage_before_authentication_is_rejected(server: TCPStoreServer) -> None:
    sock = socket.create_connection(server.address, timeout=5)
    with sock:
        sock.recv(24)  # the server's challenge
        sock.sendall(b"GET / HTTP/1.1\r\n" * 8)
        assert_closed_by_server(sock)
    assert_server_healthy(server)


def test_idle_unauthenticated_connection_does_not_hold_the_server(
    server: TCPStoreServer,
) -> None:
    idle = [socket.create_connection(server.address, timeout=5) for _ in range(5)]
    try:
        start = time.monotonic()
        assert_server_healthy(server)
        assert time.monotonic() - start < 2.0
    finally:
        for sock in idle:
            sock.close()


@pytest.mark.parametrize("field", ["value_len", "key_len", "nkeys"])
def test_oversized_length_is_rejected_without_allocation(
    server: TCPStoreServer, field: str,
) -> None:
    sock = raw_authenticated(server)
    with sock:
        value_len = 1 << 40 if field == "value_len" else 0
        nkeys = 1 << 31 if field == "nkeys" else 1
        op = wire.OP_WAIT if field == "nkeys" else wire.OP_SET
        header = wire.REQUEST.pack(
            wire.REQUEST_MAGIC, wire.VERSION, op, nkeys, value_len, -1.0, 0)
        key_len = (1 << 31) if field == "key_len" else 1
        tracemalloc.start()
        try:
            sock.sendall(header + key_len.to_bytes(4, "little") + b"k")
            assert_closed_by_server(sock)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 8 << 20, f"server allocated {peak} bytes for a rejected frame"
    assert_server_healthy(server)


def test_bad_magic_closes_only_that_connection(server: TCPStoreServer) -> None:
    host, port = server.address
    with TCPStore(host, port, SECRET, timeout=5) as bystander:
        bystander.set("before", b"1")
        sock = raw_authenticated(server)
        with sock:
            sock.sendall(b"\xde\xad\xbe\xef" * 16)
            assert_closed_by_server(sock)
        assert bystander.get("before", timeout=5) == b"1"


def test_version_mismatch_gets_an_error_reply(server: TCPStoreServer) -> None:
    sock = raw_authenticated(server)
    with sock:
        sock.sendall(wire.REQUEST.pack(
            wire.REQUEST_MAGIC, wire.VERSION + 1, wire.OP_GET, 1, 0, 0.0, 0))
        sock.settimeout(5)
        reply = b""
        while len(reply) < wire.RESPONSE.size:
            chunk = sock.recv(wire.RESPONSE.size - len(reply))
            assert chunk, "server closed without an error reply"
            reply += chunk
        magic, version, status, _, _ = wire.RESPONSE.unpack(reply)
        assert (magic, version, status) == (wire.RESPONSE_MAGIC, wire.VERSION, wire.STATUS_ERROR)
    assert_server_healthy(server)


def test_client_enforces_wire_bounds(server: TCPStoreServer) -> None:
    host, port = server.address
    with TCPStore(host, port, SECRET, timeout=5) as client:
        with pytest.raises(ValueError, match="limit"):
            client.set("k" * (wire.MAX_KEY_BYTES + 1), b"x")
        with pytest.raises(ValueError, match="64 bits"):
            client.add("k", 1 << 70)
        client.set("still-fine", b"y")


def test_counter_overflow_is_an_error(server: TCPStoreServer) -> None:
    host, port = server.address
    with TCPStore(host, port, SECRET, timeout=5) as client:
        client.add("big", (1 << 63) - 1)
        with pytest.raises(StoreError, match="overflow"):
            client.add("big", 1)
        assert client.add("big", -1) == (1 << 63) - 2


def test_hundreds_of_waiters_wake_on_one_set(server: TCPStoreServer) -> None:
    host, port = server.address
    n = 200
    clients = [TCPStore(host, port, SECRET, timeout=10) for _ in range(n)]
    try:
        timer = threading.Timer(0.5, lambda: clients[0].set("go", b"now"))
        timer.start()
        start = time.monotonic()
        results = run_threads(n - 1, lambda i: clients[i + 1].get("go", timeout=30), timeout=60)
        assert time.monotonic() - start >= 0.4
        assert results == [b"now"] * (n - 1)
        timer.join(5)
    finally:
        for c in clients:
            c.close()


def test_client_retries_until_the_server_starts() -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    srv = TCPStoreServer(SECRET, port=port)
    timer = threading.Timer(0.4, srv.start)
    timer.start()
    try:
        with TCPStore("127.0.0.1", port, SECRET, timeout=10) as client:
            client.set("k", b"v")
            assert client.get("k") == b"v"
    finally:
        timer.join(5)
        srv.close()


def test_unreachable_server_raises_store_error_from_oserror() -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    start = time.monotonic()
    with pytest.raises(StoreError) as info:
        TCPStore("127.0.0.1", port, SECRET, timeout=0.5)
    assert time.monotonic() - start < 5
    assert isinstance(info.value.__cause__, OSError)
    assert f"127.0.0.1:{port}" in str(info.value)


def test_server_close_fails_blocked_clients_and_is_idempotent() -> None:
    srv = TCPStoreServer(SECRET)
    host, port = srv.start()
    client = TCPStore(host, port, SECRET, timeout=10)
    errors: list[BaseException] = []

    def blocked() -> None:
        try:
            client.get("never")
        except StoreError as exc:
            errors.append(exc)

    t = threading.Thread(target=blocked, daemon=True)
    t.start()
    time.sleep(0.2)
    srv.close()
    srv.close()
    t.join(5)
    try:
        assert not t.is_alive()
        assert len(errors) == 1
        assert isinstance(errors[0].__cause__, OSError)
        with pytest.raises(StoreError):
            client.set("k", b"v")
    finally:
        client.close()
    with pytest.raises(StoreError):
        TCPStore(host, port, SECRET, timeout=0.3)


def test_client_close_wakes_its_own_blocked_request(server: TCPStoreServer) -> None:
    host, port = server.address
    client = TCPStore(host, port, SECRET, timeout=10)
    errors: list[BaseException] = []

    def blocked() -> None:
        try:
            client.get("never")
        except StoreError as exc:
            errors.append(exc)

    t = threading.Thread(target=blocked, daemon=True)
    t.start()
    time.sleep(0.1)
    client.close()
    t.join(5)
    assert not t.is_alive()
    assert len(errors) == 1 and "closed" in str(errors[0])
    assert_server_healthy(server)


def test_server_start_twice_and_address_before_start() -> None:
    srv = TCPStoreServer(SECRET)
    with pytest.raises(RuntimeError):
        _ = srv.address
    srv.start()
    try:
        with pytest.raises(StoreError):
            srv.start()
    finally:
        srv.close()
    with pytest.raises(ValueError):
        TCPStoreServer(b"")


def test_dropped_waiter_is_forgotten(server: TCPStoreServer) -> None:
    host, port = server.address
    with contextlib.ExitStack() as stack:
        quitter = TCPStore(host, port, SECRET, timeout=5)

        def blocked() -> None:
            with contextlib.suppress(StoreError):
                quitter.get("orphan")

        t = threading.Thread(target=blocked, daemon=True)
        t.start()
        time.sleep(0.1)
        quitter.close()
        t.join(5)
        stayer = stack.enter_context(TCPStore(host, port, SECRET, timeout=5))
        stayer.set("orphan", b"x")  # must not try to answer the dropped connection
        assert stayer.get("orphan") == b"x"
