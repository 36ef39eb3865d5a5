"""The policy contract: registry, classification (design §8.3), config JSON, call validation."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from server.policies import (
    POLICY_REGISTRY,
    ChunkPolicy,
    PolicyConfig,
    PolicyConfigError,
    PolicyInputError,
    PolicyLoadError,
    classify,
    make_policy,
    register_policy,
)
from server.policies.no_chunk import NoChunkPolicy
from server.policies.stateful_chunk import StatefulChunkPolicy

S, A, T = 5, 3, 8


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def config(policy_type: str, **kw) -> PolicyConfig:
    return PolicyConfig(type=policy_type, state_dim=S, action_dim=A, chunk_size=T, fps=10, execution_horizon=4, **kw)


def small(policy_type: str, **kw) -> ChunkPolicy:
    torch.manual_seed(0)
    hp = {"hidden_dim": 32, "obs_embed_dim": 16}
    return make_policy(config(policy_type, hyper_params=hp, **kw)).eval()


def state_batch(size: int = 1, seed: int = 0) -> dict[str, torch.Tensor]:
    return {"observation.state": torch.randn(size, S, generator=torch.Generator().manual_seed(seed))}


def test_registry_maps_each_type_word_to_a_class_carrying_the_same_word():
    for word in ("flow_matching", "mlp_chunk", "stateful_chunk", "no_chunk"):
        assert POLICY_REGISTRY[word].type_name == word


@pytest.mark.parametrize(
    ("word", "expected"),
    [
        ("flow_matching", "stateless"),
        ("mlp_chunk", "stateless"),
        ("stateful_chunk", "stateful"),
        ("no_chunk", "no_chunk_api"),
    ],
)
def test_classify_sorts_shipped_types_into_serving_classes(word, expected):
    assert classify(POLICY_REGISTRY[word]) == expected


def test_classify_accepts_instances_and_treats_silent_classes_as_stateful():
    assert classify(small("mlp_chunk")) == "stateless"
    assert classify(NoChunkPolicy(config("no_chunk"))) == "no_chunk_api"

    class Silent(nn.Module):  # has the API but never says it is stateless
        def predict_action_chunk(self, batch, inference_delay, prefix):
            return torch.zeros(1, T, A)

    assert classify(Silent) == "stateful"


def test_a_policy_without_predict_action_chunk_is_refused_at_startup_naming_type_and_reason():
    with pytest.raises(PolicyLoadError, match=r"'no_chunk'.*predict_action_chunk"):
        make_policy(config("no_chunk"))


def test_an_unknown_type_is_refused_listing_the_registered_types():
    with pytest.raises(PolicyLoadError, match=r"unknown policy type 'pi9'.*flow_matching"):
        make_policy(config("pi9"))


def test_a_new_type_is_one_class_and_one_decorator_and_a_taken_word_is_refused():
    @register_policy("test_zero_chunk")
    class ZeroChunk(ChunkPolicy):
        chunk_stateless = True

        def __init__(self, cfg):
            super().__init__(cfg)
            self.bias = nn.Parameter(torch.zeros(1))

        def predict_action_chunk(self, batch, inference_delay, prefix):
            size, _, _ = self.check_chunk_args(batch, inference_delay, prefix)
            return torch.zeros(size, T, A)

    try:
        policy = make_policy(config("test_zero_chunk"))
        assert classify(policy) == "stateless"
        assert policy.predict_action_chunk(state_batch(2), [0, 0], [None, None]).shape == (2, T, A)
        with pytest.raises(PolicyLoadError, match="already registered"):
            register_policy("test_zero_chunk")(type("Other", (ZeroChunk,), {}))
    finally:
        POLICY_REGISTRY.pop("test_zero_chunk")


names = st.text(alphabet="abcdefgh_", min_size=1, max_size=6)


@settings(max_examples=40, deadline=None)
@given(
    state_dim=st.integers(1, 6),
    action_dim=st.integers(1, 6),
    chunk=st.integers(1, 12),
    fps=st.floats(1, 200),
    relative=st.booleans(),
    cams=st.dictionaries(names, st.tuples(st.integers(1, 64), st.integers(1, 64)), max_size=2),
    data=st.data(),
)
def test_policy_config_survives_a_json_round_trip(state_dim, action_dim, chunk, fps, relative, cams, data):
    horizon = data.draw(st.integers(1, chunk))
    indices = (
        data.draw(st.lists(st.integers(0, state_dim - 1), min_size=action_dim, max_size=action_dim)) if relative else []
    )
    cfg = PolicyConfig(
        type="flow_matching",
        state_dim=state_dim,
        action_dim=action_dim,
        chunk_size=chunk,
        fps=fps,
        image_features={k: [3, h, w] for k, (h, w) in cams.items()},
        execution_horizon=horizon,
        relative_actions=relative,
        relative_state_indices=indices,
        hyper_params={"num_steps": 3},
    )
    again = PolicyConfig.from_json(cfg.to_json())
    assert again == cfg
    assert again.to_json() == cfg.to_json()
    assert again.trained_fps == fps


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"relative_actions": True, "relative_state_indices": [0]}, "one state index per action"),
        ({"relative_actions": True, "relative_state_indices": [0, 1, 9]}, "outside the state"),
        ({"execution_horizon": 9}, "exceeds chunk_size"),
        ({"action_names": ["x"]}, "action_names has 1 names"),
        ({"image_features": {"wrist": [1, 8, 8]}}, r"expected \[3, H, W\]"),
        ({"image_features": {"a.b": [3, 8, 8]}}, "without '.'"),
    ],
)
def test_inconsistent_configs_are_rejected_naming_the_field(kwargs, message):
    base = {"type": "mlp_chunk", "state_dim": S, "action_dim": A, "chunk_size": T, "fps": 10, "execution_horizon": 4}
    with pytest.raises(PolicyConfigError, match=message):
        PolicyConfig(**{**base, **kwargs})


def test_unknown_hyper_params_and_fields_are_rejected():
    with pytest.raises(PolicyConfigError, match=r"\['num_stpes'\].*flow_matching"):
        make_policy(config("flow_matching", hyper_params={"num_stpes": 3}))
    with pytest.raises(PolicyConfigError, match="no fields"):
        PolicyConfig.from_dict({**config("mlp_chunk").to_dict(), "colour": "red"})


def test_make_policy_records_every_resolved_hyper_param_in_its_config():
    policy = small("flow_matching")
    assert policy.config.hyper_params["num_steps"] == 10
    assert policy.config.hyper_params["hidden_dim"] == 32


@pytest.mark.parametrize("word", ["flow_matching", "mlp_chunk", "stateful_chunk"])
def test_calls_with_one_delay_and_prefix_per_sample_are_validated(word):
    policy = small(word)
    assert policy.predict_action_chunk(state_batch(3), [0, 1, 2], [None] * 3).shape == (3, T, A)
    with pytest.raises(PolicyInputError, match="one entry per sample"):
        policy.predict_action_chunk(state_batch(3), [0], [None])
    with pytest.raises(PolicyInputError, match=r"prefix\[1\] has shape"):
        policy.predict_action_chunk(state_batch(2), [0, 0], [None, torch.zeros(4, A + 1)])
    with pytest.raises(PolicyInputError, match="observation.state"):
        policy.predict_action_chunk({"observation.state": torch.zeros(1, S + 1)}, [0], [None])


def test_mlp_chunk_ignores_delay_and_prefix():
    policy = small("mlp_chunk")
    batch = state_batch(1)
    plain = policy.predict_action_chunk(batch, [0], [None])
    assert torch.equal(plain, policy.predict_action_chunk(batch, [3], [torch.ones(4, A)]))
    assert not type(policy).supports_rtc


def test_mlp_chunk_with_declared_cameras_reads_them():
    policy = small("mlp_chunk", image_features={"top": [3, 12, 16]})
    batch = {**state_batch(2), "observation.images.top": torch.rand(2, 3, 12, 16)}
    out = policy.predict_action_chunk(batch, [0, 0], [None, None])
    brighter = {**batch, "observation.images.top": torch.ones(2, 3, 12, 16)}
    assert out.shape == (2, T, A)
    assert not torch.equal(out, policy.predict_action_chunk(brighter, [0, 0], [None, None]))
    with pytest.raises(PolicyInputError, match="observation.images.top"):
        policy.predict_action_chunk(state_batch(2), [0, 0], [None, None])


def test_stateful_chunk_output_depends_on_select_action_history_until_reset():
    policy: StatefulChunkPolicy = small("stateful_chunk")  # type: ignore[assignment]
    current = state_batch(1, seed=1)
    fresh = policy.predict_action_chunk(current, [0], [None])
    policy.select_action(state_batch(1, seed=2))  # another "session" feeds the history
    polluted = policy.predict_action_chunk(current, [0], [None])
    assert not torch.allclose(fresh, polluted)
    policy.reset()
    assert torch.equal(fresh, policy.predict_action_chunk(current, [0], [None]))
    assert policy.select_action(current).shape == (1, A)
