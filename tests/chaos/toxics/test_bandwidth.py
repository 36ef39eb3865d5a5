"""bandwidth: rate KB/s (1 KB = 1000 B) within 10 %."""

import time

from tests.chaos.harness import connect, proxy_to, recv_exactly


def _echo_time(s, payload: bytes) -> float:
    t0 = time.perf_counter()
    s.sendall(payload)
    assert recv_exactly(s, len(payload)) == payload
    return time.perf_counter() - t0


def test_transfer_time_matches_the_rate(api, echo):
    s = connect(proxy_to(api, echo))
    payload = b"z" * 100_000
    base = min(_echo_time(s, payload) for _ in range(3))  # the same transfer with no toxic
    api.add_toxic("p", "bandwidth", {"rate": 200}, stream="downstream")  # 200 KB/s: 0.5 s for 100 KB
    added = _echo_time(s, payload) - base
    assert 0.5 * 0.9 <= added <= 0.5 * 1.1, f"the toxic added {added:.3f} s; 100 KB at 200 KB/s is 0.5 s"
    s.close()


def test_fidelity_reads_the_delivered_rate_of_a_backlogged_link(api, echo, proxy_server):
    import pytest

    if getattr(proxy_server, "real_toxiproxy", False):
        pytest.skip("fidelity stamps are ours")
    s = connect(proxy_to(api, echo))
    api.add_toxic("p", "bandwidth", {"rate": 200}, stream="downstream")
    _echo_time(s, b"z" * 200_000)  # ~1 s at 200 KB/s: the link stays backlogged
    down = api.fidelity("p")["downstream"]
    assert down["rate_kbps"] == 200 and down["shaped_bytes"] > 100_000
    delivered = down["shaped_bytes"] / down["shaped_busy_s"] / 1e3
    assert 0.8 * 200 <= delivered <= 1.1 * 200, delivered  # within the bench's default tolerance of the rate
    assert down["chunks"] > 0 and down["error_ms_max"] < 200  # the ideal link's queueing is asked, not error
    s.close()
