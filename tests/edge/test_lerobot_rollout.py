"""RemoteInferenceEngine (edge.lerobot_rollout) against LeRobot 0.6's rollout `InferenceEngine` contract.

The contract is written down here from huggingface/lerobot src/lerobot/rollout/inference/base.py at commit
7427f31801f944f5ec9ce53cda02862ce7d1638b (lerobot 0.6.2, read only; lerobot 0.6 needs Python 3.12, so it is not
installed here). Set LEROBOT_ROLLOUT_BASE to that file of a LeRobot checkout to check the record against it and
run the adapter over LeRobot's own ABC instead of the stand-in.
"""

from __future__ import annotations

import abc
import importlib.util
import inspect
import os
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch

from edge import Action, ConfigError, RemoteEngineConfig
from edge.engine import Engine, EngineState
from edge.lerobot_rollout import frame_to_observation, rollout_engine_class
from tests.edge.conftest import ACTION_NAMES, S

ROOT = Path(__file__).resolve().parents[2]
FPS = 30.0
# name -> (kind, parameters after self) of LeRobot's InferenceEngine at the commit above
ABSTRACT = {
    "start": ("method", []),
    "stop": ("method", []),
    "reset": ("method", []),
    "get_action": ("method", ["obs_frame"]),
    "control_thread_owns_policy": ("property", None),
}
HOOKS = {  # defaults the RTC backend overrides, and so does the adapter
    "notify_observation": ("method", ["obs"]),
    "pause": ("method", []),
    "resume": ("method", []),
    "ready": ("property", None),
    "failed": ("property", None),
    "failure_traceback": ("property", None),
}
# what a backend calls on the base (as LeRobot's RTC backend does): __init__(task=), _take_task() -> (task,
# changed), _set_dispatched_task(task), _discard_task_change(); set_task / task / dispatched_task are public
BASE_CALLS = {
    "__init__": ["task"],
    "_take_task": [],
    "_set_dispatched_task": ["task"],
    "_discard_task_change": [],
    "set_task": ["task"],
}


class RecordedInferenceEngine(abc.ABC):
    """A stand-in with the recorded contract: the abstract set above and the task calls a backend makes."""

    def __init__(self, task: str = "") -> None:
        self._task, self._changed, self._dispatched = task, False, task

    @property
    def task(self) -> str:
        return self._task

    def set_task(self, task: str) -> bool:
        changed = task != self._task
        self._task, self._changed = task, self._changed or changed
        return changed

    def _take_task(self) -> tuple[str, bool]:
        changed, self._changed = self._changed, False
        return self._task, changed

    @property
    def dispatched_task(self) -> str:
        return self._dispatched

    def _set_dispatched_task(self, task: str) -> None:
        self._dispatched = task

    def _discard_task_change(self) -> None:
        self._changed, self._dispatched = False, self._task

    @abc.abstractmethod
    def start(self) -> None: ...

    @abc.abstractmethod
    def stop(self) -> None: ...

    @abc.abstractmethod
    def reset(self) -> None: ...

    @abc.abstractmethod
    def get_action(self, obs_frame: dict | None): ...

    @property
    @abc.abstractmethod
    def control_thread_owns_policy(self) -> bool: ...


def _lerobot_base():
    path = os.environ.get("LEROBOT_ROLLOUT_BASE")
    if not path:
        return None
    import lerobot.utils.constants as constants  # 0.4.4 lacks the 0.6 query keys base.py imports

    for k, v in (("QUERY_KIND", "query_kind"), ("QUERY_TEXT", "query_text")):
        if not hasattr(constants, k):
            setattr(constants, k, v)
    spec = importlib.util.spec_from_file_location("lerobot_rollout_inference_base", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod.InferenceEngine


LEROBOT_BASE = _lerobot_base()


@pytest.fixture(params=["recorded"] + (["lerobot"] if LEROBOT_BASE else []))
def base(request):
    return RecordedInferenceEngine if request.param == "recorded" else LEROBOT_BASE


def _params(fn) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p != "self"]


def _check_contract(cls) -> list[str]:
    bad = []
    for name, (kind, params) in {**ABSTRACT, **HOOKS}.items():
        attr = inspect.getattr_static(cls, name, None)
        if kind == "property" and not isinstance(attr, property):
            bad.append(f"{name}: not a property")
        elif kind == "method" and (not callable(attr) or _params(attr) != params):
            bad.append(f"{name}: params {_params(attr) if callable(attr) else attr} != {params}")
    return bad


