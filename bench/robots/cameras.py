"""Per-robot cameras: `rendered` (MuJoCo offscreen), `synthetic` (procedural, real-camera sized) or
`observation` (the image a gymnasium env puts in its observation, bench.robots.gymenv).

    make_camera(kind, robot, height, width, seed, name).frame() -> (H, W, 3) uint8 RGB

`robot` is anything with `.model`, `.camera_view` and `.scene_data()`: a TwinEnv, or
RobotBatch.robot(i) for one robot of a fleet. `camera.kind` names what produced the frames, and is
what reports record. Invariants:
- rendered: one mujoco.Renderer per (thread, model, size) in a process, shadows and reflections
  off (software GL here; shadows cost 3-4x). An EGL context can be current in one thread only, so
  a camera picks the renderer of whichever thread calls frame(): build cameras anywhere, render
  from any thread, but never one renderer from two threads.
- synthetic: one read-only bank of frames per size, shared by every camera in the process (300
  cameras cost one bank); each camera walks it in its own seeded order. Frames carry no task
  information: they exist to put realistic JPEG payloads (q90 480x640 ~20-70 KB) on the wire.
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar, Protocol

import numpy as np

from bench.robots.models import GL_UNAVAILABLE, MAX_RENDER_HEIGHT, MAX_RENDER_WIDTH

CAMERA_KINDS: dict[str, type[Camera]] = {}


class CameraSubject(Protocol):
    model: Any
    camera_view: str | dict[str, Any]

    def scene_data(self) -> Any: ...


def register_camera(kind: str):
    def register(cls: type[Camera]) -> type[Camera]:
        cls.kind = kind
        CAMERA_KINDS[kind] = cls
        return cls

    return register


def make_camera(
    kind: str, robot: CameraSubject, height: int = 96, width: int = 96, seed: int = 0, name: str = ""
) -> Camera:
    """A camera of `kind` on `robot`; `name` is the camera's (an `observation` camera reads that image)."""
    try:
        cls = CAMERA_KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown camera kind {kind!r}; known: {sorted(CAMERA_KINDS)}") from None
    if not (0 < height <= MAX_RENDER_HEIGHT and 0 < width <= MAX_RENDER_WIDTH):
        raise ValueError(f"camera size {height}x{width} outside 1..{MAX_RENDER_HEIGHT}x1..{MAX_RENDER_WIDTH}")
    camera = cls(robot, height, width, seed)
    camera.name = name
    return camera


class Camera:
    kind: ClassVar[str] = ""
    name: str = ""

    def __init__(self, robot: CameraSubject, height: int, width: int, seed: int):
        self.robot, self.height, self.width, self.seed = robot, height, width, seed

    def frame(self) -> np.ndarray:
        raise NotImplementedError


# -- rendered ------------------------------------------------------------------------------

_RENDERERS: dict[tuple[int, int, int, int], Any] = {}
_RENDERERS_LOCK = threading.Lock()


def shared_renderer(model, height: int, width: int):
    """The calling thread's renderer for `model` at this size, created on first use."""
    import mujoco

    key = (threading.get_ident(), id(model), height, width)
    with _RENDERERS_LOCK:
        entry = _RENDERERS.get(key)
        if entry is None:
            if GL_UNAVAILABLE:
                raise RuntimeError(GL_UNAVAILABLE)
            renderer = mujoco.Renderer(model, height, width)
            renderer.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = False
            renderer.scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = False
            entry = _RENDERERS[key] = (model, renderer)  # holding the model pins id(model)
    return entry[1]


def _mjv_camera(model, view: str | dict[str, Any]):
    """A named MJCF camera, or a free camera from {lookat, distance, azimuth, elevation}."""
    import mujoco

    if isinstance(view, str):
        model.camera(view)  # fail here, not at the first frame, if the MJCF lacks it
        return view
    camera = mujoco.MjvCamera()
    camera.type = mujoco.mjtCamera.mjCAMERA_FREE
    camera.lookat[:] = view.get("lookat", (0.0, 0.0, 0.0))
    camera.distance = view.get("distance", 1.0)
    camera.azimuth = view.get("azimuth", 90.0)
    camera.elevation = view.get("elevation", -45.0)
    return camera


@register_camera("rendered")
class RenderedCamera(Camera):
    def __init__(self, robot: CameraSubject, height: int, width: int, seed: int):
        super().__init__(robot, height, width, seed)
        self.view = _mjv_camera(robot.model, robot.camera_view)
        shared_renderer(robot.model, height, width)  # fail at construction if there is no GL

    @property
    def renderer(self):
        return shared_renderer(self.robot.model, self.height, self.width)

    def frame(self) -> np.ndarray:
        renderer = self.renderer
        renderer.update_scene(self.robot.scene_data(), camera=self.view)
        return renderer.render()  # a fresh array: callers may keep it


# -- synthetic -----------------------------------------------------------------------------

