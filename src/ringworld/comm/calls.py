"""The bookkeeping of collective calls that keeps ranks from matching the wrong call's data.

A collective's messages carry its sequence number and a signature of what every rank must
agree on (see :meth:`CallChecks.sign`). :class:`CallChecks`, the base of the matching engine,
keeps what that needs: the signed messages queued per call, the call each rank is in, the
messages no call of this rank will take (strays), mismatches found here or published by the
job's monitor, the calls other ranks left with an error, the calls this rank refused as their
root, and the exit check that finds a disagreement no call waited for. The engine calls these
from its matching paths; the state lives on the engine (declared here, set in its constructor).
"""

from __future__ import annotations

import contextlib
import time
import zlib
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ringworld.comm.requests import SEQ_MASK, SIG_SHIFT, TAG_UB, RecvRequest
from ringworld.errors import CommBroken, MismatchError, PeerFailure, RingworldError
from ringworld.transport.base import Incoming, SendHandle

ECHO_WAIT = 2.0  # seconds a rank waits for the record behind a peer's mismatch notice
_LOOK_BACK = 64  # calls since the last look for left-over messages checked one by one


def _nothing() -> None:
    pass


def _left_error(why: str, kind: str) -> Exception:
    """The error of a call another rank left (see Engine.fail_left): a refusal of the root's
    arguments is raised as the root raised it (ValueError, TypeError), anything else as
    CommBroken."""
    exc: Exception
    if kind == "ValueError":
        exc = ValueError(why)
    elif kind == "TypeError":
        exc = TypeError(why)
    elif kind.startswith("PeerFailure:"):  # the rank left because this one failed: name it
        exc = PeerFailure(int(kind.split(":")[1]), why)
    else:
        exc = CommBroken(why)
    setattr(exc, "from_left", True)  # noqa: B010 (not passed on again: see report_left)
    return exc


