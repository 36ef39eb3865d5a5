"""The local RTC engine (LeRobot's RTCInferenceEngine): a background thread, a latest-only slot, a queue.

    control thread: notify_observation ──► slot (obs + the queue's snapshot on its tick) ;  get_action ◄── ActionQueue
    inference thread: when qsize <= queue_threshold:
        idx_before, leftover as on the observation's tick ──► delay = ceil(tracker.max()/dt) ──► policy.predict_action_chunk(obs,
        delay, prefix = leftover cut/padded to execution_horizon) ──► merge(ceil(latency/dt), idx_before)

The policy is any object with `predict_action_chunk(obs, inference_delay, prefix)` returning a
model-space (T, A) array or a pair (model, robot); an optional `postprocess(model, obs)` gives the
robot-space chunk. `server.runtime.LocalPredictor` is the server's own path in this shape, which is
how the `remote` engine is checked against this one (golden parity).

`step_once()` runs exactly one inference cycle on the caller's thread (tests, parity); a `clock` or
a `latency_override(n)` (seconds for the n-th request) makes delays deterministic.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge.engine import Action, ConfigError, Engine, EngineState, EngineStopped, config_from_dict, register_engine
from edge.latency import LATENCY_MODES, LatencyTracker
from edge.queue import TRIM_MODES, ActionQueue, fit_prefix

log = logging.getLogger(__name__)


@dataclass
class RTCEngineConfig:
    fps: float = 30.0
    rtc_enabled: bool = True
    execution_horizon: int = 10
    buffer_time_s: float = 0.5
    queue_threshold: int | None = None  # steps; default ceil(buffer_time_s * fps)
    trim: str = "consumed"  # the remote engine's default (edge.remote.RemoteEngineConfig.trim)
    latency_mode: str = "percentile"  # as edge.remote.RemoteEngineConfig
    latency_window: int = 100
    error_retry_s: float = 0.5
    max_consecutive_errors: int = 10

    def __post_init__(self) -> None:
        for name in ("fps", "buffer_time_s", "error_retry_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
                raise ConfigError(f"{type(self).__name__}.{name}: must be a finite number > 0, got {v!r}")
        if self.trim not in TRIM_MODES:
            raise ConfigError(f"{type(self).__name__}.trim: {self.trim!r} is not one of {TRIM_MODES}")
        if self.latency_mode not in LATENCY_MODES:
            raise ConfigError(
                f"{type(self).__name__}.latency_mode: {self.latency_mode!r} is not one of {LATENCY_MODES}"
            )
        for name in ("execution_horizon", "max_consecutive_errors", "latency_window"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{type(self).__name__}.{name}: must be a positive integer, got {v!r}")
        if self.queue_threshold is None:
            self.queue_threshold = int(math.ceil(self.buffer_time_s * self.fps))

    from_dict = classmethod(config_from_dict)


def call_policy(policy, obs: dict, delay: int, prefix: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    out = policy.predict_action_chunk(obs, delay, prefix)
    if isinstance(out, tuple):
        model, robot = out
    else:
        model = out
        robot = policy.postprocess(model, obs) if hasattr(policy, "postprocess") else model
    return np.asarray(model, np.float32), np.asarray(robot, np.float32)


class LocalEngine(Engine):
    """What the two in-process engines (`sync`, `rtc`) share: a policy called here, an ActionQueue, pause and
    the state word, the run-once lifecycle (edge.engine.Engine). A subclass sets `self.queue` and owns its own
    episode counting."""

    def __init__(self, type_name: str, policy) -> None:
        if policy is None or not hasattr(policy, "predict_action_chunk"):
            raise ConfigError(
                f"the {type_name} engine needs a policy with predict_action_chunk(obs, inference_delay, prefix)"
            )
        self.type_name = type_name
        self.policy = policy
        self._paused = False
        self._state = EngineState.STOPPED
        self._stop = threading.Event()  # set by stop(), never cleared: an engine runs once

    def _refuse_restart(self) -> None:
        if self._stop.is_set() or self._state == EngineState.DEAD:
            raise EngineStopped(self.type_name, self._state)

    def _running_state(self) -> EngineState:
        """What start() sets: PAUSED if pause() came before it, else STREAMING."""
        return EngineState.PAUSED if self._paused else EngineState.STREAMING

    def _clear_queue_and_policy(self) -> None:
        """The episode boundary's common part: no action of the finished episode, the policy's own state reset."""
        self.queue.clear()
        if hasattr(self.policy, "reset"):
            self.policy.reset()

    def pause(self) -> None:
        self._paused = True
        if self._state not in (EngineState.STOPPED, EngineState.DEAD):  # before start() it is kept for start()
            self._state = EngineState.PAUSED

    def resume(self) -> None:
        self._paused = False
        if self._state == EngineState.PAUSED:
            self._state = EngineState.STREAMING

    @property
    def state(self) -> EngineState:
        return self._state


@register_engine("rtc", RTCEngineConfig)
class RTCEngine(LocalEngine):
    def __init__(
        self,
        config: RTCEngineConfig,
        policy=None,
        shutdown_event: threading.Event | None = None,
        clock: Callable[[], float] = time.monotonic,
        latency_override: Callable[[int], float] | None = None,
    ):
        super().__init__("rtc", policy)
        self.cfg = config
        self.clock = clock
        self.latency_override = latency_override  # request n -> seconds (parity tests inject delays)
        self.dt = 1.0 / config.fps
        self.shutdown_event = shutdown_event
        self.queue = ActionQueue(config.rtc_enabled, config.trim)
        self.tracker = LatencyTracker(config.latency_window, config.latency_mode)
        self._slot: tuple[dict, int, tuple[int, int]] | None = None  # (obs, version, queue snapshot on its tick)
        self._slot_lock = threading.Lock()
        self._version = 0
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._reset_epoch = 0
        self._episode = 0
        self._errors_in_row = 0
        self.counters = {"inferences": 0, "errors": 0, "none_ticks": 0, "discarded_chunks": 0, "bad_chunks": 0}
        self.merges: list[dict] = []  # per merge: delay, real_delay, trimmed (parity tests read it)

    def start(self) -> None:
        self._refuse_restart()
        if self._thread is None:
            self._state = self._running_state()
            self._thread = threading.Thread(target=self._run, name="rtc-engine", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10)
        self.queue.clear()  # the run is over: none of its actions is executed after it
        if self._state != EngineState.DEAD:
            self._state = EngineState.STOPPED

    def reset(self) -> None:
        with self._slot_lock:  # an observation notified before the reset belongs to the finished episode
            self._reset_epoch += 1
            self._episode += 1
            self._slot = None
        self._clear_queue_and_policy()

    def resume(self) -> None:
        super().resume()
        self._wake.set()

    def notify_observation(self, obs: dict[str, Any]) -> None:
        with self._slot_lock:
            self._version += 1
            self._slot = (obs, self._version, self.queue.snapshot())  # the queue on this tick, before get_action
        self._wake.set()

    def get_action(self) -> Action | None:
        # stopped or DEAD: nothing from the queue (a merge racing stop() may have refilled it)
        item = None if self._stop.is_set() or self._state == EngineState.DEAD else self.queue.get_with_meta()
        if item is None:
            self.counters["none_ticks"] += 1
            return None
        values, meta, index = item
        return Action(values, "chunk", "", meta, self._episode, index, None)

    @property
    def ready(self) -> bool:
        return self._thread is not None and self._state != EngineState.DEAD and not self._stop.is_set()

    @property
    def failed(self) -> bool:
        return self._state == EngineState.DEAD

    @property
    def stats(self) -> dict[str, Any]:
        return {
            **self.counters,
            "qsize": self.queue.qsize(),
            "latency_max_s": self.tracker.max(),
            "state": self._state.value,
        }

    # --- inference ---------------------------------------------------------------------------------

    def step_once(self) -> bool:
        """One inference cycle on the latest observation; False if there was none."""
        with self._slot_lock:
            slot, epoch = self._slot, self._reset_epoch
        if slot is None:
            return False
        obs, _, at_obs = slot
        t0 = self.clock()
        # the leftover and index on the observation's tick (edge.queue: the chunk's row 0 is that tick's)
        left_over, _, idx_before = self.queue.left_over_since(at_obs)  # the queue now if a merge came since
        prefix = fit_prefix(left_over, self.cfg.execution_horizon) if self.cfg.rtc_enabled else None
        delay = int(math.ceil(self.tracker.max() / self.dt - 1e-9))
        model, robot = call_policy(self.policy, obs, delay, prefix)
        self.counters["inferences"] += 1
        latency = self.clock() - t0
        if self.latency_override is not None:
            latency = float(self.latency_override(self.counters["inferences"]))
        real_delay = int(math.ceil(latency / self.dt - 1e-9))
        if epoch != self._reset_epoch:
            self.counters["discarded_chunks"] += 1  # a reset happened during inference
            return True
        try:
            trimmed = self.queue.merge(model, robot, real_delay, idx_before, meta=self.counters["inferences"])
        except ValueError:  # non-finite or misshapen: refused whole; _run counts it as a failed inference too
            self.counters["bad_chunks"] += 1
            raise
        self.tracker.add(latency)
        self.merges.append({"delay": delay, "real_delay": real_delay, "trimmed": trimmed, "idx_before": idx_before})
        return True

    def _run(self) -> None:
        last_version = -1
        while not self._stop.is_set():
            self._wake.clear()
            with self._slot_lock:
                version = self._slot[1] if self._slot else -1
            if self._paused or version == last_version or self.queue.qsize() > self.cfg.queue_threshold:
                self._wake.wait(0.1)
                continue
            last_version = version
            try:
                self.step_once()
                self._errors_in_row = 0
            except Exception as exc:
                self.counters["errors"] += 1
                self._errors_in_row += 1
                log.warning("rtc engine: inference failed (%d in a row): %s", self._errors_in_row, exc)
                if self._errors_in_row >= self.cfg.max_consecutive_errors:
                    self._state = EngineState.DEAD  # failed, and nothing is executed from here on; the event last
                    if self.shutdown_event is not None:
                        self.shutdown_event.set()
                    return
                self._stop.wait(self.cfg.error_retry_s)
