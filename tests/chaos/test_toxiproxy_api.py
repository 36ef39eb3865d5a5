"""Toxiproxy's HTTP API, driven through the real `toxiproxy-python` client (via ChaosClient) and raw HTTP:
routes, JSON shapes, status codes, populate, reset, enable/disable, live reconfiguration."""

from __future__ import annotations

import json
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
    assert t == {
        "name": "latency_downstream",
        "type": "latency",
        "stream": "downstream",
        "toxicity": 1.0,
        "attributes": {"latency": 10, "jitter": 0},
    }


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
    created = api.populate(
        [{"name": "a", "listen": "127.0.0.1:0", "upstream": up}, {"name": "b", "listen": "127.0.0.1:0", "upstream": up}]
    )
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
        replaced = {
            p["name"]: p
            for p in api.populate([{"name": "a", "listen": a["listen"], "upstream": f"127.0.0.1:{other.port}"}])
        }
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


# --- bad input: what Toxiproxy (Go's encoding/json and net) answers, ours answers too -----------------------


def _send(method: str, url: str, body: str) -> requests.Response:
    return requests.request(method, url, data=body.encode(), headers={"Content-Type": "application/json"})


def _all_json(url: str) -> None:
    """Every GET that shows toxics parses as strict JSON (NaN and Infinity are not JSON)."""

    def strict(text):
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c} in {text[:200]}"))

    for path in ("/proxies", "/proxies/p", "/proxies/p/toxics"):
        strict(requests.get(url + path).text)


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999", "-1e999"])
def test_a_non_finite_number_is_a_bad_request_body_and_never_reaches_a_response(api, echo, proxy_server, number):
    url = proxy_server.api_url
    proxy_to(api, echo)
    r = _send("POST", f"{url}/proxies/p/toxics", f'{{"type": "latency", "toxicity": {number}}}')
    assert r.status_code == 400 and r.json()["error"].startswith("bad request body: ")
    assert _send("POST", f"{url}/proxies/p/toxics", '{"type": "latency"}').status_code == 200
    r = _send("PATCH", f"{url}/proxies/p/toxics/latency_downstream", f'{{"toxicity": {number}}}')
    assert r.status_code == 400 and r.json()["error"].startswith("bad request body: ")
    r = _send("POST", f"{url}/proxies/p/toxics", f'{{"type": "loss", "attributes": {{"probability": {number}}}}}')
    assert r.status_code == 400
    if not number[-1].isdigit():  # not JSON wherever it stands (Go skips a 1e999 in a key it does not know)
        r = _send("POST", f"{url}/proxies", f'{{"name": "q", "upstream": "127.0.0.1:1", "extra": [{number}]}}')
        assert r.status_code == 400
    _all_json(url)
    assert api.get_proxy("p")["toxics"][0]["toxicity"] == 1.0


def test_an_integer_attribute_beyond_int64_is_a_bad_request_and_int64_itself_is_accepted(api, echo, proxy_server):
    url = proxy_server.api_url
    listen = proxy_to(api, echo)
    for big in (str(10**35), "9" * 401, str(2**63), str(-(2**63) - 1)):
        r = _send("POST", f"{url}/proxies/p/toxics", f'{{"type": "latency", "attributes": {{"latency": {big}}}}}')
        assert r.status_code == 400, big[:30]
        assert r.json()["error"] == (
            f"bad request body: json: cannot unmarshal number {big} into Go struct field "
            "LatencyToxic.attributes.latency of type int64"
        )
    assert api.get_proxy("p")["toxics"] == []
    ok = _send("POST", f"{url}/proxies/p/toxics", f'{{"type": "latency", "attributes": {{"latency": {2**63 - 1}}}}}')
    assert ok.status_code == 200 and ok.json()["attributes"]["latency"] == 2**63 - 1
    r = _send("PATCH", f"{url}/proxies/p/toxics/latency_downstream", f'{{"attributes": {{"jitter": {2**63}}}}}')
    assert r.status_code == 400 and "of type int64" in r.json()["error"]
    # the toxic accepted holds a connection's data (int64 ms: for ever) and removing it delivers the data
    s = connect(listen)
    s.sendall(b"held")
    api.remove_toxic("p", "latency_downstream")
    assert recv_exactly(s, 4) == b"held"
    s.close()


def test_numbers_too_long_and_nesting_too_deep_are_bad_requests(api, echo, proxy_server):
    url = proxy_server.api_url
    proxy_to(api, echo)
    digits = "7" * 5000
    r = _send("POST", f"{url}/proxies", f'{{"name": {digits}, "upstream": "127.0.0.1:1"}}')
    assert r.status_code == 400 and r.json()["error"].startswith("bad request body: ")
    r = _send("POST", f"{url}/proxies/p/toxics", f'{{"type": "latency", "attributes": {{"latency": {digits}}}}}')
    assert r.status_code == 400 and r.json()["error"].endswith("of type int64")
    deep = "[" * 100_000
    for path in ("/proxies", "/proxies/p/toxics", "/populate"):
        r = _send("POST", url + path, deep)
        assert r.status_code == 400 and r.json()["error"].startswith("bad request body: "), path
    r = _send("POST", f"{url}/populate", f'[{{"name": {digits}, "upstream": "127.0.0.1:1"}}]')
    assert r.status_code == 400 and set(r.json()) == {"error", "status", "proxies"} and r.json()["proxies"] is None
    assert set(api.list_proxies()) == {"p"}


def test_null_stream_and_toxicity_on_create_mean_their_defaults(api, echo, proxy_server):
    proxy_to(api, echo)
    r = _send(
        "POST",
        f"{proxy_server.api_url}/proxies/p/toxics",
        '{"name": null, "type": "latency", "stream": null, "toxicity": null, "attributes": {"latency": null}}',
    )
    assert r.status_code == 200
    assert r.json() == {
        "name": "latency_downstream",
        "type": "latency",
        "stream": "downstream",
        "toxicity": 1.0,
        "attributes": {"latency": 0, "jitter": 0},
    }


def test_listen_errors_read_like_go(api, echo, proxy_server):
    url = proxy_server.api_url
    listen = proxy_to(api, echo)
    r = requests.post(f"{url}/proxies", json={"name": "q", "listen": listen, "upstream": f"127.0.0.1:{echo.port}"})
    assert r.status_code == 500 and r.json()["error"] == f"listen tcp {listen}: bind: address already in use"
    r = requests.patch(f"{url}/proxies/p", json={"listen": "bad"})
    assert r.status_code == 500 and r.json()["error"] == "listen tcp: address bad: missing port in address"
