"""`bench train --policy-type T --rtc-mode training_time`: the (robot, policy, mode) recipe is the one that runs,
end to end (prefix demos, a DAgger round, evaluation skipped), and the checkpoint it writes is a training-time one
of that policy type; a combination without a recipe is refused with the ones that exist."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from bench.training import train
from server.policies.checkpoint import load_checkpoint
from server.policies.train import TRAINING_LOG_FILE

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

TINY = {"d_model": 16, "num_heads": 2, "num_layers": 1, "obs_layers": 1, "mlp_ratio": 2, "num_steps": 3}


def test_the_transformer_training_time_recipe_trains_end_to_end(tmp_path, monkeypatch):
    key = ("reacher", "flow_transformer", "training_time")
    tiny = replace(
        train.RTC_MODE_RECIPES[key],
        episodes=2,
        epochs=2,
        max_prefix_rows=2,
        on_policy_episodes=1,
        hyper_params=TINY,
        eval_episodes=0,
    )
    monkeypatch.setitem(train.RTC_MODE_RECIPES, key, tiny)
    path = train.train_robot_policy(
        "reacher", tmp_path / "ckpt", seed=0, policy_type="flow_transformer", rtc_mode="training_time", evaluate=False
    )
    log = json.loads((path / TRAINING_LOG_FILE).read_text())
    assert log["recipe"]["policy_type"] == "flow_transformer" and log["recipe"]["epochs"] == 2
    assert log["on_policy_samples"] > 0 and log["prefix_rows_mean"] > 0  # the DAgger round ran on prefixed requests
    policy = load_checkpoint(path).policy
    assert policy.config.type == "flow_transformer" and policy.prefix_conditioned
    assert policy.hp["rtc_mode"] == "training_time" and policy.hp["max_prefix_rows"] == 2
    prefix = torch.full((4, 2), 0.25)
    chunk = policy.predict_action_chunk({"observation.state": torch.zeros(1, 10)}, [2], [prefix])[0]
    assert torch.equal(chunk[:2], prefix[:2])


def test_a_policy_type_without_a_training_time_recipe_is_refused_naming_the_recipes(tmp_path):
    with pytest.raises(train.TrainError, match="--policy-type flow_transformer --rtc-mode training_time"):
        train.train_robot_policy("reacher", tmp_path, policy_type="mlp_chunk", rtc_mode="training_time")