BANK_FRAMES = 8
BANK_SEED = 20_240_611
# Sensor noise std in 8-bit levels; it sets the JPEG size. Measured at q90, 480x640: 0 -> ~24 KB,
# 2 -> ~39 KB, 3 -> ~53 KB, 4 -> ~68 KB. 2.0 sits mid-range of real 480p frames (20-70 KB).
SENSOR_NOISE = 2.0

_BANKS: dict[tuple[int, int], np.ndarray] = {}
_BANKS_LOCK = threading.Lock()


def synthetic_bank(height: int, width: int) -> np.ndarray:
    """(BANK_FRAMES, H, W, 3) uint8, read-only, identical in every process for a given size."""
    key = (height, width)
    with _BANKS_LOCK:
        bank = _BANKS.get(key)
        if bank is None:
            rng = np.random.default_rng([BANK_SEED, height, width])
            bank = np.stack([_scene(rng, height, width, k) for k in range(BANK_FRAMES)])
            bank.flags.writeable = False  # shared by every camera: nobody may draw on it
            _BANKS[key] = bank
    return bank


def _scene(rng: np.random.Generator, height: int, width: int, k: int) -> np.ndarray:
    """A lit room with a few objects drifting across frames, softened like a lens, plus noise."""
    y = np.linspace(0.0, 1.0, height)[:, None, None]
    x = np.linspace(0.0, 1.0, width)[None, :, None]
    horizon = 0.45
    wall = np.array([150.0, 145.0, 135.0]) * (1.0 - 0.25 * x)
    floor = np.array([95.0, 100.0, 110.0]) * (0.7 + 0.5 * y)
    img = np.where(y < horizon, wall, floor) + np.zeros((height, width, 3))
    # Floor tiles give the JPEG some real structure to code, not just noise.
    tiles = ((np.floor(x * 10 + 0.5 * k / BANK_FRAMES) + np.floor(y * 12)) % 2)[..., 0] == 0
    img[(y[..., 0] >= horizon) & tiles] *= 0.82
    yy, xx = np.mgrid[0:height, 0:width] / max(height, width)
    shape_rng = np.random.default_rng([BANK_SEED, 7])  # same objects in every frame; only k moves them
    for s in range(6):
        cy, cx = shape_rng.uniform(0.15, 0.85, 2) * (height, width) / max(height, width)
        cx += 0.03 * k * (1 if s % 2 else -1)
        ry, rx = shape_rng.uniform(0.04, 0.14, 2)
        color = shape_rng.uniform(30, 230, 3)
        if s % 2:  # ellipse
            inside = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1.0
        else:  # box
            inside = (np.abs(yy - cy) <= ry) & (np.abs(xx - cx) <= rx)
        lit_from_above = 0.75 + 0.25 * (1 - (yy - cy) / (2 * ry))
        img[inside] = (color * lit_from_above[inside, None]).clip(0, 255)
    img = _box_blur(img, radius=max(1, height // 240))
    img += rng.normal(0.0, SENSOR_NOISE, img.shape)
    return img.clip(0, 255).astype(np.uint8)


def _box_blur(img: np.ndarray, radius: int) -> np.ndarray:
    """Separable box blur via cumulative sums (edges clamp)."""
    for axis in (0, 1):
        pad = [(0, 0)] * img.ndim
        pad[axis] = (radius + 1, radius)
        c = np.cumsum(np.pad(img, pad, mode="edge"), axis=axis)
        n = img.shape[axis]
        hi = np.take(c, np.arange(2 * radius + 1, 2 * radius + 1 + n), axis=axis)
        lo = np.take(c, np.arange(0, n), axis=axis)
        img = (hi - lo) / (2 * radius + 1)
    return img


@register_camera("synthetic")
class SyntheticCamera(Camera):
    def __init__(self, robot: CameraSubject, height: int, width: int, seed: int):
        super().__init__(robot, height, width, seed)
        self.bank = synthetic_bank(height, width)
        rng = np.random.default_rng([seed, 0x5CA3])
        self.index = int(rng.integers(BANK_FRAMES))
        self.stride = int(rng.choice([s for s in range(1, BANK_FRAMES) if np.gcd(s, BANK_FRAMES) == 1]))

    def frame(self) -> np.ndarray:
        """The next bank frame: a shared read-only array, never copied (copy to draw on it)."""
        frame = self.bank[self.index]
        self.index = (self.index + self.stride) % BANK_FRAMES
        return frame


# -- observation ---------------------------------------------------------------------------


@register_camera("observation")
class ObservationCamera(Camera):
    """The image named by the camera's name in the robot's latest env observation (a gym group's
    `observation.cameras`): the env draws it, this process renders nothing."""

    def __init__(self, robot: CameraSubject, height: int, width: int, seed: int):
        super().__init__(robot, height, width, seed)
        if not hasattr(robot, "observation_image"):
            raise ValueError(
                "camera kind `observation` takes its images from a gymnasium env's observation: "
                "only a group with `gym:` has one"
            )

    def frame(self) -> np.ndarray:
        return self.robot.observation_image(self.name)