def test_the_recorded_contract_is_lerobots_own_abc():
    if LEROBOT_BASE is None:
        pytest.skip("LEROBOT_ROLLOUT_BASE names no LeRobot 0.6 base.py: the recorded contract stands alone")
    assert set(LEROBOT_BASE.__abstractmethods__) == set(ABSTRACT)
    assert not _check_contract(LEROBOT_BASE)
    for name, params in BASE_CALLS.items():
        assert _params(getattr(LEROBOT_BASE, name)) == params, name


def test_the_adapter_implements_every_abstract_method_and_hook_with_lerobots_signatures(base):
    cls = rollout_engine_class(base)
    assert issubclass(cls, base) and not getattr(cls, "__abstractmethods__", set())
    assert not _check_contract(cls)


def test_importing_the_adapter_imports_no_torch_or_lerobot():
    code = "import sys, edge, edge.lerobot_rollout; bad = {'torch', 'lerobot'} & set(sys.modules); assert not bad, bad"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_the_rollout_extra_brings_torch_and_lerobot_06_and_the_plain_install_neither():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["optional-dependencies"]["lerobot-rollout"] == [
        "torch>=2.2",
        "lerobot>=0.6; python_version >= '3.12'",
    ]
    assert not any(d.startswith(("torch", "lerobot")) for d in project["dependencies"])


def test_without_lerobots_rollout_the_engine_name_explains_the_install():
    import edge.lerobot_rollout as lr

    try:
        import lerobot.rollout.inference.base  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"lerobot 0.6 .*fleet-inference\[lerobot-rollout\]"):
            lr.RemoteInferenceEngine  # noqa: B018
    else:
        assert issubclass(lr.RemoteInferenceEngine, lerobot.rollout.inference.base.InferenceEngine)


# --- frame mapping ---------------------------------------------------------------------------------------------


def test_a_chw_float_frame_and_an_hwc_uint8_frame_map_to_the_same_observation():
    rng = np.random.default_rng(0)
    hwc = rng.integers(0, 256, (96, 96, 3), dtype=np.uint8)
    chw = torch.from_numpy(hwc).permute(2, 0, 1).float() / 255.0
    state = torch.arange(S, dtype=torch.float64)
    a = frame_to_observation({"observation.state": state, "observation.images.front": chw[None]}, "pick")
    b = frame_to_observation({"observation.state": state.numpy(), "observation.images.front": hwc, "task": "pick"})
    for o in (a, b):
        assert o["state"].dtype == np.float32 and o["state"].shape == (S,) and o["task"] == "pick"
        assert o["images"]["front"].dtype == np.uint8 and o["images"]["front"].shape == (96, 96, 3)
    np.testing.assert_array_equal(a["images"]["front"], hwc)
    np.testing.assert_array_equal(b["images"]["front"], hwc)
    assert frame_to_observation({"observation.state": state, "task": ["place"]}, "pick")["task"] == "place"


@pytest.mark.parametrize(
    "frame, words",
    [
        ({"observation.images.front": np.zeros((3, 8, 8), np.float32)}, "observation.state"),
        ({"observation.state": np.zeros(S), "observation.images.front": np.zeros((8, 8))}, "expected one image"),
        ({"observation.state": np.zeros(S), "observation.images.front": np.zeros((8, 8, 5), np.float32)}, "channel"),
        ({"observation.state": np.zeros(S), "observation.images.front": np.zeros((3, 8, 8), np.int64)}, "dtype"),
    ],
)
def test_a_frame_our_engine_cannot_take_is_refused_naming_its_key(frame, words):
    with pytest.raises(ValueError, match=words):
        frame_to_observation(frame)


class _Scripted(Engine):
    """An engine whose next actions a test sets: mapping and ordering checks without the network."""

    def __init__(self, names):
        self.cfg = RemoteEngineConfig(
            connect_endpoints=["tcp/127.0.0.1:1"], model_id="m", action_names=names, state_dim=S
        )
        self.next: Action | None = None
        self.seen: list[dict] = []
        self.calls: list[str] = []

    def start(self):
        self.calls.append("start")

    def stop(self):
        self.calls.append("stop")

    def reset(self):
        self.calls.append("reset")

    def pause(self):
        self.calls.append("pause")

    def resume(self):
        self.calls.append("resume")

    def notify_observation(self, obs):
        self.seen.append(obs)

    def get_action(self):
        return self.next

    ready = failed = property(lambda self: False)
    state = property(lambda self: EngineState.STREAMING)
    stats = property(lambda self: {})


