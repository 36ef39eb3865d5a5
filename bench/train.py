"""`bench train --robot TYPE`: build the behaviour-cloned checkpoint a robot type's fleet is served.

    bench.demos.collect_demos (scripted expert + DART noise) -> server.policies.train.train_bc
      -> bench/checkpoints/<type>/{config.json, model.safetensors, stats.json, training.json}
      -> bench.demos.evaluate_closed_loop -> evaluation.json (success rate, seam smoothness)

Owns the per-type training recipe (`RECIPES`, keyed by robot type). Invariant: the same type,
seed and recipe give the same checkpoint (train_bc is deterministic for fixed inputs and thread
count). Policies are state-only (no image features): cameras load the network and the server's
decode path, but the policy does not look at them, which keeps training minutes, not hours.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from bench.scenario import CHECKPOINTS_DIR


class TrainError(RuntimeError):
    """Training cannot run (unknown type, missing package); the message says what to do."""


@dataclass(frozen=True)
class Recipe:
    policy_type: str = "flow_matching"  # supports RTC; "mlp_chunk" does not
    chunk_size: int = 30
    execution_horizon: int = 10
    episodes: int = 60
    epochs: int = 40
    batch_size: int = 256
    lr: float = 1e-3
    eval_episodes: int = 10
    replan_every: int = 15


RECIPES: dict[str, Recipe] = {
    "reacher": Recipe(episodes=80, epochs=40),
    "arm": Recipe(episodes=40, epochs=40),
    "base": Recipe(episodes=30, epochs=40),
}


def train_robot_policy(robot_type: str, out_dir: str | Path | None = None, seed: int = 0, *,
                       policy_type: str | None = None, episodes: int | None = None, steps: int | None = None,
                       evaluate: bool = True) -> Path:
    """Collect demos for `robot_type`, train a chunk policy, save it to `out_dir`; return the path.

    `steps` (optional) overrides the epochs so that about that many optimiser steps run.
    """
    try:
        from bench.demos import collect_demos, evaluate_closed_loop
        from bench.robots import robot_type as robot_cls
        from server.policies.base import PolicyConfig
        from server.policies.train import train_bc
    except ImportError as exc:
        raise TrainError(f"training needs the server and sim extras (pip install -e '.[server,sim]'): {exc}") from None
    if robot_type not in RECIPES:
        raise TrainError(f"no training recipe for robot type {robot_type!r}; recipes: {', '.join(sorted(RECIPES))}")
    recipe = RECIPES[robot_type]
    ptype = policy_type or recipe.policy_type
    out = Path(out_dir) if out_dir else CHECKPOINTS_DIR / robot_type
    cls = robot_cls(robot_type)

    n_episodes = episodes or recipe.episodes
    states, chunks = collect_demos(robot_type, n_episodes, seed, recipe.chunk_size)
    epochs = recipe.epochs
    if steps:
        per_epoch = max(1, -(-len(states) // recipe.batch_size))
        epochs = max(1, steps // per_epoch)
    config = PolicyConfig(
        type=ptype, state_dim=len(cls.state_names), action_dim=len(cls.action_names), chunk_size=recipe.chunk_size,
        fps=30.0, action_names=list(cls.action_names), state_names=list(cls.state_names),
        execution_horizon=recipe.execution_horizon,
    )
    path = train_bc(ptype, states, chunks, config, out, epochs=epochs, seed=seed, batch_size=recipe.batch_size,
                    lr=recipe.lr)
    if evaluate and recipe.eval_episodes:
        result = evaluate_checkpoint(path, robot_type, recipe.eval_episodes, seed + 10_000, recipe.replan_every,
                                     evaluate_closed_loop)
        (Path(path) / "evaluation.json").write_text(json.dumps(result, indent=2, default=float) + "\n")
    return Path(path)


def evaluate_checkpoint(path: Path, robot_type: str, episodes: int, seed: int, replan_every: int, evaluate_closed_loop) -> dict:
    """Closed-loop success of the saved checkpoint, called the way the server calls it."""
    import numpy as np
    import torch

    from server.policies.checkpoint import load_checkpoint

    loaded = load_checkpoint(path)
    policy, stats = loaded.policy, loaded.stats
    def arr(v):
        return np.asarray(v.detach().cpu().numpy() if hasattr(v, "detach") else v, np.float32)

    s_mean, s_std = arr(stats["observation.state"]["mean"]), arr(stats["observation.state"]["std"])
    a_mean, a_std = arr(stats["action"]["mean"]), arr(stats["action"]["std"])

    def act(state: np.ndarray) -> np.ndarray:
        x = torch.from_numpy(((np.asarray(state, np.float32) - s_mean) / s_std)[None])
        with torch.no_grad():
            chunk = policy.predict_action_chunk({"observation.state": x}, [0], [None])[0].numpy()
        return chunk * a_std + a_mean

    result = evaluate_closed_loop(robot_type, act, episodes, seed, replan_every)
    return {k: v for k, v in result.items() if not isinstance(v, (list, np.ndarray))} | {"per_episode": result.get("per_episode")}
