"""Any Gymnasium environment as a fleet robot type, by scenario configuration (`fleet.groups[].gym`).

    gym: {env, kwargs, observation, action, fallback, success, episode_s}     (a scenario group's key)
        |  gym_robot_type(): one probe env -> its spaces -> state/action names and bounds, mapping checked
        v
    GymBatch: one env per robot, stepped robot by robot (a generic env cannot be batched)
        engine action --offset + scale * a, clip--> env.step --observation mapping--> state (S,) float32, images

Invariant: a GymBatch keeps RobotBatch's contract (states, step(actions with None rows), done, reset(idx),
extend_episode, episode_score, robot(i)), so a shard's loop cannot tell the two apart, and the shipped MuJoCo
types keep their batched RobotBatch untouched. An episode ends when the env says terminated or truncated, or
at `episode_s`. A mapping the env's spaces cannot satisfy is refused with `GymMappingError`, which names the
key (below `gym`) and the env's actual space.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import re
from collections.abc import Sequence
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium.utils import seeding

from bench.robots.core import DEFAULT_FPS, ROBOT_TYPES, RobotType, measure_tick_us

GYM_PREFIX = "gym:"
FALLBACKS = ("hold", "zero")
DEFAULT_SUCCESS = {"info": "is_success"}
# `observation.state` entries: a key path into a Dict observation (`agent_pos`, `pixels.top`), then an
# optional index or slice into that leaf flattened (`agent_pos[0:2]`, `[3]` for a Box observation)
_ENTRY = re.compile(r"^(?P<path>[A-Za-z_][\w-]*(?:\.[\w-]+)*)?(?:\[(?P<lo>-?\d*)(?P<colon>:)?(?P<hi>-?\d*)\])?$")


class GymMappingError(ValueError):
    """A `gym:` mapping the env cannot satisfy: `path` is the key below `gym` (("observation", "state", 0))."""

    def __init__(self, path: tuple, message: str):
        self.path, self.message = path, message
        super().__init__(f"gym.{'.'.join(map(str, path))}: {message}")


# --- the env ---------------------------------------------------------------------------------------


def make_env(config: dict) -> gym.Env:
    """The env a `gym:` config names: a registered id (its package imported first when the id is
    `namespace/Name-vN` and the namespace is not registered yet) or `module:callable` returning an env."""
    env_id, kwargs = config["env"], dict(config.get("kwargs") or {})
    module, colon, attr = env_id.partition(":")
    if colon and "/" not in module and not attr.startswith(("/", " ")) and re.match(r"^[A-Za-z_][\w.]*$", attr):
        try:
            factory = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise GymMappingError(
                ("env",), f"cannot load {env_id!r}: {exc}; install the package that defines it, or put it on PYTHONPATH"
            ) from None
        if isinstance(factory, type) and issubclass(factory, gym.Env) or callable(factory):
            env = factory(**kwargs)
        else:
            raise GymMappingError(("env",), f"{env_id!r} is not callable")
        if not isinstance(env, gym.Env):
            raise GymMappingError(("env",), f"{env_id!r} returned {type(env).__name__}, not a gymnasium.Env")
        return env
    namespace = env_id.split("/", 1)[0] if "/" in env_id else None
    if namespace and namespace not in {s.namespace for s in gym.registry.values()}:
        try:
            importlib.import_module(namespace)  # gym-pusht registers `gym_pusht/PushT-v0` when imported
        except ImportError:
            pass
    try:
        return gym.make(env_id, **kwargs)
    except gym.error.Error as exc:
        raise GymMappingError(("env",), f"{exc}; give a registered env id or `module:callable`") from None
    except TypeError as exc:
        raise GymMappingError(("kwargs",), f"the env refuses its kwargs: {exc}") from None


def describe(space: gym.Space) -> str:
    return str(space)


# --- the mapping -----------------------------------------------------------------------------------


def _leaf(space: gym.Space, path: str, key: tuple) -> gym.Space:
    sub = space
    for part in path.split("."):
        if not isinstance(sub, gym.spaces.Dict) or part not in sub.spaces:
            raise GymMappingError(key, f"key {path!r} not in the env's observation space {describe(space)}")
        sub = sub.spaces[part]
    return sub


def _state_entry(space: gym.Space, entry: str, key: tuple) -> tuple[tuple[str, ...], slice, list[str]]:
    m = _ENTRY.match(entry.strip())
    if not m or (not m["path"] and m["lo"] is None and not m["colon"]):
        raise GymMappingError(
            key,
            f"{entry!r} is not a key path (`agent_pos`, `pixels.top`) with an optional "
            f"index or slice (`agent_pos[0:2]`, `[3]`); the observation space: {describe(space)}",
        )
    path = m["path"] or ""
    if path:
        leaf = _leaf(space, path, key)
    elif isinstance(space, gym.spaces.Dict):
        raise GymMappingError(key, f"{entry!r} names no key of the env's Dict observation space {describe(space)}")
    else:
        leaf = space
    if not isinstance(leaf, gym.spaces.Box):
        raise GymMappingError(key, f"{path or 'the observation'} is {describe(leaf)}, not a Box: a state takes numbers")
    size = int(np.prod(leaf.shape))
    if m["colon"]:
        sl = slice(int(m["lo"]) if m["lo"] else None, int(m["hi"]) if m["hi"] else None)
    elif m["lo"]:
        k = int(m["lo"])
        if not -size <= k < size:
            raise GymMappingError(
                key, f"index {k} outside {path or 'the observation'} {describe(leaf)} ({size} values)"
            )
        sl = slice(k, k + 1 if k != -1 else None)
    else:
        sl = slice(None)
    picked = list(range(size))[sl]
    if not picked:
        raise GymMappingError(key, f"{entry!r} selects nothing of {path or 'the observation'} {describe(leaf)}")
    name = path or "obs"
    return tuple(path.split(".")) if path else (), sl, [f"{name}[{k}]" if size > 1 else name for k in picked]


def _camera_entry(space: gym.Space, name: str, path: str, key: tuple) -> tuple[tuple[str, ...], tuple[int, int]]:
    leaf = _leaf(space, path, key)
    if not (
        isinstance(leaf, gym.spaces.Box) and leaf.dtype == np.uint8 and len(leaf.shape) == 3 and leaf.shape[2] == 3
    ):
        raise GymMappingError(
            key,
            f"camera {name!r}: {path!r} is {describe(leaf)}; a camera takes an (H, W, 3) "
            "uint8 image (with gym-pusht: kwargs {obs_type: pixels_agent_pos})",
        )
    return tuple(path.split(".")), (int(leaf.shape[0]), int(leaf.shape[1]))


def _per_action(value: Any, n: int, key: tuple, env_space: gym.Space) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float64).reshape(-1)
    if arr.size == 1:
        return np.full(n, float(arr[0]))
    if arr.size != n:
        raise GymMappingError(
            key, f"{arr.size} values for the env's {n} actions; its action space: {describe(env_space)}"
        )
    return arr


class GymMapping:
    """A `gym:` config checked against the env's spaces: what `state`, `images` and `env_action` compute."""

    def __init__(self, config: dict, observation_space: gym.Space, action_space: gym.Space):
        obs = config.get("observation") or {}
        state = obs.get("state")
        if state is None:
            if isinstance(observation_space, gym.spaces.Dict):
                raise GymMappingError(
                    ("observation", "state"),
                    "a Dict observation needs `state`: the keys (or "
                    f"slices) that make the policy's state; the env's: {describe(observation_space)}",
                )
            state = ["[:]"]
        self.state_parts = [
            _state_entry(observation_space, str(e), ("observation", "state", i)) for i, e in enumerate(state)
        ]
        self.state_names = tuple(n for _, _, names in self.state_parts for n in names)
        self.cameras = {
            name: _camera_entry(observation_space, name, str(path), ("observation", "cameras", name))
            for name, path in (obs.get("cameras") or {}).items()
        }
        if not isinstance(action_space, gym.spaces.Box) or len(action_space.shape) != 1:
            raise GymMappingError(
                ("env",),
                f"the env's action space is {describe(action_space)}; a fleet robot "
                "takes a 1-D Box of numbers (wrap a Discrete env in your own `module:callable`)",
            )
        self.action_space = action_space
        n = action_space.shape[0]
        act = config.get("action") or {}
        names = act.get("names")
        if names is None:
            names = [f"action[{k}]" for k in range(n)]
        if len(names) != n:
            raise GymMappingError(
                ("action", "names"),
                f"{len(names)} names for the env's {n} actions; its action space: {describe(action_space)}",
            )
        self.action_names = tuple(str(x) for x in names)
        self.scale = _per_action(act.get("scale", 1.0), n, ("action", "scale"), action_space)
        self.offset = _per_action(act.get("offset", 0.0), n, ("action", "offset"), action_space)
        if np.any(self.scale == 0):
            raise GymMappingError(("action", "scale"), "a scale of 0 throws the engine's action away")
        self.clip = bool(act.get("clip", True))
        lo = (action_space.low.astype(np.float64) - self.offset) / self.scale
        hi = (action_space.high.astype(np.float64) - self.offset) / self.scale
        self.low, self.high = np.minimum(lo, hi), np.maximum(lo, hi)  # the engine's units
        fallback = config.get("fallback", "hold")
        if isinstance(fallback, str):
            if fallback not in FALLBACKS:
                raise GymMappingError(("fallback",), f"{fallback!r} is not `hold`, `zero` or a list of {n} numbers")
            self.fixed_fallback = None
        else:
            self.fixed_fallback = _per_action(fallback, n, ("fallback",), action_space)
            if np.any(self.fixed_fallback < self.low) or np.any(self.fixed_fallback > self.high):
                raise GymMappingError(
                    ("fallback",),
                    f"{self.fixed_fallback.tolist()} lies outside the engine's action "
                    f"range {self.low.tolist()}..{self.high.tolist()} (the env's {describe(action_space)} "
                    "through scale and offset)",
                )
        self.fallback = fallback if isinstance(fallback, str) else "fixed"
        success = dict(config.get("success") or DEFAULT_SUCCESS)
        given = [k for k in ("info", "reward", "terminated") if success.get(k) is not None]
        if len(given) != 1:
            raise GymMappingError(
                ("success",), f"give exactly one of `info`, `reward`, `terminated` (got {given or 'none'})"
            )
        self.success = success

    def state(self, obs: Any) -> np.ndarray:
        parts = []
        for path, sl, _ in self.state_parts:
            leaf = obs
            for p in path:
                leaf = leaf[p]
            parts.append(np.ravel(np.asarray(leaf, dtype=np.float32))[sl])
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    def images(self, obs: Any) -> dict[str, np.ndarray]:
        out = {}
        for name, (path, _) in self.cameras.items():
            leaf = obs
            for p in path:
                leaf = leaf[p]
            out[name] = leaf
        return out

    def env_action(self, command: np.ndarray) -> np.ndarray:
        a = self.offset + self.scale * command
        if self.clip:
            a = np.clip(a, self.action_space.low, self.action_space.high)
        return a.astype(self.action_space.dtype)


