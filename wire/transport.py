"""Zenoh session configuration shared by every process, and the router entry point.

One function builds every config so that all sides agree on the facts measured in
shared/notes/zenoh-python.md:
- shared memory OFF (otherwise large payloads bypass the TCP link and any fault proxy, and pool
  files survive SIGKILL),
- multicast scouting OFF (endpoints are configuration, design P11),
- a short client lease (the lease the CLIENT announces decides how fast a frozen peer is seen),
  and a longer router lease (`ROUTER_LEASE_MS`: each side sends keep-alives at its OWN lease / 4),
- connect retry as one object (leaf keys are rejected),
- TLS/mTLS files when given.

`endpoint_problem` is the one check of a Zenoh endpoint string (the server's manifest and the edge's
config both use it), and `MIN_LEASE_MS`..`MAX_LEASE_MS` the one range of a lease.

`python -m wire.transport --listen tcp/127.0.0.1:7447` runs a router in its own process (never
in-process with a busy session: they starve each other).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass

from wire.errors import WireError
from wire.keys import DEFAULT_ROOT, sanitize_root
from wire.procs import raise_fd_limit
from wire.suggest import did_you_mean


class TlsError(ValueError):
    """A TLS file is missing, unreadable, not PEM, expired, not yet valid, or does not match its key/CA."""


@dataclass(frozen=True)
class TlsFiles:
    root_ca_certificate: str
    certificate: str | None = None
    private_key: str | None = None

    def check(self) -> None:
        """Raise TlsError naming the file and the fix; never let Zenoh fail later with a vaguer message.

        Existence and PEM shape are always checked; with the `cryptography` package (the server and
        bench extras have it, a robot may not) also validity dates, key/certificate match and that
        the certificate is signed by the CA."""
        for name in ("root_ca_certificate", "certificate", "private_key"):
            path = getattr(self, name)
            if path is None:
                continue
            if not os.path.isfile(path):
                raise TlsError(
                    f"TLS {name} file {path!r} does not exist; check the path or regenerate the PKI (bench pki --help)"
                )
            try:
                with open(path, "rb") as f:
                    head = f.read(1 << 20)
            except OSError as exc:
                raise TlsError(
                    f"TLS {name} file {path!r} cannot be read ({exc.strerror}); fix its permissions"
                ) from None
            marker = b"PRIVATE KEY-----" if name == "private_key" else b"-----BEGIN CERTIFICATE-----"
            if marker not in head:
                raise TlsError(
                    f"TLS {name} file {path!r} is not a PEM {'private key' if name == 'private_key' else 'certificate'}"
                    "; give the PEM file"
                )
        if bool(self.certificate) != bool(self.private_key):
            raise TlsError("mTLS needs both a certificate and its private key; give the other one")
        try:
            from cryptography import x509  # noqa: F401
        except ImportError:
            return
        _deep_check(self)


def _deep_check(t: TlsFiles) -> None:
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    def load_cert(path: str, what: str):
        try:
            with open(path, "rb") as f:
                return x509.load_pem_x509_certificate(f.read())
        except ValueError as exc:
            raise TlsError(f"TLS {what} file {path!r} is not a valid certificate ({exc}); regenerate it") from None

    now = dt.datetime.now(dt.UTC)
    ca = load_cert(t.root_ca_certificate, "root_ca_certificate")
    certs = [("root_ca_certificate", t.root_ca_certificate, ca)]
    if t.certificate:
        certs.append(("certificate", t.certificate, load_cert(t.certificate, "certificate")))
    for what, path, cert in certs:
        if cert.not_valid_after_utc < now:
            raise TlsError(
                f"TLS {what} {path!r} expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC; issue a new certificate"
            )
        if cert.not_valid_before_utc > now:
            raise TlsError(
                f"TLS {what} {path!r} is not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC; "
                "check this machine's clock or the certificate"
            )
    if not t.certificate:
        return
    cert = certs[1][2]
    try:
        with open(t.private_key, "rb") as f:
            key = serialization.load_pem_private_key(f.read(), password=None)
    except (ValueError, TypeError) as exc:
        raise TlsError(
            f"TLS private_key {t.private_key!r} cannot be loaded ({exc}); give an unencrypted PEM key"
        ) from None
    pub = serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(serialization.Encoding.DER, pub) != cert.public_key().public_bytes(
        serialization.Encoding.DER, pub
    ):
        raise TlsError(
            f"TLS private_key {t.private_key!r} does not belong to certificate {t.certificate!r}; "
            "give the key it was issued for"
        )
    try:
        cert.verify_directly_issued_by(ca)
    except Exception:
        raise TlsError(
            f"TLS certificate {t.certificate!r} (CN {common_name(cert)!r}) is not signed by the CA "
            f"{t.root_ca_certificate!r}; the router will refuse it. Use a certificate of this fleet's CA"
        ) from None


def common_name(cert) -> str:
    from cryptography.x509.oid import NameOID

    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else ""


# Zenoh's endpoint grammar (zenoh-protocol's EndPoint): <protocol>/<address>[?<metadata>][#<config>], e.g.
# tcp/10.0.0.1:7447, tls/[fe80::1%eth0]:7447, tcp/10.0.0.1:7447#iface=eth0, unixsock-stream//run/zenoh.sock.
# Zenoh itself only checks that an address follows the protocol ('foo/bar', 'tcp/host:notaport' pass its
# config and fail at connect, where a robot blames an unreachable router): the protocols and the host:port
# shape are checked here.
HOST_PORT_PROTOCOLS = ("tcp", "udp", "tls", "quic", "ws")  # address: host:port, an IPv6 host in brackets
# the protocols Zenoh's links speak, with an address of each (past ws: a path, pipe name, device, vsock address)
ADDRESS_EXAMPLES = {
    **{p: "127.0.0.1:7447" for p in HOST_PORT_PROTOCOLS},
    "unixsock-stream": "/tmp/zenoh.sock",
    "unixpipe": "zenoh-pipe",
    "serial": "/dev/ttyUSB0",
    "vsock": "VMADDR_CID_ANY:7447",
}
ENDPOINT_PROTOCOLS = tuple(ADDRESS_EXAMPLES)
_HOST_PORT_RE = re.compile(r"(\[[0-9A-Fa-f:.]+(%[\w.-]+)?\]|[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?):(\d{1,5})")


def endpoint_problem(endpoint: object, listen: bool = False) -> str:
    """What is wrong with `endpoint` as a Zenoh endpoint, worded with what to write instead; "" if nothing is.
    `listen`: an endpoint to listen on, where port 0 asks for any free port."""
    example = f"tcp/{ADDRESS_EXAMPLES['tcp']}"
    if not isinstance(endpoint, str):
        return f"{endpoint!r} is not a Zenoh endpoint; give a string protocol/address, e.g. {example}"
    if any(c.isspace() for c in endpoint):
        return f"{endpoint!r} is not a Zenoh endpoint; write it as protocol/address without spaces, e.g. {example}"
    protocol, slash, rest = endpoint.partition("/")
    address = re.split(r"[?#]", rest, maxsplit=1)[0]
    if not slash or protocol not in ENDPOINT_PROTOCOLS:
        if _HOST_PORT_RE.fullmatch(rest or protocol):  # 127.0.0.1:7447, foo/127.0.0.1:7447
            example = f"tcp/{rest or protocol}"
        known = ", ".join(ENDPOINT_PROTOCOLS)
        why = f"; {protocol!r} is not one of {known}{did_you_mean(protocol, ENDPOINT_PROTOCOLS)}" if slash else ""
        return f"{endpoint!r} is not a Zenoh endpoint{why}; write it as protocol/address, e.g. {example}"
    if protocol not in HOST_PORT_PROTOCOLS:
        return (
            ""
            if address
            else (
                f"{endpoint!r} is not a Zenoh endpoint: no address after {protocol}/; "
                f"e.g. {protocol}/{ADDRESS_EXAMPLES[protocol]}"
            )
        )
    m = _HOST_PORT_RE.fullmatch(address)
    lowest = 0 if listen else 1
    if m is None or not lowest <= int(m.group(4)) <= 65535:
        return (
            f"{endpoint!r} is not a Zenoh endpoint: {protocol} needs host:port (a port from {lowest} to 65535"
            f"{', 0: any free port' if listen else ''}, an IPv6 host in brackets), e.g. "
            f"{protocol}/{ADDRESS_EXAMPLES[protocol]} or {protocol}/[::1]:7447"
        )
    return ""


# A lease any side may announce: under 100 ms a busy host misses keep-alives (lease / 4) and loses healthy
# links; over 10 minutes a dead peer holds its sessions (and a server its capacity) for as long.
MIN_LEASE_MS, MAX_LEASE_MS = 100, 600_000


TX_WAIT_BEFORE_DROP_US = 20_000
# Batches per priority queue (Zenoh's default is 2 each): room for a micro-batch's burst of express chunks.
TX_QUEUE_SIZE = {
    "control": 2,
    "real_time": 2,
    "interactive_high": 16,
    "interactive_low": 4,
    "data_high": 4,
    "data": 8,
    "data_low": 2,
    "background": 2,
}


# The router's own lease. A side sends a keep-alive every (its own lease) / 4 on each idle link, and the
# peer expires the link after the lease the side announced. At 1 s the router sent 4 keep-alives a second
# to each of 300 robots (1200 messages/s through the WAN proxy, over a third of everything the proxy
# wrote in the headline); at 4 s it sends one. What it costs: a client sees a router that froze without
# closing its sockets after ~4 s instead of ~1 s. A killed router closes them (seen at once), a partition
# closes them too, and a robot's per-request timeout catches a silent link long before either lease.
ROUTER_LEASE_MS = 4000

# Sessions a router accepts (Zenoh's `transport/unicast/max_sessions`). Zenoh's default, 1000, refuses the
# 1,001st client as if no router listened ("Unable to connect to any of ..."), so a fleet of 1,000 robots and
# its replicas does not fit (docs/results/, "1,000 robots on 16 cores"). A fleet's
# router sizes it from the fleet (`bench.run.sizing.router_max_sessions`); this is the floor.
ROUTER_MAX_SESSIONS = 4096
# Observations one link may put through the router per second (`--max-observation-rate-hz`; Zenoh's ingress
# `downsampling`: a put on `<root>/**/obs` sooner than 1/HZ after the link's previous one is dropped at the router).
# A robot floods at link speed only when broken or hostile: at ~34k observations/s a replica's subscriber fell
# behind and the router's queue to it dropped the other robots' observations too (their p99 3.4 ms -> 2.2 s); no
# per-message saving in Python keeps up with that, so it is shed here, before any server. Off by default: Zenoh's
# budget is a minimum interval with no burst, so a client that asks again the moment its answer comes (a loopback
# benchmark, `python -m wire.demo`: under 1 ms apart) would lose requests. A robot sends at most one observation a
# control tick: set several times the fastest robot's rate (`bench run` sets 10x its fleet's fastest fps). The
# budget is per link, so a router other routers connect to (a node router, the hub of `bench run --cluster ray`)
# runs without it: that link carries many robots.
ROUTER_MAX_OBSERVATION_RATE_HZ = 0.0
# Incoming links in handshake at once (Zenoh's `accept_pending`, default 100): 1,000 robots start within
# half a second, and a partition's end sends a site's robots back together.
ROUTER_ACCEPT_PENDING = 1000


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
            # a router presents its certificate to its clients (listen) and, joining another router, to that
            # router (connect: the hub's access rules key on the node router's common name)
            for key in ("listen", "connect") if mode == "router" else ("connect",):
                t[f"{key}_certificate"] = tls.certificate
                t[f"{key}_private_key"] = tls.private_key
        c.insert_json5("transport/link/tls", json.dumps(t))
    for k, v in (extra or {}).items():
        c.insert_json5(k, json.dumps(v))
    return c


def open_session(*, connect: list[str], lease_ms: int = 1000, tls: TlsFiles | None = None, what: str = "client"):
    """Open a client session or raise ConnectionError naming the endpoint and the fix."""
    import zenoh

    if tls is None and any(e.startswith(("tls/", "quic/")) for e in connect):
        raise TlsError(f"{what}: endpoint {connect[0]} needs TLS files (root CA, and for mTLS a certificate and key)")
    if tls is not None:
        try:
            tls.check()
        except TlsError as exc:
            raise TlsError(f"{what}: {exc}") from None
    try:
        return zenoh.open(make_config("client", connect=connect, lease_ms=lease_ms, tls=tls))
    except zenoh.ZError as exc:
        if tls is not None:
            raise ConnectionError(
                f"{what}: no TLS session with a router at {', '.join(connect)} ({_short(exc)}); either the router is down, "
                "or it refused the handshake: the certificate must be signed by the router's CA, unexpired, and "
                "the router's certificate must name this endpoint's host"
            ) from None
        raise ConnectionError(
            f"{what}: cannot reach a Zenoh router at {', '.join(connect)} ({_short(exc)}); "
            "start the router or fix the endpoint (a running router refuses sessions beyond its --max-sessions "
            "the same way)"
        ) from None


def arrival_stamps(sample) -> tuple[int, int | None]:
    """(now, when a router routed `sample`), both on this process's monotonic clock, ns: call it first thing in a
    sample's callback. The second is the sample's Zenoh timestamp (a Zenoh router stamps each sample it routes
    that has none, unless its config turns `timestamping` off) read as an age against the wall clock, read
    beside the monotonic one so that nothing runs between the two; None when unstamped or unreadable. The
    timestamp is the router's wall clock: from another host, the two hosts' wall clocks' difference is in it."""
    now = time.monotonic_ns()
    wall = time.time_ns()
    ts = sample.timestamp
    if ts is None:
        return now, None
    try:
        return now, now - (wall - int(ts.get_time().timestamp() * 1e9))
    except (AttributeError, ValueError, OverflowError, OSError):
        return now, None


