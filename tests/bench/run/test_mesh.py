"""bench.run.mesh, the pieces of per-node routers and proxies that need no Ray: which router mode a run
uses, a node router's command line, routers joined to a hub that route between each other (real Zenoh
routers, a querier on one and a queryable on another), node routers meshed with each other (a query between
two nodes with the hub killed, a restarted router rejoined, a router started mid-run admitted under mTLS),
a site call fanned out to every node's proxy with the fidelity counters summed (real proxy servers), and a
`router` fault on every router at once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bench.run.mesh import (
    AllRouters,
    MeshSecurity,
    NodeLinks,
    NodeMesh,
    SiteFanout,
    node_host,
    node_router_argv,
    peer_router_cns,
    resolve_routers,
)
from chaos.client import ChaosClient, ProxyPool
from chaos.toxiproxy.fidelity import add
from tests.chaos.harness import connect, echo  # noqa: F401  (fixture)


def test_routers_default_to_per_node_with_or_without_mtls_and_driver_stays_selectable():
    assert resolve_routers(None) == "per_node" and resolve_routers("driver") == "driver"
    with pytest.raises(ValueError, match="one of per_node, driver"):
        resolve_routers("each")


def test_a_node_router_listens_on_its_node_and_joins_the_hub_and_the_node_routers_started_before_it():
    argv = node_router_argv("10.0.0.7", 7448, "tcp/10.0.0.1:7447")
    assert argv[1:] == ["-m", "wire.transport", "--listen", "tcp/10.0.0.7:7448", "--connect", "tcp/10.0.0.1:7447"]
    argv = node_router_argv("10.0.0.8", 7449, "tcp/10.0.0.1:7447", peers=["tcp/10.0.0.7:7448"])
    assert argv[3:] == [
        "--listen",
        "tcp/10.0.0.8:7449",
        "--connect",
        "tcp/10.0.0.1:7447",
        "--connect",
        "tcp/10.0.0.7:7448",
    ]
    with pytest.raises(ValueError, match="a plain node router joins plain routers, not 'tls/10.0.0.7:7448'"):
        node_router_argv("10.0.0.8", 7449, "tcp/10.0.0.1:7447", peers=["tls/10.0.0.7:7448"])
    assert node_host("127.0.0.1", {"ip": "10.0.0.7"}) == "127.0.0.1"  # the whole cluster is this host
    assert node_host("10.0.0.1", {"ip": "10.0.0.7"}) == "10.0.0.7"


def test_fidelity_snapshots_of_one_site_on_several_nodes_add_up():
    leg = {
        "chunks": 3,
        "bytes": 300,
        "asked_ms_sum": 30.0,
        "error_ms_sum": 1.5,
        "error_ms_max": 0.9,
        "early": 0,
        "hist": [1, 2, 0],
        "shaped_bytes": 0,
        "shaped_ideal_s": 0.0,
        "shaped_busy_s": 0.0,
        "rate_kbps": 0,
    }
    other = {**leg, "chunks": 1, "bytes": 50, "error_ms_max": 2.5, "hist": [0, 0, 1], "rate_kbps": 100}
    total = add(
        [
            {"edges_ms": [0.1, 0.2], "upstream": leg, "downstream": leg},
            {"edges_ms": [0.1, 0.2], "upstream": other, "downstream": leg},
        ]
    )
    assert total["edges_ms"] == [0.1, 0.2]
    up = total["upstream"]
    assert (up["chunks"], up["bytes"], up["hist"], up["error_ms_max"], up["rate_kbps"]) == (4, 350, [1, 2, 1], 2.5, 100)
    assert up["error_ms_sum"] == 3.0 and total["downstream"]["chunks"] == 6


@pytest.mark.integration
def test_routers_joined_to_a_hub_route_a_query_from_one_node_to_another(tmp_path):
    from wire.procs import start_router
    from wire.transport import open_session

    hub, hub_endpoint = start_router(None, tmp_path / "hub.log")
    routers = [hub]
    try:
        a, a_endpoint = start_router(None, tmp_path / "a.log", connect=[hub_endpoint])
        routers.append(a)
        b, b_endpoint = start_router(None, tmp_path / "b.log", connect=[hub_endpoint])
        routers.append(b)
        assert a.argv[a.argv.index("--connect") + 1] == hub_endpoint
        replica = open_session(connect=[b_endpoint], what="replica on node B")
        robot = open_session(connect=[a_endpoint], what="robot on node A")
        try:
            replica.declare_queryable("mesh/probe", lambda q: q.reply("mesh/probe", b"served by B"))
            answers: list[bytes] = []
            deadline = time.monotonic() + 10
            while not answers and time.monotonic() < deadline:  # the routers exchange the route after join
                answers = [bytes(r.ok.payload.to_bytes()) for r in robot.get("mesh/probe", timeout=1.0) if r.ok]
            assert answers == [b"served by B"]
        finally:
            robot.close()
            replica.close()
    finally:
        for r in reversed(routers):
            r.stop()


@pytest.mark.integration
def test_meshed_node_routers_carry_a_query_between_two_nodes_with_the_hub_killed_and_rejoin_a_restarted_one(tmp_path):
    """router:B joins the hub and router:A (started before it), as NodeMesh starts them. A robot on node A reaches the
    replica on node B; samples published on A arrive on B once each although two paths exist (direct, and through
    the hub); with the hub frozen the query is answered at once (the route is the direct link), and with the hub
    killed -9 still crosses; router:A killed -9 and started again is rejoined by router:B (Zenoh retries a connect
    endpoint whose link closed), the hub still down."""
    import signal

    import zenoh

    from wire.procs import start_router
    from wire.transport import open_session

    hub, hub_endpoint = start_router(None, tmp_path / "hub.log")
    mesh = NodeMesh(_LocalCluster(), hub_endpoint, "127.0.0.1", tmp_path, lambda: {}, lambda *_: None)
    sessions = []
    try:
        a = mesh.links({"node_id": "a" * 40, "ip": "10.0.0.7"}, proxies=0)
        b = mesh.links({"node_id": "b" * 40, "ip": "10.0.0.8"}, proxies=0)
        assert (a.peers, b.peers) == ([], [a.router_endpoint])
        assert mesh.describe()["b" * 40]["router"]["peers"] == [a.router_endpoint]  # summary.json's cluster.nodes
        replica = open_session(connect=[b.router_endpoint], what="replica on node B")
        sessions.append(replica)
        robot = open_session(connect=[a.router_endpoint], what="robot on node A")
        sessions.append(robot)
        got: list[int] = []
        replica.declare_subscriber("mesh/seq", lambda s: got.append(int(bytes(s.payload.to_bytes()))))
        replica.declare_queryable("mesh/probe", lambda q: q.reply("mesh/probe", b"served by B"))
        assert _answers(robot, "mesh/probe") == [b"served by B"]
        pub = robot.declare_publisher("mesh/seq", congestion_control=zenoh.CongestionControl.BLOCK)
        deadline = time.monotonic() + 10
        while -1 not in got and time.monotonic() < deadline:  # the subscriber's route has reached router:A
            pub.put(b"-1")
            time.sleep(0.05)  # pacing the warm-up, not synchronisation: the loop waits for a delivery
        for i in range(50):
            pub.put(str(i).encode())
        assert _answers(robot, "mesh/probe") == [b"served by B"]  # a round trip after the last put, then count
        deadline = time.monotonic() + 10
        while len([g for g in got if g >= 0]) < 50 and time.monotonic() < deadline:
            assert _answers(robot, "mesh/probe", timeout_s=1.0) == [b"served by B"]
        assert [g for g in got if g >= 0] == list(range(50)), "a sample lost or delivered twice over the two paths"

        # the hub frozen (SIGSTOP: its links stay up until its 4 s lease runs out): answered at once all the same,
        # so the route already was the direct link (through the hub no answer comes back: measured, 5 of 5 unanswered)
        hub.signal(signal.SIGSTOP)
        assert _answers(robot, "mesh/probe", timeout_s=2.0) == [b"served by B"]
        hub.signal(signal.SIGKILL)
        hub.proc.wait()
        assert _answers(robot, "mesh/probe") == [b"served by B"]  # router:A -> router:B, no hub

        router_a = mesh.cluster.children[0].proc
        router_a.signal(signal.SIGKILL)
        router_a.proc.wait()
        router_a.start(timeout_s=15)  # the same argv and port, as a `router` fault's restart
        assert _answers(robot, "mesh/probe", timeout_s=15) == [b"served by B"]  # the robot and router:B came back
    finally:
        for s in reversed(sessions):
            s.close()
        for child in mesh.cluster.children:
            if child.proc is not None:
                child.proc.stop()
        hub.stop()


@pytest.fixture
def three_proxy_servers(tmp_path, monkeypatch):
    from tests.chaos.harness import python_proxy_servers

    with python_proxy_servers(tmp_path, monkeypatch, 3) as servers:
        yield servers


class _Named:
    def __init__(self, name):
        self.name = name


@pytest.mark.integration
def test_a_site_call_reaches_the_drivers_proxy_and_every_nodes_and_their_legs_add_up(
    three_proxy_servers, echo, tmp_path
):  # noqa: F811
    """The node has two proxy processes (as bench.run.sizing.node_proxy_processes gives a busy node): its copy of
    site eu was dealt to the second, so a call on the site must find it there, not on the node's first process."""
    driver, node_0, node_1 = (ChaosClient(s.api_url) for s in three_proxy_servers)
    pool = ProxyPool([driver])
    pool.create_proxy("site-eu", upstream=f"127.0.0.1:{echo.port}")
    on_node = ProxyPool([node_0, node_1])  # the node's sites dealt over its processes as NodeMesh deals them
    on_node.create_proxy("site-us", upstream=f"127.0.0.1:{echo.port}")
    eu = on_node.create_proxy("site-eu", upstream=f"127.0.0.1:{echo.port}")
    mesh = NodeMesh(None, "tcp/127.0.0.1:1", "127.0.0.1", tmp_path, lambda: {}, lambda *_: None)
    mesh.nodes["n1"] = NodeLinks(
        {"node_id": "n1"},
        router=_Named("router:n1"),
        router_endpoint="",
        proxies=[_Named("chaos-proxy:n1"), _Named("chaos-proxy-1:n1")],
        api_urls=[node_0.url, node_1.url],
        pool=on_node,
        sites={"us": "tcp/elsewhere", "eu": f"tcp/{eu['listen']}"},
    )
    described = mesh.describe()["n1"]["chaos_proxy"]
    assert described["processes"] == 2 and described["site_process"] == {"us": 0, "eu": 1}
    assert [s["name"] for s in described["servers"]] == ["chaos-proxy:n1", "chaos-proxy-1:n1"]
    assert set(node_1.list_proxies()) == {"site-eu"}  # the site lives on the node's second process only
    chaos = SiteFanout(pool, mesh)
    chaos.add_toxic("site-eu", type="latency", attributes={"latency": 20}, name="lat")
    assert [t["name"] for t in driver.toxics("site-eu")] == ["lat"] == [t["name"] for t in node_1.toxics("site-eu")]
    assert node_0.toxics("site-us") == []  # the other site's process got nothing
    s = connect(eu["listen"])  # a robot on the node, through the node's copy of the site's proxy
    try:
        s.sendall(b"ping")
        assert s.recv(4) == b"ping"
    finally:
        s.close()
    legs = chaos.fidelity("site-eu")
    assert (
        legs["downstream"]["chunks"] >= 1 and legs["downstream"]["bytes"] >= 4
    )  # the node's bytes count (the toxic is downstream)
    assert legs["downstream"]["bytes"] == node_1.fidelity("site-eu")["downstream"]["bytes"]  # the driver's copy: idle
    chaos.set_enabled("site-eu", False)  # a partition of the site is a partition on every node
    assert driver.get_proxy("site-eu")["enabled"] is False and node_1.get_proxy("site-eu")["enabled"] is False
    assert node_0.get_proxy("site-us")["enabled"] is True
    chaos.remove_toxic("site-eu", "lat")
    assert node_1.toxics("site-eu") == [] and chaos.server_of("site-eu") == 0


