"""`bench train --robot TYPE`: build the behaviour-cloned checkpoint a robot type's fleet is served.

    bench.training.demos.collect_demos (scripted expert + DART noise; chunks = the expert's plan per state)
      -> server.policies.train.train_bc
      -> bench/checkpoints/<type>/{config.json, model.safetensors, stats.json, training.json}
      -> bench.training.demos.evaluate_closed_loop, the policy and the expert side by side
      -> evaluation.json (success rate vs the expert's, seam smoothness, with and without RTC)

Owns the per-type training recipe (`RECIPES`, keyed by robot type). Invariant: the same type,
seed and recipe give the same checkpoint hash on a machine (demos are seeded numpy, train_bc is
deterministic for fixed inputs and thread count, and training runs on `Recipe.threads` threads).
Policies are state-only (no image features): cameras load the network and the server's decode path,
but the policy does not look at them, which keeps training minutes, not hours.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.scenario.load import CHECKPOINTS_DIR

EVALUATION_FILE = "evaluation.json"


class TrainError(RuntimeError):
    """Training cannot run (unknown type, missing package); the message says what to do."""


@dataclass(frozen=True)
class Recipe:
    policy_type: str = "flow_matching"  # supports RTC; "mlp_chunk" does not
    chunk_size: int = 30
    execution_horizon: int = 10
    fps: float = 30.0  # the control rate of the demos = the checkpoint's trained fps
    hyper_params: dict[str, Any] = field(default_factory=dict)  # the policy type's, over its defaults
    # demonstrations (bench.training.demos.collect_demos)
    episodes: int = 60
    episode_s: float | None = None  # None: the type's own episode length
    stride: int = 1
    noise: float = 1.0
    labels: str = "plan"
    # rtc_mode "training_time": demos from collect_prefix_demos (d ~ U{0..max_prefix_rows} committed rows per
    # state), the policy built and trained for training-time RTC (hyper_params rtc_mode of flow_matching or
    # flow_transformer)
    rtc_mode: str = "guidance"
    max_prefix_rows: int = 15
    # training_time, then one DAgger round: the trained policy runs asynchronously (`on_policy_episodes` per d
    # in 1..max_prefix_rows, collect_on_policy_prefix_demos), its requests are labelled by the expert, and the
    # policy is trained again from scratch on the demos plus `on_policy_repeat` copies of those
    on_policy_episodes: int = 0
    on_policy_repeat: int = 2
    # optimisation (server.policies.train.train_bc)
    epochs: int = 40
    batch_size: int = 256
    lr: float = 1e-3
    threads: int = 1  # part of the recipe: a checkpoint's bytes depend on the thread count
    # closed-loop evaluation: the first replan_every is the headline figure
    eval_episodes: int = 20
    replan_every: tuple[int, ...] = (15, 10)


RECIPES: dict[str, Recipe] = {
    # The reach is over in ~0.5 s of a 2 s episode: one-second demos keep half the states on it.
    # 100 evaluation episodes: at 20, one run's success moves by ~0.1 (binomial), too coarse to compare policies
    "reacher": Recipe(episodes=300, episode_s=1.0, epochs=120, eval_episodes=100),
    # 40 demos x 60 epochs already track (1.00 closed loop) but with rough chunks (within-chunk jerk 0.015 of the
    # range, seams no smoother than that): 120 x 200 give jerk 0.002, tracking error 5.7 mm against the expert's 4.8
    "arm": Recipe(episodes=120, stride=2, epochs=200, eval_episodes=50),
    "base": Recipe(episodes=30, epochs=40),
}

# (robot type, policy type) -> the recipe `--policy-type` picks instead of the robot type's
POLICY_RECIPES: dict[tuple[str, str], Recipe] = {
    # the tiny transformer (flow_transformer's "tiny" preset): ~0.2 s a step of 256 on one thread. 80 epochs
    # left its late chunk rows poor (closed-loop success 0.65 replanning every 15 ticks, 0.97 every 10);
    # 160 reach 1.00 at both (100 episodes; the MLP: 0.95 at both)
    ("reacher", "flow_transformer"): Recipe(
        policy_type="flow_transformer", episodes=300, episode_s=1.0, epochs=160, eval_episodes=100
    ),
}


# (robot type, policy type, rtc_mode) -> the recipe `--rtc-mode` picks: training-time RTC (arXiv 2512.05964); the
# policy type is `--policy-type`, else flow_matching
RTC_MODE_RECIPES: dict[tuple[str, str, str], Recipe] = {
    # 2 s demos: asynchronous requests come every s = 15 ticks over the whole 2 s episode, and a state has a
    # committed prefix only from its second request on; twice the states of the plain recipe, as many epochs
    # One DAgger round (on_policy_episodes): trained on the DART demos alone, the policy met states and prefixes
    # of its own that the demos lack (simulated-delay twin, 40 episodes: success 0.95 at d = 0, 0.70 at d = 4,
    # 0.57 at d = 8); with its own requests labelled and trained again, 1.00 / 0.97 / 0.93 (docs/scenarios.md)
    ("reacher", "flow_matching", "training_time"): Recipe(
        episodes=300,
        episode_s=2.0,
        epochs=120,
        eval_episodes=100,
        rtc_mode="training_time",
        max_prefix_rows=16,
        on_policy_episodes=80,
    ),
    # The arm's plain recipe (10 s episodes, every second state) with prefix labels; a request every s = 15
    # ticks gives ~20 per episode, so 10 on-policy episodes per d (~3,200 requests, as the reacher's 4,960 are
    # to its demos: about a third with the two copies)
    ("arm", "flow_matching", "training_time"): Recipe(
        episodes=120,
        stride=2,
        epochs=200,
        eval_episodes=50,
        rtc_mode="training_time",
        max_prefix_rows=16,
        on_policy_episodes=10,
    ),
    # the tiny transformer, per-token flow time (flow_transformer's module docstring): the MLP's demos and DAgger
    # round; 80 epochs of the 2 s demos are as many optimiser steps as reacher_transformer's 160 of the 1 s ones
    # (~0.18 s a step of 256 on one thread)
    ("reacher", "flow_transformer", "training_time"): Recipe(
        policy_type="flow_transformer",
        episodes=300,
        episode_s=2.0,
        epochs=80,
        eval_episodes=100,
        rtc_mode="training_time",
        max_prefix_rows=16,
        on_policy_episodes=80,
    ),
}


# Gym robot types with their own expert and demos (the env is a package's, not our MJCF): name -> module
# whose `train(out, seed, episodes=..., epochs=..., eval_episodes=...)` writes the checkpoint
GYM_TRAINERS: dict[str, str] = {"so101": "bench.training.so101"}


def _train_gym_robot(robot_type, out_dir, seed, *, policy_type, episodes, steps, fps, rtc_mode, evaluate) -> Path:
    import importlib

    for flag, value in (("--policy-type", policy_type), ("--fps", fps), ("--rtc-mode", rtc_mode)):
        if value is not None:
            raise TrainError(
                f"{flag}: the {robot_type} recipe is fixed (flow_matching at the env's 10 Hz); leave it out"
            )
    out = Path(out_dir) if out_dir else CHECKPOINTS_DIR / robot_type
    check_arguments(out, seed=seed, episodes=episodes, steps=steps)
    try:
        module = importlib.import_module(GYM_TRAINERS[robot_type])
        trainer = module.train
    except ImportError as exc:
        raise TrainError(f"training {robot_type} needs its env package: {exc}") from None
    kwargs = {"eval_episodes": module.EVAL_EPISODES if evaluate else 0}
    if episodes is not None:
        kwargs["episodes"] = episodes
    if steps is not None:
        kwargs["steps"] = steps
    return trainer(out, seed, **kwargs)


def check_arguments(
    out: Path,
    *,
    seed: int = 0,
    policy_type: str | None = None,
    episodes: int | None = None,
    steps: int | None = None,
    fps: float | None = None,
) -> None:
    """Refuse (TrainError) what would fail only after minutes of demo collection; None keeps the recipe's value."""
    from server.policies.base import PolicyLoadError, policy_class

    if policy_type is not None:
        try:
            policy_class(policy_type)
        except PolicyLoadError as exc:
            raise TrainError(f"--policy-type: {exc}") from None
    for flag, value in (("--episodes", episodes), ("--steps", steps)):
        if value is not None and value < 1:
            raise TrainError(f"{flag} {value}: must be at least 1 (leave it out for the recipe's)")
    if seed < 0:
        raise TrainError(f"--seed {seed}: must be >= 0 (numpy seeds the demos with it)")
    if fps is not None and not (math.isfinite(fps) and fps > 0):
        raise TrainError(f"--fps {fps:g}: must be a finite number of Hz > 0 (leave it out for the recipe's)")
    if out.exists() and not out.is_dir():
        raise TrainError(f"--out {str(out)!r} is not a directory; give a directory (it is created if missing)")
    try:  # made now, as the checkpoint would be: access() says yes to root even on /sys
        out.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=out).close()
    except OSError as exc:
        raise TrainError(
            f"--out {str(out)!r}: cannot write there ({exc.strerror or exc}); give a writable directory"
        ) from None


