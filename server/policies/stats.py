"""Normalisation statistics: the content of a checkpoint's stats.json and its tensor form.

    {"observation.state": {"mean": [...S], "std": [...S]},
     "action":            {"mean": [...A], "std": [...A]},          # of the (relative) training targets
     "observation.images.<name>": {"mean": [3], "std": [3]}}        # optional, per channel

Invariants: every std is > 0 (`compute_stats` maps a constant dimension's std to 1.0, so it is
centred rather than blown up at serve time); JSON values are float32 values written exactly, so
save -> load -> save gives the same bytes. `normalize`/`unnormalize` are the one formula both
training and serving use: (x - mean) / std.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

import numpy as np
import torch
from torch import Tensor

from server.policies.base import STATE_KEY, PolicyConfig, PolicyLoadError, image_key

ACTION_KEY = "action"
STD_FLOOR = 1e-6

Stats = dict[str, dict[str, list[float]]]
StatsTensors = dict[str, dict[str, Tensor]]


class StatsError(PolicyLoadError):
    """stats.json is missing a key, has the wrong length, or a non-positive std."""


def _mean_std(x: np.ndarray) -> dict[str, list[float]]:
    x = np.asarray(x, dtype=np.float64)
    mean = x.mean(axis=0).astype(np.float32)
    std = x.std(axis=0).astype(np.float32)
    std = np.where(std < STD_FLOOR, np.float32(1.0), std)
    return {"mean": [float(v) for v in mean], "std": [float(v) for v in std]}


def compute_stats(states: np.ndarray, action_targets: np.ndarray) -> Stats:
    """Stats over states (N, S) and the action targets (N, T, A) the model is trained on."""
    return {
        STATE_KEY: _mean_std(states),
        ACTION_KEY: _mean_std(np.asarray(action_targets).reshape(-1, np.asarray(action_targets).shape[-1])),
    }


def validate_stats(stats: Mapping, config: PolicyConfig) -> None:
    expected = {STATE_KEY: config.state_dim, ACTION_KEY: config.action_dim}
    expected.update({image_key(n): shape[0] for n, shape in config.image_features.items() if image_key(n) in stats})
    for key in stats:
        if key not in expected:
            raise StatsError(f"stats.json has an entry {key!r} that the config does not declare")
    for key, dim in expected.items():
        entry = stats.get(key)
        if not isinstance(entry, Mapping) or set(entry) != {"mean", "std"}:
            raise StatsError(f"stats.json[{key!r}] must be {{'mean': [...], 'std': [...]}}, got {entry!r:.80}")
        for field in ("mean", "std"):
            values = entry[field]
            if not isinstance(values, list) or len(values) != dim:
                raise StatsError(f"stats.json[{key!r}][{field!r}] must list {dim} numbers")
            if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
                raise StatsError(f"stats.json[{key!r}][{field!r}] has a non-finite value")
        if min(entry["std"]) <= 0:
            raise StatsError(f"stats.json[{key!r}]['std'] has a value <= 0; a std must be positive")


def stats_to_json(stats: Stats) -> str:
    return json.dumps(stats, indent=2, sort_keys=True) + "\n"


def stats_to_tensors(stats: Stats) -> StatsTensors:
    """float32 CPU tensors, built once per loaded checkpoint and shared read-only by every session."""
    return {
        key: {field: torch.tensor(values, dtype=torch.float32) for field, values in entry.items()}
        for key, entry in stats.items()
    }


def normalize(x: Tensor, entry: Mapping[str, Tensor]) -> Tensor:
    return (x - entry["mean"]) / entry["std"]


def unnormalize(x: Tensor, entry: Mapping[str, Tensor]) -> Tensor:
    return x * entry["std"] + entry["mean"]
