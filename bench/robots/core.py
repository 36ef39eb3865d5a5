"""Robot twins: the RobotType contract, its registry, the fleet stepping engine and the gym view.

    commands (B, A), None rows = "no new command this tick"
        |  resolve: None or non-finite -> the type's hold semantics; clip to the action space
        |  RobotType.to_ctrl                 (e.g. base: (vx, wz) -> three body-frame servos)
        v
    for each robot: MjData.ctrl <- ctrl; mj_step x n_substeps    (the only per-robot Python; GIL kept)
        |  copy RobotType.mirrors (qpos, qvel, ...) into (B, ...) arrays
        v
    RobotType.refresh_task / evaluate / observe, vectorised over the fleet axis B

One MjModel per robot type per process (bench.robots.models), one MjData per robot. TwinEnv, the
gymnasium.Env, is a RobotBatch of one: a robot behaves identically alone or in a fleet of 300, and
that is the invariant this module keeps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import gymnasium as gym
import mujoco
import numpy as np
from gymnasium.utils import seeding

from bench.robots.cameras import make_camera
from bench.robots.models import shared_model, substeps_for

DEFAULT_FPS = 30


def _gil_holding_mj_step():
    """libmujoco's own `mj_step(m, d)` called through ctypes.PyDLL, which keeps the GIL: a fleet slot's
    physics runs as one uninterrupted stretch instead of handing the GIL to another thread at every
    robot (the bindings release it per call, and in a shard of 150 engine threads each hand-back costs
    the control loop a wait). None when the library or the structs' addresses are not available."""
    import ctypes
    import glob
    import os

    try:
        paths = sorted(glob.glob(os.path.join(os.path.dirname(mujoco.__file__), "libmujoco.so*")))
        if not paths:
            return None
        fn = ctypes.PyDLL(paths[0]).mj_step
        fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p], None
        probe_model = mujoco.MjModel.from_xml_string("<mujoco/>")
        probe = mujoco.MjData(probe_model)
        fn(probe_model._address, probe._address)
        return fn if probe.time > 0 else None
    except (OSError, AttributeError, TypeError):
        return None


_MJ_STEP = _gil_holding_mj_step()

ROBOT_TYPES: dict[str, type[RobotType]] = {}


def register_robot(name: str):
    """Class decorator: make a RobotType available to make_robot / RobotBatch under `name`."""

    def register(cls: type[RobotType]) -> type[RobotType]:
        if name in ROBOT_TYPES:
            raise ValueError(f"robot type {name!r} is already registered by {ROBOT_TYPES[name]}")
        cls.name = name
        ROBOT_TYPES[name] = cls
        return cls

    return register


# Where a name no module registered is looked up next (bench.robots.plugins adds its entry points and
# `module:Class`): each returns the type, registered, or None.
TYPE_FINDERS: list = []


def robot_type(name: str) -> type[RobotType]:
    """The registered type `name`, else a finder's (a plugin, imported and registered on first use);
    ValueError naming the known ones otherwise."""
    cls = ROBOT_TYPES.get(name)
    if cls is not None:
        return cls
    for find in TYPE_FINDERS:
        cls = find(name)
        if cls is not None:
            return cls
    raise ValueError(f"unknown robot type {name!r}; known: {sorted(ROBOT_TYPES)}")


