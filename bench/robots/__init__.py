"""Robot twins for the bench: registered robot types, each a gymnasium.Env, plus a fleet stepper.

    make_robot("arm", seed=0)        -> TwinEnv (gymnasium.Env), step(None) = no new command
    RobotBatch("reacher", 300)       -> 300 robots stepped in lockstep, same semantics as TwinEnv
    ROBOT_TYPES / register_robot     -> one file per robot type: arm.py, reacher.py, base.py
    plugins.py                       -> users' types: entry points `fleet_inference.robots`, `module:Class`
    gymenv.py                        -> any Gymnasium env as a type, from a scenario's `gym:` (one env a robot)

Each robot type's MjModel is compiled once per process (models.py); robots own only their MjData.
"""

# First: the GL backend is chosen before anything here imports mujoco (MuJoCo reads MUJOCO_GL once, at import).
from bench.robots import models  # noqa: I001  isort: skip

# Importing a robot type's module registers it (after core: each module imports register_robot).
from bench.robots import arm, base, plugins, reacher  # noqa: E402,F401
from bench.robots.core import (
    DEFAULT_FPS,
    ROBOT_TYPES,
    RobotBatch,
    RobotType,
    RobotView,
    TwinEnv,
    make_robot,
    register_robot,
    robot_type,
)
from bench.robots.models import shared_model

__all__ = [
    "DEFAULT_FPS",
    "ROBOT_TYPES",
    "RobotBatch",
    "RobotType",
    "RobotView",
    "TwinEnv",
    "make_robot",
    "register_robot",
    "robot_type",
    "shared_model",
]
