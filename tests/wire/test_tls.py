"""TLS settings fail fast and say why (missing/bad file, expired, another CA, refused handshake), and
the generated router rules hold on a real mTLS router (eclipse-zenoh 1.10)."""

from __future__ import annotations

import datetime as dt
import json
import sys
import time

import pytest

from bench.security.pki import Pki
from wire.acl import FleetIdentities, router_access_control
from wire.keys import ReplicaKeys
from wire.procs import ChildProcess, free_port
from wire.transport import TlsError, TlsFiles, open_session


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return Pki(tmp_path_factory.mktemp("pki"))


def test_a_missing_file_names_the_file_and_the_fix(pki, tmp_path):
    with pytest.raises(TlsError, match=r"certificate file .*nope.pem.* does not exist"):
        TlsFiles(pki.ca_cert_path.as_posix(), str(tmp_path / "nope.pem"), str(tmp_path / "nope.key")).check()


def test_a_file_that_is_not_pem_is_refused(pki, tmp_path):
    junk = tmp_path / "junk.pem"
    junk.write_text("hello")
    with pytest.raises(TlsError, match="not a PEM certificate"):
        TlsFiles(str(junk)).check()


def test_an_expired_certificate_is_refused_with_its_date(pki):
    now = dt.datetime.now(dt.UTC)
    old = pki.issue("expired-robot", not_before=now - dt.timedelta(days=5), not_after=now - dt.timedelta(days=1))
    with pytest.raises(TlsError, match="expired on"):
        TlsFiles(old.ca, old.cert, old.key).check()


def test_a_certificate_of_another_ca_or_a_wrong_key_is_refused(pki, tmp_path):
    foreign = Pki(tmp_path / "other", ca_name="other").robot("robot-a")
    with pytest.raises(TlsError, match="not signed by the CA"):
        TlsFiles(pki.ca_cert_path.as_posix(), foreign.cert, foreign.key).check()
    mine = pki.robot("robot-a")
    with pytest.raises(TlsError, match="does not belong to certificate"):
        TlsFiles(mine.ca, mine.cert, foreign.key).check()


def test_edge_config_and_server_manifest_refuse_bad_tls_at_construction(pki, tmp_path):
    from edge.remote import ConfigError, RemoteEngineConfig
    from server.manifest import ManifestError, TlsConfig, _build  # noqa: F401

    now = dt.datetime.now(dt.UTC)
    old = pki.issue("expired-2", not_before=now - dt.timedelta(days=5), not_after=now - dt.timedelta(days=1))
    with pytest.raises(ConfigError, match="RemoteEngineConfig.tls_cert: .*expired"):
        RemoteEngineConfig(
            model_id="m", action_names=["a"], state_dim=1, tls_ca=old.ca, tls_cert=old.cert, tls_key=old.key
        )
    with pytest.raises(ManifestError, match="zenoh.tls.connect_certificate: .*expired"):
        _build(
            TlsConfig,
            {"root_ca_certificate": old.ca, "connect_certificate": old.cert, "connect_private_key": old.key},
            "zenoh.tls",
            None,
            "m.yaml",
        )


@pytest.fixture(scope="module")
def secure_router(pki, tmp_path_factory):
    r = pki.router()
    acl = router_access_control(FleetIdentities(("robot-a", "robot-b"), ("r0",)))
    endpoint = f"tls/127.0.0.1:{free_port()}"
    child = ChildProcess(
        [
            sys.executable,
            "-m",
            "wire.transport",
            "--listen",
            endpoint,
            "--tls-ca",
            r.ca,
            "--tls-cert",
            r.cert,
            "--tls-key",
            r.key,
            "--config-json",
            json.dumps({"access_control": acl}),
        ],
        tmp_path_factory.mktemp("router") / "router.log",
        ready_text="router ready",
    ).start(15)
    yield endpoint
    child.stop()


def _session(endpoint, files):
    return open_session(connect=[endpoint], tls=TlsFiles(files.ca, files.cert, files.key), what="test")