class _LocalChild:
    """A cluster child that runs here (bench.run.cluster.RemoteChild's calls NodeMesh makes): a real process."""

    def __init__(self, name, log_path, ready_text):
        self.name, self.log_path, self.ready_text, self.argv, self.proc = name, log_path, ready_text, None, None

    def locate(self):
        return {}

    def free_ports(self, n):
        from wire.procs import free_port

        return [free_port() for _ in range(n)]

    def set_argv(self, argv):
        self.argv = argv

    def start(self, timeout_s):
        from wire.procs import ChildProcess

        self.proc = ChildProcess(self.argv, self.log_path, ready_text=self.ready_text, name=self.name)
        self.proc.start(timeout_s=timeout_s)


class _LocalCluster:
    def __init__(self):
        self.children = []

    def place_on(self, node_id, name, log_path, ready_text=None, **kw):
        self.children.append(_LocalChild(name, log_path, ready_text))
        return self.children[-1]


@pytest.mark.integration
def test_a_node_given_two_proxy_processes_deals_its_sites_over_them_and_a_site_call_finds_each(echo, tmp_path):  # noqa: F811
    node = {"node_id": "n" * 40, "ip": "10.0.0.7"}
    toxics = {"us": [], "eu": [{"type": "latency", "attributes": {"latency": 5}, "name": "profile"}]}
    registered = []
    mesh = NodeMesh(
        _LocalCluster(),
        "tcp/127.0.0.1:1",
        "127.0.0.1",
        tmp_path,
        lambda: toxics,
        lambda name, child: registered.append(name),
    )
    # the node's router stands in as the echo server: what a robot sends through its site's proxy comes back
    mesh.nodes[node["node_id"]] = NodeLinks(
        node, router=_Named("router:nnnnnnnnnnnn"), router_endpoint=f"tcp/127.0.0.1:{echo.port}"
    )
    try:
        links = mesh.links(node, proxies=2)
        assert registered == ["chaos-proxy:nnnnnnnnnnnn", "chaos-proxy-1:nnnnnnnnnnnn"]
        assert mesh.links(node, proxies=3) is links and len(links.proxies) == 2  # a node keeps its first processes
        described = mesh.describe()[node["node_id"]]["chaos_proxy"]
        assert described["processes"] == 2 and described["site_process"] == {"us": 0, "eu": 1}
        second = ChaosClient(links.api_urls[1])
        assert set(second.list_proxies()) == {"site-eu"}  # eu was dealt to the node's second process
        assert [t["name"] for t in second.toxics("site-eu")] == ["profile"]  # with its site's profile
        s = connect(links.sites["eu"].split("/", 1)[1])
        try:
            s.sendall(b"ping")
            assert s.recv(4) == b"ping"
        finally:
            s.close()
        (client,) = mesh.clients("site-eu")  # what SiteFanout calls for the site on this node: its second process
        assert client.url == links.api_urls[1] and client.fidelity("site-eu")["downstream"]["bytes"] >= 4
        assert [c.url for c in mesh.clients("site-us")] == [links.api_urls[0]]
    finally:
        for child in mesh.cluster.children:
            if child.proc is not None:
                child.proc.stop()