class RobotType:
    """What one kind of robot is: its MJCF, what a command means, and its task.

    Subclasses live one per file and are registered with @register_robot. An instance is bound to
    the shared model and is stateless: everything per robot lives in the RobotBatch arrays (fleet
    axis first) or in that robot's MjData, so one instance serves the whole fleet.
    """

    name: ClassVar[str] = ""
    action_names: ClassVar[tuple[str, ...]] = ()
    state_names: ClassVar[tuple[str, ...]] = ()
    action_low: ClassVar[tuple[float, ...]] = ()
    action_high: ClassVar[tuple[float, ...]] = ()
    nominal_physics_dt: ClassVar[float] = 0.01
    max_physics_dt: ClassVar[float | None] = None  # set: the fewest substeps no longer than this, not the nearest
    episode_s: ClassVar[float] = 10.0
    settle_s: ClassVar[float] = 0.0  # ticks before this are not scored: reaching the task first
    tolerance: ClassVar[float] = 0.02  # tracking error (m) that counts as on task
    success_fraction: ClassVar[float] = 0.8  # of scored ticks within tolerance for is_success
    safe_fallback: ClassVar[str] = "hold"  # the edge fallback ("hold" | "zero") that keeps it safe
    mirrors: ClassVar[tuple[str, ...]] = ("qpos", "qvel")  # MjData fields the fleet arrays copy
    camera_view: ClassVar[str | dict[str, Any]] = {}  # a named MJCF camera, or free-camera params

    def __init__(self, model: mujoco.MjModel):
        self.model = model
        self.low = np.asarray(self.action_low, dtype=np.float64)
        self.high = np.asarray(self.action_high, dtype=np.float64)

    # -- model -------------------------------------------------------------------------------
    @classmethod
    def load_spec(cls) -> mujoco.MjSpec:
        raise NotImplementedError

    @classmethod
    def fleet(cls, n: int, *, seed: int | None = 0, fps: float = DEFAULT_FPS, episode_s: float | None = None):
        """n robots of this type stepped as one (a shard's slot): a RobotBatch, batched MuJoCo; a type that
        cannot be batched (bench.robots.gymenv) returns its own batch with the same contract."""
        return RobotBatch(cls.name, n, seed=seed, fps=fps, episode_s=episode_s)

    # -- per-robot reset ---------------------------------------------------------------------
    def new_task(self, n: int) -> dict[str, np.ndarray]:
        """Fleet arrays for the task (targets, waypoints, ...), one row per robot."""
        return {}

    def reset_robot(self, data: mujoco.MjData, batch: RobotBatch, i: int, rng: np.random.Generator) -> np.ndarray:
        """Sample robot i's start state into `data` and its task into batch.task; return the
        command that is in force at t=0 (what "hold" means before any command arrives)."""
        raise NotImplementedError

    # -- command semantics -------------------------------------------------------------------
    def hold(self, last_command: np.ndarray) -> np.ndarray:
        """The command applied when none arrives. Default: the last one stays in force."""
        return last_command

    def zero(self) -> np.ndarray:
        return np.zeros(len(self.action_names))

    def to_ctrl(self, command: np.ndarray, batch: RobotBatch) -> np.ndarray:
        return command

    # -- task, vectorised over the fleet -----------------------------------------------------
    def refresh_task(self, batch: RobotBatch) -> None:
        """Advance time-dependent task fields to batch.tick (moving targets)."""

    def evaluate(self, batch: RobotBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(tracking_error, within_tolerance, reward, terminated), each shaped (B,).

        Called once per tick and again after any reset, for the whole fleet: task side effects
        (advancing a waypoint) must be idempotent when the physics has not moved."""
        raise NotImplementedError

    def observe(self, batch: RobotBatch) -> np.ndarray:
        raise NotImplementedError

    def episode_score(self, batch: RobotBatch) -> tuple[np.ndarray, np.ndarray]:
        """(success_score in [0, 1], is_success), each (B,): fraction of scored ticks on task."""
        score = batch.within_ticks / np.maximum(batch.scored_ticks, 1)
        return score, score >= self.success_fraction

    def episode_info(self, batch: RobotBatch, i: int) -> dict[str, Any]:
        """Extra end-of-episode facts for robot i (collisions, waypoints, ...)."""
        return {}

    def sync_scene(self, data: mujoco.MjData, batch: RobotBatch, i: int) -> None:
        """Copy visual-only task state (target markers) into `data` before a render. Physics never
        reads these, so the stepping loop skips them."""


class RobotBatch:
    """N robots of one type stepped in lockstep at `fps`, each with its own MjData and episode.

    Robot i of RobotBatch(t, n, seed=s) behaves exactly like make_robot(t, seed=s + i).
    After step(): `states` (B, S) float32, `tracking_error`, `done` and `episode_score()` are
    current; robots whose episode is done keep stepping until the caller resets them.
    `states` is a new array after every step and reset, so rows already handed to an engine are
    never overwritten underneath it.
    """

    def __init__(
        self,
        robot_type_name: str,
        n: int,
        *,
        seed: int | None = 0,
        fps: float = DEFAULT_FPS,
        episode_s: float | None = None,
    ):
        cls = robot_type(robot_type_name)
        self.fps = float(fps)
        self.control_dt = 1.0 / self.fps
        self.n_substeps, self.physics_dt = substeps_for(self.fps, cls.nominal_physics_dt, cls.max_physics_dt)
        self.model = shared_model(cls, self.physics_dt)
        self.type = cls(self.model)
        self.n = n
        self.episode_ticks = max(1, round((episode_s or cls.episode_s) * self.fps))
        self.settle_ticks = round(cls.settle_s * self.fps)
        self.datas = [mujoco.MjData(self.model) for _ in range(n)]
        self.rngs = [seeding.np_random(None if seed is None else seed + i)[0] for i in range(n)]

        m = self.model
        shapes = {"qpos": (m.nq,), "qvel": (m.nv,), "sensordata": (m.nsensordata,), "xpos": (m.nbody, 3), "ncon": ()}
        self.mirror = {name: np.zeros((n, *shapes[name])) for name in cls.mirrors}
        # Each robot's MjData arrays as numpy views, made once: a view stays valid for as long as its MjData,
        # and making one is most of what a field access costs (~1 us, four of them a robot a tick). Scalar
        # fields (ncon) have no view and are read each tick.
        self._ctrl_views = [d.ctrl for d in self.datas]
        arrays = [name for name in cls.mirrors if shapes[name] != ()]
        self._mirror_views = [tuple((self.mirror[name], getattr(d, name)) for name in arrays) for d in self.datas]
        self._mirror_scalars = tuple((name, self.mirror[name]) for name in cls.mirrors if shapes[name] == ())
        self.task = self.type.new_task(n)
        num_actions = len(cls.action_names)
        self.last_command = np.zeros((n, num_actions))
        self.tick = np.zeros(n, dtype=np.int64)
        self.episode_limit = np.full(n, self.episode_ticks, dtype=np.int64)  # ticks of each robot's episode
        self.scored_ticks = np.zeros(n, dtype=np.int64)
        self.within_ticks = np.zeros(n, dtype=np.int64)
        self.error_sum = np.zeros(n)
        self.bad_commands = np.zeros(n, dtype=np.int64)
        self.terminated = np.zeros(n, dtype=bool)
        self.tracking_error = np.zeros(n)
        self.within = np.zeros(n, dtype=bool)
        self.reward = np.zeros(n)
        self.states = np.zeros((n, len(cls.state_names)), dtype=np.float32)
        self.reset()

    # mirrors read like fields: batch.qpos, batch.xpos, ...
    def __getattr__(self, name: str) -> np.ndarray:
        mirror = self.__dict__.get("mirror", {})
        if name in mirror:
            return mirror[name]
        raise AttributeError(name)

    @property
    def done(self) -> np.ndarray:
        return self.terminated | (self.tick >= self.episode_limit)

    def extend_episode(self, extra_ticks: np.ndarray) -> None:
        """Lengthen each robot's CURRENT episode by extra_ticks[i] (the next reset restores episode_ticks)."""
        self.episode_limit += np.asarray(extra_ticks, dtype=np.int64)

    def reset(self, indices: Sequence[int] | np.ndarray | None = None, seed: int | None = None) -> np.ndarray:
        """Start a new episode for `indices` (default all). With `seed`, robot i is reseeded with
        seed + i, the same rule as the constructor. Returns all states (B, S)."""
        idx = range(self.n) if indices is None else [int(i) for i in indices]
        for i in idx:
            if seed is not None:
                self.rngs[i] = seeding.np_random(seed + i)[0]
            d = self.datas[i]
            mujoco.mj_resetData(self.model, d)
            self.last_command[i] = self.type.reset_robot(d, self, i, self.rngs[i])
            d.ctrl[:] = self.type.to_ctrl(self.last_command[i : i + 1], self)[0]
            mujoco.mj_forward(self.model, d)
            for name, buf in self.mirror.items():
                buf[i] = getattr(d, name)
            self.tick[i] = 0
            self.episode_limit[i] = self.episode_ticks
            self.scored_ticks[i] = self.within_ticks[i] = self.bad_commands[i] = 0
            self.error_sum[i] = 0.0
            self.terminated[i] = False
        self.type.refresh_task(self)
        error, within, _, _ = self.type.evaluate(self)
        self.tracking_error[:] = error
        self.within[:] = within
        self.states = self.type.observe(self).astype(np.float32)
        return self.states

    def hold_actions(self) -> np.ndarray:
        return self.type.hold(self.last_command).copy()

    def zero_actions(self) -> np.ndarray:
        return np.tile(self.type.zero(), (self.n, 1))

    def resolve(self, actions: np.ndarray | Sequence[np.ndarray | None] | None) -> np.ndarray:
        """The command each robot executes this tick, (B, A)."""
        hold = self.type.hold(self.last_command)
        if actions is None:
            return hold.copy()
        if isinstance(actions, np.ndarray) and actions.dtype != object:
            command = np.array(actions, dtype=np.float64).reshape(self.n, -1)
            missing = np.zeros(self.n, dtype=bool)
        else:
            if len(actions) != self.n:
                raise ValueError(f"expected {self.n} actions, got {len(actions)}")
            # one stack of the given actions into the hold's rows, not an array per robot (a fleet slot's tick)
            missing = np.fromiter((a is None for a in actions), dtype=bool, count=self.n)
            given = np.flatnonzero(~missing)
            if len(given) == self.n:
                command = np.stack(actions).astype(np.float64).reshape(self.n, -1)
            else:
                command = np.array(hold, dtype=np.float64)
                if len(given):
                    command[given] = np.stack([actions[i] for i in given]).astype(np.float64).reshape(len(given), -1)
        # A NaN reaching MuJoCo would poison the robot's state for the rest of the episode; treat it
        # as "no command" and count it so the caller can see its policy misbehaved.
        bad = ~np.isfinite(command).all(axis=1) & ~missing
        self.bad_commands += bad
        missing |= bad
        np.clip(command, self.type.low, self.type.high, out=command)
        command[missing] = hold[missing]
        return command

    def step(self, actions: np.ndarray | Sequence[np.ndarray | None] | None = None) -> np.ndarray:
        """Advance every robot one control tick. `actions`: (B, A), a sequence with None entries for
        robots that received no new command, or None for all. Returns states (B, S) float32."""
        command = self.resolve(actions)
        ctrl = self.type.to_ctrl(command, self)
        self.last_command = command
        model, n_substeps, scalars = self.model, self.n_substeps, self._mirror_scalars
        ctrl_views, mirror_views = self._ctrl_views, self._mirror_views
        step = _MJ_STEP
        m_addr = model._address if step is not None else 0
        for i, d in enumerate(self.datas):
            ctrl_views[i][:] = ctrl[i]
            if step is not None:
                d_addr = d._address
                for _ in range(n_substeps):
                    step(m_addr, d_addr)
            else:
                mujoco.mj_step(model, d, n_substeps)
            for buf, view in mirror_views[i]:
                buf[i] = view
            for name, buf in scalars:
                buf[i] = getattr(d, name)
        self.tick += 1
        self.type.refresh_task(self)
        error, within, self.reward, terminated = self.type.evaluate(self)
        self.terminated |= terminated
        scored = self.tick > self.settle_ticks
        self.scored_ticks += scored
        self.within_ticks += scored & within
        self.error_sum += error
        self.tracking_error, self.within = error, within
        self.states = self.type.observe(self).astype(np.float32)
        return self.states

    def episode_score(self) -> tuple[np.ndarray, np.ndarray]:
        """(success_score, is_success) of each robot's episode so far."""
        return self.type.episode_score(self)

    def scene_data(self, i: int) -> mujoco.MjData:
        """Robot i's MjData with visual-only task state synced, ready for a renderer."""
        d = self.datas[i]
        self.type.sync_scene(d, self, i)
        return d

    def robot(self, i: int) -> RobotView:
        return RobotView(self, i)


class RobotView:
    """One robot of a batch as a camera sees it (bench.robots.cameras): model, scene and view."""

    def __init__(self, batch: RobotBatch, i: int):
        self.batch, self.index = batch, i
        self.model = batch.model
        self.robot_type = batch.type.name
        self.camera_view = batch.type.camera_view

    def scene_data(self) -> mujoco.MjData:
        return self.batch.scene_data(self.index)


class TwinEnv(gym.Env):
    """A single robot twin as a gymnasium.Env (a RobotBatch of one).

    step(None) (or step_hold()) means "no new command this tick" and applies the robot's hold
    semantics: arm keeps its position target, reacher applies zero torque, base keeps its velocity.
    The episode truncates after episode_s; info["is_success"], info["success_score"] and
    info["mean_tracking_error"] appear on the final step; info["tracking_error"] and
    info["command"] (what the actuators received) on every step.
    """

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"], "render_fps": DEFAULT_FPS}

    def __init__(
        self,
        robot_type_name: str,
        *,
        seed: int | None = None,
        fps: float = DEFAULT_FPS,
        episode_s: float | None = None,
        camera: str | None = None,
        camera_size: tuple[int, int] = (96, 96),
        render_mode: str | None = None,
    ):
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        self._batch = RobotBatch(robot_type_name, 1, seed=seed, fps=fps, episode_s=episode_s)
        self._type = self._batch.type
        self._pending_seed = seed
        self.render_mode = render_mode
        self.metadata = {"render_modes": ["rgb_array"], "render_fps": fps}
        low, high = self._type.low.astype(np.float32), self._type.high.astype(np.float32)
        self.action_space = gym.spaces.Box(low, high, dtype=np.float32)
        num_states = len(self._type.state_names)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (num_states,), dtype=np.float32)
        self.camera = None
        if camera is not None or render_mode == "rgb_array":
            self.camera = make_camera(camera or "rendered", self, *camera_size, seed=seed or 0)

    # -- metadata the bench, edge and demos read -------------------------------------------
    robot_type = property(lambda self: self._type.name)
    action_names = property(lambda self: list(self._type.action_names))
    state_names = property(lambda self: list(self._type.state_names))
    fps = property(lambda self: self._batch.fps)
    physics_dt = property(lambda self: self._batch.physics_dt)
    n_substeps = property(lambda self: self._batch.n_substeps)
    safe_fallback = property(lambda self: self._type.safe_fallback)
    camera_view = property(lambda self: self._type.camera_view)
    model = property(lambda self: self._batch.model)
    data = property(lambda self: self._batch.datas[0])
    batch = property(lambda self: self._batch)

    @property
    def last_command(self) -> np.ndarray:
        """The command in force after the last step (what the actuators actually received)."""
        return self._batch.last_command[0].astype(np.float32)

    def hold_action(self) -> np.ndarray:
        """The explicit action equal to sending nothing this tick."""
        return self._batch.hold_actions()[0].astype(np.float32)

    def zero_action(self) -> np.ndarray:
        """The literal all-zero command: stop for velocity/torque robots, the ready pose for arm."""
        return self._type.zero().astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is None and self._pending_seed is not None:
            seed = self._pending_seed  # make_robot(seed=s) seeds the first episode
        self._pending_seed = None
        super().reset(seed=seed)
        self._batch.rngs[0] = self.np_random
        states = self._batch.reset([0])
        return states[0].copy(), {"tracking_error": float(self._batch.tracking_error[0])}

    def step(self, action: np.ndarray | None):
        b = self._batch
        b.step(None if action is None else np.asarray(action, dtype=np.float64).reshape(1, -1))
        terminated, truncated = bool(b.terminated[0]), bool(b.tick[0] >= b.episode_limit[0])
        info: dict[str, Any] = {
            "tracking_error": float(b.tracking_error[0]),
            "within_tolerance": bool(b.within[0]),
            "command": b.last_command[0].astype(np.float32),
        }
        if terminated or truncated:
            score, success = b.episode_score()
            info["is_success"] = bool(success[0])
            info["success_score"] = float(score[0])
            info["mean_tracking_error"] = float(b.error_sum[0] / max(b.tick[0], 1))
            info["bad_commands"] = int(b.bad_commands[0])
            info.update(self._type.episode_info(b, 0))
        return b.states[0].copy(), float(b.reward[0]), terminated, truncated, info

    def step_hold(self):
        """step(None): no new command this tick."""
        return self.step(None)

    def scene_data(self) -> mujoco.MjData:
        return self._batch.scene_data(0)

    def render(self):
        if self.render_mode != "rgb_array":
            return None
        return self.camera.frame()

    def close(self):
        self.camera = None


