"""LeRobot checkpoints (written by LeRobot's own save_pretrained) served by a policy-server process.

One `policy-server` process serves a LeRobot ACT (shared, one camera) and a LeRobot Diffusion (exclusive,
state + environment state) through a real router; every served chunk is compared with LeRobot's own
`predict_action_chunk` / `select_action` and its saved pre/postprocessors on the same observation.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml

from server.policies.checkpoint import CheckpointError, load_checkpoint
from server.policies.lerobot_random import write_random_checkpoint
from server.runtime import InferItem, ModelRuntime
from tests.server.zclient import RawClient
from wire import ActionChunk, Error, ErrorCode, ReplicaKeys, SessionAck, conformance
from wire.images import encode_image
from wire.procs import ChildProcess

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FPS = 10.0
ACT_STATE, ACT_ACTIONS, ACT_CHUNK, CAM = 6, 4, 10, (32, 32)
DP_STATE, DP_ENV, DP_ACTIONS, DP_CHUNK = 4, 2, 3, 6
DP_NAMES = ["x", "y", "grip"]  # the manifest's model.action_names (LeRobot's config names none)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("lerobot")
    act = write_random_checkpoint(
        root / "act_arm", "act", ACT_STATE, ACT_ACTIONS, ACT_CHUNK, dim_model=64, cameras=[("front", *CAM)]
    )
    dp = write_random_checkpoint(
        root / "dp_arm", "diffusion", DP_STATE, DP_ACTIONS, DP_CHUNK, dim_model=32, env_state_dim=DP_ENV
    )
    return act, dp


@pytest.fixture(scope="module")
def served(ckpts, tmp_path_factory):
    """(router endpoint, server process) serving act_arm and dp_arm in one policy-server process."""
    from wire.procs import start_router

    tmp = tmp_path_factory.mktemp("served")
    router, endpoint = start_router(None, tmp / "router.log")
    act, dp = ckpts
    manifest = {
        "model": {"repo_or_path": str(act)},
        "model_id": "act_arm",
        "trained_fps": FPS,
        "warmup_inferences": 1,
        "max_sessions": 8,
        "scheduling": {"max_batch": 4},
        "zenoh": {"connect_endpoints": [endpoint]},
        "extra_models": [
            {"model": {"repo_or_path": str(dp), "action_names": DP_NAMES}, "model_id": "dp_arm", "trained_fps": FPS}
        ],
    }
    path = tmp / "m.yaml"
    path.write_text(yaml.safe_dump(manifest))
    child = ChildProcess(
        [sys.executable, "-m", "server.cli", "--manifest", str(path)],
        tmp / "server.log",
        ready_text="policy-server ready",
        name="server",
    )
    try:
        child.start(timeout_s=90)
        yield endpoint, child
    finally:
        child.stop()
        router.stop()


def lerobot_reference(directory):
    """LeRobot's own policy and processors for `directory`, loaded as LeRobot's docs do it."""
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.policies.factory import get_policy_class, make_pre_post_processors

    cfg = PreTrainedConfig.from_pretrained(str(directory))
    policy = get_policy_class(cfg.type).from_pretrained(str(directory), config=cfg).eval()
    pre, post = make_pre_post_processors(cfg, pretrained_path=str(directory))
    return policy, pre, post


def act_observation(seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(ACT_STATE).astype(np.float32), rng.integers(0, 256, (*CAM, 3), dtype=np.uint8)


def open_client(endpoint, model, uuid, state_dim, actions, **kw):
    """`actions`: the action names, or their count for LeRobot's default names."""
    names = [f"action_{i}" for i in range(actions)] if isinstance(actions, int) else actions
    c = RawClient(endpoint, ReplicaKeys(model, "main", "r0"), uuid)
    ack = c.open(fps=FPS, state_dim=state_dim, action_names=names, **kw)
    return c, ack


def chunk_of(c, state, **kw):
    seq = c.send(state, **kw)
    got = c.chunk_for(seq, timeout=20)
    assert got is not None, f"no chunk for seq {seq}"
    return got[1]


def test_a_lerobot_act_served_remotely_equals_lerobots_own_chunk(ckpts, served):
    endpoint, _ = served
    state, frame = act_observation(1)
    c, ack = open_client(endpoint, "act_arm", "robot-act", ACT_STATE, ACT_ACTIONS, cameras={"front": [*CAM, 3]})
    try:
        assert isinstance(ack, SessionAck), ack
        msg = chunk_of(c, state, images={"front": encode_image(frame, "raw")}, episode_start=True)
        assert isinstance(msg, ActionChunk), msg
    finally:
        c.close()
    policy, pre, post = lerobot_reference(ckpts[0])
    image = torch.from_numpy(frame).permute(2, 0, 1).float() / 255.0  # as lerobot's control_utils.predict_action
    batch = pre({"observation.state": torch.from_numpy(state), "observation.images.front": image})
    with torch.no_grad():
        model = policy.predict_action_chunk(batch)
    robot = post(model)[0].numpy()
    assert msg.chunk_robot.shape == (ACT_CHUNK, ACT_ACTIONS)
    np.testing.assert_array_equal(msg.chunk_model, model[0].numpy())  # byte-identical: one thread, batch of one
    np.testing.assert_array_equal(msg.chunk_robot, robot)


