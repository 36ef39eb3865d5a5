"""timeout: data is dropped; the connection closes `timeout` ms after the last chunk (0 = never)."""

import socket
import time

from tests.chaos.harness import connect, proxy_to


def test_timeout_drops_data_then_closes(api, echo):
    s = connect(proxy_to(api, echo))
    api.add_toxic("p", "timeout", {"timeout": 300}, stream="upstream")
    t0 = time.perf_counter()
    s.sendall(b"hello")
    s.settimeout(3)
    assert s.recv(10) == b""  # closed, nothing delivered
    took = time.perf_counter() - t0
    assert 0.25 <= took <= 1.0, took
    s.close()


def test_timeout_zero_holds_the_connection_open_forever(api, echo):
    s = connect(proxy_to(api, echo))
    api.add_toxic("p", "timeout", {"timeout": 0}, stream="upstream")
    s.sendall(b"hello")
    s.settimeout(0.5)
    try:
        got = s.recv(10)
    except TimeoutError:
        got = None
    assert got is None, "no data and no close"
    s.close()
