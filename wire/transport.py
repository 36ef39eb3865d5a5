"""Zenoh session configuration shared by every process, and the router entry point.

One function builds every config so that all sides agree on the facts measured in
shared/notes/zenoh-python.md:
- shared memory OFF (otherwise large payloads bypass the TCP link and any fault proxy, and pool
  files survive SIGKILL),
- multicast scouting OFF (endpoints are configuration, design P11),
- a short client lease (the lease the CLIENT announces decides how fast a frozen peer is seen),
- connect retry as one object (leaf keys are rejected),
- TLS/mTLS files when given.

`python -m wire.transport --listen tcp/127.0.0.1:7447` runs a router in its own process (never
in-process with a busy session: they starve each other).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class TlsFiles:
    root_ca_certificate: str
    certificate: str | None = None
    private_key: str | None = None

    def check(self) -> None:
        for name in ("root_ca_certificate", "certificate", "private_key"):
            path = getattr(self, name)
            if path is not None and not os.path.isfile(path):
                raise FileNotFoundError(f"TLS {name} file {path!r} does not exist; check the path or regenerate the PKI")


TX_WAIT_BEFORE_DROP_US = 20_000
# Batches per priority queue (Zenoh's default is 2 each): room for a micro-batch's burst of express chunks.
TX_QUEUE_SIZE = {"control": 2, "real_time": 2, "interactive_high": 16, "interactive_low": 4, "data_high": 4, "data": 8,
                 "data_low": 2, "background": 2}


def make_config(
    mode: str = "client",
    connect: list[str] | tuple[str, ...] = (),
    listen: list[str] | tuple[str, ...] = (),
    lease_ms: int = 1000,
    tls: TlsFiles | None = None,
    retry_init_ms: int = 100,
    retry_max_ms: int = 1000,
    extra: dict | None = None,
):
    import zenoh

    c = zenoh.Config()
    c.insert_json5("mode", json.dumps(mode))
    if connect:
        c.insert_json5("connect/endpoints", json.dumps(list(connect)))
        c.insert_json5("connect/retry", json.dumps({"period_init_ms": retry_init_ms, "period_max_ms": retry_max_ms}))
    if listen:
        c.insert_json5("listen/endpoints", json.dumps(list(listen)))
    c.insert_json5("scouting/multicast/enabled", "false")
    c.insert_json5("transport/shared_memory/enabled", "false")
    c.insert_json5("transport/link/tx/lease", str(int(lease_ms)))
    c.insert_json5("transport/link/tx/keep_alive", "4")
    # DROP-congestion messages (obs, chunks, events) wait this long for room in the link's queue before
    # they are dropped. Zenoh's 1 ms default drops a burst of express chunks whenever the tx task is not
    # scheduled within a millisecond (a busy 2-core host): a lost chunk costs the robot request_timeout_s.
    # 20 ms stays far below any request timeout, so a dead link still never stalls a publisher for long.
    c.insert_json5("transport/link/tx/queue/congestion_control/drop/wait_before_drop", str(TX_WAIT_BEFORE_DROP_US))
    c.insert_json5("transport/link/tx/queue/size", json.dumps(TX_QUEUE_SIZE))
    if tls is not None:
        tls.check()
        t = {"root_ca_certificate": tls.root_ca_certificate, "enable_mtls": tls.certificate is not None}
        if tls.certificate:
            key = "listen" if mode == "router" else "connect"
            t[f"{key}_certificate"] = tls.certificate
            t[f"{key}_private_key"] = tls.private_key
        c.insert_json5("transport/link/tls", json.dumps(t))
    for k, v in (extra or {}).items():
        c.insert_json5(k, json.dumps(v))
    return c


def open_session(*, connect: list[str], lease_ms: int = 1000, tls: TlsFiles | None = None, what: str = "client"):
    """Open a client session or raise ConnectionError naming the endpoint and the fix."""
    import zenoh

    try:
        return zenoh.open(make_config("client", connect=connect, lease_ms=lease_ms, tls=tls))
    except zenoh.ZError as exc:
        raise ConnectionError(
            f"{what}: cannot reach a Zenoh router at {', '.join(connect)} ({exc}); "
            "start the router or fix the endpoint"
        ) from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m wire.transport", description="Run a Zenoh router in this process.")
    ap.add_argument("--listen", action="append", required=True, help="endpoint, e.g. tcp/127.0.0.1:7447 (repeatable)")
    ap.add_argument("--config-json", default=None, help="extra config as a JSON object of key -> value (e.g. access_control)")
    ap.add_argument("--tls-ca"), ap.add_argument("--tls-cert"), ap.add_argument("--tls-key")
    args = ap.parse_args(argv)
    import zenoh

    tls = TlsFiles(args.tls_ca, args.tls_cert, args.tls_key) if args.tls_ca else None
    extra = json.loads(args.config_json) if args.config_json else None
    try:
        session = zenoh.open(make_config("router", listen=args.listen, tls=tls, extra=extra))
    except zenoh.ZError as exc:
        print(f"router: cannot listen on {args.listen}: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(f"router ready {' '.join(args.listen)}", flush=True)
    stop.wait()
    session.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
