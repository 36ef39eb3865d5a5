"""The client's inbox: a session's replies, held raw and bounded, decoded into a `Result` or an `Event`.

A chunk becomes a Result; an error, a drain notice or a reply that does not decode becomes an Event.

Zenoh's callback only deposits (raw bytes into the bounded `Inbox`, no decode on Zenoh's thread); the
caller's `take` waits on the inbox's condition and `decode` runs on the caller's thread.

Invariant: the inbox holds at most INBOX_MAX messages and INBOX_MAX_BYTES (unless one message alone is
larger), in arrival order; past either the oldest event goes first, then the oldest chunk, never the newest.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from wire import ActionChunk, DrainNotice, Error, ErrorCode, MsgType, WireError, decode_message, unpack_header
from wire.header import MSG_TYPE_OFFSET

INBOX_MAX = 64  # messages the inbox holds: past it (or INBOX_MAX_BYTES) the oldest event goes, else the oldest chunk
INBOX_MAX_BYTES = 8 << 20  # their payloads and attachments together: a chunk is a few KB, a 32 MiB message is no chunk


@dataclass
class Result:
    seq_id: int
    episode_id: int
    session_epoch: int
    chunk_model: np.ndarray
    chunk_robot: np.ndarray
    rtt_s: float
    queue_wait_ms: float
    inference_ms: float
    superseded_seqs: int = 0
    server_load: float = 0.0
    rtc_applied: bool = False
    inference_emulated: bool = False
    t_recv: float = 0.0  # monotonic seconds
    session_id: str = ""
    error: None = None
    sent_ns: int = 0  # the request's client_mono_ns (echoed): when it was sent, on this client's monotonic clock
    routed_ns: int | None = None  # when the first router routed the chunk, on this client's monotonic clock (its
    # Zenoh timestamp: the router's wall clock, so a router on another host adds the two hosts' clocks' difference)


@dataclass
class Event:
    """An EVENT from the server: an Error for a request (or the session) or a DrainNotice."""

    kind: (
        str  # "error" | "drain" | "bad_chunk" (a reply that does not decode, or a chunk whose header and body disagree)
    )
    code: str
    message: str
    seq_id: int | None
    episode_id: int
    session_epoch: int
    details: dict = field(default_factory=dict)

    @property
    def error(self) -> str:
        return self.code


def _is_chunk(attachment: bytes) -> bool:
    """Whether a message's attachment header says CHUNK (its msg_type byte, wire.header), without unpacking it."""
    return len(attachment) > MSG_TYPE_OFFSET and attachment[MSG_TYPE_OFFSET] == MsgType.CHUNK


class Inbox:
    """Raw messages (t_ns, payload, attachment, routed_ns) in arrival order, bounded; `deposit` never waits."""

    def __init__(self):
        self._items: deque = deque()
        self.nbytes = 0  # the held payloads and attachments together
        self._cv = threading.Condition()
        self._interrupted = False  # set by interrupt(): a waiting take returns None at once

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self):
        return iter(list(self._items))

    def deposit(self, item: tuple) -> None:
        """Append `item` (t_ns, payload, attachment, routed_ns) and wake a waiting `take`. Past INBOX_MAX
        messages or INBOX_MAX_BYTES the oldest event (error, drain notice, anything but a chunk) goes first, then
        the oldest chunk, never the newest message: a stream of events after a chunk pushed the chunk out of a
        message-capped inbox, and its request timed out (a hostile server's 200 events a chunk: 1 timeout in 51
        requests). Read from the header's msg_type byte, no decode on Zenoh's thread; a message whose header lies
        is dropped at decode."""
        with self._cv:
            self._items.append(item)
            self.nbytes += len(item[1]) + len(item[2])
            while len(self._items) > INBOX_MAX or (self.nbytes > INBOX_MAX_BYTES and len(self._items) > 1):
                last = len(self._items) - 1  # the newest always stays
                at = next((i for i, old in enumerate(self._items) if i < last and not _is_chunk(old[2])), 0)
                gone = self._items[at]
                del self._items[at]
                self.nbytes -= len(gone[1]) + len(gone[2])
            self._cv.notify_all()

    def take(self, deadline: float | None) -> tuple | None:
        """The oldest message, waiting until monotonic `deadline` (None: for ever); None once it passes or
        after `interrupt()`."""
        with self._cv:
            while not self._items:
                left = None if deadline is None else deadline - time.monotonic()
                if self._interrupted or (left is not None and left <= 0):
                    self._interrupted = False
                    return None
                self._cv.wait(left)
            item = self._items.popleft()
            self.nbytes -= len(item[1]) + len(item[2])
            return item

    def interrupt(self) -> None:
        """Wake the thread blocked in `take` (it returns None now, or its next wait does)."""
        with self._cv:
            self._interrupted = True
            self._cv.notify_all()

    def clear(self) -> None:
        with self._cv:
            self._items.clear()
            self.nbytes = 0


def decode(t_ns: int, payload: bytes, att: bytes, routed_ns: int | None = None) -> Result | Event | None:
    """One inbox message as the caller sees it: a Result for a chunk whose header and body agree, an Event for an
    error, a drain notice or anything that does not decode, None for any other message."""
    try:
        h = unpack_header(att)
        msg = decode_message(payload)
    except WireError as exc:
        return Event("bad_chunk", exc.code, f"undecodable message from the server: {exc}", None, 0, 0)
    if isinstance(msg, ActionChunk):
        if h.msg_type != MsgType.CHUNK or msg.seq_id_echo != h.seq_id:
            return Event(
                "bad_chunk",
                ErrorCode.MALFORMED,
                "chunk header and body disagree",
                h.seq_id,
                h.episode_id,
                h.session_epoch,
            )
        return Result(
            h.seq_id,
            h.episode_id,
            h.session_epoch,
            msg.chunk_model,
            msg.chunk_robot,
            (t_ns - msg.client_mono_ns_echo) / 1e9,
            msg.queue_wait_ms,
            msg.inference_ms,
            msg.superseded_seqs,
            msg.server_load,
            msg.rtc_applied,
            msg.inference_emulated,
            t_ns / 1e9,
            msg.session_id,
            sent_ns=msg.client_mono_ns_echo,
            routed_ns=routed_ns,
        )
    if isinstance(msg, DrainNotice):
        return Event(
            "drain",
            ErrorCode.DRAINING,
            msg.reason or "replica draining",
            None,
            h.episode_id,
            h.session_epoch,
            {"replica_id": msg.replica_id, "deadline_ms": msg.deadline_ms},
        )
    if isinstance(msg, Error):
        return Event(
            "error",
            msg.code,
            msg.message,
            msg.seq_id if msg.seq_id is not None else h.seq_id,
            h.episode_id,
            h.session_epoch,
            msg.details,
        )
    return None
