"""Scripted experts: one per robot type, each a pure function of the robot's state vector.

An expert reads only what the robot publishes (the env observation, `state_names` order) and
returns one action per tick, so the same call serves demonstration collection (bench.training.demos), a
reference "policy" for the bench, and the upper bound a behaviour-cloned policy is measured against.
Kinematics come from the type's shared MjModel through a private scratch MjData: an expert never
touches a robot's own MjData.

A chunk policy runs open loop between calls, so what it has to learn at a state is the expert's
*plan* from there, not its next action:

    states (N, S) --Expert.place--> scratch twins (one RobotBatch) --expert, T ticks--> plans (N, T, A)

`plan_chunks` rolls the clean expert forward on scratch twins started from the states: row 0 is
expert(state), row k what the expert would send k ticks later if nothing disturbed the robot. It
reads nothing but the state vector (`place` says what each expert infers from it; the arm assumes
its target keeps its current velocity), so a plan is a function a state-only policy can learn, and
run as a chunk policy it is the expert's own score under chunked execution.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import numpy as np

# bench.robots before mujoco: it chooses MuJoCo's GL backend, which MuJoCo reads once, at import (models.py)
from bench.robots import DEFAULT_FPS, RobotBatch, RobotType, robot_type, shared_model  # isort: skip
import mujoco  # noqa: E402,I001

from bench.robots.arm import Arm
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
    # What the expert foresees of the task from one state; None: the robot type's own task model.
    task_model: ClassVar[type[RobotType] | None] = None

    def __call__(self, state: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def place(self, data: mujoco.MjData, task: dict[str, np.ndarray], i: int, state: np.ndarray) -> None:
        """Put a scratch twin (its MjData, row i of its task arrays) where `state` says the robot is."""
        raise NotImplementedError


def plan_chunks(
    robot_type_name: str,
    states: np.ndarray,
    chunk_size: int,
    *,
    fps: float = DEFAULT_FPS,
    batch_size: int = 256,
    prefixes: np.ndarray | None = None,
    prefix_rows: np.ndarray | None = None,
) -> np.ndarray:
    """(N, chunk_size, A) float32: the expert's open-loop plan from each state of `states` (N, S).

    A pure function of the states: twins are placed from them, never sampled. With `prefixes` (N, >= n, A)
    and `prefix_rows` (N,) ints n: rows 0..n-1 of plan i are `prefixes[i, :n]` (actions already committed),
    executed on the twin, and the expert plans the rest from the state they lead to (training-time RTC's
    labels, bench.training.demos).
    """
    states = np.asarray(states, dtype=np.float32).reshape(len(states), -1)
    if prefix_rows is None:
        prefix_rows = np.zeros(len(states), dtype=np.int64)
    else:
        prefix_rows = np.minimum(np.asarray(prefix_rows, dtype=np.int64), chunk_size)
        if prefixes is None or len(prefixes) != len(states) or len(prefix_rows) != len(states):
            raise ValueError("prefix_rows needs prefixes, both with one entry per state")
        if prefix_rows.max(initial=0) > np.asarray(prefixes).shape[1]:
            raise ValueError(
                f"prefix_rows up to {prefix_rows.max()} but prefixes hold {np.asarray(prefixes).shape[1]} rows"
            )
    expert = expert_for(robot_type_name)
    plans = np.zeros((len(states), chunk_size, len(robot_type(robot_type_name).action_names)), dtype=np.float32)
    if len(states) == 0:
        return plans
    twins = RobotBatch(robot_type_name, min(batch_size, len(states)), seed=0, fps=fps)  # MjData cost ~1 ms each
    if expert.task_model is not None:
        twins.type = expert.task_model(twins.model)
        twins.task = twins.type.new_task(twins.n)
    for start in range(0, len(states), twins.n):
        rows = states[start : start + twins.n]
        padded = np.concatenate([rows, np.repeat(rows[-1:], twins.n - len(rows), axis=0)])
        forced = None
        if prefix_rows.any():
            n = np.zeros(twins.n, dtype=np.int64)
            n[: len(rows)] = prefix_rows[start : start + len(rows)]
            forced = (np.zeros((twins.n, chunk_size, plans.shape[2]), dtype=np.float32), n)
            width = min(chunk_size, np.asarray(prefixes).shape[1])
            forced[0][: len(rows), :width] = np.asarray(prefixes, dtype=np.float32)[start : start + len(rows), :width]
        plans[start : start + len(rows)] = _plan(expert, twins, padded, chunk_size, forced)[: len(rows)]
    return plans


def _plan(
    expert: Expert,
    twins: RobotBatch,
    states: np.ndarray,
    chunk_size: int,
    forced: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    twins.reset()  # zeroes the episode counters; `place` then overwrites the sampled start and task
    for i, state in enumerate(states):
        data = twins.datas[i]
        expert.place(data, twins.task, i, np.asarray(state, dtype=np.float64))
        mujoco.mj_forward(twins.model, data)
        for name, buf in twins.mirror.items():
            buf[i] = getattr(data, name)
    twins.type.refresh_task(twins)
    plan = np.zeros((len(states), chunk_size, len(twins.type.action_names)), dtype=np.float32)
    current = states  # row 0 from the state itself, not from its reconstruction
    for k in range(chunk_size):
        plan[:, k] = [expert(s) for s in current]
        if forced is not None:  # committed rows replace the expert's own (plan_chunks' prefixes)
            plan[:, k] = np.where((k < forced[1])[:, None], forced[0][:, k], plan[:, k])
        if k + 1 < chunk_size:
            current = twins.step(plan[:, k])
    return plan


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


def _wrap(angle: float | np.ndarray) -> float | np.ndarray:
    return (angle + np.pi) % (2 * np.pi) - np.pi


class _ConstantVelocityTarget(Arm):
    """The arm's task as one state shows it: the target moves on at the velocity it has now."""

    def new_task(self, n: int) -> dict[str, np.ndarray]:
        return super().new_task(n) | {"start_target": np.zeros((n, 3)), "start_target_vel": np.zeros((n, 3))}

    def refresh_task(self, batch: RobotBatch) -> None:
        t = (batch.tick * batch.control_dt)[:, None]
        batch.task["target"] = batch.task["start_target"] + batch.task["start_target_vel"] * t
        batch.task["target_vel"] = batch.task["start_target_vel"].copy()


