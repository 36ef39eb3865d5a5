"""Behaviour cloning for the shipped chunk policies: arrays in, a checkpoint directory out.

    states (N, S), action_chunks (N, T, A) [, images {name: (N, H, W, 3) uint8}]
      -> targets (relative to state[relative_state_indices] at chunk start when relative_actions)
      -> stats.json, normalise -> policy.training_loss(...) epochs x minibatches -> save_checkpoint

Owns `train_bc`. The loss is the policy's own `training_loss` (flow-matching loss for
`flow_matching`, MSE for `mlp_chunk`/`stateful_chunk`), so adding a policy type needs no change here.

Invariants: the same arrays, config and seed give a byte-identical checkpoint (same hash) on the same
machine and thread count; images go through `server.processors.images_to_model`, the function the
server uses, so train-time and serve-time preprocessing are the same code. Besides the three
checkpoint files the directory gets training.json (loss curve, timings), which is not hashed.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import numpy as np
import torch

from server.policies.base import STATE_KEY, PolicyConfig, PolicyError, image_key, make_policy, policy_class
from server.policies.checkpoint import save_checkpoint
from server.policies.stats import ACTION_KEY, compute_stats, normalize, stats_to_tensors

TRAINING_LOG_FILE = "training.json"


class TrainingError(PolicyError, ValueError):
    """The training arrays or config do not fit together; the message names the mismatch."""


def _check_arrays(states: np.ndarray, action_chunks: np.ndarray, config: PolicyConfig) -> None:
    n = states.shape[0] if states.ndim == 2 else -1
    if states.ndim != 2 or states.shape[1] != config.state_dim:
        raise TrainingError(f"states has shape {states.shape}; expected (N, state_dim={config.state_dim})")
    expected = (n, config.chunk_size, config.action_dim)
    if action_chunks.shape != expected:
        raise TrainingError(
            f"action_chunks has shape {action_chunks.shape}; expected {expected} (N, chunk_size, action_dim)"
        )
    if n == 0:
        raise TrainingError("no training samples (N = 0)")
    if not (np.isfinite(states).all() and np.isfinite(action_chunks).all()):
        raise TrainingError("states or action_chunks contain NaN or inf")


def _check_images(images: dict[str, np.ndarray] | None, config: PolicyConfig, n: int) -> dict[str, np.ndarray]:
    images = dict(images or {})
    missing = sorted(set(config.image_features) - set(images))
    extra = sorted(set(images) - set(config.image_features))
    if missing or extra:
        raise TrainingError(
            f"images must cover exactly the declared image_features {sorted(config.image_features)}; "
            f"missing {missing}, undeclared {extra}"
        )
    for name, frames in images.items():
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[0] != n or frames.shape[-1] != 3:
            raise TrainingError(
                f"images[{name!r}] has shape {frames.shape} dtype {frames.dtype}; expected ({n}, H, W, 3) uint8 RGB"
            )
    return images


def train_bc(
    policy_type: str,
    states: np.ndarray,
    action_chunks: np.ndarray,
    config: PolicyConfig,
    out_dir: str | os.PathLike,
    epochs: int,
    seed: int,
    images: dict[str, np.ndarray] | None = None,
    *,
    batch_size: int = 256,
    lr: float = 1e-3,
    prefix_rows: np.ndarray | None = None,
) -> Path:
    """Train `policy_type` by behaviour cloning and save the checkpoint to `out_dir`; returns its path.

    `prefix_rows` (N,) ints: training-time RTC's committed rows per sample (bench.training.demos.
    collect_prefix_demos), passed to the policy's `training_loss`; only a policy built for it takes them
    (flow_matching with rtc_mode training_time)."""
    from server.processors import images_to_model  # processors imports checkpoint; keep the cycle lazy

    if config.type != policy_type:
        raise TrainingError(f"policy_type={policy_type!r} but config.type={config.type!r}; they must be the same word")
    policy_class(policy_type)  # refuses unknown types and types without a chunk API
    if epochs < 1 or batch_size < 1:
        raise TrainingError(f"epochs ({epochs}) and batch_size ({batch_size}) must be >= 1")
    states = np.asarray(states, dtype=np.float32)
    action_chunks = np.asarray(action_chunks, dtype=np.float32)
    _check_arrays(states, action_chunks, config)
    n = states.shape[0]
    images = _check_images(images, config, n)
    prefix_t = None
    if prefix_rows is not None:
        prefix_rows = np.asarray(prefix_rows)
        if prefix_rows.shape != (n,) or prefix_rows.min() < 0 or prefix_rows.max() >= config.chunk_size:
            raise TrainingError(
                f"prefix_rows has shape {prefix_rows.shape}, range [{prefix_rows.min()}, "
                f"{prefix_rows.max()}]; expected ({n},) ints in [0, chunk_size={config.chunk_size})"
            )
        if config.hyper_params.get("rtc_mode") != "training_time":
            raise TrainingError(
                "prefix_rows train training-time RTC: set hyper_params rtc_mode: training_time "
                f"(policy type {policy_type!r} with hyper_params {config.hyper_params})"
            )
        prefix_t = torch.from_numpy(prefix_rows.astype(np.int64))

    targets = action_chunks
    if config.relative_actions:
        targets = action_chunks - states[:, config.relative_state_indices][:, None, :]
    stats = compute_stats(states, targets)
    tensors = stats_to_tensors(stats)
    state_t = normalize(torch.from_numpy(states), tensors[STATE_KEY])
    target_t = normalize(torch.from_numpy(np.ascontiguousarray(targets)), tensors[ACTION_KEY])

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        policy = make_policy(config)
    policy.train()
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=0.0)
    steps_per_epoch = math.ceil(n / batch_size)
    total_steps = epochs * steps_per_epoch
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(step, total_steps) / total_steps))
    )

    started = time.perf_counter()
    epoch_losses: list[float] = []
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator)
        running = 0.0
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            batch = {STATE_KEY: state_t[idx]}
            for name, frames in images.items():
                batch[image_key(name)] = images_to_model(frames[idx.numpy()], config.image_features[name])
            extra = {} if prefix_t is None else {"prefix_rows": prefix_t[idx]}
            loss = policy.training_loss(batch, target_t[idx], generator=generator, **extra)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            running += float(loss.detach()) * len(idx)
        epoch_losses.append(running / n)
    seconds = time.perf_counter() - started

    policy.eval()
    out = save_checkpoint(policy, stats, out_dir)
    log = {
        "policy_type": policy_type,
        "samples": n,
        "epochs": epochs,
        "seed": seed,
        "batch_size": batch_size,
        "lr": lr,
        **({} if prefix_t is None else {"prefix_rows_mean": float(prefix_t.float().mean())}),
        "epoch_losses": epoch_losses,
        "final_loss": epoch_losses[-1],
        "train_seconds": round(seconds, 3),
    }
    (out / TRAINING_LOG_FILE).write_text(json.dumps(log, indent=2) + "\n")
    return out
