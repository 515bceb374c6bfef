"""The adapter's two listeners as a real process, over real TLS: the `prefix-metrics-adapter`
command on 127.0.0.1 with certificates made here with `cryptography` (a front-proxy CA, a client CA
for KEDA, and a CA nobody trusts), called with urllib.

What the unit tests (test_adapter_auth.py) cannot show: which CA the TLS layer trusts on which
port. A client-CA certificate gets in on the client-CA port only, a front-proxy certificate on
the front-proxy port only, a certificate of an unknown CA on neither (no TLS session at all),
and no certificate gets a 401 Status. Values through the client-CA port, the way KEDA reads
them: tests/k8s/test_adapter_keda.py.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from processes import stop_process  # e2e/cluster, on sys.path from conftest.py
from waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
RESOURCES = "/apis/external.metrics.k8s.io/v1beta1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PKI:
    """CAs and certificates made with the `cryptography` package (EC P-256, one day), written
    as PEM files the adapter and urllib's TLS read."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self._keys: dict[Path, ec.EllipticCurvePrivateKey] = {}
        self._certs: dict[Path, x509.Certificate] = {}

    def _write(self, name: str, crt: x509.Certificate, key: ec.EllipticCurvePrivateKey
               ) -> tuple[Path, Path]:  # fmt: skip
        crt_path, key_path = self.dir / f"{name}.crt", self.dir / f"{name}.key"
        crt_path.write_bytes(crt.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))  # fmt: skip
        self._keys[crt_path], self._certs[crt_path] = key, crt
        return crt_path, key_path

    @staticmethod
    def _name(subject: str) -> x509.Name:
        """"/O=keda/CN=keda-operator" as an X.509 name."""
        oids = {"CN": NameOID.COMMON_NAME, "O": NameOID.ORGANIZATION_NAME}
        parts = [p.split("=", 1) for p in subject.strip("/").split("/")]
        return x509.Name([x509.NameAttribute(oids[k], v) for k, v in parts])

    def _builder(self, subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
                 ) -> x509.CertificateBuilder:  # fmt: skip
        now = datetime.datetime.now(datetime.UTC)
        return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1)))  # fmt: skip

    def ca(self, name: str) -> tuple[Path, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = self._name(f"/CN={name}")
        usage = x509.KeyUsage(digital_signature=False, content_commitment=False,
                              key_encipherment=False, data_encipherment=False,
                              key_agreement=False, key_cert_sign=True, crl_sign=True,
                              encipher_only=False, decipher_only=False)  # fmt: skip
        crt = (self._builder(subject, subject, key)
               .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
               .add_extension(usage, critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                              critical=False)
               .sign(key, hashes.SHA256()))  # fmt: skip
        return self._write(name, crt, key)

    def cert(
        self, name: str, ca: tuple[Path, Path], subject: str, *, server: bool = False
    ) -> tuple[Path, Path]:
        ca_crt, ca_key = self._certs[ca[0]], self._keys[ca[0]]
        key = ec.generate_private_key(ec.SECP256R1())
        usage = x509.KeyUsage(digital_signature=True, content_commitment=False,
                              key_encipherment=False, data_encipherment=False,
                              key_agreement=False, key_cert_sign=False, crl_sign=False,
                              encipher_only=False, decipher_only=False)  # fmt: skip
        purpose = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        b = (self._builder(self._name(subject), ca_crt.subject, key)
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=False)
             .add_extension(usage, critical=True)
             .add_extension(x509.ExtendedKeyUsage([purpose]), critical=False)
             .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                 ca_crt.public_key()), critical=False))  # fmt: skip
        if server:
            b = b.add_extension(x509.SubjectAlternativeName([
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
                critical=False)  # fmt: skip
        return self._write(name, b.sign(ca_key, hashes.SHA256()), key)


class Certs:
    def __init__(self, pki: PKI) -> None:
        self.serving_ca = pki.ca("serving-ca")
        self.serving = pki.cert("serving", self.serving_ca, "/CN=adapter", server=True)
        self.front_proxy_ca = pki.ca("front-proxy-ca")
        self.front_proxy = pki.cert("front-proxy", self.front_proxy_ca, "/CN=front-proxy-client")
        self.client_ca = pki.ca("keda-client-ca")
        self.keda = pki.cert("keda", self.client_ca, "/O=keda/CN=keda-operator")
        # Same CA, a CN the adapter was not told to accept.
        self.other = pki.cert("other", self.client_ca, "/CN=someone-else")
        self.unknown_ca = pki.ca("unknown-ca")
        # Same name as KEDA's, from a CA nobody trusts: the name alone must not get in.
        self.forged = pki.cert("forged", self.unknown_ca, "/O=keda/CN=keda-operator")


class AdapterProcess:
    def __init__(self, certs: Certs, work: Path) -> None:
        self.front_port, self.client_port = free_port(), free_port()
        self.log_path = work / "adapter.log"
        # Credentials for an API server that is not there: nothing here lists models.
        kubeconfig = work / "kubeconfig"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{free_port()}",
                                                   "insecure-skip-tls-verify": True}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "c",
        }))  # fmt: skip
        exe = Path(sys.executable).parent / "prefix-metrics-adapter"
        cmd = [
            str(exe), "--bind-address", "127.0.0.1", "--secure-port", str(self.front_port),
            "--tls-cert-file", str(certs.serving[0]),
            "--tls-private-key-file", str(certs.serving[1]),
            "--requestheader-client-ca-file", str(certs.front_proxy_ca[0]),
            "--requestheader-allowed-names", "front-proxy-client",
            "--client-ca-file", str(certs.client_ca[0]),
            "--client-ca-port", str(self.client_port),
            "--client-allowed-names", "keda-operator",
            "--kubeconfig", str(kubeconfig), "--verbose",
        ]  # fmt: skip
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        stop_process(self.proc, 10)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return Certs(PKI(tmp_path_factory.mktemp("pki")))


