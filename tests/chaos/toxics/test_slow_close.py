"""slow_close: data untouched, the close reaches the other side `delay` ms late."""

import socket
import threading
import time

from tests.chaos.harness import connect


def test_close_is_delayed_but_data_is_not(api):
    srv = socket.create_server(("127.0.0.1", 0))

    def serve():
        c, _ = srv.accept()
        c.sendall(b"bye")
        c.close()

    threading.Thread(target=serve, daemon=True).start()
    listen = api.create_proxy("p", upstream=f"127.0.0.1:{srv.getsockname()[1]}")["listen"]
    api.add_toxic("p", "slow_close", {"delay": 400}, stream="downstream")
    s = connect(listen)
    t0 = time.perf_counter()
    s.settimeout(3)
    assert s.recv(10) == b"bye"
    data_at = time.perf_counter() - t0
    assert s.recv(10) == b""
    closed_at = time.perf_counter() - t0
    assert data_at < 0.2 and closed_at >= 0.38, (data_at, closed_at)
    s.close()
    srv.close()