def test_each_node_is_sized_by_the_robots_of_the_shards_placed_on_it_and_what_ray_reserved_there():
    """node_proxy_processes: node A carries shards 0 and 1 (3,000 robots at 30 Hz over 3 sites) and has the
    CPUs; node B carries one small shard beside a replica on 2 CPUs; node C only a replica (no shards: no proxies)."""
    from types import SimpleNamespace as NS

    from bench.run.specs import node_proxy_processes

    class Placed:
        def __init__(self, node_id):
            self.node_id = node_id

        def locate(self):
            return {"node_id": self.node_id}

    table = [{"group": "g"}] * 3010
    specs = [
        {"shard": 0, "robots": [{"robot": i} for i in range(0, 1500)]},
        {"shard": 1, "robots": [{"robot": i} for i in range(1500, 3000)]},
        {"shard": 2, "robots": [{"robot": i} for i in range(3000, 3010)]},
    ]
    placed = {0: Placed("A"), 1: Placed("A"), 2: Placed("B")}
    run = NS(
        s=NS(cluster={"shard_cpus": 1, "replica_cpus": 1}, sites={"a": None, "b": None, "c": None}),
        cluster=NS(
            nodes=lambda: [{"node_id": "A", "cpus": 16}, {"node_id": "B", "cpus": 2}, {"node_id": "C", "cpus": 8}]
        ),
        robot_table=table,
        request_rates={"g": 1.5},  # 30 Hz robots asking every 20 ticks
        servers={"r0": {"child": Placed("B")}, "r1": {"child": Placed("C")}},
    )
    assert node_proxy_processes(run, specs, placed) == {"A": 3, "B": 1}
    run.cluster = NS(nodes=lambda: [{"node_id": "A", "cpus": 4}, {"node_id": "B", "cpus": 2}])
    assert node_proxy_processes(run, specs, placed) == {"A": 1, "B": 1}  # A's CPUs: its 2 shards and router
    run.servers["r2"] = {"child": Placed("A")}  # a replica beside them takes the one CPU left for a second loop
    run.cluster = NS(nodes=lambda: [{"node_id": "A", "cpus": 5}, {"node_id": "B", "cpus": 2}])
    assert node_proxy_processes(run, specs, placed) == {"A": 1, "B": 1}
    del run.servers["r2"]
    assert node_proxy_processes(run, specs, placed) == {"A": 2, "B": 1}


