"""Checkpoints on disk: a directory of three files, loaded only from local paths, never with pickle.

    <dir>/config.json        PolicyConfig (canonical JSON)
    <dir>/model.safetensors  weights (safetensors: no code execution on load)
    <dir>/stats.json         normalisation stats (see server/policies/stats.py)

A directory as LeRobot's `save_pretrained` writes it (config.json naming a LeRobot type, model.safetensors,
policy_preprocessor.json, policy_postprocessor.json) loads through server/policies/lerobot.py instead, with
LeRobot's own classes; LeRobot is imported only then.

Invariants:
- `checkpoint_hash` = sha256 over the three files in the fixed order above, each fed as
  name, NUL, byte length (8 bytes little-endian), bytes; so any changed byte in any file (e.g. two
  finetunes with the same names but different weights) gives a different hash.
- The weights loaded are parsed from the very bytes that were hashed (no second read).
- A type without `predict_action_chunk` is refused before any weight is read (`PolicyLoadError`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from server.policies.base import ChunkPolicy, PolicyConfig, PolicyError, PolicyLoadError, make_policy, policy_class
from server.policies.stats import Stats, StatsTensors, stats_to_json, stats_to_tensors, validate_stats

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
STATS_FILE = "stats.json"
CHECKPOINT_FILES = (CONFIG_FILE, WEIGHTS_FILE, STATS_FILE)  # the hash order

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


class CheckpointError(PolicyLoadError):
    """A checkpoint directory is missing, incomplete, not local, or does not match its policy."""


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A policy in eval mode with its config, shared read-only stats tensors and provenance."""

    policy: ChunkPolicy
    config: PolicyConfig
    stats: StatsTensors
    checkpoint_hash: str
    revision_info: dict[str, Any] = field(default_factory=dict)
    # which processors.PIPELINE_KINDS entry builds a session's pipeline, and what it builds it from
    processor_kind: str = "stats"
    processor_parts: dict[str, Any] = field(default_factory=dict)


def checkpoint_hash(files: dict[str, bytes]) -> str:
    digest = hashlib.sha256()
    for name in CHECKPOINT_FILES:
        data = files[name]
        digest.update(name.encode() + b"\0" + len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def save_checkpoint(policy: ChunkPolicy, stats: Stats, directory: str | os.PathLike) -> Path:
    """Write config.json, model.safetensors and stats.json into `directory` (created if needed)."""
    validate_stats(stats, policy.config)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    weights = {k: v.detach().to("cpu").contiguous() for k, v in policy.state_dict().items()}
    (out / CONFIG_FILE).write_text(policy.config.to_json())
    safetensors.torch.save_file(weights, str(out / WEIGHTS_FILE), metadata={"type": policy.config.type})
    (out / STATS_FILE).write_text(stats_to_json(stats))
    return out


def _resolve_local(path: str | os.PathLike) -> Path:
    text = os.fspath(path)
    looks_remote = "://" in text or (_HUB_ID.match(text) is not None and not text.startswith("."))
    candidate = Path(text).expanduser()
    if not candidate.exists():
        if looks_remote:
            raise CheckpointError(
                f"{text!r} looks like a Hub repo id or URL, but weights load only from local paths. "
                f"Download it first (e.g. `huggingface-cli download {text} --local-dir ./ckpt`) and "
                f"pass the directory"
            )
        raise CheckpointError(f"checkpoint directory {text!r} does not exist; weights load only from local paths")
    if not candidate.is_dir():
        raise CheckpointError(
            f"checkpoint path {text!r} is a file; pass the directory holding {list(CHECKPOINT_FILES)}"
        )
    return candidate.resolve()


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise CheckpointError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)}") from None


