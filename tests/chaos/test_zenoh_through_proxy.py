"""A Zenoh client session through the proxy to a router: partitions and silent links as Zenoh sees them.

Predictions (docs/chaos.md): a partition (`enabled: false`) closes the TCP link, so the router drops
the client's liveliness token at once; after healing, the client reconnects within its retry period
(`connect/retry` period_max 1000 ms here) plus a handshake of a few round trips of the site's profile
(chaos.profiles.expected_rtt_ms). A client lease shorter than the profile's round trip (500 ms over
satellite's 600 ms) never holds a session at all. A silent link (a `timeout` toxic: bytes vanish, the socket
stays open) is only noticed when the client's lease (500 ms) expires.
"""

from __future__ import annotations

import threading
import time

import pytest
import zenoh

from chaos import profiles
from tests.chaos.harness import api, proxy_server  # noqa: F401
from wire.transport import open_session


class Watch:
    """Liveliness events of one key, timestamped on arrival."""

    def __init__(self, session, key):
        self.events: list[tuple[float, str]] = []
        self.cv = threading.Condition()
        self.sub = session.liveliness().declare_subscriber(
            key, zenoh.handlers.Callback(self._on, indirect=False), history=True
        )

    def _on(self, sample):
        with self.cv:
            self.events.append((time.monotonic(), "put" if sample.kind == zenoh.SampleKind.PUT else "delete"))
            self.cv.notify_all()

    def wait(self, kind: str, after: float, timeout: float) -> float | None:
        deadline = time.monotonic() + timeout
        with self.cv:
            while True:
                for t, k in self.events:
                    if k == kind and t >= after:
                        return t
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cv.wait(left)


@pytest.mark.parametrize("profile", ["lan", "wan_50ms", "satellite"])
def test_partition_and_heal_are_seen_by_zenoh_liveliness(api, router, profile):
    hostport = router.split("/", 1)[1]
    listen = api.create_proxy("site", upstream=hostport)["listen"]
    for toxic in profiles.profile_toxics(profile):
        api.add_toxic("site", **toxic)
    # the prediction: the retry period (period_max 1 s), then the reconnect handshake, a few round trips
    heal_within_s = 1.0 + 4 * profiles.expected_rtt_ms(profile) / 1e3 + 0.5
    observer = open_session(connect=[router], what="observer")
    # the remote engine's default lease; a 500 ms lease cannot hold a session over satellite's 600 ms RTT
    robot = open_session(connect=[f"tcp/{listen}"], lease_ms=1000, what="robot")
    try:
        watch = Watch(observer, "@fleet/test/robot/alive")
        token = robot.liveliness().declare_token("@fleet/test/robot/alive")
        assert watch.wait("put", 0, 10) is not None
        t_cut = time.monotonic()
        api.set_enabled("site", False)
        t_drop = watch.wait("delete", t_cut, 3)
        assert t_drop is not None and t_drop - t_cut < 0.5, "a closed link drops the token at once"
        time.sleep(0.5)  # hold the partition: the outage the robot lives through
        t_heal = time.monotonic()
        api.set_enabled("site", True)
        t_back = watch.wait("put", t_heal, heal_within_s + 5)
        assert t_back is not None and t_back - t_heal < heal_within_s, (
            f"{profile}: reconnected after {t_back and t_back - t_heal} s; predicted within {heal_within_s:.2f} s"
        )
        token.undeclare()
    finally:
        robot.close()
        observer.close()


def test_a_silent_link_is_seen_only_after_the_clients_lease(api, router):
    hostport = router.split("/", 1)[1]
    listen = api.create_proxy("site", upstream=hostport)["listen"]
    observer = open_session(connect=[router], what="observer")
    robot = open_session(connect=[f"tcp/{listen}"], lease_ms=500, what="robot")
    try:
        watch = Watch(observer, "@fleet/test/robot2/alive")
        token = robot.liveliness().declare_token("@fleet/test/robot2/alive")  # held: a dropped token is undeclared
        assert watch.wait("put", 0, 5) is not None
        time.sleep(0.5)  # a settled link: no handshake traffic in flight when the link goes silent
        assert [k for _, k in watch.events] == ["put"], [(round(t - watch.events[0][0], 3), k) for t, k in watch.events]
        t_cut = time.monotonic()
        api.add_toxic("site", "timeout", {"timeout": 0}, stream="upstream", name="blackhole")
        t_drop = watch.wait("delete", t_cut, 5)
        assert t_drop is not None
        assert 0.3 <= t_drop - t_cut <= 2.0, f"detected after {t_drop - t_cut:.2f} s; the lease is 0.5 s"
        del token
    finally:
        api.set_enabled("site", False)  # cut the black hole: a close handshake into it times out
        try:
            robot.close()
        except zenoh.ZError:
            pass  # the robot's side of a link that was silent: nothing left to close cleanly
        observer.close()