@pytest.mark.integration
def test_a_router_fault_takes_every_router_down_and_its_undo_brings_each_back(tmp_path):
    from chaos.faults import ManagedProcess

    routers = [ManagedProcess.router(tmp_path / f"r{i}.log", name=f"router-{i}")[0] for i in range(2)]
    try:
        both = AllRouters(routers)
        pids = [r.pid for r in routers]
        handle = both.kill()
        assert not any(r.alive() for r in routers) and not both.alive()
        handle.undo()
        assert all(r.alive() for r in routers) and [r.pid for r in routers] != pids
        both.restart()
        assert both.alive()
        from chaos.faults import ProcessFaultError

        with pytest.raises(ProcessFaultError, match="restart_with is for a server"):
            both.restart_with(["x"])
    finally:
        for r in routers:
            r.stop()


# --- security: mtls on node routers (MeshSecurity) ----------------------------------------------------------------


def test_a_secure_node_router_listens_with_tls_joins_a_tls_hub_and_enforces_the_rules():
    from bench.security.pki import Issued

    tls = Issued("/p/ca.pem", "/p/router-n1.pem", "/p/router-n1.key")
    argv = node_router_argv("10.0.0.7", 7448, "tls/10.0.0.1:7447", tls, "/p/rules.json")
    assert argv[3:] == [
        "--listen",
        "tls/10.0.0.7:7448",
        "--connect",
        "tls/10.0.0.1:7447",
        "--tls-ca",
        "/p/ca.pem",
        "--tls-cert",
        "/p/router-n1.pem",
        "--tls-key",
        "/p/router-n1.key",
        "--access-control",
        "/p/rules.json",
    ]
    with pytest.raises(ValueError, match="joins TLS routers under access rules"):
        node_router_argv("10.0.0.7", 7448, "tcp/10.0.0.1:7447", tls, "/p/rules.json")  # a plain hub: never
    with pytest.raises(ValueError, match="joins TLS routers under access rules, not 'tcp/10.0.0.8:7448'"):
        node_router_argv("10.0.0.7", 7448, "tls/10.0.0.1:7447", tls, "/p/rules.json", ["tcp/10.0.0.8:7448"])
    with pytest.raises(ValueError, match="joins TLS routers under access rules"):
        node_router_argv("10.0.0.7", 7448, "tls/10.0.0.1:7447", tls, None)  # no rules: never


