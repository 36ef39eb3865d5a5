"""Shared fixtures: a real Zenoh router in its own process on 127.0.0.1."""

from __future__ import annotations

import os

# MuJoCo picks its GL backend at import: software EGL must be chosen before any test imports it.
os.environ.setdefault("MUJOCO_GL", "egl")

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

from wire.procs import start_router  # noqa: E402

# Property tests judge behaviour, not speed: hypothesis's default 200 ms deadline per example failed a codec test in a
# CI run on the loaded 2-core host (an empty PNG took 461 ms once, 0.3 ms on the retry). Speed lives in benchmarks/.
settings.register_profile("fleet", deadline=None)
settings.load_profile("fleet")


@pytest.fixture
def router(tmp_path):
    """A fresh router per test; yields its client endpoint, e.g. "tcp/127.0.0.1:40123"."""
    child, endpoint = start_router(None, tmp_path / "router.log")
    try:
        yield endpoint
    finally:
        child.stop()


@pytest.fixture
def router_proc(tmp_path):
    """Like `router` but yields (ChildProcess, endpoint) so a test can kill and restart it."""
    child, endpoint = start_router(None, tmp_path / "router.log")
    try:
        yield child, endpoint
    finally:
        child.stop()


@pytest.fixture
def one_torch_thread():
    """Torch on one thread for the test (restored after): tiny models run faster, and steadier, on one thread
    when the 2 cores are shared. A module opts in with `pytestmark = pytest.mark.usefixtures("one_torch_thread")`."""
    import torch  # not at import: the robot-side install has no torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
