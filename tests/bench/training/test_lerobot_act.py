"""`bench train --policy-type lerobot_act`: the expert's demos become a LeRobotDataset, LeRobot's ACT trains on it with
LeRobot's step, and the checkpoint is one the server loads and serves; the shipped fleet scenario validates."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("lerobot")

from bench import cli  # noqa: E402
from bench.evidence.exitcode import Exit  # noqa: E402
from bench.scenario.load import CHECKPOINTS_DIR, SCENARIOS_DIR  # noqa: E402
from bench.training import lerobot_act  # noqa: E402

TINY = replace(
    lerobot_act.ACT_RECIPES["reacher"],
    episodes=2,
    episode_s=0.5,
    chunk_size=8,
    dim_model=32,
    n_heads=2,
    dim_feedforward=64,
    steps=40,
    batch_size=8,
    lr=1e-3,
    eval_episodes=0,
)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("act") / "reacher_lerobot_act"
    return lerobot_act.train_lerobot_act("reacher", out, recipe=TINY)


def test_the_demos_are_a_lerobot_dataset_with_the_state_split_as_the_server_reads_it(trained):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from bench.robots import robot_type

    dataset = LeRobotDataset("bench/reacher_expert", root=trained / lerobot_act.DATASET_DIR)
    assert dataset.meta.total_episodes == 2 and dataset.fps == 30
    names = list(robot_type("reacher").state_names)
    assert dataset.meta.features[lerobot_act.STATE]["names"] == names[:8]
    assert dataset.meta.features[lerobot_act.ENV_STATE]["names"] == names[8:]  # the wire state's tail
    frame = dataset[0]
    assert frame[lerobot_act.STATE].shape == (8,) and frame[lerobot_act.ENV_STATE].shape == (2,)


def test_training_runs_lerobots_step_and_lowers_the_loss(trained):
    log = json.loads((trained / lerobot_act.TRAINING_FILE).read_text())
    assert log["steps"] == TINY.steps and log["policy"] == "lerobot_act"
    assert np.isfinite(log["final_loss"]) and log["final_loss"] < log["first_loss"]
    assert not (trained / lerobot_act.EVALUATION_FILE).exists()  # eval_episodes 0: no figure written


def test_the_checkpoint_loads_in_the_server_as_a_lerobot_act_and_returns_robot_space_chunks(trained):
    from server.policies.checkpoint import load_checkpoint

    loaded = load_checkpoint(trained, trained_fps=30, action_names=["joint0.torque", "joint1.torque"])
    assert loaded.config.type == "act" and loaded.config.state_dim == 10 and loaded.config.chunk_size == 8
    act = lerobot_act.LeRobotCheckpointPolicy(trained, 30, ["joint0.torque", "joint1.torque"])
    chunk = act(np.zeros(10, np.float32))
    assert chunk.shape == (8, 2) and np.isfinite(chunk).all()


def test_bench_train_refuses_what_lerobot_act_has_no_recipe_or_flag_for(capsys):
    assert cli.main(["train", "--robot", "arm", "--policy-type", "lerobot_act"]) == Exit.INVALID
    err = capsys.readouterr().err
    assert "no lerobot_act recipe for robot type 'arm'; recipes: reacher" in err and "Traceback" not in err
    assert cli.main(["train", "--robot", "reacher", "--policy-type", "lerobot_act", "--rtc-mode", "training_time"]) == (
        Exit.INVALID
    )
    assert "LeRobot's ACT has no RTC" in capsys.readouterr().err


@pytest.mark.skipif(
    not (CHECKPOINTS_DIR / "reacher_lerobot_act" / "model.safetensors").is_file(), reason="shipped checkpoint absent"
)
def test_the_shipped_act_checkpoint_and_its_fleet_scenario_validate(capsys):
    assert cli.main(["validate", str(SCENARIOS_DIR / "lerobot_act.yaml")]) == Exit.PASS, capsys.readouterr().err
