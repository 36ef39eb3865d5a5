"""The `arm` robot: a 6-DoF position-controlled arm tracking a slowly moving target.

Action = six joint position targets (rad), sent straight to position servos (assets/arm.xml).
Hold = the last targets stay in force, so a stalled arm freezes where it was told to be; the literal
zero command is the ready pose, a jump, so "hold" is this robot's safe fallback.
Task: keep the tool tip (site "ee") within `tolerance` of a target that drifts along a smooth
per-episode Lissajous path (~5-12 cm/s), so stale chunks visibly cost tracking.
"""

from __future__ import annotations

import mujoco
import numpy as np

from bench.robots.core import RobotBatch, RobotType, register_robot
from bench.robots.models import ASSETS

JOINTS = ("shoulder_pan", "shoulder_lift", "elbow", "wrist_1", "wrist_2", "wrist_3")


@register_robot("arm")
class Arm(RobotType):
    action_names = tuple(f"{j}.pos" for j in JOINTS)
    state_names = (
        *(f"{j}.pos" for j in JOINTS),
        *(f"{j}.vel" for j in JOINTS),
        "target.x", "target.y", "target.z",
        "target.vx", "target.vy", "target.vz",
        "ee.x", "ee.y", "ee.z",
    )  # fmt: skip
    # The servos' ctrlrange in assets/arm.xml (checked against the compiled model on load).
    action_low = (-3.1, -2.0, -2.5, -2.5, -3.1, -2.5)
    action_high = (3.1, 2.0, 2.5, 2.5, 3.1, 2.5)
    nominal_physics_dt = 1 / 180  # 6 substeps at 30 Hz: stable for these servos, ~30 us per tick
    episode_s = 10.0
    settle_s = 1.0  # reaching the target from the random start pose is not tracking
    tolerance = 0.03
    success_fraction = 0.8
    safe_fallback = "hold"
    mirrors = ("qpos", "qvel", "sensordata")
    camera_view = "front"

    # Target path, sampled per episode: centre box, per-axis amplitude and period.
    CENTER_LOW, CENTER_HIGH = (0.25, -0.20, 0.18), (0.45, 0.20, 0.40)
    AMPLITUDE = (0.04, 0.10)  # m
    PERIOD_S = (6.0, 12.0)
    START_JITTER = 0.3  # rad around the ready pose

    def __init__(self, model: mujoco.MjModel):
        super().__init__(model)
        if not np.allclose(model.actuator_ctrlrange, np.stack([self.low, self.high], axis=1)):
            raise ValueError(f"arm.xml ctrlrange {model.actuator_ctrlrange.tolist()} != Arm.action_low/high")
        self.ee_sensor = model.sensor("ee").adr[0]

    @classmethod
    def load_spec(cls) -> mujoco.MjSpec:
        return mujoco.MjSpec.from_file(str(ASSETS / "arm.xml"))

    def new_task(self, n: int) -> dict[str, np.ndarray]:
        return {k: np.zeros((n, 3)) for k in ("center", "amplitude", "omega", "phase", "target", "target_vel")}

    def reset_robot(self, data, batch: RobotBatch, i: int, rng: np.random.Generator) -> np.ndarray:
        m = self.model
        qpos = rng.uniform(-self.START_JITTER, self.START_JITTER, m.nq)
        data.qpos[:] = np.clip(qpos, m.jnt_range[:, 0], m.jnt_range[:, 1])
        task = batch.task
        task["center"][i] = rng.uniform(self.CENTER_LOW, self.CENTER_HIGH)
        task["amplitude"][i] = rng.uniform(*self.AMPLITUDE, 3)
        task["omega"][i] = 2 * np.pi / rng.uniform(*self.PERIOD_S, 3)
        task["phase"][i] = rng.uniform(0, 2 * np.pi, 3)
        return data.qpos.copy()  # the servos start holding the start pose

    def refresh_task(self, batch: RobotBatch) -> None:
        t = (batch.tick * batch.control_dt)[:, None]
        task = batch.task
        angle = task["omega"] * t + task["phase"]
        task["target"] = task["center"] + task["amplitude"] * np.sin(angle)
        task["target_vel"] = task["amplitude"] * task["omega"] * np.cos(angle)

    def ee(self, batch: RobotBatch) -> np.ndarray:
        return batch.sensordata[:, self.ee_sensor : self.ee_sensor + 3]

    def evaluate(self, batch: RobotBatch):
        error = np.linalg.norm(self.ee(batch) - batch.task["target"], axis=1)
        no = np.zeros(batch.n, dtype=bool)
        return error, error < self.tolerance, -error, no

    def observe(self, batch: RobotBatch) -> np.ndarray:
        task = batch.task
        return np.concatenate([batch.qpos, batch.qvel, task["target"], task["target_vel"], self.ee(batch)], axis=1)

    def sync_scene(self, data, batch: RobotBatch, i: int) -> None:
        data.mocap_pos[0] = batch.task["target"][i]
