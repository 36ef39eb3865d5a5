"""Scripted experts: one per robot type, each a pure function of the robot's state vector.

An expert reads only what the robot publishes (the env observation, `state_names` order) and
returns one action per tick, so the same call serves demonstration collection (bench.demos), a
reference "policy" for the bench, and the upper bound a behaviour-cloned policy is measured against.
Kinematics come from the type's shared MjModel through a private scratch MjData: an expert never
touches a robot's own MjData.
"""

from __future__ import annotations

from typing import Callable, ClassVar

import mujoco
import numpy as np

from bench.robots import DEFAULT_FPS, robot_type, shared_model
from bench.robots.models import substeps_for

EXPERTS: dict[str, type[Expert]] = {}


def register_expert(name: str) -> Callable[[type[Expert]], type[Expert]]:
    def register(cls: type[Expert]) -> type[Expert]:
        cls.robot_type = name
        EXPERTS[name] = cls
        return cls

    return register


def expert_for(robot_type_name: str) -> Expert:
    """A fresh expert for the robot type (experts keep scratch buffers, so one per thread)."""
    try:
        return EXPERTS[robot_type_name]()
    except KeyError:
        raise ValueError(f"no expert for robot type {robot_type_name!r}; known: {sorted(EXPERTS)}") from None


class Expert:
    robot_type: ClassVar[str] = ""

    def __call__(self, state: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class _Kinematics:
    """Forward kinematics and Jacobians on the type's shared model, in a scratch MjData."""

    def __init__(self, robot_type_name: str):
        cls = robot_type(robot_type_name)
        _, physics_dt = substeps_for(DEFAULT_FPS, cls.nominal_physics_dt)  # the fleet's own model
        self.model = shared_model(cls, physics_dt)
        self.data = mujoco.MjData(self.model)
        self.jacp = np.zeros((3, self.model.nv))

    def at(self, qpos: np.ndarray) -> mujoco.MjData:
        self.data.qpos[: len(qpos)] = qpos
        mujoco.mj_kinematics(self.model, self.data)
        mujoco.mj_comPos(self.model, self.data)  # mj_jac* read cdof and subtree_com
        return self.data


def _field(robot_type_name: str, first: str, count: int = 1) -> slice:
    """Where `count` state entries starting at `first` sit in the type's state vector."""
    start = robot_type(robot_type_name).state_names.index(first)
    return slice(start, start + count)


def _damped_pinv_step(jac: np.ndarray, error: np.ndarray, damping: float) -> np.ndarray:
    """J^T (J J^T + damping^2 I)^-1 e: least squares that stays bounded near singular poses."""
    jjt = jac @ jac.T + damping**2 * np.eye(len(error))
    return jac.T @ np.linalg.solve(jjt, error)


@register_expert("arm")
class ArmExpert(Expert):
    """Inverse kinematics to where the target will be, sent as the servos' position targets.

    A position servo lags its target by roughly its time constant, so the expert aims `LEAD_S`
    ahead along the target's velocity. A null-space pull towards the ready pose keeps the
    redundant wrist from drifting into joint limits over long episodes.
    """

    LEAD_S = 0.08
    IK_ITERATIONS = 3
    DAMPING = 0.02
    NULL_GAIN = 0.05
    MAX_STEP = 0.25  # rad per tick: bounds the slew from a far start pose

    def __init__(self):
        self.kin = _Kinematics("arm")
        m = self.kin.model
        self.site = m.site("ee").id
        self.q_low, self.q_high = m.jnt_range[:, 0], m.jnt_range[:, 1]
        self.q = _field("arm", "shoulder_pan.pos", 6)
        self.target, self.target_vel = _field("arm", "target.x", 3), _field("arm", "target.vx", 3)

    def __call__(self, state: np.ndarray) -> np.ndarray:
        state = np.asarray(state, dtype=np.float64)
        q, target, target_vel = state[self.q], state[self.target], state[self.target_vel]
        goal = target + self.LEAD_S * target_vel
        solution = q.copy()
        for _ in range(self.IK_ITERATIONS):
            d = self.kin.at(solution)
            error = goal - d.site_xpos[self.site]
            mujoco.mj_jacSite(self.kin.model, d, self.kin.jacp, None, self.site)
            jac = self.kin.jacp[:, :6]
            jac_pinv = jac.T @ np.linalg.inv(jac @ jac.T + self.DAMPING**2 * np.eye(3))
            null_pull = -self.NULL_GAIN * solution
            dq = jac_pinv @ error + null_pull - jac_pinv @ (jac @ null_pull)
            solution = np.clip(solution + dq, self.q_low, self.q_high)
        return (q + np.clip(solution - q, -self.MAX_STEP, self.MAX_STEP)).astype(np.float32)


@register_expert("reacher")
class ReacherExpert(Expert):
    """Joint-space PD on the fingertip-to-target vector mapped through the Jacobian.

    Gains are set for the 30 Hz zero-order hold: the joints (armature 1, gear 200) respond in a
    few ticks, so a stiffer loop would ring at the control rate.
    """

    KP, KD, DAMPING = 1.2, 0.12, 0.02

    def __init__(self):
        self.kin = _Kinematics("reacher")
        self.fingertip = self.kin.model.body("fingertip").id
        self.cos, self.sin = _field("reacher", "cos_joint0", 2), _field("reacher", "sin_joint0", 2)
        self.qvel, self.offset = _field("reacher", "joint0.vel", 2), _field("reacher", "fingertip_minus_target.x", 2)

    def __call__(self, state: np.ndarray) -> np.ndarray:
        state = np.asarray(state, dtype=np.float64)
        q = np.arctan2(state[self.sin], state[self.cos])
        qvel, error = state[self.qvel], -state[self.offset]
        d = self.kin.at(q)
        mujoco.mj_jacBody(self.kin.model, d, self.kin.jacp, None, self.fingertip)
        dq = _damped_pinv_step(self.kin.jacp[:2, :2], error, self.DAMPING)
        return np.clip(self.KP * dq - self.KD * qvel, -1.0, 1.0).astype(np.float32)


@register_expert("base")
class BaseExpert(Expert):
    """Go-to-goal unicycle controller: turn towards the goal, drive when facing it, slow on arrival.

    Arrival speed is kept low (K_RHO * tolerance) so the turn towards the next waypoint never
    swings the chassis into a wall.
    """

    K_RHO, K_ALPHA = 0.9, 2.5

    def __init__(self):
        self.goal = _field("base", "goal.dx", 2)
        self.v_max, self.w_max = robot_type("base").action_high

    def __call__(self, state: np.ndarray) -> np.ndarray:
        dx, dy = (float(v) for v in state[self.goal])
        rho, alpha = np.hypot(dx, dy), np.arctan2(dy, dx)
        vx = min(self.v_max, self.K_RHO * rho) * max(np.cos(alpha), 0.0) ** 2
        wz = np.clip(self.K_ALPHA * alpha, -self.w_max, self.w_max)
        return np.array([vx, wz], dtype=np.float32)
