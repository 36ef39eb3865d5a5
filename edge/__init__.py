"""The edge engine: what a robot's control loop calls every tick (`get_action()` never blocks).

Backends by type word: `sync` (inline), `rtc` (local thread), `remote` (the network, design 9).
`make_engine(config)` builds the one a config names; `edge.client` is the plain client API.
No torch here: the edge installs with numpy, msgpack and zenoh only.
"""

from edge.engine import (
    Action,
    ConfigError,
    Engine,
    EngineState,
    EngineStopped,
    FallbackBehavior,
    engine_types,
    make_engine,
    register_engine,
)
from edge.latency import LatencyTracker
from edge.queue import ActionQueue
from edge.remote import RemoteEngine, RemoteEngineConfig

__all__ = [
    "Action",
    "ActionQueue",
    "ConfigError",
    "Engine",
    "EngineState",
    "EngineStopped",
    "FallbackBehavior",
    "LatencyTracker",
    "RemoteEngine",
    "RemoteEngineConfig",
    "engine_types",
    "make_engine",
    "register_engine",
]
