"""A fleet shard: one process hosting many robots, each with its own `remote` engine and Zenoh session.

    control thread (runner's socket) ── start / stop / robot_fault
    loop thread:   for each phase slot when due:  frames → notify_observation → get_action → record
                   then RobotBatch.step(actions) for the slot's robots (None = hold)
    status thread: every second drain engine records + transitions into buffers, send status
    records writer thread (bench.fleet.records): Arrow IPC files in the run's records/ directory

`python -m bench.fleet.shard --spec shard-K.json --control /tmp/.../control.sock`

Invariant: the loop thread does no I/O and no waiting other than for the next slot's due time;
everything slow (draining engines, writing files, talking to the runner) happens on other threads.
Every tick is recorded with its timing split (host delay vs engine time, see bench.fleet.ticks).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import signal
import sys
import threading
import time
import traceback
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from bench.fleet import threadcpu
from bench.fleet.records import RecordWriter
from bench.fleet.ticks import HOST_LATE, LATE, TOO_LATE, TickSchedule, classify_tick, slot_starved
from wire.procs import raise_priority

# Robots of a shard tick in this many slots per period, each slot one wake-up of the loop. Few and large:
# after its sleep a slot starts on cold caches (the VM's other processes ran in between), and that costs
# every slot ~0.5-1 ms of CPU however few robots it steps (the loop body alone, with 5 ms sleeps between
# slots: 53-73 us per robot-tick at 17 robots a slot, 39-45 at 34, 33 at 100; 20-25 without the sleeps).
# In the headline (100 robots a shard) 2 slots instead of 6 took the loop from 62-68 to 43-48 us per
# robot-tick. Not 1: a slot's last robots wait for the first ones (host_delay), and a longer slot
# holds the shard's GIL longer against its engine threads.
SLOTS_PER_PERIOD = 2
LOOP_FIFO_PRIORITY = 10  # SCHED_FIFO priority of the control loop thread, as a robot's real-time loop runs
STATUS_PERIOD_S = 1.0
FLUSH_PERIOD_S = 2.0
_FALLBACK_SOURCES = ("hold", "repeat_last", "zero", "fallback")
INT32_MAX = 2**31 - 1  # a record's int32 column: a server's count beyond it (a u32 on the wire) is held at it
RAISED_SOURCE = "raised"  # a tick's source when the engine's notify_observation or get_action raised


def robot_seed(seed: int, group_index: int, index: int) -> int:
    return int(np.random.SeedSequence([seed, group_index, index]).generate_state(1)[0])


def robot_spec(rid: int, group_index: int, index: int, group, seed: int, endpoint: str,
               seed_group_index: int | None = None) -> dict:
    """What a shard needs to build one robot and its engine (JSON-able; written by the runner).
    `seed_group_index`: seed the robot as robot `index` of that group (a `seeds_of` baseline)."""
    from bench.scenario.load import checkpoint_dir, engine_config

    engine = engine_config(group, endpoint)  # the config `bench validate` built and the engine accepted
    cams = None
    if group.cameras is not None:
        c = group.cameras
        cams = {"kind": c.kind, "names": list(c.names), "height": c.height, "width": c.width}
    shadow = None
    if getattr(group, "shadow", None):
        shadow = {**group.shadow, "checkpoint": str(checkpoint_dir(group.shadow.get("policy") or group.policy))}
    kind = getattr(group, "engine_kind", "remote")
    sg = group_index if seed_group_index is None else seed_group_index
    return {"robot": rid, "group": group.name, "group_index": group_index, "index": index, "robot_type": group.robot,
            "fps": group.fps, "episode_s": group.episode_s, "seed": robot_seed(seed, sg, index),
            "stagger_episodes": bool(getattr(group, "stagger_episodes", False)),
            "cameras": cams, "engine": engine, "shadow": shadow, "engine_kind": kind,
            "checkpoint": str(checkpoint_dir(group.policy)) if kind == "local" else None}


@dataclass
class RobotSlot:
    spec: dict
    rid: int
    engine: object = None
    cameras: list = field(default_factory=list)  # (name, camera)
    state: str = "CONNECTING"
    killed: bool = False
    episode: int = 0
    episode_t0: float = 0.0
    max_age: float = math.inf
    raises: int = 0  # engine calls that raised (the engine never raises: each one is the system failing)
    first_raise: str = ""  # the first one's call and traceback, sent to the runner by the status thread
    raise_sent: bool = False


def raise_loop_priority() -> str:
    """Run the calling thread (the control loop) as a real robot runs its loop: SCHED_FIFO when the host
    allows it, else nice -10, else unchanged. Returns which one took effect (reported in summary.json).

    On a loaded 2-core host the loop thread otherwise spends more time runnable-but-waiting for a core
    than running (measured: 28 % running, 39 % on the run queue), and that host lateness would hide what
    the network and the servers did. The loop sleeps between slots and its work is bounded (one slot of
    robots), and the kernel's RT throttling keeps 5 % of each second for everything else."""
    return raise_priority(os.environ.get("BENCH_LOOP_PRIORITY", "fifo"), LOOP_FIFO_PRIORITY, threading.get_native_id())


