"""Per-session pipelines: no cross-session state, shared read-only stats, images, RTC prefix re-anchoring."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from server.policies import PolicyConfig, load_checkpoint, make_policy, save_checkpoint
from server.processors import (
    NormalizeStep,
    ProcessorError,
    RelativeActionsStep,
    images_to_model,
    make_session_pipeline,
    prepare_prefix,
)
from wire.images import encode_image

S, A, T, H = 5, 3, 6, 4
STATS = {
    "observation.state": {"mean": [1.0, 2.0, 3.0, 4.0, 5.0], "std": [2.0, 2.0, 2.0, 2.0, 0.5]},
    "action": {"mean": [0.5, -0.5, 0.0], "std": [0.5, 2.0, 4.0]},
}
INDICES = [4, 0, 2]  # action a is anchored at state[INDICES[a]]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def checkpoint(tmp_path, relative=True, cams=None):
    cfg = PolicyConfig(
        type="mlp_chunk",
        state_dim=S,
        action_dim=A,
        chunk_size=T,
        fps=10,
        execution_horizon=H,
        image_features=cams or {},
        relative_actions=relative,
        relative_state_indices=INDICES if relative else [],
        hyper_params={"hidden_dim": 16, "obs_embed_dim": 8},
    )
    torch.manual_seed(0)
    return load_checkpoint(save_checkpoint(make_policy(cfg), STATS, tmp_path / f"ckpt_{relative}_{bool(cams)}"))


def mean(key):
    return np.array(STATS[key]["mean"], dtype=np.float32)


def std(key):
    return np.array(STATS[key]["std"], dtype=np.float32)


def test_eight_sessions_interleaved_each_get_their_own_state_back(tmp_path):
    loaded = checkpoint(tmp_path)
    pipelines = [make_session_pipeline(loaded) for _ in range(8)]
    joint_states = [np.arange(S, dtype=np.float32) * (i + 1) + 10 * i for i in range(8)]
    chunk_model = torch.randn(1, T, A, generator=torch.Generator().manual_seed(0))
    for pipeline, state in zip(pipelines, joint_states):
        batch = pipeline.preprocess({"observation.state": state})
        np.testing.assert_allclose(
            batch["observation.state"][0].numpy(),
            (state - mean("observation.state")) / std("observation.state"),
            rtol=1e-6,
        )
    order = list(range(8))
    random.Random(0).shuffle(order)
    for i in order:  # postprocess in a different order than preprocess
        robot = pipelines[i].postprocess(chunk_model).numpy()
        expected = chunk_model[0].numpy() * std("action") + mean("action") + joint_states[i][INDICES]
        np.testing.assert_allclose(robot, expected, rtol=1e-5, atol=1e-5)
    assert len({id(p.find(RelativeActionsStep)) for p in pipelines}) == 8


def test_stats_tensors_are_shared_by_every_session_and_never_written(tmp_path):
    loaded = checkpoint(tmp_path)
    before = {k: {f: t.clone() for f, t in e.items()} for k, e in loaded.stats.items()}
    pipelines = [make_session_pipeline(loaded) for _ in range(8)]
    for pipeline in pipelines:
        stats = pipeline.find(NormalizeStep).stats
        for key, entry in loaded.stats.items():
            for field, tensor in entry.items():
                assert stats[key][field].data_ptr() == tensor.data_ptr()
        pipeline.preprocess({"observation.state": np.ones(S)})
        pipeline.postprocess(torch.ones(T, A))
    for key, entry in loaded.stats.items():
        for field, tensor in entry.items():
            assert torch.equal(tensor, before[key][field])


def test_postprocess_before_preprocess_is_an_error_and_reset_clears_the_anchor(tmp_path):
    pipeline = make_session_pipeline(checkpoint(tmp_path))
    with pytest.raises(ProcessorError, match="postprocess before preprocess"):
        pipeline.postprocess(torch.zeros(T, A))
    pipeline.preprocess({"observation.state": np.ones(S)})
    pipeline.postprocess(torch.zeros(1, T, A))
    pipeline.reset()
    with pytest.raises(ProcessorError, match="postprocess before preprocess"):
        pipeline.postprocess(torch.zeros(T, A))


def test_absolute_policy_postprocess_only_unnormalises(tmp_path):
    pipeline = make_session_pipeline(checkpoint(tmp_path, relative=False))
    pipeline.preprocess({"observation.state": np.full(S, 100.0)})
    np.testing.assert_allclose(pipeline.postprocess(torch.zeros(T, A)).numpy(), np.tile(mean("action"), (T, 1)))


def test_bad_observations_are_named(tmp_path):
    pipeline = make_session_pipeline(checkpoint(tmp_path, cams={"top": [3, 8, 8]}))
    with pytest.raises(ProcessorError, match="expects 5"):
        pipeline.preprocess({"observation.state": np.ones(S + 1)})
    with pytest.raises(ProcessorError, match="camera 'top'"):
        pipeline.preprocess({"observation.state": np.ones(S)})
    with pytest.raises(ProcessorError, match="uint8 RGB"):
        pipeline.preprocess({"observation.state": np.ones(S), "observation.images.top": np.zeros((8, 8, 3))})
    with pytest.raises(ProcessorError, match="non-finite"):
        pipeline.preprocess({"observation.state": np.full(S, np.nan)})


def test_images_are_resized_to_the_declared_shape_in_rgb_order(tmp_path):
    loaded = checkpoint(tmp_path, cams={"top": [3, 12, 16]})
    pipeline = make_session_pipeline(loaded)
    red = np.zeros((48, 64, 3), dtype=np.uint8)
    red[..., 0] = 255
    batch = pipeline.preprocess({"observation.state": np.ones(S), "observation.images.top": red, "task": "ignored"})
    image = batch["observation.images.top"]
    assert set(batch) == {"observation.state", "observation.images.top"}
    assert image.shape == (1, 3, 12, 16) and image.dtype == torch.float32
    torch.testing.assert_close(image[0, 0], torch.ones(12, 16))
    torch.testing.assert_close(image[0, 1:], torch.zeros(2, 12, 16))
    png = pipeline.preprocess({"observation.state": np.ones(S), "observation.images.top": encode_image(red, "png")})
    assert torch.equal(png["observation.images.top"], image)
    out = loaded.policy.predict_action_chunk(batch, [0], [None])
    assert pipeline.postprocess(out).shape == (T, A)


def test_a_frame_resizes_identically_alone_or_in_a_batch():
    frames = np.random.default_rng(0).integers(0, 256, size=(3, 30, 40, 3), dtype=np.uint8)
    together = images_to_model(frames, [3, 15, 20])
    for i in range(3):
        torch.testing.assert_close(images_to_model(frames[i], [3, 15, 20])[0], together[i], rtol=0, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(0, 9), horizon=st.integers(1, 8))
def test_prefix_is_cut_or_padded_by_repeating_its_last_row(tmp_path_factory, rows, horizon):
    pipeline = make_session_pipeline(checkpoint(tmp_path_factory.mktemp("p"), relative=False))
    prefix_model = np.arange(rows * A, dtype=np.float32).reshape(rows, A)
    out = prepare_prefix(pipeline, prefix_model, None, None, horizon)
    if rows == 0:
        assert out is None
        return
    assert out.shape == (horizon, A) and out.dtype == torch.float32
    kept = min(rows, horizon)
    np.testing.assert_array_equal(out[:kept].numpy(), prefix_model[:kept])
    np.testing.assert_array_equal(out[kept:].numpy(), np.repeat(prefix_model[-1:], horizon - kept, axis=0))


def test_relative_prefix_is_reanchored_to_the_current_state_and_normalised(tmp_path):
    pipeline = make_session_pipeline(checkpoint(tmp_path))
    old_state = np.array([0.0, 1.0, 2.0, 3.0, 4.0], dtype=np.float32)
    current_state = old_state + np.array([0.5, -1.0, 2.0, 0.0, 1.5], dtype=np.float32)
    prefix_robot = np.random.default_rng(0).normal(size=(3, A)).astype(np.float32) + old_state[INDICES]
    stale_model = ((prefix_robot - old_state[INDICES]) - mean("action")) / std("action")
    pipeline.preprocess({"observation.state": current_state})
    out = prepare_prefix(pipeline, stale_model, prefix_robot, current_state, H).numpy()
    expected = ((prefix_robot - current_state[INDICES]) - mean("action")) / std("action")
    np.testing.assert_allclose(out[:3], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[3], expected[-1], rtol=1e-5, atol=1e-6)
    # Without an explicit state the anchor cached by this request's preprocess is used.
    np.testing.assert_allclose(prepare_prefix(pipeline, None, prefix_robot, None, H).numpy(), out)
    # Round trip: postprocess of the re-anchored prefix gives the robot-space prefix back.
    np.testing.assert_allclose(
        pipeline.postprocess(torch.as_tensor(np.resize(out, (T, A))))[:3].numpy(), prefix_robot, rtol=1e-5, atol=1e-5
    )


def test_relative_prefix_without_its_robot_space_rows_is_refused(tmp_path):
    pipeline = make_session_pipeline(checkpoint(tmp_path))
    pipeline.preprocess({"observation.state": np.ones(S)})
    with pytest.raises(ProcessorError, match="needs prefix_robot"):
        prepare_prefix(pipeline, np.zeros((2, A)), None, np.ones(S), H)
    assert prepare_prefix(pipeline, None, None, np.ones(S), H) is None
    assert prepare_prefix(pipeline, np.zeros((0, A)), np.zeros((0, A)), np.ones(S), H) is None
    with pytest.raises(ProcessorError, match=r"expected \(L, 3\)"):
        prepare_prefix(pipeline, None, np.zeros((2, A + 1)), np.ones(S), H)


def test_absolute_policy_with_only_a_robot_space_prefix_normalises_it(tmp_path):
    pipeline = make_session_pipeline(checkpoint(tmp_path, relative=False))
    prefix_robot = np.ones((2, A), dtype=np.float32)
    out = prepare_prefix(pipeline, None, prefix_robot, None, 2).numpy()
    np.testing.assert_allclose(out, (prefix_robot - mean("action")) / std("action"))


def test_chunks_come_back_as_cpu_float32_and_bad_shapes_are_named(tmp_path):
    pipeline = make_session_pipeline(checkpoint(tmp_path, relative=False))
    pipeline.preprocess({"observation.state": np.ones(S)})
    assert pipeline.postprocess(torch.zeros(1, T, A, dtype=torch.bfloat16)).dtype == torch.float32
    with pytest.raises(ProcessorError, match=r"chunk has shape \(1, 5, 3\)"):
        pipeline.postprocess(torch.zeros(1, T - 1, A))


def test_reanchored_prefix_and_guidance_continue_the_old_chunk_in_robot_space(tmp_path):
    cfg = PolicyConfig(
        type="flow_matching",
        state_dim=S,
        action_dim=A,
        chunk_size=T,
        fps=10,
        execution_horizon=H,
        relative_actions=True,
        relative_state_indices=INDICES,
        hyper_params={"hidden_dim": 32, "obs_embed_dim": 16},
    )
    torch.manual_seed(0)
    loaded = load_checkpoint(save_checkpoint(make_policy(cfg), STATS, tmp_path / "fm"))
    pipeline = make_session_pipeline(loaded)
    current_state = np.array([0.3, 1.0, -2.0, 0.5, 4.0], dtype=np.float32)
    leftover_robot = np.random.default_rng(0).normal(size=(H, A)).astype(np.float32) + current_state[INDICES]
    batch = pipeline.preprocess({"observation.state": current_state})
    prefix = prepare_prefix(pipeline, None, leftover_robot, current_state, H)
    delay = 2
    robot = pipeline.postprocess(loaded.policy.predict_action_chunk(batch, [delay], [prefix])).numpy()
    np.testing.assert_allclose(robot[:delay], leftover_robot[:delay], atol=0.05)