def test_peer_router_names_are_roles_and_cannot_be_a_robots(tmp_path):
    from wire.acl import FleetIdentities

    assert peer_router_cns() == ("router", "node-router")  # the hub's and every node router's, whichever node
    with pytest.raises(ValueError, match="'node-router' is both a router and a robot"):
        FleetIdentities(("node-router",), ("r0",), routers=peer_router_cns())


class _Node:
    """The part of a cluster child NodeMesh uses before it starts one (bench.run.cluster.RemoteChild)."""

    def __init__(self):
        self.files, self.argv, self.started, self.name = {}, None, False, "router:nnnnnnnnnnnn"

    def locate(self):
        return {}

    def free_ports(self, n):
        return [7448]

    def set_argv(self, argv):
        self.argv = argv

    def start(self, timeout_s):
        self.started = True


class _Cluster:
    def __init__(self):
        self.children = []

    def place_on(self, node_id, name, log_path, **kw):
        self.children.append(_Node())
        return self.children[-1]


def test_a_node_router_gets_its_own_key_a_role_certificate_naming_its_node_and_the_rules_and_so_does_a_late_one(
    tmp_path,
):
    from cryptography import x509

    from bench.security.pki import Pki

    pki, rules = Pki(tmp_path / "pki"), tmp_path / "rules.json"
    rules.write_text("{}")
    mesh = NodeMesh(
        _Cluster(), "tls/10.0.0.1:7447", "10.0.0.1", tmp_path, lambda: {}, lambda *_: None, MeshSecurity(pki, rules)
    )
    links = mesh.links({"node_id": "n" * 40, "ip": "10.0.0.7"}, proxies=0)
    child = mesh.cluster.children[0]
    assert child.started and links.router_endpoint == "tls/10.0.0.7:7448"
    assert links.describe()["router"]["access_rules"] == str(rules)
    cert = child.argv[child.argv.index("--tls-cert") + 1]
    assert cert == str(pki.dir / "router-nnnnnnnnnnnn.pem") == links.describe()["router"]["certificate"]
    assert set(child.files) == {str(pki.ca_cert_path), cert, child.argv[child.argv.index("--tls-key") + 1], str(rules)}
    issued = x509.load_pem_x509_certificate(child.files[cert])
    assert issued.subject.rfc4514_string() == "CN=node-router"  # the role the rules admit
    sans = issued.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "10.0.0.7" in [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)]  # robots verify this name
    assert "nnnnnnnnnnnn.node.invalid" in sans.get_values_for_type(x509.DNSName)  # its node, recorded
    with pytest.raises(ValueError, match="need MeshSecurity"):  # a TLS hub never gets plain node routers
        NodeMesh(_Cluster(), "tls/10.0.0.1:7447", "10.0.0.1", tmp_path, lambda: {}, lambda *_: None)
    # a node the run had not used (say a replica restarted there): its router starts, joins the hub and the first
    late = mesh.links({"node_id": "m" * 40, "ip": "10.0.0.8"}, proxies=0)
    argv = mesh.cluster.children[1].argv
    assert late.peers == [links.router_endpoint]
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--connect"] == ["tls/10.0.0.1:7447", "tls/10.0.0.7:7448"]
    late_cert = x509.load_pem_x509_certificate(Path(argv[argv.index("--tls-cert") + 1]).read_bytes())
    assert late_cert.subject.rfc4514_string() == "CN=node-router"
    assert argv[argv.index("--tls-key") + 1] != child.argv[child.argv.index("--tls-key") + 1]  # its own key


