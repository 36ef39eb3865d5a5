"""The policy contract the server runs, and the registry that maps a config word to a class.

    config.json --PolicyConfig--> make_policy --> ChunkPolicy.predict_action_chunk(batch, d[b], prefix[b])
                                                   (model space: normalised in, normalised out)

Owns: `PolicyConfig` (the JSON-serialisable description of a checkpoint), the `ChunkPolicy` ABC,
`register_policy` / `POLICY_REGISTRY` / `make_policy`, and `classify`, which sorts a policy into the
serving classes of design §8.3.

Invariants:
- `inference_delay` and `prefix` are per sample: sample b of a batch is computed exactly as if it
  were alone in a batch of one (so micro-batched sessions keep their own delays and prefixes).
- A policy is "stateless" only if its class opts in with `chunk_stateless = True`; anything unknown
  is "stateful" (exclusive mode), and a class without `predict_action_chunk` never gets past
  `make_policy` (`PolicyLoadError`).
- The type word in config.json, in `register_policy("...")` and in `type_name` is the same word.
"""

from __future__ import annotations

import abc
import dataclasses
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

STATE_KEY = "observation.state"
IMAGE_KEY_PREFIX = "observation.images."
# Hyper-parameters that say how a trained network is sampled or run, not what the network is: a replica's
# manifest may override them (`model.hyper_params`); every other one is fixed by training.
SERVING_HYPER_PARAMS = (
    "num_steps",
    "noise_seed",
    "max_guidance_weight",
    "guidance_jacobian",
    "prefix_schedule",
    "rtc_mode",
    "autocast",
    "batch_buckets",
    "compile",
)

PolicyClass = Literal["stateless", "stateful", "no_chunk_api"]


class PolicyError(Exception):
    """Base class of every error the policies package raises."""


class PolicyLoadError(PolicyError):
    """A policy cannot be served: unknown type, no chunk API, bad checkpoint. Raised at start-up."""


class PolicyConfigError(PolicyError, ValueError):
    """A `PolicyConfig` (or its hyper-parameters) is inconsistent; the message names the field."""


class PolicyInputError(PolicyError, ValueError):
    """A call to `predict_action_chunk` got a batch, delays or prefixes of the wrong shape."""


def image_key(name: str) -> str:
    return IMAGE_KEY_PREFIX + name


