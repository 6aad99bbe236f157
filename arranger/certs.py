"""certs makes the TLS material of a small cluster (`arranger certs`): a CA, a server
certificate for the names and addresses clients use, and one client certificate per agent,
with the `cryptography` library. Keys are ECDSA P-256; key files are readable by their owner
only. Larger sites use their own PKI: the server and agents only need PEM files.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 3650


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "arranger"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _alt_names(hosts: Iterable[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def make_certificates(
    out: Path, server_hosts: list[str], agents: list[str], days: int = VALID_DAYS
) -> list[Path]:
    """make_certificates writes ca.pem/ca.key, server.pem/server.key (valid for
    `server_hosts`, plus localhost and 127.0.0.1) and <agent>.pem/<agent>.key for each agent
    into `out`; keys are readable by their owner only. Returns the files written."""
    taken = {"ca", "server"} & set(agents)
    if taken:
        raise ValueError(f"--agent {sorted(taken)[0]}: that name is the CA's or the server's files")
    now = datetime.datetime.now(datetime.UTC)
    out.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("arranger CA"))
        .issuer_name(_name("arranger CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
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
        .sign(ca_key, hashes.SHA256())
    )
    written = _write(out, "ca", ca, ca_key)

    def leaf(name: str, hosts: list[str], usage: x509.ObjectIdentifier) -> None:
        key = _key()
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if hosts:
            builder = builder.add_extension(x509.SubjectAlternativeName(_alt_names(hosts)), False)
        written.extend(_write(out, name, builder.sign(ca_key, hashes.SHA256()), key))

    hosts = list(dict.fromkeys([*server_hosts, "localhost", "127.0.0.1"]))
    leaf("server", hosts, ExtendedKeyUsageOID.SERVER_AUTH)
    for agent in agents:
        leaf(agent, [], ExtendedKeyUsageOID.CLIENT_AUTH)
    return written


def _write(out: Path, name: str, cert: x509.Certificate, key: Any) -> list[Path]:
    cert_path, key_path = out / f"{name}.pem", out / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.touch(mode=0o600)
    key_path.chmod(0o600)
    key_path.write_bytes(_pem_key(key))
    return [cert_path, key_path]
