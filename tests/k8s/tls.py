"""HTTPS for `FakeKube`, so that in-cluster configuration works against it.

The `kubernetes` client's `load_incluster_config` always builds `https://$KUBERNETES_SERVICE_HOST:
$KUBERNETES_SERVICE_PORT` and trusts only the CA of the service account mount
(`/var/run/secrets/kubernetes.io/serviceaccount/ca.crt`): a plain-HTTP fake API cannot serve it.
`make_tls` makes a throwaway CA and a server certificate for the names a pod uses to reach the API
(`127.0.0.1`, `localhost`, `kubernetes.default.svc`, ...), with `cryptography` (already installed: the
`kubernetes` client needs it through `google-auth`), and `https_server` serves a `FakeKube` (any kmock
handler) with it. `kubernetes_service_env` is what the kubelet injects into every container for the
`kubernetes` service.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.test_utils
import kmock
import yarl
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

API_HOSTS = ("127.0.0.1", "localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc")


@dataclass(frozen=True)
class TLSFiles:
    """PEM files: the CA certificate (a pod's `ca.crt`), the server's certificate and key."""

    ca_cert: Path
    cert: Path
    key: Path

    def server_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert, self.key)
        return context

    def client_context(self) -> ssl.SSLContext:
        """A client context trusting only this CA (as a pod trusts only its `ca.crt`)."""
        return ssl.create_default_context(cafile=str(self.ca_cert))


def make_tls(directory: Path, hosts: Sequence[str] = API_HOSTS, days: int = 2) -> TLSFiles:
    """A fresh CA and a server certificate for `hosts` (IP addresses become IP SANs) in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    valid_from, valid_to = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=days)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "labkube-test-ca")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid_from)
        .not_valid_after(valid_to)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid_from)
        .not_valid_after(valid_to)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    files = TLSFiles(directory / "ca.crt", directory / "tls.crt", directory / "tls.key")
    files.ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key.touch(mode=0o600)
    files.key.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return files


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def https_server_cls(context: ssl.SSLContext) -> type[aiohttp.test_utils.RawTestServer]:
    """A `server_cls` for `kmock.Server` that serves HTTPS with `context`.

    kmock calls `server_cls(handler, host=..., port=...)` and enters it, which calls `start_server()`
    without arguments; aiohttp's `start_server` takes the site's SSL context from an `ssl` keyword.
    """

    class HTTPSTestServer(aiohttp.test_utils.RawTestServer):
        async def start_server(self, loop: Any = None, **kwargs: Any) -> None:
            await super().start_server(loop=loop, ssl=context, **kwargs)

    return HTTPSTestServer


def https_server(handler: kmock.RawHandler, tls: TLSFiles, host: str = "127.0.0.1") -> kmock.Server:
    """`kmock.Server(handler)` over HTTPS; its own client (`server.client`) trusts the CA."""
    client_context = tls.client_context()

    def client(url: yarl.URL) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(ssl=client_context))

    return kmock.Server(handler, host=host, server_cls=https_server_cls(tls.server_context()), client_fct=client)


def kubernetes_service_env(host: str, port: int) -> dict[str, str]:
    """The variables the kubelet gives every container for the `kubernetes` service in `default`
    (the in-cluster config reads the first two). Real clusters publish port 443 in the names of the
    `KUBERNETES_PORT_443_*` variables; the fake API listens on another port, so its number is used."""
    tcp = f"tcp://{host}:{port}"
    prefix = f"KUBERNETES_PORT_{port}_TCP"
    return {
        "KUBERNETES_SERVICE_HOST": host,
        "KUBERNETES_SERVICE_PORT": str(port),
        "KUBERNETES_SERVICE_PORT_HTTPS": str(port),
        "KUBERNETES_PORT": tcp,
        prefix: tcp,
        f"{prefix}_PROTO": "tcp",
        f"{prefix}_PORT": str(port),
        f"{prefix}_ADDR": host,
    }
