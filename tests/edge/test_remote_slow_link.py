"""The remote engine on a link slower than its control timeouts: a real router, the real policy server, and the
chaos proxy (`chaos.toxiproxy`, `latency` toxic on both directions) between the robot and the router.

    robot engine ──► chaos proxy (+1.5 s each way) ──► router ◄── policy server (direct)

With a round trip of ~3 s, over the 2 s base of the status and session timeouts (wire.qos.CONTROL_TIMEOUTS_S),
every handshake round with fixed timeouts fails alike until max_offline_s (docs/bench.md, "1,000 robots on this
host"); the adaptive timeouts (edge.client.ControlTimeouts) double after a round nobody answered and get through.
"""

from __future__ import annotations

import re
import time

import pytest

from chaos.client import ChaosClient
from chaos.launch import start_proxy_server
from edge import EngineState
from tests.edge.test_remote import engine, loop

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ONE_WAY_MS = 1500  # each direction: a round trip of ~3 s, over the 2 s base timeouts
BOUND_S = (
    20.0  # the adaptive engine needs ~14 s: Zenoh open (~2 round trips) + a 2 s round + a 4 s round (~2 round trips)
)


@pytest.fixture
def slow_link(router, tmp_path, monkeypatch):
    """A `tcp/` endpoint that reaches `router` through the chaos proxy with ONE_WAY_MS on each direction."""
    monkeypatch.setenv("CHAOS_PROXY", "python")
    proxy = start_proxy_server(tmp_path / "proxy.log")
    try:
        api = ChaosClient(proxy.api_url)
        listen = api.create_proxy("robot-link", upstream=router.split("/", 1)[1])["listen"]
        for stream in ("upstream", "downstream"):
            api.add_toxic("robot-link", "latency", {"latency": ONE_WAY_MS}, stream=stream)
        yield f"tcp/{listen}"
    finally:
        proxy.stop()


def first_session_s(eng, t_start: float) -> float | None:
    """Seconds from start() to the first successful handshake (its transition's reason names the session)."""
    for t, _old, _new, reason in eng.drain_transitions():
        if reason.startswith("session "):
            return t - t_start
    return None


def test_a_link_slower_than_the_control_timeouts_gets_a_session_only_with_adaptive_timeouts(
    router, slow_link, server_factory, ckpt
):
    server_factory(ckpt)  # on the router directly: only the robot's link is slow
    # lease above the round trip (docs/edge.md); requests wait longer than the round trip; offline far beyond
    # the bound, so neither engine goes DEAD while it is watched: only the timeouts differ
    common = dict(lease_ms=8000, request_timeout_s=10.0, max_offline_s=60.0)
    adaptive = engine(slow_link, client_uuid="robot-adaptive", **common)
    fixed = engine(slow_link, client_uuid="robot-fixed", control_timeout_max_s=2.0, **common)
    t0 = time.monotonic()
    adaptive.start()
    fixed.start()
    try:
        # the adaptive robot's control loop runs for the whole bound: the fixed one must not get through in it either
        loop(adaptive, BOUND_S, until=lambda _: adaptive.failed or fixed.failed)
        adaptive_s, fixed_s = first_session_s(adaptive, t0), first_session_s(fixed, t0)
        print(f"first session after {adaptive_s} s (adaptive), {fixed_s} s (fixed at 2 s); fixed: {fixed.last_error}")
        assert not adaptive.failed and not fixed.failed
        assert adaptive_s is not None and adaptive_s < BOUND_S, (
            f"adaptive: no session in {BOUND_S} s: {adaptive.last_error}"
        )
        assert fixed_s is None, f"fixed 2 s timeouts got a session after {fixed_s} s on a ~3 s round trip"
        assert fixed.state == EngineState.CONNECTING
        waited = re.search(r"\(waited (\d+\.\d) s, timeout 2\.0 s;", fixed.last_error)  # bounds, not text: a
        assert waited and 1.9 <= float(waited.group(1)) < 5.0, fixed.last_error  # loaded host adds to any wait
        assert adaptive.control_timeouts.grown_s == 0.0  # the successful round brought the timeouts back to the base
    finally:
        adaptive.stop()
        fixed.stop()