def check_mapping(config: dict) -> tuple[GymMapping, gym.Env]:
    """The mapping checked against a fresh env (the caller closes it); GymMappingError names the key."""
    env = make_env(config)
    try:
        return GymMapping(config, env.observation_space, env.action_space), env
    except Exception:
        env.close()
        raise


def check_env_contract(config: dict) -> None:
    """gymnasium.utils.env_checker.check_env on a fresh env: GymMappingError(("env",), ...) with its words."""
    import warnings

    from gymnasium.utils.env_checker import check_env

    env = make_env(config)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            check_env(env.unwrapped, skip_render_check=True)
    except Exception as exc:
        raise GymMappingError(
            ("env",),
            f"gymnasium's check_env refuses {config['env']!r}: {type(exc).__name__}: "
            f"{exc}; fix the env, or set gym.check_env: false to run it anyway",
        ) from None
    finally:
        env.close()


# --- the robot type --------------------------------------------------------------------------------


class GymRobotType(RobotType):
    """A robot type made from a `gym:` config (gym_robot_type). Its `fleet()` is a GymBatch, never a RobotBatch:
    it has no MJCF of ours, so nothing of RobotBatch's MuJoCo stepping applies."""

    config: ClassVar[dict] = {}
    fps: ClassVar[float] = DEFAULT_FPS
    cameras: ClassVar[dict[str, tuple[int, int]]] = {}  # camera name -> (height, width) from the observation
    tick_us: ClassVar[float | None] = None  # measured cost of one robot's tick (measure_tick_us), for the sizing
    mapping: ClassVar[GymMapping | None] = None

    @classmethod
    def fleet(cls, n: int, *, seed: int | None = 0, fps: float = DEFAULT_FPS, episode_s: float | None = None):
        return GymBatch(cls, n, seed=seed, fps=fps, episode_s=episode_s)


