"""Named network profiles: what a site's link to the router looks like, as a list of toxics.

A profile is the list of toxic dicts one site's proxy gets at start, in the Toxiproxy JSON shape
`{type, name, stream, toxicity, attributes}` (`ChaosClient.add_toxic(proxy, **toxic)` takes it as
is). Streams are Toxiproxy's: `upstream` is robot -> router (observations), `downstream` is router
-> robot (action chunks). Link delays sit on both streams, so a round trip crosses two of them.

Invariant: `profile_toxics` hands out fresh dicts whose types and attribute names are those of the
toxic registry (`chaos.toxiproxy.toxics.REGISTRY`), so anything it returns is accepted by the proxy.
The numbers are tabled in docs/chaos-faults.md.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

from chaos.toxiproxy.toxics import REGISTRY
from wire.suggest import did_you_mean

STREAMS = ("upstream", "downstream")

# The loopback plus one proxy hop, measured order of magnitude: what `lan` adds nothing to.
BASE_RTT_MS = 0.2


def _attribute_table() -> dict[str, dict[str, Any]]:
    """type word -> {attribute: default}, read off the toxic dataclasses (one source of truth)."""
    return {
        name: {f.name: f.default for f in dataclasses.fields(cls)} for name, cls in REGISTRY.items() if name != "noop"
    }


TOXIC_ATTRIBUTES: dict[str, dict[str, Any]] = _attribute_table()


def toxic(type: str, stream: str, toxicity: float = 1.0, name: str | None = None, **attributes) -> dict:
    """One toxic dict; unset attributes keep the toxic's defaults (as the proxy would)."""
    attrs = dict(TOXIC_ATTRIBUTES[type])
    unknown = set(attributes) - set(attrs)
    if unknown:
        raise ValueError(
            f"toxic {type!r} has no attribute {', '.join(sorted(unknown))}; attributes: {', '.join(attrs)}"
        )
    attrs.update(attributes)
    return {
        "type": type,
        "name": name or f"{type}_{stream}",
        "stream": stream,
        "toxicity": toxicity,
        "attributes": attrs,
    }


def both_streams(type: str, **attributes) -> list[dict]:
    return [toxic(type, stream, **attributes) for stream in STREAMS]


# Per direction: latency/jitter in ms (a round trip pays both directions), bandwidth in KB/s per
# connection (every robot has its own connection), loss as the probability a TCP segment is lost.
PROFILES: dict[str, list[dict]] = {
    # The proxy hop on loopback is the LAN: no toxic, ~0.2 ms RTT.
    "lan": [],
    # Jittery and a little lossy: 3 ms +/- 8 ms each way (delays below 0 clip to 0), 0.2 % loss.
    "wifi": [
        *both_streams("latency", latency=3, jitter=8),
        *both_streams("loss", probability=0.002),
    ],
    # A phone link: 25 +/- 10 ms each way, 10 Mbit/s up, 20 Mbit/s down, 0.5 % loss.
    "lte": [
        *both_streams("latency", latency=25, jitter=10),
        toxic("bandwidth", "upstream", rate=1250),
        toxic("bandwidth", "downstream", rate=2500),
        *both_streams("loss", probability=0.005),
    ],
    # The design's latency budget: 50 ms RTT = 25 ms each way, small jitter, no loss.
    "wan_50ms": both_streams("latency", latency=25, jitter=2),
    # Geostationary: ~300 ms each way (~600 ms RTT), 2 Mbit/s up, 10 Mbit/s down.
    "satellite": [
        *both_streams("latency", latency=300, jitter=10),
        toxic("bandwidth", "upstream", rate=250),
        toxic("bandwidth", "downstream", rate=1250),
    ],
    # A shared, saturated uplink: 300 KB/s each way and queueing delay of 40 +/- 15 ms each way.
    "congested": [
        *both_streams("latency", latency=40, jitter=15),
        *both_streams("bandwidth", rate=300),
    ],
}


def _unknown(what: str, value: str, known) -> ValueError:
    known = sorted(known)
    return ValueError(f"unknown {what} {value!r}" + did_you_mean(value, known) + f"; known: {', '.join(known)}")


def _flatten_overrides(overrides: Mapping) -> dict[tuple[str, str], Any]:
    """{"latency.jitter": 5} or {"latency": {"jitter": 5}} -> {("latency", "jitter"): 5}."""
    flat: dict[tuple[str, str], Any] = {}
    for key, value in overrides.items():
        if isinstance(value, Mapping):
            for attr, v in value.items():
                flat[(str(key), str(attr))] = v
            continue
        type_word, dot, attr = str(key).partition(".")
        if not dot or not attr:
            raise ValueError(
                f"override key {key!r} is not TYPE.ATTRIBUTE (e.g. 'latency.jitter') nor TYPE: {{ATTRIBUTE: VALUE}}"
            )
        flat[(type_word, attr)] = value
    return flat


