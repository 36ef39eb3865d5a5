"""chaos.client.ProxyPool: a run's sites spread over several proxy processes, each proxy reached (toxics,
enable/disable, fidelity) on the server that created it; and the rule that sizes the pool."""

from __future__ import annotations

import pytest

from chaos.client import ChaosClient, ProxyPool
from tests.chaos.harness import connect, echo, python_proxy_servers  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration


@pytest.fixture
def two_servers(tmp_path, monkeypatch):
    with python_proxy_servers(tmp_path, monkeypatch, 2) as servers:
        yield servers


def test_sites_are_dealt_over_the_servers_and_every_call_reaches_the_right_one(two_servers, echo):  # noqa: F811
    pool = ProxyPool([ChaosClient(s.api_url) for s in two_servers])
    for name in ("site-eu", "site-us", "site-ap"):
        pool.create_proxy(name, upstream=f"127.0.0.1:{echo.port}", listen="127.0.0.1:0")
    assert [pool.server_of(n) for n in ("site-eu", "site-us", "site-ap")] == [0, 1, 0]
    pool.add_toxic("site-us", type="latency", attributes={"latency": 30})
    own = ChaosClient(two_servers[1].api_url)
    assert [t["type"] for t in own.toxics("site-us")] == ["latency"]  # on server 1, where site-us lives
    assert set(own.list_proxies()) == {"site-us"} and set(pool.list_proxies()) == {"site-eu", "site-us", "site-ap"}
    pool.set_enabled("site-eu", False)
    assert pool.get_proxy("site-eu")["enabled"] is False and pool.get_proxy("site-ap")["enabled"] is True
    with pytest.raises(KeyError, match="no proxy 'site-xx'"):
        pool.toxics("site-xx")
    s = connect(pool.get_proxy("site-ap")["listen"])  # a proxy on a pooled server carries bytes
    try:
        s.sendall(b"ping")
        assert s.recv(4) == b"ping"
    finally:
        s.close()


def test_the_pool_size_follows_the_proxy_load_and_the_spare_cores():
    from bench.cli import load_with_overrides
    from bench.run.sizing import proxy_processes

    def headline(*sets):
        return load_with_overrides("scenarios/300_robots_wan.yaml", list(sets), check_checkpoints=False)

    assert proxy_processes(headline(), cores=2) == 1  # the headline here: one loop, no core to spare
    assert proxy_processes(headline(), cores=64) == 1  # ~0.17 of a core of proxy work: one loop is enough
    big = [f"fleet.groups.{i}.count=1000" for i in range(3)]
    assert proxy_processes(headline(*big), cores=64) == 3  # ~1 core of proxy work: one process per site
    assert proxy_processes(headline(*big), cores=4) == 1  # the shards and replicas' work leaves no core for more
    one_site = big + ["fleet.groups.1.site=eu", "fleet.groups.2.site=eu", "sites={eu: {profile: wan_50ms}}"]
    assert proxy_processes(headline(*one_site), cores=64) == 1  # never more processes than sites