def normal_thread_priority() -> None:
    """Threads started by the loop thread inherit its policy: give them the ordinary one back."""
    try:
        os.sched_setscheduler(threading.get_native_id(), os.SCHED_OTHER, os.sched_param(0))
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 0)
    except (AttributeError, OSError):
        pass


def make_remote_engine(cfg: dict):
    from edge import RemoteEngineConfig, make_engine as _make

    return _make(RemoteEngineConfig.from_dict(dict(cfg)))


def engine_factory(path: str | None):
    """The engine constructor: edge's remote engine, or "module:function" (tests use a fake)."""
    if not path:
        return make_remote_engine
    import importlib

    mod, _, attr = path.partition(":")
    return getattr(importlib.import_module(mod), attr)


_STATE_NAMES: dict = {}  # engine state object -> its name (the loop asks 9000 times a second)


def engine_state_name(engine) -> str:
    st = getattr(engine, "state", None)
    try:
        name = _STATE_NAMES[st]
    except (KeyError, TypeError):
        name = str(getattr(st, "name", None) or getattr(st, "value", None) or str(st)).upper().split(".")[-1]
        try:
            _STATE_NAMES[st] = name
        except TypeError:
            pass
    if getattr(engine, "failed", False):
        return "DEAD"
    return name


class Shard:
    def __init__(self, spec: dict, control_path: str | None):
        self.spec = spec
        self.index = spec["shard"]
        self.control_path = control_path
        self.stop_event = threading.Event()
        self.start_event = threading.Event()
        self.start_msg: dict = {}
        self.robots: list[RobotSlot] = []
        self.batches: dict[int, object] = {}  # slot id -> RobotBatch
        self.writer = RecordWriter(spec["records_dir"], f"shard{self.index}")
        self.ticks = self.writer.buffer("ticks")
        self.loop_rec = self.writer.buffer("loop", 4096)
        self.episodes = self.writer.buffer("episodes", 4096)
        self.requests = self.writer.buffer("requests", 8192)
        self.transitions = self.writer.buffer("transitions", 4096)
        self.loop_ticks = 0  # robot-ticks the loop stepped, warm-up included
        self.thread_cpu: threadcpu.Ledger | None = None  # from the loop's start: each thread's CPU, kept past its end
        self.replaced_requests = 0  # requests of engines a restart replaced: their workers' CPU is in thread_cpu
        self.counts = {"ticks": 0, "none_ticks": 0, "late_ticks": 0, "host_late_ticks": 0, "too_late_ticks": 0}
        self.recent_rtt: list[float] = []
        # one thread applies robot faults, in the order they came, off the control loop: a restart that stops a
        # slow engine must not be overtaken by the kill sent after it (a thread a fault let that kill land first and
        # the restart revive it)
        self._fault_queue: queue.Queue[dict] = queue.Queue()
        self._fault_worker: threading.Thread | None = None
        self.control = None
        self.t0 = 0.0
        self.make_engine = engine_factory(spec.get("engine_factory"))

    # --- setup ---------------------------------------------------------------------------------

    def connect(self) -> None:
        from bench.fleet.control import ControlClient

        if self.control_path:
            self.control = ControlClient(self.control_path, self.on_message)
            self.send({"type": "hello", "shard": self.index, "pid": os.getpid()})

    def send(self, msg: dict) -> None:
        if msg.get("type") == "log":  # never from the loop thread: its own log file (logs/shard-K.log) keeps it
            print(f"shard {self.index}: {msg['message']}", file=sys.stderr, flush=True)
        if self.control is not None:
            msg.setdefault("shard", self.index)
            self.control.send(msg)

    def on_message(self, msg: dict) -> None:
        kind = msg.get("type")
        if kind == "start":
            self.start_msg = msg
            self.start_event.set()
        elif kind in ("stop", "closed"):
            self.stop_event.set()
            self.start_event.set()
        elif kind == "robot_fault":
            if self._fault_worker is None:  # the control thread's only: started once, on the first fault
                self._fault_worker = threading.Thread(target=self._fault_loop, name="robot faults", daemon=True)
                self._fault_worker.start()
            self._fault_queue.put(msg)

    def build(self) -> None:
        from bench.robots import core as robots_core

        specs = self.spec["robots"]
        self.robots = [RobotSlot(spec=s, rid=s["robot"], max_age=float(s["engine"].get("max_action_age_s", math.inf)))
                       for s in specs]
        keys = [(s["robot_type"], s["episode_s"]) for s in specs]
        self.schedule = TickSchedule(0.0, [1.0 / s["fps"] for s in specs], SLOTS_PER_PERIOD, keys=keys)
        for sid, members in enumerate(self.schedule.members):
            if not members:
                continue
            s0 = specs[members[0]]
            batch = robots_core.RobotBatch(s0["robot_type"], len(members), seed=0, fps=s0["fps"], episode_s=s0["episode_s"])
            from gymnasium.utils import seeding

            for j, r in enumerate(members):
                batch.rngs[j] = seeding.np_random(specs[r]["seed"])[0]
            batch.reset()
            # A fleet whose episodes all start on the same tick sends its episodes' first requests as one burst
            # (the headline's servers saw 27x more arrivals in the busiest 100 ms of each 2 s than in the
            # quietest): a staggered group lengthens each robot's first episode by a seeded part of one.
            batch.extend_episode(np.array([np.random.default_rng(specs[r]["seed"]).integers(0, batch.episode_ticks)
                                           if specs[r].get("stagger_episodes") else 0 for r in members]))
            self.batches[sid] = batch
            for j, r in enumerate(members):
                cams = specs[r].get("cameras")
                if cams:
                    from bench.robots.cameras import make_camera

                    view = batch.robot(j)
                    self.robots[r].cameras = [(name, make_camera(cams["kind"], view, cams["height"], cams["width"],
                                                                 seed=specs[r]["seed"] + k))
                                              for k, name in enumerate(cams["names"])]
        # engines: building them opens a Zenoh session each; do it on a few threads
        make_engine = self.make_engine

        def start_engine(r: RobotSlot):
            if r.spec.get("shadow"):  # golden parity: the remote engine in lockstep with a local one
                from bench.fleet.parity import make_parity_engine

                r.engine = make_parity_engine(r.spec["engine"], r.spec["shadow"], seed=r.spec["seed"])
            elif r.spec.get("engine_kind") == "local":  # the in-run baseline: the checkpoint here, no network
                from bench.fleet.local import make_local_engine

                r.engine = make_local_engine(r.spec["engine"], r.spec["checkpoint"])
            else:
                r.engine = make_engine(r.spec["engine"])
            r.engine.start()
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(start_engine, self.robots))

    # --- the control loop ----------------------------------------------------------------------

    def run_loop(self) -> None:
        sched = self.schedule
        t0 = self.t0
        sched.t0 = self.start_msg.get("start_mono", t0)
        end = self.start_msg.get("end_mono", math.inf)
        next_flush = time.monotonic() + FLUSH_PERIOD_S
        robots = self.robots
        ticks = self.ticks
        counts = self.counts
        mono = time.monotonic
        while not self.stop_event.is_set():
            sid, due = sched.next_due()
            now = mono()
            if due >= end:
                break
            if due > now:
                if self.stop_event.wait(due - now):
                    break
            t_wake = mono()
            cpu0 = time.thread_time()
            members = sched.members[sid]
            period = sched.slots[sid][0]
            batch = self.batches[sid]
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
                        self._engine_raised(rs, call)
                got[j] = (a, tb, mono(), engine_state_name(rs.engine) if not rs.killed else "DEAD", raised)
            for j, r in enumerate(members):
                rs = robots[r]
                state = states[j]
                a, tb, te, est, raised = got[j]
                lateness = te - due
                host_delay = tb - due
                cls = classify_tick(lateness, host_delay, period)
                if a is None:
                    ticks.append(robot=rs.rid, t=rel, lateness_ms=lateness * 1e3, host_delay_ms=host_delay * 1e3,
                                 engine_ms=(te - tb) * 1e3, tick_class=cls, state_digest=zlib.crc32(state.tobytes()),
                                 seq=-1, session_id="", episode_id=-1, chunk_index=-1, action_age_s=np.nan,
                                 source=RAISED_SOURCE if raised else "none", is_none=True, engine_state=est, robot_episode=rs.episode, action=None)
                else:
                    values = np.asarray(a.values, dtype=np.float32)
                    actions[j] = values
                    ticks.append(robot=rs.rid, t=rel, lateness_ms=lateness * 1e3, host_delay_ms=host_delay * 1e3,
                                 engine_ms=(te - tb) * 1e3, tick_class=cls, state_digest=zlib.crc32(state.tobytes()),
                                 seq=int(a.seq_id if a.seq_id is not None else -1), session_id=str(a.session_id or ""),
                                 episode_id=int(a.episode_id if a.episode_id is not None else -1),
                                 chunk_index=int(a.chunk_index if a.chunk_index is not None else -1),
                                 action_age_s=float(a.age_s) if a.age_s is not None else np.nan,
                                 source=str(a.source), is_none=False, engine_state=est, robot_episode=rs.episode,
                                 action=values)
                if rel >= 0:
                    counts["ticks"] += 1
                    counts["none_ticks"] += a is None
                    counts["late_ticks"] += cls == LATE or cls == TOO_LATE
                    counts["host_late_ticks"] += cls == HOST_LATE
            batch.step(actions)
            self.loop_ticks += n  # warm-up included, as the loop's CPU time is (bench.fleet.threadcpu)
            done = batch.done
            if done.any():
                self._end_episodes(batch, members, np.nonzero(done)[0], rel)
            t_done = mono()
            wall = t_done - t_wake
            cpu = time.thread_time() - cpu0
            skipped = sched.advance(sid, t_done)
            # the slot's budget is the time until the next slot fell due: past it, the loop is behind
            _, next_due = sched.next_due()
            budget = max(next_due - due, 0.0)
            self.loop_rec.append(slot=sid, t=rel, robots=len(members), wall_ms=wall * 1e3, cpu_ms=cpu * 1e3,
                                 budget_ms=budget * 1e3, overrun=t_done > next_due or slot_starved(wall, cpu, period),
                                 skipped_ticks=skipped, shard=self.index)
            if skipped and rel >= 0:
                counts["host_late_ticks"] += skipped * len(members)
            if mono() >= next_flush:
                self.ticks.flush()
                self.loop_rec.flush()
                self.episodes.flush()
                next_flush = mono() + FLUSH_PERIOD_S

    def _end_episodes(self, batch, members, idx, rel) -> None:
        _score, success = batch.episode_score()
        for j in idx:
            rs = self.robots[members[j]]
            self.episodes.append(robot=rs.rid, t=rel, robot_episode=rs.episode, success=bool(success[j]),
                                 length_s=float(batch.tick[j] / batch.fps))
            rs.episode += 1
            if not rs.killed:
                try:
                    rs.engine.reset()
                except Exception:
                    self._engine_raised(rs, "reset")
        batch.reset(idx)

    def _engine_raised(self, rs: RobotSlot, call: str) -> None:
        """On the loop thread: count it; keep the first traceback for the status thread to send (no I/O here)."""
        rs.raises += 1
        if not rs.first_raise:
            rs.first_raise = f"engine.{call}() raised: {traceback.format_exc(limit=8).strip()}"

    def _send_raises(self) -> None:
        for rs in self.robots:
            if rs.first_raise and not rs.raise_sent:
                rs.raise_sent = True
                self.send({"type": "log", "message": f"robot {rs.rid}: {rs.first_raise}"})

    def _fault_loop(self) -> None:
        """Robot faults run off the loop thread (stopping an engine may block on I/O), one at a time, in order."""
        normal_thread_priority()  # a restarted engine's threads must not inherit a real-time priority
        while True:
            f = self._fault_queue.get()
            try:
                self._robot_fault(f)
            finally:
                self._fault_queue.task_done()

    def _robot_fault(self, f: dict) -> None:
        targets = [r for r in self.robots if r.rid in set(f.get("robots", []))]
        action = f.get("action")
        ledger = self.thread_cpu
        if ledger is not None and action in ("kill", "stop", "restart"):
            ledger.sample()  # the workers of the engines about to stop: their CPU so far stays in the split
        for r in targets:
            try:
                if action in ("kill", "stop"):
                    r.killed = True
                    r.engine.stop()
                elif action == "pause":
                    r.engine.pause()
                elif action == "resume":
                    r.engine.resume()
                elif action == "restart":
                    r.killed = True
                    r.engine.stop()
                    self.replaced_requests += int(getattr(r.engine, "counters", {}).get("requests", 0))
                    r.engine = self.make_engine(r.spec["engine"])
                    r.engine.start()
                    r.killed = False
            except Exception as exc:
                self.send({"type": "log", "message": f"robot fault {action} on {r.rid}: {exc!r}"})
        if ledger is not None:
            ledger.sample()  # this thread's CPU so far and the stops' last work

    # --- status / drain thread -----------------------------------------------------------------

    def drain(self) -> None:
        rel_now = time.monotonic() - self.t0
        for rs in self.robots:
            eng = rs.engine
            if eng is None:
                continue
            try:
                recs = eng.drain_records()
                trans = eng.drain_transitions()
            except Exception:
                continue
            for rec in recs or ():
                rtt = _f(rec.get("rtt_ms"))
                t = rec.get("t")
                t = rel_now if t is None else self._rel(t)
                self.requests.append(robot=rs.rid, t=t, seq=int(rec.get("seq", rec.get("seq_id", -1)) or -1), rtt_ms=rtt,
                                     queue_wait_ms=_f(rec.get("queue_wait_ms")), inference_ms=_f(rec.get("inference_ms")),
                                     network_ms=_f(rec.get("network_ms")), encode_ms=_f(rec.get("encode_ms")),
                                     send_lag_ms=_f(rec.get("send_lag_ms")), merge_lag_ms=_f(rec.get("merge_lag_ms")),
                                     delay_steps=int(rec.get("delay_steps") or 0),
                                     execution_steps=int(rec.get("execution_steps") or 0),
                                     steps_remaining=int(rec.get("steps_remaining") or 0),
                                     superseded_seqs=min(int(rec.get("superseded_seqs") or 0), INT32_MAX),
                                     outcome=str(rec.get("outcome", "")), sent_ns=int(rec.get("sent_ns") or 0),
                                     downlink_from_router_ms=_f(rec.get("downlink_from_router_ms")))
                if math.isfinite(rtt):
                    self.recent_rtt.append(rtt)
            for tr in trans or ():
                t, frm, to, reason = _transition_fields(tr)
                self.transitions.append(robot=rs.rid, t=self._rel(t) if t is not None else rel_now,
                                        from_state=_state_str(frm), to_state=_state_str(to), reason=str(reason or ""))

    def _rel(self, t: float) -> float:
        """Engine timestamps are monotonic seconds; records use seconds since the run's t=0."""
        return float(t) - self.t0

    def status(self) -> dict:
        states: dict[str, int] = {}
        for rs in self.robots:
            st = "DEAD" if rs.killed else engine_state_name(rs.engine)
            states[st] = states.get(st, 0) + 1
        rtt = self.recent_rtt[-2000:]
        self.recent_rtt = rtt
        msg = {"type": "status", "robots": len(self.robots), "states": states, **self.counts}
        if rtt:
            msg["rtt_ms_p50"] = float(np.percentile(rtt, 50))
            msg["rtt_ms_p99"] = float(np.percentile(rtt, 99))
        return msg

    def status_loop(self) -> None:
        while not self.stop_event.wait(STATUS_PERIOD_S):
            try:
                if self.thread_cpu is not None:  # each second, so a thread that ends loses at most a second's CPU
                    self.thread_cpu.sample()
                self.drain()
                self.requests.flush()
                self.transitions.flush()
                self._send_raises()
                self.send(self.status())
            except Exception as exc:
                self.send({"type": "log", "message": f"status: {exc!r}"})

    # --- lifecycle -----------------------------------------------------------------------------

    def main(self) -> int:
        self.connect()
        try:
            self.build()
        except Exception as exc:
            self.send({"type": "error", "error": f"build failed: {exc!r}\n{traceback.format_exc()}"})
            self.teardown()
            return 2
        self.send({"type": "ready", "robots": len(self.robots)})
        self.start_event.wait()
        if self.stop_event.is_set() and not self.start_msg:
            self.teardown()
            return 0
        self.t0 = self.start_msg["t0_mono"]
        status = threading.Thread(target=self.status_loop, name="status", daemon=True)
        status.start()
        self.loop_priority = raise_loop_priority()
        self.send({"type": "log", "message": f"control loop priority: {self.loop_priority}"})
        if self.start_msg.get("clock_offset_s"):
            self.send({"type": "log", "message": f"clock offset from the runner's: {self.start_msg['clock_offset_s']:+.6f} s"})
        error = None
        self.thread_cpu, t_loop = threadcpu.Ledger(), time.monotonic()
        try:
            prof_dir = os.environ.get("BENCH_PROFILE_DIR")  # profile the control loop thread (cProfile)
            if prof_dir:
                import cProfile

                prof = cProfile.Profile()
                prof.runcall(self.run_loop)
                prof.dump_stats(os.path.join(prof_dir, f"shard{self.index}.prof"))
            else:
                self.run_loop()
        except Exception as exc:
            error = f"loop failed: {exc!r}\n{traceback.format_exc()}"
        self.stop_event.set()
        status.join(5)
        # before the teardown: its CPU (stopping every engine) is not the run's
        requests = sum(int(getattr(r.engine, "counters", {}).get("requests", 0)) for r in self.robots
                       if r.engine is not None)
        thread_cpu = {**self.thread_cpu.report(), "wall_s": round(time.monotonic() - t_loop, 3),
                      "ticks": self.loop_ticks, "requests": requests + self.replaced_requests}
        final = self.teardown()
        if error:
            self.send({"type": "error", "error": error})
            return 1
        parity = {str(r.rid): r.engine.parity for r in self.robots if getattr(r.engine, "parity", None) is not None}
        raises = {str(r.rid): {"count": r.raises, "first": r.first_raise} for r in self.robots if r.raises}
        self.send({"type": "done", "final_states": final, "status": self.status_counts_only(), "parity": parity,
                   "engine_raises": raises,
                   "loop_priority": getattr(self, "loop_priority", "normal"), "thread_cpu": thread_cpu})
        return 0

    def status_counts_only(self) -> dict:
        return {"type": "status", **self.counts}

    def teardown(self) -> dict:
        final = {str(r.rid): ("DEAD" if r.killed else engine_state_name(r.engine)) for r in self.robots if r.engine}
        try:
            self.drain()
        except Exception:
            pass
        with ThreadPoolExecutor(max_workers=16) as pool:
            list(pool.map(lambda r: _quiet(r.engine.stop) if r.engine is not None else None, self.robots))
        try:
            self.drain()  # the stop transitions
        except Exception:
            pass
        for buf in (self.ticks, self.loop_rec, self.episodes, self.requests, self.transitions):
            buf.flush()
        self.writer.close()
        return final


