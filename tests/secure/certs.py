"""Test PKI made at test time with ``cryptography`` (no private key is committed): a CA, a
server certificate for 127.0.0.1/localhost, a client certificate, an expired server
certificate and a second, untrusted CA with a server certificate of its own. EC P-256 keys:
quick to make."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_NOW = dt.datetime.now(dt.UTC)


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path

    @property
    def combined(self) -> Path:
        """Certificate and key in one PEM (baresip's ``sip_certificate``)."""
        path = self.cert.with_suffix(".both.pem")
        if not path.exists():
            path.write_bytes(self.cert.read_bytes() + self.key.read_bytes())
        return path


@dataclass(frozen=True)
class Pki:
    ca: Path  # the trusted CA's certificate (tls_ca_file)
    server: Issued  # 127.0.0.1, ::1 and localhost, signed by the CA
    client: Issued  # a trunk's client certificate, signed by the CA
    expired: Issued  # 127.0.0.1, signed by the CA, expired yesterday
    rogue_ca: Path  # a CA nobody trusts
    rogue: Issued  # 127.0.0.1, signed by the rogue CA


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return path


def _ca(root: Path, cn: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey, Path]:
    key = _key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_NOW - dt.timedelta(days=1))
        .not_valid_after(_NOW + dt.timedelta(days=30))
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    path = root / f"{cn}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert, key, path


def _issue(
    root: Path,
    name: str,
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey, Path],
    *,
    client: bool = False,
    expired: bool = False,
) -> Issued:
    ca_cert, ca_key, _ = ca
    key = _key()
    start, end = (
        (_NOW - dt.timedelta(days=10), _NOW - dt.timedelta(days=1))
        if expired
        else (_NOW - dt.timedelta(days=1), _NOW + dt.timedelta(days=30))
    )
    sans: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
    ]
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    cert_path = root / f"{name}.crt.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return Issued(cert_path, _write_key(key, root / f"{name}.key.pem"))


def make_pki(root: Path) -> Pki:
    root.mkdir(parents=True, exist_ok=True)
    ca = _ca(root, "voxgate-test-ca")
    rogue = _ca(root, "rogue-ca")
    return Pki(
        ca=ca[2],
        server=_issue(root, "server", ca),
        client=_issue(root, "trunk-client", ca, client=True),
        expired=_issue(root, "expired", ca, expired=True),
        rogue_ca=rogue[2],
        rogue=_issue(root, "rogue-server", rogue),
    )
