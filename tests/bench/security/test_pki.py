"""The bench PKI helper: one CA, leaves named by identity, keys never readable by others."""

from __future__ import annotations

import datetime as dt
import os
import stat

import pytest
from cryptography import x509

from bench.security.pki import Pki, server_cn
from wire.transport import TlsFiles, common_name


def test_robot_router_and_server_certificates_chain_to_the_ca_with_the_identity_as_cn(tmp_path):
    pki = Pki(tmp_path / "pki")
    robot, router, server = pki.robot("honest-0"), pki.router(), pki.server("r0")
    ca = x509.load_pem_x509_certificate(open(robot.ca, "rb").read())
    for files, cn in ((robot, "honest-0"), (router, "router"), (server, server_cn("r0"))):
        cert = x509.load_pem_x509_certificate(open(files.cert, "rb").read())
        assert common_name(cert) == cn
        cert.verify_directly_issued_by(ca)
        TlsFiles(files.ca, files.cert, files.key).check()
    san = (
        x509.load_pem_x509_certificate(open(router.cert, "rb").read())
        .extensions.get_extension_for_class(x509.SubjectAlternativeName)
        .value
    )
    assert "localhost" in san.get_values_for_type(x509.DNSName)  # robots verify the router's name


def test_keys_are_0600_and_the_directory_0700(tmp_path):
    pki = Pki(tmp_path / "pki")
    files = pki.robot("honest-1")
    assert stat.S_IMODE(os.stat(files.key).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(pki.ca_key_path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "pki").st_mode) == 0o700


def test_the_ca_is_reused_across_instances_and_another_pki_is_another_ca(tmp_path):
    a1 = Pki(tmp_path / "a").ca_cert_path.read_bytes()
    assert Pki(tmp_path / "a").ca_cert_path.read_bytes() == a1
    assert Pki(tmp_path / "b").ca_cert_path.read_bytes() != a1


def test_validity_can_be_set_for_expired_certificate_tests(tmp_path):
    now = dt.datetime.now(dt.UTC)
    files = Pki(tmp_path / "pki").issue(
        "old", not_before=now - dt.timedelta(days=3), not_after=now - dt.timedelta(days=1)
    )
    cert = x509.load_pem_x509_certificate(open(files.cert, "rb").read())
    assert cert.not_valid_after_utc < now


def test_a_router_certificate_names_the_addresses_it_listens_on_and_a_node_routers_its_node(tmp_path):
    pki = Pki(tmp_path)
    hub = x509.load_pem_x509_certificate(open(pki.router(hosts=("10.0.0.1", "head.example")).cert, "rb").read())
    node = x509.load_pem_x509_certificate(open(pki.node_router("5d2dca76ab12", "10.0.0.7").cert, "rb").read())

    def names(cert) -> set[str]:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        return {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} | set(san.get_values_for_type(x509.DNSName))

    assert names(hub) == {"127.0.0.1", "localhost", "10.0.0.1", "head.example"}
    assert names(node) == {"127.0.0.1", "localhost", "10.0.0.7", "5d2dca76ab12.node.invalid"}
    # a node router's CN is its role (the access rules admit it, whichever node); its node is in the SAN and file
    assert common_name(node) == "node-router" and common_name(hub) == "router"
    assert (tmp_path / "router-5d2dca76ab12.pem").is_file() and (tmp_path / "router-5d2dca76ab12.key").is_file()


def _pki(*args) -> int:
    from bench.cli import main

    return main(["pki", *map(str, args)])


@pytest.mark.parametrize("days", [0, -5, 3651, 1_000_000_000])
def test_a_validity_outside_1_to_3650_days_is_refused_before_any_file(tmp_path, capsys, days):
    """0 wrote certificates already expired (and a CA later runs reuse); -5 and 1e9 were tracebacks."""
    assert _pki("--dir", tmp_path / "pki", "--robot", "r1", "--days", days) == 2
    assert f"certificates valid for {days} days (--days): give 1 to 3650 days" in capsys.readouterr().err
    assert not (tmp_path / "pki").exists()


@pytest.mark.parametrize(
    "robot, says",
    [
        ("*", "--robot '*' contains '*'"),
        ("a/b", "--robot 'a/b' contains '/'"),
        ("", "--robot is empty"),
    ],
)
def test_a_robot_name_the_key_layer_refuses_is_refused_before_any_file(tmp_path, capsys, robot, says):
    """A CN the router's rules cannot name: `*` was written as robot-*.pem, `a/b` and "" were tracebacks."""
    assert _pki("--dir", tmp_path / "pki", "--robot", "ok", "--robot", robot) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "pki").exists()


def test_an_acl_file_in_a_missing_directory_is_refused_before_the_certificates(tmp_path, capsys):
    assert _pki("--dir", tmp_path / "pki", "--robot", "r1", "--acl", tmp_path / "missing" / "acl.json") == 2
    assert "its directory does not exist" in capsys.readouterr().err
    assert not (tmp_path / "pki").exists()


def test_a_dir_that_is_a_file_or_holds_no_readable_ca_is_refused(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert _pki("--dir", tmp_path / "file") == 2
    assert "is a file; the PKI needs a directory" in capsys.readouterr().err
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "ca.pem").write_text("garbage\n")
    (tmp_path / "bad" / "ca.key").write_text("garbage\n")
    assert _pki("--dir", tmp_path / "bad", "--robot", "r1") == 2
    err = capsys.readouterr().err
    assert "ca.pem' is not a PEM certificate" in err and "remove ca.pem and ca.key" in err
    assert sorted(p.name for p in (tmp_path / "bad").iterdir()) == ["ca.key", "ca.pem"]


def test_an_expired_ca_is_not_reused(tmp_path, capsys):
    pki = Pki(tmp_path / "pki", days=1)
    now = dt.datetime.now(dt.UTC)
    old = pki.issue("old-ca", not_before=now - dt.timedelta(days=3), not_after=now - dt.timedelta(days=1))
    os.replace(old.cert, pki.ca_cert_path)  # any expired certificate with a key stands in for an expired CA
    os.replace(old.key, pki.ca_key_path)
    assert _pki("--dir", tmp_path / "pki", "--robot", "r1") == 2
    assert "expired at" in capsys.readouterr().err


def test_an_existing_directory_keeps_its_mode(tmp_path):
    """`--dir .` closed the repository to everyone else: only a directory the PKI makes is 0700."""
    os.chmod(tmp_path, 0o755)
    assert _pki("--dir", tmp_path, "--robot", "r1") == 0
    assert stat.S_IMODE(os.stat(tmp_path).st_mode) == 0o755
    assert stat.S_IMODE(os.stat(tmp_path / "robot-r1.key").st_mode) == 0o600
