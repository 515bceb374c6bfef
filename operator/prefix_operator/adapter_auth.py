"""Authentication of the adapter: kube-apiserver's front proxy on the aggregated-API port, and
optionally clients of a CA of our own (KEDA) on a second port.

kube-apiserver proxies requests for external.metrics.k8s.io to us over TLS, presenting its
front-proxy client certificate (--proxy-client-cert-file) and naming the real user in request
headers (X-Remote-User, X-Remote-Group, X-Remote-Extra-*). Headers alone prove nothing, so they
are believed only on a connection whose client certificate verifies against the requestheader
CA and whose CN is one of the allowed names: the same rule kube-apiserver's own requestheader
authenticator applies. Everything else gets 401 with a Kubernetes Status body.

The TLS layer (ssl, CERT_OPTIONAL) does the chain verification during the handshake: a
certificate that does not verify never gets a connection. A connection without any certificate
is let through the handshake so that /healthz and /readyz stay reachable for the kubelet's
probes; the middleware below turns it away everywhere else.

Clients that call the adapter directly, like KEDA's metrics-api trigger, can present a client
certificate but cannot add the front proxy's headers. For them, --client-ca-file: a separate CA
whose verified certificates are users in themselves (CN = user, O = groups), the rule of
kube-apiserver's own --client-ca-file. Each CA gets its own listener and TLS context, trusting
that CA alone: ssl cannot tell which of several trusted CAs verified a certificate, and a
client-CA certificate taken for a front-proxy one would let its holder name any user in
X-Remote-User. On the client-CA port the X-Remote-* headers are never read.
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from aiohttp import web

from .external_metrics import status

log = logging.getLogger(__name__)

AUTH_CONFIGMAP_NAMESPACE = "kube-system"
AUTH_CONFIGMAP_NAME = "extension-apiserver-authentication"
UNAUTHENTICATED_PATHS = frozenset({"/healthz", "/readyz", "/livez"})


@dataclass(frozen=True)
class RequestHeaderConfig:
    """kube-apiserver's --requestheader-* settings, as it publishes them."""

    client_ca_pem: str
    allowed_names: frozenset[str] = frozenset()
    username_headers: tuple[str, ...] = ("X-Remote-User",)
    group_headers: tuple[str, ...] = ("X-Remote-Group",)
    extra_headers_prefixes: tuple[str, ...] = ("X-Remote-Extra-",)

    @classmethod
    def from_ca_file(
        cls, path: str | Path, allowed_names: frozenset[str] = frozenset()
    ) -> RequestHeaderConfig:
        return cls(client_ca_pem=Path(path).read_text(), allowed_names=allowed_names)

    @classmethod
    def from_configmap_data(cls, data: Mapping[str, str]) -> RequestHeaderConfig:
        """The data of kube-system/extension-apiserver-authentication (lists are JSON)."""
        ca = data.get("requestheader-client-ca-file") or ""
        if not ca.strip():
            raise ValueError(
                f"ConfigMap {AUTH_CONFIGMAP_NAMESPACE}/{AUTH_CONFIGMAP_NAME} has no "
                "requestheader-client-ca-file: kube-apiserver runs without "
                "--requestheader-client-ca-file, so it cannot proxy to aggregated APIs"
            )

        def strings(key: str, default: tuple[str, ...]) -> tuple[str, ...]:
            raw = data.get(key)
            if not raw:
                return default
            value = json.loads(raw)
            return tuple(str(v) for v in value) if isinstance(value, list) else default

        return cls(
            client_ca_pem=ca,
            allowed_names=frozenset(strings("requestheader-allowed-names", ())),
            username_headers=strings("requestheader-username-headers", cls.username_headers),
            group_headers=strings("requestheader-group-headers", cls.group_headers),
            extra_headers_prefixes=strings(
                "requestheader-extra-headers-prefix", cls.extra_headers_prefixes
            ),
        )

    def authenticate(self, peercert: Mapping[str, Any] | None, headers: Any) -> User | str:
        return authenticate(self, peercert, headers)


