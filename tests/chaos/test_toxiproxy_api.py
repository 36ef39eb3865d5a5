"""Toxiproxy's HTTP API, driven through the real `toxiproxy-python` client (via ChaosClient) and raw HTTP:
routes, JSON shapes, status codes, populate, reset, enable/disable, live reconfiguration."""

from __future__ import annotations

import socket
import time

import pytest
import requests

from chaos.client import ChaosError
from tests.chaos.harness import Echo, api, connect, echo, proxy_server, proxy_to, recv_exactly, round_trip  # noqa: F401


def test_version_and_an_empty_server(api):
    assert api.version()
    assert api.list_proxies() == {}


def test_create_reports_the_real_port_and_the_full_shape(api, echo):
    p = api.create_proxy("db", upstream=f"127.0.0.1:{echo.port}")
    assert set(p) >= {"name", "listen", "upstream", "enabled", "toxics"}
    assert p["enabled"] is True and p["toxics"] == [] and not p["listen"].endswith(":0")
    s = connect(p["listen"])
    assert round_trip(s) < 1.0
    s.close()


def test_status_codes_match_toxiproxy(api, echo, proxy_server):
    url = proxy_server.api_url
    proxy_to(api, echo, "dup")
    r = requests.post(f"{url}/proxies", json={"name": "dup", "listen": "127.0.0.1:0", "upstream": "127.0.0.1:1"})
    assert r.status_code == 409 and "error" in r.json()
    assert requests.get(f"{url}/proxies/nope").status_code == 404
    assert requests.delete(f"{url}/proxies/nope").status_code == 404
    r = requests.post(f"{url}/proxies", json={"listen": "127.0.0.1:0", "upstream": "127.0.0.1:1"})
    assert r.status_code == 400 and "name" in r.json()["error"]
    r = requests.post(f"{url}/proxies/dup/toxics", json={"type": "nonsense"})
    assert r.status_code == 400
    r = requests.post(f"{url}/proxies/dup/toxics", json={"type": "latency", "stream": "sideways"})
    assert r.status_code == 400 and "stream" in r.json()["error"]
    ok = requests.post(f"{url}/proxies/dup/toxics", json={"type": "latency", "attributes": {"latency": 5}})
    assert ok.status_code == 200 and ok.json()["name"] == "latency_downstream"
    assert requests.post(f"{url}/proxies/dup/toxics", json={"type": "latency"}).status_code == 409
    assert requests.get(f"{url}/proxies/dup/toxics/none").status_code == 404
    assert requests.delete(f"{url}/proxies/dup/toxics/latency_downstream").status_code == 204
    assert requests.delete(f"{url}/proxies/dup").status_code == 204


def test_toxic_shape_includes_all_attributes(api, echo):
    proxy_to(api, echo)
    t = api.add_toxic("p", "latency", {"latency": 10})
    assert t == {"name": "latency_downstream", "type": "latency", "stream": "downstream", "toxicity": 1.0,
                 "attributes": {"latency": 10, "jitter": 0}}


def test_disable_is_a_partition_and_enable_heals_it(api, echo):
    listen = proxy_to(api, echo)
    s = connect(listen)
    round_trip(s)
    api.set_enabled("p", False)
    with pytest.raises((ConnectionError, OSError)):
        s.settimeout(2)
        s.sendall(b"x")
        recv_exactly(s, 1)
    with pytest.raises(OSError):
        connect(listen, timeout=1)
    api.set_enabled("p", True)
    s2 = connect(listen)
    assert round_trip(s2) < 1.0
    s2.close()


def test_a_toxic_added_later_applies_to_an_open_connection_and_removal_lifts_it(api, echo):
    listen = proxy_to(api, echo)
    s = connect(listen)
    base = min(round_trip(s) for _ in range(5))
    api.add_toxic("p", "latency", {"latency": 100}, stream="upstream")
    slow = round_trip(s)
    api.update_toxic("p", "latency_upstream", {"latency": 200})
    slower = round_trip(s)
    api.remove_toxic("p", "latency_upstream")
    fast = min(round_trip(s) for _ in range(3))
    assert slow >= 0.095 and slower >= 0.195 and fast < base + 0.05
    s.close()


def test_populate_creates_keeps_and_replaces(api, echo):
    up = f"127.0.0.1:{echo.port}"
    created = api.populate([{"name": "a", "listen": "127.0.0.1:0", "upstream": up},
                            {"name": "b", "listen": "127.0.0.1:0", "upstream": up}])
    assert {p["name"] for p in created} == {"a", "b"}
    assert set(api.list_proxies()) == {"a", "b"}
    with pytest.raises(ChaosError, match="400"):
        api.populate([{"name": "", "listen": "127.0.0.1:0", "upstream": up}])
    # The same listen + upstream again: left alone (a live connection through it survives).
    a = api.get_proxy("a")
    s = connect(a["listen"])
    again = {p["name"]: p for p in api.populate([{"name": "a", "listen": a["listen"], "upstream": up}])}
    assert again["a"]["listen"] == a["listen"]
    s.sendall(b"kept")
    assert recv_exactly(s, 4) == b"kept"
    # Another upstream: replaced (the proxy now forwards elsewhere; its old connections are closed).
    other = Echo()
    try:
        replaced = {p["name"]: p for p in api.populate([{"name": "a", "listen": a["listen"],
                                                         "upstream": f"127.0.0.1:{other.port}"}])}
        assert replaced["a"]["upstream"] == f"127.0.0.1:{other.port}"
        assert api.get_proxy("a")["upstream"] == f"127.0.0.1:{other.port}"
        s2 = connect(replaced["a"]["listen"])
        s2.sendall(b"moved")
        assert recv_exactly(s2, 5) == b"moved"
        s2.close()
    finally:
        other.close()
        s.close()


def test_reset_removes_toxics_and_reenables_but_deletes_nothing(api, echo):
    proxy_to(api, echo)
    api.add_toxic("p", "latency", {"latency": 50})
    api.set_enabled("p", False)
    api.reset()
    p = api.get_proxy("p")
    assert p["enabled"] is True and p["toxics"] == []


def test_browser_user_agents_are_refused(proxy_server):
    r = requests.get(f"{proxy_server.api_url}/proxies", headers={"User-Agent": "Mozilla/5.0"})
    assert r.status_code == 403


def test_many_proxies_and_connections(api, echo):
    """Hundreds of proxies and connections on one process: create 200, hold a connection through each,
    push a round trip through all 200 at once."""
    listens = [proxy_to(api, echo, f"p{i}") for i in range(200)]
    socks = [connect(listen) for listen in listens]
    for s in socks:
        s.sendall(b"ping")
    assert all(recv_exactly(s, 4) == b"ping" for s in socks)
    for s in socks:
        s.close()
    assert len(api.list_proxies()) == 200
