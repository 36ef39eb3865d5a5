"""Bring your own robot: a Gymnasium env and a RobotType subclass from a package outside bench/
(tests/bench/robot_plugin/fleet_robot_fixture, on PYTHONPATH only here) become fleet robot types by scenario
configuration and entry points alone, and a wrong mapping is refused with the env's real spaces."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from bench.robots import core

REPO = Path(__file__).resolve().parents[2]
PLUGIN_DIR = Path(__file__).resolve().parent / "robot_plugin"
REACHER = REPO / "bench" / "checkpoints" / "reacher"

GYM_GROUP = """\
    - name: point
      gym:
        env: fleet_robot_fixture/PointReach-v0
        observation: {state: [joints, to_target]}
        action: {names: [joint0.torque, joint1.torque]}
        fallback: zero
        success: {info: is_success}
      count: 3
      site: lab
      policy: {checkpoint}
      engine: {buffer_time_s: 0.5, max_action_age_s: 1.0}
"""

SCENARIO = """\
name: gym_plugin
description: three robots of a user's own gymnasium env, served the reacher checkpoint
duration_s: {duration}
warmup_s: 2
fleet:
  shards: 1
  groups:
{groups}
sites:
  lab: {{profile: lan}}
servers:
  replicas:
    - {{id: r0, checkpoint: {checkpoint}, max_sessions: 8}}
assertions:
  - dead_robots == 0
  - requests > 10
  - episodes >= 3