def check_attribute(type_word: str, attr: str, value) -> int | float:
    """The value as the proxy's JSON wants it (ints stay ints); ValueError naming TYPE.ATTRIBUTE."""
    if type_word not in TOXIC_ATTRIBUTES:
        raise _unknown("toxic type", type_word, TOXIC_ATTRIBUTES)
    attrs = TOXIC_ATTRIBUTES[type_word]
    if attr not in attrs:
        raise ValueError(
            f"unknown attribute {type_word}.{attr}{did_you_mean(attr, attrs)}; {type_word} attributes: "
            f"{', '.join(attrs)}"
        )
    default = attrs[attr]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"{type_word}.{attr} must be a number >= 0, got {value!r}")
    if isinstance(default, int):
        if value != int(value):
            raise ValueError(f"{type_word}.{attr} must be a whole number (the proxy takes integers), got {value!r}")
        return int(value)
    if attr == "probability" and value > 1:
        raise ValueError(f"{type_word}.{attr} must be a probability in 0..1, got {value!r}")
    return float(value)


def worst_round_trip_ms(toxics: list[dict]) -> float:
    """The longest round trip (ms) `toxics` apply to a small message: each direction's latency toxics at their
    latency + jitter, summed over both directions (bandwidth and loss not counted)."""
    return float(
        sum(
            t["attributes"].get("latency", 0) + t["attributes"].get("jitter", 0)
            for t in toxics
            if t["type"] == "latency"
        )
    )


def profile_toxics(name: str, overrides: Mapping | None = None) -> list[dict]:
    """The toxics of profile `name` with `overrides` merged, as fresh dicts.

    An override sets that attribute on every toxic of that type (both streams); a type the
    profile lacks is added on both streams with its defaults plus the override (so `lan` with
    `{"latency.latency": 5}` gets 5 ms each way).
    """
    if name not in PROFILES:
        raise _unknown("network profile", name, PROFILES)
    toxics = copy.deepcopy(PROFILES[name])
    for (type_word, attr), value in _flatten_overrides(overrides or {}).items():
        value = check_attribute(type_word, attr, value)
        matching = [t for t in toxics if t["type"] == type_word]
        if not matching:
            matching = both_streams(type_word)
            toxics.extend(matching)
        for t in matching:
            t["attributes"][attr] = value
    return toxics


def mean_latency_ms(latency: float, jitter: float) -> float:
    """Mean of max(0, latency + uniform[-jitter, jitter)): the latency toxic clips delays at 0."""
    if jitter <= latency:
        return float(latency)
    return (latency + jitter) ** 2 / (4.0 * jitter)


def expected_rtt_ms(name: str, overrides: Mapping | None = None) -> float:
    """Mean round trip of a small message at no load: the base hop, latency both ways, loss waits.

    Bandwidth is left out (it depends on message size and load); a jitter larger than the
    latency counts with its clipping at 0; loss adds the mean RTO wait of a one-segment message.
    """
    from chaos.toxiproxy.toxics.loss import delay_moments_ms

    rtt = BASE_RTT_MS
    for t in profile_toxics(name, overrides):
        a = t["attributes"]
        share = t["toxicity"]
        if t["type"] == "latency":
            rtt += share * mean_latency_ms(a["latency"], a["jitter"])
        elif t["type"] == "loss":
            rtt += share * delay_moments_ms(a["probability"], a["rto_ms"], a["max_rto_ms"])[0]
    return rtt


def real_toxiproxy_equivalent(toxics: list[dict]) -> list[dict]:
    """The same toxics for the real Toxiproxy binary, which has no `loss`: each `loss` becomes the
    `latency` toxic with the same mean and spread of added delay (a stand-in, not the same fault;
    see chaos.toxiproxy.toxics.loss.loss_fallback). Other toxics are copied unchanged."""
    from chaos.toxiproxy.toxics import TOXIPROXY_TYPES, loss_fallback

    fallbacks = {"loss": loss_fallback}
    out = []
    for t in toxics:
        if t["type"] in TOXIPROXY_TYPES:
            out.append(copy.deepcopy(t))
        elif t["type"] in fallbacks:
            out.append(fallbacks[t["type"]](copy.deepcopy(t)))
        else:
            raise ValueError(f"toxic type {t['type']!r} has no real-Toxiproxy equivalent")
    return out