def config_key(config: dict) -> str:
    return json.dumps(config, sort_keys=True, default=str)


def type_name(config: dict, taken: dict[str, dict] | None = None) -> str:
    """`gym:<env>`, or with a digest of the config where `taken` (name -> config, e.g. the other groups of one
    scenario) holds that name for another config."""
    name = GYM_PREFIX + config["env"]
    other = (taken or {}).get(name)
    if other is None or config_key(other) == config_key(config):
        return name
    return f"{name}~{hashlib.sha1(config_key(config).encode()).hexdigest()[:6]}"


def gym_robot_type(config: dict, name: str | None = None, *, measure: bool = True) -> type[GymRobotType]:
    """The robot type of a `gym:` config, registered in ROBOT_TYPES under `name` (default `type_name`), replacing
    a type of another config there: the same config gives the same class. Raises GymMappingError."""
    name = name or type_name(config)
    known = ROBOT_TYPES.get(name)
    if known is not None and config_key(getattr(known, "config", {})) == config_key(config):
        return known
    mapping, env = check_mapping(config)
    try:
        render_fps = (getattr(env, "metadata", None) or {}).get("render_fps")
        max_steps = getattr(getattr(env, "spec", None), "max_episode_steps", None)
    finally:
        env.close()
    fps = float(render_fps) if render_fps else float(DEFAULT_FPS)
    episode_s = config.get("episode_s") or (max_steps / fps if max_steps else 10.0)
    cls = type(
        "Gym_" + re.sub(r"\W", "_", config["env"]),
        (GymRobotType,),
        {
            "name": name,
            "config": json.loads(config_key(config)),
            "mapping": mapping,
            "action_names": mapping.action_names,
            "state_names": mapping.state_names,
            "action_low": tuple(mapping.low.tolist()),
            "action_high": tuple(mapping.high.tolist()),
            "episode_s": float(episode_s),
            "fps": fps,
            "cameras": {k: size for k, (_, size) in mapping.cameras.items()},
            "safe_fallback": "zero" if mapping.fallback == "zero" else "hold",
            "nominal_physics_dt": 1.0 / fps,  # one env.step a tick at the env's own rate
            "__module__": __name__,
        },
    )
    ROBOT_TYPES[name] = cls
    if measure:
        try:
            cls.tick_us = measure_tick_us(cls, robots=1, ticks=30)
        except Exception:  # an env that fails to step: gymnasium's check_env says why (check_env_contract)
            cls.tick_us = None
    return cls


