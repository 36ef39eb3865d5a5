"""server.health: real HTTP on 127.0.0.1 — liveness, readiness flips, the /metrics scrape, 404, silence, slow clients."""

from __future__ import annotations

import http.client
import json
import select
import socket
import time
import urllib.error
import urllib.request

import pytest

from server.health import HealthBindError, HealthServer
from server.metrics import Metrics

# Bypass any HTTP(S)_PROXY of the environment: these requests must go straight to 127.0.0.1.
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def get(server: HealthServer, path: str) -> tuple[int, str, bytes]:
    try:
        with _opener.open(f"http://127.0.0.1:{server.port}{path}", timeout=5) as r:
            return r.status, r.headers["Content-Type"], r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read()


@pytest.fixture
def metrics():
    return Metrics()


def test_port_zero_picks_a_free_port_and_stop_releases_it(metrics):
    server = HealthServer(0, metrics, ready_fn=lambda: True).start()
    try:
        assert server.port > 0
        assert get(server, "/healthz")[0] == 200
    finally:
        server.stop()
    server.stop()  # idempotent
    with pytest.raises(OSError):
        _opener.open(f"http://127.0.0.1:{server.port}/healthz", timeout=2)


def test_readyz_flips_from_503_to_200_with_a_json_reason(metrics):
    state = {"ready": False}
    with HealthServer(0, metrics, ready_fn=lambda: state["ready"]) as server:
        status, ctype, body = get(server, "/readyz")
        assert (status, ctype) == (503, "application/json")
        assert json.loads(body) == {"ready": False, "reason": "not ready"}
        state["ready"] = True
        status, _, body = get(server, "/readyz")
        assert status == 200 and json.loads(body) == {"ready": True, "reason": "ready"}


def test_readyz_carries_the_reason_ready_fn_gives_and_503s_when_it_raises(metrics):
    answers = iter([(False, "warming up: 2/5 inferences"), RuntimeError("registry gone")])

    def ready_fn():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    with HealthServer(0, metrics, ready_fn=ready_fn) as server:
        assert json.loads(get(server, "/readyz")[2])["reason"] == "warming up: 2/5 inferences"
        status, _, body = get(server, "/readyz")
        assert status == 503 and "RuntimeError: registry gone" in json.loads(body)["reason"]


def test_healthz_follows_live_fn(metrics):
    state = {"live": True}
    with HealthServer(0, metrics, ready_fn=lambda: False, live_fn=lambda: state["live"]) as server:
        assert get(server, "/healthz")[::2] == (200, b"ok\n")
        state["live"] = False
        assert get(server, "/healthz")[0] == 503


def test_metrics_serves_the_prometheus_text_of_the_registry(metrics):
    metrics.inc("requests", model="pi0")
    with HealthServer(0, metrics, ready_fn=lambda: True) as server:
        status, ctype, body = get(server, "/metrics")
        assert status == 200
        assert ctype.startswith("text/plain; version=0.0.4")
        assert 'policy_server_requests_total{model="pi0"} 1.0\n' in body.decode()
        assert "process_resident_memory_bytes" in body.decode()


def test_metrics_answers_openmetrics_to_a_scraper_that_asks_for_it(metrics):
    import urllib.request

    metrics.inc("requests", model="pi0")
    with HealthServer(0, metrics, ready_fn=lambda: True) as server:
        req = urllib.request.Request(
            f"http://127.0.0.1:{server.port}/metrics?name[]=policy_server_requests_total",
            headers={"Accept": "application/openmetrics-text; version=1.0.0"},
        )
        with urllib.request.urlopen(req, timeout=2) as r:
            body, ctype = r.read().decode(), r.headers["Content-Type"]
    assert ctype.startswith("application/openmetrics-text")
    assert 'policy_server_requests_total{model="pi0"} 1.0\n' in body and body.endswith("# EOF\n")
    assert "process_" not in body  # restricted to the family asked for


def test_sessions_serves_the_status_function_and_filters_by_client(metrics):
    seen = []

    def sessions_fn(client):
        seen.append(client)
        return {"models": {"pi0": {"sessions": [{"client_uuid": client}]}}}

    with HealthServer(0, metrics, ready_fn=lambda: True, sessions_fn=sessions_fn) as server:
        status, ctype, body = get(server, "/sessions?client=robot-7")
        assert status == 200 and ctype == "application/json"
        assert json.loads(body)["models"]["pi0"]["sessions"] == [{"client_uuid": "robot-7"}]
        assert get(server, "/sessions")[0] == 200 and seen == ["robot-7", None]
    with HealthServer(0, metrics, ready_fn=lambda: True) as server:
        assert get(server, "/sessions")[0] == 404


