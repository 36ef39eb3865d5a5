"""What recording a LeRobotDataset (`record.dataset`) costs the shard's control loop: bench.fleet.loop's
`record_observations` timed on one slot of robots, per robot-tick, without and with one camera frame.

    python -m benchmarks.dataset_recording [--robots 50] [--reps 200] [--camera 64x64]

The figure is the loop thread's CPU time (its state copy and rows appended into the record buffers); the buffers'
writer thread, which turns full chunks into Arrow batches off the loop, is not in it. Without `record.dataset`
the loop does none of this (one attribute test per slot). The conversion to LeRobot's format after the run:
docs/results/2026-12-02-lerobot-dataset-recording.md.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from types import SimpleNamespace

import numpy as np

from bench.fleet.loop import record_observations
from bench.fleet.records import RecordWriter


def loop_cost_us(robots: int, reps: int, camera: tuple[int, int] | None) -> float:
    """CPU microseconds of the loop thread per robot-tick recorded."""
    writer = RecordWriter(tempfile.mkdtemp(prefix="dataset-recording-"), "bench")
    shard = SimpleNamespace(
        observations=writer.buffer("observations", 4096),
        frames=writer.buffer("frames", 1024) if camera else None,
        robots=[SimpleNamespace(rid=i, episode=0) for i in range(robots)],
    )
    batch = SimpleNamespace(last_command=np.zeros((robots, 2)))
    images = {"front": np.zeros((*camera, 3), np.uint8)} if camera else {}
    got = [(None, 0.0, 0.0, "STREAMING", False, images)] * robots
    states = np.zeros((robots, 10), np.float32)
    members = list(range(robots))
    t0 = time.thread_time()
    for k in range(reps):
        record_observations(shard, batch, members, got, states.copy(), k / 30)
    spent = time.thread_time() - t0
    writer.close()
    return spent / (robots * reps) * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.dataset_recording")
    ap.add_argument("--robots", type=int, default=50)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--camera", default="64x64", help="HxW of the one camera frame recorded per tick")
    args = ap.parse_args(argv)
    h, w = (int(x) for x in args.camera.split("x"))
    print(f"state + command only: {loop_cost_us(args.robots, args.reps, None):.1f} us CPU per robot-tick")
    print(f"... + one {h}x{w} frame: {loop_cost_us(args.robots, args.reps, (h, w)):.1f} us CPU per robot-tick")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
