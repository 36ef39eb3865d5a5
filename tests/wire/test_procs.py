"""wire.procs.start_router and chaos.launch.start_proxy_server: a port picked for the child and taken by another
process before the child binds it costs a retry on a new port, not a failed start; a port the caller gave is not
swapped behind its back. wire.procs.raise_fd_limit: a process holding a socket per robot lifts its soft limit."""

from __future__ import annotations

import resource
import socket
import time

import pytest

import wire.procs as procs


@pytest.fixture
def taken_port():
    """A port another process holds (here: a listening socket of this one)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_picked_port_taken_before_the_router_binds_it_is_picked_again(tmp_path, taken_port, monkeypatch):
    picks = iter([taken_port])  # the first pick loses the race; the next is a real free one
    real_free_port = procs.free_port
    monkeypatch.setattr(procs, "free_port", lambda: next(picks, None) or real_free_port())
    child, endpoint = procs.start_router(None, tmp_path / "router.log")
    try:
        assert child.alive() and endpoint != f"tcp/127.0.0.1:{taken_port}"
        assert "Address already in use" in (tmp_path / "router.log").read_text()  # the first try did lose
    finally:
        child.stop()


def test_a_port_the_caller_gave_is_not_swapped_when_taken(tmp_path, taken_port):
    with pytest.raises(RuntimeError, match="Address already in use"):
        procs.start_router(taken_port, tmp_path / "router.log")


def test_the_chaos_proxy_api_port_taken_before_it_binds_is_picked_again(tmp_path, taken_port, monkeypatch):
    """The replay test's proxy lost this race once in CI ("[Errno 98] address already in use", lower case)."""
    from chaos.client import ChaosClient
    from chaos.launch import start_proxy_server

    monkeypatch.setenv("CHAOS_PROXY", "python")
    picks = iter([taken_port])
    real_free_port = procs.free_port
    monkeypatch.setattr(procs, "free_port", lambda: next(picks, None) or real_free_port())
    server = start_proxy_server(tmp_path / "proxy.log")
    try:
        assert server.port != taken_port and server.child.alive()
        assert "address already in use" in (tmp_path / "proxy.log").read_text().lower()
        assert ChaosClient(server.api_url).version()  # the API answers on the port it reports
    finally:
        server.stop()


def test_raise_fd_limit_lifts_the_soft_limit_to_the_hard_one():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip(f"this host's hard limit of open files is {hard}: nothing to lift")
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        got = procs.raise_fd_limit()
        assert got > 256 and resource.getrlimit(resource.RLIMIT_NOFILE)[0] == got
        assert hard == resource.RLIM_INFINITY or got == hard
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_router_refuses_the_session_beyond_its_max_sessions_and_names_the_limit(tmp_path):
    """Zenoh's own default (1000) refused 8 of 1,000 robots on the 16-core machine: the flag must reach Zenoh."""
    from wire.transport import open_session

    child, endpoint = procs.start_router(None, tmp_path / "router.log", extra_args=["--max-sessions", "2"])
    sessions = []
    try:
        assert "(max sessions 2)" in (tmp_path / "router.log").read_text()
        sessions += [open_session(connect=[endpoint]) for _ in range(2)]
        with pytest.raises(ConnectionError, match="--max-sessions"):
            sessions.append(open_session(connect=[endpoint]))
        sessions.pop(0).close()  # a place freed is a place taken, once the router has seen the close
        deadline = time.monotonic() + 10.0
        while True:  # the router drops the closed session on its own threads: no event reaches this process
            try:
                sessions.append(open_session(connect=[endpoint]))
                break
            except ConnectionError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)
    finally:
        for s in sessions:
            s.close()
        child.stop()


def test_a_listeners_port_is_picked_below_the_range_outbound_connections_take_their_local_ports_from():
    """A replica's health port or a router's, kept across a restart, must not be the local end of a connection
    some robot opened while it was down: picked below the kernel's ephemeral range, which outbound connections'
    local ports come from (checked here on 64 of them)."""
    lo, hi = procs.ephemeral_range()
    picked = {procs.free_port() for _ in range(20)}
    assert all(procs.LISTEN_PORT_FLOOR <= p < lo for p in picked)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", procs.free_port()))
        listener.listen(128)
        clients = [socket.create_connection(listener.getsockname()) for _ in range(64)]
        try:
            local = {c.getsockname()[1] for c in clients}
        finally:
            for c in clients:
                c.close()
    assert all(lo <= p <= hi for p in local) and not local & picked


