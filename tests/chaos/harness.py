"""Shared pieces of the proxy conformance suite: the proxy server as a process (ours, and the real
`toxiproxy-server` when it is on PATH), a TCP echo/sink upstream, and a timed TCP client."""

from __future__ import annotations

import contextlib
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

from chaos.client import ChaosClient
from chaos.launch import start_proxy_server


def server_params():
    params = [pytest.param("python", id="chaos.toxiproxy")]
    params.append(
        pytest.param(
            "toxiproxy",
            id="toxiproxy-server",
            marks=pytest.mark.skipif(
                shutil.which("toxiproxy-server") is None, reason="no toxiproxy-server binary on PATH"
            ),
        )
    )
    return params


@pytest.fixture(scope="session", params=server_params())
def proxy_server(request, tmp_path_factory):
    import os

    old = os.environ.get("CHAOS_PROXY")
    os.environ["CHAOS_PROXY"] = request.param
    try:
        srv = start_proxy_server(tmp_path_factory.mktemp("proxy") / "proxy.log")
    finally:
        if old is None:
            os.environ.pop("CHAOS_PROXY", None)
        else:
            os.environ["CHAOS_PROXY"] = old
    yield srv
    srv.stop()


@pytest.fixture
def api(proxy_server):
    client = ChaosClient(proxy_server.api_url)
    client.reset()
    for name in list(client.list_proxies()):
        client.delete_proxy(name)
    yield client
    for name in list(client.list_proxies()):
        client.delete_proxy(name)


class Echo:
    """A TCP echo server on 127.0.0.1 (one thread per connection)."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self._stop = False
        self.echoed = 0  # bytes sent back, over all connections
        self._echoed_cv = threading.Condition()
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    def _accept(self):
        while not self._stop:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)
            threading.Thread(target=self._echo, args=(c,), daemon=True).start()

    def _echo(self, c):
        try:
            while data := c.recv(65536):
                c.sendall(data)
                with self._echoed_cv:
                    self.echoed += len(data)
                    self._echoed_cv.notify_all()
        except OSError:
            pass
        finally:
            c.close()

    def wait_echoed(self, n: int, timeout_s: float = 5.0) -> None:
        """Until `n` bytes in all have been sent back (they are on their way to the peer)."""
        with self._echoed_cv:
            assert self._echoed_cv.wait_for(lambda: self.echoed >= n, timeout_s), f"echoed {self.echoed} of {n} bytes"

    def close(self):
        self._stop = True
        # close() alone does not wake a thread blocked in accept(): the thread, and the listening socket it holds
        # (the port stays in LISTEN), would outlive the test; shutdown() makes that accept() fail at once
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self._acceptor.join(5)
        assert not self._acceptor.is_alive(), "the echo server's accept thread did not end"
        for c in self.conns:
            try:
                c.close()
            except OSError:
                pass


@contextlib.contextmanager
def python_proxy_servers(tmp_path, monkeypatch, n: int):
    """`n` chaos.toxiproxy servers (ours, which report fidelity), each its own process, stopped after."""
    monkeypatch.setenv("CHAOS_PROXY", "python")
    servers = [start_proxy_server(tmp_path / f"p{i}.log") for i in range(n)]
    try:
        yield servers
    finally:
        for s in servers:
            s.stop()


@pytest.fixture
def echo():
    e = Echo()
    yield e
    e.close()


def connect(listen: str, timeout: float = 5.0) -> socket.socket:
    host, port = listen.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def unread_bytes_from(port: int) -> int | None:
    """Bytes waiting in the receive queue of the IPv4 TCP socket connected to 127.0.0.1:`port` (another process's
    socket: the kernel's table, /proc/net/tcp); None when there is no such connected socket."""
    for row in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = row.split()
        if f[3] == "01" and int(f[2].split(":")[1], 16) == port:  # ESTABLISHED, remote port
            return int(f[4].split(":")[1], 16)  # tx_queue:rx_queue
    return None


def recv_exactly(s: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError(f"closed after {len(out)} of {n} bytes")
        out += chunk
    return bytes(out)


def round_trip(s: socket.socket, payload: bytes = b"x" * 64) -> float:
    t0 = time.perf_counter()
    s.sendall(payload)
    assert recv_exactly(s, len(payload)) == payload
    return time.perf_counter() - t0


def proxy_to(api: ChaosClient, echo: Echo, name: str = "p") -> str:
    return api.create_proxy(name, upstream=f"127.0.0.1:{echo.port}")["listen"]
