"""LeRobot checkpoints, served by LeRobot's own modeling and processor code (lerobot 0.4.4).

    <dir>/config.json  ("type": "act", "diffusion", ...)     PreTrainedConfig.from_pretrained (backbone weights: None)
    <dir>/model.safetensors                                  <LeRobot policy class>.from_pretrained(dir, strict=True)
    <dir>/policy_preprocessor.json, policy_postprocessor.json
          + their *_step_*.safetensors (dataset stats)       make_pre_post_processors(cfg, pretrained_path=dir)

    wire state (S,) = observation.state ++ observation.environment_state (when the policy has one), in that order
    per session: LeRobotPipeline (server/processors.py) -> LeRobot's preprocessor (batch, normalise)
    one forward pass: LeRobotPolicy.predict_action_chunk(stacked batch) -> LeRobot's predict_action_chunk / select_action
    per session: LeRobot's postprocessor (unnormalise) -> (T, A) robot-space chunk

Owns: FAMILIES (how each LeRobot type word is served: shared or exclusive, RTC, rows per chunk),
`is_lerobot_checkpoint`, `load_lerobot_checkpoint` and the `LeRobotPolicy` wrappers.

Invariants:
- LeRobot is imported only by `load_lerobot_checkpoint` (and the wrappers it builds): a server that never serves a
  LeRobot checkpoint never imports it. Nothing here re-implements a LeRobot model or processor step.
- Only a local directory loads (`checkpoint._resolve_local` refuses a hub id before this module runs), and nothing
  is downloaded: a config that names pretrained backbone weights (ImageNet ResNet18) is loaded with them unset,
  the checkpoint's tensors overwrite the backbone anyway (strict: every tensor must match).
- `checkpoint_hash` covers every file LeRobot reads (sorted by name, framed as checkpoint.checkpoint_hash); the
  files are hashed before LeRobot opens them.
- Design 004 §8.3: ACT (and pi0 / pi0.5 / SmolVLA) keep no state between `predict_action_chunk` calls (shared
  mode, micro-batched); Diffusion stacks its last `n_obs_steps` observations in the instance (exclusive mode).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor

from server.policies.base import ChunkPolicy, PolicyConfig, PolicyInputError

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
PREPROCESSOR_FILE = "policy_preprocessor.json"
POSTPROCESSOR_FILE = "policy_postprocessor.json"
TRAIN_CONFIG_FILE = "train_config.json"  # lerobot-train writes it beside the policy; read for env.fps only
STATE_FEATURE_KEYS = ("observation.state", "observation.environment_state")  # their order in the wire state
IMAGE_PREFIXES = ("observation.images.", "observation.image")
TESTED_WITH = "lerobot 0.4.4"
INSTALL_HINT = 'pip install -e ".[server,lerobot]"'
# Every policy type word lerobot 0.4.4 registers: a config.json naming one of these is a LeRobot checkpoint.
LEROBOT_TYPES = frozenset(
    {
        "act",
        "diffusion",
        "pi0",
        "pi05",
        "pi0_fast",
        "smolvla",
        "groot",
        "xvla",
        "wall_x",
        "sac",
        "tdmpc",
        "vqbet",
        "sarm",
    }
)


class LeRobotCheckpointError(ValueError):
    """Raised as checkpoint.CheckpointError by `load_lerobot_checkpoint`; kept here so this module stands alone."""


@dataclass(frozen=True)
class Family:
    """How the server serves one LeRobot policy type."""

    chunk_stateless: bool  # design 004 §8.3: shared mode (and micro-batched) when True, exclusive otherwise
    chunk_rows: str  # the config field giving the rows LeRobot's predict_action_chunk returns
    lerobot_rtc: bool  # LeRobot's predict_action_chunk takes inference_delay / prev_chunk_left_over
    hyper_params: Mapping[str, Any]  # serving hyper-parameters a manifest may override


# tested here: act and diffusion (tests/server/test_lerobot.py, CPU); the pi0 family needs transformers and local
# weights, and LeRobot's RTC guidance for it is not wired to remote sessions yet (served in append mode)
FAMILIES: dict[str, Family] = {
    "act": Family(True, "chunk_size", False, {}),
    "diffusion": Family(False, "n_action_steps", False, {"noise_seed": 0}),
    "pi0": Family(True, "chunk_size", True, {}),
    "pi05": Family(True, "chunk_size", True, {}),
    "smolvla": Family(True, "chunk_size", True, {}),
}


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def is_lerobot_checkpoint(directory: Path) -> bool:
    """A directory whose config.json names a LeRobot policy type (as LeRobot's save_pretrained writes it)."""
    meta = _read_json(directory / CONFIG_FILE)
    return isinstance(meta, dict) and meta.get("type") in LEROBOT_TYPES and "state_dim" not in meta


def checkpoint_files(directory: Path) -> list[str]:
    """The files LeRobot reads from `directory`, sorted: the hash order."""
    names = {CONFIG_FILE, WEIGHTS_FILE, PREPROCESSOR_FILE, POSTPROCESSOR_FILE}
    for pipeline in (PREPROCESSOR_FILE, POSTPROCESSOR_FILE):
        for step in (_read_json(directory / pipeline) or {}).get("steps", []):
            if isinstance(step, dict) and isinstance(step.get("state_file"), str):
                names.add(step["state_file"])
    if (directory / TRAIN_CONFIG_FILE).is_file():
        names.add(TRAIN_CONFIG_FILE)
    return sorted(names)


def files_hash(files: Mapping[str, bytes]) -> str:
    """sha256 over `files` in sorted name order, each as name, NUL, byte length (8 bytes little-endian), bytes."""
    digest = hashlib.sha256()
    for name in sorted(files):
        data = files[name]
        digest.update(name.encode() + b"\0" + len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def _trained_fps(directory: Path, trained_fps: float | None) -> float:
    if trained_fps:
        return float(trained_fps)
    env = (_read_json(directory / TRAIN_CONFIG_FILE) or {}).get("env") or {}
    fps = env.get("fps") if isinstance(env, dict) else None
    if isinstance(fps, (int, float)) and fps > 0:
        return float(fps)
    raise LeRobotCheckpointError(
        f"LeRobot checkpoint {str(directory)!r} does not say the rate it was trained at (its config.json has no fps "
        f"and no {TRAIN_CONFIG_FILE} gives env.fps); set `trained_fps:` in the manifest to the dataset's fps"
    )


def _feature_layout(cfg) -> tuple[list[tuple[str, int]], dict[str, str], dict[str, list[int]]]:
    """(state keys and sizes in wire order, camera name -> LeRobot key, camera name -> [3, H, W])."""
    inputs = dict(cfg.input_features)
    state = [(key, int(inputs[key].shape[0])) for key in STATE_FEATURE_KEYS if key in inputs]
    cameras: dict[str, str] = {}
    shapes: dict[str, list[int]] = {}
    for key, feature in inputs.items():
        if key in STATE_FEATURE_KEYS:
            continue
        if getattr(feature.type, "name", str(feature.type)) != "VISUAL":
            raise LeRobotCheckpointError(
                f"input feature {key!r} ({feature.type}) has no place in an observation on the wire, which carries "
                f"{' + '.join(STATE_FEATURE_KEYS)} and camera frames; this LeRobot policy cannot be served here"
            )
        prefix = next((p for p in IMAGE_PREFIXES if key.startswith(p)), None)
        name = key[len(prefix) :].lstrip(".") if prefix else key
        name = name or "image"
        cameras[name] = key
        shapes[name] = [int(x) for x in feature.shape]
    if STATE_FEATURE_KEYS[0] not in inputs:
        raise LeRobotCheckpointError(
            f"the policy has no {STATE_FEATURE_KEYS[0]!r} input feature, which LeRobot's policies read at inference "
            f"and the wire's observation always carries"
        )
    return state, cameras, shapes


class LeRobotPolicy(ChunkPolicy):
    """A LeRobot policy behind the server's `ChunkPolicy` call: (B, T, A) model-space chunks of LeRobot's batch.

    Batch keys are LeRobot's (`observation.state`, `observation.environment_state`, `observation.images.<name>`),
    as the session's `LeRobotPipeline` produced them. Delays and prefixes are validated and ignored: no family
    served here has remote RTC yet (`rtc_unsupported_reason` says why, in the session ack's warning).
    """

    family: ClassVar[Family]
    lerobot_type: ClassVar[str] = ""

    def __init__(self, config: PolicyConfig, inner: torch.nn.Module, lerobot_config: Any):
        super().__init__(config)
        self.inner = inner
        self.lerobot_config = lerobot_config

    @property
    def rtc_unsupported_reason(self) -> str:
        if self.family.lerobot_rtc:
            return (
                f"LeRobot's {self.lerobot_type} takes RTC arguments, but this server does not pass them to it yet; "
                "served in append mode"
            )
        return f"LeRobot's {self.lerobot_type} predict_action_chunk takes no inference_delay / prev_chunk_left_over"

    def check_batch(self, batch: Mapping[str, Tensor], inference_delay: Sequence[int], prefix: Sequence) -> int:
        sizes = {int(v.shape[0]) for v in batch.values()}
        if len(sizes) != 1:
            raise PolicyInputError(f"batch tensors disagree on the batch size: {sorted(sizes)}")
        size = sizes.pop()
        if len(inference_delay) != size or len(prefix) != size:
            raise PolicyInputError(
                f"inference_delay ({len(inference_delay)}) and prefix ({len(prefix)}) need one entry per sample (B={size})"
            )
        return size

    def predict_action_chunk(
        self, batch: dict[str, Tensor], inference_delay: Sequence[int], prefix: Sequence[Tensor | None]
    ) -> Tensor:
        size = self.check_batch(batch, inference_delay, prefix)
        inputs = {k: (v.clone() if v.is_inference() else v) for k, v in batch.items()}
        with torch.no_grad():
            chunk = self.lerobot_chunk(inputs, size)
        return chunk.float()

    def lerobot_chunk(self, batch: dict[str, Tensor], size: int) -> Tensor:
        """(B, T, A): LeRobot's own `predict_action_chunk`."""
        return self.inner.predict_action_chunk(batch)


class LeRobotStatelessPolicy(LeRobotPolicy):
    """ACT, pi0, pi0.5, SmolVLA: `predict_action_chunk(batch)` reads only its argument."""

    chunk_stateless = True


class LeRobotDiffusionPolicy(LeRobotPolicy):
    """Diffusion: LeRobot's `select_action` stacks the last `n_obs_steps` observations from the instance's queues,
    then denoises a chunk; here each request's observation enters that history (one per chunk, not one per control
    step as in a local rollout) and the whole chunk LeRobot queued is returned. `noise_seed` (default 0) seeds the
    sampling noise per call (DDPM draws noise at every step), so a chunk is a function of the observation history;
    None draws from torch's global RNG."""

    chunk_stateless = False
    hyper_param_defaults = FAMILIES["diffusion"].hyper_params

    def reset(self) -> None:
        self.inner.reset()

    def lerobot_chunk(self, batch: dict[str, Tensor], size: int) -> Tensor:
        from lerobot.utils.constants import ACTION, OBS_STATE

        queues = self.inner._queues
        history = queues.get(OBS_STATE)
        if history and history[-1].shape[0] != size:  # only warm-up passes change the batch size (exclusive mode)
            self.inner.reset()
        seed = self.hp.get("noise_seed")
        if seed is None:
            first = self.inner.select_action(dict(batch))
        else:
            device = self.param_device
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                torch.manual_seed(int(seed))
                first = self.inner.select_action(dict(batch))
        queued = self.inner._queues[ACTION]
        chunk = torch.stack([first, *queued], dim=1)
        queued.clear()  # the next request denoises a new chunk from its own observation
        return chunk


def _wrapper_class(type_name: str) -> type[LeRobotPolicy]:
    """A class per type word (classify reads the class): stateless ones call predict_action_chunk; the one stateful
    family, Diffusion, goes through select_action's observation queues."""
    base = LeRobotStatelessPolicy if FAMILIES[type_name].chunk_stateless else LeRobotDiffusionPolicy
    return type(f"LeRobot_{type_name}", (base,), {"family": FAMILIES[type_name], "lerobot_type": type_name})


def _import_lerobot():
    try:
        from lerobot.configs.policies import PreTrainedConfig
        from lerobot.policies.factory import get_policy_class, make_pre_post_processors
    except ImportError as exc:
        raise LeRobotCheckpointError(
            f"serving a LeRobot checkpoint needs the lerobot package ({exc}); install it with `{INSTALL_HINT}` "
            f"(tested with {TESTED_WITH}, see docs/lerobot.md)"
        ) from None
    return PreTrainedConfig, get_policy_class, make_pre_post_processors


def load_lerobot_checkpoint(
    directory: Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    trained_fps: float | None = None,
    action_names: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Load a local LeRobot checkpoint directory with LeRobot's classes.

    Returns the parts of a `checkpoint.LoadedCheckpoint`: policy (a `LeRobotPolicy` in eval mode), config (the
    validation matrix as a `PolicyConfig`), processors (LeRobot's loaded pre- and postprocessor, copied per session
    by `processors.make_session_pipeline`), state_keys, cameras, checkpoint_hash and revision_info.
    """
    meta = _read_json(directory / CONFIG_FILE)
    type_name = meta.get("type") if isinstance(meta, dict) else None
    if type_name not in FAMILIES:
        raise LeRobotCheckpointError(
            f"LeRobot policy type {type_name!r} is not served: the server serves whole action chunks of "
            f"{', '.join(sorted(FAMILIES))} (see docs/lerobot.md); a select_action-only policy cannot be served remotely"
        )
    missing = [n for n in (WEIGHTS_FILE, PREPROCESSOR_FILE, POSTPROCESSOR_FILE) if not (directory / n).is_file()]
    if missing:
        raise LeRobotCheckpointError(
            f"LeRobot checkpoint {str(directory)!r} lacks {missing}; save_pretrained writes config.json and "
            f"model.safetensors, and the saved processors write {PREPROCESSOR_FILE} and {POSTPROCESSOR_FILE} (a "
            f"checkpoint from before lerobot 0.4 has none: convert it with lerobot's "
            f"`python -m lerobot.processor.migrate_policy_normalization`)"
        )
    names = checkpoint_files(directory)
    absent = [n for n in names if not (directory / n).is_file()]
    if absent:
        raise LeRobotCheckpointError(f"LeRobot checkpoint {str(directory)!r} lacks {absent}, which its processors name")
    files = {name: (directory / name).read_bytes() for name in names}
    digest = files_hash(files)
    fps = _trained_fps(directory, trained_fps)

    PreTrainedConfig, get_policy_class, make_pre_post_processors = _import_lerobot()
    try:
        cfg = PreTrainedConfig.from_pretrained(str(directory), local_files_only=True)
    except Exception as exc:  # draccus raises its own parse errors
        raise LeRobotCheckpointError(f"{directory / CONFIG_FILE} is not a LeRobot {type_name} config: {exc}") from None
    if getattr(cfg, "pretrained_backbone_weights", None):
        cfg.pretrained_backbone_weights = None  # offline; the checkpoint's tensors hold the trained backbone
    cfg.device = str(torch.device(device))
    state, cameras, shapes = _feature_layout(cfg)
    action = cfg.output_features.get("action")
    if action is None:
        raise LeRobotCheckpointError(f"{directory / CONFIG_FILE} declares no 'action' output feature")
    family = FAMILIES[type_name]
    rows = int(getattr(cfg, family.chunk_rows))
    try:
        inner = get_policy_class(type_name).from_pretrained(
            str(directory), config=cfg, local_files_only=True, strict=True
        )
    except Exception as exc:
        raise LeRobotCheckpointError(
            f"LeRobot could not load {directory / WEIGHTS_FILE} as its {type_name} policy: {type(exc).__name__}: {exc}"
        ) from None
    try:  # the preprocessing stays on the CPU: the runtime stacks the batch and copies it to the device once
        preprocessor, postprocessor = make_pre_post_processors(
            cfg,
            pretrained_path=str(directory),
            preprocessor_overrides={"device_processor": {"device": "cpu"}},
            postprocessor_overrides={"device_processor": {"device": "cpu"}},
        )
    except Exception as exc:
        raise LeRobotCheckpointError(
            f"LeRobot could not load the processors of {str(directory)!r}: {type(exc).__name__}: {exc}"
        ) from None
    state_dim = sum(size for _, size in state)
    action_dim = int(action.shape[0])
    names = list(action_names or [])
    if names and len(names) != action_dim:
        raise LeRobotCheckpointError(
            f"model.action_names has {len(names)} names but the LeRobot policy in {str(directory)!r} outputs "
            f"{action_dim} actions; give one name per action column, in the dataset's order"
        )
    config = PolicyConfig(
        type=type_name,
        state_dim=state_dim,
        action_dim=action_dim,
        action_names=names,
        chunk_size=rows,
        fps=fps,
        state_names=[f"{key}[{i}]" for key, size in state for i in range(size)],
        image_features=shapes,
        execution_horizon=min(10, rows),
    )
    policy = _wrapper_class(type_name)(config, inner, cfg)
    policy.to(device=torch.device(device), dtype=dtype).eval().requires_grad_(False)
    revision_info = {
        "source": "local",
        "format": "lerobot",
        "path": str(directory),
        "type": type_name,
        "files": {
            name: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in files.items()
        },
        "checkpoint_hash": digest,
    }
    return {
        "policy": policy,
        "config": policy.config,
        "processors": (preprocessor, postprocessor),
        "state_keys": state,
        "cameras": cameras,
        "checkpoint_hash": digest,
        "revision_info": revision_info,
    }
