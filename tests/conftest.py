"""Shared fixtures: a real Zenoh router in its own process on 127.0.0.1."""

from __future__ import annotations

import os

# MuJoCo picks its GL backend at import: software EGL must be chosen before any test imports it.
os.environ.setdefault("MUJOCO_GL", "egl")

import pytest  # noqa: E402

from wire.procs import start_router  # noqa: E402


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
