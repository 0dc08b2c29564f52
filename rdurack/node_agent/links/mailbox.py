"""A socket's mailbox: transfers that arrived over its links, waiting to be consumed.

The link server's threads put messages in; the socket's own thread takes them out by the
key every collective schedule derives identically on both ends: (collective tag, step,
sending socket). Arrival order on the wire does not matter, so a fast peer's step-3
message can sit here while the socket still waits for a slow peer's step 2.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from rdurack.errors import InvalidRequest, LinkFailure

# (collective tag, collective step, sending socket id): one message per key.
Key = tuple[str, int, str]
# What received data comes in; np.frombuffer takes any of them.
Buffer = bytes | bytearray | memoryview


class Parts:
    """A transfer's data in the pieces it came in (views into the bytes gRPC received,
    not copies; read-only by convention), in order.

    A Deliver's data is complete at once. A streamed Transfer's is handed to the socket
    at its header and filled by the link server's thread as its chunks arrive, so the
    socket copies chunk k into its tensor while chunk k+1 is on the wire: read after
    the whole stream, a 64 MB transfer's copy (about 5 ms on this machine) came after
    its last byte, where the bare floor (bench_bare.py) copies each chunk as it comes.
    """

    def __init__(self, pieces: Iterable[Buffer] = (), *, complete: bool = True) -> None:
        self._pieces: list[Buffer] = list(pieces)
        self._complete = complete
        self._failure: str | None = None
        self._cond = threading.Condition()

    # The link server's thread, for a transfer still arriving.

    def add(self, piece: Buffer) -> None:
        with self._cond:
            self._pieces.append(piece)
            self._cond.notify_all()

    def finish(self) -> None:
        """Every byte the header declared is in."""
        with self._cond:
            self._complete = True
            self._cond.notify_all()

    def fail(self, reason: str) -> None:
        """The transfer broke off or was refused: its reader raises LinkFailure(reason)."""
        with self._cond:
            self._failure = reason
            self._cond.notify_all()

    # The receiving socket's thread.

    def read(self, timeout_s: float, multiple: int = 1) -> Iterator[Buffer]:
        """The pieces in order, each as soon as it is in, cut so that every one but the
        last is a whole number of `multiple` bytes (elements of the receiving tensor: a
        piece cut inside an element has that element's bytes joined to the next piece).
        Raises LinkFailure if the transfer fails, or when no piece comes for `timeout_s`
        seconds (wall time)."""
        carry = b""  # the bytes of an element cut between two pieces
        index = 0
        while (piece := self._next(index, timeout_s)) is not None:
            index += 1
            if carry:
                piece = carry + bytes(piece)
            whole = len(piece) - len(piece) % multiple
            carry = bytes(piece[whole:])
            if whole:
                yield memoryview(piece)[:whole] if whole < len(piece) else piece
        if carry:
            yield carry

    def join(self, timeout_s: float) -> Buffer:
        """The whole data as one buffer: the only piece as it is, several joined (a
        copy), once all is in."""
        pieces = list(self.read(timeout_s))
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def _next(self, index: int, timeout_s: float) -> Buffer | None:
        """Piece `index` once it is in; None after the last."""
        with self._cond:
            if not self._cond.wait_for(
                lambda: self._failure is not None or index < len(self._pieces) or self._complete,
                timeout_s,
            ):
                raise LinkFailure(
                    f"transfer data stopped arriving: nothing more within {timeout_s} s "
                    f"after {index} chunks"
                )
            if self._failure is not None:
                raise LinkFailure(self._failure)
            return self._pieces[index] if index < len(self._pieces) else None


@dataclass(frozen=True, slots=True)
class Message:
    """One received transfer, as the receiving socket consumes it."""

    src: str  # sending socket id, e.g. "rdu-n0-s3"
    tag: str  # collective tag; "" for point-to-point
    step: int  # step within the collective
    arrival_ns: int  # emulated arrival computed by the sender's link model, ns
    nbytes: int  # declared size, bytes (what the link model charged)
    # The data, possibly still arriving; None for a timing-only transfer.
    parts: Parts | None
    dtype: str  # numpy dtype name of the payload, "" when none
    shape: tuple[int, ...]  # elements per dimension; () when none

    def payload(self, timeout_s: float) -> Buffer | None:
        """The data as one buffer once all is in (`Parts.join`); None in timing mode."""
        return None if self.parts is None else self.parts.join(timeout_s)


class Mailbox:
    """Thread-safe store of received messages, taken by exact (tag, step, src) key."""

    def __init__(self, owner: str) -> None:
        self.owner = owner  # the receiving socket's id, named in every error
        self._messages: dict[Key, Message] = {}
        self._cond = threading.Condition()
        # Set by `abort` (another thread: a peer of the job died): every wait fails with
        # it until `reset`.
        self._aborted: str | None = None

    def put(self, msg: Message) -> None:
        """Store `msg`; a second message with the same key is a protocol error."""
        key = (msg.tag, msg.step, msg.src)
        with self._cond:
            if key in self._messages:
                raise LinkFailure(
                    f"{self.owner}: duplicate message from {msg.src} for {msg.tag!r} step "
                    f"{msg.step} (protocol error: each collective step carries at most one "
                    "message per sender)"
                )
            self._messages[key] = msg
            # Every waiter re-checks its own key; waking one could wake the wrong one.
            self._cond.notify_all()

    def take(
        self,
        tag: str,
        step: int,
        src: str,
        timeout_s: float,
        give_up: Callable[[], BaseException | None] = lambda: None,
    ) -> Message:
        """Block until the message (tag, step, src) is here, remove and return it.

        Raises LinkFailure after `timeout_s` seconds (wall time) without it, or at once
        once `abort` was called. `give_up` is asked before each wait and whenever the
        wait wakes (`wake`): an exception it returns is raised at once (the waiter's own
        sends failed: the reply may never come).
        """
        if not timeout_s >= 0:  # also refuses NaN
            raise InvalidRequest(f"timeout_s must be >= 0, got {timeout_s}")
        key = (tag, step, src)
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while key not in self._messages:
                if self._aborted is not None:
                    raise LinkFailure(
                        f"{self.owner}: stopped waiting for {src} ({tag!r} step {step}): "
                        f"{self._aborted}"
                    )
                reason = give_up()
                if reason is not None:
                    raise reason
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise LinkFailure(
                        f"{self.owner}: no message from {src} for {tag!r} step {step} within "
                        f"{timeout_s} s (is the sender alive and its link up?)"
                    )
                self._cond.wait(remaining)
            return self._messages.pop(key)

    def abort(self, reason: str) -> None:
        """Fail every wait, now and until `reset`, with `reason` (the job is over: a
        peer died and its messages will never come)."""
        with self._cond:
            self._aborted = reason
            self._cond.notify_all()

    def reset(self) -> None:
        """A job took or gave back the socket: wait normally again, and drop what is
        pending. No message is due then (a job's sockets are all reserved before any of
        them runs, and its calls have all returned before it releases them); what is
        here is left over from a failed run, and a retry of the job (same id, so the
        same tags) must not take it."""
        with self._cond:
            self._aborted = None
            self._messages.clear()

    def wake(self) -> None:
        """Wake every waiter to ask its `give_up` again."""
        with self._cond:
            self._cond.notify_all()

    def discard(self, tag: str) -> int:
        """Drop every pending message of `tag` (cleanup after a failed collective), so a
        retry under the same tag does not see stale data. Returns how many were dropped."""
        with self._cond:
            stale = [k for k in self._messages if k[0] == tag]
            for k in stale:
                del self._messages[k]
            return len(stale)

    def stray(self, prefix: str, tag: str) -> Message | None:
        """A message whose tag starts with `prefix` but is not `tag` (a peer that issued
        another collective where this socket waits for `tag`), if one is here."""
        with self._cond:
            return next(
                (m for (t, _, _), m in self._messages.items() if t != tag and t.startswith(prefix)),
                None,
            )

    def pending(self) -> int:
        """Messages received and not yet taken."""
        with self._cond:
            return len(self._messages)