@dataclass(frozen=True)
class ClientCertConfig:
    """--client-ca-file: certificates of this CA authenticate by themselves."""

    client_ca_pem: str
    # CNs accepted (empty: any certificate of the CA).
    allowed_names: frozenset[str] = frozenset()

    @classmethod
    def from_ca_file(
        cls, path: str | Path, allowed_names: frozenset[str] = frozenset()
    ) -> ClientCertConfig:
        return cls(client_ca_pem=Path(path).read_text(), allowed_names=allowed_names)

    def authenticate(self, peercert: Mapping[str, Any] | None, headers: Any) -> User | str:
        return authenticate_client_certificate(self, peercert)


Authenticator = RequestHeaderConfig | ClientCertConfig


def server_ssl_context(
    cert_file: str | Path, key_file: str | Path, auth: Authenticator
) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(cert_file), str(key_file))
    ctx.load_verify_locations(cadata=auth.client_ca_pem)
    # OPTIONAL, not REQUIRED: probes come without a certificate (see the module docstring).
    ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def _subject(peercert: Mapping[str, Any] | None, attribute: str) -> list[str]:
    return [
        str(value)
        for rdn in (peercert or {}).get("subject", ())
        for key, value in rdn
        if key == attribute
    ]


def common_name(peercert: Mapping[str, Any] | None) -> str | None:
    """The subject CN of a certificate as ssl.SSLSocket.getpeercert() returns it."""
    names = _subject(peercert, "commonName")
    return names[0] if names else None


def organizations(peercert: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The subject O values, in order: a client certificate's groups (as in Kubernetes)."""
    return tuple(_subject(peercert, "organizationName"))


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...] = ()
    extra: dict[str, list[str]] = field(default_factory=dict)


def authenticate(
    auth: RequestHeaderConfig, peercert: Mapping[str, Any] | None, headers: Mapping[str, str] | Any
) -> User | str:
    """The user the front proxy vouches for, or why the request is refused. `peercert` is
    only ever a certificate the TLS handshake verified against the requestheader CA."""
    if not peercert:
        return "no client certificate: only kube-apiserver's front proxy may call this API"
    cn = common_name(peercert)
    if auth.allowed_names and cn not in auth.allowed_names:
        return f"client certificate CN {cn!r} is not an allowed requestheader name"
    name = next((v for h in auth.username_headers if (v := headers.get(h))), "")
    if not name:
        return "the front proxy named no user"
    getall = getattr(headers, "getall", None)
    groups: list[str] = []
    for h in auth.group_headers:
        groups += getall(h, []) if getall else ([headers[h]] if h in headers else [])
    extra: dict[str, list[str]] = {}
    for key, value in headers.items():  # items(): a repeated header is several values
        for prefix in auth.extra_headers_prefixes:
            if key.lower().startswith(prefix.lower()):
                # kube-apiserver percent-encodes extra keys to fit them in a header name.
                extra.setdefault(unquote(key[len(prefix) :]).lower(), []).append(value)
    return User(name, tuple(groups), extra)


def authenticate_client_certificate(
    auth: ClientCertConfig, peercert: Mapping[str, Any] | None
) -> User | str:
    """The user a client-CA certificate names, or why the request is refused. `peercert` is
    only ever a certificate the TLS handshake verified against the client CA (its listener
    trusts no other). Request headers play no part: nobody vouches for them here."""
    if not peercert:
        return "no client certificate: present a certificate of the client CA"
    cn = common_name(peercert)
    if not cn:
        return "the client certificate has no CN to name its user"
    if auth.allowed_names and cn not in auth.allowed_names:
        return f"client certificate CN {cn!r} is not an allowed client name"
    return User(cn, organizations(peercert))


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def middleware(
    auth: Authenticator,
) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    mode = "client-ca" if isinstance(auth, ClientCertConfig) else "front-proxy"

    @web.middleware
    async def authenticate_request(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in UNAUTHENTICATED_PATHS:
            return await handler(request)
        transport = request.transport
        peercert = transport.get_extra_info("peercert") if transport is not None else None
        outcome = auth.authenticate(peercert, request.headers)
        if isinstance(outcome, str):
            log.info(
                "401 for %s %s from %s (%s): %s",
                request.method,
                request.path_qs,
                request.remote,
                mode,
                outcome,
            )
            return web.json_response(status(401, "Unauthorized", outcome), status=401)
        log.debug(
            "%s %s as %r, groups %s (%s)",
            request.method,
            request.path_qs,
            outcome.name,
            list(outcome.groups),
            mode,
        )
        request["user"] = outcome
        return await handler(request)

    return authenticate_request
