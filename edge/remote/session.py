"""The remote engine's session: its connection to the router and the handshake that opens (or reopens) it.

The worker owns it. `open` runs one round of the session-open ladder (edge.client.Model.open: status query,
replica choice, session open) with the handshake's control timeouts, which double after a round nobody answered
in time (edge.client.ControlTimeouts) and settle with a session. Invariant: a model other than the first one
acknowledged is never served (a reconnect asks for that exact checkpoint, and another capability is fatal).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

# what a reconnect must find unchanged
CAPABILITIES = ("checkpoint_hash", "policy_type", "action_names", "state_dim", "chunk_size", "model_id", "rtc_enabled")


def capability_mismatch(first, ack) -> str:
    """The first capability that differs between two acks, as "name old -> new" ("" if none)."""
    for name in CAPABILITIES:
        a, b = getattr(first, name), getattr(ack, name)
        if a != b:
            return f"{name} {a!r} -> {b!r}"
    return ""


def camera_shapes(cameras: list[str], obs: dict) -> dict[str, list[int]]:
    """Camera shapes for the session open, from an observation (placeholders for a camera it lacks)."""
    imgs = obs.get("images") or {}
    out = {}
    for name in cameras:
        frame = imgs.get(name)
        shape = list(np.asarray(frame).shape) if frame is not None and not hasattr(frame, "to_wire") else [1, 1, 3]
        out[name] = shape
    return out


@dataclass
class Opened:
    """One handshake round: the ack (None if no session), the error to report, and a fatal reason (DEAD)."""

    ack: Any = None
    error: str = ""
    fatal: str = ""


class Session:
    def __init__(self, cfg, connection=None, wake=None, nudge=None, on_token=None):
        from edge.client import ControlTimeouts

        self.cfg = cfg
        self.control_timeouts = ControlTimeouts(cfg.control_timeout_max_s)
        self.conn_given = connection
        self.conn = None
        self.model = None  # edge.client.Model, made on the first handshake
        self.first_ack = None
        self._wake, self._nudge, self._on_token = wake, nudge, on_token

    @property
    def acked(self) -> bool:
        return self.model is not None and self.model.ack is not None

    def session_id(self) -> str:
        m = self.model
        ack = m.ack if m is not None else None
        return ack.session_id if ack is not None else ""

    def connect(self) -> None:
        if self.conn is not None:
            return
        from edge.client import Connection

        if self.conn_given is not None:
            self.conn = self.conn_given
            return
        c, tls = self.cfg, None
        if c.tls_ca:
            from wire.transport import TlsFiles

            tls = TlsFiles(c.tls_ca, c.tls_cert, c.tls_key)
        self.conn = Connection(
            c.connect_endpoints, c.client_uuid, c.client_type, root=c.root, lease_ms=c.lease_ms, tls=tls
        )

    def open(
        self,
        exclude: set[str],
        p95_s: float,
        deadline: float,
        camera_shapes: Callable[[], dict[str, list[int]]],
        candidates: list | None = None,
    ) -> Opened:
        """One handshake round, skipping the replicas in `exclude`, before `deadline` (monotonic s); with
        `candidates` (Status), on those replicas in that order, without a discovery (a rebalancing move)."""
        from edge.client import NoReplica, SessionRefused

        try:
            self.connect()
            if self.model is None:
                c = self.cfg
                self.model = self.conn.model(
                    c.model_id,
                    c.revision,
                    priority=c.priority,
                    open=False,
                    task=c.task,
                    fps=c.fps,
                    action_names=list(c.action_names),
                    state_dim=c.state_dim,
                    cameras=camera_shapes(),
                    rtc_enabled=c.rtc_enabled,
                    execution_horizon=c.execution_horizon,
                    expected_checkpoint_hash=c.expected_checkpoint_hash,
                    replica_order=list(c.replica_order),
                    tags=dict(c.tags),
                    jpeg_quality=c.jpeg_quality,
                )
                self.model.wake = self._wake
                self.model.nudge = self._nudge
                self.model.on_token = self._on_token
            if self.first_ack is not None:  # a reconnect: this exact checkpoint or nothing
                self.model.open_args["expected_checkpoint_hash"] = self.first_ack.checkpoint_hash
            ct = self.control_timeouts
            ct.seed(p95_s)
            ack = self.model.open(
                exclude,
                status_timeout_s=ct.timeout_s("status"),
                session_timeout_s=ct.timeout_s("session"),
                deadline=deadline,
                candidates=candidates,
            )
        except SessionRefused as exc:
            return Opened(error=str(exc), fatal=f"session refused: {exc}")
        except NoReplica as exc:
            # a link slower than the timeouts fails every round alike unless they grow; a refusal in words
            # (CAPACITY...) came in time: nothing grows, and what a slow link needed is kept for the next round
            if exc.unanswered:
                self.control_timeouts.grow()
            log.info("%s: no session yet: %s", self.cfg.client_uuid, exc)
            return Opened(error=str(exc))
        except (ConnectionError, TimeoutError) as exc:
            log.info("%s: no session yet: %s", self.cfg.client_uuid, exc)
            return Opened(error=str(exc))
        except Exception as exc:  # a zenoh error while the router restarts, and the like
            error = f"{type(exc).__name__}: {exc}"
            log.warning("%s: handshake failed: %s", self.cfg.client_uuid, error)
            return Opened(error=error)
        self.control_timeouts.settle()
        if self.first_ack is None:
            self.first_ack = ack
        else:
            mismatch = capability_mismatch(self.first_ack, ack)
            if mismatch:
                self.model.close()
                return Opened(fatal=f"the server came back with another model: {mismatch}")
        return Opened(ack=ack)

    def close(self) -> None:
        try:
            if self.model is not None:
                self.model.close()
            if self.conn is not None and self.conn_given is None:
                self.conn.close()
        except Exception:
            pass
        self.conn = None if self.conn_given is None else self.conn
        self.model = None if self.conn_given is None else self.model
