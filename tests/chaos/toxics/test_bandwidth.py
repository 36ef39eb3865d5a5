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