class CallChecks:
    """Signatures, strays, mismatches, calls left and refused, for one rank's engine."""

    rank: int
    calm: bool
    ft: Any
    posted: defaultdict[int, list[RecvRequest[Any]]]
    unexpected: defaultdict[int, list[Incoming]]
    _signed: defaultdict[int, dict[int, dict[int, int]]]
    _marks: dict[str, int]
    _mismatched: list[tuple[RecvRequest[Any], int, int]]
    signatures: dict[int, str]
    comm_names: dict[int, str]
    entered: dict[int, int]
    entered_tag: dict[int, int]
    previous_tag: dict[int, int]
    open_calls: defaultdict[int, set[int]]
    _left_seen: dict[int, tuple[int, int]]
    _closes: dict[int, int]
    strays: list[tuple[int, int, int, int]]
    mismatched: dict[int, tuple[int, str]]
    unsurfaced: dict[int, str]
    remote_mismatches: list[tuple[int, int, int, str, int, str | None]]
    remote_left: list[tuple[int, int, int, str, str]]
    left_calls: dict[tuple[int, int], tuple[str, str]]
    dropping: dict[int, set[int]]
    revoked: dict[int, Any]

    def _init_calls(self) -> None:
        """Start with no call checked, broken, left or refused (the engine's constructor)."""
        # mismatches found elsewhere: (context, seq, by, by's call, sender, sender's call)
        self.remote_mismatches: list[tuple[int, int, int, str, int, str | None]] = []
        self.mismatched: dict[int, tuple[int, str]] = {}  # context -> (broken call, why)
        self.unsurfaced: dict[int, str] = {}  # ... found after this rank's calls in it ended
        # collective calls another rank left with an error: (context, seq, by, why) found by
        # the monitor, and (context, seq) -> the error once taken in (see fail_left)
        self.remote_left: list[tuple[int, int, int, str, str]] = []
        self.left_calls: dict[tuple[int, int], tuple[str, str]] = {}  # ... -> (why, kind)
        # context -> calls whose messages this rank drops (refused as root, or given up)
        self.dropping: dict[int, set[int]] = {}
        self.signatures: dict[int, str] = {}  # collective call signature hash -> description
        # a call's agreed values (collective, algorithm, count, dtype...) -> its signature: per
        # engine, as the descriptions above are (worlds of threads each have their own)
        self.signed_calls: dict[tuple[Any, ...], int] = {}
        self._marks: dict[str, int] = {}  # ... and back (see sign)
        self._mismatched: list[tuple[RecvRequest[Any], int, int]] = []  # found while polling
        # signed collective calls (see note_call): context -> tag of the call this rank is in
        self.entered_tag: dict[int, int] = {}
        self.previous_tag: dict[int, int] = {}  # ... and of the signed call before it
        # collective calls not finished on this rank, whose messages may still come late:
        # nonblocking ones in flight and ones that failed here (context -> sequence numbers)
        self.open_calls: defaultdict[int, set[int]] = defaultdict(set)
        # context -> (the call at the last look for messages left over, the open calls closed
        # by then: _closes), and context -> open calls closed so far: see _find_left_over
        self._left_seen: dict[int, tuple[int, int]] = {}
        self._closes: dict[int, int] = {}
        # messages no call of this rank will take (context, tag, sender, bytes): see
        # _check_unexpected
        self.strays: list[tuple[int, int, int, int]] = []

    if TYPE_CHECKING:  # the engine's (see Engine)
        def isend(self, dest: int, context: int, tag: int, flags: int,
                  segments: Sequence[memoryview], nbytes: int) -> SendHandle: ...

        def progress(self) -> bool: ...

    def _unindex(self, context: int, tag: int) -> None:
        seqs = self._signed[context]
        seq = tag & SEQ_MASK
        tags = seqs[seq]
        left = tags[tag] - 1
        if left:
            tags[tag] = left
        else:
            del tags[tag]
            if not tags:
                del seqs[seq]

    def _other_signature(self, context: int, tag: int) -> Incoming | None:
        """A queued message of the same collective call as ``tag`` (same sequence number)
        with another signature, or None. Cost: a lookup; a scan only when there is one."""
        tags = self._signed.get(context, {}).get(tag & SEQ_MASK)
        if not tags or (len(tags) == 1 and tag in tags):
            return None
        for m in self.unexpected.get(context, ()):
            if m.tag & SEQ_MASK == tag & SEQ_MASK and m.tag > SEQ_MASK and m.tag != tag:
                return m
        return None

    def _check_signatures(self, context: int, source: int, tag: int,
                          posted: list[RecvRequest[Any]]) -> None:
        """Fail a receive of the same collective call (sequence number) as ``tag`` posted with
        another call signature: every rank must call collective #n with the same one."""
        seq = tag & SEQ_MASK
        for i, r in enumerate(posted):
            if r.tag & SEQ_MASK == seq and r.tag > SEQ_MASK and r.tag != tag:
                del posted[i]
                self._mismatch(r, tag, source)
                return

    def sign(self, text: str) -> int:
        """The 16-bit signature (never 0) of the call that ``text`` describes, noted for the
        mismatch messages. Cost: a dict lookup once known."""
        mark = self._marks.get(text)
        if mark is None:
            mark = (zlib.crc32(text.encode()) & 0xFFFF) | 1
            if len(self._marks) < 4096:
                self._marks[text] = mark
            self.signatures[mark] = text
        return mark

    def note_call(self, context: int, tag: int) -> None:
        """Record that this rank entered the signed collective call ``tag`` on ``context``.

        A message of this call queued with another signature is a mismatch even when this rank
        posts no receive in the call (a root that only sends): found here or on arrival. So is
        one of an earlier call, which ended without taking it (it came while that call ran).
        Cost: two dict lookups; a scan only when messages of other calls wait.
        """
        old = self.entered_tag.get(context)
        if old is not None:
            self.previous_tag[context] = old
        self.entered_tag[context] = tag
        m = self._other_signature(context, tag)
        if m is not None:
            self.strays.append((context, m.tag, m.source, m.nbytes))
        seq = tag & SEQ_MASK
        seqs = self._signed.get(context)
        if seqs and (len(seqs) > 1 or seq not in seqs):
            self._find_left_over(context, seq)
        else:  # (none queued but this call's: none left over)
            self._left_seen[context] = (seq, self._closes.get(context, 0))

    def _find_left_over(self, context: int, seq: int) -> None:
        """Note as a stray a queued message of a call before ``seq`` on ``context`` that
        this rank ended without taking (not one still open: nonblocking, or given up, whose
        late messages stay queued: they are set aside in one C-level pass).

        Calls ahead of this one queue messages when a rank runs ahead (a rooted call's
        senders): those are not looked at again each call. Where the last look (at call
        ``last``) found none left over and no call open then has closed since (``_closes``
        counts the closes), only the calls from ``last`` on can have been left since (a message
        of an earlier call that comes later is found on arrival: ``_check_unexpected``). A
        gather whose sender ran hundreds of calls ahead spent most of the root's time here
        (72-85 us a call, 16 us in step)."""
        open_calls = self.open_calls.get(context)
        seen = self._left_seen.get(context)
        closes = self._closes.get(context, 0)
        self._left_seen[context] = (seq, closes)
        seqs = self._signed[context]
        if seen is not None and seen[1] == closes:
            last = seen[0]
            gap = (seq - last) & TAG_UB
            if gap <= _LOOK_BACK:
                for k in range(gap):
                    s = (last + k) & TAG_UB
                    if s in seqs and not (open_calls and s in open_calls):
                        self._note_left_over(context, s)
                        return
                return
        for s in seqs.keys() - open_calls if open_calls else seqs.keys():
            if 0 < (seq - s) & TAG_UB < TAG_UB // 2:
                self._note_left_over(context, s)
                return

    def close_call(self, context: int, seq: int) -> None:
        """Call ``seq`` on ``context``, open until now (nonblocking), completed here: its
        messages are no longer expected, and the next look for left-over ones looks at the
        whole queue (see :meth:`_find_left_over`)."""
        self.open_calls[context].discard(seq)
        self._closes[context] = self._closes.get(context, 0) + 1

    def _note_left_over(self, context: int, s: int) -> None:
        m = next(m for m in self.unexpected[context] if m.tag > SEQ_MASK and m.tag & SEQ_MASK == s)
        self.strays.append((context, m.tag, m.source, m.nbytes))

    def _check_unexpected(self, context: int, tag: int, source: int, nbytes: int) -> None:
        """A signed collective message nobody has asked for: note it as a stray (a mismatch)
        when it is of this rank's current call with another signature, or of a call this rank
        finished without taking it (every message of a call is taken within the call)."""
        mine = self.entered_tag.get(context)
        if mine is None or context in self.mismatched:
            return
        seq = tag & SEQ_MASK
        current = self.entered.get(context, mine & SEQ_MASK)
        behind = (current - seq) & TAG_UB
        if behind == 0:
            if mine & SEQ_MASK == seq and mine != tag:
                self.strays.append((context, tag, source, nbytes))
        elif behind < TAG_UB // 2 and seq not in self.open_calls.get(context, ()):
            self.strays.append((context, tag, source, nbytes))

    def _fail_strays(self) -> None:
        """Turn the stray messages found while polling into mismatches on their communicators:
        the other ranks learn through the fault-tolerance service, every later call fails."""
        found, self.strays = self.strays, []
        for context, tag, sender, nbytes in found:
            if context in self.mismatched:
                continue
            seq = tag & SEQ_MASK
            mine = f"a call that ended without taking world rank {sender}'s message"
            own = self._own_tag(context, seq)
            if own:
                if own == tag and not nbytes and self._fail_as_published(context, seq):
                    continue  # the sender's notice of a mismatch it found (0 bytes): shown as
                    # it found it
                mine = self.signatures.get(own >> SIG_SHIFT, f"signature {own >> SIG_SHIFT:04x}")
            other = self.signatures.get(tag >> SIG_SHIFT)
            if self.ft is not None:
                with contextlib.suppress(RingworldError):
                    if other is None:  # the sender's call, as it publishes it (when it sees
                        other = self.ft.exchange_signature(context, seq, sender, mine)  # one)
                    else:
                        self.ft.publish_signature(context, seq, mine)
                    self.ft.publish_mismatch(context, seq, mine, sender, other)
            self.fail_call(context, seq, self.rank, mine, sender,
                           other or f"another call (signature {tag >> SIG_SHIFT:04x})")

    def _own_tag(self, context: int, seq: int, candidates: Sequence[int] = ()) -> int:
        """The tag of this rank's collective call ``seq`` on ``context`` among ``candidates``,
        then the calls it entered last and before that; 0 if none of them is that call."""
        for t in (*candidates, self.entered_tag.get(context, 0),
                  self.previous_tag.get(context, 0)):
            if t > SEQ_MASK and t & SEQ_MASK == seq:
                return t
        return 0

    def _fail_as_published(self, context: int, seq: int) -> bool:
        """Fail call ``seq`` on ``context`` with the mismatch another rank published for it
        (a stray of this rank's own signature is that rank's notice, sent just before it
        publishes); False if none appears within ECHO_WAIT seconds."""
        if self.ft is None:
            return False
        deadline = time.monotonic() + ECHO_WAIT
        while True:
            try:
                found = self.ft.find_mismatch(context, seq)
            except RingworldError:
                return False
            if found is not None:
                self.fail_call(*found)
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)

    def check_mismatched(self, context: int, seq: int | None = None) -> None:
        """Raise the mismatch that broke ``context``'s collective sequence (at call ``seq`` or
        before, if given), if any: calls that send no messages, such as the shared-memory ones,
        check here, and calls that found a stray while completing.

        Raises:
            MismatchError: a collective call on this context met another rank's different one.
        """
        if self.strays:
            self._fail_strays()
        while self.remote_mismatches:
            self.fail_call(*self.remote_mismatches.pop())
        broken = self.mismatched.get(context)
        if broken is not None and (seq is None or broken[0] <= seq):
            self.unsurfaced.pop(context, None)
            raise MismatchError(broken[1] if seq is None or seq == broken[0]
                                else f"{broken[1]} (this rank in call #{seq})")

    def _mismatch(self, req: RecvRequest[Any], theirs: int, sender: int) -> None:
        """Note that ``req`` met ``sender``'s message of another call; :meth:`progress` fails
        it."""
        self._mismatched.append((req, theirs, sender))

    def _fail_mismatched(self) -> None:
        """Fail the receives that met another call's message with a MismatchError showing both
        ranks' call signatures, after telling each peer (a message of this call's signature,
        which fails its receive in turn: it may be waiting for nothing from this rank)."""
        found, self._mismatched = self._mismatched, []
        for req, _, sender in found:
            for peer in {req.source, sender}:
                with contextlib.suppress(RingworldError):  # the peer may be gone already
                    self.isend(peer, req.context, req.tag, 0, [], 0)
        for req, theirs, sender in found:
            seq = req.tag & SEQ_MASK
            sig, other_sig = req.tag >> SIG_SHIFT, theirs >> SIG_SHIFT
            mine = self.signatures.get(sig, f"signature {sig:04x}")
            other = self.signatures.get(other_sig)
            unknown = f"another call (signature {other_sig:04x})"
            if self.ft is not None:  # first: the members waiting fail, and publish their calls
                with contextlib.suppress(RingworldError):
                    self.ft.publish_mismatch(req.context, seq, mine, sender, other)
                if other is None:  # the sender's call, once it has published it
                    other = self.ft.exchange_signature(req.context, seq, sender, mine)
            name = self.comm_names.get(req.context, f"context {req.context}")
            text = (f"collective mismatch on {name}, call #{seq}: world rank {self.rank} "
                    f"called {mine}, but world rank {sender} called {other or unknown}")
            self.mismatched.setdefault(req.context, (seq, text))
            self.unsurfaced.pop(req.context, None)  # this call raises it
            req._error = MismatchError(text)
            req._done = True

    def fail_call(self, context: int, seq: int, by: int, by_call: str, sender: int,
                  sender_call: str | None) -> None:
        """Fail this rank's receives of collective calls from ``seq`` on, on ``context``, now and
        later, after rank ``by`` found its call ``seq`` (``by_call``) meeting ``sender``'s
        (``sender_call``, None if unknown): the sequence is broken there. Each error shows the
        disagreeing calls (a rank that had finished call ``seq`` fails in its next call)."""
        posted = self.posted.get(context) or []
        failed = [r for r in posted if r.tag > SEQ_MASK and r.tag & SEQ_MASK >= seq]
        if self.ft is not None:
            with contextlib.suppress(RingworldError):
                # this rank's own call ``seq``, for rank ``by`` and the lookup below (never a
                # later call's: a receive posted in call seq + 1 must not speak for call seq)
                own = self._own_tag(context, seq, [r.tag for r in failed])
                mine = self.signatures.get(own >> SIG_SHIFT) if own else None
                if mine is not None:
                    self.ft.publish_signature(context, seq, mine)
                if sender_call is None:
                    sender_call = self.ft.read_signature(context, seq, sender)
        name = self.comm_names.get(context, f"context {context}")
        if by_call == sender_call:  # a message of the call that ``by`` ended without taking
            what = (f"world ranks {by} and {sender} both called {by_call}, but world rank {by} "
                    f"ended it without taking a message world rank {sender} sent it there (the "
                    "ranks gave different counts)")
        else:
            what = (f"world rank {by} called {by_call}, but world rank {sender} called "
                    f"{sender_call or 'another call'}")
        text = f"collective mismatch on {name}, call #{seq}: {what}"
        first = context not in self.mismatched  # else known (and maybe raised) already
        self.mismatched.setdefault(context, (seq, text))
        if not failed and first:  # no call of this rank waits in it: the next one raises,
            self.unsurfaced.setdefault(context, text)  # or exit does
        if failed:
            self.unsurfaced.pop(context, None)  # the calls waiting in it raise it
            posted[:] = [r for r in posted if r not in failed]
        for r in failed:
            at = r.tag & SEQ_MASK
            r._error = MismatchError(text + (f" (this rank was in call #{at})" if at != seq
                                             else ""))
            r._done = True

    def refuse_call(self, context: int, seq: int, why: str, kind: str) -> None:
        """This rank, a root, refuses collective call ``seq`` on ``context`` for an argument
        error only it can see (``why``; ``kind``: its exception's type name). The members
        waiting for it fail with the same type (through the job store), and the messages they
        send it in that call are dropped here (queued ones now, late ones on arrival), so the
        communicator's later calls line up on every rank."""
        self.give_up_call(context, seq)
        self.report_left(context, seq, why, kind)

    def give_up_call(self, context: int, seq: int) -> None:
        """This rank is done with collective call ``seq`` on ``context`` without taking all
        of its messages (it refused the call as its root, or failed in it): those queued are
        dropped now and those still to come on arrival (taken, so that their senders
        complete), rather than kept for good or found as strays. Cost: a scan of the
        communicator's queue."""
        self.dropping.setdefault(context, set()).add(seq)
        self.open_calls[context].add(seq)
        queue = self.unexpected.get(context)
        if queue:
            for m in [m for m in queue if m.tag > SEQ_MASK and m.tag & SEQ_MASK == seq]:
                queue.remove(m)
                self._unindex(context, m.tag)
                self._drop(m)

    def _drop(self, inc: Incoming) -> None:
        """Take a message nobody will receive, so that its sender completes."""
        inc.read_into(memoryview(bytearray(inc.nbytes)), _nothing)

    def report_left(self, context: int, seq: int, text: str, kind: str = "") -> None:
        """Tell every rank (through the job store) that this rank left its collective call
        ``seq`` on ``context`` with an error (``text``: "the call with the error"): members
        waiting in it for this rank's part fail instead of waiting (see :meth:`fail_left`).
        ``kind`` "ValueError" or "TypeError": the text is a refusal (see :meth:`refuse_call`),
        which they raise as that type. Best effort (no monitor, no store: they wait for their
        timeout or this rank's exit)."""
        if self.ft is not None:
            with contextlib.suppress(RingworldError):
                self.ft.publish_left(context, seq, text, kind)

    def fail_left(self, context: int, seq: int, by: int, text: str, kind: str = "") -> None:
        """Fail this rank's receives of collective call ``seq`` on ``context``, now and later
        (:meth:`check_left`), as world rank ``by`` left that call with an error (``text``)."""
        if kind in ("ValueError", "TypeError"):  # a root's refusal: its text says it all
            why = text
        else:
            name = self.comm_names.get(context, f"context {context}")
            why = f"{name}, call #{seq}: world rank {by} left {text}"
        self.left_calls.setdefault((context, seq), (why, kind))
        self.calm = False
        posted = self.posted.get(context)
        if not posted:
            return
        failed = [r for r in posted if r.tag > SEQ_MASK and r.tag & SEQ_MASK == seq]
        if failed:
            posted[:] = [r for r in posted if r not in failed]
        for r in failed:
            r._error = _left_error(why, kind)
            r._done = True

    def check_left(self, context: int, seq: int) -> None:
        """Raise if another rank left collective call ``seq`` on ``context`` with an error.

        Raises:
            CommBroken: naming that rank and its error.
            ValueError / TypeError: the root refused the call's arguments.
        """
        while self.remote_left:
            self.fail_left(*self.remote_left.pop())
        found = self.left_calls.get((context, seq))
        if found is not None:
            raise _left_error(*found)

    def exit_check(self) -> str | None:
        """At exit: a collective message that arrived for a call this rank finished without
        taking it (a disagreement that left no rank waiting, such as two ranks that both
        broadcast as the root), described; None if there is none. Best effort: it looks at
        what has arrived by now. Cost: one poll of the transports."""
        with contextlib.suppress(RingworldError):
            self.progress()
        if self.unsurfaced:
            return next(iter(self.unsurfaced.values()))
        for context, queue in self.unexpected.items():
            if context in self.mismatched or context in self.revoked:
                continue  # reported already, or calls were cut short on purpose
            current = self.entered.get(context)
            given_up = self.open_calls.get(context, set())
            for m in queue:
                seq = m.tag & SEQ_MASK
                if m.tag <= SEQ_MASK or seq in given_up or current is None or seq > current:
                    continue
                name = self.comm_names.get(context, f"context {context}")
                theirs = self.signatures.get(m.tag >> SIG_SHIFT, "another call")
                return (f"collective mismatch on {name}, call #{seq}: world rank {m.source} "
                        f"called {theirs}, and its message was never taken here (this rank "
                        f"made another call, or the same with other arguments)")
        return None
