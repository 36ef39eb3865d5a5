"""A fleet shard: one process hosting many robots, each with its own `remote` engine and Zenoh session.

    control thread (runner's socket) ── start / stop / robot_fault
    loop thread:   for each phase slot when due:  frames → notify_observation → get_action → record
                   then RobotBatch.step(actions) for the slot's robots (None = hold)
    status thread: every second drain engine records + transitions into buffers, send status
    records writer thread (bench.fleet.records): Arrow IPC files in the run's records/ directory

`python -m bench.fleet.shard --spec shard-K.json --control /tmp/.../control.sock`

Invariant: the loop thread does no I/O and no waiting other than for the next slot's due time;
everything slow (draining engines, writing files, talking to the runner) happens on other threads.
Every tick is recorded with its timing split (host delay vs engine time, see bench.fleet.tick
This module owns the shard's process and its threads' lifecycle (`Shard`: control, status, start, teardown);
a robot's spec and slot are bench.fleet.robot, building them bench.fleet.build, the hot loop
bench.fleet.loop, robot faults bench.fleet.faults, draining the engines bench.fleet.drain.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from bench.fleet import threadcpu
from bench.fleet.build import SLOTS_PER_PERIOD
from bench.fleet.build import build as build_shard
from bench.fleet.drain import INT32_MAX
from bench.fleet.drain import drain as drain_engines
from bench.fleet.faults import RobotFaults
from bench.fleet.loop import FLUSH_PERIOD_S, RAISED_SOURCE
from bench.fleet.loop import run_loop as run_control_loop
from bench.fleet.priority import LOOP_FIFO_PRIORITY, normal_thread_priority, raise_loop_priority
from bench.fleet.records import RecordWriter
from bench.fleet.robot import RobotSlot, engine_factory, engine_state_name, make_remote_engine, robot_seed, robot_spec

__all__ = [
    "FLUSH_PERIOD_S",
    "INT32_MAX",
    "LOOP_FIFO_PRIORITY",
    "RAISED_SOURCE",
    "SLOTS_PER_PERIOD",
    "STATUS_PERIOD_S",
    "RobotSlot",
    "Shard",
    "engine_factory",
    "engine_state_name",
    "main",
    "make_remote_engine",
    "normal_thread_priority",
    "raise_loop_priority",
    "robot_seed",
    "robot_spec",
]

STATUS_PERIOD_S = 1.0


class Shard:
    """One shard process: its control channel to the runner, its robots and their record buffers, and the
    threads that run them (control, loop, status, robot faults)."""

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
        # a dataset's per-tick observations and camera frames (bench.run.dataset): None when not recorded,
        # so the loop's only cost without them is one test per slot
        record = spec.get("record") or {}
        self.observations = self.writer.buffer("observations", 4096) if record.get("dataset") else None
        self.frames = self.writer.buffer("frames", 1024) if record.get("dataset") and record.get("cameras") else None
        self.loop_ticks = 0  # robot-ticks the loop stepped, warm-up included
        self.thread_cpu: threadcpu.Ledger | None = None  # from the loop's start: each thread's CPU, kept past its end
        self.replaced_requests = 0  # requests of engines a restart replaced: their workers' CPU is in thread_cpu
        self.counts = {"ticks": 0, "none_ticks": 0, "late_ticks": 0, "host_late_ticks": 0, "too_late_ticks": 0}
        self.recent_rtt: list[float] = []
        self.faults = RobotFaults(self)  # applied off the control loop, in the order they came
        self.control = None
        self.t0 = 0.0
        self.loop_priority = "normal"  # the control loop's, once it runs (bench.fleet.priority)
        # the engines' network workers: on one shared thread of this shard (the default), or a thread each as
        # on a robot (fleet.engine_workers: threads); a test's engine factory gets no pool
        self.engine_pool = None
        if not spec.get("engine_factory") and spec.get("engine_workers", "pool") == "pool":
            from edge.remote.drive import WorkerPool

            self.engine_pool = WorkerPool(f"remote-engine pool shard-{self.index}")
            pool = self.engine_pool
            self.make_engine = lambda cfg: make_remote_engine(cfg, pool=pool)
        else:
            self.make_engine = engine_factory(spec.get("engine_factory"))

    # --- control -------------------------------------------------------------------------------

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
            self.faults.put(msg)

    # --- building and the control loop ---------------------------------------------------------

    def build(self) -> None:
        build_shard(self)

    def run_loop(self) -> None:
        run_control_loop(self)

    # --- status / drain thread -----------------------------------------------------------------

    def drain(self) -> None:
        drain_engines(self)

    def _send_raises(self) -> None:
        for rs in self.robots:
            if rs.first_raise and not rs.raise_sent:
                rs.raise_sent = True
                self.send({"type": "log", "message": f"robot {rs.rid}: {rs.first_raise}"})

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
            self.send(
                {"type": "log", "message": f"clock offset from the runner's: {self.start_msg['clock_offset_s']:+.6f} s"}
            )
        error = None
        self.thread_cpu, t_loop = threadcpu.Ledger(), time.monotonic()
        try:
            prof_dir = os.environ.get("BENCH_PROFILE_DIR")  # profile the control loop thread (cProfile)
            if prof_dir:
                import cProfile

                prof = cProfile.Profile(time.thread_time)  # CPU time: a wait for the GIL is not the loop's
                prof.runcall(self.run_loop)
                prof.dump_stats(os.path.join(prof_dir, f"shard{self.index}.prof"))
            else:
                self.run_loop()
        except Exception as exc:
            error = f"loop failed: {exc!r}\n{traceback.format_exc()}"
        self.stop_event.set()
        status.join(5)
        # before the teardown: its CPU (stopping every engine) is not the run's
        requests = sum(
            int(getattr(r.engine, "counters", {}).get("requests", 0)) for r in self.robots if r.engine is not None
        )
        moves = {
            str(r.rid): int(getattr(r.engine, "counters", {}).get("moves", 0))
            for r in self.robots
            if r.engine is not None and getattr(r.engine, "counters", {}).get("moves", 0)
        }
        thread_cpu = {
            **self.thread_cpu.report(),
            "wall_s": round(time.monotonic() - t_loop, 3),
            "ticks": self.loop_ticks,
            "requests": requests + self.replaced_requests,
        }
        final = self.teardown()
        if error:
            self.send({"type": "error", "error": error})
            return 1
        parity = {str(r.rid): r.engine.parity for r in self.robots if getattr(r.engine, "parity", None) is not None}
        raises = {str(r.rid): {"count": r.raises, "first": r.first_raise} for r in self.robots if r.raises}
        self.send(
            {
                "type": "done",
                "final_states": final,
                "moves": moves,
                "status": self.status_counts_only(),
                "parity": parity,
                "engine_raises": raises,
                "loop_priority": self.loop_priority,
                "thread_cpu": thread_cpu,
            }
        )
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
        for buf in (self.ticks, self.loop_rec, self.episodes, self.requests, self.transitions, self.observations):
            if buf is not None:
                buf.flush()
        if self.frames is not None:
            self.frames.flush()
        self.writer.close()
        if self.engine_pool is not None:
            self.engine_pool.close(wait=False)
        return final


def _quiet(fn):
    try:
        fn()
    except Exception:
        pass


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
