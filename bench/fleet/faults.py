"""Robot faults in a shard (kill, stop, pause, resume, restart of a robot's engine), applied off the control
loop by one thread, one at a time, in the order the runner sent them."""

from __future__ import annotations

import queue
import threading

from bench.fleet.priority import normal_thread_priority


class RobotFaults:
    """The shard's robot faults, applied by one thread of their own in the order they came, off the control loop:
    a restart that stops a slow engine must not be overtaken by the kill sent after it (a thread a fault let that
    kill land first and the restart revive it)."""

    def __init__(self, shard):  # the bench.fleet.shard.Shard whose robots these faults hit
        self.shard = shard
        self.queue: queue.Queue[dict] = queue.Queue()
        self._worker: threading.Thread | None = None

    def put(self, msg: dict) -> None:
        """A `robot_fault` message, on the control thread (the only one that calls this)."""
        if self._worker is None:  # started once, on the first fault
            self._worker = threading.Thread(target=self._loop, name="robot faults", daemon=True)
            self._worker.start()
        self.queue.put(msg)

    def _loop(self) -> None:
        """Robot faults run off the loop thread (stopping an engine may block on I/O), one at a time, in order."""
        normal_thread_priority()  # a restarted engine's threads must not inherit a real-time priority
        while True:
            f = self.queue.get()
            try:
                self.apply(f)
            finally:
                self.queue.task_done()

    def apply(self, f: dict) -> None:
        """One fault on its robots: kill, stop, pause, resume or restart each one's engine."""
        targets = [r for r in self.shard.robots if r.rid in set(f.get("robots", []))]
        action = f.get("action")
        ledger = self.shard.thread_cpu
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
                    self.shard.replaced_requests += int(getattr(r.engine, "counters", {}).get("requests", 0))
                    r.engine = self.shard.make_engine(r.spec["engine"])
                    r.engine.start()
                    r.killed = False
            except Exception as exc:
                self.shard.send({"type": "log", "message": f"robot fault {action} on {r.rid}: {exc!r}"})
        if ledger is not None:
            ledger.sample()  # this thread's CPU so far and the stops' last work
