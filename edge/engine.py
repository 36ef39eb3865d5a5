"""The engine interface every backend implements, its states, the action it returns, the registry.

    control thread                          backend (sync | rtc | remote)
    notify_observation(obs) ──► slot ──►    [inference: inline, thread, or network worker]
    get_action() ◄── Action | None ◄──      ActionQueue (edge.queue)

A control loop calls `notify_observation` then `get_action` every tick and never learns which
backend runs (LeRobot's rollout shape). Invariant: `get_action()` never blocks on I/O and never
raises for a network or server fault; it returns an `Action` (with provenance) or None.

Backends register a config dataclass under a type word (`sync`, `rtc`, `remote`);
`make_engine(config)` builds the engine its type names.
"""

from __future__ import annotations

import dataclasses
import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from wire.configerrors import show


class EngineState(str, enum.Enum):
    """States of 9.2 (plus STOPPED/PAUSED for the lifecycle around them)."""

    STOPPED = "STOPPED"  # before start() / after stop() (final then: an engine runs once)
    CONNECTING = "CONNECTING"
    STREAMING = "STREAMING"
    DEGRADED = "DEGRADED"  # requests failing, queue still holds actions
    STALLED = "STALLED"  # queue empty or staleness bound hit: fallback applies
    RECONNECTING = "RECONNECTING"
    PAUSED = "PAUSED"
    DEAD = "DEAD"  # failed=True; never leaves this state


class FallbackBehavior(str, enum.Enum):
    """What `get_action` returns when no fresh action exists (STALLED)."""

    HOLD = "hold"  # None: the robot driver sends nothing
    REPEAT_LAST = "repeat_last"  # the last returned action again
    ZERO = "zero"  # zeros: the safe choice for velocity-controlled robots


@dataclass(frozen=True, slots=True)
class Action:
    """One action for one tick, with where it came from.

    source: "chunk" for a queued action, or the fallback word ("repeat_last", "zero") when it is a
    fallback. age_s: seconds since the observation the chunk answered was taken (monotonic).
    """

    values: np.ndarray
    source: str = "chunk"
    session_id: str = ""
    seq_id: int | None = None
    episode_id: int | None = None
    chunk_index: int | None = None
    age_s: float | None = None

    @property
    def is_fallback(self) -> bool:
        return self.source != "chunk"


def _fast_init(cls):
    """Give the frozen dataclass `cls` (Action) an `__init__` that stores each field through its slot's descriptor.

    The generated frozen `__init__` calls `object.__setattr__(self, name, value)` per field (a global, an
    attribute lookup and a generic set each): about 2 us for Action's seven, on every tick of every robot. This
    one takes the same parameters with the same defaults and stores the same values, only through the slot
    descriptors themselves (bound once, here); the class stays what it was (frozen: assigning a field after
    construction raises FrozenInstanceError; fields, repr, eq, replace unchanged) and has no __post_init__ to
    skip. A field added to the class and not here fails at import.
    """
    names = ("values", "source", "session_id", "seq_id", "episode_id", "chunk_index", "age_s")
    if tuple(f.name for f in dataclasses.fields(cls)) != names or hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}'s fields changed: update edge.engine._fast_init")
    s0, s1, s2, s3, s4, s5, s6 = (cls.__dict__[n].__set__ for n in names)

    def __init__(
        self,
        values: np.ndarray,
        source: str = "chunk",
        session_id: str = "",
        seq_id: int | None = None,
        episode_id: int | None = None,
        chunk_index: int | None = None,
        age_s: float | None = None,
    ) -> None:
        s0(self, values)
        s1(self, source)
        s2(self, session_id)
        s3(self, seq_id)
        s4(self, episode_id)
        s5(self, chunk_index)
        s6(self, age_s)

    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    __init__.__module__ = cls.__module__
    cls.__init__ = __init__
    return cls


_fast_init(Action)


