"""Per-session processor pipelines: robot-space numpy in, model-space torch to the policy, and back.

    obs {"observation.state": (S,) float, "observation.images.<name>": (H, W, 3) uint8 RGB}
      --preprocess-->  ToTensorStep -> ImageStep -> RelativeActionsStep -> NormalizeStep  --> batch (B=1)
    chunk_model (1, T, A) or (T, A)
      --postprocess--> to CPU float32 -> NormalizeStep -> RelativeActionsStep --> chunk_robot (T, A)

    LeRobot checkpoints (processor kind "lerobot"): `LeRobotPipeline`, this session's copies of the checkpoint's
    saved LeRobot pre/postprocessors, runs LeRobot's own steps between the same two conversions.

Owns: the steps, `Pipeline`, `LeRobotPipeline`, `PIPELINE_KINDS` / `make_session_pipeline` and `prepare_prefix`
(the RTC prefix in model space, re-anchored for relative-action policies as LeRobot's rtc.py does).

Invariants:
- One `Pipeline` per session, never shared: `RelativeActionsStep` caches the raw state at preprocess
  and reads it back at postprocess, so two sessions on one instance would add each other's state.
  A session runs one request at a time (preprocess ... postprocess), which makes that cache safe.
- Normalisation stats are the loaded checkpoint's tensors, referenced by every pipeline and never
  copied or written (all arithmetic is out of place).
- Serve-time image preprocessing is `images_to_model`, the function `train_bc` uses too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from server.policies.base import STATE_KEY, PolicyConfig, image_key
from server.policies.checkpoint import LoadedCheckpoint
from server.policies.stats import ACTION_KEY, StatsTensors, normalize, unnormalize


class ProcessorError(ValueError):
    """An observation, chunk or prefix does not fit the session's policy; the message says which, `code` the wire's
    error code for it (BAD_TENSOR; a declared camera's frame missing: CAMERA_MISMATCH; a frame that is no
    (H, W, 3) uint8 RGB image: BAD_IMAGE)."""

    def __init__(self, message: str, code: str = "BAD_TENSOR"):
        super().__init__(message)
        self.code = code


def images_to_model(frames: np.ndarray | Tensor, shape: Sequence[int]) -> Tensor:
    """(N, H, W, 3) or (H, W, 3) uint8 RGB -> (N, 3, h, w) float32 in [0, 1] at the declared shape.

    Bilinear with antialias, stretched to (h, w) (no letterbox), per sample: a frame gives the same
    tensor alone or in a batch. A torch uint8 frame (a GPU-decoded JPEG, server.accel) is converted
    on its own device by the same arithmetic.
    """
    if isinstance(frames, Tensor):
        return _tensor_images_to_model(frames, shape)
    frames = np.asarray(frames)
    if frames.ndim == 3:
        frames = frames[None]
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ProcessorError(
            f"image has shape {frames.shape[1:] if frames.ndim == 4 else frames.shape} dtype {frames.dtype}; "
            f"expected (H, W, 3) uint8 RGB",
            "BAD_IMAGE",
        )
    # astype copies: decoded wire frames are read-only views, which torch.from_numpy warns about
    images = torch.from_numpy(frames.astype(np.float32)).permute(0, 3, 1, 2).div_(255.0).contiguous()
    height, width = int(shape[1]), int(shape[2])
    if images.shape[-2:] != (height, width):
        images = F.interpolate(images, size=(height, width), mode="bilinear", align_corners=False, antialias=True)
        images = images.clamp_(0.0, 1.0)
    return images


def _tensor_images_to_model(frames: Tensor, shape: Sequence[int]) -> Tensor:
    if frames.ndim == 3:
        frames = frames[None]
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != torch.uint8:
        raise ProcessorError(
            f"image has shape {tuple(frames.shape)} dtype {frames.dtype}; expected (H, W, 3) uint8 RGB", "BAD_IMAGE"
        )
    images = frames.to(torch.float32).permute(0, 3, 1, 2).div_(255.0).contiguous()
    height, width = int(shape[1]), int(shape[2])
    if images.shape[-2:] != (height, width):
        images = F.interpolate(images, size=(height, width), mode="bilinear", align_corners=False, antialias=True)
        images = images.clamp_(0.0, 1.0)
    return images


class ProcessorStep:
    """One stage: `preprocess` transforms the batch dict, `postprocess` transforms the chunk."""

    def preprocess(self, batch: dict[str, Any]) -> dict[str, Any]:
        return batch

    def postprocess(self, chunk: Tensor) -> Tensor:
        return chunk

    def reset(self) -> None:
        """Episode boundary: drop any cached state."""


class ToTensorStep(ProcessorStep):
    """State numpy (S,) -> float32 tensor (1, S); the chunk goes back to CPU float32 before any step."""

    def __init__(self, config: PolicyConfig):
        self.config = config

    def preprocess(self, batch: dict[str, Any]) -> dict[str, Any]:
        if STATE_KEY not in batch:
            raise ProcessorError(f"observation has no {STATE_KEY!r}; keys: {sorted(batch)}")
        with np.errstate(over="ignore", invalid="ignore"):  # out of float32's range becomes inf, refused below
            state = np.asarray(batch[STATE_KEY], dtype=np.float32).reshape(-1)
        if state.shape != (self.config.state_dim,):
            raise ProcessorError(
                f"{STATE_KEY} has {state.size} values; the policy expects {self.config.state_dim} "
                f"({', '.join(self.config.state_names)})"
            )
        if not np.isfinite(state).all():
            raise ProcessorError(
                f"{STATE_KEY} has non-finite values (or values beyond float32's range): {state.tolist()}"
            )
        return {**batch, STATE_KEY: torch.from_numpy(state.copy())[None]}

    def chunk_to_cpu(self, chunk: Tensor) -> Tensor:
        """The policy's (1, T, A) or (T, A) chunk as detached float32 CPU (1, T, A); runs before any step."""
        chunk = torch.as_tensor(chunk).detach().to(device="cpu", dtype=torch.float32)
        if chunk.ndim == 2:
            chunk = chunk[None]
        expected = (1, self.config.chunk_size, self.config.action_dim)
        if tuple(chunk.shape) != expected:
            raise ProcessorError(f"chunk has shape {tuple(chunk.shape)}; expected {expected} or {expected[1:]}")
        return chunk