def load_checkpoint(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str = torch.float32,
    trained_fps: float | None = None,
    action_names: Sequence[str] | None = None,
) -> LoadedCheckpoint:
    """Load a local checkpoint directory into an eval-mode, grad-free policy on `device`/`dtype`.

    `trained_fps` and `action_names` (the manifest's) give a LeRobot checkpoint what LeRobot's config does not
    record: its rate and its action columns' names. A checkpoint of ours names its actions: other names are refused."""
    directory = _resolve_local(path)
    if not (directory / STATS_FILE).is_file():
        from server.policies.lerobot import is_lerobot_checkpoint

        if is_lerobot_checkpoint(directory):
            return _load_lerobot(directory, device, _as_dtype(dtype), trained_fps, action_names)
    missing = [name for name in CHECKPOINT_FILES if not (directory / name).is_file()]
    if missing:
        raise CheckpointError(
            f"checkpoint {str(directory)!r} lacks {missing}; a checkpoint holds {list(CHECKPOINT_FILES)}"
        )
    files = {name: (directory / name).read_bytes() for name in CHECKPOINT_FILES}
    config = PolicyConfig.from_json(files[CONFIG_FILE])
    policy_class(config.type)  # refuses unknown and chunk-less types before touching the weights
    if action_names is not None and list(action_names) != config.action_names:
        raise CheckpointError(
            f"model.action_names {list(action_names)} differ from the names checkpoint {str(directory)!r} was trained "
            f"with, {config.action_names}; drop model.action_names (it is for checkpoints that name none, as LeRobot's)"
        )

    try:
        stats: Stats = json.loads(files[STATS_FILE])
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{STATS_FILE} in {str(directory)!r} is not valid JSON: {exc}") from None
    validate_stats(stats, config)

    try:
        weights = safetensors.torch.load(files[WEIGHTS_FILE])
    except Exception as exc:  # safetensors raises its own SafetensorError
        raise CheckpointError(f"{WEIGHTS_FILE} in {str(directory)!r} is not a valid safetensors file: {exc}") from None
    policy = make_policy(config)
    expected = {name: tuple(t.shape) for name, t in policy.state_dict().items()}
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    reshaped = sorted(k for k in set(expected) & set(weights) if tuple(weights[k].shape) != expected[k])
    if missing or unexpected or reshaped:
        raise CheckpointError(
            f"{WEIGHTS_FILE} in {str(directory)!r} does not match policy type {config.type!r} as config.json "
            f"describes it (wrong hyper_params or dims?): missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}, shape differs {[(k, tuple(weights[k].shape), expected[k]) for k in reshaped[:3]]}"
        )
    policy.load_state_dict(weights, strict=True)
    policy.to(device=torch.device(device), dtype=_as_dtype(dtype)).eval().requires_grad_(False)

    digest = checkpoint_hash(files)
    revision_info = {
        "source": "local",
        "path": str(directory),
        "type": config.type,
        "files": {
            name: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in files.items()
        },
        "checkpoint_hash": digest,
    }
    return LoadedCheckpoint(policy, policy.config, stats_to_tensors(stats), digest, revision_info)


def _load_lerobot(directory: Path, device, dtype: torch.dtype, trained_fps, action_names) -> LoadedCheckpoint:
    from server.policies.lerobot import LeRobotCheckpointError, load_lerobot_checkpoint

    try:
        parts = load_lerobot_checkpoint(directory, device, dtype, trained_fps, action_names)
    except LeRobotCheckpointError as exc:
        raise CheckpointError(str(exc)) from None
    return LoadedCheckpoint(
        parts["policy"],
        parts["config"],
        {},
        parts["checkpoint_hash"],
        parts["revision_info"],
        processor_kind="lerobot",
        processor_parts={k: parts[k] for k in ("processors", "state_keys", "cameras")},
    )


def _words(exc: Exception) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); save it as UTF-8"
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON: {exc}"
    return str(exc)


def init_weights(path: str | os.PathLike, seed: int = 0, dtype: torch.dtype | str = torch.bfloat16) -> Path:
    """Write model.safetensors with seeded random weights into a directory holding config.json and stats.json.

    For a model too large to ship (the GPU capacity scenario's VLA-sized flow_transformer): the
    config and stats travel in git, the weights are made where they are served. Random weights
    measure time and capacity, never task success. Saved in `dtype` (bf16 halves the file).
    """
    directory = Path(path)
    missing = [name for name in (CONFIG_FILE, STATS_FILE) if not (directory / name).is_file()]
    if missing:
        raise CheckpointError(f"{str(directory)!r} lacks {missing}; init_weights needs {CONFIG_FILE} and {STATS_FILE}")
    # every problem names its file (they are edited by hand), and both are checked before a large model is built
    try:
        config = PolicyConfig.from_json((directory / CONFIG_FILE).read_text(encoding="utf-8"))
        policy_class(config.type)
    except (PolicyError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{directory / CONFIG_FILE}: {_words(exc)}") from None
    try:
        stats = json.loads((directory / STATS_FILE).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{directory / STATS_FILE}: {_words(exc)}") from None
    if not isinstance(stats, dict):
        raise CheckpointError(f"{directory / STATS_FILE}: must hold a JSON object, got {type(stats).__name__}")
    try:
        validate_stats(stats, config)
    except PolicyError as exc:
        raise CheckpointError(f"{directory / STATS_FILE}: {exc}") from None
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            policy = make_policy(config)
    except PolicyError as exc:  # the hyper-parameters, checked by the policy type
        raise CheckpointError(f"{directory / CONFIG_FILE}: {exc}") from None
    weights = {k: v.detach().to(dtype=_as_dtype(dtype)).contiguous() for k, v in policy.state_dict().items()}
    # one metadata key, as save_checkpoint: safetensors writes a map's keys in a per-process random
    # order, so two keys would make the same weights hash differently from run to run
    safetensors.torch.save_file(weights, str(directory / WEIGHTS_FILE), metadata={"type": config.type})
    return directory
