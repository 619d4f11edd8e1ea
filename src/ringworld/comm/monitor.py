"""Heartbeats through the job store: find ranks that stop responding, and explain timeouts.

A daemon thread per rank, on a store connection of its own, every ``interval`` seconds:
- bumps this rank's heartbeat counter and publishes its state (what it waits for, the last
  collective it entered on each communicator);
- reads the heartbeat counters of the next few ranks (a ring of watchers: every rank is watched
  by up to :data:`WATCHERS` others, so the store load grows linearly with the job);
- declares a watched rank failed when its counter has not moved for ``liveness_timeout`` seconds
  (a stopped process, a cut link, a machine gone) and tells every rank through the store;
- hands failures found by any rank to the engine, whose waits then raise
  :class:`~ringworld.errors.PeerFailure` naming the rank.
A rank busy computing keeps beating (the thread runs whenever the interpreter switches threads),
so long computations between calls are not failures. Inside one long call that holds the GIL it
cannot beat; the ranks on its host then beat for it while /proc shows its process running (not
stopped), so only a stopped, vanished or cut-off rank goes silent. A rank that exits normally
says so first.

On a timeout, :meth:`Monitor.explain` reads every rank's published state, so the error says which
ranks entered the collective and which are missing, and what each of them is doing.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ringworld.comm.requests import SEQ_MASK, SIG_SHIFT, TAG_UB
from ringworld.errors import (
    CommError,
    CommRevoked,
    PeerFailure,
    RingworldError,
    Timeout,
)
from ringworld.store.base import Store
from ringworld.store.records import (
    DEAD_COUNT_KEY,
    DEAD_KEY,
    HISTORY,
    PREFIX,
    MismatchRecord,
    beat_key,
    fetch_states,
    format_states,
    get_json,
    left_record,
    mismatch_record,
    parse_mismatch,
    publish_failure,
    state_key,
    try_get,
)

WATCHERS = 3            # ranks each rank watches (the next ones in rank order)
TICK = 0.25             # seconds between looks for failures and revocations found elsewhere
#: a member whose call on a communicator is at most this many past this rank's went on from
#: it (more: the numbers wrapped, and it is behind)
AHEAD_BOUND = 1 << 20


def _process_state(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of process ``pid`` from /proc, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()  # after "pid (comm) "
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


class Monitor:
    """The heartbeat thread of one rank (see the module docstring).

    ``connect()`` opens the thread's own store connection. Cost: about ``3 + WATCHERS`` store
    round trips per interval per rank; nothing on the communication path.
    """

    def __init__(self, engine: Any, connect: Callable[[], Store], liveness_timeout: float,
                 interval: float | None = None) -> None:
        if liveness_timeout <= 0:
            raise ValueError(f"liveness_timeout={liveness_timeout!r} must be positive")
        self.engine = engine
        self.rank: int = engine.rank
        self.size: int = engine.size
        self.liveness = liveness_timeout
        self.interval = interval if interval is not None else min(1.0, liveness_timeout / 4)
        self._connect = connect
        self._store: Store | None = None
        self._stop = threading.Event()
        self._seen_failures = 0
        self._seen_revocations = 0
        self._seen_mismatches = 0
        self._declared: set[int] = set()
        self._gone: set[int] = set()  # ranks seen to have left the job (finished)
        self._history: deque[tuple[float, str]] = deque(maxlen=HISTORY)
        self._compare_after = self.interval  # seconds of a wait before comparing calls
        self._compare_wait: float | None = None  # the start of the wait that schedule is of
        self._behind: tuple[int, int, int, float] | None = None  # see _left_behind
        self._collecting = threading.Lock()  # _collect runs on the thread or in collect_now
        # this process's identity for same-host peers (see _alive_here): pid and start time
        self._pid = os.getpid()
        found = _process_state(self._pid)
        self._start = None if found is None else found[1]
        self._idents: dict[int, tuple[int, int]] = {}  # neighbours' identities, once read
        self._thread = threading.Thread(target=self._run, name="ringworld-monitor", daemon=True)
        self.error: BaseException | None = None  # why the thread stopped early, if it did

    @classmethod
    def attach(cls, engine: Any, connect: Callable[[], Store],
               liveness_timeout: float) -> Monitor:
        """Start a monitor for ``engine`` and make it the engine's fault-tolerance service
        (job-wide diagnosis of timeouts, published failures, agreements).

        Raises:
            StoreError: the store cannot be reached (the engine is closed first).
        """
        monitor = cls(engine, connect, liveness_timeout)
        try:
            monitor.start()
        except RingworldError:
            engine.close()
            raise
        engine.serve_with(monitor, monitor.explain)
        return monitor

    def start(self) -> None:
        """Connect and start beating; the first beat is published before this returns.

        Raises:
            StoreError: the store cannot be reached.
        """
        self._store = self._connect()
        self._beat(self._store)
        self._thread.start()

    def stop(self, exiting: bool = True) -> None:
        """Stop the thread; with ``exiting``, tell the others this rank left on purpose."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * self.interval + 1)
        store = self._store
        self._store = None
        if store is None:
            return
        try:
            if exiting:
                left: dict[str, Any] = {"exited": True}
                crashed = getattr(self.engine, "crashed", None)
                if crashed:
                    left["crashed"] = str(crashed)[:300]
                    peer = getattr(self.engine, "crashed_peer", None)
                    if isinstance(peer, int):
                        left["failed_peer"] = peer
                store.set(state_key(self.rank), json.dumps(left).encode())
        except RingworldError:
            pass
        finally:
            store.close()

    # ------------------------------------------------------------------ thread
    def _watched(self) -> list[int]:
        """The next WATCHERS ranks in rank order that are still in the job: a rank that has
        exited, failed or been declared is passed over, so a rank whose watchers have all
        finished is still watched by those left (a stopped rank among finished ones was found
        by nobody)."""
        gone = self._gone | self._declared | set(self.engine.dead)
        return [r for r in self._ring() if r not in gone][:WATCHERS]

    def _ring(self) -> list[int]:
        """The other ranks in rank order, starting after this one."""
        return [(self.rank + k) % self.size for k in range(1, self.size)]

    def _state(self) -> dict[str, Any]:
        e = self.engine
        names = e.comm_names
        entered = {f"{names.get(ctx, ctx)}": seq for ctx, seq in list(e.entered.items())}
        state: dict[str, Any] = {"t": time.time(), "entered": entered, "pid": self._pid,
                                 "start": self._start}
        call = self._call()
        if call is not None:
            state["call"] = call
        if e.background:  # nonblocking collectives in flight: earlier calls may not be done
            state["nb"] = len(e.background)
        waiting = e.waiting
        if waiting is not None:
            try:
                text = waiting()[:300]
            except Exception as exc:  # racing the main thread: report, never fail the beat
                text = f"(unavailable: {type(exc).__name__})"
            state["waiting"] = text
            state["since"] = e.waiting_since
            if not self._history or self._history[-1][1] != text:
                self._history.append((e.waiting_since, text))
        state["recent"] = list(self._history)
        return state

    def _call(self) -> list[Any] | None:
        """This rank's collective call in progress as [context, seq, signature text], or None
        (none entered, or one whose signature is not known: an unsigned call)."""
        e = self.engine
        cur = e.current
        if cur is None:
            return None
        ctx, seq = cur[0], cur[1]
        ref = e.call_describers.get(ctx)
        describe = None if ref is None else ref()
        if describe is not None:
            got = describe()
            if got is not None and got[0] == seq:
                return [ctx, seq, got[1]]
        tag = e.entered_tag.get(ctx)
        if tag is not None and tag & SEQ_MASK == seq:
            text = e.signatures.get(tag >> SIG_SHIFT)
            if text:
                return [ctx, seq, text]
        return None

    def _beat(self, store: Store) -> dict[str, Any]:
        state = self._state()
        store.add(beat_key(self.rank), 1)
        store.set(state_key(self.rank), json.dumps(state).encode())
        return state

    def _compare_calls(self, store: Store, state: dict[str, Any]) -> None:
        """While this rank waits long in a collective, find a member in the same call (same
        communicator and number) with another signature: the two ranks disagree on which
        collective they are in, and may both wait for good (a rank on the shared-memory path
        and one on the message path that only receives, say). Found, it breaks the sequence
        there on every rank, as a mismatch found by a receive does. Then look for a member
        the wait needs that is done with the call waited for (:meth:`_left_behind`).

        Checked after ``interval`` of a wait, then after twice as long each time, up to 30 s
        (a member may enter its call later); a new wait starts over. Cost: one store read per
        member each time.
        """
        e = self.engine
        since = e.waiting_since
        if "waiting" not in state or since != self._compare_wait:
            self._compare_wait = since if "waiting" in state else None
            self._compare_after = self.interval
            if "waiting" not in state:
                return
        if time.time() - since < self._compare_after:
            return
        self._compare_after = min(2 * self._compare_after, 30.0)
        read: dict[int, Any] = {}  # member -> its call now, read once
        mine = state.get("call")
        cur = e.current
        if mine is not None and cur is not None and cur[0] == mine[0]:
            ctx, seq, text = mine
            for member in cur[3]:
                if member == self.rank or member in e.dead:
                    continue
                theirs = read[member] = self._their_call(store, member)
                if theirs is not None and theirs[0] == ctx and theirs[1] == seq \
                        and theirs[2] != text:
                    other = str(theirs[2])
                    self.publish_mismatch(ctx, seq, text, member, other)
                    e.remote_mismatches.append((ctx, seq, self.rank, text, member, other))
                    return
        self._left_behind(store, mine, read)

    def _their_call(self, store: Store, member: int) -> tuple[int, int, Any, bool] | None:
        """``member``'s collective call in progress as (context, number, signature text,
        whether it has nonblocking collectives in flight), or None."""
        state = get_json(store, state_key(member), 0.5)
        theirs = state.get("call")
        if not (isinstance(theirs, list) and len(theirs) == 3
                and isinstance(theirs[0], int) and isinstance(theirs[1], int)):
            return None
        return theirs[0], theirs[1], theirs[2], bool(state.get("nb"))

    def _left_behind(self, store: Store, mine: list[Any] | None,
                     read: dict[int, Any]) -> None:
        """This rank waits in a collective call (blocking, or a nonblocking one's wait) for a
        message from a member that went on to a later call with nothing of this one in
        flight: it finished this call without sending it (their counts disagree: a block one
        of them counts as empty), and this rank would wait for good. Seen at two checks in a
        row of the same wait (a message just sent has landed by the second), it is a
        mismatch: published as one, every rank's calls from the waited one on fail, showing
        it. ``mine``: this rank's call in progress (its signature text is the waited call's
        where they are one); ``read``: members' calls already read at this check."""
        e = self.engine
        call = e.waiting_call  # (the wait of this call: not of another thread's)
        if call is None:
            self._behind = None
            return
        ctx, seq, since, awaits, members, text = call
        if text is None and mine is not None and mine[:2] == [ctx, seq]:
            text = mine[2]
        ahead: dict[int, int] = {}  # members done with the waited call: their call now
        for member in members if text else ():
            if member == self.rank or member in e.dead:
                continue
            theirs = read[member] if member in read else self._their_call(store, member)
            if theirs is not None and theirs[0] == ctx and not theirs[3] \
                    and 0 < (theirs[1] - seq) & TAG_UB < AHEAD_BOUND:
                ahead[member] = theirs[1]
        rank = None
        if ahead:
            try:
                rank = awaits(set(ahead))
            except Exception:  # racing the main thread's wait: look again at the next check
                rank = None
        if rank is None or rank not in ahead or text is None:
            self._behind = None
            return
        seen = (ctx, seq, rank, since)
        if self._behind != seen:
            self._behind = seen
            return
        self._behind = None
        other = (f"a call that ended without sending what world rank {self.rank} waits for, "
                 f"and went on to call #{ahead[rank]} (the ranks gave different counts, or "
                 f"made different calls)")
        self.publish_mismatch(ctx, seq, text, rank, other)
        e.remote_mismatches.append((ctx, seq, self.rank, text, rank, other))

    def _neighbours(self) -> list[int]:
        """The ranks on this rank's host that it vouches for: the next few in rank order."""
        hosts = self.engine.hosts
        if len(hosts) != self.size:
            return []
        return [r for r in self._ring() if hosts[r] == hosts[self.rank]][:WATCHERS]

    def _alive_here(self, store: Store, rank: int) -> bool | None:
        """Whether ``rank``'s process, on this host, exists and is not stopped (None: cannot
        tell, as when it published no process identity or runs in another pid namespace).
        Its published start time must match the process's, so a reused pid never vouches."""
        ident = self._idents.get(rank)
        if ident is None:
            state = get_json(store, state_key(rank), 0.5)
            pid, start = state.get("pid"), state.get("start")
            if not isinstance(pid, int) or not isinstance(start, int):
                return None
            ident = self._idents[rank] = (pid, start)
        got = _process_state(ident[0])
        if got is None or got[1] != ident[1]:
            return False  # gone (or another process with its pid)
        return got[0] not in "TtZX"  # stopped, traced, zombie or dead

    def _silence(self, store: Store, last: dict[int, tuple[int, float]], rank: int,
                 now: float) -> float:
        """Seconds since ``rank``'s heartbeat counter last moved (0 if it just did); ``last``
        keeps (counter, when seen moving) per rank. Cost: one store round trip."""
        count = store.add(beat_key(rank), 0)
        seen = last.get(rank)
        if seen is None or seen[0] != count:
            last[rank] = (count, now)
            return 0.0
        return now - seen[1]

    def _run(self) -> None:
        store = self._store
        assert store is not None
        watched = self._watched()
        # the ranks on this host it beats for when their beats stop while their process runs:
        # a rank inside one long call that holds the GIL (its monitor thread cannot run) is
        # busy, not failed; a stopped process gets no beats, nor does one on a host cut off
        # (this rank cannot reach the store either)
        local = self._neighbours()
        last: dict[int, tuple[int, float]] = {}
        prev = next_beat = time.monotonic()
        try:
            while not self._stop.wait(min(TICK, self.interval)):
                now = time.monotonic()
                if now - prev > self.liveness / 2:
                    last.clear()  # this rank itself was stopped: nobody's silence counts
                prev = now
                self._collect(store)
                if now < next_beat:
                    continue
                next_beat = now + self.interval
                self._compare_calls(store, self._beat(store))
                for r in dict.fromkeys([*local, *watched]):  # each rank looked at once
                    if r in self._declared or r in self.engine.dead or r in self._gone:
                        continue
                    silent = self._silence(store, last, r, now)
                    if (r in local and silent >= 2 * self.interval
                            and self._alive_here(store, r)):
                        last[r] = (store.add(beat_key(r), 1), now)  # busy: beat for it
                    elif r not in watched:
                        continue
                    elif silent >= 2 * self.interval and self._exited(store, r):
                        self._gone.add(r)  # it finished: watch the next rank instead
                    elif silent > self.liveness:
                        self._declare(store, r, silent)
                watched = self._watched()
        except RingworldError as exc:
            if not self._stop.is_set():
                # the store does not answer: this rank is cut off, or the launcher is gone;
                # its waits raise instead of waiting for what it can no longer learn
                self.error = exc
                self.engine.lose(exc)

    def _exited(self, store: Store, rank: int) -> bool:
        return bool(get_json(store, state_key(rank), 0.5).get("exited"))

    def _declare(self, store: Store, rank: int, silent: float) -> None:
        self._declared.add(rank)
        detail = (f"not responding: no heartbeat for {silent:.1f} s (liveness timeout "
                  f"{self.liveness:g} s; stopped, hung in native code, or cut off)")
        publish_failure(store, rank, detail, self.rank)

    def collect_now(self) -> None:
        """Take in what other ranks published (failures, mismatches, calls left) now, on the
        caller's thread, rather than at the thread's next tick: a rank about to blame a peer
        that left looks first for the reason it left. Cost: a few store round trips.

        Raises:
            StoreError: the store is unreachable.
        """
        self._collect(self._require_store())

    def _collect(self, store: Store) -> None:
        """Hand failures and revocations published by any rank (or the launcher) to the engine.
        """
        with self._collecting:
            self._collect_locked(store)

    def _collect_locked(self, store: Store) -> None:
        count = store.add(DEAD_COUNT_KEY, 0)
        while self._seen_failures < count:
            self._seen_failures += 1
            info = get_json(store, DEAD_KEY.format(self._seen_failures))
            try:
                rank, detail = int(info["rank"]), str(info["detail"])
            except (KeyError, TypeError, ValueError):
                continue
            if rank != self.rank:
                self._declared.add(rank)
                by = info.get("by")
                found = "the launcher" if by is None else f"rank {by}"
                self.engine.remote_failures.append(
                    PeerFailure(rank, f"{detail} (found by {found})"))
        count = store.add(f"{PREFIX}revoked/count", 0)
        while self._seen_revocations < count:
            self._seen_revocations += 1
            info = get_json(store, f"{PREFIX}revoked/{self._seen_revocations}")
            try:
                contexts = tuple(int(c) for c in info["contexts"])
                members = frozenset(int(m) for m in info["members"])
                why = CommRevoked(f"{info['name']} was revoked by rank {int(info['by'])}")
            except (KeyError, TypeError, ValueError):
                continue
            if self.rank in members:
                for c in contexts:  # seen at once by later sends and receives (a dict write)
                    self.engine.revoked.setdefault(c, why)
                self.engine.remote_revocations.append((contexts, members, why))

        count = store.add(f"{PREFIX}mismatch/count", 0)
        while self._seen_mismatches < count:
            self._seen_mismatches += 1
            info = get_json(store, f"{PREFIX}mismatch/{self._seen_mismatches}")
            left = left_record(info)
            if left is not None:
                if left[2] != self.rank:
                    self.engine.remote_left.append(left)
                continue
            record = parse_mismatch(info)
            if record is not None and record[2] != self.rank:
                self.engine.remote_mismatches.append(record)

    # ------------------------------------------------------------------ recovery
    def publish_failure(self, rank: int, detail: str) -> None:
        """Tell every rank that ``rank`` failed (found by this one). Two round trips.

        Raises:
            StoreError: the store is unreachable.
        """
        publish_failure(self._require_store(), rank, detail, self.rank)

    def publish_mismatch(self, context: int, seq: int, mine: str, sender: int,
                         sender_call: str | None) -> None:
        """Tell the other ranks that this rank's call ``seq`` on ``context`` (``mine``) met
        ``sender``'s (``sender_call``, None if not known yet); those waiting in it or later
        calls fail, showing both. Two round trips.

        Raises:
            StoreError: the store is unreachable.
        """
        self._publish_record({"context": context, "seq": seq, "by": self.rank, "by_call": mine,
                              "sender": sender, "sender_call": sender_call})

    def publish_left(self, context: int, seq: int, text: str, kind: str = "") -> None:
        """Tell the other ranks that this rank left its call ``seq`` on ``context`` with an
        error (``text``): those waiting in that call, or entering it later, fail with it. Two
        round trips.

        Raises:
            StoreError: the store is unreachable.
        """
        self._publish_record({"context": context, "seq": seq, "by": self.rank, "left": text,
                              "kind": kind})

    def _publish_record(self, record: dict[str, Any]) -> None:
        """Append ``record`` to the job's records of broken calls (mismatches, calls left)."""
        store = self._require_store()
        i = store.add(f"{PREFIX}mismatch/count", 1)
        store.set(f"{PREFIX}mismatch/{i}", json.dumps(record).encode())

    def exit_info(self, rank: int) -> dict[str, Any] | None:
        """What ``rank`` said as it left the job ({"exited": True} and, if an exception ended
        its program, "crashed": its text), or None if it did not (or the store cannot say).
        Cost: one store round trip (0.5 s bound)."""
        store = self._store
        if store is None:
            return None
        try:
            state = get_json(store, state_key(rank), 0.5)
        except RingworldError:
            return None
        return state if state.get("exited") else None

    def find_mismatch(self, context: int, seq: int) -> MismatchRecord | None:
        """The latest published mismatch of call ``seq`` on ``context``, if any:
        (context, seq, by, by_call, sender, sender_call). Cost: a store round trip per record.

        Raises:
            StoreError: the store is unreachable.
        """
        store = self._require_store()
        for i in range(store.add(f"{PREFIX}mismatch/count", 0), 0, -1):
            found = mismatch_record(store, i)
            if found is not None and found[:2] == (context, seq):
                return found
        return None

    def publish_revocation(self, contexts: tuple[int, ...], members: tuple[int, ...],
                           name: str) -> None:
        """Tell every rank that the communicator (``contexts``, ``members``) is revoked.

        Raises:
            StoreError: the store is unreachable.
        """
        store = self._require_store()
        i = store.add(f"{PREFIX}revoked/count", 1)
        store.set(f"{PREFIX}revoked/{i}", json.dumps(
            {"contexts": list(contexts), "members": list(members), "name": name,
             "by": self.rank}).encode())

    def agree(self, key: str, members: tuple[int, ...], flag: int, next_context: int,
              timeout: float | None) -> tuple[int, list[int], int]:
        """Agree with the live ``members`` on (AND of flags, live members, a fresh context).

        Fault tolerant: every live member gets the same answer, and members that failed (or
        fail meanwhile) are left out instead of blocking it. The first member to arrive
        coordinates: it waits until every member has either sent its flag or is known failed,
        then publishes the decision. Called from the main thread. Cost: a few store round
        trips per member.

        Raises:
            Timeout: no decision within ``timeout`` seconds.
            CommError: the coordinator failed before deciding.
        """
        store = self._require_store()
        e = self.engine
        prefix = f"{PREFIX}agree/{key}/"
        store.set(f"{prefix}v/{self.rank}", json.dumps([int(flag), int(next_context)]).encode())
        deadline = None if timeout is None else time.monotonic() + timeout
        if store.add(f"{prefix}lock", 1) == 1:
            store.set(f"{prefix}coordinator", str(self.rank).encode())
            values: dict[int, list[int]] = {}
            while True:
                e.check_peers()
                failed = set(e.dead) | e.reported
                waiting = [r for r in members if r not in values and r not in failed]
                for r in waiting:
                    with_value = try_get(store, f"{prefix}v/{r}", 0.02)
                    if with_value is not None:
                        values[r] = json.loads(with_value)
                if all(r in values or r in failed for r in members):
                    break
                if deadline is not None and time.monotonic() > deadline:
                    raise Timeout(f"agreement {key}: no value from ranks "
                                  f"{[r for r in members if r not in values]} within "
                                  f"{timeout:g} s")
            alive = sorted(values)
            result = -1
            for r in alive:
                result &= values[r][0]
            decision: dict[str, Any] = {"flag": result, "alive": alive,
                        "context": max(values[r][1] for r in alive)}
            store.set(f"{prefix}decision", json.dumps(decision).encode())
        else:
            while True:
                raw = try_get(store, f"{prefix}decision", 0.1)
                if raw is not None:
                    decision = json.loads(raw)
                    break
                coordinator = try_get(store, f"{prefix}coordinator", 0.0)
                e.check_peers()
                if coordinator is not None and int(coordinator) in (set(e.dead)
                                                                    | e.reported):
                    raise CommError(f"agreement {key}: its coordinator, rank "
                                    f"{int(coordinator)}, failed before deciding")
                if deadline is not None and time.monotonic() > deadline:
                    raise Timeout(f"agreement {key}: no decision within {timeout:g} s")
        return int(decision["flag"]), [int(r) for r in decision["alive"]], \
            int(decision["context"])

    def publish_signature(self, context: int, seq: int, mine: str) -> None:
        """Publish this rank's description of its call ``seq`` on ``context`` (for a rank that
        found a mismatch there and waits for it in :meth:`exchange_signature`).

        Raises:
            StoreError: the store is unreachable.
        """
        self._require_store().set(f"{PREFIX}sig/{context}/{seq}/{self.rank}", mine.encode())

    def read_signature(self, context: int, seq: int, peer: int) -> str | None:
        """``peer``'s published description of its call ``seq`` on ``context``, if it appears
        within 0.5 s."""
        store = self._store
        if store is None:
            return None
        raw = try_get(store, f"{PREFIX}sig/{context}/{seq}/{peer}", 0.5)
        return None if raw is None else raw.decode("utf-8", "replace")

    def exchange_signature(self, context: int, seq: int, peer: int, mine: str) -> str | None:
        """Publish this rank's description of collective ``seq`` on ``context`` and return
        ``peer``'s, if it publishes one within 0.5 s (it does when it sees the mismatch too).
        """
        store = self._store
        if store is None:
            return None
        prefix = f"{PREFIX}sig/{context}/{seq}/"
        try:
            store.set(f"{prefix}{self.rank}", mine.encode())
            raw = store.get(f"{prefix}{peer}", timeout=0.5)
        except RingworldError:
            return None
        return raw.decode("utf-8", "replace")

    def _require_store(self) -> Store:
        store = self._store
        if store is None:
            raise CommError("the job monitor is stopped (after finalize)")
        return store

    # ------------------------------------------------------------------ diagnosis
    def explain(self, what: str) -> str:
        """Every rank's state as of its last heartbeat; for a collective that timed out, which
        ranks entered it and which did not. Cost: one store round trip per rank (0.5 s bound).
        """
        store = self._store
        if store is None:
            return ""
        states = fetch_states(store, self.size)
        lines = []
        current = self.engine.current
        if current is not None:
            _, seq, name, ranks = current
            if f"#{seq} on {name}" in what:
                arrived: list[int] = []
                missing: list[int] = []
                for i, w in enumerate(ranks):
                    st = states.get(w)
                    got = None if st is None else st.get("entered", {}).get(name)
                    (arrived if isinstance(got, int) and got >= seq else missing).append(i)
                lines.append(f"ranks of {name} that entered #{seq}: {arrived or 'none'}; "
                             f"missing: {missing or 'none'} (as of their last heartbeat)")
        return "\n".join(lines + format_states(states, history=False))