def observation_rate_cap(hz: float, roots: list[str] | tuple[str, ...] = (DEFAULT_ROOT,)) -> list[dict]:
    """Zenoh's `downsampling` config: on every link into the router, puts on a robot's observation key (wire.keys:
    `<root>/.../<client>/obs`) at most `hz` a second. A root is a verbatim chunk (`@fleet`), which `**` never
    matches, so each is named. Zenoh keeps one budget per link and rule, not per key: a robot's link puts on one
    observation key, so it is that robot's."""
    return [
        {
            "id": "observations",
            "flows": ["ingress"],
            "messages": ["put"],
            "rules": [{"key_expr": f"{r}/**/obs", "freq": float(hz)} for r in roots],
        }
    ]


def _short(exc: Exception) -> str:
    """Zenoh's error text without the Rust source location it appends."""
    return str(exc).split(" at /")[0].strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m wire.transport", description="Run a Zenoh router in this process.")
    ap.add_argument("--listen", action="append", required=True, help="endpoint, e.g. tcp/127.0.0.1:7447 (repeatable)")
    ap.add_argument(
        "--connect",
        action="append",
        default=[],
        help="another router to join, e.g. tcp/HEAD:7447 (repeatable): routers connected to each other "
        "form one Zenoh network and route between them (a node router of `bench run --cluster ray`)",
    )
    ap.add_argument(
        "--config-json", default=None, help="extra config as a JSON object of key -> value (e.g. access_control)"
    )
    ap.add_argument(
        "--access-control",
        metavar="FILE",
        help="router access rules: a JSON file {access_control: ...} from `python -m wire.acl` or `bench pki --acl`",
    )
    ap.add_argument("--tls-ca"), ap.add_argument("--tls-cert"), ap.add_argument("--tls-key")
    ap.add_argument(
        "--lease-ms",
        type=int,
        default=ROUTER_LEASE_MS,
        help=f"the router's lease: clients see a frozen router after it (default {ROUTER_LEASE_MS})",
    )
    ap.add_argument(
        "--max-observation-rate-hz",
        type=float,
        default=ROUTER_MAX_OBSERVATION_RATE_HZ,
        help="observations a link may put per second; sooner ones are dropped at the router (default "
        "%(default)s = no cap; set several times the fastest robot's control rate; keep 0 on a "
        "router that other routers connect to: the budget is per link)",
    )
    ap.add_argument(
        "--observation-root",
        action="append",
        default=None,
        metavar="ROOT",
        help=f"key root whose observations the cap counts (repeatable; default {DEFAULT_ROOT}, the "
        "manifests' `zenoh.root`)",
    )
    ap.add_argument(
        "--max-sessions",
        type=int,
        default=ROUTER_MAX_SESSIONS,
        help="client sessions (robots, replicas, other routers) the router accepts; the one beyond is "
        "refused as if no router listened (default %(default)s; Zenoh's own is 1000)",
    )
    args = ap.parse_args(argv)
    if args.lease_ms < MIN_LEASE_MS:
        print(f"router: --lease-ms {args.lease_ms} is too short (at least {MIN_LEASE_MS} ms)", file=sys.stderr)
        return 2
    if args.max_sessions < 1:
        print(f"router: --max-sessions {args.max_sessions} must be at least 1", file=sys.stderr)
        return 2
    rate = args.max_observation_rate_hz
    if not (rate == 0 or 1.0 <= rate <= 1e6):  # NaN and inf fail both
        print(f"router: --max-observation-rate-hz {rate:g} must be 0 (no cap) or from 1 to 1e6", file=sys.stderr)
        return 2
    try:  # checked with no cap too: a wrong root given is a mistake either way
        roots = [sanitize_root(r) for r in args.observation_root or [DEFAULT_ROOT]]
    except WireError as exc:
        print(f"router: --observation-root: {exc}", file=sys.stderr)
        return 2
    import zenoh

    if os.environ.get("RUST_LOG"):  # e.g. RUST_LOG=zenoh::net::routing::interceptor=debug shows access-rule denials
        zenoh.init_log_from_env_or("error")
    tls = TlsFiles(args.tls_ca, args.tls_cert, args.tls_key) if args.tls_ca else None
    extra = json.loads(args.config_json) if args.config_json else None
    if args.access_control:
        try:
            with open(args.access_control) as f:
                rules = json.load(f)
        except (OSError, ValueError) as exc:
            print(f"router: cannot read the access rules {args.access_control!r}: {exc}", file=sys.stderr)
            return 2
        extra = {**(extra or {}), "access_control": rules.get("access_control", rules)}
        if extra["access_control"].get("enabled") and not tls:
            print(
                "router: access rules key on certificate common names: give --tls-ca/--tls-cert/--tls-key (mTLS) too",
                file=sys.stderr,
            )
            return 2
    extra = {
        "transport/unicast/max_sessions": args.max_sessions,
        "transport/unicast/accept_pending": max(100, min(args.max_sessions, ROUTER_ACCEPT_PENDING)),
        **({"downsampling": observation_rate_cap(rate, roots)} if rate else {}),
        **(extra or {}),
    }
    fds = raise_fd_limit()
    if fds < args.max_sessions + 64:  # one socket a session, and the router's own
        print(
            f"router: warning: {fds} open files allowed (ulimit -n) for up to {args.max_sessions} sessions: "
            f"sessions beyond about {max(0, fds - 64)} fail; raise the hard limit (ulimit -Hn)",
            file=sys.stderr,
        )
    try:
        session = zenoh.open(
            make_config(
                "router", listen=args.listen, connect=args.connect, lease_ms=args.lease_ms, tls=tls, extra=extra
            )
        )
    except zenoh.ZError as exc:
        print(f"router: cannot listen on {args.listen}: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    cap = f"max {rate:g} observations/s a link" if rate else "observations uncapped"
    print(f"router ready {' '.join(args.listen)} (max sessions {args.max_sessions}) ({cap})", flush=True)
    stop.wait()
    session.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
