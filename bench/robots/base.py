"""The `base` robot: a velocity-controlled differential-drive base visiting waypoints in a walled arena.

Action = (vx m/s, wz rad/s) in the chassis frame. Hold = the last velocity stays in force, exactly as
on a real base whose driver latches the last command: a stalled base keeps driving until it meets a
wall. So "zero" (stop) is this robot's safe fallback, not "hold".
Task: reach `WAYPOINTS` waypoints in order (within `tolerance`) without touching a wall. Touching a
wall terminates the episode as a failure; reaching the last waypoint terminates it as a success.
"""

from __future__ import annotations

import mujoco
import numpy as np

from bench.robots.core import RobotBatch, RobotType, register_robot
from bench.robots.models import ASSETS


@register_robot("base")
class Base(RobotType):
    action_names = ("vx", "wz")
    state_names = ("x", "y", "cos_yaw", "sin_yaw", "vx", "wz", "goal.dx", "goal.dy")  # goal in chassis frame
    action_low, action_high = (-0.6, -1.5), (0.6, 1.5)
    nominal_physics_dt = 0.01
    episode_s = 30.0
    tolerance = 0.15
    safe_fallback = "zero"
    mirrors = ("qpos", "qvel", "ncon")
    camera_view = "front"

    WAYPOINTS = 3
    FIELD = 1.4  # waypoints and start poses lie in [-FIELD, FIELD]^2; walls are at +-2.0
    MIN_LEG = 0.8  # m between consecutive waypoints, so every leg is a real drive
    terminate_on_collision = True

    def __init__(self, model: mujoco.MjModel):
        super().__init__(model)
        drive = model.actuator_ctrlrange[[model.actuator("vx").id, model.actuator("wz").id]]
        if not np.allclose(drive, np.stack([self.low, self.high], axis=1)):
            raise ValueError(f"base.xml vx/wz ctrlrange {drive.tolist()} != Base.action_low/high")

    @classmethod
    def load_spec(cls) -> mujoco.MjSpec:
        return mujoco.MjSpec.from_file(str(ASSETS / "base.xml"))

    def new_task(self, n: int) -> dict[str, np.ndarray]:
        return {
            "waypoints": np.zeros((n, self.WAYPOINTS, 2)),
            "reached": np.zeros(n, dtype=np.int64),  # waypoints reached so far; the goal is the next
            "collided": np.zeros(n, dtype=bool),
        }

    def reset_robot(self, data, batch: RobotBatch, i: int, rng: np.random.Generator) -> np.ndarray:
        start = rng.uniform(-self.FIELD, self.FIELD, 2)
        data.qpos[:] = (*start, rng.uniform(-np.pi, np.pi))
        previous = start
        for k in range(self.WAYPOINTS):
            while True:
                point = rng.uniform(-self.FIELD, self.FIELD, 2)
                if np.linalg.norm(point - previous) >= self.MIN_LEG:
                    break
            batch.task["waypoints"][i, k] = previous = point
        batch.task["reached"][i] = 0
        batch.task["collided"][i] = False
        return self.zero()  # parked: the driver's latched velocity is zero

    def to_ctrl(self, command: np.ndarray, batch: RobotBatch) -> np.ndarray:
        # (vx, grip, wz): the grip servo always targets zero lateral velocity.
        return np.stack([command[:, 0], np.zeros(len(command)), command[:, 1]], axis=1)

    def goal(self, batch: RobotBatch) -> np.ndarray:
        task = batch.task
        k = np.minimum(task["reached"], self.WAYPOINTS - 1)
        return task["waypoints"][np.arange(batch.n), k]

    def evaluate(self, batch: RobotBatch):
        task = batch.task
        error = np.linalg.norm(self.goal(batch) - batch.qpos[:, :2], axis=1)
        arrived = (error < self.tolerance) & (task["reached"] < self.WAYPOINTS)
        task["reached"] += arrived  # idempotent: the next goal is >= MIN_LEG away
        touching = batch.ncon > 0
        task["collided"] |= touching
        done = task["reached"] >= self.WAYPOINTS
        if self.terminate_on_collision:
            done = done | task["collided"]
        reward = -error + 10.0 * arrived - 10.0 * touching
        return error, arrived, reward, done

    def observe(self, batch: RobotBatch) -> np.ndarray:
        x, y, yaw = batch.qpos[:, 0], batch.qpos[:, 1], batch.qpos[:, 2]
        c, s = np.cos(yaw), np.sin(yaw)
        vx = c * batch.qvel[:, 0] + s * batch.qvel[:, 1]
        delta = self.goal(batch) - batch.qpos[:, :2]
        goal_dx = c * delta[:, 0] + s * delta[:, 1]
        goal_dy = -s * delta[:, 0] + c * delta[:, 1]
        return np.stack([x, y, c, s, vx, batch.qvel[:, 2], goal_dx, goal_dy], axis=1)

    def episode_score(self, batch: RobotBatch):
        task = batch.task
        score = task["reached"] / self.WAYPOINTS
        return score, (task["reached"] >= self.WAYPOINTS) & ~task["collided"]

    def episode_info(self, batch: RobotBatch, i: int) -> dict:
        task = batch.task
        return {"collided": bool(task["collided"][i]), "waypoints_reached": int(task["reached"][i])}

    def sync_scene(self, data, batch: RobotBatch, i: int) -> None:
        data.mocap_pos[0, :2] = self.goal(batch)[i]