# --- the fleet -------------------------------------------------------------------------------------


class GymBatch:
    """N envs of one gym robot type, stepped robot by robot at `fps` (RobotBatch's contract, see the module).

    Robot i of GymBatch(t, n, seed=s) resets its env with seeds drawn from rngs[i] (seeding.np_random(s + i)),
    so a robot's episodes are the same alone or in a fleet. `states` is a new array after every step and reset.
    """

    def __init__(
        self,
        cls: type[GymRobotType],
        n: int,
        *,
        seed: int | None = 0,
        fps: float = DEFAULT_FPS,
        episode_s: float | None = None,
    ):
        self.cls = self.type = cls
        self.mapping = cls.mapping
        self.fps = float(fps)
        self.control_dt = 1.0 / self.fps
        self.n = n
        self.episode_ticks = max(1, round((episode_s or cls.episode_s) * self.fps))
        self.envs = [make_env(cls.config) for _ in range(n)]
        self.rngs = [seeding.np_random(None if seed is None else seed + i)[0] for i in range(n)]
        num_actions = len(cls.action_names)
        self.low, self.high = np.asarray(cls.action_low), np.asarray(cls.action_high)
        self.last_command = np.zeros((n, num_actions))
        self.tick = np.zeros(n, dtype=np.int64)
        self.episode_limit = np.full(n, self.episode_ticks, dtype=np.int64)
        self.terminated = np.zeros(n, dtype=bool)
        self.truncated = np.zeros(n, dtype=bool)
        self.succeeded = np.zeros(n, dtype=bool)
        self.failed = np.zeros(n, dtype=bool)
        self.reward = np.zeros(n)
        self.returns = np.zeros(n)
        self.bad_commands = np.zeros(n, dtype=np.int64)
        self.images: list[dict[str, np.ndarray]] = [{} for _ in range(n)]
        self.states = np.zeros((n, len(cls.state_names)), dtype=np.float32)
        self.reset()

    @property
    def done(self) -> np.ndarray:
        return self.terminated | self.truncated | (self.tick >= self.episode_limit)

    def extend_episode(self, extra_ticks: np.ndarray) -> None:
        self.episode_limit += np.asarray(extra_ticks, dtype=np.int64)

    def reset(self, indices: Sequence[int] | np.ndarray | None = None, seed: int | None = None) -> np.ndarray:
        idx = range(self.n) if indices is None else [int(i) for i in indices]
        states = self.states.copy()
        for i in idx:
            if seed is not None:
                self.rngs[i] = seeding.np_random(seed + i)[0]
            obs, _info = self.envs[i].reset(seed=int(self.rngs[i].integers(2**31 - 1)))
            states[i] = self.mapping.state(obs)
            self.images[i] = self.mapping.images(obs)
            self.last_command[i] = self._hold_row(np.zeros(len(self.low)), start=True)
            self.tick[i] = 0
            self.episode_limit[i] = self.episode_ticks
            self.terminated[i] = self.truncated[i] = self.succeeded[i] = self.failed[i] = False
            self.reward[i] = self.returns[i] = 0.0
            self.bad_commands[i] = 0
        self.states = states
        return self.states

    def _hold_row(self, last: np.ndarray, start: bool = False) -> np.ndarray:
        m = self.mapping
        if m.fixed_fallback is not None:
            return m.fixed_fallback.copy()
        if m.fallback == "zero" or start:
            return np.clip(np.zeros(len(self.low)), self.low, self.high)
        return last.copy()

    def hold_actions(self) -> np.ndarray:
        return np.array([self._hold_row(self.last_command[i]) for i in range(self.n)])

    def resolve(self, actions) -> np.ndarray:
        """The command (engine units) each robot executes this tick, (B, A): None rows and non-finite ones hold."""
        hold = self.hold_actions()
        if actions is None:
            return hold
        command = hold.copy()
        for i, a in enumerate(actions):
            if a is None:
                continue
            row = np.asarray(a, dtype=np.float64).reshape(-1)
            if row.shape != hold[i].shape or not np.isfinite(row).all():
                self.bad_commands[i] += 1
                continue
            command[i] = np.clip(row, self.low, self.high)
        return command

    def step(self, actions: np.ndarray | Sequence[np.ndarray | None] | None = None) -> np.ndarray:
        command = self.resolve(actions)
        self.last_command = command
        states = self.states.copy()
        success = self.mapping.success
        for i, env in enumerate(self.envs):
            if self.terminated[i] or self.truncated[i]:
                continue  # stepping an env past its episode's end is undefined: the loop resets it first
            obs, reward, terminated, truncated, info = env.step(self.mapping.env_action(command[i]))
            states[i] = self.mapping.state(obs)
            if self.mapping.cameras:
                self.images[i] = self.mapping.images(obs)
            self.reward[i] = reward
            self.returns[i] += reward
            self.terminated[i], self.truncated[i] = terminated, truncated
            if success.get("info") is not None:
                self.succeeded[i] = bool(info.get(success["info"], False))
            elif success.get("reward") is not None:
                self.succeeded[i] |= reward >= success["reward"]
            else:
                failure = success.get("failure_info")
                self.failed[i] |= bool(failure and info.get(failure, False))
                self.succeeded[i] = terminated and not truncated and not self.failed[i]
        self.tick += 1
        self.states = states
        return self.states

    def episode_score(self) -> tuple[np.ndarray, np.ndarray]:
        """(success_score, is_success): 1 or 0 by the config's `success` rule, on the episode so far."""
        return self.succeeded.astype(float), self.succeeded.copy()

    def robot(self, i: int) -> GymRobotView:
        return GymRobotView(self, i)

    def close(self) -> None:
        for env in self.envs:
            env.close()


class GymRobotView:
    """One robot of a GymBatch as a camera sees it: the images of its latest observation (camera kind
    `observation`); it has no MuJoCo scene of ours, so a `rendered` camera cannot draw it."""

    model = None
    camera_view: ClassVar[dict] = {}

    def __init__(self, batch: GymBatch, i: int):
        self.batch, self.index = batch, i
        self.robot_type = batch.type.name

    def observation_image(self, name: str) -> np.ndarray:
        return self.batch.images[self.index][name]

    def scene_data(self):
        raise RuntimeError(f"robot type {self.robot_type!r} is a gymnasium env: use camera kind `observation`")