class ImageStep(ProcessorStep):
    """Each declared camera: (H, W, 3) uint8 RGB (or an object with `.decode()`) -> (1, 3, h, w) in [0, 1]."""

    def __init__(self, config: PolicyConfig):
        self.features = dict(config.image_features)

    def preprocess(self, batch: dict[str, Any]) -> dict[str, Any]:
        out = dict(batch)
        for name, shape in self.features.items():
            frame = batch.get(image_key(name))
            if frame is None:
                raise ProcessorError(
                    f"observation has no {image_key(name)!r}; the policy declares camera {name!r}", "CAMERA_MISMATCH"
                )
            if hasattr(frame, "decode") and not isinstance(frame, np.ndarray):
                frame = frame.decode(at_least=(int(shape[1]), int(shape[2])))  # wire.images.EncodedImage
            out[image_key(name)] = images_to_model(frame, shape)
        return out


class RelativeActionsStep(ProcessorStep):
    """Caches the raw state at preprocess; postprocess adds state[indices] to every action of the chunk.

    The cache lives in the instance: this is why pipelines are per session.
    """

    def __init__(self, relative_state_indices: Sequence[int]):
        self.indices = torch.tensor(list(relative_state_indices), dtype=torch.long)
        self._anchor_state: Tensor | None = None

    def preprocess(self, batch: dict[str, Any]) -> dict[str, Any]:
        self._anchor_state = batch[STATE_KEY].clone()  # raw: this step runs before NormalizeStep
        return batch

    @property
    def anchor_state(self) -> Tensor | None:
        return self._anchor_state

    def postprocess(self, chunk: Tensor) -> Tensor:
        if self._anchor_state is None:
            raise ProcessorError(
                "postprocess before preprocess: the relative-action anchor state is unset. "
                "Run preprocess on this session's observation first (same pipeline instance)"
            )
        return chunk + self._anchor_state[:, self.indices][:, None, :]

    def to_relative(self, actions: Tensor, state: Tensor) -> Tensor:
        """Robot-space (L, A) actions re-expressed relative to raw state (S,)."""
        return actions - state.reshape(-1)[self.indices][None, :]

    def reset(self) -> None:
        self._anchor_state = None


class NormalizeStep(ProcessorStep):
    """(x - mean) / std on state (and images when the checkpoint has image stats); inverse on actions."""

    def __init__(self, stats: StatsTensors):
        self.stats = stats  # the checkpoint's tensors, shared by every session: read only

    def preprocess(self, batch: dict[str, Any]) -> dict[str, Any]:
        out = dict(batch)
        out[STATE_KEY] = normalize(batch[STATE_KEY], self.stats[STATE_KEY])
        for key, entry in self.stats.items():
            if key != STATE_KEY and key != ACTION_KEY and key in batch:
                out[key] = (batch[key] - entry["mean"][:, None, None]) / entry["std"][:, None, None]
        return out

    def postprocess(self, chunk: Tensor) -> Tensor:
        return unnormalize(chunk, self.stats[ACTION_KEY])

    def normalize_action(self, actions: Tensor) -> Tensor:
        return normalize(actions, self.stats[ACTION_KEY])