@pytest.fixture(scope="module")
def adapter(certs: Certs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AdapterProcess]:
    a = AdapterProcess(certs, tmp_path_factory.mktemp("adapter"))

    def up() -> bool:
        if a.proc.poll() is not None:
            raise AssertionError(f"the adapter exited ({a.proc.returncode}):\n{a.log()}")
        return all(call(certs, p, "/healthz")[0] == 200 for p in (a.front_port, a.client_port))

    try:
        wait_until(up, 30, "the adapter's two listeners")
        yield a
    finally:
        a.stop()


def call(
    certs: Certs,
    port: int,
    path: str,
    cert: tuple[Path, Path] | None = None,
    headers: dict[str, str] | None = None,
    tls12: bool = False,
) -> tuple[int, Any]:
    """One HTTPS GET to the adapter, verifying its serving certificate."""
    ctx = ssl.create_default_context(cafile=str(certs.serving_ca[0]))
    if tls12:
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    if cert is not None:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    req = urllib.request.Request(f"https://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=5) as r:
            raw, status = r.read(), r.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def refused_by_tls(certs: Certs, port: int, cert: tuple[Path, Path]) -> None:
    """A certificate the listener does not trust ends the handshake: never an HTTP answer.

    With TLS 1.2 the server checks the client's certificate inside the handshake, so the
    handshake itself fails (asyncio's TLS server hangs up without an alert, hence an EOF, not
    "unknown ca"); TLS 1.3 checks it after the client has finished its side, and the client
    only sees the connection close before any response (also checked). The same client with
    a trusted certificate gets through both ways (test_..._client_ca_port)."""
    with pytest.raises(urllib.error.URLError) as e:
        call(certs, port, RESOURCES, cert, tls12=True)
    assert isinstance(e.value.reason, ssl.SSLError), e.value
    with pytest.raises(ConnectionError):
        call(certs, port, RESOURCES, cert)


def test_a_client_ca_certificate_gets_in_on_the_client_ca_port(
    certs: Certs, adapter: AdapterProcess
) -> None:
    # A caller may add any header it likes; on this port none of them names the user.
    status, body = call(certs, adapter.client_port, RESOURCES, certs.keda,
                        {"X-Remote-User": "system:admin"})  # fmt: skip
    assert status == 200, body
    assert call(certs, adapter.client_port, RESOURCES, certs.keda, tls12=True)[0] == 200
    assert body["kind"] == "APIResourceList"
    assert {r["name"] for r in body["resources"]} == {
        "prefix_router_working_set_tokens", "prefix_router_in_flight", "prefix_router_demand",
        "prefix_router_queued", "prefix_router_queue_oldest_wait_seconds"}  # fmt: skip
    # The user is the certificate's CN, the groups its O, whatever X-Remote-User said.
    assert f"GET {RESOURCES} as 'keda-operator', groups ['keda'] (client-ca)" in adapter.log()
    assert "'system:admin'" not in adapter.log()


def test_no_certificate_gets_401_on_both_ports(certs: Certs, adapter: AdapterProcess) -> None:
    for port, why in ((adapter.client_port, "present a certificate of the client CA"),
                      (adapter.front_port, "only kube-apiserver's front proxy")):  # fmt: skip
        status, body = call(certs, port, RESOURCES, headers={"X-Remote-User": "admin"})
        assert status == 401, body
        assert body["kind"] == "Status" and body["reason"] == "Unauthorized"
        assert why in body["message"]


def test_a_certificate_of_an_unknown_ca_gets_no_connection(
    certs: Certs, adapter: AdapterProcess
) -> None:
    for port in (adapter.client_port, adapter.front_port):
        refused_by_tls(certs, port, certs.forged)


def test_each_ca_is_trusted_on_its_own_port_only(certs: Certs, adapter: AdapterProcess) -> None:
    # The front proxy's certificate (with the header it would send) on the client-CA port, and
    # KEDA's certificate on the aggregated-API port: neither CA is trusted on the other port.
    refused_by_tls(certs, adapter.client_port, certs.front_proxy)
    refused_by_tls(certs, adapter.front_port, certs.keda)
    # The front-proxy port keeps its rules: certificate of its CA, allowed CN, user header.
    status, body = call(certs, adapter.front_port, RESOURCES, certs.front_proxy,
                        {"X-Remote-User": "system:kube-controller-manager"})  # fmt: skip
    assert status == 200, body
    status, body = call(certs, adapter.front_port, RESOURCES, certs.front_proxy)
    assert status == 401 and "named no user" in body["message"]


def test_a_client_ca_certificate_with_another_cn_is_refused(
    certs: Certs, adapter: AdapterProcess
) -> None:
    status, body = call(certs, adapter.client_port, RESOURCES, certs.other)
    assert status == 401, body
    assert "'someone-else' is not an allowed client name" in body["message"]
