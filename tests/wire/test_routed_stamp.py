"""A Zenoh router stamps what it routes (its default config); the server reads that stamp as the moment the first
router routed an observation, on its own monotonic clock (wire.transport.arrival_stamps), and a client as the
moment the first router routed a chunk."""

from __future__ import annotations

import json
import threading
import time

import pytest

from wire.procs import start_router
from wire.transport import arrival_stamps, make_config

zenoh = pytest.importorskip("zenoh")


def through(endpoint: str, n: int = 20) -> list[tuple[int, int, int | None]]:
    """(sent, received, routed) monotonic ns of `n` samples put by one client and taken by another."""
    pub = zenoh.open(make_config("client", connect=[endpoint]))
    sub_session = zenoh.open(make_config("client", connect=[endpoint]))
    got, sent, warm, done = [], {}, threading.Event(), threading.Event()

    def on_sample(sample):
        received, routed = arrival_stamps(sample)
        i = int(sample.payload.to_bytes())
        if i < 0:  # a warm-up sample: the router knows the subscription
            warm.set()
            return
        got.append((sent[i], received, routed))
        if len(got) == n:
            done.set()

    try:
        sub = sub_session.declare_subscriber("stamp/test", on_sample)
        for _ in range(250):  # until the router routes to the new subscriber (its declaration travels first)
            pub.put("stamp/test", "-1")
            if warm.wait(0.02):
                break
        assert warm.is_set(), "the subscriber never got a sample"
        for i in range(n):
            sent[i] = time.monotonic_ns()
            pub.put("stamp/test", str(i))
        assert done.wait(10), f"{len(got)} of {n} samples arrived"
        sub.undeclare()
    finally:
        pub.close()
        sub_session.close()
    return got


def test_a_stamping_router_s_time_falls_between_the_put_and_the_callback(tmp_path):
    child, endpoint = start_router(None, tmp_path / "router.log")
    try:
        got = through(endpoint)
    finally:
        child.stop()
    for sent, received, routed in got:  # the wall clock is read beside the monotonic one: no slack needed
        assert routed is not None
        assert sent <= routed <= received, (sent, routed, received)


def test_an_unstamped_sample_has_no_routed_time(tmp_path):
    off = json.dumps({"timestamping": {"enabled": {"router": False}}})
    child, endpoint = start_router(None, tmp_path / "router.log", extra_args=["--config-json", off])
    try:
        got = through(endpoint, n=3)
    finally:
        child.stop()
    assert [routed for _, _, routed in got] == [None, None, None]
