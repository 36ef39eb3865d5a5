"""How much CPU a real-time fleet of each robot type costs: us per robot-step at 300 robots.

    python -m benchmarks.robot_step [--robots 300] [--seconds 5] [--types arm reacher base]

Steps a RobotBatch with moving commands (a tenth of the robots send nothing each tick, as a fleet
with stalls would), resetting robots whose episode ends, and reports per type: wall and CPU us per
robot-step, the fraction of one core that real time at `fps` needs, and the single-env
(TwinEnv.step) cost for comparison. Writes reports/bench/robots_step.json.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import numpy as np

from bench.robots import DEFAULT_FPS, ROBOT_TYPES, RobotBatch, make_robot
from benchmarks.common import Result, cli, parse_with_out, run_main, write_report

REPORT = Path("reports/bench/robots_step.json")


def _mujoco_version() -> str:
    import mujoco  # after bench.robots, which chooses MuJoCo's GL backend before mujoco is imported

    return mujoco.__version__


def commands(batch: RobotBatch, tick: int, rng: np.random.Generator) -> list[np.ndarray | None]:
    """Smooth per-robot sinusoids across the action range, with 10% "no command" rows."""
    low, high = batch.type.low, batch.type.high
    phase = np.arange(batch.n)[:, None] * 0.37 + np.arange(len(low))[None, :]
    wave = np.sin(2 * np.pi * 0.3 * tick / batch.fps + phase)
    actions = (low + high) / 2 + 0.5 * (high - low) / 2 * wave
    silent = rng.random(batch.n) < 0.1
    return [None if s else a for s, a in zip(silent, actions)]


def bench_fleet(robot_type: str, robots: int, seconds: float, fps: float) -> dict:
    batch = RobotBatch(robot_type, robots, seed=0, fps=fps)
    rng = np.random.default_rng(0)
    ticks = max(1, round(seconds * fps))
    plan = [commands(batch, t, rng) for t in range(ticks + 15)]
    for t in range(15):  # warm-up: caches, first allocations
        batch.step(plan[t])
    resets = 0
    wall = cpu = 0.0
    for t in range(15, 15 + ticks):
        w0, c0 = time.perf_counter(), time.process_time()
        batch.step(plan[t])
        done = np.flatnonzero(batch.done)
        if done.size:  # a fleet restarts finished episodes; that cost belongs to the fleet too
            batch.reset(done)
            resets += done.size
        wall += time.perf_counter() - w0
        cpu += time.process_time() - c0
    steps = ticks * robots
    us_wall, us_cpu = wall / steps * 1e6, cpu / steps * 1e6
    return {
        "robots": robots,
        "fps": fps,
        "n_substeps": batch.n_substeps,
        "physics_dt": batch.physics_dt,
        "ticks": ticks,
        "episode_resets": int(resets),
        "us_per_robot_step_wall": round(us_wall, 2),
        "us_per_robot_step_cpu": round(us_cpu, 2),
        "us_per_mj_step": round(us_wall / batch.n_substeps, 2),
        "cores_for_real_time": round(us_cpu * robots * fps / 1e6, 3),
        "real_time_factor": round((ticks / fps) / wall, 2),
    }


def bench_env(robot_type: str, steps: int = 600) -> float:
    env = make_robot(robot_type, seed=0)
    env.reset()
    action = env.hold_action()
    t0 = time.perf_counter()
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            env.reset()
    return round((time.perf_counter() - t0) / steps * 1e6, 2)


def run(quick: bool) -> Result:
    res = run_main(main, ["--robots", "30", "--seconds", "0.3"] if quick else [])
    rep = res.details
    for name, row in rep["types"].items():
        res.add(f"{name}: CPU per robot-step ({row['robots']} robots)", row["us_per_robot_step_cpu"], "us")
        res.add(f"{name}: cores for real time ({row['robots']} robots)", row["cores_for_real_time"], "cores")
    return res


def main(argv: list[str] | None = None) -> dict:
    parser = cli(__doc__)
    parser.add_argument("--robots", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=5.0, help="simulated seconds per type")
    parser.add_argument("--fps", type=float, default=DEFAULT_FPS)
    parser.add_argument("--types", nargs="+", default=sorted(ROBOT_TYPES))
    args = parse_with_out(parser, argv, REPORT)

    report = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "mujoco": _mujoco_version()},
        "types": {},
    }
    for name in args.types:
        result = bench_fleet(name, args.robots, args.seconds, args.fps)
        result["us_per_env_step_single"] = bench_env(name)
        report["types"][name] = result
        print(
            f"{name:8s} {args.robots} robots @ {args.fps:g} Hz: {result['us_per_robot_step_wall']:7.2f} us/robot-step "
            f"(cpu {result['us_per_robot_step_cpu']:.2f}, {result['n_substeps']} substeps) -> "
            f"{result['cores_for_real_time']:.2f} cores for real time; single TwinEnv.step "
            f"{result['us_per_env_step_single']:.1f} us"
        )
    return write_report(args.out, report)


if __name__ == "__main__":
    main()
