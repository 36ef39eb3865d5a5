"""A small random-weight LeRobot checkpoint, written by LeRobot itself (tests, benchmarks, capacity scenarios).

    python -m server.policies.lerobot_random OUT_DIR --type act|diffusion --state-dim N --action-dim M --chunk K
        [--dim-model D] [--camera NAME:HxW ...] [--env-state-dim E] [--seed S]

    OUT_DIR/config.json, model.safetensors                        LeRobot's `save_pretrained`
    OUT_DIR/policy_preprocessor.json, policy_postprocessor.json   LeRobot's `make_pre_post_processors(cfg,
    OUT_DIR/policy_*_step_*_normalizer_processor.safetensors        dataset_stats=...)`, saved

Random weights and random (seeded) dataset stats: the files measure loading, serving and forward time,
never task success. LeRobot's ACT and Diffusion read `observation.state` and need a camera or an
`observation.environment_state` besides it: a state-only checkpoint takes `--env-state-dim`, and the
server's wire state is then `observation.state` followed by `observation.environment_state` (see
server/policies/lerobot.py). Imports LeRobot (and torch) when run, never at server start-up.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

STATE = "observation.state"
ENV_STATE = "observation.environment_state"
IMAGE_PREFIX = "observation.images."
ACTION = "action"
TYPES = ("act", "diffusion")


class RandomCheckpointError(ValueError):
    """An argument the generator cannot turn into a LeRobot config; the message names it."""


def parse_camera(text: str) -> tuple[str, int, int]:
    """'front:96x96' -> ('front', 96, 96)."""
    name, _, size = text.partition(":")
    height, _, width = size.lower().partition("x")
    if not name or not height.isdigit() or not width.isdigit() or "." in name or "/" in name:
        raise RandomCheckpointError(f"--camera {text!r}: write NAME:HxW, e.g. front:96x96 (a name without '.' or '/')")
    return name, int(height), int(width)


def _features(state_dim: int, env_state_dim: int, action_dim: int, cameras: list[tuple[str, int, int]]):
    from lerobot.configs.types import FeatureType, PolicyFeature

    if not cameras and env_state_dim < 1:
        raise RandomCheckpointError(
            "LeRobot's ACT and Diffusion need a camera or an environment state besides observation.state: give "
            "--camera NAME:HxW or --env-state-dim E (the wire state is then --state-dim + E values)"
        )
    inputs: dict[str, Any] = {STATE: PolicyFeature(type=FeatureType.STATE, shape=(state_dim,))}
    if env_state_dim:
        inputs[ENV_STATE] = PolicyFeature(type=FeatureType.ENV, shape=(env_state_dim,))
    for name, height, width in cameras:
        inputs[IMAGE_PREFIX + name] = PolicyFeature(type=FeatureType.VISUAL, shape=(3, height, width))
    outputs = {ACTION: PolicyFeature(type=FeatureType.ACTION, shape=(action_dim,))}
    return inputs, outputs


def _config(kind: str, inputs, outputs, chunk: int, dim_model: int | None, cameras):
    if kind == "act":
        from lerobot.policies.act.configuration_act import ACTConfig

        dim = int(dim_model or 256)
        return ACTConfig(
            input_features=inputs,
            output_features=outputs,
            chunk_size=chunk,
            n_action_steps=chunk,
            dim_model=dim,
            n_heads=max(1, dim // 64),
            dim_feedforward=4 * dim,
            n_encoder_layers=1,
            n_decoder_layers=1,
            use_vae=False,  # the VAE only shapes training; inference decodes from a zero latent either way
            pretrained_backbone_weights=None,  # offline: no ImageNet download
            device="cpu",
        )
    if kind == "diffusion":
        from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig

        dim = int(dim_model or 64)
        # n_action_steps <= horizon - n_obs_steps + 1; the U-Net halves the horizon per down block
        horizon = max(8, -(-(chunk + 1) // 4) * 4)
        crop = None
        if cameras:
            crop = (min(h for _, h, _ in cameras), min(w for _, _, w in cameras))
        return DiffusionConfig(
            input_features=inputs,
            output_features=outputs,
            n_obs_steps=2,
            horizon=horizon,
            n_action_steps=chunk,
            down_dims=(dim, 2 * dim),
            diffusion_step_embed_dim=dim,
            n_groups=8,
            crop_shape=crop,
            num_inference_steps=10,
            pretrained_backbone_weights=None,
            use_group_norm=True,
            device="cpu",
        )
    raise RandomCheckpointError(f"--type {kind!r}: this generator writes {', '.join(TYPES)}")


def _stats(inputs, outputs, seed: int) -> dict[str, dict[str, Any]]:
    """Seeded dataset stats with every field the normalisation modes read (mean/std and min/max)."""
    import torch

    generator = torch.Generator().manual_seed(seed + 1)
    stats: dict[str, dict[str, Any]] = {}
    for key, feature in {**inputs, **outputs}.items():
        if key.startswith(IMAGE_PREFIX):
            shape = (3, 1, 1)
            mean = torch.full(shape, 0.45)
            std = torch.full(shape, 0.25)
            low, high = torch.zeros(shape), torch.ones(shape)
        else:
            shape = tuple(feature.shape)
            mean = torch.randn(shape, generator=generator)
            std = 0.5 + torch.rand(shape, generator=generator)
            low, high = mean - 2 * std, mean + 2 * std
        stats[key] = {"mean": mean, "std": std, "min": low, "max": high}
    return stats


def write_random_checkpoint(
    out_dir: str | Path,
    kind: str,
    state_dim: int,
    action_dim: int,
    chunk: int,
    dim_model: int | None = None,
    cameras: list[tuple[str, int, int]] | None = None,
    env_state_dim: int = 0,
    seed: int = 0,
) -> Path:
    """Write a LeRobot checkpoint directory with seeded random weights; returns it."""
    for label, value in (("--state-dim", state_dim), ("--action-dim", action_dim), ("--chunk", chunk)):
        if value < 1:
            raise RandomCheckpointError(f"{label} must be >= 1, got {value}")
    if kind not in TYPES:
        raise RandomCheckpointError(f"--type {kind!r}: this generator writes {', '.join(TYPES)}")
    import torch
    from lerobot.policies.factory import get_policy_class, make_pre_post_processors

    cameras = list(cameras or [])
    inputs, outputs = _features(state_dim, env_state_dim, action_dim, cameras)
    config = _config(kind, inputs, outputs, chunk, dim_model, cameras)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        policy = get_policy_class(kind)(config)
    stats = _stats(inputs, outputs, seed)
    preprocessor, postprocessor = make_pre_post_processors(config, dataset_stats=stats)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    policy.save_pretrained(out)
    preprocessor.save_pretrained(out)
    postprocessor.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m server.policies.lerobot_random", description=__doc__.split("\n")[0]
    )
    parser.add_argument("out_dir")
    parser.add_argument("--type", dest="kind", choices=TYPES, required=True)
    parser.add_argument("--state-dim", type=int, required=True)
    parser.add_argument("--action-dim", type=int, required=True)
    parser.add_argument("--chunk", type=int, required=True, help="actions per predicted chunk")
    parser.add_argument(
        "--dim-model", type=int, default=None, help="ACT's dim_model (256) / Diffusion's first U-Net width (64)"
    )
    parser.add_argument("--camera", action="append", default=[], help="NAME:HxW, repeatable")
    parser.add_argument("--env-state-dim", type=int, default=0, help="an observation.environment_state of this size")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        cameras = [parse_camera(c) for c in args.camera]
        out = write_random_checkpoint(
            args.out_dir,
            args.kind,
            args.state_dim,
            args.action_dim,
            args.chunk,
            args.dim_model,
            cameras,
            args.env_state_dim,
            args.seed,
        )
    except RandomCheckpointError as exc:
        print(f"lerobot_random: {exc}", file=sys.stderr)
        return 2
    print(f"wrote a random-weight LeRobot {args.kind} checkpoint to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
