"""The policy server's Zenoh session: opening it as the manifest says, and watching its router.

    open_manifest_session(m) ──► wire.transport.open_session, retried with backoff for zenoh.connect_timeout_s
    RouterLink(z)            ──► connected() for /readyz (`no router`), a log line per router lost or regained

Owns: `open_manifest_session`, `RouterLink`, `StartCancelled`. A `ServerProcess` opens one session for all
its models; a lone `PolicyServer` opens its own.
"""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("policy_server")


class RouterLink:
    """Whether the server's Zenoh session has a router now, and a log line each time it loses or regains one.

    A client-mode session reaches robots only through a router; while it has none, /readyz says not ready
    (reason `no router`) so nothing sends it sessions. Zenoh reconnects by itself: this only watches. The
    routers are counted from the transport events, not `routers_zid()`, which may still list a router when
    the event of its loss arrives.
    """

    def __init__(self, z):
        import zenoh

        self._router, self._put = zenoh.WhatAmI.ROUTER, zenoh.SampleKind.PUT
        self._lock = threading.Lock()
        self._routers = {str(zid) for zid in z.info.routers_zid()}  # history=True repeats them: no change, no line
        self._listener = z.info.declare_transport_events_listener(self._on_transport, history=True)

    def connected(self) -> bool:
        with self._lock:
            return bool(self._routers)

    def _on_transport(self, event) -> None:
        transport = event.transport
        if transport.whatami != self._router:
            return
        zid, put = str(transport.zid), event.kind == self._put
        with self._lock:
            changed = (zid in self._routers) != put
            if put:
                self._routers.add(zid)
            else:
                self._routers.discard(zid)
            left = len(self._routers)
        if not changed:
            return
        if put:
            log.info("Zenoh router %s connected (%d in all): ready for sessions", zid, left)
        elif left:
            log.info("Zenoh router %s lost, %d still connected", zid, left)
        else:
            log.warning("Zenoh router %s lost: not ready (no router) until one is back; reconnecting", zid)

    def close(self) -> None:
        try:
            self._listener.undeclare()
        except Exception:  # the session may be closed already
            pass


class StartCancelled(Exception):
    """stop() (SIGTERM, Ctrl-C) came while start() was still waiting for a Zenoh router: nothing to drain."""


def open_manifest_session(m, *, sleep=time.sleep, clock=time.monotonic, stopped: threading.Event | None = None):
    """The server's Zenoh session as the manifest's `zenoh` section (server.manifest.ZenohConfig) says: endpoints,
    lease, TLS files.

    An unreachable router is retried with backoff (0.1 s doubling to 2 s) until `zenoh.connect_timeout_s`
    has passed: a replica restarted while its router is saturated or restarting must not exit on a refusal
    that would have cleared a second later. Missing or bad TLS files fail at once (no retry can fix them).
    `stopped` set ends the retries at once with StartCancelled (a SIGTERM must not wait out the timeout).
    """
    if stopped is not None:
        sleep = stopped.wait
    from wire.transport import TlsFiles, open_session

    z = m.zenoh
    tls = z.tls
    tls_files = (
        TlsFiles(tls.root_ca_certificate, tls.connect_certificate, tls.connect_private_key)
        if tls.root_ca_certificate
        else None
    )
    connect = list(z.connect_endpoints)
    deadline = clock() + z.connect_timeout_s
    delay, attempts = 0.1, 0
    while True:
        attempts += 1
        try:
            return open_session(connect=connect, lease_ms=z.lease_ms, tls=tls_files, what="policy-server")
        except ConnectionError as exc:
            left = deadline - clock()
            if left <= 0:
                if attempts > 1:
                    raise ConnectionError(
                        f"{exc} (gave up after {attempts} attempts; zenoh.connect_timeout_s {z.connect_timeout_s})"
                    ) from None
                raise
            log.warning(
                "router not reachable yet (attempt %d), retrying in %.1f s: %s", attempts, min(delay, left), exc
            )
            sleep(min(delay, left))
            if stopped is not None and stopped.is_set():
                raise StartCancelled(f"stopped while waiting for a Zenoh router (attempt {attempts})") from None
            delay = min(2.0, delay * 2)
