"""Demonstrations for behaviour cloning, and the closed-loop check a cloned chunk policy must pass.

collect_demos runs a type's scripted expert (bench.training.experts) with DART-style noise: the robot
executes expert + small temporally correlated noise, but every label is clean expert output at the
state actually visited, so the data covers the drift a cloned policy will cause and shows how to
recover from it. Each state is paired with a chunk of `chunk_size` clean labels (`CHUNK_LABELS`):
- "plan": the expert's open-loop plan from that state (bench.training.experts.plan_chunks). A chunk runs
  open loop, so this is the chunk that reproduces the expert; what `bench train` clones.
- "trajectory": the next labels along the noisy path actually driven, the last repeated past the
  episode end. They answer noise that will not recur when the chunk runs open loop (on reacher the
  gap to the plan is half the labels' own spread), so a policy cloned from them drifts.
collect_prefix_demos adds training-time RTC's labels: a delay d per state, the d rows the robot is
already committed to (the previous request's plan), then the expert's plan from where they lead.

evaluate_closed_loop runs a chunk policy the way the fleet does: one call per `replan_every`
ticks, the chunk executed open-loop meanwhile, and "no command" (the robot's hold semantics) when a
chunk runs out before the next call. It reports task success and seam smoothness.

Output arrays are float32, states (N, S) in the robot's state_names order and chunks (N, T, A) in
action_names order: what server.policies.train.train_bc consumes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from bench.evidence.seams import seam_metrics
from bench.robots import DEFAULT_FPS, make_robot
from bench.training.experts import expert_for, plan_chunks

# Per-type DART noise, in action units per dimension: small next to the expert's own corrections.
NOISE_STD: dict[str, tuple[float, ...]] = {
    "arm": (0.03,) * 6,  # rad of position target
    "reacher": (0.1, 0.1),  # of the +-1 torque range
    "base": (0.05, 0.15),  # m/s, rad/s
}
# AR(1) correlation per tick (~0.3 s at 30 Hz): white noise at 30 Hz is filtered away by the servos
# and never pushes the robot off the expert's path, so it would teach no recovery.
NOISE_CORRELATION = 0.9

CHUNK_LABELS = ("trajectory", "plan")


def collect_demos(
    robot_type: str,
    episodes: int,
    seed: int,
    chunk_size: int,
    *,
    noise: float = 1.0,
    fps: float = DEFAULT_FPS,
    episode_s: float | None = None,
    labels: str = "trajectory",
    stride: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """(states (N, S), action_chunks (N, chunk_size, A)), float32, from `episodes` expert episodes.

    Episode e uses robot seed `seed + e`; `noise` scales NOISE_STD (0 = the clean expert);
    `labels` is one of CHUNK_LABELS; `stride` keeps every stride-th visited state (a plan costs
    chunk_size simulated ticks, and neighbouring states teach nearly the same plan).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if labels not in CHUNK_LABELS:
        raise ValueError(f"labels must be one of {CHUNK_LABELS}, got {labels!r}")
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    all_states, all_chunks = [], []
    for states, actions in _dart_episodes(robot_type, episodes, seed, noise=noise, fps=fps, episode_s=episode_s):
        all_states.append(states[::stride])
        if labels == "trajectory":
            all_chunks.append(_chunks(actions, chunk_size)[::stride])
    states = np.concatenate(all_states)
    if labels == "plan":
        return states, plan_chunks(robot_type, states, chunk_size, fps=fps)
    return states, np.concatenate(all_chunks)


