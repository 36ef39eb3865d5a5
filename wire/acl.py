"""Router access rules generated from a fleet: default deny, one subject per certificate identity.

    fleet (robot uuids, replicas) ──► router_access_control(...) ──► access_control JSON for zenohd
                                                                     (`python -m wire.acl` prints it)

What each identity may do (design 004 6.6; key layout in wire.keys), every other message denied:

    robot <uuid>   ingress put                <root>/*/*/*/*/<uuid>/obs          its own observations
                   ingress declare_subscriber <root>/*/*/*/*/<uuid>/action       its own chunks ...
                   egress  put                <root>/*/*/*/*/<uuid>/action       ... delivered to it
                   ingress liveliness_token   <root>/*/*/*/*/<uuid>/alive        its own presence
                   ingress query              <root>/*/*/*/*/<uuid>/{session,reset}  its own control plane
                   ingress query              <root>/*/*/*/status                discovery (status is public)
                   egress  reply              the same keys                      the answers
                   ingress liveliness_subscriber / liveliness_query <root>/*/*/*/alive   replica presence
                   egress  liveliness_token   <root>/*/*/*/alive                 replica tokens reach it
    server-<rid>   ingress declare_queryable  its replica's status, session, */*/session, */*/reset
                   ingress declare_subscriber its replica's */*/obs;  egress put of the same (delivered)
                   ingress put                its replica's */*/action;  egress declare_subscriber (routing)
                   ingress liveliness_token   its replica's alive;  ingress/egress liveliness of */*/alive
                   egress  query / ingress reply on its queryables (the requests reach it, answers leave)
    peer router    every message, both flows, <root>/**: a hub and its node routers (`bench run --cluster ray`,
                   bench.run.mesh) carry each other's clients, each client checked by the router it is attached to

A robot's rules name its uuid literally, so a robot can neither publish to nor subscribe to another
robot's keys, nor declare another robot's or a replica's token, nor open or reset another robot's
session (the per-client `session` key), nor reach the replica-level `session` key. Facts measured
with eclipse-zenoh 1.10 (shared/notes/zenoh-python.md): denials are silent, the router's own
in-process session bypasses the rules, and rule changes need a router restart.

Invariant: the generated rules never use `**` under the root for a robot; every robot key
expression has the client uuid as its literal sixth chunk.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

from wire.keys import DEFAULT_ROOT, sanitize, sanitize_root

ROBOT_INGRESS_TOPICS = {
    "obs": ("put",),
    "action": ("declare_subscriber",),
    "alive": ("liveliness_token",),
    "session": ("query",),
    "reset": ("query",),
}


@dataclass(frozen=True)
class FleetIdentities:
    """Who connects to the router: robot client uuids (= certificate CNs) and replica ids."""

    robots: tuple[str, ...]
    replicas: tuple[str, ...]
    root: str = DEFAULT_ROOT
    monitors: tuple[str, ...] = ()  # read-only presence observers (the bench's ground-truth monitor)
    routers: tuple[str, ...] = ()  # peer routers' certificate CNs (a hub and its node routers): they carry everyone

    def __post_init__(self) -> None:
        sanitize_root(self.root)
        for r in self.robots:
            sanitize(r, "client_uuid")
        for r in self.replicas:
            sanitize(r, "replica_id")
        if len(set(self.robots)) != len(self.robots):
            raise ValueError("a robot uuid is listed twice; every robot needs its own certificate")
        others = {*self.robots, *(server_cn(r) for r in self.replicas), *self.monitors}
        clash = sorted(others & set(self.routers))
        if clash:  # a robot whose certificate names a router would get a router's rights
            raise ValueError(
                f"identity {clash[0]!r} is both a router and a robot, replica or monitor; "
                "every certificate common name must name one identity"
            )


def server_cn(replica_id: str) -> str:
    return f"server-{replica_id}"


def _robot_keys(root: str, uuid: str, topic: str) -> list[str]:
    return [f"{root}/*/*/*/*/{uuid}/{topic}"]


def _rule(rid: str, messages: list[str], flows: list[str], keys: list[str]) -> dict:
    return {"id": rid, "permission": "allow", "messages": messages, "flows": flows, "key_exprs": keys}


def robot_rules(root: str, uuid: str) -> list[dict]:
    own = lambda t: _robot_keys(root, uuid, t)  # noqa: E731
    return [
        _rule(f"{uuid}-obs", ["put"], ["ingress"], own("obs")),
        _rule(f"{uuid}-action", ["declare_subscriber"], ["ingress"], own("action")),
        _rule(f"{uuid}-action-in", ["put"], ["egress"], own("action")),
        _rule(f"{uuid}-alive", ["liveliness_token"], ["ingress"], own("alive")),
        _rule(f"{uuid}-control", ["query"], ["ingress"], own("session") + own("reset") + [f"{root}/*/*/*/status"]),
        _rule(
            f"{uuid}-control-replies", ["reply"], ["egress"], own("session") + own("reset") + [f"{root}/*/*/*/status"]
        ),
        # the servers' declarations must reach the robot, or its publisher sees no subscriber and sends nothing
        _rule(f"{uuid}-server-decls", ["declare_subscriber"], ["egress"], [f"{root}/*/*/*/*/*/obs"]),
        _rule(
            f"{uuid}-server-queryables",
            ["declare_queryable"],
            ["egress"],
            [f"{root}/*/*/*/*/*/session", f"{root}/*/*/*/*/*/reset", f"{root}/*/*/*/status"],
        ),
        _rule(
            f"{uuid}-replicas",
            ["declare_liveliness_subscriber", "liveliness_query"],
            ["ingress"],
            [f"{root}/*/*/*/alive"],
        ),
        _rule(f"{uuid}-replica-tokens", ["liveliness_token"], ["egress"], [f"{root}/*/*/*/alive"]),
    ]


def server_rules(root: str, replica_id: str) -> list[dict]:
    p = f"{root}/*/*/{replica_id}"
    rid = server_cn(replica_id)
    queryables = [f"{p}/status", f"{p}/session", f"{p}/*/*/session", f"{p}/*/*/reset"]
    return [
        _rule(f"{rid}-queryables", ["declare_queryable"], ["ingress"], queryables),
        # a discovery query names every replica (<root>/<model>/<rev>/*/status) and the router checks both the
        # query and its replies against the QUERY's key expression: the rules must include it whole
        _rule(f"{rid}-queries-in", ["query"], ["egress"], queryables + [f"{root}/*/*/*/status"]),
        _rule(f"{rid}-replies-out", ["reply"], ["ingress"], queryables + [f"{root}/*/*/*/status"]),
        _rule(f"{rid}-obs", ["declare_subscriber"], ["ingress"], [f"{p}/*/*/obs"]),
        _rule(f"{rid}-obs-in", ["put"], ["egress"], [f"{p}/*/*/obs"]),
        _rule(f"{rid}-action", ["put"], ["ingress"], [f"{p}/*/*/action"]),
        _rule(f"{rid}-action-subs", ["declare_subscriber"], ["egress"], [f"{p}/*/*/action"]),
        _rule(f"{rid}-alive", ["liveliness_token"], ["ingress"], [f"{p}/alive"]),
        _rule(
            f"{rid}-clients-alive",
            ["declare_liveliness_subscriber", "liveliness_query"],
            ["ingress"],
            [f"{p}/*/*/alive"],
        ),
        _rule(f"{rid}-clients-alive-in", ["liveliness_token"], ["egress"], [f"{p}/*/*/alive"]),
    ]


def monitor_rules(root: str, name: str) -> list[dict]:
    return [
        _rule(f"{name}-presence", ["declare_liveliness_subscriber", "liveliness_query"], ["ingress"], [f"{root}/**"]),
        _rule(f"{name}-presence-in", ["liveliness_token"], ["egress"], [f"{root}/**"]),
    ]


ROUTER_MESSAGES = [
    "put",
    "delete",
    "declare_subscriber",
    "query",
    "reply",
    "declare_queryable",
    "liveliness_token",
    "declare_liveliness_subscriber",
    "liveliness_query",
]


def peer_router_rules(root: str, cn: str) -> list[dict]:
    """Another router of the same network (hub <-> node router): it carries every robot's and replica's traffic,
    already checked against these same rules by the router those clients are attached to."""
    return [_rule(f"{cn}-all", ROUTER_MESSAGES, ["ingress", "egress"], [f"{root}/**"])]


def router_access_control(fleet: FleetIdentities) -> dict:
    """The `access_control` block of the router config (default deny)."""
    rules: list[dict] = []
    subjects: list[dict] = []
    policies: list[dict] = []

    def add(subject_id: str, cn: str, these: list[dict]) -> None:
        rules.extend(these)
        subjects.append({"id": subject_id, "cert_common_names": [cn]})
        policies.append({"rules": [r["id"] for r in these], "subjects": [subject_id]})

    for uuid in fleet.robots:
        add(f"robot-{uuid}", uuid, robot_rules(fleet.root, uuid))
    for rid in fleet.replicas:
        add(server_cn(rid), server_cn(rid), server_rules(fleet.root, rid))
    for name in fleet.monitors:
        add(f"monitor-{name}", name, monitor_rules(fleet.root, name))
    for cn in fleet.routers:
        add(f"peer-{cn}", cn, peer_router_rules(fleet.root, cn))
    return {"enabled": True, "default_permission": "deny", "rules": rules, "subjects": subjects, "policies": policies}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m wire.acl", description="Print the router access_control block for a fleet (JSON)."
    )
    ap.add_argument("--robot", action="append", default=[], help="client uuid = certificate CN (repeatable)")
    ap.add_argument("--robots-file", help="file with one client uuid per line")
    ap.add_argument("--replica", action="append", default=[], help="replica id (its certificate CN is server-<id>)")
    ap.add_argument(
        "--peer-router",
        action="append",
        default=[],
        help="certificate CN of another router of the same network (a hub or a node router, repeatable): "
        "allowed every message under the root, both ways",
    )
    ap.add_argument("--root", default=DEFAULT_ROOT)
    args = ap.parse_args(argv)
    robots = list(args.robot)
    if args.robots_file:
        with open(args.robots_file) as f:
            robots += [line.strip() for line in f if line.strip() and not line.startswith("#")]
    try:
        acl = router_access_control(
            FleetIdentities(tuple(robots), tuple(args.replica), args.root, routers=tuple(args.peer_router))
        )
    except Exception as exc:
        print(f"wire.acl: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"access_control": acl}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
