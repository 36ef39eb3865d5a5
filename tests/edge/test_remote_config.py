"""RemoteEngineConfig refuses a bad value at construction with a ConfigError naming the field and the
value. Each value below used to pass `RemoteEngineConfig(...)` and `make_engine`: `start()` then failed
every handshake until max_offline_s (DEAD), or a later TypeError named no field. No network here."""

from __future__ import annotations

import math

import pytest

from edge import ConfigError, RemoteEngineConfig, make_engine
from edge.rtc import RTCEngineConfig
from edge.sync import SyncEngineConfig

BASE = dict(model_id="arm", action_names=["x", "y"], state_dim=2)


@pytest.mark.parametrize(
    "field,value,words",
    [
        # key chunks and what the session open carries
        ("client_uuid", "*", "client_uuid '*' contains '*'; key chunks may not contain"),
        ("client_uuid", "a/b", "client_uuid 'a/b' contains '/'"),
        ("model_id", 5, "must be a string, got 5 (an integer); give the model id the server serves"),
        ("model_id", "a/b", "model_id 'a/b' contains '/'"),
        ("revision", None, "must be a string, got None; give the revision the server serves"),
        ("root", None, "must be a string, got None; give the servers' key root, e.g. @fleet"),
        ("root", "", "root '' must be one verbatim chunk starting with '@'"),
        ("root", "a/*", "root 'a/*' must be one verbatim chunk starting with '@'"),
        ("tags", None, "must be a mapping of tag names to string values, e.g. {site: lab}, got None"),
        ("tags", ["x"], "got ['x'] (a list)"),
        ("replica_order", None, "must be a list of replica ids, e.g. [r0, r1], got None"),
        ("replica_order", "r1", "e.g. [r1], got 'r1' (a string)"),
        ("task", None, "must be a string, got None"),
        # endpoints: the wire's rule (wire.transport.endpoint_problem)
        ("connect_endpoints", ["tcp/"], "'tcp/' is not a Zenoh endpoint: tcp needs host:port"),
        ("connect_endpoints", ["foo/bar"], "'foo/bar' is not a Zenoh endpoint; 'foo' is not one of"),
        ("connect_endpoints", ["tcp/127.0.0.1:notaport"], "'tcp/127.0.0.1:notaport' is not a Zenoh endpoint"),
        ("connect_endpoints", 5, "must be a list of Zenoh router endpoints, e.g. [tcp/127.0.0.1:7447], got 5"),
        # scheduling hints: the observation's ranges
        ("urgency", "high", "must be a number from 0 to 1 (1 = most time-critical), got 'high'"),
        ("urgency", None, "must be a number from 0 to 1 (1 = most time-critical), got None"),
        (
            "priority",
            "high",
            "must be an integer from 0 to 255 (0 = most urgent; the range of an observation's priority), got 'high'",
        ),
        ("priority", -5, "got -5"),
        ("priority", 1.5, "got 1.5"),
        # numbers that are not what they claim
        ("fps", math.inf, "must be a finite number > 0, got inf"),
        ("buffer_time_s", math.inf, "must be a finite number > 0, or null"),
        ("request_timeout_s", math.inf, "must be a finite number > 0, got inf"),
        ("max_offline_s", math.inf, "must be a finite number > 0, got inf"),
        ("jpeg_quality", True, "must be an integer from 0 to 100 (0: raw frames, else the JPEG quality), got True"),
        (
            "lease_ms",
            10**12,
            "must be an integer from 100 to 600000 (ms; keep it above the link's round trip), got 1000000000000",
        ),
        ("rtc_enabled", "no", "must be true or false, got 'no' (a string)"),
        # lists that are not lists of distinct names
        (
            "action_names",
            "shoulder",
            "must be a list of the robot's action names in the policy's order, e.g. [shoulder], got 'shoulder'",
        ),
        ("action_names", [1, 2], "(non-empty strings), got 1 in [1, 2]"),
        ("action_names", ["x", "x"], "'x' is listed 2 times in ['x', 'x']; list each once"),
        ("cameras", "front", "must be a list of camera names, e.g. [front], got 'front'"),
    ],
)
def test_a_bad_value_is_refused_at_construction_naming_the_field_and_the_value(field, value, words):
    with pytest.raises(ConfigError) as err:
        make_engine(RemoteEngineConfig(**{**BASE, field: value}))
    assert str(err.value).startswith(f"RemoteEngineConfig.{field}: ") and words in str(err.value), str(err.value)


def test_a_tls_endpoint_without_a_ca_is_refused_naming_tls_ca():
    with pytest.raises(ConfigError, match=r"^RemoteEngineConfig\.tls_ca: endpoint tls/10\.0\.0\.1:7447 needs TLS"):
        RemoteEngineConfig(**BASE, connect_endpoints=["tls/10.0.0.1:7447"])


@pytest.mark.parametrize("cls", [RemoteEngineConfig, RTCEngineConfig, SyncEngineConfig])
@pytest.mark.parametrize("value", [["model_id"], None, "fps: 30"])
def test_from_dict_refuses_anything_but_a_mapping(cls, value):
    with pytest.raises(ConfigError, match=rf"^{cls.__name__}: the config must be a mapping of field names to values"):
        cls.from_dict(value)


@pytest.mark.parametrize("cls", [RTCEngineConfig, SyncEngineConfig])
def test_the_local_engines_refuse_an_infinite_fps_too(cls):
    with pytest.raises(ConfigError, match=rf"^{cls.__name__}\.fps: must be a finite number > 0, got inf"):
        cls(fps=math.inf)


@pytest.mark.parametrize(
    "field,value",
    [
        ("connect_endpoints", "tcp/127.0.0.1:7447"),  # one endpoint as a string
        (
            "connect_endpoints",
            (
                "tcp/[::1]:7447",
                "udp/10.0.0.1:7447",
                "ws/router:80",
                "unixsock-stream//tmp/z.sock",
                "tcp/10.0.0.1:7447#iface=eth0",
            ),
        ),
        ("client_uuid", ""),
        ("client_uuid", "robot-01.lab_2"),
        ("root", "@lab"),
        ("tags", {"site": "lab"}),
        ("replica_order", ("r0", "r1")),
        ("task", "Fold the towel / left"),
        ("cameras", ["front", "wrist"]),
        ("urgency", 1),
        ("priority", 255),
        ("jpeg_quality", 0),
        ("lease_ms", 100),
        ("lease_ms", 600_000),
        ("buffer_time_s", None),
        ("execution_horizon", 0),
    ],
)
def test_the_values_that_were_valid_stay_valid(field, value):
    cfg = RemoteEngineConfig(**{**BASE, field: value})
    assert make_engine(cfg).cfg is cfg
