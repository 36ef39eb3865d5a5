"""The control loop of a shard, on its loop thread: each slot when due, every robot's frames, observation and
action, then the records of its ticks and one step of the slot's robots.

Invariant: the loop thread does no I/O and no waiting other than for the next slot's due time (an engine
that raises is counted here, its traceback sent by the status thread); every tick is recorded with its
timing split (host delay vs engine time, see bench.fleet.ticks)."""

from __future__ import annotations

import math
import time
import traceback
import zlib

import numpy as np

from bench.fleet.robot import RobotSlot, engine_state_name
from bench.fleet.ticks import HOST_LATE, LATE, LATE_FRACTION, ON_TIME, TOO_LATE, classify_tick, slot_starved

FLUSH_PERIOD_S = 2.0
RAISED_SOURCE = "raised"  # a tick's source when the engine's notify_observation or get_action raised


def run_loop(shard) -> None:
    """Step every slot of the shard's robots when due, until the run's end or a stop."""
    sched = shard.schedule
    t0 = shard.t0
    sched.t0 = shard.start_msg.get("start_mono", t0)
    end = shard.start_msg.get("end_mono", math.inf)
    next_flush = time.monotonic() + FLUSH_PERIOD_S
    robots = shard.robots
    ticks = shard.ticks
    counts = shard.counts
    mono = time.monotonic
    while not shard.stop_event.is_set():
        sid, due = sched.next_due()
        now = mono()
        if due >= end:
            break
        if due > now:
            if shard.stop_event.wait(due - now):
                break
        t_wake = mono()
        cpu0 = time.thread_time()
        members = sched.members[sid]
        period = sched.slots[sid][0]
        batch = shard.batches[sid]
        states = batch.states
        n = len(members)
        actions: list = [None] * n
        got: list = [None] * n  # (action, t_begin, t_end, engine state) of each robot, in slot order
        rel = due - t0
        # The engines first, every robot of the slot, then the bench's bookkeeping: a robot's host_delay
        # is then the engine calls of the robots before it in the slot, not their records too.
        for j, r in enumerate(members):
            rs = robots[r]
            images = {name: cam.frame() for name, cam in rs.cameras} if rs.cameras else {}
            tb = mono()
            a, raised = None, False
            if not rs.killed:
                try:
                    call = "notify_observation"
                    rs.engine.notify_observation({"state": states[j], "images": images})
                    call = "get_action"
                    a = rs.engine.get_action()
                except Exception:  # the engine's contract broken: recorded (engine_raises), the robot holds
                    a, raised = None, True
                    engine_raised(rs, call)
            got[j] = (a, tb, mono(), engine_state_name(rs.engine) if not rs.killed else "DEAD", raised, images)
        rows = []  # the slot's ticks, each in bench.fleet.records.SCHEMAS["ticks"] order: one extend_rows
        n_none = n_late = n_host_late = 0  # the slot's counts, added to `counts` once
        late_after = LATE_FRACTION * period  # classify_tick's threshold, inlined: the common on-time tick
        for j, r in enumerate(members):
            rs = robots[r]
            state = states[j]
            a, tb, te, est, raised, _images = got[j]
            lateness = te - due
            host_delay = tb - due
            cls = ON_TIME if lateness <= late_after else classify_tick(lateness, host_delay, period)
            digest = zlib.crc32(state.tobytes())
            if a is None:
                rows.append(
                    (
                        rs.rid, rel, lateness * 1e3, host_delay * 1e3, (te - tb) * 1e3, cls, digest,
                        -1, "", -1, -1, np.nan, RAISED_SOURCE if raised else "none", True, est, rs.episode, None,
                    )
                )  # fmt: skip
            else:
                values = a.values
                if type(values) is not np.ndarray or values.dtype != np.float32:
                    values = np.asarray(values, dtype=np.float32)
                actions[j] = values
                seq, episode_id, index, age = a.seq_id, a.episode_id, a.chunk_index, a.age_s
                rows.append(
                    (
                        rs.rid, rel, lateness * 1e3, host_delay * 1e3, (te - tb) * 1e3, cls, digest,
                        -1 if seq is None else seq,
                        a.session_id or "",
                        -1 if episode_id is None else episode_id,
                        -1 if index is None else index,
                        np.nan if age is None else age,
                        a.source, False, est, rs.episode, values,
                    )
                )  # fmt: skip
            if cls:
                n_late += cls == LATE or cls == TOO_LATE
                n_host_late += cls == HOST_LATE
            n_none += a is None
        if rel >= 0:
            counts["ticks"] += n
            counts["none_ticks"] += n_none
            counts["late_ticks"] += n_late
            counts["host_late_ticks"] += n_host_late
        ticks.extend_rows(rows)
        observed = states.copy() if shard.observations is not None else None
        batch.step(actions)
        if observed is not None:
            record_observations(shard, batch, members, got, observed, rel)
        shard.loop_ticks += n  # warm-up included, as the loop's CPU time is (bench.fleet.threadcpu)
        done = batch.done
        if done.any():
            end_episodes(shard, batch, members, np.nonzero(done)[0], rel)
        t_done = mono()
        wall = t_done - t_wake
        cpu = time.thread_time() - cpu0
        skipped = sched.advance(sid, t_done)
        # the slot's budget is the time until the next slot fell due: past it, the loop is behind
        _, next_due = sched.next_due()
        budget = max(next_due - due, 0.0)
        shard.loop_rec.append(
            slot=sid,
            t=rel,
            robots=len(members),
            wall_ms=wall * 1e3,
            cpu_ms=cpu * 1e3,
            budget_ms=budget * 1e3,
            overrun=t_done > next_due or slot_starved(wall, cpu, period),
            skipped_ticks=skipped,
            shard=shard.index,
        )
        if skipped and rel >= 0:
            counts["host_late_ticks"] += skipped * len(members)
        if mono() >= next_flush:
            shard.ticks.flush()
            shard.loop_rec.flush()
            shard.episodes.flush()
            if shard.observations is not None:
                shard.observations.flush()
                if shard.frames is not None:
                    shard.frames.flush()
            next_flush = mono() + FLUSH_PERIOD_S


