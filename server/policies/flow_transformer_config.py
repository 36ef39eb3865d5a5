"""flow_transformer's hyper_params: their defaults, the presets (`tiny` for a CPU, `vla_300m` for a GPU),
the allowed values and the checks a config must pass before a network is built."""

from __future__ import annotations

from typing import Any

from server.policies.base import PolicyConfig, PolicyConfigError
from server.policies.flow_matching import DEFAULTS as FLOW_MATCHING_DEFAULTS
from server.policies.flow_matching import PREFIX_SCHEDULES

DEFAULTS: dict[str, Any] = {
    "d_model": 64,
    "num_heads": 4,
    "num_layers": 2,  # action expert blocks (self + cross attention + MLP)
    "obs_layers": 1,  # encoder blocks over the observation tokens
    "mlp_ratio": 2,
    "image_encoder": "conv",  # "conv": strided convs pooled to a grid; "vit": patches + positions
    "image_grid": 2,  # conv: grid x grid tokens per camera
    "patch_size": 16,  # vit: patch side in pixels (the image side must be a multiple)
    "num_steps": 10,
    "noise_seed": 0,  # None: fresh noise from torch's global RNG on every call
    "max_guidance_weight": 10.0,
    "guidance_jacobian": "network",  # or "identity" (LeRobot main's effective behaviour)
    "prefix_schedule": "linear",  # LeRobot's ramp; "exp": the RTC paper's soft mask (eq. 5)
    "autocast": "bf16",  # on CUDA only: "bf16" or "none"
    "batch_buckets": [],  # e.g. [1, 8, 16, 32, 64]: pad a batch to the next size (compile; none: COMPILE_BUCKETS)
    "compile": False,  # torch.compile the velocity network (CUDA: CUDA graphs; CPU: inductor's C++, needs g++)
    # "guidance" | "training_time" and its training prefix bound, as flow_matching's (module docstring)
    **{name: FLOW_MATCHING_DEFAULTS[name] for name in ("rtc_mode", "max_prefix_rows")},
}

PRESETS: dict[str, dict[str, Any]] = {
    # trains on the reacher demos on one CPU thread in minutes (bench/training/train.py)
    "tiny": {"d_model": 64, "num_heads": 4, "num_layers": 2, "obs_layers": 1, "mlp_ratio": 2},
    # a pi0-sized action expert (14 adaLN blocks of width 1024) over a ViT stem, for 2 x 224x224 cameras
    "vla_300m": {
        "d_model": 1024,
        "num_heads": 16,
        "num_layers": 14,
        "obs_layers": 2,
        "mlp_ratio": 4,
        "image_encoder": "vit",
        "patch_size": 16,
        "batch_buckets": [1, 8, 16, 32, 64],
    },
}
# `compile` without `batch_buckets`: powers of two up to the largest batch P10's sweeps use (a larger batch compiles
# its own size); set `batch_buckets` to pad less (an eager pass gains nothing from padding)
COMPILE_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
IMAGE_ENCODERS = ("conv", "vit")
AUTOCASTS = ("bf16", "none")
GUIDANCE_JACOBIANS = ("network", "identity")


def _check_hyper_params(config: PolicyConfig, hp: dict[str, Any]) -> None:
    for name in ("d_model", "num_heads", "num_layers", "mlp_ratio", "num_steps", "image_grid", "patch_size"):
        value = hp[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PolicyConfigError(f"flow_transformer {name}={value!r} must be a positive int")
    if isinstance(hp["obs_layers"], bool) or not isinstance(hp["obs_layers"], int) or hp["obs_layers"] < 0:
        raise PolicyConfigError(f"flow_transformer obs_layers={hp['obs_layers']!r} must be an int >= 0")
    if hp["d_model"] % hp["num_heads"] or hp["d_model"] % 2:
        raise PolicyConfigError(
            f"flow_transformer d_model={hp['d_model']} must be even and a multiple of num_heads={hp['num_heads']}"
        )
    for name, allowed in (
        ("image_encoder", IMAGE_ENCODERS),
        ("autocast", AUTOCASTS),
        ("guidance_jacobian", GUIDANCE_JACOBIANS),
        ("prefix_schedule", PREFIX_SCHEDULES),
    ):
        if hp[name] not in allowed:
            raise PolicyConfigError(f"flow_transformer {name}={hp[name]!r}; use one of {allowed}")
    if any(b < 1 for b in hp["batch_buckets"]):
        raise PolicyConfigError(f"flow_transformer batch_buckets {hp['batch_buckets']} must be positive ints")
    if hp["image_encoder"] == "vit":
        patch = hp["patch_size"]
        for name, (_, height, width) in config.image_features.items():
            if height % patch or width % patch:
                raise PolicyConfigError(
                    f"flow_transformer vit: camera {name!r} is {height}x{width}, not a multiple of "
                    f"patch_size={patch}; declare another image size or patch size"
                )


def preset_hyper_params(name: str, **overrides: Any) -> dict[str, Any]:
    """A preset's hyper_params (with overrides): `PolicyConfig(type="flow_transformer", hyper_params=...)`."""
    if name not in PRESETS:
        raise PolicyConfigError(f"flow_transformer preset {name!r} unknown; presets: {sorted(PRESETS)}")
    return {**PRESETS[name], **overrides}