@dataclass
class PolicyConfig:
    """Everything needed to rebuild a policy and its processors; stored as a checkpoint's config.json.

    `fps` is the rate the policy was trained at (`trained_fps`). `relative_state_indices[a]` is the
    state dimension that anchors action dimension `a` when `relative_actions` is true (the model
    then predicts `action - state[anchor]`, anchored at the state of the chunk's observation).
    `hyper_params` is per type; `make_policy` fills in the type's defaults so a saved config records
    every value the policy was built with.
    """

    type: str
    state_dim: int
    action_dim: int
    chunk_size: int
    fps: float
    action_names: list[str] = field(default_factory=list)
    state_names: list[str] = field(default_factory=list)
    image_features: dict[str, list[int]] = field(default_factory=dict)
    execution_horizon: int = 10
    relative_actions: bool = False
    relative_state_indices: list[int] = field(default_factory=list)
    hyper_params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.type, str) or not self.type:
            raise PolicyConfigError(f"PolicyConfig.type must be a registered type word, got {self.type!r}")
        for name in ("state_dim", "action_dim", "chunk_size", "execution_horizon"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PolicyConfigError(f"PolicyConfig.{name} must be a positive int, got {value!r}")
        if not isinstance(self.fps, (int, float)) or isinstance(self.fps, bool) or not self.fps > 0:
            raise PolicyConfigError(f"PolicyConfig.fps (trained fps) must be > 0, got {self.fps!r}")
        self.fps = float(self.fps)
        if self.execution_horizon > self.chunk_size:
            raise PolicyConfigError(
                f"PolicyConfig.execution_horizon={self.execution_horizon} exceeds chunk_size="
                f"{self.chunk_size}; a prefix cannot be longer than the chunk it guides"
            )
        self.action_names = list(self.action_names) or [f"action_{i}" for i in range(self.action_dim)]
        self.state_names = list(self.state_names) or [f"state_{i}" for i in range(self.state_dim)]
        for names, dim, label in (
            (self.action_names, self.action_dim, "action"),
            (self.state_names, self.state_dim, "state"),
        ):
            if len(names) != dim:
                raise PolicyConfigError(
                    f"PolicyConfig.{label}_names has {len(names)} names but {label}_dim={dim}; "
                    f"give one name per dimension, in order (or none for generated names)"
                )
            if len(set(names)) != len(names):
                raise PolicyConfigError(f"PolicyConfig.{label}_names has duplicates: {names}")
        self.image_features = {str(k): [int(x) for x in v] for k, v in self.image_features.items()}
        for name, shape in self.image_features.items():
            if not name or "." in name or "/" in name:
                raise PolicyConfigError(
                    f"image feature name {name!r} must be non-empty without '.' or '/'; "
                    f"it becomes the batch key {image_key('<name>')!r}"
                )
            if len(shape) != 3 or shape[0] != 3 or shape[1] < 1 or shape[2] < 1:
                raise PolicyConfigError(
                    f"image feature {name!r} has shape {shape}; expected [3, H, W] (RGB, channels first)"
                )
        self.relative_actions = bool(self.relative_actions)
        self.relative_state_indices = [int(i) for i in self.relative_state_indices]
        if self.relative_actions and len(self.relative_state_indices) != self.action_dim:
            raise PolicyConfigError(
                f"relative_actions=True needs relative_state_indices with one state index per action "
                f"dimension ({self.action_dim}), got {self.relative_state_indices}"
            )
        bad = [i for i in self.relative_state_indices if not 0 <= i < self.state_dim]
        if bad:
            raise PolicyConfigError(f"relative_state_indices {bad} are outside the state (state_dim={self.state_dim})")
        self.hyper_params = dict(self.hyper_params)

    @property
    def trained_fps(self) -> float:
        return self.fps

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        """Canonical JSON (sorted keys), so equal configs give equal bytes and equal hashes."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PolicyConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise PolicyConfigError(f"PolicyConfig has no fields {unknown}; known fields: {sorted(known)}")
        try:
            return cls(**data)
        except TypeError as exc:  # a required field is missing
            raise PolicyConfigError(f"PolicyConfig is incomplete: {exc}") from None

    @classmethod
    def from_json(cls, text: str | bytes) -> PolicyConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PolicyConfigError(f"config.json is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise PolicyConfigError("config.json must hold a JSON object")
        return cls.from_dict(data)


def resolve_hyper_params(config: PolicyConfig, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The type's defaults overlaid with `config.hyper_params`; an unknown key is an error."""
    unknown = sorted(set(config.hyper_params) - set(defaults))
    if unknown:
        raise PolicyConfigError(
            f"hyper_params {unknown} are not known to policy type {config.type!r}; known: {sorted(defaults)}"
        )
    return {**defaults, **config.hyper_params}


class ChunkPolicy(nn.Module, abc.ABC):
    """A policy that maps one observation batch to one action chunk, in model (normalised) space.

    Batch keys: "observation.state" (B, S) float32 normalised; "observation.images.<name>"
    (B, 3, H, W) float in [0, 1] for each declared image feature. Output: (B, T, A) float32.

    Class attributes: `supports_rtc` (honours delay and prefix; otherwise they are validated and
    ignored, and the server downgrades RTC sessions to append mode) and `chunk_stateless` (the
    output depends only on the arguments, never on instance state: safe to share across sessions).
    """

    type_name: ClassVar[str] = ""
    supports_rtc: ClassVar[bool] = False
    chunk_stateless: ClassVar[bool] = False
    # The type's hyper-parameters and their defaults; `config.hyper_params` may override, never add.
    hyper_param_defaults: ClassVar[Mapping[str, Any]] = {}

    def __init__(self, config: PolicyConfig):
        super().__init__()
        hp = self.normalize_hyper_params(resolve_hyper_params(config, self.hyper_param_defaults))
        self.check_hyper_params(config, hp)
        # The saved config records every hyper-parameter, defaults included, so a checkpoint never
        # changes meaning when a later version changes a default.
        self.config = PolicyConfig.from_dict({**config.to_dict(), "hyper_params": hp})
        self.hp = hp

    def override_hyper_params(self, overrides: Mapping[str, Any]) -> None:
        """Serve this network with other sampling hyper-parameters (a manifest's `model.hyper_params`): only
        names in SERVING_HYPER_PARAMS that this type has; the result is checked as at construction (and
        `rtc_mode` against what the network was trained for), and nothing changes when it fails."""
        overrides = dict(overrides)
        unknown = sorted(set(overrides) - set(self.hp))
        if unknown:
            raise PolicyConfigError(
                f"policy type {self.type_name!r} has no hyper-parameter {', '.join(map(repr, unknown))}; "
                f"it has: {', '.join(sorted(self.hp))}"
            )
        fixed = sorted(set(overrides) - set(SERVING_HYPER_PARAMS))
        if fixed:
            raise PolicyConfigError(
                f"{', '.join(map(repr, fixed))} define(s) the trained {self.type_name} network and cannot be changed at "
                f"serving time; a manifest may override only {', '.join(k for k in SERVING_HYPER_PARAMS if k in self.hp)} "
                f"(train a checkpoint with the others: `bench train`)"
            )
        hp = self.normalize_hyper_params({**self.hp, **overrides})
        self.check_hyper_params(self.config, hp)
        previous = dict(self.hp)
        self.hp.clear()
        self.hp.update(hp)
        try:
            if "rtc_mode" in overrides and hasattr(self, "check_rtc_mode"):
                self.check_rtc_mode()  # a network trained for guidance refuses training_time
        except PolicyConfigError:
            self.hp.clear()
            self.hp.update(previous)
            raise
        self.config = PolicyConfig.from_dict({**self.config.to_dict(), "hyper_params": dict(self.hp)})

    @classmethod
    def normalize_hyper_params(cls, hp: dict[str, Any]) -> dict[str, Any]:
        """Canonical forms of resolved hyper-parameters (sorted lists, ...); the default returns them as they are."""
        return hp

    @classmethod
    def check_hyper_params(cls, config: PolicyConfig, hp: Mapping[str, Any]) -> None:
        """Raise `PolicyConfigError` naming the field when resolved hyper-parameters are inconsistent."""

    @abc.abstractmethod
    def predict_action_chunk(
        self,
        batch: dict[str, Tensor],
        inference_delay: Sequence[int],
        prefix: Sequence[Tensor | None],
    ) -> Tensor:
        """(B, T, A) model-space chunk; `inference_delay[b]` and `prefix[b]` ((L, A) or None) per sample."""

    def reset(self) -> None:
        """Clear per-episode instance state. A no-op for chunk-stateless policies."""

    def prepare_serving(self) -> None:
        """Before a server's first forward pass, on the device it runs on: check what serving needs there
        (a compiler for `compile`) and raise PolicyConfigError naming what to do. The default has nothing to check."""

    def training_loss(
        self, batch: dict[str, Tensor], action_chunk: Tensor, generator: torch.Generator | None = None
    ) -> Tensor:
        """Scalar loss of this policy on a normalised (B, T, A) target chunk; used by `train_bc`."""
        raise NotImplementedError(f"policy type {self.type_name!r} cannot be trained by train_bc")

    # Helpers for subclasses -------------------------------------------------------------------

    @property
    def param_device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def param_dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def check_chunk_args(
        self,
        batch: Mapping[str, Tensor],
        inference_delay: Sequence[int],
        prefix: Sequence[Tensor | None],
    ) -> tuple[int, list[int], list[Tensor | None]]:
        """Validate a call; return (B, delays clamped to >= 0, prefixes with empty ones as None)."""
        state = batch.get(STATE_KEY)
        if state is None:
            raise PolicyInputError(f"batch has no {STATE_KEY!r}; keys: {sorted(batch)}")
        if state.ndim != 2 or state.shape[1] != self.config.state_dim:
            raise PolicyInputError(f"{STATE_KEY} has shape {tuple(state.shape)}; expected (B, {self.config.state_dim})")
        size = state.shape[0]
        for name, shape in self.config.image_features.items():
            image = batch.get(image_key(name))
            if image is None:
                raise PolicyInputError(f"batch has no {image_key(name)!r} (declared image feature)")
            if tuple(image.shape) != (size, *shape):
                raise PolicyInputError(
                    f"{image_key(name)} has shape {tuple(image.shape)}; expected ({size}, {', '.join(map(str, shape))})"
                )
        if len(inference_delay) != size or len(prefix) != size:
            raise PolicyInputError(
                f"inference_delay ({len(inference_delay)}) and prefix ({len(prefix)}) need one entry "
                f"per sample (B={size}); pass None in prefix for a sample without one"
            )
        delays = [max(0, int(d)) for d in inference_delay]
        prefixes: list[Tensor | None] = []
        for b, p in enumerate(prefix):
            if p is not None and (p.ndim != 2 or p.shape[1] != self.config.action_dim):
                raise PolicyInputError(
                    f"prefix[{b}] has shape {tuple(p.shape)}; expected (L, {self.config.action_dim})"
                )
            prefixes.append(None if p is None or p.shape[0] == 0 else p)
        return size, delays, prefixes

    def model_inputs(self, batch: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """The batch on this policy's device and dtype (inference tensors cloned into normal ones)."""
        out = {}
        for key, value in batch.items():
            if key == STATE_KEY or key.startswith(IMAGE_KEY_PREFIX):
                if value.is_inference():
                    value = value.clone()
                out[key] = value.to(device=self.param_device, dtype=self.param_dtype)
        return out


POLICY_REGISTRY: dict[str, type[nn.Module]] = {}


def register_policy(type_name: str) -> Callable[[type[nn.Module]], type[nn.Module]]:
    """Class decorator: `@register_policy("flow_matching")` makes config type "flow_matching" build it."""

    def decorate(cls: type[nn.Module]) -> type[nn.Module]:
        existing = POLICY_REGISTRY.get(type_name)
        if existing is not None and existing is not cls:
            raise PolicyLoadError(
                f"policy type {type_name!r} is already registered to {existing.__module__}."
                f"{existing.__qualname__}; pick another type word"
            )
        cls.type_name = type_name
        POLICY_REGISTRY[type_name] = cls
        return cls

    return decorate


def _has_chunk_api(cls: type) -> bool:
    method = getattr(cls, "predict_action_chunk", None)
    return callable(method) and not getattr(method, "__isabstractmethod__", False)


def classify(policy_or_cls: nn.Module | type) -> PolicyClass:
    """Design §8.3: "stateless" (shared mode), "stateful" (exclusive mode) or "no_chunk_api" (refused).

    Stateless is opt-in (`chunk_stateless = True`); a policy that does not say is treated as stateful.
    """
    cls = policy_or_cls if inspect.isclass(policy_or_cls) else type(policy_or_cls)
    if not _has_chunk_api(cls):
        return "no_chunk_api"
    return "stateless" if getattr(cls, "chunk_stateless", False) is True else "stateful"


def policy_class(type_name: str) -> type[ChunkPolicy]:
    """The registered class for a type word, refusing classes the server cannot serve."""
    cls = POLICY_REGISTRY.get(type_name)
    if cls is None:
        raise PolicyLoadError(
            f"unknown policy type {type_name!r}; registered types: {sorted(POLICY_REGISTRY)}. "
            f"Register it with @register_policy({type_name!r}) in server/policies/"
        )
    if classify(cls) == "no_chunk_api":
        raise PolicyLoadError(
            f"policy type {type_name!r} ({cls.__qualname__}) has no predict_action_chunk: the server "
            f"serves whole action chunks (RTC and append merges need them), and a select_action-only "
            f"policy (SAC/SARM-like) cannot be served remotely. Serve a chunking policy instead"
        )
    return cls  # type: ignore[return-value]


def make_policy(config: PolicyConfig) -> ChunkPolicy:
    """A freshly initialised policy for `config` (weights come from `load_checkpoint`)."""
    return policy_class(config.type)(config)