"""


def scenario_text(groups: str = GYM_GROUP, duration: float = 4) -> str:
    return SCENARIO.format(groups=groups.replace("{checkpoint}", str(REACHER)), checkpoint=REACHER, duration=duration)


def plugin_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PLUGIN_DIR), str(REPO), env.get("PYTHONPATH", "")])
    env.setdefault("MUJOCO_GL", "egl")
    return env


@pytest.fixture
def plugin_path(monkeypatch):
    """The fixture package importable in this process (and its entry point visible), the registry restored after."""
    monkeypatch.syspath_prepend(str(PLUGIN_DIR))
    saved = dict(core.ROBOT_TYPES)
    yield
    core.ROBOT_TYPES.clear()
    core.ROBOT_TYPES.update(saved)
    for name in [m for m in sys.modules if m.startswith("fleet_robot_fixture")]:
        del sys.modules[name]


def validate(tmp_path, text: str, capsys) -> tuple[int, str]:
    from bench.cli import main

    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(text))
    rc = main(["validate", str(path)])
    out = capsys.readouterr()
    return rc, out.out + out.err


@pytest.mark.integration
def test_a_gym_env_from_a_package_outside_bench_runs_as_a_fleet_group_from_yaml_alone(tmp_path):
    for mod in ("edge", "server.cli", "chaos.launch"):
        pytest.importorskip(mod)
    scenario = tmp_path / "gym_plugin.yaml"
    scenario.write_text(scenario_text())
    proc = subprocess.run(
        [sys.executable, "-m", "bench.cli", "run", str(scenario), "--reports", str(tmp_path / "reports"), "--quiet"],
        cwd=REPO,
        env=plugin_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    runs = list((tmp_path / "reports" / "gym_plugin").iterdir())
    assert len(runs) == 1, proc.stderr
    summary = json.loads((runs[0] / "summary.json").read_text())
    assert summary["verdict"] == "pass", (proc.stderr[-3000:], json.dumps(summary["assertions"], indent=1))
    assert proc.returncode == 0
    # 3 robots x 30 Hz x 4 s, every one a real env.step driven by the served policy's chunks
    assert summary["robots"] == 3 and summary["ticks"] > 300
    # PointReach truncates at 60 steps (2 s): each robot ended at least one episode the env's TimeLimit ended
    assert summary["figures"]["episodes"] >= 3


def test_bench_validate_refuses_a_wrong_mapping_with_the_envs_real_spaces(tmp_path, capsys, plugin_path):
    rc, out = validate(
        tmp_path, scenario_text(GYM_GROUP.replace("[joints, to_target]", "[agent_pos, to_target]")), capsys
    )
    assert rc == 2
    assert (
        "fleet.groups[0].gym.observation.state[0]: key 'agent_pos' not in the env's observation space "
        "Dict('joints': Box(-inf, inf, (8,), float32), 'to_target': Box(-inf, inf, (2,), float32))"
    ) in out, out
    # a state of the wrong size for the policy: the mapping's names and the policy's size
    rc, out = validate(
        tmp_path, scenario_text(GYM_GROUP.replace("[joints, to_target]", "['joints[0:4]', to_target]")), capsys
    )
    assert rc == 2 and "gym.observation.state: the mapping makes a state of 6 values" in out and "takes 10" in out, out
    # actions the policy does not act on: the server would refuse every session
    rc, out = validate(
        tmp_path, scenario_text(GYM_GROUP.replace("names: [joint0.torque, joint1.torque]", "scale: 2")), capsys
    )
    assert rc == 2 and "gym.action.names" in out and "['joint0.torque', 'joint1.torque']" in out, out
    # an action mapping of the wrong length names the env's action space
    rc, out = validate(tmp_path, scenario_text(GYM_GROUP.replace("fallback: zero", "fallback: [0, 0, 0]")), capsys)
    assert (
        rc == 2 and "gym.fallback: 3 values for the env's 2 actions" in out and "Box(-1.0, 1.0, (2,), float32)" in out
    )
    # the right mapping passes
    rc, out = validate(tmp_path, scenario_text(), capsys)
    assert rc == 0 and "3xgym:fleet_robot_fixture/PointReach-v0@30Hz" in out, out


def test_bench_validate_runs_gymnasiums_check_env_unless_told_not_to(tmp_path, capsys, plugin_path):
    broken = GYM_GROUP.replace("fleet_robot_fixture/PointReach-v0", "fleet_robot_fixture.envs:broken_env")
    rc, out = validate(tmp_path, scenario_text(broken), capsys)
    assert (
        rc == 2
        and "fleet.groups[0].gym.env: gymnasium's check_env refuses 'fleet_robot_fixture.envs:broken_env'" in out
    )
    assert "gym.check_env: false" in out, out
    rc, out = validate(
        tmp_path, scenario_text(broken.replace("      count: 3", "        check_env: false\n      count: 3")), capsys
    )
    assert rc == 0, out


def test_plugin_robot_types_are_found_by_entry_point_and_module_class(tmp_path, capsys, plugin_path):
    from bench.robots.plugins import PluginError, entry_points

    assert entry_points()["two_link"] == "fleet_robot_fixture.robots:TwoLink"
    by_entry_point = core.robot_type("two_link")
    by_path = core.robot_type("fleet_robot_fixture.robots:TwoLink")
    assert by_entry_point is by_path and by_entry_point.__module__ == "fleet_robot_fixture.robots"
    assert by_entry_point.name == "two_link" and core.robot_type("reacher").name == "reacher"
    # its own MJCF: the longer second link reaches further than the shipped reacher's
    batch = by_entry_point.fleet(2, seed=0)
    assert isinstance(batch, core.RobotBatch) and batch.model.geom("link1").size[1] > 0.055
    batch.step(np.zeros((2, 2)))
    assert batch.states.shape == (2, 10) and np.isfinite(batch.states).all()
    # a scenario names it as `module:Class` with no edit of bench/
    plugin_group = GYM_GROUP.replace(
        "      gym:\n        env: fleet_robot_fixture/PointReach-v0\n        observation: {state: [joints, to_target]}\n"
        "        action: {names: [joint0.torque, joint1.torque]}\n        fallback: zero\n        success: {info: is_success}\n",
        "      robot: fleet_robot_fixture.robots:TwoLink\n",
    )
    rc, out = validate(tmp_path, scenario_text(plugin_group), capsys)
    assert rc == 0 and "3xfleet_robot_fixture.robots:TwoLink@30Hz" in out, out
    rc, out = validate(tmp_path, scenario_text(plugin_group.replace("robots:TwoLink", "robots:ThreeLink")), capsys)
    assert rc == 2 and "module 'fleet_robot_fixture.robots' has no 'ThreeLink'" in out, out
    with pytest.raises(PluginError, match="cannot import 'no_such_pkg.robots'.*PYTHONPATH"):
        core.robot_type("no_such_pkg.robots:Arm")


def test_a_gym_batch_keeps_the_robot_batch_contract(plugin_path):
    from bench.robots.cameras import make_camera
    from bench.robots.gymenv import gym_robot_type

    config = {
        "env": "fleet_robot_fixture/PointReach-v0",
        "kwargs": {"image": True},
        "observation": {"state": ["joints", "to_target[1]"], "cameras": {"wrist": "camera"}},
        "action": {"scale": 0.5, "offset": 0.1},
        "fallback": [0.2, -0.2],
    }
    cls = gym_robot_type(config, measure=False)
    assert cls.state_names[-2:] == ("joints[7]", "to_target[1]") and cls.fps == 30 and cls.episode_s == 2.0
    # the engine's range is the env's [-1, 1] through offset + scale * a
    assert np.allclose(cls.action_low, [-2.2, -2.2]) and np.allclose(cls.action_high, [1.8, 1.8])
    fleet, alone = cls.fleet(3, seed=5), cls.fleet(1, seed=7)
    assert np.array_equal(fleet.states[2], alone.states[0]), "robot i of a fleet seeded s is the robot seeded s + i"
    camera = make_camera("observation", fleet.robot(1), 16, 16, name="wrist")
    assert camera.frame().shape == (16, 16, 3)
    # None and a NaN row hold: the fixed fallback; a real row is clipped to the engine's range
    fleet.step([None, np.array([np.nan, 0.0]), np.array([9.0, -9.0])])
    assert np.allclose(fleet.last_command, [[0.2, -0.2], [0.2, -0.2], [1.8, -2.2]]) and fleet.bad_commands[1] == 1
    for _ in range(59):
        fleet.step(None)
    assert fleet.done.all() and fleet.truncated.all(), "the env's TimeLimit (60 steps) ends the episode"
    fleet.reset([0])
    assert list(fleet.done) == [False, True, True] and fleet.tick[0] == 0
    # the sizing rule prices a gym robot's tick at its measured cost, not a MuJoCo step's
    from bench.run.sizing import physics_ms_per_tick

    cls.tick_us = 1234.0
    assert physics_ms_per_tick(cls.name, 30.0) == pytest.approx(1.234)


def test_bench_robots_lists_built_in_and_plugin_types(tmp_path):
    scenario = tmp_path / "gym_plugin.yaml"
    scenario.write_text(scenario_text())
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "bench.cli", "robots", "--no-measure", str(scenario), "--gym"),
            "{env: fleet_robot_fixture/PointReach-v0, kwargs: {image: true}, "
            "observation: {state: [joints], cameras: {wrist: camera}}}",
        ],
        cwd=REPO,
        env=plugin_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for head in (
        "reacher  [built in]",
        "arm  [built in]",
        "base  [built in]",
        "two_link  [plugin fleet_robot_fixture.robots:TwoLink]",
        "gym:fleet_robot_fixture/PointReach-v0  [gym fleet_robot_fixture/PointReach-v0]",
    ):
        assert head in out, out
    assert "action:   joint0.torque, joint1.torque (2)" in out and "one env a robot" in out
    assert "not measured" in out and "us/tick" not in out
    # --gym: an env sized before any scenario names it, its images as observation cameras
    assert "gym:fleet_robot_fixture/PointReach-v0~" in out and "wrist (observation, 16x16)" in out, out
