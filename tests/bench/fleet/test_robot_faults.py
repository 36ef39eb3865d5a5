"""A shard applies robot faults one at a time, in the order the runner sent them."""

from __future__ import annotations

import threading

from bench.fleet.shard import RobotSlot, Shard


class SlowStopEngine:
    """An engine whose stop() blocks a while (a worker finishing its I/O), as a real one may."""

    def __init__(self, name: str, release: threading.Event):
        self.name, self.release = name, release
        self.started = self.stopped = False

    def start(self):
        self.started = True

    def stop(self):
        self.release.wait(10)
        self.stopped = True


def test_a_kill_sent_after_a_restart_is_applied_after_it(tmp_path):
    """A robot's kill window ends (restart) and a second kill follows before the restart's slow stop returned:
    the robot must end killed. With a thread a fault, the kill landed first and the restart revived the robot."""
    shard = Shard({"shard": 0, "records_dir": str(tmp_path)}, None)
    release = threading.Event()
    made = []

    def make_engine(spec):
        made.append(SlowStopEngine(f"new{len(made)}", release))
        return made[-1]

    shard.make_engine = make_engine
    old = SlowStopEngine("old", release)
    shard.robots = [RobotSlot(spec={"engine": {}}, rid=7, engine=old)]
    shard.on_message({"type": "robot_fault", "robots": [7], "action": "restart"})
    shard.on_message({"type": "robot_fault", "robots": [7], "action": "kill"})
    release.set()
    shard.faults.queue.join()
    robot = shard.robots[0]
    assert old.stopped and len(made) == 1 and made[0].started
    assert robot.engine is made[0] and made[0].stopped  # the kill stopped the engine the restart made
    assert robot.killed
    shard.writer.close()
