"""Edge tests run against the real policy server (in this process, its own Zenoh session) and a real
router process. `server_factory(**manifest_overrides)` starts replicas; all are stopped at teardown."""

from __future__ import annotations

import pytest
import torch

from server.policies import PolicyConfig, make_policy, save_checkpoint

S, A, T = 4, 3, 10
ACTION_NAMES = ["x", "y", "grip"]
STATS = {
    "observation.state": {"mean": [0.0] * S, "std": [1.0] * S},
    "action": {"mean": [0.0] * A, "std": [1.0] * A},
}


def make_checkpoint(path, seed=0, policy_type="flow_matching", action_names=ACTION_NAMES):
    torch.set_num_threads(1)
    cfg = PolicyConfig(
        type=policy_type,
        state_dim=S,
        action_dim=len(action_names),
        chunk_size=T,
        fps=30,
        execution_horizon=5,
        action_names=list(action_names),
        hyper_params={
            "hidden_dim": 32,
            "obs_embed_dim": 16,
            **({"num_steps": 3} if policy_type == "flow_matching" else {}),
        },
    )
    torch.manual_seed(seed)
    stats = {
        "observation.state": STATS["observation.state"],
        "action": {"mean": [0.0] * len(action_names), "std": [1.0] * len(action_names)},
    }
    return save_checkpoint(make_policy(cfg), stats, path)


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("edge_ckpt") / "arm")


@pytest.fixture(scope="session")
def other_ckpt(tmp_path_factory):
    """Same names and shapes, other weights: the wrong-model case a client must detect by hash."""
    return make_checkpoint(tmp_path_factory.mktemp("edge_ckpt2") / "arm", seed=1)


@pytest.fixture
def server_factory(router, tmp_path):
    from server.service import PolicyServer

    started = []

    def start(ckpt_path, replica_id="r0", **over):
        m = {
            "model": {"repo_or_path": str(ckpt_path)},
            "model_id": "arm",
            "replica_id": replica_id,
            "max_sessions": 8,
            "warmup_inferences": 1,
            "zenoh": {"connect_endpoints": [router]},
            "health_port": -1,
            "session": {"gc_grace_s": 0.3},
        }
        m.update(over)
        srv = PolicyServer(m).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()
