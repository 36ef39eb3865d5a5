"""What one served model sends back to its clients, and the bookkeeping of each reply.

    a result of ModelRuntime.infer ──► answer: ActionChunk (header echoed) or Error event ──► the session's publisher
                                   └─► book: metrics, per-session and replica sketches, audit line (after the batch)
    a refusal of the intake, an expired or dropped request ──► event_error (+ audit line)

Owns: `Replies` (chunks, error events, audit lines). Invariants: every chunk echoes seq_id, episode_id,
client_mono_ns and session_epoch of the observation it answers; a batch's replies all go out before
any of their bookkeeping; an error event goes on the client's action key, on its session's publisher
when it has one.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from server.served import Pending, Served
from wire import ActionChunk, Error, ErrorCode, Header, MsgType

if TYPE_CHECKING:
    from server.sessions import Session


def _event_qos() -> dict:
    """EVENT QoS for a one-off `session.put` (no publisher for a client without a session)."""
    from wire.qos import EVENT, publisher_kwargs

    kw = publisher_kwargs(EVENT)
    kw.pop("reliability", None)  # a publisher-only option in zenoh-python 1.x
    return kw


class Replies:
    """The reply side of one PolicyServer (its metrics, audit log, mailbox and Zenoh session)."""

    def __init__(self, server: Served):
        self.srv = server

    def event_error(self, key: str, header: Header | None, err: Error, session: Session | None = None) -> None:
        """An EVENT on the client's action key (derived from its obs key), echoing what we know of the header."""
        action_key = key[: -len("obs")] + "action" if key.endswith("/obs") else key
        h = Header(
            1,
            MsgType.EVENT,
            header.seq_id if header else 0,
            header.episode_id if header else 0,
            header.client_mono_ns if header else 0,
            header.session_epoch if header else 0,
        )
        try:
            if session is not None and session.publisher is not None:
                session.publisher.put(err.encode(), attachment=h.pack())
            else:
                self.srv.z.put(action_key, err.encode(), attachment=h.pack(), **_event_qos())
        except Exception:
            self.srv.metrics.inc("send_errors", model=self.srv.info.model_id)

    def expired(self, reqs: list) -> None:
        """Requests that outlived scheduling.request_ttl_ms in the queue: counted, audited, their clients told."""
        srv = self.srv
        for req in reqs:
            srv.metrics.inc("requests_expired", model=srv.info.model_id)
            p: Pending = req.payload
            p.session.outcomes["expired"] += 1
            self.audit(p.session, p.header, (time.monotonic() - req.arrived) * 1e3, 0.0, None, 0, "expired")
            self.event_error(
                p.session.keys.action,
                p.header,
                Error(
                    ErrorCode.EXPIRED,
                    f"request waited over {srv.m.scheduling.request_ttl_ms} ms in the queue",
                    seq_id=p.header.seq_id,
                ),
                session=p.session,
            )

    def answer(self, req, res, t_pick: float, sent: list) -> bytes | None:
        """Publish the chunk (or the error event); returns the chunk body sent, if any. A chunk's metrics and audit
        line are left in `sent` for `book`, after the batch's other replies went out: done here, each reply
        of a batch waited for every earlier one's (the replica's time outside its queue and pass, 5.5 / 11.0 ms p50
        at batches of 16 / 40 on the H100 host, most of it after the pass)."""
        srv = self.srv
        p: Pending = req.payload
        s, h = p.session, p.header
        wait_ms = (t_pick - req.arrived) * 1e3
        superseded = srv.mailbox.take_superseded(s.session_id)
        model = srv.info.model_id
        if res.error:
            if (
                res.error_code == "INTERNAL"
                and req.retries < srv.mailbox.max_retries
                and srv.mailbox.requeue(req).requeued
            ):
                srv.metrics.inc("dispatch_retries", model=model)
                return
            code = res.error_code or ErrorCode.INTERNAL
            if code == "INTERNAL":
                srv.metrics.inc("dispatch_errors", model=model, error="forward")
            elif code == ErrorCode.NON_FINITE_ACTION:  # the policy's output, not the observation's form, failed
                srv.metrics.inc("non_finite_actions", model=model)
            else:
                srv.metrics.inc("observation_errors", model=model, code=code)
            s.outcomes[f"error:{code}"] += 1
            self.event_error(
                s.keys.action, h, Error(code, f"inference failed: {res.error}", seq_id=h.seq_id), session=s
            )
            self.audit(s, h, wait_ms, res.inference_ms, None, superseded, f"error:{code}")
            return
        chunk = ActionChunk(
            s.session_id,
            h.seq_id,
            h.client_mono_ns,
            res.chunk_model,
            res.chunk_robot,
            queue_wait_ms=max(0.0, wait_ms),
            inference_ms=res.inference_ms,
            superseded_seqs=superseded,
            server_load=srv.active_sessions() / max(1, srv.info.effective_max_sessions),
            rtc_applied=res.rtc_applied,
            inference_emulated=res.emulated_ms > 0,
        )
        body = chunk.encode()
        header = Header(h.schema_version, MsgType.CHUNK, h.seq_id, h.episode_id, h.client_mono_ns, h.session_epoch)
        handed_ns = time.monotonic_ns()  # the chunk is handed to Zenoh: the put may deliver it before it returns
        try:
            s.publisher.put(body, attachment=header.pack())
            sent_ns = handed_ns
            srv.metrics.inc("chunks_sent", model=model)
            outcome = "ok"
        except Exception as exc:
            srv.metrics.inc("send_errors", model=model)
            outcome, sent_ns = f"send_error:{type(exc).__name__}", None
        s.outcomes[outcome] += 1
        sent.append((req, res, wait_ms, superseded, outcome, t_pick, handed_ns, sent_ns))
        return body

    def book(
        self, req, res, wait_ms: float, superseded, outcome: str, t_pick: float, handed_ns: int, sent_ns: int | None
    ) -> None:
        """A sent chunk's metrics, per-session percentiles and audit line (`answer` left them for after the
        batch's replies)."""
        srv = self.srv
        p: Pending = req.payload
        s, h = p.session, p.header
        model = srv.info.model_id
        srv.metrics.observe("queue_wait_ms", wait_ms, model=model)
        srv.metrics.observe("inference_ms", res.inference_ms, model=model)
        srv.metrics.observe("e2e_latency_ms", (handed_ns / 1e9 - req.arrived) * 1e3, model=model)
        # per-robot percentiles in fixed memory, for the /sessions status (never a metric label)
        s.queue_wait_ms.add(wait_ms)
        s.inference_ms.add(res.inference_ms)
        srv.recent_queue_wait_ms.add(wait_ms)
        srv.recent_inference_ms.add(res.inference_ms)
        self.audit(
            s,
            h,
            wait_ms,
            res.inference_ms,
            [0, int(res.chunk_robot.shape[0])],
            superseded,
            outcome,
            emulated_ms=res.emulated_ms,
            rtc_applied=res.rtc_applied,
            forward_ms=round(res.forward_ms, 3),
            batch=res.batch,
            received_mono_ms=round(p.received_ns / 1e6, 3) if p.received_ns else None,
            routed_mono_ms=round(p.routed_ns / 1e6, 3) if p.routed_ns else None,
            picked_mono_ms=round(t_pick * 1e3, 3),
            sent_mono_ms=round(sent_ns / 1e6, 3) if sent_ns else None,
        )

    def audit(self, s: Session, h: Header, wait_ms, inference_ms, chunk_range, superseded, outcome, **extra) -> None:
        info = self.srv.info
        self.srv.audit.write(
            {
                "session_id": s.session_id,
                "client_uuid": s.client_uuid,
                "seq_id": h.seq_id,
                "episode_id": h.episode_id,
                "client_mono_ns": h.client_mono_ns,
                "queue_wait_ms": round(wait_ms, 3),
                "inference_ms": round(inference_ms, 3),
                "chunk_range": chunk_range,
                "superseded_seqs": superseded,
                "outcome": outcome,
                "model_id": info.model_id,
                "replica_id": info.replica_id,
                "checkpoint_hash": info.checkpoint_hash,
                **extra,
            }
        )
