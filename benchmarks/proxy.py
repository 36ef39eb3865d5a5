"""What the fault proxy costs when no toxic is set: small TCP round trips direct vs through it.

    python -m benchmarks.proxy [--round-trips 2000] [--size 64]

Starts the proxy server as its own process and a TCP echo server; interleaves direct and proxied
round trips (so machine noise hits both alike); prints p50/p99 of each and the added p50 (target:
under 0.2 ms); writes reports/bench/chaos_overhead.json. Also times the proxy server's start-up.

Then what the proxy spends on a fleet's traffic: `--connections` clients (100: a headline shard's robots)
each send an observation-sized message (1.5 KB) and read a chunk-sized answer (400 B) back through
a 25 ms latency toxic each way (the headline's wan_50ms), all at once, on each event loop the proxy
offers (asyncio's own, uvloop) in the same run: the proxy process's CPU per round trip (psutil).
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


def _echo_server(reply: int | None = None) -> tuple[socket.socket, int]:
    """Echoes each read back, or (with `reply`) answers every read of up to 64 KB with `reply` bytes."""
    srv = socket.create_server(("127.0.0.1", 0), backlog=1024)
    answer = b"r" * reply if reply is not None else None

    def serve(c):
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with c:
            while data := c.recv(65536):
                c.sendall(data if answer is None else answer)

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


def measure_cpu(loop: str, connections: int, round_trips: int, request: int = 1500, reply: int = 400) -> dict:
    """The proxy process's CPU per round trip on `loop`: `connections` clients at once, each `round_trips`
    request/reply exchanges through a 25 ms latency toxic each way."""
    import psutil

    from chaos.client import ChaosClient
    from chaos.launch import start_proxy_server

    srv, port = _echo_server(reply)
    with tempfile.TemporaryDirectory() as tmp:
        proxy = start_proxy_server(Path(tmp) / "proxy.log", loop=loop)
        try:
            api = ChaosClient(proxy.api_url)
            listen = api.create_proxy("fleet", upstream=f"127.0.0.1:{port}")["listen"]
            for stream in ("upstream", "downstream"):
                api.add_toxic("fleet", "latency", {"latency": 25}, name=f"lat_{stream}", stream=stream)
            lport = int(listen.rsplit(":", 1)[1])
            socks = [_conn(lport) for _ in range(connections)]
            payload = b"o" * request
            start = threading.Barrier(connections + 1)

            def client(s):
                start.wait()
                for _ in range(round_trips):
                    s.sendall(payload)
                    got = 0
                    while got < reply:
                        got += len(s.recv(65536))

            threads = [threading.Thread(target=client, args=(s,), daemon=True) for s in socks]
            for t in threads:
                t.start()
            p = psutil.Process(proxy.pid)
            c0, t0 = p.cpu_times(), time.monotonic()
            start.wait()
            for t in threads:
                t.join()
            c1, wall = p.cpu_times(), time.monotonic() - t0
            for s in socks:
                s.close()
        finally:
            proxy.stop()
    srv.close()
    cpu = (c1.user - c0.user) + (c1.system - c0.system)
    n = connections * round_trips
    return {
        "loop": loop,
        "connections": connections,
        "round_trips": n,
        "cpu_s": cpu,
        "wall_s": wall,
        "cpu_us_per_round_trip": cpu / n * 1e6,
        "cores": cpu / wall,
    }


def run(quick: bool) -> Result:
    r = measure(300 if quick else 3000, 64)
    n = 10 if quick else 40
    cpu = {loop: measure_cpu(loop, 100, n) for loop in ("asyncio", "uvloop")}
    r["cpu"] = cpu
    res = Result(details=r)
    res.add("added latency p50, 64-byte round trip", r["added_ms_p50"], "ms", target=0.2)
    res.add("direct round trip p50", r["direct_ms_p50"], "ms")
    res.add("proxied round trip p99", r["proxied_ms_p99"], "ms")
    res.add("proxy start-up", r["startup_s"], "s")
    for loop, c in cpu.items():
        res.add(f"proxy CPU per round trip, 100 connections, {loop}", c["cpu_us_per_round_trip"], "us")
    res.add(
        "proxy CPU per round trip, uvloop / asyncio",
        cpu["uvloop"]["cpu_us_per_round_trip"] / cpu["asyncio"]["cpu_us_per_round_trip"],
        "x",
    )
    return res


def main(argv=None) -> int:
    ap = cli(__doc__, prog="python -m benchmarks.proxy")
    ap.add_argument("--round-trips", type=int, default=2000)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--connections", type=int, default=100)
    ap.add_argument("--fleet-round-trips", type=int, default=40, help="round trips per connection in the CPU part")
    args = parse_with_out(ap, argv, "reports/bench/chaos_overhead.json")
    res = measure(args.round_trips, args.size)
    startup_s = res["startup_s"]
    print(
        f"proxy start-up {startup_s * 1e3:.0f} ms; {args.size}-byte round trips: direct p50 {res['direct_ms_p50']:.3f} ms "
        f"p99 {res['direct_ms_p99']:.3f} ms; through the proxy p50 {res['proxied_ms_p50']:.3f} ms p99 "
        f"{res['proxied_ms_p99']:.3f} ms; added p50 {res['added_ms_p50']:.3f} ms (target < 0.2 ms)"
    )
    res["cpu"] = {loop: measure_cpu(loop, args.connections, args.fleet_round_trips) for loop in ("asyncio", "uvloop")}
    for loop, c in res["cpu"].items():
        print(
            f"{loop}: {c['connections']} connections x {args.fleet_round_trips} round trips through 25 ms each way: "
            f"proxy CPU {c['cpu_us_per_round_trip']:.0f} us a round trip ({c['cores']:.2f} cores)"
        )
    a, u = (res["cpu"][k]["cpu_us_per_round_trip"] for k in ("asyncio", "uvloop"))
    print(f"uvloop / asyncio: {u / a:.2f}x")
    write_report(args.out, res, indent=1, end="", say=None)
    return 0 if res["added_ms_p50"] < 0.2 else 1


if __name__ == "__main__":
    sys.exit(main())
