"""check_policy and `policy-server check`: every shipped checkpoint passes the server's rules, and broken ones
(weights of another shape, a policy returning a short chunk, NaN weights, config-only) fail naming the problem."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.scenario.checkpoints import GENERATED
from server.check import PolicyCheckError, check_policy
from server.cli import main
from server.policies import (
    CheckpointError,
    PolicyConfig,
    PolicyLoadError,
    load_checkpoint,
    make_policy,
    save_checkpoint,
)
from server.policies.base import register_policy
from server.policies.lerobot import is_lerobot_checkpoint
from server.policies.mlp_chunk import MlpChunkPolicy

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

CHECKPOINTS = Path(__file__).resolve().parents[2] / "bench" / "checkpoints"
# not the ones made where they run (bench.scenario.checkpoints.GENERATED, git-ignored: a LeRobot one needs trained_fps)
# this project's own policy checkpoints; a shipped LeRobot one (its config is LeRobot's, its rate in the manifest)
# is checked by tests/bench/training/test_lerobot_act.py and tests/server/test_lerobot.py
SHIPPED = sorted(
    p.name
    for p in CHECKPOINTS.iterdir()
    if (p / "model.safetensors").is_file() and p.name not in GENERATED and not is_lerobot_checkpoint(p)
)
CLI = [sys.executable, "-m", "server.cli", "check"]
S, A, T = 4, 3, 6
STATS = {"observation.state": {"mean": [0.0] * S, "std": [1.0] * S}, "action": {"mean": [0.0] * A, "std": [1.0] * A}}


def saved(tmp_path, policy_type="flow_matching", name="ckpt"):
    cfg = PolicyConfig(
        type=policy_type,
        state_dim=S,
        action_dim=A,
        chunk_size=T,
        fps=15,
        execution_horizon=4,
        action_names=["x", "y", "grip"],
        hyper_params={"hidden_dim": 32, "obs_embed_dim": 16},
    )
    torch.manual_seed(0)
    return save_checkpoint(make_policy(cfg), STATS, tmp_path / name)


@register_policy("test_short_chunk")
class _ShortChunk(MlpChunkPolicy):
    """Returns one row fewer than config.json's chunk_size: the server would send robots short chunks."""

    def predict_action_chunk(self, batch, inference_delay, prefix):
        return super().predict_action_chunk(batch, inference_delay, prefix)[:, :-1]


def test_the_shipped_checkpoints_are_found():
    assert {"arm", "reacher", "reacher_transformer", "reacher_camera_untrained"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_checkpoint_passes_check_policy(name):
    report = check_policy(CHECKPOINTS / name)
    cfg = json.loads((CHECKPOINTS / name / "config.json").read_text())
    assert report["checkpoint_hash"] == load_checkpoint(CHECKPOINTS / name).checkpoint_hash
    assert (report["type"], report["state_dim"], report["chunk_size"]) == (
        cfg["type"],
        cfg["state_dim"],
        cfg["chunk_size"],
    )
    assert report["action_names"] == cfg["action_names"] and set(report["cameras"]) == set(cfg["image_features"])


def test_a_config_only_checkpoint_fails_naming_init_weights():
    with pytest.raises(CheckpointError, match=r"lacks \['model.safetensors'\].*`bench init-weights .*reacher_vla`"):
        check_policy(CHECKPOINTS / "reacher_vla")


def test_weights_of_another_shape_fail_by_the_loaders_rule(tmp_path):
    directory = saved(tmp_path)
    cfg = json.loads((directory / "config.json").read_text())
    cfg["hyper_params"]["hidden_dim"] = 48
    (directory / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="does not match policy type 'flow_matching'.*shape differs"):
        check_policy(directory)


def test_a_policy_returning_a_chunk_of_the_wrong_shape_fails_naming_both_shapes(tmp_path):
    directory = saved(tmp_path, "test_short_chunk")
    load_checkpoint(directory)  # the loader alone finds nothing wrong; the server's warm-up does
    with pytest.raises(
        PolicyCheckError,
        match=r"warm-up forward pass failed: postprocess failed: chunk has shape "
        r"\(1, 5, 3\); expected \(1, 6, 3\).*no replica of this checkpoint "
        r"would start",
    ):
        check_policy(directory)


def test_nan_weights_fail_at_the_servers_warm_up(tmp_path):
    cfg = PolicyConfig(
        type="mlp_chunk",
        state_dim=S,
        action_dim=A,
        chunk_size=T,
        fps=15,
        execution_horizon=4,
        action_names=["x", "y", "grip"],
        hyper_params={"hidden_dim": 32, "obs_embed_dim": 16},
    )
    policy = make_policy(cfg)
    with torch.no_grad():
        for p in policy.parameters():
            p.fill_(float("nan"))
    directory = save_checkpoint(policy, STATS, tmp_path / "nan")
    with pytest.raises(
        PolicyLoadError, match="warm-up forward pass on a zero observation: the policy produced non-finite actions"
    ):
        check_policy(directory)


def test_the_cli_says_ok_or_the_problem_in_one_line_without_a_traceback(tmp_path, capsys):
    ok = subprocess.run(CLI + [str(CHECKPOINTS / "reacher")], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "policy-server check: OK" in ok.stdout and "flow_matching" in ok.stdout, ok
    # the short-chunk type is registered in this process only: the CLI's process refuses it by the registry's rule
    target = str(saved(tmp_path, "test_short_chunk"))
    bad = subprocess.run(CLI + [target], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "OK" not in bad.stdout, bad
    assert (
        bad.stderr.count("\n") == 1 and target in bad.stderr and "unknown policy type 'test_short_chunk'" in bad.stderr
    )
    for target, words in {
        str(tmp_path / "missing"): "does not exist",
        str(CHECKPOINTS / "reacher" / "config.json"): "is a file",
    }.items():
        assert main(["check", target]) == 2
        out = capsys.readouterr()
        assert out.out == "" and out.err.count("\n") == 1 and target in out.err and words in out.err, out