def test_a_lerobot_diffusion_is_exclusive_and_equals_lerobots_own_select_action(ckpts, served):
    endpoint, _ = served
    rng = np.random.default_rng(2)
    states = [rng.standard_normal(DP_STATE + DP_ENV).astype(np.float32) for _ in range(2)]
    c, ack = open_client(endpoint, "dp_arm", "robot-dp", DP_STATE + DP_ENV, DP_NAMES)
    other = None
    try:
        assert isinstance(ack, SessionAck), ack
        assert c.status().serving_mode == "exclusive"
        other, busy = open_client(endpoint, "dp_arm", "robot-dp-2", DP_STATE + DP_ENV, DP_NAMES)
        assert isinstance(busy, Error) and busy.code == ErrorCode.EXCLUSIVE_BUSY, busy
        served_chunks = [chunk_of(c, s, episode_start=(i == 0)).chunk_robot for i, s in enumerate(states)]
    finally:
        c.close()
        if other is not None:
            other.close()
    policy, pre, post = lerobot_reference(ckpts[1])
    policy.reset()
    for state, got in zip(states, served_chunks):  # the second chunk sees both observations in LeRobot's queue
        batch = pre({"observation.state": torch.from_numpy(state[:DP_STATE]),
                     "observation.environment_state": torch.from_numpy(state[DP_STATE:])})  # fmt: skip
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(0)  # the served noise_seed
            first = policy.select_action(batch)
        chunk = torch.stack([first, *policy._queues["action"]], dim=1)
        policy._queues["action"].clear()
        np.testing.assert_allclose(got, post(chunk)[0].numpy(), rtol=0, atol=1e-5)


def test_rtc_against_act_gets_append_mode_naming_why_and_the_status_says_no_rtc(served):
    endpoint, _ = served
    c, ack = open_client(
        endpoint, "act_arm", "robot-rtc", ACT_STATE, ACT_ACTIONS, cameras={"front": [*CAM, 3]}, rtc_enabled=True
    )
    try:
        assert isinstance(ack, SessionAck) and ack.rtc_enabled is False
        assert any("takes no inference_delay / prev_chunk_left_over" in w for w in ack.warnings), ack.warnings
        status = c.status()
        assert (status.policy_type, status.supports_rtc, status.serving_mode) == ("act", False, "shared")
        assert status.chunk_size == ACT_CHUNK and status.cameras == {"front": [*CAM, 3]}
    finally:
        c.close()


def test_a_wrong_state_size_or_a_missing_camera_is_refused_with_the_reason(served):
    endpoint, _ = served
    wrong, ack = open_client(endpoint, "act_arm", "robot-bad", ACT_STATE + 1, ACT_ACTIONS, cameras={"front": [*CAM, 3]})
    wrong.close()
    assert isinstance(ack, Error) and ack.code == ErrorCode.STATE_DIM_MISMATCH, ack
    assert f"the policy expects {ACT_STATE}" in ack.message
    blind, ack = open_client(endpoint, "act_arm", "robot-blind", ACT_STATE, ACT_ACTIONS)
    blind.close()
    assert isinstance(ack, Error) and ack.code == ErrorCode.CAMERA_MISMATCH and "front" in ack.message, ack
    c, ack = open_client(endpoint, "act_arm", "robot-nocam", ACT_STATE, ACT_ACTIONS, cameras={"front": [*CAM, 3]})
    try:  # opened with the camera, then an observation without its frame
        assert isinstance(ack, SessionAck), ack
        seq = c.send(np.zeros(ACT_STATE, np.float32))
        got = c.wait_for(lambda h, m: isinstance(m, Error) and m.seq_id == seq, timeout=20)
        assert got is not None and got[1].code == ErrorCode.CAMERA_MISMATCH, got
        assert "observation.images.front" in got[1].message
    finally:
        c.close()


def test_the_wire_conformance_suite_passes_against_a_lerobot_act_replica(served, capsys):
    endpoint, _ = served
    rc = conformance.main(["--router", endpoint, "--model", "act_arm"])
    out = capsys.readouterr().out
    assert rc == 0 and "FAIL" not in out, out


def test_micro_batched_act_chunks_equal_each_session_alone(ckpts):
    runtime = ModelRuntime(load_checkpoint(ckpts[0], trained_fps=FPS))
    observations = [act_observation(seed) for seed in range(4)]
    items = [InferItem(runtime.new_pipeline(), s, {"front": f}) for s, f in observations]
    assert items[0].pipeline.preprocessor is not items[1].pipeline.preprocessor  # per-session LeRobot processors
    batched = runtime.infer(items, emulate=False)
    assert {r.batch for r in batched} == {4} and not any(r.error for r in batched)
    for (state, frame), together in zip(observations, batched):
        alone = runtime.infer([InferItem(runtime.new_pipeline(), state, {"front": frame})], emulate=False)[0]
        np.testing.assert_allclose(together.chunk_robot, alone.chunk_robot, rtol=0, atol=1e-5)