def train_robot_policy(
    robot_type: str,
    out_dir: str | Path | None = None,
    seed: int = 0,
    *,
    policy_type: str | None = None,
    episodes: int | None = None,
    steps: int | None = None,
    fps: float | None = None,
    evaluate: bool = True,
    recipe: Recipe | None = None,
    rtc_mode: str | None = None,
) -> Path:
    """Collect demos for `robot_type`, train a chunk policy, save it to `out_dir`; return the path.

    `recipe` replaces RECIPES[robot_type] (or POLICY_RECIPES[(robot_type, policy_type)], or
    RTC_MODE_RECIPES[(robot_type, policy_type, rtc_mode)]); `policy_type`, `episodes` and `fps` (the demos' control rate,
    recorded as the trained fps) override single fields, and `steps` (optional) sets the epochs so that
    about that many optimiser steps run.
    """
    from bench.training import lerobot_act

    if policy_type == lerobot_act.POLICY_NAME:  # LeRobot's ACT, trained by LeRobot's own code
        if rtc_mode not in (None, "guidance") or fps is not None or recipe is not None:
            raise TrainError(
                f"--policy-type {lerobot_act.POLICY_NAME} takes --episodes, --steps, --seed and --out only "
                f"(LeRobot's ACT has no RTC; its rate is the recipe's {lerobot_act.ActRecipe.fps:g} Hz)"
            )
        try:
            return lerobot_act.train_lerobot_act(
                robot_type, out_dir, seed, episodes=episodes, steps=steps, evaluate_after=evaluate
            )
        except lerobot_act.ActTrainError as exc:
            raise TrainError(str(exc)) from None
    try:
        import numpy as np
        import torch

        from bench.robots import robot_type as robot_cls
        from bench.training.demos import collect_demos, collect_on_policy_prefix_demos, collect_prefix_demos
        from server.policies.base import PolicyConfig, policy_class
        from server.policies.train import TRAINING_LOG_FILE, train_bc
    except ImportError as exc:
        raise TrainError(f"training needs the server and sim extras (pip install -e '.[server,sim]'): {exc}") from None
    if robot_type in GYM_TRAINERS:
        return _train_gym_robot(
            robot_type,
            out_dir,
            seed,
            policy_type=policy_type,
            episodes=episodes,
            steps=steps,
            fps=fps,
            rtc_mode=rtc_mode,
            evaluate=evaluate,
        )
    if recipe is None and robot_type not in RECIPES:
        raise TrainError(
            f"no training recipe for robot type {robot_type!r}; recipes: {', '.join(sorted([*RECIPES, *GYM_TRAINERS]))}"
        )
    rtc_key = (robot_type, policy_type or Recipe.policy_type, rtc_mode or "")
    if recipe is None and rtc_mode not in (None, "guidance") and rtc_key not in RTC_MODE_RECIPES:
        raise TrainError(
            f"no recipe for robot type {robot_type!r}, policy type {rtc_key[1]!r} with rtc_mode "
            f"{rtc_mode!r}; recipes: "
            f"{', '.join(f'--robot {r} --policy-type {p} --rtc-mode {m}' for r, p, m in sorted(RTC_MODE_RECIPES))}"
        )
    out = Path(out_dir) if out_dir else CHECKPOINTS_DIR / robot_type
    check_arguments(out, seed=seed, policy_type=policy_type, episodes=episodes, steps=steps, fps=fps)
    recipe = recipe or RTC_MODE_RECIPES.get(rtc_key)
    recipe = recipe or POLICY_RECIPES.get((robot_type, policy_type or ""), RECIPES[robot_type])
    recipe = replace(
        recipe,
        policy_type=policy_type or recipe.policy_type,
        episodes=recipe.episodes if episodes is None else episodes,
        fps=recipe.fps if fps is None else fps,
    )
    cls = robot_cls(robot_type)

    threads = torch.get_num_threads()
    torch.set_num_threads(recipe.threads)
    try:
        started = time.perf_counter()
        prefix_rows, hyper_params = None, dict(recipe.hyper_params)
        if recipe.rtc_mode == "training_time":
            if "rtc_mode" not in policy_class(recipe.policy_type).hyper_param_defaults:
                raise TrainError(
                    f"policy type {recipe.policy_type!r} has no rtc_mode training_time; "
                    f"flow_matching and flow_transformer have"
                )
            states, chunks, prefix_rows = collect_prefix_demos(
                robot_type,
                recipe.episodes,
                seed,
                recipe.chunk_size,
                recipe.max_prefix_rows,
                noise=recipe.noise,
                episode_s=recipe.episode_s,
                stride=recipe.stride,
                fps=recipe.fps,
            )
            hyper_params.update(rtc_mode="training_time", max_prefix_rows=recipe.max_prefix_rows)
        else:
            states, chunks = collect_demos(
                robot_type,
                recipe.episodes,
                seed,
                recipe.chunk_size,
                noise=recipe.noise,
                episode_s=recipe.episode_s,
                labels=recipe.labels,
                stride=recipe.stride,
                fps=recipe.fps,
            )
        collect_seconds = time.perf_counter() - started
        epochs = recipe.epochs
        if steps:
            per_epoch = max(1, -(-len(states) // recipe.batch_size))
            epochs = max(1, steps // per_epoch)
        config = PolicyConfig(
            type=recipe.policy_type,
            state_dim=len(cls.state_names),
            action_dim=len(cls.action_names),
            chunk_size=recipe.chunk_size,
            fps=recipe.fps,
            action_names=list(cls.action_names),
            state_names=list(cls.state_names),
            execution_horizon=recipe.execution_horizon,
            hyper_params=hyper_params,
        )
        path = Path(
            train_bc(
                recipe.policy_type,
                states,
                chunks,
                config,
                out,
                epochs=epochs,
                seed=seed,
                batch_size=recipe.batch_size,
                lr=recipe.lr,
                prefix_rows=prefix_rows,
            )
        )
        on_policy = {}
        if recipe.rtc_mode == "training_time" and recipe.on_policy_episodes:
            first = json.loads((path / TRAINING_LOG_FILE).read_text())
            # seeds 50000 + 1000 d + e: apart from the demos' (seed + e) and the evaluations' (10000 + e)
            more = collect_on_policy_prefix_demos(
                robot_type, path, recipe.on_policy_episodes, seed + 50_000, recipe.max_prefix_rows
            )
            states, chunks, prefix_rows = (
                np.concatenate([a] + [b] * recipe.on_policy_repeat) for a, b in zip((states, chunks, prefix_rows), more)
            )
            on_policy = {
                "on_policy_samples": len(more[0]),
                "first_round_final_loss": first["final_loss"],
                "first_round_train_seconds": first["train_seconds"],
            }
            path = Path(
                train_bc(
                    recipe.policy_type,
                    states,
                    chunks,
                    config,
                    out,
                    epochs=epochs,
                    seed=seed,
                    batch_size=recipe.batch_size,
                    lr=recipe.lr,
                    prefix_rows=prefix_rows,
                )
            )
        log_file = path / TRAINING_LOG_FILE
        log = json.loads(log_file.read_text()) | on_policy
        log.update(
            robot_type=robot_type,
            recipe=asdict(recipe),
            collect_seconds=round(collect_seconds, 3),
            total_seconds=round(time.perf_counter() - started, 3),
        )
        log_file.write_text(json.dumps(log, indent=2) + "\n")
        (path / EVALUATION_FILE).unlink(missing_ok=True)  # never leave a stale figure beside new weights
        if evaluate and recipe.eval_episodes:
            result = evaluate_checkpoint(path, robot_type, recipe.eval_episodes, seed + 10_000, recipe.replan_every)
            (path / EVALUATION_FILE).write_text(json.dumps(result, indent=2, default=float) + "\n")
    finally:
        torch.set_num_threads(threads)
    return path


class CheckpointPolicy:
    """A saved checkpoint as an `act(state) -> chunk` callable, normalised the way the server does it.

    With `rtc`, every call after an episode's first is guided (flow_matching's RTC) by the rows of
    the previous chunk that were planned but not executed: `replan_every` onwards, at most
    execution_horizon of them, inference delay 0 (evaluate_closed_loop starts a chunk the tick it
    asks for it).
    """

    def __init__(self, path: str | Path, replan_every: int = 0, rtc: bool = False):
        import torch

        from server.policies.checkpoint import load_checkpoint
        from server.policies.stats import ACTION_KEY, STATE_KEY

        self.torch = torch
        loaded = load_checkpoint(path)
        self.policy, self.config = loaded.policy, loaded.config
        self.state_stats, self.action_stats = loaded.stats[STATE_KEY], loaded.stats[ACTION_KEY]
        self.replan_every, self.rtc = replan_every, rtc and self.policy.supports_rtc
        self.previous = None

    def reset(self) -> None:
        self.previous = None

    def __call__(self, state):
        torch = self.torch
        x = (torch.as_tensor(state, dtype=torch.float32)[None] - self.state_stats["mean"]) / self.state_stats["std"]
        prefix = None
        if self.rtc and self.previous is not None:
            prefix = self.previous[self.replan_every : self.replan_every + self.config.execution_horizon]
        with torch.no_grad():
            chunk = self.policy.predict_action_chunk({"observation.state": x}, [0], [prefix])[0]
        self.previous = chunk
        return (chunk * self.action_stats["std"] + self.action_stats["mean"]).numpy()


def evaluate_checkpoint(
    path: Path,
    robot_type: str,
    episodes: int,
    seed: int,
    replan_every: int | tuple[int, ...],
    evaluate_closed_loop=None,
) -> dict:
    """Closed-loop success of the saved checkpoint and of the expert, under the same chunked execution.

    Headline fields are the policy's at the first `replan_every`; `expert` is the expert's own plan
    (bench.training.experts.plan_chunks) run the same way, `success_vs_expert` their ratio, and
    `by_replan_every` every rate for policy, policy with RTC guidance, and expert.
    """
    from bench.training.demos import evaluate_closed_loop as closed_loop
    from bench.training.experts import plan_chunks

    run = evaluate_closed_loop or closed_loop
    periods = (replan_every,) if isinstance(replan_every, int) else tuple(replan_every)
    config = CheckpointPolicy(path).config
    chunk_size, fps = config.chunk_size, config.fps  # evaluated at the rate it was trained at

    def expert(state):
        return plan_chunks(robot_type, state[None], chunk_size, fps=fps)[0]

    def summary(result: dict) -> dict:
        keys = ("success_rate", "mean_success_score", "mean_tracking_error", "held_ticks", "seam")
        return {k: result[k] for k in keys}

    by_period, headline = {}, None
    for period in periods:
        policy = run(robot_type, CheckpointPolicy(path, period), episodes, seed, period, fps=fps)
        rtc = run(robot_type, CheckpointPolicy(path, period, rtc=True), episodes, seed, period, fps=fps)
        reference = run(robot_type, expert, episodes, seed, period, fps=fps)
        by_period[str(period)] = {"policy": summary(policy), "policy_rtc": summary(rtc), "expert": summary(reference)}
        if headline is None:
            headline = policy | {"expert": summary(reference), "policy_rtc": summary(rtc)}
    expert_rate = headline["expert"]["success_rate"]
    headline["seed"] = seed
    headline["success_vs_expert"] = headline["success_rate"] / expert_rate if expert_rate else None
    headline["by_replan_every"] = by_period
    per_episode = headline.pop("per_episode")
    return headline | {"per_episode": per_episode}