def test_unknown_paths_are_404_and_query_strings_are_ignored(metrics):
    with HealthServer(0, metrics, ready_fn=lambda: True) as server:
        assert get(server, "/nope")[0] == 404
        assert get(server, "/")[0] == 404
        assert get(server, "/healthz?verbose=1")[0] == 200


def test_requests_are_never_logged_to_stderr(metrics, capfd):
    with HealthServer(0, metrics, ready_fn=lambda: False) as server:
        for path in ("/healthz", "/readyz", "/metrics", "/nope"):
            get(server, path)
    out, err = capfd.readouterr()
    assert err == "" and out == ""


def _half_request(server: HealthServer) -> socket.socket:
    """A client that sends a request line and one header, never the blank line that ends them, and waits."""
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    return s


def test_a_silent_connection_is_closed_after_the_timeout(metrics):
    with HealthServer(0, metrics, lambda: True, timeout_s=0.3) as hs:
        s = _half_request(hs)
        try:
            t0 = time.monotonic()
            assert s.recv(1024) == b"", "the server closes the connection, unanswered"
            assert time.monotonic() - t0 < 5
        finally:
            s.close()
        assert get(hs, "/healthz")[0] == 200, "a whole request is answered as before"


def test_connections_beyond_max_connections_are_closed_and_probes_return_when_they_go(metrics):
    with HealthServer(0, metrics, lambda: True, timeout_s=60, max_connections=4) as hs:
        held = [_half_request(hs) for _ in range(4)]
        extra = _half_request(hs)
        try:
            assert extra.recv(1024) == b"", "the fifth is closed at once, not held for the 60 s timeout"
        finally:
            extra.close()
            for s in held:
                s.close()
        deadline = time.monotonic() + 10
        while True:  # their threads see the close and free their slots; nothing outside can wait on that
            try:
                if get(hs, "/healthz")[0] == 200:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert time.monotonic() < deadline, "a probe is served again once the idle clients left"
            time.sleep(0.02)


def test_head_answers_the_probe_paths_without_a_body(metrics):
    with HealthServer(0, metrics, lambda: (False, "warming up")) as hs:
        conn = http.client.HTTPConnection("127.0.0.1", hs.port, timeout=5)
        try:
            for path, status in (("/healthz", 200), ("/readyz", 503), ("/metrics", 200)):
                conn.request("HEAD", path)
                r = conn.getresponse()
                assert (r.status, r.read()) == (status, b"") and int(r.headers["Content-Length"]) > 0
        finally:
            conn.close()


def test_a_taken_port_is_a_bind_error_naming_it(metrics):
    with HealthServer(0, metrics, lambda: True) as hs:
        with pytest.raises(HealthBindError, match=rf"cannot listen on 127\.0\.0\.1:{hs.port}: Address already in use"):
            HealthServer(hs.port, metrics, lambda: True).start()


def _drip_until_closed(s: socket.socket, max_bytes: int) -> bytes | None:
    """Send a header one byte at a time, a byte every 50 ms (far inside the read timeout), until the server
    answers or closes; returns what it sent back (b"" for a bare close), or None if it never did."""
    try:
        s.sendall(b"GET /healthz HTTP/1.1\r\nX-Drip: ")
        for _ in range(max_bytes):
            readable, _, _ = select.select([s], [], [], 0.05)  # the pacing, and the server's answer if it comes
            if readable:
                return s.recv(1024)
            s.sendall(b"a")
    except (BrokenPipeError, ConnectionResetError):
        return b""
    return None


def test_a_request_dripping_its_headers_is_answered_408_at_the_head_deadline_and_frees_its_slot(metrics):
    # A read timeout alone never fires for a client sending a byte just inside it; the deadline is total.
    with HealthServer(0, metrics, lambda: True, timeout_s=60, max_connections=1, head_deadline_s=0.3) as hs:
        s = socket.create_connection(("127.0.0.1", hs.port), timeout=10)
        try:
            answer = _drip_until_closed(s, max_bytes=200)  # 10 s of dripping: 30x the deadline
            assert answer is not None, "the dripping client still held its connection after 200 bytes"
            assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
            assert s.recv(1024) == b"", "and the connection is closed"
        finally:
            s.close()
        assert get(hs, "/healthz")[0] == 200, "its only slot is free again: the probe is served"


def test_a_connection_that_sends_nothing_is_closed_unanswered_at_the_head_deadline(metrics):
    with HealthServer(0, metrics, lambda: True, timeout_s=60, head_deadline_s=0.3) as hs:
        with socket.create_connection(("127.0.0.1", hs.port), timeout=10) as s:
            assert s.recv(1024) == b"", "closed well before the 60 s read timeout, with no response"
