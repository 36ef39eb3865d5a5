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
        s.sendall(payload[i:i + 20])
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