def _dart_episodes(robot_type: str, episodes: int, seed: int, *, noise: float, fps: float, episode_s: float | None):
    """Per episode (visited states (n, S), clean expert labels (n, A)), float32, the robot driven by the
    expert plus AR(1) noise (module docstring); episode e uses robot seed `seed + e`."""
    expert = expert_for(robot_type)
    rng = np.random.default_rng([seed, 0xDA27])  # the noise stream, independent of robot seeds
    env = make_robot(robot_type, seed=seed, fps=fps, episode_s=episode_s)
    std = noise * np.asarray(NOISE_STD.get(robot_type, (0.0,) * env.action_space.shape[0]))
    innovation = std * np.sqrt(1 - NOISE_CORRELATION**2)  # keeps the stationary std at `std`
    for e in range(episodes):
        state, _ = env.reset(seed=seed + e)
        perturbation = rng.normal(0.0, 1.0, std.shape) * std
        states, actions = [], []
        while True:
            label = expert(state)
            states.append(state)
            actions.append(label)
            state, _, terminated, truncated, _ = env.step(label + perturbation)
            perturbation = NOISE_CORRELATION * perturbation + rng.normal(0.0, 1.0, std.shape) * innovation
            if terminated or truncated:
                break
        yield np.asarray(states, dtype=np.float32), np.asarray(actions, dtype=np.float32)


