"""latency: each chunk waits latency +/- jitter ms; order is kept."""

from tests.chaos.harness import connect, proxy_to, round_trip


def test_latency_and_jitter_bound_every_round_trip(api, echo):
    s = connect(proxy_to(api, echo))
    base = min(round_trip(s) for _ in range(5))
    api.add_toxic("p", "latency", {"latency": 40, "jitter": 10}, stream="downstream")
    rtts = [round_trip(s) for _ in range(20)]
    assert all(0.030 - 0.002 <= r <= 0.050 + base + 0.03 for r in rtts), rtts  # slack: a busy host's wake-ups
    median = sorted(rtts)[len(rtts) // 2]
    assert 0.030 <= median - base <= 0.050 + 0.005, rtts  # the typical round trip: within latency +/- jitter
    assert max(rtts) - min(rtts) > 0.004, "jitter must vary the delay"
    s.close()


def test_latency_on_both_streams_adds_up(api, echo):
    s = connect(proxy_to(api, echo))
    api.add_toxic("p", "latency", {"latency": 30}, stream="upstream")
    api.add_toxic("p", "latency", {"latency": 30}, stream="downstream")
    r = sorted(round_trip(s) for _ in range(5))[2]
    assert 0.058 <= r <= 0.1
    s.close()


def test_jitter_never_reorders_bytes(api, echo):
    s = connect(proxy_to(api, echo))
    api.add_toxic("p", "latency", {"latency": 5, "jitter": 5}, stream="downstream")
    payload = b"".join(i.to_bytes(2, "big") for i in range(500))
    for i in range(0, len(payload), 20):
        s.sendall(payload[i : i + 20])
    from tests.chaos.harness import recv_exactly

    assert recv_exactly(s, len(payload)) == payload
    s.close()


def test_toxicity_zero_passes_data_untouched_and_one_applies_the_toxic(api, echo):
    s = connect(proxy_to(api, echo))
    base = min(round_trip(s) for _ in range(5))
    api.add_toxic("p", "latency", {"latency": 60}, stream="downstream", toxicity=0.0)
    assert max(round_trip(s) for _ in range(5)) < base + 0.03  # the per-connection draw failed: no delay
    s.close()
    api.update_toxic("p", "latency_downstream", toxicity=1.0)
    s = connect(api.get_proxy("p")["listen"])
    assert min(round_trip(s) for _ in range(3)) >= 0.058
    s.close()


def _ours(proxy_server):
    import pytest

    if getattr(proxy_server, "real_toxiproxy", False):
        pytest.skip("fidelity stamps are ours: the real Toxiproxy has no /fidelity")


def test_fidelity_reports_the_delay_asked_and_what_was_applied(api, echo, proxy_server):
    from chaos.toxiproxy.fidelity import percentile_ms

    _ours(proxy_server)
    s = connect(proxy_to(api, echo))
    api.add_toxic("p", "latency", {"latency": 40}, stream="downstream")
    for _ in range(15):
        round_trip(s)
    f = api.fidelity("p")
    down, up = f["downstream"], f["upstream"]
    assert down["chunks"] >= 15 and up["chunks"] == 0  # no toxic upstream: the fast path, nothing stamped
    assert abs(down["asked_ms_sum"] / down["chunks"] - 40.0) < 0.01  # exactly what the toxic drew
    assert len(down["hist"]) == len(f["edges_ms"]) + 1 and sum(down["hist"]) == down["chunks"]
    assert percentile_ms(down["hist"], 0.5) <= 15.0  # a timer fires on time give or take a busy host
    assert down["asked_ms_min"] == down["asked_ms_max"] == 40.0 and up["asked_ms_max"] is None
    # and by the 100 ms of the proxy's monotonic clock (this host's): what a request's hop is bounded by
    import time

    by_s = api.fidelity_asked("p")["downstream"]
    assert by_s["t0_s"] <= time.monotonic() and max(by_s["asked_ms_max"]) == 40.0
    assert api.fidelity_asked("p")["upstream"] == {"t0_s": None, "bucket_s": 0.1, "dropped": False, "asked_ms_max": []}
    s.close()


def test_fidelity_sees_a_stalled_proxy_as_applied_delay_beyond_the_asked(api, echo, proxy_server):
    import os
    import signal
    import time

    from tests.chaos.harness import recv_exactly, unread_bytes_from

    _ours(proxy_server)
    s = connect(proxy_to(api, echo))
    api.add_toxic("p", "latency", {"latency": 300}, stream="downstream")
    round_trip(s)
    before = api.fidelity("p")["downstream"]["error_ms_max"]
    s.sendall(b"y" * 64)
    # the proxy stops while the toxic holds the echo: the echo has left (an event) and the proxy's upstream socket
    # has nothing unread (the kernel's table), so the proxy took it; a fixed sleep here was a guess a loaded host
    # could lose (the proxy not yet scheduled: it stamps the chunk after the stall, and the stall vanishes)
    echo.wait_echoed(64 + 64)  # round_trip's bytes, then these
    deadline = time.monotonic() + 5
    while unread_bytes_from(echo.port) != 0:
        assert time.monotonic() < deadline, f"the proxy did not read the echo: {unread_bytes_from(echo.port)} unread"
        time.sleep(0.001)  # another process's socket: no event reaches this one
    os.kill(proxy_server.pid, signal.SIGSTOP)  # a host that gives the proxy no CPU for 500 ms
    time.sleep(0.5)  # the stall itself, not synchronisation
    os.kill(proxy_server.pid, signal.SIGCONT)
    recv_exactly(s, 64)
    after = api.fidelity("p")["downstream"]
    # the stall ends >= 500 ms after the stamp, 200 ms past the 300 ms asked: applied >= asked + 200 ms
    assert after["error_ms_max"] >= 150.0 > before, (before, after)
    s.close()
