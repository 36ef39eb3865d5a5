"""The router access rules generated from a fleet (wire.acl): who may do what on which key."""

from __future__ import annotations

import json

import pytest

from wire.acl import FleetIdentities, main, router_access_control
from wire.errors import WireError
from wire.keys import ReplicaKeys

FLEET = FleetIdentities(("robot-a", "robot-b"), ("r0", "r1"))


def _includes(pattern: str, key: str) -> bool:
    """Zenoh inclusion for the patterns the generator uses (`*` one chunk, `**` any, verbatim `@` chunks)."""
    p, k = pattern.split("/"), key.split("/")
    if "**" in p:
        i = p.index("**")
        return _includes("/".join(p[:i]), "/".join(k[:i])) and len(k) >= i
    return len(p) == len(k) and all(a == b or (a == "*" and not b.startswith("@")) for a, b in zip(p, k))


def allowed(acl: dict, cn: str, message: str, flow: str, key: str) -> bool:
    subject = next(s["id"] for s in acl["subjects"] if cn in s["cert_common_names"])
    rule_ids = {r for p in acl["policies"] if subject in p["subjects"] for r in p["rules"]}
    return any(
        r["id"] in rule_ids
        and message in r["messages"]
        and flow in r["flows"]
        and any(_includes(k, key) for k in r["key_exprs"])
        for r in acl["rules"]
    )


ACL = router_access_control(FLEET)
A = ReplicaKeys("arm", "main", "r0").client("default", "robot-a")
B = ReplicaKeys("arm", "main", "r0").client("default", "robot-b")


def test_default_is_deny_and_every_identity_is_a_certificate_common_name():
    assert ACL["enabled"] and ACL["default_permission"] == "deny"
    assert {cn for s in ACL["subjects"] for cn in s["cert_common_names"]} == {
        "robot-a",
        "robot-b",
        "server-r0",
        "server-r1",
    }
    assert all(r["permission"] == "allow" for r in ACL["rules"])
    json.dumps(ACL)  # the router takes it as JSON


@pytest.mark.parametrize(
    "message,flow,key",
    [
        ("put", "ingress", A.obs),
        ("declare_subscriber", "ingress", A.action),
        ("put", "egress", A.action),
        ("liveliness_token", "ingress", A.alive),
        ("query", "ingress", A.session),
        ("query", "ingress", A.reset),
        ("query", "ingress", "@fleet/arm/main/*/status"),
        ("reply", "egress", "@fleet/arm/main/*/status"),
        ("declare_liveliness_subscriber", "ingress", "@fleet/arm/main/*/alive"),
        ("liveliness_token", "egress", "@fleet/arm/main/r0/alive"),
        ("declare_subscriber", "egress", "@fleet/arm/main/r0/*/*/obs"),  # the server's subscriber reaches the robot
    ],
)
def test_a_robot_may_use_its_own_keys_and_the_control_plane_the_protocol_needs(message, flow, key):
    assert allowed(ACL, "robot-a", message, flow, key)


@pytest.mark.parametrize(
    "message,flow,key",
    [
        ("put", "ingress", B.obs),  # forge another robot's observations
        ("declare_subscriber", "ingress", B.obs),  # read them
        ("declare_subscriber", "ingress", B.action),  # read another robot's chunks
        ("put", "egress", B.action),
        ("put", "ingress", A.action),  # publish chunks to itself (impersonate the server)
        ("liveliness_token", "ingress", B.alive),  # another robot's presence
        ("liveliness_token", "ingress", "@fleet/arm/main/r0/alive"),  # a replica's presence
        ("query", "ingress", B.session),
        ("query", "ingress", B.reset),  # open or reset another robot's session
        ("query", "ingress", "@fleet/arm/main/r0/session"),  # the replica-level open takes the body's word for the uuid
        ("declare_queryable", "ingress", "@fleet/arm/main/r0/status"),  # impersonate a replica
        ("declare_subscriber", "ingress", "@fleet/**"),
        ("put", "ingress", "@fleet/arm/main/r0/default/robot-a/alive"),
    ],
)
def test_a_robot_may_not_touch_another_robots_keys_or_impersonate_a_replica(message, flow, key):
    assert not allowed(ACL, "robot-a", message, flow, key)


