"""SO-101 pick-cube: the scripted expert, its demos, and `bench train --robot so101` (a gym robot type).

    ENV (scenarios/so101_pick_wan.yaml's `gym:`) --PickCubeExpert + DART noise--> (states, chunks of the next
    clean labels) -> server.policies.train.train_bc -> bench/checkpoints/so101/ -> evaluate_closed_loop

The built-in types' training (bench.training.train) plans chunks on batched twins of our own MJCF; this env
is the package's, so its chunks are the next labels along the driven path (bench.training.demos'
"trajectory" labels) and its evaluation steps the env itself, on time and as the fleet runs a chunk (a tick
late, from row 1: `run_episodes(latency_ticks=1)`). Success is the env's `info["succeed"]`
(the cube lifted 10 cm and within 5 cm of the gripper), the same word the scenario's `success` names.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

# The fleet's `gym:` mapping; the scenario and the checkpoint share it (state and action names, fps 10).
ENV_CONFIG: dict[str, Any] = {
    "env": "bench.robots.so101:make",
    # 2.5 cm per unit action (the package's scripted scale), the gripper held top-down, pads on the jaws
    # (without them the jaw meshes touch the cube at one point each and it slips), a random cube each episode
    "kwargs": {"action_scale": 0.025, "top_down_ik": True, "jaw_pads": True, "random_block_position": True},
    "observation": {"state": ["agent_pos", "environment_state"]},
    "action": {"names": ["dx", "dy", "dz", "grasp"]},
    # no command: stand still and close the jaws (a held cube stays held; `hold` would repeat a motion)
    "fallback": [0.0, 0.0, 0.0, 0.0],
    "success": {"info": "succeed"},
}
EVAL_EPISODES = 50
CHUNK_SIZE = 6
EXECUTION_HORIZON = 3
NOISE_STD = np.array([0.15, 0.15, 0.15, 0.0])  # action units (x 2.5 cm); the jaw command stays clean
NOISE_CORRELATION = 0.7

# agent_pos: qpos (5), qvel (5), gripper_pose (1: the jaw command, -1 closed .. 1 open), ee xyz (3); then cube xyz
_Q, _QVEL, _GRIP, _CUBE = slice(0, 5), slice(5, 10), 10, slice(14, 17)


class PickCubeExpert:
    """Hover over the cube, descend, close the jaws in steps, lift: a pure function of the 17-value state.

    The phase is read from the state, never remembered, so a cloned policy can learn it: the jaw command
    (`gripper_pose`) says whether closing has begun, the grasp point (between the jaws, from forward
    kinematics of the arm's joints on a scratch MjData) against the cube says where the hand is. The jaws
    close over four ticks (the command stepped down from the one in the state) so they settle on the cube
    before the lift; a descent the top-down IK cannot finish (stalled joints) closes where it stopped.
    """

    SCALE = 0.025  # ENV_CONFIG's action_scale
    GRASP_HEIGHT = 0.015  # grasp point above the cube's centre: the pads pinch its upper half
    HOVER_HEIGHT = 0.07
    LIFT_HEIGHT = 0.14  # over the 0.10 the env counts as a lift
    CAREFUL = 0.4  # action units near the cube
    GAIN = 1.0  # of the error a tick (0.5 survives a tick-late execution, 0.90 vs 0.20, but does not clone: 0.0)

    def __init__(self, model):
        import mujoco

        from bench.robots.so101 import import_env_package

        import_env_package()
        from lerobot_env_so101.ik_control import control_point
        from lerobot_env_so101.mujoco_env import _ARM_JOINT_NAMES, grasp_point_offset

        self.mujoco, self.control_point = mujoco, control_point
        self.model, self.data = model, mujoco.MjData(model)
        self.site = model.site("gripperframe").id
        self.offset = grasp_point_offset(model, self.site)
        self.qadr = [model.joint(name).qposadr[0] for name in _ARM_JOINT_NAMES]
        self.table_z = float(model.geom("block").size[2])  # the cube's centre at rest

    def grasp_point(self, state: np.ndarray) -> np.ndarray:
        self.data.qpos[self.qadr] = state[_Q]
        self.mujoco.mj_kinematics(self.model, self.data)
        return self.control_point(self.data, self.site, self.offset)

    def __call__(self, state: np.ndarray) -> np.ndarray:
        state = np.asarray(state, dtype=np.float64)
        grasp, cube, jaw = self.grasp_point(state), state[_CUBE], state[_GRIP]
        error = cube + (0.0, 0.0, self.GRASP_HEIGHT) - grasp
        near = np.linalg.norm(error) < 0.03
        stalled = np.linalg.norm(state[_QVEL]) < 0.05 and abs(error[2]) < 0.03
        at_cube = np.linalg.norm(error[:2]) < 0.008 and (abs(error[2]) < 0.008 or stalled)
        if jaw < -0.99 and near:  # closed on the cube: lift straight up
            goal = np.array([grasp[0], grasp[1], self.table_z + self.GRASP_HEIGHT + self.LIFT_HEIGHT])
            return self._towards(goal - grasp, self.CAREFUL, 0.0)
        if (jaw < 0.99 and near) or at_cube:  # closing: stand still, the jaw command one step further closed
            return np.array([0.0, 0.0, 0.0, max(0.0, (jaw + 1) / 2 - 0.25)], dtype=np.float32)
        if np.linalg.norm(error[:2]) > 0.02:
            goal = np.array([cube[0], cube[1], self.table_z + self.HOVER_HEIGHT])
            return self._towards(goal - grasp, 1.0, 1.0)
        return self._towards(error, self.CAREFUL, 1.0)

    def _towards(self, delta: np.ndarray, limit: float, jaw: float) -> np.ndarray:
        return np.array([*np.clip(self.GAIN * delta / self.SCALE, -limit, limit), jaw], dtype=np.float32)


def make_env():
    from bench.robots.gymenv import make_env as make

    return make(ENV_CONFIG)


def mapping():
    from bench.robots.gymenv import gym_robot_type

    return gym_robot_type(ENV_CONFIG, measure=False).mapping


def run_episodes(
    act_fn,
    episodes: int,
    seed: int,
    *,
    replan_every: int = 1,
    noise: float = 0.0,
    latency_ticks: int = 0,
):
    """Closed loop on the env: `act_fn(state) -> (T, 4)` called every `replan_every` ticks, its rows run open
    loop meanwhile (the fallback past its end and before the first chunk). Yields per episode (states, the
    actions commanded (clean of the noise), succeeded).

    `latency_ticks`: a chunk asked for at tick t takes over at tick t + latency_ticks from that row, the previous
    chunk running until then: the fleet's engine, whose chunk arrives after the tick its state was read at (row
    0's tick has passed; scenarios/so101_pick_wan.yaml's tick log shows chunk_index 1 first)."""
    env, mapper = make_env(), mapping()
    rng = np.random.default_rng([seed, 0xDA27])
    innovation = NOISE_STD * noise * np.sqrt(1 - NOISE_CORRELATION**2)
    fallback = np.asarray(ENV_CONFIG["fallback"], np.float32)
    try:
        for e in range(episodes):
            obs, _ = env.reset(seed=seed + e)
            perturbation = rng.normal(0.0, 1.0, 4) * NOISE_STD * noise
            states, labels, info, tick = [], [], {}, 0
            chunk, cursor, pending = np.zeros((0, 4), np.float32), 0, None
            while True:
                state = mapper.state(obs)
                if tick % replan_every == 0:
                    pending = (tick + latency_ticks, np.asarray(act_fn(state), dtype=np.float32).reshape(-1, 4))
                if pending is not None and tick >= pending[0]:
                    chunk, cursor, pending = pending[1], latency_ticks, None
                action = chunk[cursor] if cursor < len(chunk) else fallback
                cursor += 1
                states.append(state)
                labels.append(action)
                obs, _, terminated, truncated, info = env.step(mapper.env_action(action + perturbation))
                perturbation = NOISE_CORRELATION * perturbation + rng.normal(0.0, 1.0, 4) * innovation
                tick += 1
                if terminated or truncated:
                    break
            yield np.asarray(states, np.float32), np.asarray(labels, np.float32), bool(info.get("succeed"))
    finally:
        env.close()


def expert_policy():
    """The expert as an `act(state) -> (1, 4)` chunk callable on its own scratch model."""
    env = make_env()
    expert = PickCubeExpert(env.unwrapped.model)
    env.close()
    return lambda state: expert(state)[None]


def expert_success(episodes: int, seed: int) -> float:
    return float(np.mean([ok for _, _, ok in run_episodes(expert_policy(), episodes, seed)]))


def collect_demos(episodes: int, seed: int, chunk_size: int = CHUNK_SIZE, noise: float = 1.0):
    """(states (N, 17), chunks (N, chunk_size, 4), success of the demo episodes): the expert driven with DART
    noise, each visited state with the next chunk_size clean labels along the driven path."""
    from bench.training.demos import _chunks

    states, chunks, successes = [], [], []
    for s, labels, ok in run_episodes(expert_policy(), episodes, seed, noise=noise):
        states.append(s)
        chunks.append(_chunks(labels, chunk_size))
        successes.append(ok)
    return np.concatenate(states), np.concatenate(chunks), float(np.mean(successes))


def train(
    out: Path,
    seed: int = 0,
    *,
    episodes: int = 200,
    epochs: int = 40,
    steps: int | None = None,
    eval_episodes: int = EVAL_EPISODES,
) -> Path:
    """Demos, train_bc, and evaluation.json (policy and expert success over `eval_episodes`); `steps` sets the
    epochs so that about that many optimiser steps (of 256) run."""
    import torch

    from bench.training.train import EVALUATION_FILE, CheckpointPolicy
    from server.policies.base import PolicyConfig
    from server.policies.train import TRAINING_LOG_FILE, train_bc

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        started = time.perf_counter()
        states, chunks, demo_success = collect_demos(episodes, seed)
        collect_seconds = time.perf_counter() - started
        if steps:
            epochs = max(1, steps // max(1, -(-len(states) // 256)))
        m = mapping()
        config = PolicyConfig(
            type="flow_matching",
            state_dim=len(m.state_names),
            action_dim=len(m.action_names),
            chunk_size=CHUNK_SIZE,
            fps=10.0,
            action_names=list(m.action_names),
            state_names=list(m.state_names),
            execution_horizon=EXECUTION_HORIZON,
            hyper_params={},
        )
        path = Path(train_bc("flow_matching", states, chunks, config, out, epochs=epochs, seed=seed))
        log = json.loads((path / TRAINING_LOG_FILE).read_text())
        log.update(
            robot_type="so101",
            env=ENV_CONFIG,
            demo_episodes=episodes,
            demo_success_rate=demo_success,
            collect_seconds=round(collect_seconds, 3),
            total_seconds=round(time.perf_counter() - started, 3),
        )
        (path / TRAINING_LOG_FILE).write_text(json.dumps(log, indent=2) + "\n")
        if eval_episodes:
            eval_seed = seed + 10_000
            policy = CheckpointPolicy(path, EXECUTION_HORIZON)
            rate = np.mean(
                [ok for *_, ok in run_episodes(policy, eval_episodes, eval_seed, replan_every=EXECUTION_HORIZON)]
            )
            # as the fleet's engine runs it: the chunk arrives after the tick its state was read at, so it takes
            # over a tick later from row 1 (the ticks of scenarios/so101_pick_wan.yaml)
            late = [
                ok
                for *_, ok in run_episodes(
                    policy, eval_episodes, eval_seed, replan_every=EXECUTION_HORIZON, latency_ticks=1
                )
            ]
            result = {
                "robot_type": "so101",
                "episodes": eval_episodes,
                "seed": eval_seed,
                "replan_every": EXECUTION_HORIZON,
                "success_rate": float(rate),
                "success_rate_one_tick_late": float(np.mean(late)),
                "expert": {"success_rate": expert_success(eval_episodes, eval_seed)},
            }
            (path / EVALUATION_FILE).write_text(json.dumps(result, indent=2) + "\n")
    finally:
        torch.set_num_threads(threads)
    return path