@pytest.fixture
def secure_mesh(tmp_path):
    """A hub and node router A, both mTLS with the same generated rules (a fleet of robot-a, robot-b and replicas
    r0, r1; the hub and the node routers as peers, by role), A started by NodeMesh as a run starts it; a test
    starts another node's router mid-run with `mesh.links`."""
    import json
    from types import SimpleNamespace

    from bench.security.pki import Pki
    from wire.acl import FleetIdentities, router_access_control
    from wire.procs import ChildProcess, free_port

    pki = Pki(tmp_path / "pki")
    rules = tmp_path / "router-access-control.json"
    acl = router_access_control(FleetIdentities(("robot-a", "robot-b"), ("r0", "r1"), routers=peer_router_cns()))
    rules.write_text(json.dumps({"access_control": acl}))
    hub_tls = pki.router()
    hub_endpoint = f"tls/127.0.0.1:{free_port()}"
    hub = ChildProcess(
        [*router_argv_for_hub(hub_endpoint, hub_tls, rules)],
        tmp_path / "hub.log",
        ready_text="router ready",
        name="hub",
    )
    hub.start(timeout_s=15)
    mesh = NodeMesh(
        _LocalCluster(), hub_endpoint, "127.0.0.1", tmp_path, lambda: {}, lambda *_: None, MeshSecurity(pki, rules)
    )
    try:
        a = mesh.links({"node_id": "n" * 40, "ip": "127.0.0.1"}, proxies=0)
        yield SimpleNamespace(pki=pki, hub=hub, hub_endpoint=hub_endpoint, node_endpoint=a.router_endpoint, mesh=mesh)
    finally:
        for child in mesh.cluster.children:
            if child.proc is not None:
                child.proc.stop()
        hub.stop()


def router_argv_for_hub(endpoint, tls, rules):
    from wire.procs import router_argv

    return router_argv(
        endpoint, (), ["--tls-ca", tls.ca, "--tls-cert", tls.cert, "--tls-key", tls.key, "--access-control", str(rules)]
    )


def _session(pki, endpoint, identity):
    from wire.transport import TlsFiles, open_session

    f = pki.server(identity.removeprefix("server-")) if identity.startswith("server-") else pki.robot(identity)
    return open_session(connect=[endpoint], tls=TlsFiles(f.ca, f.cert, f.key), what=identity)


def _answers(session, key, timeout_s=10.0, want=1):
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:  # the routers exchange the route after join
        got = sorted(bytes(r.ok.payload.to_bytes()) for r in session.get(key, timeout=1.0) if r.ok)
    return got