@register_expert("arm")
class ArmExpert(Expert):
    """Inverse kinematics to where the target will be, sent as the servos' position targets.

    A position servo lags its target by roughly its time constant, so the expert aims `LEAD_S`
    ahead along the target's velocity. A null-space pull towards the ready pose keeps the
    redundant wrist from drifting into joint limits over long episodes.
    """

    task_model = _ConstantVelocityTarget
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
        self.q, self.qvel = _field("arm", "shoulder_pan.pos", 6), _field("arm", "shoulder_pan.vel", 6)
        self.target, self.target_vel = _field("arm", "target.x", 3), _field("arm", "target.vx", 3)

    def place(self, data, task, i, state):
        data.qpos[:], data.qvel[:] = state[self.q], state[self.qvel]
        task["start_target"][i], task["start_target_vel"][i] = state[self.target], state[self.target_vel]

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
    """Closed-form inverse kinematics to the target, reached by a speed-limited joint velocity loop.

    Why this shape (a chunk policy has to clone the expert's plan, see the module docstring):
    - The elbow always bends the same way. Every episode starts with the arm stretched out
      (joint1 ~ 0, a singular pose), where a Jacobian controller bends whichever way the sign of a
      0.01 rad jitter says: two mirror-image plans for nearly equal states, which a cloned policy
      averages into a motion that reaches neither. The one switch left is where the shoulder's
      shortest way round flips (target straight behind the arm), and a replan settles it.
    - Joint speed is capped and the torque follows a velocity error (the joints take 200x gear on
      ~1 kg m^2, ~7 rad/s per tick at full torque), so plans are smooth ramps instead of
      saturated bang-bang swings whose switching tick a policy would have to hit exactly.
    """

    K_Q = 8.0  # 1/s: joint-space approach rate
    QVEL_MAX = 6.0  # rad/s
    K_VEL = 0.1  # torque per rad/s of velocity error: ~2/3 of the error corrected per tick
    ELBOW_SIGN = 1.0

    def __init__(self):
        m = _Kinematics("reacher").model
        self.upper = float(m.body("body1").pos[0])  # shoulder to elbow
        self.fore = float(m.body("fingertip").pos[0])  # elbow to fingertip
        self.elbow_max = float(m.jnt_range[m.joint("joint1").id, 1])
        self.cos, self.sin = _field("reacher", "cos_joint0", 2), _field("reacher", "sin_joint0", 2)
        self.target, self.qvel = _field("reacher", "target.x", 2), _field("reacher", "joint0.vel", 2)

    def place(self, data, task, i, state):
        data.qpos[:2] = np.arctan2(state[self.sin], state[self.cos])
        data.qpos[2:] = state[self.target]
        data.qvel[:2], data.qvel[2:] = state[self.qvel], 0.0

    def joint_goal(self, target: np.ndarray) -> np.ndarray:
        """(shoulder, elbow) that puts the fingertip on `target` (or nearest, out of reach)."""
        a, b = self.upper, self.fore
        cos_elbow = (target @ target - a * a - b * b) / (2 * a * b)
        elbow = self.ELBOW_SIGN * min(np.arccos(np.clip(cos_elbow, -1.0, 1.0)), self.elbow_max)
        shoulder = np.arctan2(target[1], target[0]) - np.arctan2(b * np.sin(elbow), a + b * np.cos(elbow))
        return np.array([shoulder, elbow])

    def __call__(self, state: np.ndarray) -> np.ndarray:
        state = np.asarray(state, dtype=np.float64)
        q = np.arctan2(state[self.sin], state[self.cos])
        error = self.joint_goal(state[self.target]) - q
        error[0] = _wrap(error[0])  # the shoulder turns freely: take the short way round
        qvel_goal = np.clip(self.K_Q * error, -self.QVEL_MAX, self.QVEL_MAX)
        return np.clip(self.K_VEL * (qvel_goal - state[self.qvel]), -1.0, 1.0).astype(np.float32)


