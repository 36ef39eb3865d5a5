"""MuJoCo's GL backend: a host without libEGL still simulates robots with synthetic cameras, and the
first rendered camera (or the scenario check) names the missing library instead of crashing at import."""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

# A host without libEGL, emulated in a fresh interpreter: ctypes finds no EGL library.
NO_EGL = "import ctypes.util as u; _f = u.find_library; u.find_library = lambda n: None if n == 'EGL' else _f(n)\n"


def _python(code: str, **env) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k != "MUJOCO_GL"}
    e.update(env, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-c", NO_EGL + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=e,
        cwd=ROOT,
        timeout=120,
    )


def test_without_libegl_synthetic_cameras_run_and_a_rendered_one_names_the_library():
    out = _python("""
        import numpy as np
        from bench.robots import make_robot
        from bench.robots.cameras import make_camera
        robot = make_robot("reacher", seed=0)
        robot.reset(seed=0)
        robot.step(np.zeros(2))
        frame = make_camera("synthetic", robot.unwrapped, 32, 32).frame()
        assert frame.shape == (32, 32, 3), frame.shape
        try:
            make_camera("rendered", robot.unwrapped, 32, 32)
        except RuntimeError as exc:
            print("ERR", exc)
    """)
    assert out.returncode == 0, out.stderr
    assert "ERR rendered cameras need libEGL" in out.stdout and "libegl1" in out.stdout


def test_an_explicit_egl_without_libegl_does_not_crash_the_import():
    out = _python("import bench.robots; import os; print(os.environ['MUJOCO_GL'])", MUJOCO_GL="egl")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "disable"


def test_another_explicit_backend_is_left_alone():
    out = _python(
        "import bench.robots.models as m; import os; print(os.environ['MUJOCO_GL'], m.GL_UNAVAILABLE)",
        MUJOCO_GL="disable",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["disable", "None"]


def test_a_scenario_with_rendered_cameras_is_refused_up_front_naming_the_library(tmp_path):
    text = (ROOT / "scenarios" / "smoke.yaml").read_text()
    assert "fleet:" in text
    path = tmp_path / "rendered.yaml"
    import yaml

    data = yaml.safe_load(text)
    data["fleet"]["groups"][0]["cameras"] = {"kind": "rendered", "names": ["front"], "height": 32, "width": 32}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    out = _python(f"import sys; from bench.cli import main; sys.exit(main(['validate', {str(path)!r}]))")
    assert out.returncode == 2, out.stdout + out.stderr
    err = out.stdout + out.stderr
    assert "cameras.kind" in err and "libEGL" in err and "Traceback" not in err


def _python_with_egl(code: str) -> subprocess.CompletedProcess:
    """A fresh interpreter on this host as it is (its libEGL found), MUJOCO_GL and any display unset."""
    e = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "DISPLAY", "WAYLAND_DISPLAY")}
    e["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=e, cwd=ROOT, timeout=120
    )


@pytest.mark.skipif(ctypes.util.find_library("EGL") is None, reason="no libEGL on this host (Debian: libegl1)")
def test_without_mujoco_gl_any_bench_robots_import_renders_on_egl():
    """MuJoCo reads MUJOCO_GL once, at its import: the package chooses EGL before any of its modules imports mujoco
    (bench.robots.core imports it at its top; it used to come first, so MuJoCo took GLFW and every rendered frame of
    a process started without MUJOCO_GL failed: the benchmark suite's `cameras`), and so do the modules outside it
    that import mujoco at their top."""
    for first in ("bench.robots.core", "bench.robots.cameras", "bench.training.experts", "benchmarks.robot_step"):
        out = _python_with_egl(f"""
            import os, importlib
            importlib.import_module({first!r})
            from bench.robots import make_robot
            from bench.robots.cameras import make_camera
            robot = make_robot("arm", seed=0)
            robot.reset(seed=0)
            frame = make_camera("rendered", robot.unwrapped, 32, 32).frame()
            print(os.environ["MUJOCO_GL"], frame.shape, int(frame.max()) > 0)
        """)
        assert out.returncode == 0, (first, out.stderr[-2000:])
        assert out.stdout.split() == ["egl", "(32,", "32,", "3)", "True"], (first, out.stdout)


def test_mujoco_imported_first_without_mujoco_gl_is_named_not_left_to_fail_at_the_first_frame():
    """What MuJoCo chose at its import is what counts: GLFW without a display is named, whether or not MUJOCO_GL
    was set afterwards; EGL chosen by the caller is left alone."""
    for late in ("", "import os; os.environ['MUJOCO_GL'] = 'egl'"):
        out = _python_with_egl(f"""
            import mujoco
            {late}
            import bench.robots.models as m
            print(m.GL_UNAVAILABLE)
        """)
        assert out.returncode == 0, out.stderr
        assert "imported before bench.robots and chose GLFW" in out.stdout and "MUJOCO_GL=egl" in out.stdout
    out = _python_with_egl("""
        import os
        os.environ["MUJOCO_GL"] = "egl"
        import mujoco
        import bench.robots.models as m
        print(m.GL_UNAVAILABLE)
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "None"