def test_without_room_below_the_ephemeral_range_the_kernel_picks(monkeypatch):
    real_lo, real_hi = procs.ephemeral_range()
    monkeypatch.setattr(procs, "ephemeral_range", lambda: (procs.LISTEN_PORT_FLOOR + 10, 60999))
    port = procs.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free
    assert real_lo <= port <= real_hi  # the kernel's pick, not one from a 10-port gap


def test_a_router_sheds_a_links_observations_beyond_its_rate_and_leaves_other_links_and_keys_alone(tmp_path):
    """A robot flooding its observation key loses what comes sooner than 1/HZ after its last at the router; another
    robot's link keeps every observation, and the flooder's other puts pass (the cap is `<root>/**/obs`, per link;
    the root `@fleet` is a verbatim chunk, which a bare `**/obs` would never match)."""
    import queue
    import subprocess
    import sys
    from collections import Counter

    from wire.transport import open_session

    child, endpoint = procs.start_router(None, tmp_path / "router.log", extra_args=["--max-observation-rate-hz", "20"])
    sessions = []
    try:
        assert "(max 20 observations/s a link)" in (tmp_path / "router.log").read_text()
        monitor, flooder, honest = (open_session(connect=[endpoint]) for _ in range(3))
        sessions += [monitor, flooder, honest]
        got: Counter = Counter()
        arrived: queue.Queue = queue.Queue()

        def seen(sample) -> None:
            key = str(sample.key_expr)
            got[key] += 1
            if not key.endswith("/obs"):
                arrived.put(key)

        subscriber = monitor.declare_subscriber("@fleet/t/**", seen)
        for s in (flooder, honest):  # each link's route to the subscriber is up once one of its puts arrives
            while True:
                s.put("@fleet/t/hello", b"")
                try:
                    arrived.get(timeout=0.2)
                    break
                except queue.Empty:
                    continue
        t0 = time.monotonic()
        for i in range(2000):  # far above 20 a second
            flooder.put("@fleet/t/flood/obs", b"x")
            if i % 200 == 0:
                honest.put("@fleet/t/honest/obs", b"y")  # ten, 60 ms or more apart: each under the cap's 50 ms
                time.sleep(0.06)
        for s, name in ((flooder, "flood"), (honest, "honest")):
            s.put(
                f"@fleet/t/{name}/done", b""
            )  # a link's puts arrive in order: after this, all of its earlier ones have
        seen_done = set()
        while len(seen_done) < 2:
            key = arrived.get(timeout=10)
            if key.endswith("/done"):
                seen_done.add(key)
        elapsed = time.monotonic() - t0
        assert got["@fleet/t/honest/obs"] == 10, got
        assert 1 <= got["@fleet/t/flood/obs"] <= 20 * elapsed + 2 < 2000, (got, elapsed)
        subscriber.undeclare()
    finally:
        for s in sessions:
            s.close()
        child.stop()
    bad = subprocess.run(
        [sys.executable, "-m", "wire.transport", "--listen", "tcp/127.0.0.1:0", "--max-observation-rate-hz", "0.5"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 2 and "--max-observation-rate-hz 0.5 must be 0 (no cap) or from 1 to 1e6" in bad.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "wire.transport", "--listen", "tcp/127.0.0.1:0", "--observation-root", "fleet"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 2 and "--observation-root" in bad.stderr and "'@'" in bad.stderr, bad.stderr


def test_a_child_notes_when_it_exited_not_when_someone_looked(tmp_path):
    """The bench's runner polls its children every 0.5 s, so an unplanned exit's window started up to 0.5 s after
    the exit. A watcher thread notes the exit as it happens."""
    import sys

    started = time.monotonic()
    child = procs.ChildProcess([sys.executable, "-c", "import time; time.sleep(0.3)"], tmp_path / "c.log").start()
    assert child.exited_mono is None or child.exited_mono >= started + 0.3
    child.proc.wait()
    child._exit_watch.join(timeout=10)
    assert started + 0.3 <= child.exited_mono <= time.monotonic() and child.proc.returncode == 0
    child.start()  # started again: a fresh exit time, the last one's forgotten
    assert child.exited_mono is None
    child.stop()
    child._exit_watch.join(timeout=10)
    assert child.exited_mono is not None and child.proc.returncode != 0  # stop() still reaps and reads the code
