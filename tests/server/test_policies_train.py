"""train_bc: behaviour cloning of synthetic linear data into a servable, reproducible checkpoint."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from server.policies import PolicyConfig, PolicyLoadError, TrainingError, load_checkpoint, train_bc
from server.processors import make_session_pipeline

S, A, T = 6, 3, 8
HP = {"hidden_dim": 64, "obs_embed_dim": 32}


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def linear_dataset(n: int, seed: int = 0):
    """Each chunk starts at the state's first A joints and moves at a velocity linear in the state."""
    gain = np.random.default_rng(1234).normal(size=(S, A)).astype(np.float32) * 0.5
    rng = np.random.default_rng(seed)
    states = rng.normal(size=(n, S)).astype(np.float32) * 2.0 + 1.0
    steps = np.arange(1, T + 1, dtype=np.float32)[None, :, None] * 0.1
    chunks = states[:, None, :A] + steps * (states @ gain)[:, None, :]
    return states, chunks.astype(np.float32)


def config(policy_type: str, **kw) -> PolicyConfig:
    return PolicyConfig(
        type=policy_type, state_dim=S, action_dim=A, chunk_size=T, fps=20, execution_horizon=4, hyper_params=HP, **kw
    )


def tracking_error(directory, states, chunks) -> float:
    loaded = load_checkpoint(directory)
    errors = []
    for state, chunk in zip(states, chunks):
        pipeline = make_session_pipeline(loaded)
        batch = pipeline.preprocess({"observation.state": state})
        robot = pipeline.postprocess(loaded.policy.predict_action_chunk(batch, [0], [None])).numpy()
        errors.append(np.abs(robot - chunk).mean())
    return float(np.mean(errors))


@pytest.mark.parametrize("relative", [False, True])
def test_mlp_chunk_learns_a_linear_dataset_and_tracks_it_through_the_pipeline(tmp_path, relative):
    states, chunks = linear_dataset(1024)
    kw = {"relative_actions": True, "relative_state_indices": [0, 1, 2]} if relative else {}
    cfg = config("mlp_chunk", **kw)
    out = train_bc("mlp_chunk", states, chunks, cfg, tmp_path / "ckpt", epochs=20, seed=0, batch_size=64, lr=3e-3)
    log = json.loads((out / "training.json").read_text())
    assert log["final_loss"] < 0.01 < log["epoch_losses"][0]
    held_out_states, held_out_chunks = linear_dataset(16, seed=1)
    assert tracking_error(out, held_out_states, held_out_chunks) < 0.05 * np.abs(held_out_chunks).mean()
    if relative:  # the model was trained on action - state[indices]; its stats say so
        stats = json.loads((out / "stats.json").read_text())
        relative_targets = chunks - states[:, None, :A]
        np.testing.assert_allclose(
            stats["action"]["mean"], relative_targets.reshape(-1, A).mean(0), rtol=1e-4, atol=1e-5
        )


def test_flow_matching_learns_a_linear_dataset(tmp_path):
    states, chunks = linear_dataset(1024)
    cfg = config("flow_matching")
    out = train_bc("flow_matching", states, chunks, cfg, tmp_path / "ckpt", epochs=40, seed=0, batch_size=64, lr=3e-3)
    log = json.loads((out / "training.json").read_text())
    assert log["final_loss"] < 0.25 * log["epoch_losses"][0]
    held_out_states, held_out_chunks = linear_dataset(16, seed=1)
    assert tracking_error(out, held_out_states, held_out_chunks) < 0.15 * np.abs(held_out_chunks).mean()


def test_same_data_and_seed_give_the_same_checkpoint_hash(tmp_path):
    states, chunks = linear_dataset(256)
    runs = [
        load_checkpoint(
            train_bc("flow_matching", states, chunks, config("flow_matching"), tmp_path / name, epochs=2, seed=seed)
        )
        for name, seed in (("a", 7), ("b", 7), ("c", 8))
    ]
    assert runs[0].checkpoint_hash == runs[1].checkpoint_hash != runs[2].checkpoint_hash


def test_cameras_train_through_the_serving_image_path(tmp_path):
    states, chunks = linear_dataset(64)
    frames = np.random.default_rng(0).integers(0, 256, size=(64, 24, 32, 3), dtype=np.uint8)
    cfg = config("mlp_chunk", image_features={"wrist": [3, 12, 16]})
    out = train_bc("mlp_chunk", states, chunks, cfg, tmp_path / "ckpt", epochs=1, seed=0, images={"wrist": frames})
    loaded = load_checkpoint(out)
    pipeline = make_session_pipeline(loaded)
    batch = pipeline.preprocess({"observation.state": states[0], "observation.images.wrist": frames[0]})
    assert pipeline.postprocess(loaded.policy.predict_action_chunk(batch, [0], [None])).shape == (T, A)
    with pytest.raises(TrainingError, match=r"missing \['wrist'\]"):
        train_bc("mlp_chunk", states, chunks, cfg, tmp_path / "x", epochs=1, seed=0)


def test_mismatched_inputs_are_refused_naming_the_problem(tmp_path):
    states, chunks = linear_dataset(8)
    with pytest.raises(TrainingError, match="same word"):
        train_bc("flow_matching", states, chunks, config("mlp_chunk"), tmp_path, epochs=1, seed=0)
    with pytest.raises(TrainingError, match=r"action_chunks has shape \(8, 7, 3\)"):
        train_bc("mlp_chunk", states, chunks[:, :-1], config("mlp_chunk"), tmp_path, epochs=1, seed=0)
    with pytest.raises(TrainingError, match="states has shape"):
        train_bc("mlp_chunk", states[:, :-1], chunks, config("mlp_chunk"), tmp_path, epochs=1, seed=0)
    with pytest.raises(PolicyLoadError, match="no predict_action_chunk"):
        cfg = PolicyConfig(type="no_chunk", state_dim=S, action_dim=A, chunk_size=T, fps=20, execution_horizon=4)
        train_bc("no_chunk", states, chunks, cfg, tmp_path, epochs=1, seed=0)


def test_stateful_chunk_trains_with_mse(tmp_path):
    states, chunks = linear_dataset(128)
    out = train_bc("stateful_chunk", states, chunks, config("stateful_chunk"), tmp_path / "ckpt", epochs=2, seed=0)
    assert load_checkpoint(out).config.type == "stateful_chunk"
    assert torch.get_default_dtype() == torch.float32
