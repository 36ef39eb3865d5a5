"""A throw-away PKI for bench runs and tests: one CA, a certificate per robot, replica and router.

    ca.pem ──signs──► router.pem     (CN router, SAN 127.0.0.1 + localhost: robots verify the name)
                 ├──► router-<node>.pem      (a cluster node's router: CN node-router, the role the access rules
                 │                            admit; SAN its node's address and `<node>.node.invalid`, its node)
                 ├──► server-<replica>.pem   (CN server-<replica>)
                 └──► robot-<uuid>.pem       (CN = the robot's client uuid: the router's access rules key on it)

Files land in one directory (the run directory's `pki/`), keys with mode 0600 and the directory
0700 when the PKI creates it (an existing directory keeps its mode: `--dir .` must not close a repository).
A directory whose `ca.pem`/`ca.key` cannot be read as a CA, or whose CA has expired, is refused
(`PkiError`) before anything is written. Real fleets bring their own CA and certificates (docs/security.md says how); nothing here is
needed on a robot: the edge only reads the three files it is given.

Invariant: a certificate's common name is exactly the identity the access rules name (the client
uuid, `server-<replica>`, `router`, `node-router`), and every certificate is signed by `ca.pem` of the same
directory unless it was issued by another `Pki` on purpose (the foreign-CA intruder).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

ROUTER_CN = "router"
# Every node router's CN, whichever node: the rules admit the role, so a router started mid-run on a node that
# had none is admitted without rewriting them (Zenoh reads access rules only at start). Its node is named in its
# certificate's SAN (`node_router_name`) and file name, and in summary.json's cluster.nodes.
NODE_ROUTER_CN = "node-router"


MAX_DAYS = 3650  # a throw-away CA: ten years outlasts any test or bench run, and stays far inside X.509's dates


class PkiError(ValueError):
    """A directory or validity the PKI cannot use; the message names it and what to do."""


def node_router_name(node: str) -> str:
    """The DNS name a node router's certificate carries for its node (never resolved: `.invalid` is reserved)."""
    return f"{node}.node.invalid"


def server_cn(replica_id: str) -> str:
    return f"server-{replica_id}"


@dataclass(frozen=True)
class Issued:
    """The three files a Zenoh TLS side needs (wire.transport.TlsFiles takes them as is)."""

    ca: str
    cert: str
    key: str


class Pki:
    """A CA in `directory` (created on first use, reused afterwards) that issues leaf certificates."""

    def __init__(self, directory: str | Path, ca_name: str = "fleet-bench-ca", days: int = 30):
        try:
            from cryptography import x509  # noqa: F401
        except ImportError as exc:  # the edge's plain install does not need it; the bench does
            raise RuntimeError("the PKI helper needs the `cryptography` package: pip install -e .[sim]") from exc
        if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= MAX_DAYS:
            raise PkiError(f"certificates valid for {days} days (--days): give 1 to {MAX_DAYS} days")
        self.dir = Path(directory)
        self.ca_name = ca_name
        self.days = days
        self.ca_cert_path = self.dir / "ca.pem"
        self.ca_key_path = self.dir / "ca.key"
        if self.dir.exists() and not self.dir.is_dir():
            raise PkiError(f"{str(self.dir)!r} is a file; the PKI needs a directory (a new one is created 0700)")
        if self.ca_cert_path.exists():
            self._ca()  # refuse an unreadable or expired CA before writing anything
            return
        if not self.dir.exists():
            self.dir.mkdir(parents=True)
            os.chmod(self.dir, 0o700)  # only a directory it made: an existing one (`--dir .`) keeps its mode
        self._make_ca()

    # -- the CA -----------------------------------------------------------------------------------
    def _make_ca(self) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, self.ca_name)])
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=self.days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        _write_key(self.ca_key_path, key)
        _write_public(self.ca_cert_path, cert)

    def _ca(self):
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization

        fix = f"remove ca.pem and ca.key from {str(self.dir)!r} for a new CA, or use another directory"
        if not self.ca_key_path.is_file():
            raise PkiError(f"{str(self.ca_cert_path)!r} has no ca.key beside it; {fix}")
        try:
            cert = x509.load_pem_x509_certificate(self.ca_cert_path.read_bytes())
        except ValueError as exc:
            raise PkiError(f"{str(self.ca_cert_path)!r} is not a PEM certificate ({exc}); {fix}") from None
        try:
            key = serialization.load_pem_private_key(self.ca_key_path.read_bytes(), password=None)
        except (ValueError, TypeError) as exc:  # TypeError: a key that needs a password
            raise PkiError(f"{str(self.ca_key_path)!r} is not an unencrypted PEM key ({exc}); {fix}") from None
        if cert.not_valid_after_utc <= _now():
            raise PkiError(
                f"the CA in {str(self.ca_cert_path)!r} expired at {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC; {fix}"
            )
        return cert, key

    # -- leaves -----------------------------------------------------------------------------------
    def issue(
        self,
        common_name: str,
        *,
        server: bool = False,
        file_stem: str | None = None,
        not_before: dt.datetime | None = None,
        not_after: dt.datetime | None = None,
        hosts: tuple[str, ...] = (),
    ) -> Issued:
        """A certificate + key for `common_name`; `server` adds the 127.0.0.1/localhost names a router needs, and
        `hosts` (IP addresses or DNS names) the other addresses it listens on (a cluster node's).
        `not_before`/`not_after` exist for tests (an expired certificate)."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        ca_cert, ca_key = self._ca()
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        b = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before or now - dt.timedelta(minutes=5))
            .not_valid_after(not_after or now + dt.timedelta(days=self.days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH]),
                critical=False,
            )
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        )
        names: list = [x509.DNSName(common_name if _dns_safe(common_name) else "leaf.invalid")]
        if server:
            names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            for h in hosts:
                if h in ("localhost", "127.0.0.1"):
                    continue
                try:
                    names.append(x509.IPAddress(ipaddress.ip_address(h)))
                except ValueError:
                    names.append(x509.DNSName(h))
        b = b.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = b.sign(ca_key, hashes.SHA256())
        stem = file_stem or common_name
        cert_path, key_path = self.dir / f"{stem}.pem", self.dir / f"{stem}.key"
        _write_key(key_path, key)
        _write_public(cert_path, cert)
        return Issued(str(self.ca_cert_path), str(cert_path), str(key_path))

    def router(self, hosts: tuple[str, ...] = ()) -> Issued:
        return self.issue(ROUTER_CN, server=True, hosts=hosts)

    def node_router(self, node: str, host: str) -> Issued:
        """A cluster node's router (bench.run.mesh): CN `node-router` (the role), its own key, named for the address
        it listens on and for its node (`node_router_name`); files `router-<node>.pem`/`.key`."""
        return self.issue(NODE_ROUTER_CN, server=True, hosts=(host, node_router_name(node)), file_stem=f"router-{node}")

    def server(self, replica_id: str) -> Issued:
        return self.issue(server_cn(replica_id))

    def robot(self, client_uuid: str) -> Issued:
        return self.issue(client_uuid, file_stem=f"robot-{client_uuid}")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _dns_safe(name: str) -> bool:
    return all(c.isalnum() or c in "-." for c in name) and not name.startswith(("-", "."))


def _write_key(path: Path, key) -> None:
    from cryptography.hazmat.primitives import serialization

    data = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # never world-readable, not even briefly
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600)


def _write_public(path: Path, cert) -> None:
    from cryptography.hazmat.primitives import serialization

    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    os.chmod(path, 0o644)
