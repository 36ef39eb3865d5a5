"""`wire.transport.endpoint_problem`: the one endpoint rule of the manifest and the edge's config. It
accepts every form Zenoh's links take and refuses what Zenoh's own config lets through only to fail
at connect (where a robot blamed an unreachable router)."""

from __future__ import annotations

import json

import pytest

from wire.transport import endpoint_problem

VALID = [
    "tcp/127.0.0.1:7447",
    "tcp/localhost:7447",
    "tcp/router.example:7447",
    "tcp/B_IP:7447",
    "tcp/a:65535",
    "tcp/[::1]:7447",
    "tls/[fe80::1%eth0]:7447",
    "udp/10.0.0.1:7447",
    "tls/10.0.0.1:7447",
    "quic/router:7447",
    "ws/router:80",
    "tcp/10.0.0.1:7447#iface=eth0",
    "tcp/a:1?prio=1-3",
    "unixsock-stream//tmp/zenoh.sock",
    "unixpipe/zenoh",
    "serial//dev/ttyUSB0",
    "vsock/VMADDR_CID_ANY:7447",
]


@pytest.mark.parametrize("endpoint", VALID)
def test_every_zenoh_endpoint_form_is_accepted_and_zenoh_agrees(endpoint):
    import zenoh

    assert endpoint_problem(endpoint) == ""
    zenoh.Config().insert_json5("connect/endpoints", json.dumps([endpoint]))  # raises on what Zenoh refuses


@pytest.mark.parametrize(
    "endpoint,words",
    [
        ("tcp/", "tcp needs host:port"),
        ("foo/bar", "'foo' is not one of tcp, udp, tls, quic, ws"),
        ("tcp/127.0.0.1:notaport", "tcp needs host:port (a port from 1 to 65535"),
        ("tcp/router", "tcp needs host:port"),
        ("tcp/a:0", "a port from 1 to 65535"),
        ("tcp/a:65536", "a port from 1 to 65535"),
        ("tcp/::1:7447", "an IPv6 host in brackets), e.g. tcp/127.0.0.1:7447 or tcp/[::1]:7447"),
        ("tcp/:7447", "tcp needs host:port"),
        ("tpc/a:1", "(did you mean 'tcp'?); write it as protocol/address, e.g. tcp/a:1"),
        ("127.0.0.1:7447", "write it as protocol/address, e.g. tcp/127.0.0.1:7447"),
        ("tcp/ a:1", "without spaces"),
        ("unixsock-stream/", "no address after unixsock-stream/; e.g. unixsock-stream//tmp/zenoh.sock"),
        ("", "write it as protocol/address"),
        (5, "give a string protocol/address"),
        (None, "give a string protocol/address"),
    ],
)
def test_a_bad_endpoint_is_named_with_what_to_write(endpoint, words):
    why = endpoint_problem(endpoint)
    assert why.startswith(f"{endpoint!r} is not a Zenoh endpoint") and words in why, why


def test_a_listen_endpoint_may_ask_for_any_free_port_a_connect_endpoint_may_not():
    """Port 0 is a server's `listen_endpoints` asking for any free port (what Zenoh does with it); a router to
    connect to on port 0 does not exist."""
    assert endpoint_problem("tcp/127.0.0.1:0", listen=True) == ""
    assert "a port from 1 to 65535" in endpoint_problem("tcp/127.0.0.1:0")
    assert "a port from 0 to 65535, 0: any free port" in endpoint_problem("tcp/127.0.0.1:65536", listen=True)
