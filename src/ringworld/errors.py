"""The exception tree of Ringworld.

Every error the library raises derives from :class:`RingworldError`::

    RingworldError
    ├── ConfigError            bad environment / launcher configuration
    ├── BootstrapError         rendezvous failed (store unreachable, authentication, missing peer)
    │   └── AuthenticationError  a peer or store did not prove knowledge of the job secret
    ├── CommError              a communication operation failed
    │   ├── TransportError     bytes could not be moved (raised ``from`` the OSError beneath)
    │   │   └── PeerFailure    a peer process died or closed its connection; names the rank
    │   ├── Timeout            a blocking call ran past its timeout (also a ``TimeoutError``)
    │   ├── TruncationError    a message is larger than the receive buffer; names both sizes
    │   ├── MismatchError      ranks called a collective with different arguments; shows them
    │   │   └── ShortMessageError  a collective's block from a peer is shorter than expected
    │   └── CommBroken         the communicator failed earlier; later calls raise at once
    └── StoreError             a store request failed
        └── StoreTimeout       a key did not appear in time (also a ``TimeoutError``)

Bad arguments raise the builtin ``ValueError`` / ``TypeError`` naming the argument and value.
"""

from __future__ import annotations


class RingworldError(Exception):
    """Base class of every Ringworld error."""


class ConfigError(RingworldError):
    """The environment or launcher configuration is invalid."""


class BootstrapError(RingworldError):
    """Rendezvous between the ranks of a job failed."""


class AuthenticationError(BootstrapError):
    """A peer or the store failed to prove it knows the job secret."""


class StoreError(RingworldError):
    """A request to the rendezvous store failed."""


class StoreTimeout(StoreError, TimeoutError):
    """A store key did not appear before the timeout."""


class CommError(RingworldError):
    """A communication operation failed."""


class MismatchError(CommError):
    """Ranks disagree on a collective call (operation, size, dtype, op or root)."""


class ShortMessageError(MismatchError):
    """A collective's message from a peer is shorter than this rank's part of the call expects:
    the two ranks gave different counts for the block (a v-call's counts, which no rank states
    whole). Only the receiving rank can tell; it tells the members, which fail with CommBroken.

    Attributes:
        call: the collective call that found it, which its text starts with ("" until named).
    """

    call = ""


class TransportError(CommError):
    """A transport could not move bytes; chained from the underlying error."""


class PeerFailure(TransportError):
    """A peer process died or dropped its connection.

    Attributes:
        rank: the world rank of the failed peer.
    """

    def __init__(self, rank: int, detail: str) -> None:
        super().__init__(f"peer rank {rank} failed: {detail}")
        self.rank = rank
        self.detail = detail


class CommRevoked(CommError):
    """The communicator was revoked (``comm.revoke()`` on some rank): its pending and later
    operations fail on every member; ``comm.shrink()`` makes a working one of the live ranks."""


class Timeout(CommError, TimeoutError):
    """A blocking communication call did not complete in time."""


class TruncationError(CommError):
    """An incoming message does not fit the receive buffer.

    Attributes:
        message_bytes: size of the incoming message.
        buffer_bytes: size of the receive buffer.
        call: the collective call that found it, which its text starts with ("" for a
            receive).
    """

    call = ""

    def __init__(self, message_bytes: int, buffer_bytes: int, detail: str = "") -> None:
        extra = f" ({detail})" if detail else ""
        super().__init__(
            f"message truncated: incoming message has {message_bytes} bytes but the receive "
            f"buffer holds only {buffer_bytes} bytes{extra}"
        )
        self.message_bytes = message_bytes
        self.buffer_bytes = buffer_bytes


class CommBroken(CommError):
    """The communicator hit a fatal error earlier and can no longer be used."""


class DeviceUnavailable(RingworldError):
    """A device buffer reached a call, but what the GPU plane needs is missing here (a CUDA
    driver, the NCCL binding or library); the message names it and how to install it."""


class DeviceError(CommError):
    """NCCL or CUDA reported an error for a device call; ``code`` is NCCL's result code, or
    None for a CUDA error."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


def reaches_every_member(exc: BaseException) -> bool:
    """Whether every member of a collective learns of ``exc`` without this rank telling them
    that it left the call: a mismatch in the calls' signatures (both sides see it), a
    revocation, an error that another rank's leaving caused. Not a ``ShortMessageError``
    (only the receiving rank sees a short block)."""
    return ((isinstance(exc, MismatchError | CommRevoked)
             and not isinstance(exc, ShortMessageError)) or getattr(exc, "from_left", False))