class Pipeline:
    """A session's steps: `preprocess(obs) -> batch`, `postprocess(chunk_model) -> chunk_robot`."""

    def __init__(self, config: PolicyConfig, steps: Sequence[ProcessorStep]):
        if not steps or not isinstance(steps[0], ToTensorStep):
            raise ProcessorError("a Pipeline starts with ToTensorStep (it converts the observation in, the chunk out)")
        self.config = config
        self.steps = tuple(steps)
        self._model_keys = [STATE_KEY] + [image_key(n) for n in config.image_features]

    def preprocess(self, obs: Mapping[str, Any]) -> dict[str, Tensor]:
        """Robot-space numpy observation -> model-space batch of one (CPU float32 tensors)."""
        batch: dict[str, Any] = dict(obs)
        for step in self.steps:
            batch = step.preprocess(batch)
        return {key: batch[key] for key in self._model_keys}

    def postprocess(self, chunk_model: Tensor) -> Tensor:
        """Model-space (1, T, A) or (T, A) chunk -> robot-space (T, A) float32 CPU tensor."""
        chunk = self.steps[0].chunk_to_cpu(chunk_model)  # stats live on the CPU, the policy may not
        for step in reversed(self.steps):
            chunk = step.postprocess(chunk)
        return chunk[0]

    def reset(self) -> None:
        for step in self.steps:
            step.reset()

    def find(self, step_type: type[ProcessorStep]) -> Any:
        return next((s for s in self.steps if isinstance(s, step_type)), None)


def make_stats_pipeline(loaded: LoadedCheckpoint) -> Pipeline:
    """A NEW pipeline for one session; its NormalizeStep references `loaded.stats` without copying."""
    config = loaded.config
    steps: list[ProcessorStep] = [ToTensorStep(config), ImageStep(config)]
    if config.relative_actions:
        steps.append(RelativeActionsStep(config.relative_state_indices))
    steps.append(NormalizeStep(loaded.stats))
    return Pipeline(config, steps)


class LeRobotPipeline:
    """A session's own copies of a LeRobot checkpoint's saved preprocessor and postprocessor (LeRobot's
    `PolicyProcessorPipeline`s, deep-copied from the loaded ones: a LeRobot step may keep state, so no two
    sessions share one). The `Pipeline` interface:

        preprocess:  state (S,) -> split into the policy's state features (wire order)  } ToTensorStep's and
                     each camera (H, W, 3) uint8 -> (1, 3, h, w) in [0, 1]               } images_to_model's checks
                     -> LeRobot's preprocessor (rename, batch, normalise)  -> the policy's input features (B=1)
        postprocess: (1, T, A) model-space chunk -> LeRobot's postprocessor (unnormalise) -> (T, A) robot space
    """

    def __init__(self, config: PolicyConfig, parts: Mapping[str, Any]):
        import copy

        self.config = config
        preprocessor, postprocessor = parts["processors"]
        self.preprocessor = copy.deepcopy(preprocessor)
        self.postprocessor = copy.deepcopy(postprocessor)
        self.state_keys: list[tuple[str, int]] = list(parts["state_keys"])
        self.cameras: dict[str, str] = dict(parts["cameras"])  # camera name -> LeRobot feature key
        self._to_tensor = ToTensorStep(config)
        self._model_keys = [key for key, _ in self.state_keys] + list(self.cameras.values())

    def preprocess(self, obs: Mapping[str, Any]) -> dict[str, Tensor]:
        state = self._to_tensor.preprocess(dict(obs))[STATE_KEY]  # (1, S), size and finiteness checked
        batch: dict[str, Any] = {}
        start = 0
        for key, size in self.state_keys:
            batch[key] = state[:, start : start + size]
            start += size
        for name, key in self.cameras.items():
            frame = obs.get(image_key(name))
            if frame is None:
                raise ProcessorError(
                    f"observation has no camera {name!r}; the policy reads {key!r} (cameras: {', '.join(self.cameras)})",
                    "CAMERA_MISMATCH",
                )
            shape = self.config.image_features[name]
            if hasattr(frame, "decode") and not isinstance(frame, np.ndarray):
                frame = frame.decode(at_least=(int(shape[1]), int(shape[2])))  # wire.images.EncodedImage
            batch[key] = images_to_model(frame, shape)
        out = self.preprocessor(batch)
        return {key: out[key] for key in self._model_keys}

    def postprocess(self, chunk_model: Tensor) -> Tensor:
        chunk = self._to_tensor.chunk_to_cpu(chunk_model)
        robot = self.postprocessor(chunk)
        return torch.as_tensor(robot).to(device="cpu", dtype=torch.float32)[0]

    def reset(self) -> None:
        self.preprocessor.reset()
        self.postprocessor.reset()

    def find(self, step_type: type) -> Any:
        """None: LeRobot's steps are not this module's `ProcessorStep`s (no RTC prefix is prepared for them)."""
        return None