def test_a_refused_handshake_fails_fast_with_a_clear_message(pki, secure_router, tmp_path):
    import zenoh

    from wire.transport import make_config

    foreign = Pki(tmp_path / "other", ca_name="other").robot("robot-a")
    t0 = time.monotonic()
    c = make_config("client", connect=[secure_router])  # bypass our own file checks: the router must refuse
    c.insert_json5(
        "transport/link/tls",
        json.dumps(
            {
                "root_ca_certificate": pki.ca_cert_path.as_posix(),
                "enable_mtls": True,
                "connect_certificate": foreign.cert,
                "connect_private_key": foreign.key,
            }
        ),
    )
    with pytest.raises(zenoh.ZError):
        zenoh.open(c)
    with pytest.raises(ConnectionError, match="refused the handshake"):
        open_session(connect=[secure_router], tls=TlsFiles(pki.ca_cert_path.as_posix()), what="no-cert")
    assert time.monotonic() - t0 < 5.0


def test_the_router_rules_keep_a_robot_off_another_robots_keys(pki, secure_router):
    k = ReplicaKeys("arm", "main", "r0")
    a_keys, b_keys = k.client("default", "robot-a"), k.client("default", "robot-b")
    a, b, mon = _session(secure_router, pki.robot("robot-a")), _session(secure_router, pki.robot("robot-b")), None
    try:
        got_b_action, got_a_obs = [], []
        b_sub = b.declare_subscriber(b_keys.action, lambda s: got_b_action.append(s))
        a_spy = a.declare_subscriber(b_keys.action, lambda s: got_a_obs.append(s))  # a reads b's chunks: denied
        server = _session(secure_router, pki.server("r0"))
        obs_seen = []
        srv_sub = server.declare_subscriber(k.all_obs, lambda s: obs_seen.append(str(s.key_expr)))
        # each check is ordered after a delivery that proves the route: no fixed wait for the declarations to
        # reach the router (a loaded host can take longer than any wait picked here)
        deadline = time.monotonic() + 10
        while (len(got_b_action) < 3 or a_keys.obs not in obs_seen) and time.monotonic() < deadline:
            server.put(b_keys.action, b"chunk")  # the server may publish b's chunk; only b receives it
            a.put(b_keys.obs, b"forged")  # a forges b's observation first: dropped by the router...
            a.put(a_keys.obs, b"own")  # ...then its own, on the same link, which passes
            time.sleep(0.05)  # pacing the publisher, not synchronisation: the loop waits for deliveries
        assert len(got_b_action) >= 3 and a_keys.obs in obs_seen, (len(got_b_action), obs_seen)
        assert got_a_obs == []
        assert set(obs_seen) == {a_keys.obs}
        srv_sub.undeclare()
        b_sub.undeclare()
        a_spy.undeclare()
        server.close()
    finally:
        for z in (a, b, mon):
            if z is not None:
                z.close()


def test_an_edge_engine_refused_by_the_router_says_why_and_gives_up_after_max_offline_s(secure_router, tmp_path):
    from edge import make_engine
    from edge.remote import RemoteEngineConfig

    other = Pki(tmp_path / "other", ca_name="other")  # a consistent set of files the router does not trust
    f = other.robot("robot-a")
    eng = make_engine(
        RemoteEngineConfig(
            connect_endpoints=[secure_router],
            model_id="arm",
            action_names=["x"],
            state_dim=1,
            client_uuid="robot-a",
            tls_ca=f.ca,
            tls_cert=f.cert,
            tls_key=f.key,
            max_offline_s=2.0,
            reconnect_initial_backoff_s=0.2,
            reconnect_max_backoff_s=0.5,
        )
    )
    eng.start()
    try:
        deadline = time.monotonic() + 15
        while not eng.failed and time.monotonic() < deadline:
            time.sleep(0.1)  # the engine's own worker retries; we watch its state from outside
        assert eng.failed, "the engine must give up (DEAD) after max_offline_s, not hang"
        assert "refused the handshake" in eng.last_error
    finally:
        eng.stop()