def _quiet(fn):
    try:
        fn()
    except Exception:
        pass


def _f(v) -> float:
    try:
        return float(v) if v is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


def _state_str(s) -> str:
    if s is None:
        return ""
    name = getattr(s, "name", None) or getattr(s, "value", None) or str(s)
    return str(name).upper().split(".")[-1]


def _transition_fields(tr):
    if isinstance(tr, dict):
        return tr.get("t"), tr.get("from", tr.get("from_state")), tr.get("to", tr.get("to_state")), tr.get("reason")
    if hasattr(tr, "to") or hasattr(tr, "to_state"):
        return (getattr(tr, "t", None), getattr(tr, "from_state", getattr(tr, "frm", None)),
                getattr(tr, "to_state", getattr(tr, "to", None)), getattr(tr, "reason", ""))
    t, frm, to, *rest = tr
    return t, frm, to, (rest[0] if rest else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fleet.shard")
    ap.add_argument("--spec", required=True, help="shard spec JSON written by the runner")
    ap.add_argument("--control", default=None, help="the runner's control socket")
    args = ap.parse_args(argv)
    from bench.fleet.clock import apply_test_skew

    apply_test_skew()  # tests only (BENCH_TEST_MONO_SKEW_S): this shard reads its clock as another host's would
    with open(args.spec) as f:
        spec = json.load(f)
    sys.setswitchinterval(0.001)  # many engine threads share this process: keep GIL hand-offs short
    shard = Shard(spec, args.control)
    signal.signal(signal.SIGTERM, lambda *_: (shard.stop_event.set(), shard.start_event.set()))
    signal.signal(signal.SIGINT, lambda *_: (shard.stop_event.set(), shard.start_event.set()))
    return shard.main()


if __name__ == "__main__":
    sys.exit(main())
