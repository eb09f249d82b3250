"""A throw-away PKI for one local cluster: a CA, serving and client certificates, the SA key pair."""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = dt.timedelta(days=30)
_SERVER_SANS_DNS = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
_SERVER_SANS_IP = ("127.0.0.1", "10.96.0.1")
# Client identities: file stem -> (CN, O).
CLIENTS = {
    "admin": ("devstack-admin", "system:masters"),
    "kube-controller-manager": ("system:kube-controller-manager", None),
}


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _write_key(path: Path, key: rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _sign(
    subject: x509.Name,
    key: rsa.RSAPrivateKey,
    ca_cert: x509.Certificate | None,
    ca_key: rsa.RSAPrivateKey,
    *,
    is_ca: bool = False,
    usages: list[x509.ObjectIdentifier] | None = None,
    sans: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject if ca_cert else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
    )
    if is_ca:
        builder = builder.add_extension(
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
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def generate(pki: Path) -> None:
    """Write ca.{crt,key}, apiserver.{crt,key}, one pair per client in CLIENTS, and sa.{key,pub}."""
    pki.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_cert = _sign(_name("posttrain-devstack-ca"), ca_key, None, ca_key, is_ca=True)
    _write_key(pki / "ca.key", ca_key)
    _write_cert(pki / "ca.crt", ca_cert)

    server_key = _key()
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in _SERVER_SANS_DNS]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in _SERVER_SANS_IP]
    server_cert = _sign(
        _name("kube-apiserver"),
        server_key,
        ca_cert,
        ca_key,
        usages=[ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
        sans=sans,
    )
    _write_key(pki / "apiserver.key", server_key)
    _write_cert(pki / "apiserver.crt", server_cert)

    for stem, (cn, org) in CLIENTS.items():
        key = _key()
        cert = _sign(_name(cn, org), key, ca_cert, ca_key, usages=[ExtendedKeyUsageOID.CLIENT_AUTH])
        _write_key(pki / f"{stem}.key", key)
        _write_cert(pki / f"{stem}.crt", cert)

    sa_key = _key()
    _write_key(pki / "sa.key", sa_key)
    (pki / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
