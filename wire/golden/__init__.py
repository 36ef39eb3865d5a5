"""Golden vectors: one deterministic message per kind, encoded, checked in as hex.

    python -m wire.golden --regenerate

REGENERATING IS A SCHEMA CHANGE. If the bytes of an existing vector change, clients in the field
decode differently: decide whether that needs a `SCHEMA_VERSION` bump (wire/version.py) before
committing new vectors. Adding a vector for a new message kind is fine.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from wire.header import Header, MsgType
from wire.images import EncodedImage
from wire.messages import (
    ActionChunk,
    DrainNotice,
    Error,
    Observation,
    Reset,
    ResetAck,
    SessionAck,
    SessionOpen,
    Status,
    StatusRequest,
)
from wire.version import SCHEMA_VERSION

VECTORS_PATH = Path(__file__).with_name("vectors.json")
_MODEL = dict(
    replica_id="r0",
    model_id="arm-flow",
    revision="main",
    checkpoint_hash="9f2c" * 16,
    policy_type="flow_matching",
    action_names=["j0", "j1"],
    state_dim=3,
    cameras={"front": [4, 4, 3]},
    chunk_size=4,
    trained_fps=30.0,
    supports_rtc=True,
    serving_mode="shared",
    warmed_up=True,
    active_sessions=1,
    max_sessions=8,
    load=0.125,
)


def golden_messages() -> dict[str, tuple[Header, object]]:
    """name -> (header, message): fixed values, so encoding them is deterministic."""
    state = np.array([0.5, -1.0, 2.0], dtype=np.float32)
    chunk = np.arange(8, dtype=np.float32).reshape(4, 2) / 8
    prefix = np.full((2, 2), 0.25, dtype=np.float32)
    raw = EncodedImage("raw", bytes(range(48)), (4, 4, 3))
    v = SCHEMA_VERSION
    return {
        "observation": (
            Header(v, MsgType.OBS, 7, 2, 123456789, 1),
            Observation(
                "s-1",
                state,
                images={"front": raw},
                task="reach",
                inference_delay_steps=3,
                prefix_model=prefix,
                prefix_robot=prefix,
                episode_start=True,
                urgency=0.75,
                priority=1,
                steps_remaining=12,
                metadata={"site": "eu"},
            ),
        ),
        "action_chunk": (
            Header(v, MsgType.CHUNK, 7, 2, 123456789, 1),
            ActionChunk(
                "s-1",
                7,
                123456789,
                chunk,
                chunk + 1,
                queue_wait_ms=1.5,
                inference_ms=20.0,
                superseded_seqs=1,
                server_load=0.125,
                rtc_applied=True,
            ),
        ),
        "status": (
            Header(v, MsgType.CONTROL),
            Status(**_MODEL, ready=True, schema_min=1, schema_max=1, default_task="reach", execution_horizon=2),
        ),
        "status_request": (Header(v, MsgType.CONTROL), StatusRequest("robot-1")),
        "session_open": (
            Header(v, MsgType.CONTROL),
            SessionOpen(
                "robot-1",
                v,
                30.0,
                ["j0", "j1"],
                3,
                cameras={"front": [4, 4, 3]},
                task="reach",
                rtc_enabled=True,
                execution_horizon=2,
                tags={"site": "eu"},
            ),
        ),
        "session_ack": (
            Header(v, MsgType.CONTROL),
            SessionAck(
                **_MODEL,
                session_id="s-1",
                schema_version=v,
                rtc_enabled=True,
                execution_horizon=2,
                task="reach",
                warnings=["fps 25 differs from trained 30"],
            ),
        ),
        "reset": (Header(v, MsgType.CONTROL, 0, 3), Reset("s-1", 3)),
        "reset_ack": (Header(v, MsgType.CONTROL, 0, 3), ResetAck("s-1", 3)),
        "error": (
            Header(v, MsgType.CONTROL),
            Error(
                "CAPACITY",
                "replica r0 is full (8/8); try another replica",
                {"active_sessions": 8, "max_sessions": 8, "load": 1.0},
            ),
        ),
        "drain": (Header(v, MsgType.EVENT), DrainNotice("r0", "SIGTERM", 10000.0)),
    }


def encode_all() -> dict[str, dict[str, str]]:
    return {name: {"header": h.pack().hex(), "body": m.encode().hex()} for name, (h, m) in golden_messages().items()}


def load_vectors() -> dict[str, dict[str, str]]:
    return json.loads(VECTORS_PATH.read_text())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv != ["--regenerate"]:
        print(__doc__)
        return 2
    VECTORS_PATH.write_text(json.dumps(encode_all(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {VECTORS_PATH}")
    return 0
