"""chaos.profiles: every profile is a valid toxic list; overrides merge; errors name the bad word."""

from __future__ import annotations

import dataclasses

import pytest

from chaos import profiles
from chaos.toxiproxy.toxics import REGISTRY, TOXIPROXY_TYPES

TOXIC_KEYS = {"type", "name", "stream", "toxicity", "attributes"}


@pytest.mark.parametrize("name", sorted(profiles.PROFILES))
def test_every_profile_is_toxics_the_proxy_accepts(name):
    toxics = profiles.profile_toxics(name)
    names = [t["name"] for t in toxics]
    assert len(names) == len(set(names)), "toxic names must be unique per proxy"
    for t in toxics:
        assert set(t) == TOXIC_KEYS
        assert t["stream"] in ("upstream", "downstream")
        assert 0 <= t["toxicity"] <= 1
        cls = REGISTRY[t["type"]]
        assert set(t["attributes"]) == {f.name for f in dataclasses.fields(cls)}
        cls().update_attributes(t["attributes"])  # the proxy's own attribute check: types must match


def test_scenario_profiles_are_all_defined():
    from bench.scenario.load import PROFILES_FALLBACK

    assert set(PROFILES_FALLBACK) <= set(profiles.PROFILES)


@pytest.mark.parametrize("name", sorted(profiles.PROFILES))
def test_latency_sits_on_both_streams(name):
    toxics = [t for t in profiles.profile_toxics(name) if t["type"] == "latency"]
    by_stream = {t["stream"]: t["attributes"] for t in toxics}
    if toxics:
        assert by_stream["upstream"] == by_stream["downstream"]


def test_wan_50ms_is_the_design_budget_round_trip():
    lat = {
        t["stream"]: t["attributes"]["latency"] for t in profiles.profile_toxics("wan_50ms") if t["type"] == "latency"
    }
    assert lat == {"upstream": 25, "downstream": 25}
    assert profiles.expected_rtt_ms("wan_50ms") == pytest.approx(50, abs=0.5)


def test_expected_rtt_orders_the_profiles():
    rtt = {n: profiles.expected_rtt_ms(n) for n in profiles.PROFILES}
    assert rtt["lan"] < 1 < rtt["wifi"] < rtt["wan_50ms"] < rtt["satellite"]
    assert rtt["satellite"] == pytest.approx(600, abs=1)
    assert rtt["lte"] > 50  # 2 x 25 ms plus loss waits


def test_expected_rtt_counts_clipped_jitter():
    # wifi: 3 +/- 8 ms clips at 0, so each direction averages (3 + 8)^2 / 32 ms, not 3 ms
    assert profiles.mean_latency_ms(3, 8) == pytest.approx(121 / 32)
    assert profiles.mean_latency_ms(25, 2) == 25


def test_profile_toxics_are_fresh_copies():
    a = profiles.profile_toxics("lte")
    a[0]["attributes"]["latency"] = 999
    assert profiles.profile_toxics("lte")[0]["attributes"]["latency"] != 999
    assert profiles.PROFILES["lte"][0]["attributes"]["latency"] != 999


def test_dotted_override_sets_both_streams():
    toxics = profiles.profile_toxics("wan_50ms", {"latency.latency": 40})
    assert [t["attributes"]["latency"] for t in toxics if t["type"] == "latency"] == [40, 40]
    assert all(t["attributes"]["jitter"] == 2 for t in toxics)


def test_nested_override_sets_both_streams():
    toxics = profiles.profile_toxics("wan_50ms", {"latency": {"jitter": 5}})
    assert [t["attributes"]["jitter"] for t in toxics] == [5, 5]


def test_override_of_an_absent_type_adds_it_on_both_streams():
    toxics = profiles.profile_toxics("lan", {"loss.probability": 0.01, "latency.latency": 5})
    kinds = sorted((t["type"], t["stream"]) for t in toxics)
    assert kinds == [("latency", "downstream"), ("latency", "upstream"), ("loss", "downstream"), ("loss", "upstream")]
    loss = next(t for t in toxics if t["type"] == "loss")
    assert loss["attributes"]["probability"] == 0.01
    assert loss["attributes"]["rto_ms"] == 200  # the toxic's default


def test_integral_float_override_becomes_int():
    toxics = profiles.profile_toxics("wan_50ms", {"latency.latency": 30.0})
    assert all(type(t["attributes"]["latency"]) is int for t in toxics)


def test_unknown_profile_names_it_and_lists_known():
    with pytest.raises(ValueError, match=r"unknown network profile 'wfi' \(did you mean 'wifi'\?\); known: .*lan"):
        profiles.profile_toxics("wfi")


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"latncy.latency": 4}, r"unknown toxic type 'latncy' \(did you mean 'latency'\?\); known: .*bandwidth"),
        (
            {"latency.jiter": 4},
            r"unknown attribute latency.jiter \(did you mean 'jitter'\?\); latency attributes: latency, jitter",
        ),
        ({"latency": {"lag": 4}}, r"unknown attribute latency.lag"),
        ({"latency": 4}, r"override key 'latency' is not TYPE.ATTRIBUTE"),
        ({"latency.latency": -1}, r"latency.latency must be a number >= 0"),
        ({"latency.latency": 2.5}, r"must be a whole number"),
        ({"latency.latency": "10ms"}, r"must be a number"),
        ({"loss.probability": 1.5}, r"loss.probability must be a probability in 0..1"),
    ],
)
def test_bad_override_is_a_value_error_naming_the_key(overrides, message):
    with pytest.raises(ValueError, match=message):
        profiles.profile_toxics("wan_50ms", overrides)


def test_real_toxiproxy_equivalent_replaces_loss_with_latency():
    toxics = profiles.profile_toxics("lte")
    real = profiles.real_toxiproxy_equivalent(toxics)
    assert len(real) == len(toxics)
    assert all(t["type"] in TOXIPROXY_TYPES for t in real)
    stand_ins = [t for t in real if t["name"].startswith("loss_")]
    assert [t["type"] for t in stand_ins] == ["latency", "latency"]
    assert [t["stream"] for t in stand_ins] == ["upstream", "downstream"]
    assert all(t["attributes"]["jitter"] > 0 for t in stand_ins)
    assert [t for t in real if not t["name"].startswith("loss_")] == [t for t in toxics if t["type"] != "loss"]
