"""`bench train --robot reacher --policy lerobot_act`: a LeRobot ACT trained by LeRobot's own code on the expert.

    bench.training.demos' DART expert episodes (clean expert label per visited state)
      -> write_dataset: LeRobotDataset.create / add_frame / save_episode / finalize   <out>/dataset/ (git-ignored)
      -> train_act: ACTConfig + ACTPolicy + make_pre_post_processors(cfg, dataset_stats=dataset.meta.stats),
         LeRobot's DataLoader batches (delta_timestamps from the config), policy.forward(batch) -> loss,
         the config's AdamW preset, grad clipping, as lerobot.scripts.lerobot_train.update_policy steps
      -> <out>/config.json, model.safetensors, policy_{pre,post}processor.json (+ stats)   save_pretrained
      -> evaluate: closed loop through the server's own loading and session pipeline     evaluation.json

Owns the ACT recipes (`ACT_RECIPES`, keyed by robot type) and the state split: the robot's state vector is
`observation.state` (its first S - E values) followed by `observation.environment_state` (its last E), the
order in which the server's LeRobot path reads the wire state (server/policies/lerobot.py). LeRobot 0.4.4's
ACT needs an image or an environment state besides `observation.state`; for the reacher E = 2, its
fingertip-minus-target vector. ACT's action labels are the dataset's next `chunk_size` actions (the clean
expert labels along the driven path), not bench.training.demos' "plan" labels: that is what a LeRobotDataset
holds. LeRobot's config records no rate: the checkpoint's trained fps is the recipe's, and a manifest serving it
says `trained_fps:`.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

POLICY_NAME = "lerobot_act"  # the `bench train --policy` word
STATE = "observation.state"
ENV_STATE = "observation.environment_state"
ACTION = "action"
DATASET_DIR = "dataset"
TRAINING_FILE = "training.json"
EVALUATION_FILE = "evaluation.json"
TASK = "reach the target"


@dataclass(frozen=True)
class ActRecipe:
    env_state_dim: int = 2  # the state's last values that are observation.environment_state
    fps: float = 30.0
    # demonstrations (bench.training.demos' DART episodes)
    episodes: int = 300
    episode_s: float | None = 1.0
    noise: float = 1.0
    # LeRobot's ACTConfig fields
    chunk_size: int = 30
    dim_model: int = 128
    n_heads: int = 4
    dim_feedforward: int = 256
    n_encoder_layers: int = 1  # the encoder sees 3 tokens (latent, state, environment state)
    n_decoder_layers: int = 1
    use_vae: bool = False  # the expert is deterministic: there is no multi-modality for the VAE to model
    lr: float = 3e-4
    # optimisation
    steps: int = 3000
    batch_size: int = 32
    threads: int = 2
    # closed-loop evaluation: the first replan_every is the headline figure
    eval_episodes: int = 100
    replan_every: tuple[int, ...] = (15, 10)


ACT_RECIPES: dict[str, ActRecipe] = {
    "reacher": ActRecipe(),
}


class ActTrainError(RuntimeError):
    """ACT training cannot run; the message says what to do."""


def recipe_for(robot_type: str, *, episodes: int | None = None, steps: int | None = None) -> ActRecipe:
    if robot_type not in ACT_RECIPES:
        raise ActTrainError(
            f"no {POLICY_NAME} recipe for robot type {robot_type!r}; recipes: {', '.join(sorted(ACT_RECIPES))}"
        )
    recipe = ACT_RECIPES[robot_type]
    for flag, value in (("--episodes", episodes), ("--steps", steps)):
        if value is not None and value < 1:
            raise ActTrainError(f"{flag} {value}: must be at least 1 (leave it out for the recipe's)")
    return replace(
        recipe,
        episodes=recipe.episodes if episodes is None else episodes,
        steps=recipe.steps if steps is None else steps,
    )


def _features(robot_type: str, recipe: ActRecipe) -> dict[str, dict[str, Any]]:
    from bench.robots import robot_type as robot_cls

    cls = robot_cls(robot_type)
    state_names, action_names = list(cls.state_names), list(cls.action_names)
    split = len(state_names) - recipe.env_state_dim
    if split < 1 or recipe.env_state_dim < 1:
        raise ActTrainError(f"env_state_dim {recipe.env_state_dim} does not split a {len(state_names)}-value state")
    return {
        STATE: {"dtype": "float32", "shape": (split,), "names": state_names[:split]},
        ENV_STATE: {"dtype": "float32", "shape": (recipe.env_state_dim,), "names": state_names[split:]},
        ACTION: {"dtype": "float32", "shape": (len(action_names),), "names": action_names},
    }


def write_dataset(robot_type: str, root: Path, recipe: ActRecipe, seed: int = 0):
    """The expert's DART episodes as a LeRobotDataset at `root` (written by LeRobot; replaced if present)."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from bench.training.demos import _dart_episodes

    features = _features(robot_type, recipe)
    split = features[STATE]["shape"][0]
    if root.exists():
        shutil.rmtree(root)
    dataset = LeRobotDataset.create(
        repo_id=f"bench/{robot_type}_expert",
        fps=int(recipe.fps),
        features=features,
        root=root,
        robot_type=robot_type,
        use_videos=False,
    )
    episodes = _dart_episodes(
        robot_type, recipe.episodes, seed, noise=recipe.noise, fps=recipe.fps, episode_s=recipe.episode_s
    )
    for states, actions in episodes:
        for state, action in zip(states, actions):
            dataset.add_frame({STATE: state[:split], ENV_STATE: state[split:], ACTION: action, "task": TASK})
        dataset.save_episode()
    dataset.finalize()
    return dataset