def record_observations(shard, batch, members, got, states, rel) -> None:
    """A dataset's rows of the slot, after its step (only when the run records one): each robot's state at this
    tick, the command it then executed (its engine's action clipped to the action space, or its hold) and the
    frames its engine was given."""
    obs, frames = shard.observations, shard.frames
    commands = np.asarray(batch.last_command, dtype=np.float32)
    for j, r in enumerate(members):
        rs = shard.robots[r]
        obs.append(robot=rs.rid, t=rel, robot_episode=rs.episode, state=states[j], command=commands[j])
        if frames is not None:
            for name, img in got[j][5].items():
                img = np.asarray(img)
                frames.append(
                    robot=rs.rid, t=rel, camera=name, height=img.shape[0], width=img.shape[1], pixels=img.tobytes()
                )


def end_episodes(shard, batch, members, idx, rel) -> None:
    """Record the episodes that ended in a slot, reset their engines and their robots."""
    _score, success = batch.episode_score()
    for j in idx:
        rs = shard.robots[members[j]]
        shard.episodes.append(
            robot=rs.rid,
            t=rel,
            robot_episode=rs.episode,
            success=bool(success[j]),
            length_s=float(batch.tick[j] / batch.fps),
        )
        rs.episode += 1
        if not rs.killed:
            try:
                rs.engine.reset()
            except Exception:
                engine_raised(rs, "reset")
    batch.reset(idx)


def engine_raised(rs: RobotSlot, call: str) -> None:
    """On the loop thread: count it; keep the first traceback for the status thread to send (no I/O here)."""
    rs.raises += 1
    if not rs.first_raise:
        rs.first_raise = f"engine.{call}() raised: {traceback.format_exc(limit=8).strip()}"
