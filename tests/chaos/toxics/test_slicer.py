"""slicer: chunks are split into ~average_size pieces with `delay` microseconds between them; no byte changes."""

import time

from tests.chaos.harness import connect, proxy_to, recv_exactly


def test_sliced_data_arrives_intact_and_paced(api, echo):
    s = connect(proxy_to(api, echo))
    api.add_toxic("p", "slicer", {"average_size": 100, "size_variation": 20, "delay": 5000}, stream="downstream")
    payload = bytes(range(256)) * 8  # 2048 bytes -> ~20 slices, 5 ms apart
    t0 = time.perf_counter()
    s.sendall(payload)
    assert recv_exactly(s, len(payload)) == payload
    assert time.perf_counter() - t0 >= 0.05
    s.close()