def measure_tick_us(cls: type[RobotType], robots: int = 4, ticks: int = 50) -> float:
    """CPU (us of this thread) one robot's tick costs in a fleet slot of `robots` stepped `ticks` ticks with hold
    commands, episodes reset as the shard's loop resets them: the physics (or a gym env's step and its mapping)
    and the batch's own Python, not the engine's or the records'."""
    import time

    batch = cls.fleet(robots, seed=0, fps=getattr(cls, "fps", DEFAULT_FPS))
    batch.step(None)  # first-step costs (lazy imports, caches) are not a tick's
    t0 = time.thread_time()
    for _ in range(ticks):
        batch.step(None)
        done = batch.done
        if done.any():
            batch.reset(np.nonzero(done)[0])
    cost = (time.thread_time() - t0) / (ticks * robots) * 1e6
    close = getattr(batch, "close", None)
    if close is not None:
        close()
    return cost


def make_robot(
    robot_type_name: str,
    *,
    seed: int | None = None,
    camera: str | None = None,
    camera_size: tuple[int, int] = (96, 96),
    fps: float = DEFAULT_FPS,
    episode_s: float | None = None,
    render_mode: str | None = None,
) -> TwinEnv:
    """A robot twin by type name ("arm", "reacher", "base"); camera is a bench.robots.cameras kind."""
    return TwinEnv(
        robot_type_name,
        seed=seed,
        fps=fps,
        episode_s=episode_s,
        camera=camera,
        camera_size=camera_size,
        render_mode=render_mode,
    )