class Engine(ABC):
    """One inference backend. See the module docstring for the thread contract.

    Lifecycle: an engine runs once, as a session does. `start()` again while it runs does nothing; after
    `stop()` (or DEAD) it raises `EngineStopped`: build a new engine. A stopped or DEAD engine executes nothing
    from its queue (`get_action()` gives what it gives with nothing fresh: the fallback, or None); `reset`,
    `pause`, `resume` and `notify_observation` before `start()` or after `stop()` raise nothing and start nothing.
    """

    @abstractmethod
    def start(self) -> None:
        """Start the backend; raises EngineStopped after stop() or DEAD (an engine runs once)."""

    @abstractmethod
    def stop(self) -> None: ...

    @abstractmethod
    def reset(self) -> None:
        """Episode boundary: clear the queue, bump the episode; latency history survives."""

    @abstractmethod
    def pause(self) -> None:
        """Stop requesting new chunks; the queue is kept."""

    @abstractmethod
    def resume(self) -> None: ...

    @abstractmethod
    def notify_observation(self, obs: dict[str, Any]) -> None:
        """Latest-only: `obs` replaces any observation not yet used. Keys: state, images, task..."""

    @abstractmethod
    def get_action(self) -> Action | None: ...

    @property
    @abstractmethod
    def ready(self) -> bool: ...

    @property
    @abstractmethod
    def failed(self) -> bool: ...

    @property
    @abstractmethod
    def state(self) -> EngineState: ...

    @property
    @abstractmethod
    def stats(self) -> dict[str, Any]: ...

    def drain_records(self) -> list[dict]:
        """Per-request records since the last call (bench collection); default none."""
        return []

    def drain_transitions(self) -> list[tuple]:
        """(t_mono, from_state, to_state, reason) since the last call; default none."""
        return []


class ConfigError(ValueError):
    """A config field has a bad value; the message names the field and the fix."""


class EngineStopped(RuntimeError):
    """`start()` on an engine that was stopped or is DEAD: an engine runs once, as a session does. Restarting one
    in place would resume a closed session's episode, queue and counters; a new engine starts clean."""

    def __init__(self, type_name: str, state: EngineState, why: str = ""):
        was = "was stopped" if state == EngineState.STOPPED else f"is {state.value}" + (f" ({why})" if why else "")
        super().__init__(
            f"start(): this {type_name} engine {was}, and an engine runs once; build a new one with "
            f"make_engine(config) and start that"
        )


def config_from_dict(cls: type, d: dict):
    """`cls(**d)` for a backend's config dataclass (its `from_dict`); anything but a mapping, or a key it has no
    field for, is a ConfigError (the latter lists the known ones)."""
    known = {f.name for f in dataclasses.fields(cls)}
    if not isinstance(d, Mapping):
        raise ConfigError(
            f"{cls.__name__}: the config must be a mapping of field names to values, e.g. "
            f"{{fps: 30}}, got {show(d)}; fields: {', '.join(sorted(known))}"
        )
    unknown = sorted(set(d) - known, key=str)
    if unknown:
        raise ConfigError(f"{cls.__name__}: unknown keys {unknown}; known: {', '.join(sorted(known))}")
    return cls(**d)


_REGISTRY: dict[str, tuple[type, Callable[[Any], Engine]]] = {}


def register_engine(type_name: str, config_cls: type):
    """Class decorator: `@register_engine("rtc", RTCEngineConfig)` on the engine class."""

    def deco(engine_cls):
        _REGISTRY[type_name] = (config_cls, engine_cls)
        config_cls.type = type_name
        return engine_cls

    return deco


def engine_types() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def config_class(type_name: str) -> type:
    _load_builtin()
    if type_name not in _REGISTRY:
        raise ConfigError(f"unknown engine type {type_name!r}; known: {sorted(_REGISTRY)}")
    return _REGISTRY[type_name][0]


def make_engine(config: Any, **kwargs) -> Engine:
    """Build the engine registered for `config`'s class (kwargs go to its constructor, e.g. policy)."""
    _load_builtin()
    for cfg_cls, engine_cls in _REGISTRY.values():
        if type(config) is cfg_cls:
            return engine_cls(config, **kwargs)
    raise ConfigError(f"no engine registered for {type(config).__name__}; known types: {sorted(_REGISTRY)}")


def _load_builtin() -> None:
    import importlib

    for mod in ("edge.sync", "edge.rtc", "edge.remote"):
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name != mod:  # a real missing dependency inside the module
                raise
