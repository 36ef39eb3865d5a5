"""Torch policies the server runs: the contract, the registry, checkpoints and training.

    base.py         PolicyConfig, ChunkPolicy, register_policy / make_policy / classify
    flow_matching.py, flow_transformer.py, mlp_chunk.py, stateful_chunk.py, no_chunk.py   one type each
    flow_transformer_config.py, flow_transformer_compile.py, transformer_blocks.py   flow_transformer's parts
    checkpoint.py   config.json + model.safetensors + stats.json, local paths only, hashed
    lerobot.py      LeRobot save_pretrained directories, served by LeRobot's classes (imported only then)
    lerobot_random.py  small random-weight LeRobot checkpoints (tests, benchmarks)
    stats.py        normalisation stats (stats.json)
    train.py        train_bc: behaviour cloning into a checkpoint

Importing this package registers every shipped type. Server side only: it imports torch.
"""

from server.policies import flow_matching, flow_transformer, mlp_chunk, no_chunk, stateful_chunk  # noqa: F401  (registration)
from server.policies.base import (
    POLICY_REGISTRY,
    ChunkPolicy,
    PolicyConfig,
    PolicyConfigError,
    PolicyError,
    PolicyInputError,
    PolicyLoadError,
    classify,
    make_policy,
    register_policy,
)
from server.policies.checkpoint import CheckpointError, LoadedCheckpoint, load_checkpoint, save_checkpoint
from server.policies.train import TrainingError, train_bc

__all__ = [
    "POLICY_REGISTRY",
    "CheckpointError",
    "ChunkPolicy",
    "LoadedCheckpoint",
    "PolicyConfig",
    "PolicyConfigError",
    "PolicyError",
    "PolicyInputError",
    "PolicyLoadError",
    "TrainingError",
    "classify",
    "load_checkpoint",
    "make_policy",
    "register_policy",
    "save_checkpoint",
    "train_bc",
]
