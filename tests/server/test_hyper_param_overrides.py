"""A replica's manifest may serve a checkpoint with other sampling hyper-parameters (`model.hyper_params`):
only the serving ones, checked as at construction, and never half applied."""

from __future__ import annotations

import pytest
import torch

from server.policies import PolicyConfig, make_policy, save_checkpoint
from server.policies.base import SERVING_HYPER_PARAMS, PolicyConfigError
from server.policies.checkpoint import load_checkpoint
from server.service import PolicyServer

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

S, A, T = 4, 2, 8
STATS = {"observation.state": {"mean": [0.0] * S, "std": [1.0] * S}, "action": {"mean": [0.0] * A, "std": [1.0] * A}}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    cfg = PolicyConfig(
        type="flow_matching",
        state_dim=S,
        action_dim=A,
        chunk_size=T,
        fps=30,
        execution_horizon=6,
        action_names=["x", "y"],
        hyper_params={"hidden_dim": 32, "obs_embed_dim": 16, "num_steps": 4},
    )
    torch.manual_seed(0)
    return save_checkpoint(make_policy(cfg), STATS, tmp_path_factory.mktemp("ckpt") / "tiny")


def guided_chunk(policy):
    obs = {"observation.state": torch.linspace(-1, 1, S)[None]}
    prefix = torch.full((6, A), 0.5)
    with torch.no_grad():
        return policy.predict_action_chunk(obs, [2], [prefix])[0]


def test_a_serving_hyper_parameter_changes_the_sampling_and_the_recorded_config(ckpt):
    policy = load_checkpoint(ckpt).policy
    network = guided_chunk(policy)
    policy.override_hyper_params({"guidance_jacobian": "identity", "num_steps": 6})
    assert policy.hp["guidance_jacobian"] == "identity" and policy.config.hyper_params["num_steps"] == 6
    assert not torch.equal(guided_chunk(policy), network)
    fresh = load_checkpoint(ckpt).policy  # the checkpoint on disk is untouched
    assert torch.equal(guided_chunk(fresh), network)


@pytest.mark.parametrize(
    "overrides, words",
    [
        ({"hidden_dim": 64}, "define(s) the trained flow_matching network"),
        ({"no_such_knob": 1}, "has no hyper-parameter 'no_such_knob'"),
        ({"prefix_schedule": "cosine"}, "prefix_schedule='cosine'"),
        ({"max_guidance_weight": 2.0, "rtc_mode": "training_time"}, "not trained for rtc_mode 'training_time'"),
    ],
)
def test_a_refused_override_names_the_problem_and_changes_nothing(ckpt, overrides, words):
    policy = load_checkpoint(ckpt).policy
    before = dict(policy.hp)
    with pytest.raises(PolicyConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        policy.override_hyper_params(overrides)
    assert policy.hp == before and policy.config.hyper_params == before


def test_only_sampling_hyper_parameters_are_serving_ones():
    assert not {"hidden_dim", "num_layers", "obs_embed_dim", "time_embed_dim", "d_model", "max_prefix_rows"} & set(
        SERVING_HYPER_PARAMS
    )


def test_the_server_loads_the_manifests_overrides_before_its_runtime(ckpt, tmp_path):
    manifest = {
        "model": {"repo_or_path": str(ckpt), "hyper_params": {"max_guidance_weight": 3.0}},
        "model_id": "tiny",
        "replica_id": "r0",
        "warmup_inferences": 0,
        "health_port": 0,
        "audit_path": str(tmp_path / "audit.jsonl"),
        "zenoh": {"connect_endpoints": ["tcp/127.0.0.1:7447"]},
    }  # a manifest needs one; load() never connects
    srv = PolicyServer(manifest)
    srv.load()
    assert srv.loaded.policy.hp["max_guidance_weight"] == 3.0 and srv.runtime.rtc_mode == "guidance"
    bad = {**manifest, "model": {**manifest["model"], "hyper_params": {"num_layers": 1}}}
    with pytest.raises(PolicyConfigError, match="num_layers"):
        PolicyServer(bad).load()


def test_the_manifest_reference_names_exactly_the_serving_hyper_parameters():
    from server.manifest import ModelConfig

    doc = ModelConfig.__pydantic_fields__["hyper_params"].description
    listed = doc.split("only ", 1)[1].split(" (", 1)[0].split(", ")
    assert tuple(listed) == SERVING_HYPER_PARAMS


def test_a_ray_serve_deployment_applies_the_same_overrides(ckpt):
    """dispatch.backend ray_serve: the deployment loads its own copy of the checkpoint, and must sample it as
    the Zenoh-facing server would (the deployment class itself, without Ray)."""
    from server.dispatch import PolicyDeployment

    served = PolicyDeployment(str(ckpt), "cpu", "float32", 1, {"guidance_jacobian": "identity"}).policy
    local = load_checkpoint(ckpt).policy
    local.override_hyper_params({"guidance_jacobian": "identity"})
    assert served.hp == local.hp and torch.equal(guided_chunk(served), guided_chunk(local))


def test_a_server_told_to_compile_compiles_its_network_at_load_and_serves_the_same_chunks(tmp_path):
    """`compile: true` in a CPU replica's manifest: set up at load (inductor's C++ where a compiler is), every bucket
    up to max_batch compiled by the warm-up with and without an RTC prefix (no request compiles: a bucket first met
    by requests took 9 s inside their pass), then the same chunks as the eager checkpoint from the server's path."""
    from pathlib import Path

    import numpy as np

    from server.policies.flow_transformer import check_cpu_compiler
    from server.runtime import InferItem

    try:
        check_cpu_compiler()
    except PolicyConfigError as e:
        pytest.skip(str(e))
    ckpt = Path(__file__).resolve().parents[2] / "bench/checkpoints/reacher_transformer"
    manifest = {
        "model": {"repo_or_path": str(ckpt), "hyper_params": {"compile": True}},
        "model_id": "rt",
        "replica_id": "r0",
        "warmup_inferences": 1,
        "health_port": 0,
        "scheduling": {"max_batch": 2},
        "audit_path": str(tmp_path / "audit.jsonl"),
        "zenoh": {"connect_endpoints": ["tcp/127.0.0.1:7447"]},
    }  # a manifest needs one; load() never connects
    from torch._dynamo.utils import counters

    srv = PolicyServer(manifest)
    srv.load()
    policy = srv.loaded.policy
    assert policy._compiled and policy._velocity_fn is not policy.velocity
    state = np.linspace(-1, 1, srv.loaded.config.state_dim).astype(np.float32)
    prefix = np.full((srv.runtime.execution_horizon, 2), 0.1, np.float32)
    graphs = counters["stats"]["unique_graphs"]
    items = [InferItem(srv.runtime.new_pipeline(), state, {}, 2, prefix, prefix, rtc=rtc) for rtc in (False, True)]
    served = [r.chunk_robot for r in srv.runtime.infer(items, emulate=False)]  # a guided batch of 2
    plain = [InferItem(srv.runtime.new_pipeline(), state, {}, 2, None, None, rtc=True) for _ in range(2)]
    srv.runtime.infer(plain, emulate=False)  # two episodes' first requests: the plain pass at bucket 2
    assert counters["stats"]["unique_graphs"] == graphs  # built by the warm-up, none by a request
    assert policy.compile_fallbacks == []  # served compiled, not eager behind the same chunks
    policy._velocity_fn = policy.velocity  # the same weights, eager
    eager = [r.chunk_robot for r in srv.runtime.infer(items, emulate=False)]
    for a, b in zip(served, eager):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
