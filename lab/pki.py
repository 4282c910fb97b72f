"""Certificates for the lab's control plane: a CA, the apiserver's serving pair,
client pairs, and the service-account signing key. Written once per control plane."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=30)


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


class CertificateAuthority:
    """A throwaway CA that signs the lab's serving and client certificates."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(_name("tabby-lab-ca"))
            .issuer_name(_name("tabby-lab-ca"))
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )
        self.cert_path = directory / "ca.crt"
        self.cert_path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        _write_key(directory / "ca.key", self.key)

    def issue(
        self,
        name: str,
        common_name: str,
        *,
        organization: str | None = None,
        server_names: tuple[str, ...] = (),
        server_ips: tuple[str, ...] = (),
    ) -> KeyPair:
        """Sign a leaf: a server certificate when names/IPs are given, else a client one."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        is_server = bool(server_names or server_ips)
        usage = [ExtendedKeyUsageOID.SERVER_AUTH if is_server else ExtendedKeyUsageOID.CLIENT_AUTH]
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, organization))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        )
        if is_server:
            alt: list[x509.GeneralName] = [x509.DNSName(n) for n in server_names]
            alt += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in server_ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        pair = KeyPair(self.directory / f"{name}.crt", self.directory / f"{name}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(pair.key, key)
        return pair


def write_service_account_key(directory: Path) -> Path:
    """The RSA key kube-apiserver signs and verifies service-account tokens with."""
    path = directory / "sa.key"
    _write_key(path, rsa.generate_private_key(public_exponent=65537, key_size=2048))
    return path