def test_the_action_comes_back_in_lerobots_key_order_and_dispatched_task_is_its_observations(base):
    eng = _Scripted(["x", "y", "grip"])
    ad = rollout_engine_class(base)(eng, task="a", ordered_action_keys=["grip", "x", "y"])
    frame = {"observation.state": torch.zeros(S)}
    assert ad.get_action(frame) is None and eng.seen[-1]["task"] == "a"
    eng.next = Action(np.array([1.0, 2.0, 3.0], np.float32), age_s=0.0)
    out = ad.get_action(frame)
    assert out.dtype == torch.float32 and out.tolist() == [3.0, 1.0, 2.0]
    ad.set_task("b")
    eng.next = Action(np.array([1.0, 2.0, 3.0], np.float32), age_s=1.0)  # answers an observation taken before "b"
    ad.get_action(frame)
    assert eng.seen[-1]["task"] == "b" and ad.dispatched_task == "a"
    eng.next = Action(np.array([1.0, 2.0, 3.0], np.float32), age_s=0.0)
    ad.get_action(frame)
    assert ad.dispatched_task == "b"
    ad.notify_observation({"shoulder.pos": 0.0})  # the rollout's robot-keyed observation: the frame comes next
    assert len(eng.seen) == 4
    ad.start(), ad.pause(), ad.resume(), ad.reset(), ad.stop()
    assert eng.calls == ["start", "pause", "resume", "reset", "stop"] and ad.control_thread_owns_policy is False
    with pytest.raises(ConfigError, match="action_names"):
        rollout_engine_class(base)(eng, ordered_action_keys=["x", "y", "z"])


# --- against a real server and router ----------------------------------------------------------------------------


def _lerobots_frame_builder():
    """LeRobot's own `build_dataset_frame` and `hw_to_dataset_features` (0.6: lerobot.utils.feature_utils)."""
    try:
        from lerobot.utils.feature_utils import build_dataset_frame, hw_to_dataset_features
    except ImportError:
        from lerobot.datasets.utils import build_dataset_frame, hw_to_dataset_features
    return build_dataset_frame, hw_to_dataset_features


def test_lerobot_frames_in_tensors_out_over_a_real_server(base, router, server_factory, ckpt):
    """A rollout's ticks at 30 Hz: its robot-keyed observation to notify_observation, then get_action with the
    frame LeRobot's own build_dataset_frame makes of it (numpy, HWC uint8 camera), every other tick a torch frame
    with a CHW float camera instead. None before the first chunk, then 1-D float32 tensors of the action width;
    reset() clears the queue so the next tick has nothing again."""
    build_dataset_frame, hw_to_dataset_features = _lerobots_frame_builder()
    hw = {f"j{i}.pos": float for i in range(S)} | {"front": (96, 96, 3)}
    features = hw_to_dataset_features(hw, "observation", use_video=False)
    server_factory(ckpt)
    cfg = RemoteEngineConfig(
        connect_endpoints=[router],
        model_id="arm",
        fps=FPS,
        action_names=ACTION_NAMES,
        state_dim=S,
        request_timeout_s=1.0,
        execution_horizon=5,
        buffer_time_s=0.2,
    )
    dead = threading.Event()
    ad = rollout_engine_class(base)(cfg, task="pick", shutdown_event=dead)
    cam = np.random.default_rng(0).integers(0, 256, (96, 96, 3), dtype=np.uint8)
    cam_chw = torch.from_numpy(cam).permute(2, 0, 1).float() / 255.0
    ad.start()
    ad.resume()
    try:
        outs, k, t0 = [], 0, time.monotonic()
        while time.monotonic() - t0 < 2.0:
            obs_processed = {f"j{i}.pos": 0.01 * k for i in range(S)} | {"front": cam}
            ad.notify_observation(obs_processed)
            if k % 2:
                frame = {"observation.state": torch.full((S,), 0.01 * k), "observation.images.front": cam_chw}
            else:
                frame = build_dataset_frame(features, obs_processed, prefix="observation")
            outs.append(ad.get_action(frame))
            k += 1
            time.sleep(max(0.0, t0 + k / FPS - time.monotonic()))  # the robot's own clock: this IS the control loop
        assert outs[0] is None
        got = [o for o in outs if o is not None]
        assert len(got) > 20 and all(o.shape == (len(ACTION_NAMES),) and o.dtype == torch.float32 for o in got)
        assert ad.ready and not ad.failed and ad.failure_traceback is None and ad.dispatched_task == "pick"
        ad.reset()
        assert ad.get_action(None) is None
    finally:
        ad.stop()
    assert not dead.is_set()
