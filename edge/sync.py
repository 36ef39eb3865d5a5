"""The synchronous baseline: inference inline in `get_action` whenever the queue runs dry.

The control loop pays the whole inference time on those ticks (what a user compares the `rtc` and
`remote` engines against). Append mode: a chunk is executed to its end (or `n_action_steps`), then
the next observation is inferred.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any

from edge.engine import Action, ConfigError, EngineState, config_from_dict, register_engine
from edge.queue import ActionQueue
from edge.rtc import LocalEngine, call_policy


@dataclass
class SyncEngineConfig:
    fps: float = 30.0
    n_action_steps: int | None = None  # actions executed per chunk; None = the whole chunk

    def __post_init__(self) -> None:
        if isinstance(self.fps, bool) or not isinstance(self.fps, (int, float)) or not 0 < self.fps < math.inf:
            raise ConfigError(f"SyncEngineConfig.fps: must be a finite number > 0, got {self.fps!r}")
        if self.n_action_steps is not None and (not isinstance(self.n_action_steps, int) or self.n_action_steps < 1):
            raise ConfigError(
                f"SyncEngineConfig.n_action_steps: must be a positive integer or null, got {self.n_action_steps!r}"
            )

    from_dict = classmethod(config_from_dict)


@register_engine("sync", SyncEngineConfig)
class SyncEngine(LocalEngine):
    def __init__(self, config: SyncEngineConfig, policy=None, shutdown_event: threading.Event | None = None):
        super().__init__("sync", policy)
        self.cfg = config
        self.queue = ActionQueue(rtc_enabled=False)
        self._obs: dict | None = None
        self._episode = 0
        self._inferences = 0
        self._bad_chunks = 0  # chunks the queue refused (non-finite, wrong shape): nothing of them is executed
        self.last_error = ""

    def start(self) -> None:
        self._refuse_restart()
        if self._state == EngineState.STOPPED:
            self._state = self._running_state()

    def stop(self) -> None:
        self._stop.set()
        self.queue.clear()
        self._state = EngineState.STOPPED

    def reset(self) -> None:
        self._episode += 1
        self._clear_queue_and_policy()

    def notify_observation(self, obs: dict[str, Any]) -> None:
        self._obs = obs

    def get_action(self) -> Action | None:
        if self._stop.is_set():
            return None  # stopped: no inference and no action of the finished run
        if self.queue.qsize() == 0 and self._obs is not None and not self._paused:
            model, robot = call_policy(self.policy, self._obs, 0, None)
            n = self.cfg.n_action_steps or len(robot)
            self.queue.clear()
            self._inferences += 1
            try:
                self.queue.merge(model[:n], robot[:n], 0)
            except ValueError as exc:  # a NaN, inf or misshapen chunk: this tick gets nothing, never that chunk
                self._bad_chunks += 1  # counted, not logged: this is the control thread
                self.last_error = f"bad chunk: {exc}"
                return None
        item = self.queue.get_with_meta()
        if item is None:
            return None
        values, _meta, index = item
        return Action(values, "chunk", "", self._inferences, self._episode, index, None)

    @property
    def ready(self) -> bool:
        return self._state != EngineState.STOPPED

    @property
    def failed(self) -> bool:
        return False

    @property
    def stats(self) -> dict[str, Any]:
        return {
            "inferences": self._inferences,
            "bad_chunks": self._bad_chunks,
            "qsize": self.queue.qsize(),
            "last_error": self.last_error,
        }
