"""The answers to the remote worker's requests: its outstanding request, and the chunks and events that answer it.

For each chunk or event that arrives, `Replies.handle` decides whether it answers the outstanding request, is
sound, and is merged into the queue, or is refused, counted and recorded.

Invariants:
- A chunk is merged only if it answers the latest outstanding request of the current session epoch and episode,
  and only if it is sound (`chunk_problem`: this session's, `chunk_size` rows, the queue's invariant of finite rows
  of `len(action_names)`, the request's own `client_mono_ns` and episode echoed); a bad one is counted
  (`bad_chunks`), fails its request like a timeout and never answers the offline clock.
- A sound chunk of this session, merged or not, and an acknowledged reset answer the offline clock (`last_ok`);
  only a merged one answers the DEGRADED clock (`last_merged`).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from edge.latency import LatencyTracker
from edge.queue import ActionQueue, check_chunk
from edge.remote.handoff import Handoff
from edge.remote.link import Link
from edge.remote.plan import delay_steps
from edge.remote.session import Session

log = logging.getLogger(__name__)

NAN = float("nan")


@dataclass(frozen=True)
class Meta:
    """Provenance of a merged chunk (shared by its rows)."""

    session_id: str
    seq_id: int
    episode_id: int
    t_obs: float  # monotonic s when the source observation was taken


def chunk_problem(r, m, action_dim: int) -> str:
    """Why a chunk cannot be executed whatever it answers ("" if it can): another session's, another size than
    the session's chunk_size, or the queue's refusal (not floating point, not (chunk_size, len(action_names)) in
    both spaces, a NaN or an infinity). Checked here, on the worker, as the chunk arrives: never per tick."""
    ack = m.ack if m is not None else None
    if ack is None or r.session_epoch != m.epoch:
        return ""  # another session's: never merged (late), nothing to judge it by
    if r.session_id != ack.session_id:
        return f"it names session {r.session_id!r}; this session is {ack.session_id!r}"
    for name in ("chunk_model", "chunk_robot"):
        rows = np.shape(getattr(r, name))[:1]
        if rows != (ack.chunk_size,):
            return f"{name} has shape {np.shape(getattr(r, name))}; the session's chunks have {ack.chunk_size} rows"
    try:
        check_chunk(r.chunk_model, r.chunk_robot, action_dim)
    except ValueError as exc:
        return str(exc)
    return ""


def unanswered_record(
    seq, delay, encode_ms, send_lag_ms, outcome: str, execution_steps: int, steps_remaining: int
) -> dict:
    """The record of a request that got no chunk (no round trip to report)."""
    return {
        "t": time.monotonic(),
        "seq": seq,
        "rtt_ms": NAN,
        "queue_wait_ms": NAN,
        "inference_ms": NAN,
        "network_ms": NAN,
        "encode_ms": encode_ms,
        "send_lag_ms": send_lag_ms,
        "merge_lag_ms": NAN,
        "delay_steps": delay,
        "execution_steps": execution_steps,
        "steps_remaining": steps_remaining,
        "superseded_seqs": 0,
        "outcome": outcome,
    }


def merged_record(r, out: tuple, real_delay: int, merged_at: float, execution_steps: int, steps_remaining: int) -> dict:
    """The record of the outstanding request `out` answered by the chunk `r`, merged at `merged_at`."""
    seq, _epoch, _episode, _t_obs, _idx_before, delay, encode_ms, send_lag_ms, _sent_ns = out
    rtt_ms = r.rtt_s * 1e3
    return {
        "t": r.t_recv,
        "seq": seq,
        "rtt_ms": rtt_ms,
        "queue_wait_ms": r.queue_wait_ms,
        "inference_ms": r.inference_ms,
        "network_ms": rtt_ms - r.queue_wait_ms - r.inference_ms,
        "encode_ms": encode_ms,
        "send_lag_ms": send_lag_ms,
        # from the chunk's arrival (Zenoh's callback) to its merge here, on this worker
        "merge_lag_ms": (merged_at - r.t_recv) * 1e3,
        "delay_steps": delay,
        # from the first router routing the chunk to its arrival here (its Zenoh timestamp)
        "downlink_from_router_ms": (r.t_recv * 1e9 - r.routed_ns) / 1e6 if r.routed_ns else math.nan,
        "execution_steps": execution_steps,
        "steps_remaining": steps_remaining,
        "superseded_seqs": r.superseded_seqs,
        "outcome": "ok",
        "real_delay": real_delay,
        "sent_ns": r.sent_ns,
    }


class Replies:
    """The outstanding request of a worker and the handling of what answers it (Worker.request awaits, the inbox
    drain between requests reads late chunks and events)."""

    def __init__(
        self,
        cfg,
        queue: ActionQueue,
        tracker: LatencyTracker,
        counters: dict[str, int],
        link: Link,
        handoff: Handoff,
        records: deque,
        session: Session,
        latency_override: Callable[[int], float] | None = None,
    ):
        self.cfg, self.queue, self.tracker, self.counters, self.link = cfg, queue, tracker, counters, link
        self.handoff, self.records, self.session, self.latency_override = handoff, records, session, latency_override
        self.dt = 1.0 / cfg.fps
        self.A = len(cfg.action_names)
        self.last_error = ""
        self.last_ok = self.last_merged = time.monotonic()  # the offline and DEGRADED clocks (start() restarts them)
        # the request in flight: (seq, epoch, episode, t_obs, idx_before, delay, encode_ms, send_lag_ms, sent_ns)
        self.outstanding: tuple | None = None
        self.abandoned_seq: int | None = None  # the request an episode reset stopped waiting for (request)
        self.pending_outcome: str | None = None  # a drain or UNKNOWN_SESSION read while draining the inbox
        self.execution_steps = 0  # s of the request last sent (its records report it)
        self.steps_remaining = 0  # the queue's length when the last request left (its records carry it)

    def record_timeout(
        self, seq, delay, encode_ms, outcome, sent_ns: int | None = None, send_lag_ms: float = NAN
    ) -> None:
        """The record of a request that got no chunk: timeout, lost, abandoned."""
        rec = unanswered_record(seq, delay, encode_ms, send_lag_ms, outcome, self.execution_steps, self.steps_remaining)
        if sent_ns is not None:
            rec["sent_ns"] = sent_ns
        self.records.append(rec)

    def _record_failed(self, out, outcome: str) -> None:
        """The record of a request answered with an error or a bad chunk."""
        self.records.append(
            unanswered_record(out[0], out[5], out[6], out[7], outcome, self.execution_steps, self.steps_remaining)
        )

    def drain_inbox(self) -> None:
        m = self.session.model
        while True:
            r = m.poll()
            if r is None:
                return
            outcome = self.handle(r)
            if outcome in ("drain", "unknown_session"):
                self.pending_outcome = outcome

    def _refuse_chunk(self, out, problem: str) -> str:
        """The outstanding request's chunk is unusable: the request failed (a bad chunk, counted and recorded as one;
        DEGRADED, as for a timeout) and the next one may leave at once."""
        self.counters["errors"] += 1
        self.counters["bad_chunks"] += 1
        self.last_error = f"bad chunk: {problem}"
        log.warning("%s: chunk of seq %d refused: %s", self.cfg.client_uuid, out[0], problem)
        self._record_failed(out, "bad_chunk")
        self.outstanding = None
        self.link.fire("request_failed", f"bad chunk: {problem}")
        return "bad_chunk"

    def handle(self, r) -> str:
        """Merge a chunk (if it answers the outstanding request and is sound) or act on an event."""
        from edge.client import Event

        m = self.session.model
        out = self.outstanding
        if isinstance(r, Event):
            if r.kind == "drain":
                return "drain"  # the client matched its replica id (a server's drain header carries epoch 0)
            if r.kind == "bad_chunk":  # undecodable, or header and body disagree: nothing in it can be trusted
                self.counters["bad_chunks"] += 1
                self.last_error = f"bad chunk: {r.code}: {r.message}"
                return "ignored"
            if m is None or r.session_epoch != m.epoch:
                # about an older session (seq ids restart at 1 in each): a late ACTION_MISMATCH of a session already
                # replaced killed the robot (DEAD), a late error failed the new session's request of the same seq
                return "ignored"
            if r.code == "UNKNOWN_SESSION":
                return "unknown_session"
            if r.code in ("WRONG_MODEL", "IDENTITY_MISMATCH", "ACTION_MISMATCH"):
                self.link.fire("fatal", f"server error {r.code}: {r.message}")
                return "error_final"
            if out is not None and r.seq_id == out[0]:
                self.counters["errors"] += 1
                self.last_error = f"{r.code}: {r.message}"
                self._record_failed(out, f"error:{r.code}")
                self.outstanding = None
                self.link.fire("request_failed", f"server error {r.code}")  # the state says so, as for a timeout
                return "error"
            return "ignored"
        # a chunk
        problem = chunk_problem(r, m, self.A)
        if problem:
            if out is not None and r.seq_id == out[0] and r.session_epoch == out[1]:
                return self._refuse_chunk(out, problem)
            self.counters["bad_chunks"] += 1  # answers nothing outstanding: counted, never merged
            self.last_error = f"bad chunk: {problem}"
            return "ignored"
        # A sound chunk of this session, like an acknowledged reset, answers the offline clock (DEAD after
        # max_offline_s offline): the server and the link work, even when the chunk comes too late to merge. A
        # robot whose episodes end before their chunks arrive runs its fallback (STALLED); it is not offline (at
        # 1 Hz, where the reacher's episode is two ticks, robots went DEAD that way with their server answering).
        # A bad chunk does not: a server that sends only those is offline, and the ladder runs to DEAD.
        if m is not None and r.session_epoch == m.epoch:
            self.last_ok = time.monotonic()
        if out is None or r.seq_id != out[0] or r.session_epoch != out[1]:
            if r.seq_id == self.abandoned_seq:
                self.counters["discarded_chunks"] += 1  # the finished episode's, no longer awaited
                return "ignored"
            self.counters["late_chunks"] += 1
            return "ignored"
        seq, epoch, episode, t_obs, idx_before, delay, encode_ms, send_lag_ms, sent_ns = out
        if r.sent_ns != sent_ns:
            # its rtt would be made up: one chunk echoing 0 set the delay estimate to the host's uptime, and every
            # later request shipped an inference_delay_steps the wire refuses (no chunk again in that session)
            return self._refuse_chunk(out, f"it echoes client_mono_ns {r.sent_ns}; seq {seq} was sent at {sent_ns}")
        if episode == self.handoff.episode and r.episode_id != episode:
            # the episode has not changed here: the server echoed another one (a reset in between is the case below)
            return self._refuse_chunk(out, f"it echoes episode {r.episode_id}; seq {seq} was sent in episode {episode}")
        self.outstanding = None
        if episode != self.handoff.episode:
            self.counters["discarded_chunks"] += 1  # a reset happened while it was in flight
            return "merged"
        latency = (
            r.rtt_s if self.latency_override is None else float(self.latency_override(self.counters["chunks"] + 1))
        )
        real_delay = delay_steps(latency, self.dt)
        try:  # sound by chunk_problem(); the queue keeps its own invariant whoever merges (edge.queue)
            self.queue.merge(
                r.chunk_model,
                r.chunk_robot,
                real_delay,
                idx_before,
                meta=Meta(m.ack.session_id if m.ack else "", seq, episode, t_obs),
            )
        except ValueError as exc:
            return self._refuse_chunk(out, str(exc))
        self.tracker.add(latency)
        self.last_ok = self.last_merged = time.monotonic()
        self.records.append(
            merged_record(r, out, real_delay, self.last_merged, self.execution_steps, self.steps_remaining)
        )
        self.counters["superseded_seqs"] += r.superseded_seqs
        self.counters["chunks"] += 1  # after its record: a chunk counted is a chunk drain_records() can return
        self.link.fire("chunk_merged", "chunk merged")
        return "merged"