def test_the_checkpoint_hash_covers_lerobots_processor_files(ckpts, tmp_path):
    import shutil

    before = load_checkpoint(ckpts[1], trained_fps=FPS)
    copy = shutil.copytree(ckpts[1], tmp_path / "dp_copy")
    stats = next(copy.glob("policy_postprocessor_step_*.safetensors"))
    data = bytearray(stats.read_bytes())
    data[-1] ^= 1  # one bit of the unnormaliser's dataset stats
    stats.write_bytes(bytes(data))
    after = load_checkpoint(copy, trained_fps=FPS)
    assert before.checkpoint_hash != after.checkpoint_hash
    assert stats.name in after.revision_info["files"] and "model.safetensors" in after.revision_info["files"]


def test_a_hub_id_and_an_unsupported_lerobot_dir_are_refused_with_the_fix(ckpts, tmp_path):
    with pytest.raises(CheckpointError, match="looks like a Hub repo id.*huggingface-cli download lerobot/act_aloha"):
        load_checkpoint("lerobot/act_aloha_sim_transfer_cube_human")
    with pytest.raises(CheckpointError, match="set `trained_fps:` in the manifest"):
        load_checkpoint(ckpts[0])
    with pytest.raises(CheckpointError, match="model.action_names has 2 names but .* outputs 4 actions"):
        load_checkpoint(ckpts[0], trained_fps=FPS, action_names=["a", "b"])
    no_processors = tmp_path / "old_act"
    no_processors.mkdir()
    for name in ("config.json", "model.safetensors"):
        (no_processors / name).write_bytes((ckpts[0] / name).read_bytes())
    with pytest.raises(CheckpointError, match="lacks \\['policy_preprocessor.json'.*migrate_policy_normalization"):
        load_checkpoint(no_processors, trained_fps=FPS)


def test_server_modules_import_without_lerobot():
    code = (
        "import sys, server.service, server.policies, server.runtime, server.processors, server.policies.checkpoint; "
        "assert not [m for m in sys.modules if m == 'lerobot' or m.startswith('lerobot.')], 'lerobot imported'"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_the_lerobot_act_benchmark_times_the_served_forward_and_gives_p10(tmp_path):
    import json

    from benchmarks import lerobot_act

    out = tmp_path / "lerobot_act.json"
    assert lerobot_act.main(["--dim-model", "64", "--batches", "1", "2", "--repeats", "2", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["batches"]) == {"1", "2"} and report["batches"]["1"]["forward_ms_p50"] > 0
    p10 = report["p10"]["1"]
    assert p10["n_max"] == min(p10["utilization_bound"], p10["latency_bound"]) > 0


def test_policy_server_check_accepts_a_lerobot_checkpoint(ckpts):
    from server.check import check_policy

    report = check_policy(ckpts[0], trained_fps=FPS)
    assert (report["type"], report["policy_class"], report["supports_rtc"]) == ("act", "stateless", False)
    assert report["chunk_size"] == ACT_CHUNK and report["cameras"] == {"front": [*CAM, 3]}


def test_a_config_naming_imagenet_backbone_weights_loads_offline_with_the_checkpoints_tensors(ckpts, tmp_path):
    import json
    import shutil

    copy = shutil.copytree(ckpts[0], tmp_path / "act_imagenet")
    config = json.loads((copy / "config.json").read_text())
    config["pretrained_backbone_weights"] = "ResNet18_Weights.IMAGENET1K_V1"  # as a hub ACT config names them
    (copy / "config.json").write_text(json.dumps(config))
    state, frame = act_observation(3)
    chunks = []
    for directory in (ckpts[0], copy):
        runtime = ModelRuntime(load_checkpoint(directory, trained_fps=FPS))
        chunks.append(runtime.infer([InferItem(runtime.new_pipeline(), state, {"front": frame})])[0].chunk_robot)
    np.testing.assert_array_equal(chunks[0], chunks[1])


def test_lerobot_families_classify_as_design_004_says_and_other_types_are_refused(tmp_path):
    import json

    from server.policies.base import classify
    from server.policies.lerobot import _wrapper_class

    assert {t: classify(_wrapper_class(t)) for t in ("act", "pi0", "pi05", "smolvla", "diffusion")} == {
        "act": "stateless",
        "pi0": "stateless",
        "pi05": "stateless",
        "smolvla": "stateless",
        "diffusion": "stateful",
    }
    sac = tmp_path / "sac"
    sac.mkdir()
    (sac / "config.json").write_text(json.dumps({"type": "sac"}))
    with pytest.raises(CheckpointError, match="LeRobot policy type 'sac' is not served.*act, diffusion"):
        load_checkpoint(sac, trained_fps=FPS)