def act_config(features, recipe: ActRecipe):
    """LeRobot's ACTConfig for the dataset's policy features (no image, so no backbone)."""
    from lerobot.configs.types import FeatureType
    from lerobot.policies.act.configuration_act import ACTConfig

    outputs = {k: f for k, f in features.items() if f.type is FeatureType.ACTION}
    inputs = {k: f for k, f in features.items() if k not in outputs}
    return ACTConfig(
        input_features=inputs,
        output_features=outputs,
        chunk_size=recipe.chunk_size,
        n_action_steps=recipe.chunk_size,
        dim_model=recipe.dim_model,
        n_heads=recipe.n_heads,
        dim_feedforward=recipe.dim_feedforward,
        n_encoder_layers=recipe.n_encoder_layers,
        n_decoder_layers=recipe.n_decoder_layers,
        use_vae=recipe.use_vae,
        optimizer_lr=recipe.lr,
        pretrained_backbone_weights=None,
        device="cpu",
    )


def train_act(dataset_root: Path, out: Path, recipe: ActRecipe, seed: int = 0) -> dict[str, Any]:
    """Train LeRobot's ACT on the dataset at `dataset_root` with LeRobot's training step; save it to `out`.

    Returns the training log (steps, seconds, loss at the start and at the end)."""
    import torch
    from lerobot.datasets.factory import resolve_delta_timestamps
    from lerobot.datasets.lerobot_dataset import LeRobotDataset, LeRobotDatasetMetadata
    from lerobot.datasets.utils import dataset_to_policy_features
    from lerobot.policies.act.modeling_act import ACTPolicy
    from lerobot.policies.factory import make_pre_post_processors

    meta = LeRobotDatasetMetadata(f"bench/{dataset_root.name}", root=dataset_root)
    cfg = act_config(dataset_to_policy_features(meta.features), recipe)
    dataset = LeRobotDataset(meta.repo_id, root=dataset_root, delta_timestamps=resolve_delta_timestamps(cfg, meta))
    torch.manual_seed(seed)
    policy = ACTPolicy(cfg)
    preprocessor, postprocessor = make_pre_post_processors(cfg, dataset_stats=dataset.meta.stats)
    optimizer_config = cfg.get_optimizer_preset()
    optimizer = optimizer_config.build(policy.get_optim_params())
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=recipe.batch_size,
        shuffle=True,
        drop_last=True,
        generator=torch.Generator().manual_seed(seed),
    )
    losses: list[float] = []
    started = time.perf_counter()
    step = 0
    policy.train()
    while step < recipe.steps:
        for batch in loader:
            # lerobot.scripts.lerobot_train: preprocessor, forward -> loss, backward, clip, step, zero_grad
            loss, _ = policy.forward(preprocessor(batch))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), optimizer_config.grad_clip_norm)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
            step += 1
            if step % 500 == 0:
                print(f"lerobot_act: step {step}/{recipe.steps}, loss {loss.item():.4f}", file=sys.stderr, flush=True)
            if step >= recipe.steps:
                break
    seconds = time.perf_counter() - started
    policy.eval()
    out.mkdir(parents=True, exist_ok=True)
    policy.save_pretrained(out)
    preprocessor.save_pretrained(out)
    postprocessor.save_pretrained(out)
    window = max(1, min(100, len(losses) // 10))
    return {
        "steps": step,
        "train_seconds": round(seconds, 3),
        "frames": len(dataset),
        "episodes": meta.total_episodes,
        "parameters": sum(p.numel() for p in policy.parameters()),
        "first_loss": round(sum(losses[:window]) / window, 5),
        "final_loss": round(sum(losses[-window:]) / window, 5),
        "loss_every_100": [round(x, 5) for x in losses[::100]],
    }


class LeRobotCheckpointPolicy:
    """A LeRobot checkpoint as an `act(state) -> chunk` callable, through the server's own path: `load_checkpoint`
    (LeRobot's from_pretrained and processors) and a session's `LeRobotPipeline` (state split, normalise,
    one forward pass, unnormalise)."""

    def __init__(self, path: Path, fps: float, action_names: list[str]):
        from server.policies.checkpoint import load_checkpoint
        from server.processors import make_session_pipeline

        self.loaded = load_checkpoint(path, trained_fps=fps, action_names=action_names)
        self.pipeline = make_session_pipeline(self.loaded)

    def __call__(self, state):
        import torch

        from server.policies.base import STATE_KEY

        with torch.no_grad():
            batch = self.pipeline.preprocess({STATE_KEY: state})
            chunk = self.loaded.policy.predict_action_chunk(batch, [0], [None])
            return self.pipeline.postprocess(chunk).numpy()


def evaluate(path: Path, robot_type: str, recipe: ActRecipe, seed: int) -> dict[str, Any]:
    """Closed-loop success of the checkpoint and of the expert's plan, per replan period (bench.training.demos)."""
    from bench.robots import robot_type as robot_cls
    from bench.training.demos import evaluate_closed_loop
    from bench.training.experts import plan_chunks

    names = list(robot_cls(robot_type).action_names)
    chunk_size, fps = recipe.chunk_size, recipe.fps

    def expert(state):
        return plan_chunks(robot_type, state[None], chunk_size, fps=fps)[0]

    keys = ("success_rate", "mean_success_score", "mean_tracking_error", "held_ticks")
    result: dict[str, Any] = {"robot_type": robot_type, "episodes": recipe.eval_episodes, "seed": seed}
    for period in recipe.replan_every:
        policy = evaluate_closed_loop(
            robot_type, LeRobotCheckpointPolicy(path, fps, names), recipe.eval_episodes, seed, period, fps=fps
        )
        reference = evaluate_closed_loop(robot_type, expert, recipe.eval_episodes, seed, period, fps=fps)
        result[f"replan_every_{period}"] = {
            "policy": {k: policy[k] for k in keys},
            "expert": {k: reference[k] for k in keys},
        }
    headline = result[f"replan_every_{recipe.replan_every[0]}"]
    result["success_rate"] = headline["policy"]["success_rate"]
    result["expert_success_rate"] = headline["expert"]["success_rate"]
    return result


def train_lerobot_act(
    robot_type: str,
    out_dir: str | Path | None = None,
    seed: int = 0,
    *,
    episodes: int | None = None,
    steps: int | None = None,
    evaluate_after: bool = True,
    recipe: ActRecipe | None = None,
) -> Path:
    """Demos -> LeRobotDataset -> LeRobot ACT training -> checkpoint in `out_dir` (default
    bench/checkpoints/<type>_lerobot_act); training.json and, with `evaluate_after`, evaluation.json beside it."""
    try:
        import lerobot  # noqa: F401
        import torch
    except ImportError as exc:
        raise ActTrainError(
            f"--policy {POLICY_NAME} needs LeRobot ({exc}); install it with pip install -e '.[server,lerobot]' "
            f"(docs/lerobot.md)"
        ) from None
    from bench.scenario.load import CHECKPOINTS_DIR

    recipe = recipe or recipe_for(robot_type, episodes=episodes, steps=steps)
    out = Path(out_dir) if out_dir else CHECKPOINTS_DIR / f"{robot_type}_{POLICY_NAME}"
    threads = torch.get_num_threads()
    torch.set_num_threads(recipe.threads)
    try:
        started = time.perf_counter()
        dataset_root = out / DATASET_DIR
        write_dataset(robot_type, dataset_root, recipe, seed)
        collect_seconds = time.perf_counter() - started
        log = train_act(dataset_root, out, recipe, seed)
        log.update(
            robot_type=robot_type,
            policy=POLICY_NAME,
            seed=seed,
            recipe=asdict(recipe),
            collect_seconds=round(collect_seconds, 3),
            total_seconds=round(time.perf_counter() - started, 3),
        )
        (out / TRAINING_FILE).write_text(json.dumps(log, indent=2) + "\n")
        (out / EVALUATION_FILE).unlink(missing_ok=True)  # never a stale figure beside new weights
        if evaluate_after and recipe.eval_episodes:
            result = evaluate(out, robot_type, recipe, seed + 10_000)
            (out / EVALUATION_FILE).write_text(json.dumps(result, indent=2) + "\n")
    finally:
        torch.set_num_threads(threads)
    return out
