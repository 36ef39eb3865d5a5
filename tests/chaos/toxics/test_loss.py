"""loss: nothing is lost or reordered; a lost chunk stalls the stream for an RTO that doubles on repeats."""

import pytest

from tests.chaos.harness import connect, proxy_to, recv_exactly, round_trip


@pytest.fixture(autouse=True)
def ours_only(proxy_server):
    if proxy_server.real_toxiproxy:
        pytest.skip(
            "`loss` is our toxic; the real Toxiproxy gets its stand-in (chaos.profiles.real_toxiproxy_equivalent)"
        )


def test_loss_stalls_but_never_loses_or_reorders(api, echo):
    s = connect(proxy_to(api, echo))
    api.add_toxic(
        "p", "loss", {"probability": 0.3, "rto_ms": 40, "max_rto_ms": 160, "segment_size": 0}, stream="downstream"
    )
    # the proxy's draws are not seeded: 150 round trips (~45 lost) make a run without a repeated loss (0.7^45,
    # ~1e-7) or a stall count outside the bounds (> 5 standard deviations) negligible; 40 failed ~1 % of runs.
    # The RTO is capped at 4x: uncapped, 7 losses in a row (~3 % of 150 round trips) stalled one past the
    # socket's 5 s timeout (a CI failure); capped, that takes 33 in a row
    rtts = [round_trip(s, i.to_bytes(4, "big") * 8) for i in range(150)]  # round_trip asserts the echo is exact
    stalled = [r for r in rtts if r >= 0.038]
    assert 15 <= len(stalled) <= 80, rtts
    assert any(r >= 0.078 for r in rtts), "consecutive losses double the RTO"
    s.close()


def test_no_loss_means_no_stall(api, echo):
    s = connect(proxy_to(api, echo))
    api.add_toxic("p", "loss", {"probability": 0.0, "rto_ms": 200}, stream="downstream")
    assert max(round_trip(s) for _ in range(20)) < 0.1
    payload = bytes(range(256)) * 40
    s.sendall(payload)
    assert recv_exactly(s, len(payload)) == payload
    s.close()


def test_a_chunk_total_loss_held_is_let_go_with_its_toxic_and_the_leg_stays_finite(api, echo):
    """probability 1 asks an endless stall; the toxic's removal ends it. The chunk's asked delay is then what it
    waited (its error 0), so the fidelity counters stay finite JSON (they read Infinity, which strict clients
    cannot parse and the API now refuses to send: a 500)."""
    import math
    import socket

    s = connect(proxy_to(api, echo))
    api.add_toxic("p", "loss", {"probability": 1.0, "rto_ms": 40}, name="all_lost", stream="downstream")
    payload = b"held" * 8
    s.sendall(payload)
    s.settimeout(0.3)
    with pytest.raises(socket.timeout):  # held: nothing comes back while the toxic is there
        s.recv(1)
    s.settimeout(5.0)
    api.remove_toxic("p", "all_lost")
    assert recv_exactly(s, len(payload)) == payload
    down = api.fidelity("p")["downstream"]
    assert down["chunks"] >= 1 and math.isfinite(down["asked_ms_max"]) and down["asked_ms_max"] >= 300
    assert math.isfinite(down["asked_ms_sum"]) and down["error_ms_max"] < 300
    assert all(math.isfinite(x) for x in api.fidelity_asked("p")["downstream"]["asked_ms_max"])
    s.close()
