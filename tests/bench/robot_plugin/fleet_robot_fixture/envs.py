"""PointReach: a planar two-joint arm in a few lines of numpy, shaped like the reacher's policy input (10
values: 8 of `joints`, 2 of `to_target`) and output (two torques), so the bench's shipped reacher checkpoint
can drive it. Success: the fingertip within 2 cm of the target."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

LINKS = (0.1, 0.11)
DT = 1 / 30


class PointReachEnv(gym.Env):
    metadata = {"render_modes": [], "render_fps": 30}

    def __init__(self, damping: float = 1.0, image: bool = False):
        self.damping = damping
        spaces = {
            "joints": gym.spaces.Box(-np.inf, np.inf, (8,), np.float32),
            "to_target": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
        }
        if image:
            spaces["camera"] = gym.spaces.Box(0, 255, (16, 16, 3), np.uint8)
        self.observation_space = gym.spaces.Dict(spaces)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.q = np.zeros(2)
        self.qd = np.zeros(2)
        self.target = np.zeros(2)

    def _tip(self) -> np.ndarray:
        a = self.q[0]
        b = self.q[0] + self.q[1]
        return np.array([LINKS[0] * np.cos(a) + LINKS[1] * np.cos(b), LINKS[0] * np.sin(a) + LINKS[1] * np.sin(b)])

    def _obs(self) -> dict:
        joints = np.concatenate([np.cos(self.q), np.sin(self.q), self.target, self.qd]).astype(np.float32)
        obs = {"joints": joints, "to_target": (self._tip() - self.target).astype(np.float32)}
        if "camera" in self.observation_space.spaces:
            level = int(np.clip(255 * np.linalg.norm(obs["to_target"]) / 0.4, 0, 255))
            obs["camera"] = np.full((16, 16, 3), level, np.uint8)
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.q = self.np_random.uniform(-0.1, 0.1, 2)
        self.qd = np.zeros(2)
        while True:
            self.target = self.np_random.uniform(-0.2, 0.2, 2)
            if np.linalg.norm(self.target) < 0.2:
                break
        return self._obs(), {}

    def step(self, action):
        torque = np.clip(np.asarray(action, dtype=np.float64), -1.0, 1.0)
        self.qd += DT * (torque * 20.0 - self.damping * self.qd)
        self.q += DT * self.qd
        obs = self._obs()
        distance = float(np.linalg.norm(obs["to_target"]))
        return obs, -distance, False, False, {"is_success": distance < 0.02, "distance": distance}


class _BrokenReset(PointReachEnv):
    """Breaks the Gymnasium contract gymnasium's check_env checks: reset's observation lies outside its space."""

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        obs["to_target"] = np.zeros(3, np.float32)
        return obs, info


def broken_env(**kwargs) -> gym.Env:
    """A `module:callable` env factory whose env check_env refuses (its spaces are the PointReach ones)."""
    return _BrokenReset(**kwargs)
