"""bench.robots.cameras: rendered frames under EGL, synthetic frames with real-camera JPEG sizes."""

from __future__ import annotations

import os
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import simplejpeg
from gymnasium.utils.env_checker import check_env

from bench.robots import RobotBatch, make_robot
from bench.robots.cameras import CAMERA_KINDS, make_camera, shared_renderer


@pytest.fixture(scope="module")
def gl_available():
    """Skip, saying why, when this machine cannot make an offscreen GL context."""
    env = make_robot("reacher", seed=0)
    try:
        shared_renderer(env.model, 32, 32)
    except Exception as exc:  # noqa: BLE001  (MuJoCo raises several types for a missing libEGL)
        pytest.skip(f"no offscreen GL (MUJOCO_GL={os.environ.get('MUJOCO_GL')!r}): {exc}")


def test_the_kinds_are_registered_and_unknown_kinds_are_refused():
    assert set(CAMERA_KINDS) == {"rendered", "synthetic", "observation"}
    with pytest.raises(ValueError, match="only a group with `gym:`"):
        make_camera("observation", make_robot("arm", seed=0), 96, 96, seed=0, name="front")
    with pytest.raises(ValueError, match="synthetic"):
        make_camera("lidar", make_robot("arm", seed=0), 96, 96, seed=0)
    with pytest.raises(ValueError, match="outside"):
        make_camera("synthetic", make_robot("arm", seed=0), 720, 1280, seed=0)


@pytest.mark.parametrize("name", ["arm", "reacher", "base"])
@pytest.mark.parametrize("size", [(96, 96), (480, 640)])
def test_rendered_camera_returns_rgb_frames_of_the_asked_size(gl_available, name, size):
    env = make_robot(name, seed=0, camera="rendered", camera_size=size)
    env.reset()
    frame = env.camera.frame()
    assert env.camera.kind == "rendered"
    assert frame.shape == (*size, 3) and frame.dtype == np.uint8
    assert frame.std() > 5  # a scene, not a blank buffer
    assert env.camera.frame() is not frame  # callers may keep frames


def test_rendered_frames_follow_the_robot(gl_available):
    env = make_robot("arm", seed=0, camera="rendered", camera_size=(96, 96))
    env.reset()
    before = env.camera.frame()
    for _ in range(20):
        env.step(np.array([1.5, 0.8, -1.0, 0.5, 0.0, 0.0], dtype=np.float32))
    assert np.abs(env.camera.frame().astype(int) - before).mean() > 0.5


def test_robots_of_one_type_and_size_share_one_renderer(gl_available):
    batch = RobotBatch("base", 3, seed=0)
    cams = [make_camera("rendered", batch.robot(i), 96, 96, seed=i) for i in range(3)]
    assert cams[0].renderer is cams[1].renderer is cams[2].renderer
    frames = [c.frame() for c in cams]
    assert not np.array_equal(frames[0], frames[1])  # each camera sees its own robot


def test_a_camera_built_on_one_thread_renders_on_another(gl_available):
    # The bench builds cameras on its main thread and renders on its loop thread.
    env = make_robot("reacher", seed=0, camera="rendered", camera_size=(96, 96))
    env.reset()
    here = env.camera.frame()
    with ThreadPoolExecutor(1) as pool:
        there = pool.submit(env.camera.frame).result()
    np.testing.assert_array_equal(here, there)


def test_rgb_array_render_mode_passes_check_env(gl_available):
    env = make_robot("reacher", seed=0, render_mode="rgb_array", camera_size=(64, 64))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(env)
    env.reset()
    assert env.render().shape == (64, 64, 3)


def test_synthetic_jpeg_sizes_match_real_cameras():
    env = make_robot("arm", seed=0)
    big = make_camera("synthetic", env, 480, 640, seed=1)
    sizes_kb = [len(simplejpeg.encode_jpeg(big.frame(), quality=90)) / 1024 for _ in range(8)]
    assert all(20 <= s <= 70 for s in sizes_kb), sizes_kb
    small = make_camera("synthetic", env, 96, 96, seed=1)
    small_kb = len(simplejpeg.encode_jpeg(small.frame(), quality=90)) / 1024
    assert 1.5 <= small_kb <= 6, small_kb
    assert big.kind == "synthetic"


def test_synthetic_frames_are_deterministic_given_the_seed_and_differ_across_seeds():
    env = make_robot("base", seed=0)
    a, b = (make_camera("synthetic", env, 96, 96, seed=5) for _ in range(2))
    c = make_camera("synthetic", env, 96, 96, seed=6)
    seq_a = [a.frame() for _ in range(8)]
    seq_b = [b.frame() for _ in range(8)]
    seq_c = [c.frame() for _ in range(8)]
    assert all(np.array_equal(x, y) for x, y in zip(seq_a, seq_b))
    assert not all(np.array_equal(x, y) for x, y in zip(seq_a, seq_c))
    assert len({f.tobytes() for f in seq_a}) == 8  # consecutive frames change, like video


def test_synthetic_frames_are_shared_and_read_only():
    env = make_robot("base", seed=0)
    a, b = make_camera("synthetic", env, 96, 96, seed=1), make_camera("synthetic", env, 96, 96, seed=2)
    assert a.bank is b.bank
    frame = a.frame()
    assert frame.shape == (96, 96, 3) and frame.dtype == np.uint8
    with pytest.raises(ValueError):
        frame[0, 0] = 0