def collect_prefix_demos(
    robot_type: str,
    episodes: int,
    seed: int,
    chunk_size: int,
    max_prefix_rows: int,
    *,
    noise: float = 1.0,
    fps: float = DEFAULT_FPS,
    episode_s: float | None = None,
    stride: int = 1,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(states (N, S), action_chunks (N, chunk_size, A), prefix_rows (N,)): training-time RTC's labels.

    At visited state t a delay d ~ U{0..max_prefix_rows} is drawn and s = plan_s(d, chunk_size): the
    previous request was made s ticks earlier, on state t - s, so the robot is committed to that plan's rows
    s..s+d-1 while the new chunk is computed. The label is those d rows, then the expert's plan from the
    state they lead to (plan_chunks with prefixes): a chunk that corrects after the committed rows, which is
    what asynchronous execution runs. States with no earlier request (t < s) get d = 0, the plain plan.
    """
    if not 0 <= max_prefix_rows < chunk_size:  # a chunk needs at least one row left to learn
        raise ValueError(f"max_prefix_rows must be in [0, chunk_size={chunk_size}), got {max_prefix_rows}")
    rng = np.random.default_rng([seed, 0x77C])  # the delays, independent of the robot's and noise's streams
    from bench.training.delay_eval import plan_s  # the remote engine's derived s

    per_episode = [
        states for states, _ in _dart_episodes(robot_type, episodes, seed, noise=noise, fps=fps, episode_s=episode_s)
    ]
    states = np.concatenate(per_episode)
    plans = plan_chunks(robot_type, states, chunk_size, fps=fps)  # the d = 0 labels and the earlier requests' plans
    prefixes = np.zeros_like(plans)
    prefix_rows = np.zeros(len(states), dtype=np.int64)
    offset = 0
    for episode in per_episode:
        for t in range(len(episode)):
            d = int(rng.integers(0, max_prefix_rows + 1))
            s = plan_s(d, chunk_size)
            d = min(d, chunk_size - s)  # d > H / 2: s = d, and the previous plan holds only H - s more rows
            if d and t >= s:
                prefixes[offset + t, :d] = plans[offset + t - s, s : s + d]
                prefix_rows[offset + t] = d
        offset += len(episode)
    chunks = plan_chunks(robot_type, states, chunk_size, fps=fps, prefixes=prefixes, prefix_rows=prefix_rows)
    keep = np.arange(len(states)) % stride == 0 if stride > 1 else slice(None)
    return states[keep], chunks[keep], prefix_rows[keep]


def collect_on_policy_prefix_demos(
    robot_type: str,
    checkpoint,
    episodes: int,
    seed: int,
    max_prefix_rows: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(states, action_chunks, prefix_rows) like collect_prefix_demos, from the states and committed rows of a
    trained checkpoint's own asynchronous execution (DAgger's idea): `episodes` episodes per delay d in
    1..max_prefix_rows, run as bench.training.delay_eval's rtc_training_time (or rtc for a checkpoint trained
    for guidance), every request labelled with its committed rows and then the expert's plan from where they
    lead. The policy's own prefixes and states are what it meets when it runs; the DART demos' are the
    expert's."""
    import torch

    from bench.training.delay_eval import load_policy, plan_s, run_strategy

    config = load_policy(checkpoint).config
    strategy = "rtc_training_time" if config.hyper_params.get("rtc_mode") == "training_time" else "rtc"
    chunk_size = config.chunk_size
    states, prefixes, rows = [], [], []

    def record(state: np.ndarray, committed: np.ndarray) -> None:
        states.append(state)
        padded = np.zeros((chunk_size, committed.shape[1]), np.float32)
        padded[: len(committed)] = committed[:chunk_size]
        prefixes.append(padded)
        rows.append(min(len(committed), chunk_size - 1))

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for d in range(1, max_prefix_rows + 1):
            run_strategy(
                checkpoint,
                robot_type,
                strategy,
                d,
                max(plan_s(d, chunk_size), d),
                episodes,
                seed + 1000 * d,
                on_request=record,
            )
    finally:
        torch.set_num_threads(threads)
    states_a = np.asarray(states, dtype=np.float32)
    prefix_rows = np.asarray(rows, dtype=np.int64)
    chunks = plan_chunks(
        robot_type, states_a, chunk_size, fps=config.fps, prefixes=np.asarray(prefixes), prefix_rows=prefix_rows
    )
    return states_a, chunks, prefix_rows


def _chunks(labels: np.ndarray, chunk_size: int) -> np.ndarray:
    """Row t = labels[t : t + chunk_size], the last label repeated past the end."""
    padded = np.concatenate([labels, np.repeat(labels[-1:], chunk_size - 1, axis=0)])
    windows = np.lib.stride_tricks.sliding_window_view(padded, chunk_size, axis=0)  # (N, A, T)
    return np.ascontiguousarray(windows.transpose(0, 2, 1))


def evaluate_closed_loop(
    robot_type: str,
    act_fn: Callable[[np.ndarray], np.ndarray],
    episodes: int,
    seed: int,
    replan_every: int,
    *,
    fps: float = DEFAULT_FPS,
    episode_s: float | None = None,
) -> dict[str, Any]:
    """Run `act_fn(state) -> chunk (T, A)` closed loop; report task success and seam smoothness.

    Every `replan_every` ticks the policy is called on the current state and its chunk replaces
    the old one from its first row. Ticks past the chunk's end send no command. An `act_fn` with a
    `reset()` method (one that remembers its last chunk, e.g. for RTC guidance) is reset before
    every episode.
    """
    if replan_every < 1:
        raise ValueError(f"replan_every must be >= 1, got {replan_every}")
    env = make_robot(robot_type, seed=seed, fps=fps, episode_s=episode_s)
    num_actions = env.action_space.shape[0]
    per_episode, executed, seams, episode_starts = [], [], [], []
    held_ticks = 0
    for e in range(episodes):
        state, _ = env.reset(seed=seed + e)
        if hasattr(act_fn, "reset"):
            act_fn.reset()
        episode_starts.append(len(executed))
        errors = []
        tick = 0
        while True:
            if tick % replan_every == 0:
                chunk = np.asarray(act_fn(state), dtype=np.float32).reshape(-1, num_actions)
                seams.append(len(executed))
                cursor = 0
            action = chunk[cursor] if cursor < len(chunk) else None
            held_ticks += action is None
            cursor += 1
            state, _, terminated, truncated, info = env.step(action)
            executed.append(info["command"])
            errors.append(info["tracking_error"])
            tick += 1
            if terminated or truncated:
                break
        per_episode.append(
            {
                "seed": seed + e,
                "is_success": info["is_success"],
                "success_score": info["success_score"],
                "mean_tracking_error": float(np.mean(errors)),
                "ticks": tick,
                **{k: info[k] for k in ("collided", "waypoints_reached") if k in info},
            }
        )
    scale = env.action_space.high - env.action_space.low
    return {
        "robot_type": robot_type,
        "episodes": episodes,
        "replan_every": replan_every,
        "success_rate": float(np.mean([p["is_success"] for p in per_episode])),
        "mean_success_score": float(np.mean([p["success_score"] for p in per_episode])),
        "mean_tracking_error": float(np.mean([p["mean_tracking_error"] for p in per_episode])),
        "held_ticks": int(held_ticks),
        "seam": seam_metrics(np.asarray(executed), seams, episode_starts=episode_starts, scale=scale),
        "per_episode": per_episode,
    }