@pytest.mark.integration
def test_mtls_node_router_and_hub_carry_a_robots_query_to_a_replica_on_the_hub(secure_mesh):
    pki, hub_endpoint, node_endpoint = secure_mesh.pki, secure_mesh.hub_endpoint, secure_mesh.node_endpoint
    replica = _session(pki, hub_endpoint, "server-r0")
    robot = _session(pki, node_endpoint, "robot-a")  # on the node router: checked by the node's rules
    try:
        replica.declare_queryable("@fleet/arm/main/r0/status", lambda q: q.reply("@fleet/arm/main/r0/status", b"r0"))
        assert _answers(robot, "@fleet/arm/main/*/status") == [b"r0"]  # node router -> hub -> replica, and back
    finally:
        robot.close()
        replica.close()


@pytest.mark.integration
@pytest.mark.parametrize("router", ["first", "started mid-run"])
def test_mtls_node_router_refuses_a_client_without_a_certificate_of_the_runs_ca(secure_mesh, tmp_path, router):
    import json

    import zenoh

    from bench.security.pki import Pki
    from wire.transport import TlsFiles, make_config, open_session

    pki, node_endpoint = secure_mesh.pki, secure_mesh.node_endpoint
    if router == "started mid-run":  # admitted among the routers by its role; its own clients still checked
        node_endpoint = secure_mesh.mesh.links({"node_id": "m" * 40, "ip": "127.0.0.1"}, proxies=0).router_endpoint
    with pytest.raises(ConnectionError, match="refused the handshake"):  # no client certificate at all
        open_session(connect=[node_endpoint], tls=TlsFiles(pki.ca_cert_path.as_posix()), what="no-cert")
    foreign = Pki(tmp_path / "foreign", ca_name="foreign-ca").robot("robot-a")  # the right name, another CA
    c = make_config("client", connect=[node_endpoint])  # past our own file checks: the node router must refuse
    c.insert_json5(
        "transport/link/tls",
        json.dumps(
            {
                "root_ca_certificate": pki.ca_cert_path.as_posix(),
                "enable_mtls": True,
                "connect_certificate": foreign.cert,
                "connect_private_key": foreign.key,
            }
        ),
    )
    with pytest.raises(zenoh.ZError):
        zenoh.open(c)


@pytest.mark.integration
def test_mtls_node_router_rules_refuse_a_robot_a_replicas_key(secure_mesh):
    pki, hub_endpoint, node_endpoint = secure_mesh.pki, secure_mesh.hub_endpoint, secure_mesh.node_endpoint
    rogue = _session(pki, node_endpoint, "robot-a")
    robot = _session(pki, node_endpoint, "robot-b")
    replica = _session(pki, hub_endpoint, "server-r0")
    try:
        # robot-a poses as replica r1 on its node router first; the real r0 declares afterwards, behind the hub
        rogue.declare_queryable("@fleet/arm/main/r1/status", lambda q: q.reply("@fleet/arm/main/r1/status", b"forged"))
        replica.declare_queryable("@fleet/arm/main/r0/status", lambda q: q.reply("@fleet/arm/main/r0/status", b"r0"))
        # r0's route crossed the hub and reached robot-b's router, so robot-a's (same router) would have too
        assert _answers(robot, "@fleet/arm/main/*/status") == [b"r0"]
        assert _answers(robot, "@fleet/arm/main/*/status", timeout_s=1.0, want=2) == [b"r0"]  # still no forgery
    finally:
        replica.close()
        robot.close()
        rogue.close()


@pytest.mark.integration
def test_mtls_node_router_rules_keep_a_robot_off_another_robots_keys_across_the_hub_link(secure_mesh):
    """robot-a and robot-b on the node router, their replica behind the hub: robot-a can neither read robot-b's
    chunks nor forge robot-b's observations; each check is ordered after a delivery that proves the route."""
    from wire.keys import ReplicaKeys

    pki, hub_endpoint, node_endpoint = secure_mesh.pki, secure_mesh.hub_endpoint, secure_mesh.node_endpoint
    k = ReplicaKeys("arm", "main", "r0")
    a_keys, b_keys = k.client("default", "robot-a"), k.client("default", "robot-b")
    rogue, robot = _session(pki, node_endpoint, "robot-a"), _session(pki, node_endpoint, "robot-b")
    replica = _session(pki, hub_endpoint, "server-r0")
    try:
        spied, delivered, seen = [], [], []
        rogue.declare_subscriber(b_keys.action, lambda s: spied.append(s))  # before robot-b's own: denied
        robot.declare_subscriber(b_keys.action, lambda s: delivered.append(s))
        replica.declare_subscriber(k.all_obs, lambda s: seen.append(str(s.key_expr)))
        deadline = time.monotonic() + 10
        while (len(delivered) < 3 or a_keys.obs not in seen) and time.monotonic() < deadline:
            replica.put(b_keys.action, b"chunk")  # the replica may publish robot-b's chunks
            rogue.put(b_keys.obs, b"forged")  # robot-a forges robot-b's observation first...
            rogue.put(a_keys.obs, b"own")  # ...then its own, on the same link, which passes
            time.sleep(0.05)  # pacing the publisher, not synchronisation: the loop waits for deliveries
        assert len(delivered) >= 3 and a_keys.obs in seen, (len(delivered), seen)
        assert spied == [] and b_keys.obs not in seen
    finally:
        replica.close()
        robot.close()
        rogue.close()