@register_expert("base")
class BaseExpert(Expert):
    """Go-to-goal unicycle controller: turn towards the goal, drive when facing it, slow on arrival.

    Arrival speed is kept low (K_RHO * tolerance) so the turn towards the next waypoint never
    swings the chassis into a wall.
    """

    K_RHO, K_ALPHA = 0.9, 2.5

    def __init__(self):
        self.pose = _field("base", "x", 8)
        self.goal = _field("base", "goal.dx", 2)
        self.v_max, self.w_max = robot_type("base").action_high

    def place(self, data, task, i, state):
        x, y, c, s, vx, wz, dx, dy = state[self.pose]
        data.qpos[:] = x, y, np.arctan2(s, c)
        data.qvel[:] = c * vx, s * vx, wz  # the grip servo holds lateral velocity at ~0
        # Only the current goal is visible: the plan stops there rather than guess the next one.
        task["waypoints"][i] = x + c * dx - s * dy, y + s * dx + c * dy
        task["reached"][i], task["collided"][i] = 0, False

    def __call__(self, state: np.ndarray) -> np.ndarray:
        dx, dy = (float(v) for v in state[self.goal])
        rho, alpha = np.hypot(dx, dy), np.arctan2(dy, dx)
        vx = min(self.v_max, self.K_RHO * rho) * max(np.cos(alpha), 0.0) ** 2
        wz = np.clip(self.K_ALPHA * alpha, -self.w_max, self.w_max)
        return np.array([vx, wz], dtype=np.float32)