# processor kind (LoadedCheckpoint.processor_kind) -> a NEW session pipeline
PIPELINE_KINDS: dict[str, Any] = {
    "stats": make_stats_pipeline,
    "lerobot": lambda loaded: LeRobotPipeline(loaded.config, loaded.processor_parts),
}


def make_session_pipeline(loaded: LoadedCheckpoint) -> Pipeline | LeRobotPipeline:
    """A NEW pipeline for one session, of the checkpoint's processor kind."""
    return PIPELINE_KINDS[loaded.processor_kind](loaded)


def _fit_rows(prefix: Tensor, horizon: int) -> Tensor:
    if prefix.shape[0] >= horizon:
        return prefix[:horizon]
    return torch.cat([prefix, prefix[-1:].expand(horizon - prefix.shape[0], -1)], dim=0)


def _as_rows(array: Any, action_dim: int, label: str) -> Tensor | None:
    """(L, A) float32 tensor, a single (A,) row as (1, A), or None when absent or empty."""
    if array is None:
        return None
    with np.errstate(over="ignore", invalid="ignore"):  # out of float32's range becomes inf, refused below
        rows = np.asarray(array, dtype=np.float32)
    if rows.size == 0:
        return None
    if rows.ndim == 1 and rows.size == action_dim:
        rows = rows[None]
    if rows.ndim != 2 or rows.shape[1] != action_dim:
        raise ProcessorError(f"{label} has shape {rows.shape}; expected (L, {action_dim})")
    if not np.isfinite(rows).all():
        raise ProcessorError(f"{label} has non-finite values (or values beyond float32's range)")
    return torch.from_numpy(rows.copy())


def prepare_prefix(
    pipeline: Pipeline,
    prefix_model: np.ndarray | None,
    prefix_robot: np.ndarray | None,
    current_state: np.ndarray | None,
    horizon: int,
) -> Tensor | None:
    """The RTC prefix for `predict_action_chunk`: (horizon, A) float32 model space, or None.

    Relative-action policies: the robot-space leftover is re-anchored to the CURRENT raw state
    (`current_state`, or the state cached by this request's preprocess when None) and normalised,
    because the model-space leftover is relative to the previous chunk's anchor. Otherwise
    `prefix_model` is used as is (or `prefix_robot` normalised, when only that is given). The result
    is cut to `horizon` rows or padded by repeating its last row; an empty or absent prefix is None.
    """
    action_dim = pipeline.config.action_dim
    model = _as_rows(prefix_model, action_dim, "prefix_model")
    robot = _as_rows(prefix_robot, action_dim, "prefix_robot")
    normalizer: NormalizeStep = pipeline.find(NormalizeStep)
    relative: RelativeActionsStep | None = pipeline.find(RelativeActionsStep)
    if relative is not None:
        if robot is None:
            if model is not None:
                raise ProcessorError(
                    "a relative-action policy needs prefix_robot to re-anchor the RTC prefix to the "
                    "current state; the model-space prefix is relative to the previous chunk's anchor"
                )
            return None
        if current_state is not None:
            state = torch.as_tensor(np.asarray(current_state, dtype=np.float32)).reshape(-1)
        elif relative.anchor_state is not None:
            state = relative.anchor_state.reshape(-1)
        else:
            raise ProcessorError("prepare_prefix needs current_state (or a preprocess on this pipeline first)")
        if state.shape[0] != pipeline.config.state_dim:
            raise ProcessorError(f"current_state has {state.shape[0]} values; expected {pipeline.config.state_dim}")
        model = normalizer.normalize_action(relative.to_relative(robot, state))
    elif model is None and robot is not None:
        model = normalizer.normalize_action(robot)
    if model is None or horizon < 1:
        return None
    return _fit_rows(model, int(horizon)).contiguous()