@pytest.mark.integration
def test_mtls_a_node_router_started_mid_run_is_admitted_by_the_running_routers_and_reaches_them_without_the_hub(
    secure_mesh,
):
    """A node the run had not used gets its router mid-run (the others keep running, their rules unchanged): it
    joins the hub and router A over mTLS, a robot on A reaches a replica on it, and with the hub killed -9 the
    query still crosses their direct mTLS link (each side checked the other's certificate and the rules' role)."""
    import signal

    m = secure_mesh
    late = m.mesh.links({"node_id": "m" * 40, "ip": "127.0.0.1"}, proxies=0)
    assert late.peers == [m.node_endpoint]
    replica = _session(m.pki, late.router_endpoint, "server-r0")  # on the late router: checked by its rules
    robot = _session(m.pki, m.node_endpoint, "robot-a")
    try:
        replica.declare_queryable("@fleet/arm/main/r0/status", lambda q: q.reply("@fleet/arm/main/r0/status", b"r0"))
        assert _answers(robot, "@fleet/arm/main/*/status") == [b"r0"]
        m.hub.signal(signal.SIGKILL)
        m.hub.proc.wait()
        assert _answers(robot, "@fleet/arm/main/*/status") == [b"r0"]  # router A -> the late router, no hub
    finally:
        robot.close()
        replica.close()


@pytest.mark.integration
def test_mtls_a_router_of_another_ca_under_the_node_router_role_is_never_admitted_as_a_peer(secure_mesh, tmp_path):
    """The role CN makes the run's CA the only gate: a router holding a foreign CA's `node-router` certificate,
    started before a legitimate late router and joining the same routers, never carries its client's forgery to
    them, while the legitimate one's replica is reached (so the rogue had the time to join, and was refused)."""
    from bench.security.pki import Pki
    from wire.procs import ChildProcess, free_port, router_argv

    m = secure_mesh
    foreign = Pki(tmp_path / "foreign", ca_name="foreign-ca")
    rogue_tls = foreign.node_router("rrrrrrrrrrrr", "127.0.0.1")
    rogue_endpoint = f"tls/127.0.0.1:{free_port()}"
    tls_args = ["--tls-ca", rogue_tls.ca, "--tls-cert", rogue_tls.cert, "--tls-key", rogue_tls.key]
    rogue = ChildProcess(
        router_argv(rogue_endpoint, [m.hub_endpoint, m.node_endpoint], tls_args),
        tmp_path / "rogue.log",
        ready_text="router ready",
        name="rogue-router",
    )
    rogue.start(timeout_s=15)
    sessions = []
    try:
        forger = _session(foreign, rogue_endpoint, "robot-a")  # its own CA's client, on its own router: no rules
        sessions.append(forger)
        forger.declare_queryable("@fleet/arm/main/r1/status", lambda q: q.reply("@fleet/arm/main/r1/status", b"forged"))
        late = m.mesh.links({"node_id": "m" * 40, "ip": "127.0.0.1"}, proxies=0)
        replica = _session(m.pki, late.router_endpoint, "server-r0")
        sessions.append(replica)
        robot = _session(m.pki, m.node_endpoint, "robot-b")
        sessions.append(robot)
        replica.declare_queryable("@fleet/arm/main/r0/status", lambda q: q.reply("@fleet/arm/main/r0/status", b"r0"))
        assert _answers(robot, "@fleet/arm/main/*/status") == [b"r0"]
        assert _answers(robot, "@fleet/arm/main/*/status", timeout_s=2.0, want=2) == [b"r0"]  # still no forgery
    finally:
        for s in reversed(sessions):
            s.close()
        rogue.stop()
