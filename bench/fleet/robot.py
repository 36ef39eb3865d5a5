"""One robot of a shard: the spec the runner writes for it (`robot_spec`), the slot the shard keeps for it
(`RobotSlot`), and the engine it runs (`engine_factory`, `engine_state_name`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


def robot_seed(seed: int, group_index: int, index: int) -> int:
    return int(np.random.SeedSequence([seed, group_index, index]).generate_state(1)[0])


def robot_spec(
    rid: int, group_index: int, index: int, group, seed: int, endpoint: str, seed_group_index: int | None = None
) -> dict:
    """What a shard needs to build one robot and its engine (JSON-able; written by the runner).
    `seed_group_index`: seed the robot as robot `index` of that group (a `seeds_of` baseline)."""
    from bench.scenario.load import checkpoint_dir, engine_config

    engine = engine_config(group, endpoint)  # the config `bench validate` built and the engine accepted
    cams = None
    if group.cameras is not None:
        c = group.cameras
        cams = {"kind": c.kind, "names": list(c.names), "height": c.height, "width": c.width}
    shadow = None
    if getattr(group, "shadow", None):
        shadow = {**group.shadow, "checkpoint": str(checkpoint_dir(group.shadow.get("policy") or group.policy))}
    kind = getattr(group, "engine_kind", "remote")
    sg = group_index if seed_group_index is None else seed_group_index
    return {
        "robot": rid,
        "group": group.name,
        "group_index": group_index,
        "index": index,
        "robot_type": group.robot,
        "gym": getattr(group, "gym", None),  # a gym group's config: the shard makes its type from it
        "fps": group.fps,
        "episode_s": group.episode_s,
        "seed": robot_seed(seed, sg, index),
        "stagger_episodes": bool(getattr(group, "stagger_episodes", False)),
        "cameras": cams,
        "engine": engine,
        "shadow": shadow,
        "engine_kind": kind,
        "checkpoint": str(checkpoint_dir(group.policy)) if kind == "local" else None,
    }


@dataclass
class RobotSlot:
    spec: dict
    rid: int
    engine: object = None
    cameras: list = field(default_factory=list)  # (name, camera)
    state: str = "CONNECTING"
    killed: bool = False
    episode: int = 0
    episode_t0: float = 0.0
    max_age: float = math.inf
    raises: int = 0  # engine calls that raised (the engine never raises: each one is the system failing)
    first_raise: str = ""  # the first one's call and traceback, sent to the runner by the status thread
    raise_sent: bool = False


def make_remote_engine(cfg: dict, pool=None):
    """edge's remote engine for `cfg`; its worker on `pool` (edge.remote.drive.WorkerPool) if given."""
    from edge import RemoteEngineConfig
    from edge import make_engine as _make

    return _make(RemoteEngineConfig.from_dict(dict(cfg)), pool=pool)


def engine_factory(path: str | None):
    """The engine constructor: edge's remote engine, or "module:function" (tests use a fake)."""
    if not path:
        return make_remote_engine
    import importlib

    mod, _, attr = path.partition(":")
    return getattr(importlib.import_module(mod), attr)


_STATE_NAMES: dict = {}  # engine state object -> its name (the loop asks 9000 times a second)


def engine_state_name(engine) -> str:
    st = getattr(engine, "state", None)
    try:
        name = _STATE_NAMES[st]
    except (KeyError, TypeError):
        name = str(getattr(st, "name", None) or getattr(st, "value", None) or str(st)).upper().split(".")[-1]
        try:
            _STATE_NAMES[st] = name
        except TypeError:
            pass
    if getattr(engine, "failed", False):
        return "DEAD"
    return name
