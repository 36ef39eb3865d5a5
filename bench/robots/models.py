"""The process-wide MjModel cache: each robot type is compiled once per physics step size.

Invariant: every MjData in this process that simulates robot type T at step size dt points at the
same MjModel object, `shared_model(T, dt)`. A model is read-only once published here; per-robot
state lives only in MjData. Compiling per robot (what most gym wrappers do) costs 100-230 MB on a
real arm and would make a 300-robot fleet impossible on one machine.
"""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path
from typing import ClassVar, Protocol


def _choose_gl_backend() -> str | None:
    """Pick MuJoCo's GL backend before mujoco is imported (it reads MUJOCO_GL once, at import).

    Headless machines have no display: EGL (llvmpipe here) is the backend that works where we run. A
    host without libEGL must still simulate robots with synthetic cameras, but `import mujoco` with
    MUJOCO_GL=egl and no libEGL dies (AttributeError on eglQueryString), so there GL is switched off and
    the reason kept for the first rendered camera to report. An explicit MUJOCO_GL other than egl wins.
    Returns why rendering is unavailable, or None. `bench/robots/__init__.py` imports this module first, so every
    import of bench.robots chooses before mujoco is imported. In a process that imported mujoco itself before that,
    MuJoCo has chosen already (GLFW where MUJOCO_GL was unset): where that cannot render (GLFW without a display)
    it is said here, not left to fail at the first frame with "an OpenGL platform library has not been loaded".
    """
    import ctypes.util
    import sys

    imported = sys.modules.get("mujoco")
    if imported is not None:  # too late to choose: say what MuJoCo chose, if it cannot render here
        chosen = getattr(getattr(imported, "GLContext", None), "__module__", "")
        if chosen == "mujoco.glfw" and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
            return (
                "mujoco was imported before bench.robots and chose GLFW, which needs a display: import "
                "bench.robots before mujoco, or set MUJOCO_GL=egl (with libEGL) before anything imports mujoco"
            )
        return None
    asked = os.environ.get("MUJOCO_GL", "").strip().lower()
    if asked not in ("", "egl"):
        return None
    if ctypes.util.find_library("EGL"):
        os.environ["MUJOCO_GL"] = "egl"
        return None
    os.environ["MUJOCO_GL"] = "disable"
    return (
        "rendered cameras need libEGL (libEGL.so.1), which this host lacks: install it (Debian: "
        "apt-get install libegl1) or set MUJOCO_GL=osmesa with libOSMesa installed; synthetic cameras "
        "need no GL"
    )


GL_UNAVAILABLE = _choose_gl_backend()

import mujoco  # noqa: E402
import numpy as np  # noqa: E402

ASSETS = Path(__file__).parent / "assets"

# Arena size for one MjData. MuJoCo's default (13.6 MB of address space per MjData) is sized for
# contact-rich scenes. Measured maxuse_arena: arm 3 KB, reacher 1.4 KB, base 17 KB while pressed into
# a wall; 256 KB leaves headroom for a corner, and untouched pages cost no resident memory.
ARENA_BYTES = 256 * 1024

# Largest offscreen frame a camera may ask for (bench.robots.cameras); MuJoCo sizes the offscreen buffer
# from the model, so it has to be set before compiling.
MAX_RENDER_HEIGHT, MAX_RENDER_WIDTH = 480, 640
# Offscreen multisampling: 4x MSAA makes software GL (llvmpipe) 3-5x slower per frame
# (arm at 480x640: 24 ms vs 5 ms), and real camera frames are not anti-aliased renders anyway.
RENDER_SAMPLES = 0

_MODELS: dict[tuple[str, float], mujoco.MjModel] = {}
_LOCK = threading.Lock()


def substeps_for(fps: float, nominal_physics_dt: float, max_physics_dt: float | None = None) -> tuple[int, float]:
    """(n_substeps, physics_dt) so that n_substeps * physics_dt is exactly one control tick.

    The physics step is nudged off the nominal value instead of letting the control period drift:
    a 30 Hz robot must take exactly 1/30 s of simulated time per tick. With `max_physics_dt`: where a
    tick is a whole number of nominal steps, exactly those (the MJCF's own stepping, e.g. Reacher-v5's
    2 x 10 ms at 50 Hz); otherwise the fewest substeps whose step does not exceed it (a coarser step the
    integrator is known to take).
    """
    if fps <= 0:
        raise ValueError(f"fps must be positive, got {fps}")
    nominal_n = 1.0 / (fps * nominal_physics_dt)
    if max_physics_dt and abs(nominal_n - round(nominal_n)) > 1e-9:
        return (n := max(1, math.ceil(1.0 / (fps * max_physics_dt) - 1e-9))), 1.0 / (fps * n)
    n = max(1, round(nominal_n))
    return n, 1.0 / (fps * n)


def can_collide(model: mujoco.MjModel) -> bool:
    """Whether any contact can ever be generated: an explicit <pair>, or two geoms whose contype and
    conaffinity bits match (MuJoCo's own filter: (ct1 & ca2) | (ct2 & ca1)), a geom with itself aside."""
    if model.npair > 0:
        return True
    ct, ca = model.geom_contype.astype(int), model.geom_conaffinity.astype(int)
    match = (ct[:, None] & ca[None, :]) | (ct[None, :] & ca[:, None])
    np.fill_diagonal(match, 0)
    return bool(match.any())


class ModelSource(Protocol):
    """What the cache compiles: a robot type (a bench.robots.core.RobotType subclass) by its name and MJCF. Said
    here, below core, so that the cache needs nothing above it."""

    name: ClassVar[str]

    @classmethod
    def load_spec(cls) -> mujoco.MjSpec: ...


def shared_model(robot_type: type[ModelSource], physics_dt: float) -> mujoco.MjModel:
    """The one MjModel for `robot_type` at `physics_dt`, compiled on first use."""
    key = (robot_type.name, round(physics_dt, 12))
    model = _MODELS.get(key)
    if model is not None:
        return model
    with _LOCK:  # two threads building fleets at once must still end up with one model
        model = _MODELS.get(key)
        if model is None:
            spec = robot_type.load_spec()
            spec.option.timestep = physics_dt
            spec.memory = ARENA_BYTES
            spec.visual.global_.offheight = max(spec.visual.global_.offheight, MAX_RENDER_HEIGHT)
            spec.visual.global_.offwidth = max(spec.visual.global_.offwidth, MAX_RENDER_WIDTH)
            spec.visual.quality.offsamples = RENDER_SAMPLES
            model = spec.compile()
            if not can_collide(model):
                # Every geom pair is filtered out by its contype/conaffinity bits (Reacher-v5's MJCF
                # sets contype 0 everywhere), yet mj_collision still runs its broad phase at every
                # RK4 stage: a third of the reacher's step. Skipping it cannot change a state.
                model.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_CONTACT
            _MODELS[key] = model
    return model


def cached_models() -> dict[tuple[str, float], mujoco.MjModel]:
    """A snapshot of the cache, for memory reports and tests."""
    return dict(_MODELS)