@pytest.mark.parametrize(
    "message,flow,key,ok",
    [
        ("declare_queryable", "ingress", "@fleet/arm/main/r0/status", True),
        ("declare_queryable", "ingress", "@fleet/arm/main/r0/*/*/session", True),
        ("declare_subscriber", "ingress", "@fleet/arm/main/r0/*/*/obs", True),
        ("put", "ingress", A.action, True),
        ("liveliness_token", "ingress", "@fleet/arm/main/r0/alive", True),
        ("reply", "ingress", "@fleet/arm/main/*/status", True),  # replies are checked on the query's key
        ("liveliness_token", "ingress", "@fleet/arm/main/r1/alive", False),  # another replica's token
        ("declare_subscriber", "ingress", "@fleet/arm/main/r1/*/*/obs", False),  # another replica's traffic
        ("put", "ingress", "@fleet/arm/main/r1/default/robot-a/action", False),
    ],
)
def test_a_replica_gets_the_rights_of_its_own_keys_only(message, flow, key, ok):
    assert allowed(ACL, "server-r0", message, flow, key) is ok


def test_robot_rules_name_the_uuid_literally_and_never_use_double_star():
    for r in ACL["rules"]:
        if r["id"].startswith("robot-a-"):
            for k in r["key_exprs"]:
                assert "**" not in k
                assert k.endswith(("/status", "/alive", "/obs", "/action", "/session", "/reset")), k


def test_a_duplicate_or_unsafe_uuid_is_refused():
    with pytest.raises(ValueError):
        FleetIdentities(("robot-a", "robot-a"), ("r0",))
    with pytest.raises(WireError, match="BAD_KEY"):
        FleetIdentities(("robot/*",), ("r0",))


def test_the_cli_prints_the_block(capsys, tmp_path):
    f = tmp_path / "robots.txt"
    f.write_text("robot-a\n# comment\nrobot-b\n")
    assert main(["--robots-file", str(f), "--replica", "r0"]) == 0
    out = json.loads(capsys.readouterr().out)["access_control"]
    assert {s["id"] for s in out["subjects"]} == {"robot-robot-a", "robot-robot-b", "server-r0"}
    assert main(["--robot", "robot-a", "--replica", "r0", "--peer-router", "router", "--peer-router", "router-n1"]) == 0
    out = json.loads(capsys.readouterr().out)["access_control"]
    assert {s["id"] for s in out["subjects"]} == {"robot-robot-a", "server-r0", "peer-router", "peer-router-n1"}


def test_peer_routers_carry_everything_under_the_root_and_robots_keep_their_narrow_rules():
    acl = router_access_control(FleetIdentities(("robot-a", "robot-b"), ("r0",), routers=("router", "router-n1")))
    for cn in ("router", "router-n1"):  # a hub and its node router pass each other every client's traffic
        assert allowed(acl, cn, "put", "ingress", B.obs) and allowed(acl, cn, "put", "egress", A.action)
        assert allowed(acl, cn, "declare_queryable", "ingress", "@fleet/arm/main/r0/status")
        assert allowed(acl, cn, "liveliness_token", "egress", A.alive)
        assert not allowed(acl, cn, "put", "ingress", "other/root/key")  # the fleet's root only
    assert not allowed(acl, "robot-a", "put", "ingress", B.obs)  # unchanged by the peers
    assert [r for r in acl["rules"] if r["id"].startswith("robot-a-")] == [
        r for r in ACL["rules"] if r["id"].startswith("robot-a-")
    ]
    with pytest.raises(ValueError, match="both a router and a robot"):
        FleetIdentities(("router-n1",), ("r0",), routers=("router", "router-n1"))
    with pytest.raises(ValueError, match="both a router and a robot"):
        FleetIdentities(("robot-a",), ("r0",), routers=("server-r0",))  # nor a replica's name
