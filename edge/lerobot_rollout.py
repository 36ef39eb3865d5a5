"""RemoteInferenceEngine: the remote engine behind LeRobot's rollout, one more `InferenceEngine` backend (design 9).

    lerobot-rollout control thread            this adapter                     edge.remote.RemoteEngine
    get_action(obs_frame) ──► frame_to_observation ──► notify_observation(obs) ──► worker ──► server
    torch.Tensor | None   ◄── action_to_tensor     ◄── get_action() -> Action | None

LeRobot's rollout calls `get_action(obs_frame)` once per policy tick with the dataset frame of that tick
(`observation.state`, `observation.images.<cam>`) and wants the next action as a 1-D tensor in its
`ordered_action_keys` order, or None. The adapter publishes the frame as this tick's observation, then
returns what our engine gives. Invariant: as in `edge.engine`, `get_action` never does I/O and never raises
for a network or server fault. Importing this module imports neither torch nor LeRobot (the edge's plain
install has neither); `RemoteInferenceEngine` is built on first use over LeRobot's own ABC.
"""

from __future__ import annotations

import bisect
import threading
import time
from typing import Any

import numpy as np

from edge.engine import Action, ConfigError, Engine, make_engine

STATE_KEY = "observation.state"
IMAGE_PREFIX = "observation.images."
_torch = None


def _torch_module():
    global _torch
    if _torch is None:
        import torch

        _torch = torch
    return _torch


def _numpy(x: Any) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "detach"):  # a torch tensor, on any device
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _image_hwc_uint8(cam: str, x: Any) -> np.ndarray:
    """LeRobot's two image conventions to ours: float CHW in [0, 1] (dataset / processor side) or uint8 HWC
    (camera side), either with a leading batch of 1."""
    a = _numpy(x)
    if a.ndim == 4 and a.shape[0] == 1:
        a = a[0]
    if a.ndim != 3:
        raise ValueError(
            f"observation.images.{cam}: expected one image (C,H,W float or H,W,C uint8), got shape {a.shape}"
        )
    if a.dtype == np.uint8:
        return a if a.shape[-1] in (1, 3, 4) else np.ascontiguousarray(a.transpose(1, 2, 0))
    if np.issubdtype(a.dtype, np.floating):
        if a.shape[0] in (1, 3, 4):
            a = a.transpose(1, 2, 0)
        elif a.shape[-1] not in (1, 3, 4):
            raise ValueError(f"observation.images.{cam}: no channel axis of 1, 3 or 4 in shape {a.shape}")
        scaled = a * np.float32(255.0)  # in place from here on: a 480x640 frame is 1.8 ms, not 4 ms, this way
        scaled += np.float32(0.5)
        np.clip(scaled, 0, 255, out=scaled)
        out = np.empty(scaled.shape, np.uint8)
        out[...] = scaled  # the cast truncates: with the +0.5 above, a rounding
        return out
    raise ValueError(f"observation.images.{cam}: dtype {a.dtype}; a frame is float in [0, 1] or uint8")


def frame_to_observation(frame: dict[str, Any], task: str = "") -> dict[str, Any]:
    """A LeRobot observation frame -> our engine's observation: state float32 (1-D), images HWC uint8 by camera
    name, task (the frame's own `task` string wins over `task`)."""
    if STATE_KEY not in frame:
        raise ValueError(f"a LeRobot observation frame holds {STATE_KEY!r}; got keys {sorted(frame)}")
    state = np.asarray(_numpy(frame[STATE_KEY]), np.float32)
    if state.ndim == 2 and state.shape[0] == 1:
        state = state[0]
    images = {k[len(IMAGE_PREFIX) :]: _image_hwc_uint8(k[len(IMAGE_PREFIX) :], v) for k, v in frame.items()
              if k.startswith(IMAGE_PREFIX)}  # fmt: skip
    t = frame.get("task")
    if isinstance(t, (list, tuple)) and len(t) == 1:
        t = t[0]
    obs: dict[str, Any] = {"state": state, "images": images}
    task = t if isinstance(t, str) and t else task
    if task:
        obs["task"] = task
    return obs


class _TaskTimeline:
    """Which task each observation carried, by its monotonic time: an action's `age_s` names its observation's
    time, so `dispatched_task` is the task of the chunk's own observation, not the one asked for since."""

    def __init__(self, task: str):
        self.times: list[float] = [float("-inf")]
        self.tasks: list[str] = [task]

    def sent(self, task: str, at: float) -> None:
        if task != self.tasks[-1]:
            self.times.append(at)
            self.tasks.append(task)
            if len(self.times) > 64:  # a chunk older than 63 task switches is long gone
                del self.times[0], self.tasks[0]
                self.times[0] = float("-inf")

    def at(self, t: float) -> str:
        return self.tasks[max(0, bisect.bisect_right(self.times, t) - 1)]


