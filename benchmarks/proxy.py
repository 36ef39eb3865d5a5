"""What the fault proxy costs when no toxic is set: small TCP round trips direct vs through it.

    python -m benchmarks.proxy [--round-trips 2000] [--size 64]

Starts the proxy server as its own process and a TCP echo server; interleaves direct and proxied
round trips (so machine noise hits both alike); prints p50/p99 of each and the added p50 (target:
under 0.2 ms); writes reports/bench/chaos_overhead.json. Also times the proxy server's start-up.
"""

from __future__ import annotations

import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.common import Result, cli, parse_with_out, write_report


def _echo_server() -> tuple[socket.socket, int]:
    srv = socket.create_server(("127.0.0.1", 0))

    def serve(c):
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with c:
            while data := c.recv(65536):
                c.sendall(data)

    def accept():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(c,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return srv, srv.getsockname()[1]


def _conn(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _rt(s: socket.socket, payload: bytes) -> float:
    t0 = time.perf_counter_ns()
    s.sendall(payload)
    got = 0
    while got < len(payload):
        got += len(s.recv(65536))
    return (time.perf_counter_ns() - t0) / 1e6


def measure(round_trips: int, size: int) -> dict:
    """Interleaved direct and proxied round trips of `size` bytes; the p50/p99 of each and the added p50."""
    from chaos.client import ChaosClient
    from chaos.launch import start_proxy_server

    srv, port = _echo_server()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        proxy = start_proxy_server(Path(tmp) / "proxy.log")
        startup_s = time.monotonic() - t0
        try:
            api = ChaosClient(proxy.api_url)
            listen = api.create_proxy("bench", upstream=f"127.0.0.1:{port}")["listen"]
            direct, proxied = _conn(port), _conn(int(listen.rsplit(":", 1)[1]))
            payload = b"x" * size
            for _ in range(100):  # warm both paths
                _rt(direct, payload), _rt(proxied, payload)
            d, p = [], []
            for _ in range(round_trips):
                d.append(_rt(direct, payload))
                p.append(_rt(proxied, payload))
            direct.close()
            proxied.close()
        finally:
            proxy.stop()
    srv.close()
    d, p = np.array(d), np.array(p)
    return {
        "round_trips": round_trips,
        "size_bytes": size,
        "startup_s": startup_s,
        "direct_ms_p50": float(np.median(d)),
        "direct_ms_p99": float(np.percentile(d, 99)),
        "proxied_ms_p50": float(np.median(p)),
        "proxied_ms_p99": float(np.percentile(p, 99)),
        "added_ms_p50": float(np.median(p) - np.median(d)),
        "real_toxiproxy": proxy.real_toxiproxy,
    }


def run(quick: bool) -> Result:
    r = measure(300 if quick else 3000, 64)
    res = Result(details=r)
    res.add("added latency p50, 64-byte round trip", r["added_ms_p50"], "ms", target=0.2)
    res.add("direct round trip p50", r["direct_ms_p50"], "ms")
    res.add("proxied round trip p99", r["proxied_ms_p99"], "ms")
    res.add("proxy start-up", r["startup_s"], "s")
    return res


def main(argv=None) -> int:
    ap = cli(__doc__, prog="python -m benchmarks.proxy")
    ap.add_argument("--round-trips", type=int, default=2000)
    ap.add_argument("--size", type=int, default=64)
    args = parse_with_out(ap, argv, "reports/bench/chaos_overhead.json")
    res = measure(args.round_trips, args.size)
    startup_s = res["startup_s"]
    print(
        f"proxy start-up {startup_s * 1e3:.0f} ms; {args.size}-byte round trips: direct p50 {res['direct_ms_p50']:.3f} ms "
        f"p99 {res['direct_ms_p99']:.3f} ms; through the proxy p50 {res['proxied_ms_p50']:.3f} ms p99 "
        f"{res['proxied_ms_p99']:.3f} ms; added p50 {res['added_ms_p50']:.3f} ms (target < 0.2 ms)"
    )
    write_report(args.out, res, indent=1, end="", say=None)
    return 0 if res["added_ms_p50"] < 0.2 else 1


if __name__ == "__main__":
    sys.exit(main())
