"""reset_peer: after `timeout` ms the connection is reset (ECONNRESET at the client)."""

import time

import pytest

from tests.chaos.harness import connect, proxy_to


def test_the_client_sees_a_reset(api, echo):
    s = connect(proxy_to(api, echo))
    api.add_toxic("p", "reset_peer", {"timeout": 100}, stream="upstream")
    t0 = time.perf_counter()
    s.sendall(b"hello")
    s.settimeout(3)
    with pytest.raises(ConnectionResetError):
        while s.recv(10):
            pass
    assert time.perf_counter() - t0 >= 0.09
    s.close()