class RemoteInferenceAdapter:
    """The adapter's body, over whichever `InferenceEngine` base it is mixed into (see `rollout_engine_class`).

    `engine`: a RemoteEngineConfig (built with `make_engine`) or an engine (`edge.engine.Engine`).
    `ordered_action_keys`: LeRobot's dataset action order (its rollout context's `ordered_action_keys`); the
    returned tensor follows it. It must name the engine config's `action_names`, in any order; None keeps the
    config's order. Threading: every method runs on LeRobot's control thread; the network runs on our engine's
    worker, so the policy-owning thread is never the control thread (`control_thread_owns_policy` is False).
    """

    def __init__(
        self,
        engine: Any,
        task: str = "",
        *,
        ordered_action_keys: list[str] | None = None,
        shutdown_event: threading.Event | None = None,
    ) -> None:
        super().__init__(task=task)
        if not isinstance(engine, Engine):
            engine = make_engine(engine, **({"shutdown_event": shutdown_event} if shutdown_event else {}))
        self.remote = engine
        names = list(getattr(getattr(engine, "cfg", None), "action_names", None) or [])
        self._order = None
        if ordered_action_keys is not None and list(ordered_action_keys) != names:
            if sorted(ordered_action_keys) != sorted(names):
                raise ConfigError(
                    f"ordered_action_keys {list(ordered_action_keys)} are not the engine's action_names {names}: "
                    f"set RemoteEngineConfig.action_names to the dataset's action names (any order)"
                )
            self._order = np.array([names.index(k) for k in ordered_action_keys])
        self._timeline = _TaskTimeline(task)

    # --- lifecycle (LeRobot: start / stop / reset / pause / resume) -------------------------------------

    def start(self) -> None:
        """Open the session and start our worker. An engine runs once: after stop() build a new adapter."""
        self.remote.start()

    def stop(self) -> None:
        self.remote.stop()

    def reset(self) -> None:
        """Episode boundary: our queue cleared, the last observation dropped, an in-flight chunk discarded."""
        self.remote.reset()
        self._discard_task_change()

    def pause(self) -> None:
        self.remote.pause()

    def resume(self) -> None:
        self.remote.resume()

    # --- control thread ----------------------------------------------------------------------------------

    def notify_observation(self, obs: dict) -> None:
        """A frame (it holds `observation.state`) is published; LeRobot's rollout passes its robot-keyed
        processed observation here, which is skipped: the same tick's frame arrives with `get_action`."""
        if STATE_KEY in obs:
            self._publish(obs)

    def get_action(self, obs_frame: dict | None) -> Any:
        """Publish `obs_frame` (if any) as this tick's observation, then return the next action as a float32
        CPU tensor in `ordered_action_keys` order, or None (no chunk yet, or the `hold` fallback)."""
        if obs_frame is not None:
            self._publish(obs_frame)
        action = self.remote.get_action()
        if action is None:
            return None
        return self._tensor(action)

    def _publish(self, frame: dict) -> None:
        task, _ = self._take_task()  # no queue flush on a change: the next chunk answers the new task
        obs = frame_to_observation(frame, task)
        self._timeline.sent(obs.get("task", ""), time.monotonic())
        self.remote.notify_observation(obs)

    def _tensor(self, action: Action) -> Any:
        if action.age_s is not None:
            self._set_dispatched_task(self._timeline.at(time.monotonic() - action.age_s))
        v = np.asarray(action.values, np.float32)
        v = v[self._order] if self._order is not None else v.copy()
        return _torch_module().from_numpy(v)

    # --- status ----------------------------------------------------------------------------------------

    @property
    def control_thread_owns_policy(self) -> bool:
        """The policy lives on the server; no text head is served here (`supports_text_queries` stays False)."""
        return False

    @property
    def ready(self) -> bool:
        return self.remote.ready

    @property
    def failed(self) -> bool:
        """DEAD (design 9.2): LeRobot's controller then ends the run as it does for a dead RTC thread."""
        return self.remote.failed

    @property
    def failure_traceback(self) -> str | None:
        if not self.remote.failed:
            return None
        stats = self.remote.stats
        return f"remote engine DEAD: {stats.get('dead_reason') or stats.get('last_error') or 'no reason given'}"


def rollout_engine_class(base: type) -> type:
    """`RemoteInferenceAdapter` mixed into `base`, LeRobot's `InferenceEngine` ABC (or a stand-in with its
    contract, for tests where LeRobot's rollout is not installed)."""
    return type("RemoteInferenceEngine", (RemoteInferenceAdapter, base), {"__module__": __name__})


_built: dict[str, type] = {}


def __getattr__(name: str):
    if name != "RemoteInferenceEngine":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _built:
        try:
            from lerobot.rollout.inference.base import InferenceEngine
        except ImportError as exc:
            raise ImportError(
                f"RemoteInferenceEngine plugs into LeRobot's rollout, which this environment lacks ({exc}); it exists "
                f"from lerobot 0.6 (Python >= 3.12): pip install 'fleet-inference[lerobot-rollout]' there"
            ) from None
        _built[name] = rollout_engine_class(InferenceEngine)
    return _built[name]
