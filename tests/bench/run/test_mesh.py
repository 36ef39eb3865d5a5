"""bench.run.mesh, the pieces of per-node routers and proxies that need no Ray: which router mode a run
uses, a node router's command line, routers joined to a hub that route between each other (real Zenoh
routers, a querier on one and a queryable on another), a site call fanned out to every node's proxy with
the fidelity counters summed (real proxy servers), and a `router` fault on every router at once."""

from __future__ import annotations

import time

import pytest

from bench.run.mesh import AllRouters, NodeLinks, NodeMesh, SiteFanout, node_host, node_router_argv, resolve_routers
from chaos.client import ChaosClient, ProxyPool
from chaos.toxiproxy.fidelity import add
from tests.chaos.harness import connect, echo  # noqa: F401  (fixture)


def test_routers_default_to_per_node_except_with_mtls_and_a_contradiction_is_refused():
    assert resolve_routers(None, "tcp") == "per_node"
    assert resolve_routers(None, "mtls") == "driver"
    assert resolve_routers("driver", "tcp") == "driver" and resolve_routers("driver", "mtls") == "driver"
    with pytest.raises(ValueError, match=r"per_node is not built for security: mtls.*routers: driver"):
        resolve_routers("per_node", "mtls")
    with pytest.raises(ValueError, match="one of per_node, driver"):
        resolve_routers("each", "tcp")


def test_a_node_router_listens_on_its_node_and_joins_the_hub():
    argv = node_router_argv("10.0.0.7", 7448, "tcp/10.0.0.1:7447")
    assert argv[1:] == ["-m", "wire.transport", "--listen", "tcp/10.0.0.7:7448", "--connect", "tcp/10.0.0.1:7447"]
    assert node_host("127.0.0.1", {"ip": "10.0.0.7"}) == "127.0.0.1"  # the whole cluster is this host
    assert node_host("10.0.0.1", {"ip": "10.0.0.7"}) == "10.0.0.7"


def test_fidelity_snapshots_of_one_site_on_several_nodes_add_up():
    leg = {"chunks": 3, "bytes": 300, "asked_ms_sum": 30.0, "error_ms_sum": 1.5, "error_ms_max": 0.9, "early": 0,
           "hist": [1, 2, 0], "shaped_bytes": 0, "shaped_ideal_s": 0.0, "shaped_busy_s": 0.0, "rate_kbps": 0}
    other = {**leg, "chunks": 1, "bytes": 50, "error_ms_max": 2.5, "hist": [0, 0, 1], "rate_kbps": 100}
    total = add([{"edges_ms": [0.1, 0.2], "upstream": leg, "downstream": leg},
                 {"edges_ms": [0.1, 0.2], "upstream": other, "downstream": leg}])
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


@pytest.fixture
def two_proxy_servers(tmp_path, monkeypatch):
    from chaos.launch import start_proxy_server

    monkeypatch.setenv("CHAOS_PROXY", "python")
    servers = [start_proxy_server(tmp_path / f"p{i}.log") for i in range(2)]
    try:
        yield servers
    finally:
        for s in servers:
            s.stop()


@pytest.mark.integration
def test_a_site_call_reaches_the_drivers_proxy_and_every_nodes_and_their_legs_add_up(two_proxy_servers, echo,  # noqa: F811
                                                                                    tmp_path):
    driver, node = (ChaosClient(s.api_url) for s in two_proxy_servers)
    pool = ProxyPool([driver])
    pool.create_proxy("site-eu", upstream=f"127.0.0.1:{echo.port}")
    on_node = node.create_proxy("site-eu", upstream=f"127.0.0.1:{echo.port}")
    mesh = NodeMesh(None, "tcp/127.0.0.1:1", "127.0.0.1", tmp_path, lambda: {}, lambda *_: None)
    mesh.nodes["n1"] = NodeLinks({"node_id": "n1"}, router=None, router_endpoint="", client=node,
                                 sites={"eu": f"tcp/{on_node['listen']}"})
    chaos = SiteFanout(pool, mesh)
    chaos.add_toxic("site-eu", type="latency", attributes={"latency": 20}, name="lat")
    assert [t["name"] for t in driver.toxics("site-eu")] == ["lat"] == [t["name"] for t in node.toxics("site-eu")]
    s = connect(on_node["listen"])  # a robot on the node, through the node's copy of the site's proxy
    try:
        s.sendall(b"ping")
        assert s.recv(4) == b"ping"
    finally:
        s.close()
    legs = chaos.fidelity("site-eu")
    assert legs["downstream"]["chunks"] >= 1 and legs["downstream"]["bytes"] >= 4  # the node's bytes count (the toxic is downstream)
    assert legs["downstream"]["bytes"] == node.fidelity("site-eu")["downstream"]["bytes"]  # the driver's copy: idle
    chaos.set_enabled("site-eu", False)  # a partition of the site is a partition on every node
    assert driver.get_proxy("site-eu")["enabled"] is False and node.get_proxy("site-eu")["enabled"] is False
    chaos.remove_toxic("site-eu", "lat")
    assert node.toxics("site-eu") == [] and chaos.server_of("site-eu") == 0


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



def test_run_refuses_per_node_routers_with_mtls_before_it_joins_a_cluster(tmp_path, capsys, monkeypatch):
    from bench.cli import main
    from tests.bench.scenario.test_validate_catches import BASE

    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # were it tried, joining would fail with another message
    path = tmp_path / "s.yaml"
    path.write_text(BASE + "security: mtls\ncluster: {routers: per_node}\n")
    assert main(["run", str(path), "--cluster", "ray", "--reports", str(tmp_path / "reports")]) == 2
    err = capsys.readouterr().err
    assert "cluster.routers: per_node is not built for security: mtls" in err and "routers: driver" in err, err
    assert not (tmp_path / "reports").exists()
