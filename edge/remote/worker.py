"""The remote engine's network worker: it opens the session, sends each request when it is due and merges the
chunk that answers it, as steps that a thread of its own or a shared pool runs (edge.remote.drive).

    wait: qsize <= H - s (edge.remote.plan), a new observation (edge.remote.handoff), an acknowledged session
    idx_before + prefixes as on the obs's tick, delay ─► encode JPEG ─► put obs ─► await chunk (timeout)
    accept only the outstanding seq of this epoch ─► merge(ceil(rtt/dt), idx_before), tracker.add(rtt)

Each request ends in an outcome word (`ok`, `timeout`, `error`, `streak`, `lost`, `drain`, `unknown_session`,
`stopped`) that the run loop turns into a link event (edge.remote.link) and, for a lost session, a back-off.

Invariants:
- A chunk's row 0 belongs to its observation's tick: the prefix starts with the action executed on that tick and
  the merge counts it as consumed (the queue's snapshot taken in notify_observation).
- A chunk is merged only if it answers the latest outstanding request of the current session epoch and episode,
  and only if it is sound: edge.remote.replies judges and merges what arrives.
- Only monotonic clocks; no wall-clock instant crosses the wire.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from edge.engine import EngineState
from edge.latency import LatencyTracker
from edge.queue import ActionQueue, fit_prefix
from edge.remote.drive import Call, Wait, run_inline
from edge.remote.handoff import Handoff
from edge.remote.link import Backoff, Link
from edge.remote.plan import ExecutionPlan, delay_steps, is_due, plan_execution
from edge.remote.rebalance import Rebalancer, plan_move
from edge.remote.replies import Replies
from edge.remote.session import Session, camera_shapes

log = logging.getLogger(__name__)

S = EngineState


class Worker:
    def __init__(
        self,
        cfg,
        queue: ActionQueue,
        tracker: LatencyTracker,
        counters: dict[str, int],
        link: Link,
        handoff: Handoff,
        records: deque,
        connection=None,
        latency_override: Callable[[int], float] | None = None,
    ):
        self.cfg, self.queue, self.tracker, self.counters, self.link = cfg, queue, tracker, counters, link
        self.handoff = handoff
        self.dt = 1.0 / cfg.fps
        self.rebalancer = Rebalancer(cfg)
        self.session = Session(cfg, connection, wake=handoff.wake, nudge=handoff.nudge, on_token=self.rebalancer.token)
        self.backoff = Backoff(cfg, handoff.nudge, handoff.stop, counters)
        self.replies = Replies(cfg, queue, tracker, counters, link, handoff, records, self.session, latency_override)
        self.ready = False  # a replica said it is warmed up
        self.sent_version = -1  # the handoff slot's version last sent
        self.timeouts_in_row = 0
        self.started_episode = -1  # the episode whose episode_start went out (worker-owned: no race with reset)
        self._warned_plans: set[tuple[int, int, int]] = set()  # (d, s, H) already warned about

    # --- the run loop: sessions, back-off, outcomes --------------------------------------------------------

    def run(self) -> None:
        """The worker on this thread (a robot's: one thread per engine)."""
        run_inline(self.steps())

    def steps(self):
        """The worker as steps (edge.remote.drive): run_inline on a thread of its own, or on a WorkerPool."""
        cfg, link, stop = self.cfg, self.link, self.handoff.stop
        backoff = cfg.reconnect_initial_backoff_s
        exclude: set[str] = set()
        opened_at_chunks = -1  # counters["chunks"] when the current session opened
        while not stop.is_set() and link.state != S.DEAD:
            offline = time.monotonic() - self.replies.last_ok
            if not self.session.acked or link.state in (S.CONNECTING, S.RECONNECTING):
                if offline > cfg.max_offline_s:
                    link.fire(
                        "fatal",
                        f"offline for more than max_offline_s={cfg.max_offline_s:g} s "
                        f"({self.replies.last_error or 'no server'})",
                    )
                    break
                self.handoff.nudge.clear()  # a replica token appearing from now on cuts the backoff below
                if (yield from self.handshake(exclude)):
                    # the backoff starts over once this session merges a chunk, not on its ack: a replica that
                    # acknowledges and then drains, forgets or fails every session would otherwise be asked again
                    # at once, again and again (a drain notice on every open: 51 reconnects in 4 s)
                    opened_at_chunks = self.counters["chunks"]
                    exclude = set()
                    continue
                if link.state == S.DEAD:
                    break
                exclude = set()  # after a failed round every replica is a candidate again
                if (yield from self.backoff.waiting(backoff)):
                    break
                backoff = self.backoff.grown(backoff)
                continue
            outcome = yield from self.cycle()
            if self.counters["chunks"] != opened_at_chunks:
                backoff = cfg.reconnect_initial_backoff_s
                self.backoff.chunk_merged()
            if outcome in ("lost", "drain", "unknown_session", "streak"):
                m = self.session.model
                if outcome == "drain" and m.replica is not None:
                    exclude = {m.replica.replica_id}
                self.counters["reconnects"] += 1
                link.fire("reconnect", outcome)
                if self.counters["chunks"] == opened_at_chunks:  # the session gave nothing: back off before the next
                    if (yield from self.backoff.waiting(backoff)):
                        break
                    backoff = self.backoff.grown(backoff)
            elif outcome in ("timeout", "error") and time.monotonic() - self.replies.last_ok > cfg.max_offline_s:
                link.fire(
                    "fatal",
                    f"no chunk for more than max_offline_s={cfg.max_offline_s:g} s ({self.replies.last_error or 'timeouts'})",
                )
        yield Call(self.session.close)

    def handshake(self, exclude: set[str]):
        """One handshake round (steps: its queries are a Call); True with a session acknowledged."""
        p95, deadline = self.tracker.p95(), self.replies.last_ok + self.cfg.max_offline_s
        opened = yield Call(lambda: self.session.open(exclude, p95, deadline, self._camera_shapes))
        if opened.error:
            self.replies.last_error = opened.error
        if opened.fatal:
            self.link.fire("fatal", opened.fatal)
        if opened.ack is None:
            return False
        self._accepted(opened.ack)
        return True

    def _accepted(self, ack) -> None:
        """A session acknowledged (a handshake or a rebalancing move): adopt what it says."""
        self.rebalancer.opened(time.monotonic())
        if self.queue.rtc_enabled and not ack.rtc_enabled:
            # the server downgraded the session (its policy cannot guide): replace mode would throw away
            # the leftover at every merge with nothing blending the seam, so append as LeRobot does
            log.warning(
                "%s: %s serves this session without RTC; merging in append mode", self.cfg.client_uuid, ack.replica_id
            )
            self.queue.set_rtc_enabled(False)
        if ack.warmed_up:
            self.ready = True
        self.replies.outstanding = None
        self.replies.pending_outcome = (
            None  # an event about the previous session (e.g. its drain) is not about this one
        )
        self.started_episode = -1  # a new session starts its first episode with episode_start
        self.link.fire(
            "session_paused" if self.handoff.paused else "session", f"session {ack.session_id} on {ack.replica_id}"
        )

    def rebalance(self, episode: int):
        """At the boundary into `episode`, when a check is due: read the replicas' loads and perhaps move the
        session (edge.remote.rebalance). True when a move was tried: the old session is then closed and the new
        one's first request carries the episode start, so no reset goes out. Steps: its queries are Calls."""
        m, now = self.session.model, time.monotonic()
        if m is None or m.replica is None or self.session.first_ack is None or not self.rebalancer.due(now):
            return False
        own = m.replica.replica_id
        try:
            found = yield Call(lambda: m.discover(self.session.control_timeouts.timeout_s("status")))
        except Exception as exc:  # a zenoh error while the router restarts: stay, look again later
            log.info("%s: rebalance check failed: %s", self.cfg.client_uuid, exc)
            self.rebalancer.checked(time.monotonic(), lone=True)
            return False
        self.counters["rebalance_checks"] += 1
        move = plan_move(
            found, own, self.session.first_ack.checkpoint_hash, self.cfg.rebalance_threshold, self.rebalancer.rng
        )
        lone = not any(s.replica_id != own for s in found)
        self.rebalancer.checked(time.monotonic(), any(not s.ready for s in found), move is not None, lone)
        if move is None or not move.target:
            return False
        by_id = {s.replica_id: s for s in found}
        m.episode_id = int(episode)
        p95, deadline = self.tracker.p95(), self.replies.last_ok + self.cfg.max_offline_s
        candidates = [by_id[move.target], by_id[own]]  # the target refuses (full by now): stay where it was
        opened = yield Call(lambda: self.session.open(set(), p95, deadline, self._camera_shapes, candidates=candidates))
        if opened.error:
            self.replies.last_error = opened.error
        if opened.fatal:
            self.link.fire("fatal", opened.fatal)
            return True
        if opened.ack is not None:
            if opened.ack.replica_id != own:
                self.counters["moves"] += 1
                log.info(
                    "%s: moved from %s (load %.2f, fair share %.2f) to %s",
                    self.cfg.client_uuid,
                    own,
                    move.own_load,
                    move.fair_share,
                    opened.ack.replica_id,
                )
            self._accepted(opened.ack)
        return True  # without an ack the run loop opens a session as after any lost one

    def _camera_shapes(self) -> dict[str, list[int]]:
        slot = self.handoff.latest()
        return camera_shapes(self.cfg.cameras, slot[0] if slot else {})

    def step(self, timeout_s: float | None = None) -> str:
        """One request on the caller's thread (RemoteEngine.step_once): handshake if needed, send the latest
        observation, wait for its chunk (for `timeout_s`, which becomes request_timeout_s, if given)."""
        return run_inline(self._step(timeout_s))

    def _step(self, timeout_s: float | None):
        if not self.session.acked and not (yield from self.handshake(set())):
            return "no_session"
        slot = self.handoff.latest()
        if slot is None:
            return "no_observation"
        if timeout_s is not None:
            self.cfg.request_timeout_s = float(timeout_s)
        return (yield from self.request(self.session.model, slot[0], slot[1], slot[3], slot[5]))

    # --- when to ask -----------------------------------------------------------------------------------------

    def delay_steps(self) -> int:
        """The delay estimate d in control steps (what each request ships as inference_delay_steps)."""
        return delay_steps(self.tracker.max(), self.dt)

    def execution_plan(self) -> ExecutionPlan:
        """The request point for the delay measured now (edge.remote.plan.plan_execution); a plan that breaks RTC's
        d <= s <= H - d is logged once per (d, s, H)."""
        ack = self.session.first_ack
        chunk = int(getattr(ack, "chunk_size", 0) or 0) or int(round(1.0 / self.dt))  # before a session: 1 s
        plan = plan_execution(self.delay_steps(), chunk, self.dt, self.cfg.buffer_time_s, self.queue.rtc_enabled)
        key = (plan.delay_steps, plan.execution_steps, plan.chunk_size)
        if plan.violation and key not in self._warned_plans:
            self._warned_plans.add(key)
            self.counters["plan_warnings"] += 1
            log.warning("%s: %s", self.cfg.client_uuid, plan.violation)
        return plan

    def cycle(self):
        """Wait until a request is due, send it, await its chunk (steps). Returns an outcome word."""
        m, h = self.session.model, self.handoff
        if m.server_lost.is_set():
            return "lost"
        if h.reset_pending is not None:
            ep = h.reset_pending
            h.reset_pending = None
            if (yield from self.rebalance(ep)):
                return "ok"
            try:  # acknowledged, but not awaited: the next observation's episode_start resets the session too
                # seeded from the measured round trip: a slow link's ack still counts in resets_acked
                self.session.control_timeouts.seed(self.tracker.p95())
                m.reset_nowait(ep, self._on_reset_reply, timeout_s=self.session.control_timeouts.timeout_s("reset"))
            except Exception as exc:
                log.info("%s: reset to episode %d not sent: %s", self.cfg.client_uuid, ep, exc)
        # wait for: a fresh observation, queue playback under the buffer, not paused
        while not h.stop.is_set():
            h.wake.clear()
            self.replies.drain_inbox()  # late chunks, events
            if m.server_lost.is_set():
                return "lost"
            if self.replies.pending_outcome:
                out, self.replies.pending_outcome = self.replies.pending_outcome, None
                return out
            slot = h.latest()
            # a request carries an observation not sent yet and taken while the queue was at or under the
            # buffer (notify_observation), so it leaves on the tick that made it due, not up to a period later
            fresh = slot is not None and slot[2] != self.sent_version and slot[4]
            qsize = self.queue.qsize()
            plan = self.execution_plan()
            h.due_buffer_s = plan.buffer_s  # notify_observation marks observations taken at or under it
            buffered = qsize * self.dt - plan.buffer_s  # > 0: seconds until a request is due
            # due now, counting the action the observation's tick takes (it may not have run yet); a chunk
            # merged since the observation refilled the queue, and that observation is no longer due
            if not h.paused and h.reset_pending is None and fresh and is_due(qsize, self.dt, plan.buffer_s):
                break
            if h.reset_pending is not None:
                return "ok"
            self._check_degraded()
            # The tick that brings the queue to the buffer wakes us with its observation (notify_observation):
            # one wake-up a request, not a poll; every needless wake-up costs the control loop of a shard
            # hosting hundreds of engines its GIL. The timeout is the DEGRADED check's, or a backstop.
            h.want_obs = not h.paused
            if h.paused:
                timeout = 1.0
            elif buffered > 0:
                timeout = buffered + self.dt + 1e-3
                if self.link.state == S.STREAMING:
                    timeout = min(
                        timeout,
                        max(self.replies.last_merged + self.cfg.degraded_after_s - time.monotonic(), 0.0) + 1e-3,
                    )
                timeout = min(timeout, 1.0)
            else:
                timeout = 0.25  # waiting for an observation: notify_observation wakes us first
            yield Wait(h.wake, timeout)
            h.want_obs = False
        if h.stop.is_set():
            return "stopped"
        obs, t_obs, version, episode, _due, at_obs = slot
        self.sent_version = version
        self.replies.execution_steps = plan.execution_steps
        return (yield from self.request(m, obs, t_obs, episode, at_obs))

    def _on_reset_reply(self, acked: bool) -> None:  # on Zenoh's thread
        if acked:
            self.counters["resets_acked"] += 1
            self.replies.last_ok = time.monotonic()  # the server holds this session: not offline (see handle)

    def _check_degraded(self) -> None:
        if (
            self.link.state == S.STREAMING
            and time.monotonic() - self.replies.last_merged > self.cfg.degraded_after_s
            and self.queue.qsize() > 0
        ):
            self.link.fire("no_chunk", f"no chunk for {self.cfg.degraded_after_s:g} s")

    # --- one request -------------------------------------------------------------------------------------------

    def request(self, m, obs: dict, t_obs: float, episode: int, at_obs: tuple[int, int] | None = None):
        """Send one observation and await its chunk (steps: the wait is on the handoff's wake, which every
        arrival, a reset and stop() set). Returns an outcome word."""
        c, h = self.cfg, self.handoff
        H = c.execution_horizon
        # the leftover and index on the observation's tick (its own action included): the chunk's row 0 is
        # that tick's, as the policy plans it; the queue now, if a merge came in between
        left_model, left_robot, idx_before = self.queue.left_over_since(at_obs)
        prefix_model = prefix_robot = None
        if self.queue.rtc_enabled and H > 0:
            prefix_model = fit_prefix(left_model, H)
            prefix_robot = fit_prefix(left_robot, H)
        delay = self.delay_steps()
        remaining = self.replies.steps_remaining = (
            self.queue.qsize()
        )  # actions left as it leaves (wire: steps_remaining)
        t0 = time.monotonic()
        images = {n: (obs.get("images") or {})[n] for n in c.cameras if n in (obs.get("images") or {})}
        episode_start = episode != self.started_episode
        try:
            seq = m.observe(
                c.urgency,
                state=np.asarray(obs["state"], np.float32),
                images=images,
                episode_id=episode,
                inference_delay_steps=delay,
                prefix_model=prefix_model,
                prefix_robot=prefix_robot,
                episode_start=episode_start,
                steps_remaining=remaining,
                **({"task": obs["task"]} if obs.get("task") else {}),
            )
        except Exception as exc:
            self.replies.last_error = f"observe failed: {type(exc).__name__}: {exc}"
            self.counters["errors"] += 1
            return "error"
        self.started_episode = episode
        encode_ms = (time.monotonic() - t0) * 1e3
        self.counters["requests"] += 1
        # from the observation's tick to this worker taking it up: its wake-up (on a bench shard, every engine's
        # worker shares a process and its GIL with the control loop, so this is where a busy shard shows)
        send_lag_ms = (t0 - t_obs) * 1e3
        self.replies.outstanding = (
            seq,
            m.epoch,
            episode,
            t_obs,
            idx_before,
            delay,
            encode_ms,
            send_lag_ms,
            m.last_sent_ns,
        )
        deadline = t0 + c.request_timeout_s
        while not h.stop.is_set():
            if h.episode != episode:
                # The episode ended while this request was in flight: its chunk would be discarded on arrival,
                # so waiting for it only delays the new episode's first request by the rest of a round trip.
                # Abandoned, not timed out: its chunk, if it comes, is counted as discarded.
                self.replies.abandoned_seq = seq
                self.replies.outstanding = None
                self.replies.record_timeout(
                    seq, delay, encode_ms, "abandoned", sent_ns=int(t0 * 1e9), send_lag_ms=send_lag_ms
                )
                return "ok"
            left = deadline - time.monotonic()
            if left <= 0:
                break
            h.wake.clear()  # before the look: an arrival after it wakes the wait below
            r = m.get_result(0)
            if m.server_lost.is_set():
                self.replies.record_timeout(seq, delay, encode_ms, "lost", send_lag_ms=send_lag_ms)
                return "lost"
            if r is None:
                yield Wait(h.wake, min(left, 0.25))
                continue
            outcome = self.replies.handle(r)
            if outcome == "merged":
                self.timeouts_in_row = 0
                return "ok"
            if outcome in ("drain", "unknown_session"):
                return outcome
            if outcome in ("error", "error_final"):
                return "error"
            if outcome == "bad_chunk":
                # no usable chunk, as a timeout: a streak of them reconnects (perhaps to a sound replica)
                self.timeouts_in_row += 1
                if self.timeouts_in_row >= c.timeout_streak:
                    self.timeouts_in_row = 0
                    return "streak"
                return "error"
        if h.stop.is_set():
            return "stopped"
        # timed out: the request stays outstanding (a late answer may still be merged)
        self.counters["timeouts"] += 1
        self.timeouts_in_row += 1
        self.replies.record_timeout(seq, delay, encode_ms, "timeout", send_lag_ms=send_lag_ms)
        self.link.fire("request_failed", "request timed out")
        if self.timeouts_in_row >= c.timeout_streak:
            self.timeouts_in_row = 0
            return "streak"
        return "timeout"
