"""Checkpoints: safetensors + JSON only, local paths only, a hash that tracks every byte."""

from __future__ import annotations

import json

import pytest
import torch

from server.policies import (
    CheckpointError,
    PolicyConfig,
    PolicyLoadError,
    load_checkpoint,
    make_policy,
    save_checkpoint,
)
from server.policies.checkpoint import CHECKPOINT_FILES
from server.policies.stats import StatsError

S, A, T = 4, 3, 6


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def config(policy_type: str = "flow_matching") -> PolicyConfig:
    return PolicyConfig(
        type=policy_type,
        state_dim=S,
        action_dim=A,
        chunk_size=T,
        fps=15,
        execution_horizon=4,
        action_names=["x", "y", "grip"],
        hyper_params={"hidden_dim": 32, "obs_embed_dim": 16},
    )


STATS = {
    "observation.state": {"mean": [0.5, -1.0, 0.0, 2.0], "std": [1.0, 0.5, 2.0, 1.0]},
    "action": {"mean": [0.1, 0.2, 0.3], "std": [1.0, 1.0, 0.25]},
}


def saved(tmp_path, name="ckpt", seed=0, policy_type="flow_matching"):
    torch.manual_seed(seed)
    return save_checkpoint(make_policy(config(policy_type)), STATS, tmp_path / name)


def test_round_trip_restores_config_stats_and_identical_outputs(tmp_path):
    torch.manual_seed(0)
    policy = make_policy(config()).eval()
    directory = save_checkpoint(policy, STATS, tmp_path / "ckpt")
    loaded = load_checkpoint(directory)
    assert sorted(p.name for p in directory.iterdir()) == sorted(CHECKPOINT_FILES)  # no pickle files
    assert loaded.config == policy.config
    assert loaded.stats["action"]["std"].tolist() == STATS["action"]["std"]
    assert not loaded.policy.training
    assert not any(p.requires_grad for p in loaded.policy.parameters())
    batch = {"observation.state": torch.randn(2, S)}
    args = ([1, 0], [torch.randn(4, A), None])
    assert torch.equal(loaded.policy.predict_action_chunk(batch, *args), policy.predict_action_chunk(batch, *args))
    assert loaded.revision_info["checkpoint_hash"] == loaded.checkpoint_hash
    assert set(loaded.revision_info["files"]) == set(CHECKPOINT_FILES)


def test_hash_is_stable_across_resave_and_changes_with_any_weight(tmp_path):
    first = load_checkpoint(saved(tmp_path, "a"))
    resaved = load_checkpoint(save_checkpoint(first.policy, STATS, tmp_path / "b"))
    assert resaved.checkpoint_hash == first.checkpoint_hash
    assert len(first.checkpoint_hash) == 64

    finetune = make_policy(config())
    finetune.load_state_dict(first.policy.state_dict())
    with torch.no_grad():
        next(finetune.parameters()).view(-1)[0] += 1e-3  # same names, same shapes, one weight differs
    tuned = load_checkpoint(save_checkpoint(finetune, STATS, tmp_path / "c"))
    assert tuned.config == first.config
    assert tuned.checkpoint_hash != first.checkpoint_hash


def test_hash_changes_with_stats(tmp_path):
    first = load_checkpoint(saved(tmp_path, "a"))
    other = {**STATS, "action": {"mean": [0.1, 0.2, 0.3], "std": [1.0, 1.0, 0.5]}}
    assert (
        load_checkpoint(save_checkpoint(first.policy, other, tmp_path / "b")).checkpoint_hash != first.checkpoint_hash
    )


@pytest.mark.parametrize("source", ["lerobot/pi0_towels", "hf://lerobot/pi0", "https://huggingface.co/lerobot/pi0"])
def test_hub_ids_and_urls_are_refused_with_the_local_path_rule(source):
    with pytest.raises(CheckpointError, match="weights load only from local paths.*download"):
        load_checkpoint(source)


def test_missing_directory_file_or_weights_are_named(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist; weights load only from local paths"):
        load_checkpoint(tmp_path / "nope")
    directory = saved(tmp_path)
    with pytest.raises(CheckpointError, match="is a file"):
        load_checkpoint(directory / "config.json")
    (directory / "stats.json").unlink()
    with pytest.raises(CheckpointError, match=r"lacks \['stats.json'\]"):
        load_checkpoint(directory)


def test_weights_that_do_not_match_the_config_are_refused(tmp_path):
    directory = saved(tmp_path)
    cfg = json.loads((directory / "config.json").read_text())
    cfg["hyper_params"]["hidden_dim"] = 48
    (directory / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="does not match policy type 'flow_matching'.*shape differs"):
        load_checkpoint(directory)


def test_a_no_chunk_checkpoint_is_refused_before_its_weights_are_read(tmp_path):
    directory = saved(tmp_path)
    cfg = json.loads((directory / "config.json").read_text())
    cfg.update(type="no_chunk", hyper_params={})
    (directory / "config.json").write_text(json.dumps(cfg))
    (directory / "model.safetensors").write_bytes(b"not safetensors at all")
    with pytest.raises(PolicyLoadError, match="no predict_action_chunk"):
        load_checkpoint(directory)


def test_bad_stats_are_refused_naming_the_entry(tmp_path):
    directory = saved(tmp_path)
    stats = json.loads((directory / "stats.json").read_text())
    stats["action"]["std"][1] = 0.0
    (directory / "stats.json").write_text(json.dumps(stats))
    with pytest.raises(StatsError, match=r"stats.json\['action'\]\['std'\] has a value <= 0"):
        load_checkpoint(directory)


def test_load_casts_to_the_requested_dtype(tmp_path):
    loaded = load_checkpoint(saved(tmp_path), dtype="bfloat16")
    assert all(p.dtype == torch.bfloat16 for p in loaded.policy.parameters())
    out = loaded.policy.predict_action_chunk({"observation.state": torch.randn(1, S)}, [1], [torch.zeros(4, A)])
    assert out.dtype == torch.float32
