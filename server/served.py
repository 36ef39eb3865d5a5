"""What the planes of one served model see of it: the `Served` interface and the `Pending` payload.

    server.service.PolicyServer ──(is a)──► Served ◄── server.control, server.intake, server.replies
    Intake.accept ──► Request(payload=Pending) ──► Mailbox ──► dispatch loop ──► Replies.answer / book

Owns: `Served` (a typing.Protocol: exactly the members of a PolicyServer that its control plane, intake and
replies read or call) and `Pending` (what the dispatch thread needs of one accepted observation).
Invariant: the planes import this, never server.service; a member a plane newly uses is declared here
first, so the server's surface to its planes stays one list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from server.sessions import Session
from wire import Header, Observation

if TYPE_CHECKING:
    from server.audit import AuditLog
    from server.capture import CaptureWriter
    from server.guard import Guard
    from server.mailbox import Mailbox
    from server.manifest import Manifest
    from server.metrics import Metrics, WindowedSketch
    from server.runtime import ModelRuntime
    from server.sessions import ReplicaInfo, SessionRegistry
    from wire import ReplicaKeys
    from wire.tensors import Limits


@dataclass
class Pending:
    """What the dispatch thread needs of one accepted observation (the Request payload)."""

    session: Session
    header: Header
    obs: Observation
    payload_bytes: int
    raw: bytes | None = None  # kept only when debug capture is on
    received_ns: int = 0  # this server's monotonic clock when the observation reached it (audit: received_mono_ms)
    routed_ns: int | None = None  # the same clock when the first router routed it (audit: routed_mono_ms), if stamped


class Served(Protocol):
    """One served model as its planes use it (server.service.PolicyServer is the one implementation)."""

    m: Manifest
    info: ReplicaInfo
    keys: ReplicaKeys
    limits: Limits
    z: Any  # the Zenoh session: action publishers, one-off error events
    metrics: Metrics
    audit: AuditLog
    capture: CaptureWriter | None
    guard: Guard
    sessions: SessionRegistry
    mailbox: Mailbox
    runtime: ModelRuntime
    recent_queue_wait_ms: WindowedSketch
    recent_inference_ms: WindowedSketch
    default_latency_budget_ms: float
    ready: bool
    warmed_up: bool
    draining: bool

    def active_sessions(self) -> int:
        """The sessions open on this replica."""
        ...

    def set_load(self) -> None:
        """Publish active_sessions, active_clients and load after a session opened or closed."""
        ...

    def close_session(self, s: Session, why: str, count: bool = True) -> None:
        """Forget `s` (registry, mailbox, publisher); `count` it as a client_disconnected."""
        ...

    def start_dispatch(self) -> None:
        """Start this model's dispatch loops, once, with its first request."""
        ...
