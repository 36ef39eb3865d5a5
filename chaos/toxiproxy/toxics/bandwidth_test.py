"""bandwidth: rate KB/s (1 KB = 1000 B) within 10 %."""

import time

from tests.chaos.harness import connect, proxy_to, recv_exactly


def test_transfer_time_matches_the_rate(api, echo):
    s = connect(proxy_to(api, echo))
    api.add_toxic("p", "bandwidth", {"rate": 200}, stream="downstream")  # 200 KB/s
    payload = b"z" * 100_000  # 0.5 s at 200 KB/s
    t0 = time.perf_counter()
    s.sendall(payload)
    assert recv_exactly(s, len(payload)) == payload
    took = time.perf_counter() - t0
    assert 0.45 <= took <= 0.55 * 1.1 + 0.05, took
    s.close()
