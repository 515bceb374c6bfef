"""The adapter's authentication rules (pure part): the front proxy's, and the client CA's. The
TLS side (which CA each port trusts; a certificate that does not verify never gets a
connection) runs over real TLS in tests/operator/test_adapter_client_ca.py and against real
kube-apiserver certificates in tests/k8s/test_metrics_adapter.py."""

from __future__ import annotations

import json

import pytest
from multidict import CIMultiDict

from prefix_operator.adapter_auth import (
    ClientCertConfig,
    RequestHeaderConfig,
    User,
    authenticate,
    authenticate_client_certificate,
    common_name,
    organizations,
)

# The shape ssl.SSLSocket.getpeercert() returns for a verified certificate.
FRONT_PROXY = {"subject": ((("organizationName", "k8s"),), (("commonName", "front-proxy-client"),))}
AUTH = RequestHeaderConfig(
    client_ca_pem="-----BEGIN CERTIFICATE-----\n...",
    allowed_names=frozenset({"front-proxy-client"}),
)


def headers(*pairs: tuple[str, str]) -> CIMultiDict[str]:
    return CIMultiDict(pairs)


def test_the_front_proxy_vouches_for_the_user() -> None:
    h = headers(
        ("X-Remote-User", "system:serviceaccount:kube-system:horizontal-pod-autoscaler"),
        ("X-Remote-Group", "system:serviceaccounts"),
        ("X-Remote-Group", "system:authenticated"),
        ("X-Remote-Extra-Scopes", "a"),
        ("X-Remote-Extra-Scopes", "b"),
        ("X-Remote-Extra-Example.com%2fteam", "ml"),
    )
    user = authenticate(AUTH, FRONT_PROXY, h)
    assert user == User(
        "system:serviceaccount:kube-system:horizontal-pod-autoscaler",
        ("system:serviceaccounts", "system:authenticated"),
        {"scopes": ["a", "b"], "example.com/team": ["ml"]},
    )


@pytest.mark.parametrize(
    ("peercert", "hdrs", "why"),
    [
        (None, headers(("X-Remote-User", "admin")), "no client certificate"),
        ({}, headers(("X-Remote-User", "admin")), "no client certificate"),
        (
            {"subject": ((("commonName", "intruder"),),)},
            headers(("X-Remote-User", "admin")),
            "not an allowed requestheader name",
        ),
        (FRONT_PROXY, headers(), "named no user"),
    ],
)
def test_everything_else_is_refused(
    peercert: dict | None, hdrs: CIMultiDict[str], why: str
) -> None:
    outcome = authenticate(AUTH, peercert, hdrs)
    assert isinstance(outcome, str) and why in outcome


def test_empty_allowed_names_accept_any_cn_of_the_ca() -> None:
    # kube-apiserver's rule: with no --requestheader-allowed-names, the CA alone decides.
    open_auth = RequestHeaderConfig(client_ca_pem="x")
    cert = {"subject": ((("commonName", "aggregator"),),)}
    assert authenticate(open_auth, cert, headers(("X-Remote-User", "u"))) == User("u")


def test_configmap_as_kube_apiserver_publishes_it() -> None:
    data = {
        "client-ca-file": "CLUSTER CA (not ours to trust for proxying)",
        "requestheader-client-ca-file": "FRONT PROXY CA",
        "requestheader-allowed-names": json.dumps(["front-proxy-client", "aggregator"]),
        "requestheader-username-headers": json.dumps(["X-Remote-User"]),
        "requestheader-group-headers": json.dumps(["X-Remote-Group"]),
        "requestheader-extra-headers-prefix": json.dumps(["X-Remote-Extra-"]),
    }
    cfg = RequestHeaderConfig.from_configmap_data(data)
    assert cfg.client_ca_pem == "FRONT PROXY CA"
    assert cfg.allowed_names == {"front-proxy-client", "aggregator"}
    assert cfg.username_headers == ("X-Remote-User",)
    with pytest.raises(ValueError, match="requestheader-client-ca-file"):
        RequestHeaderConfig.from_configmap_data({"client-ca-file": "x"})
    minimal = RequestHeaderConfig.from_configmap_data({"requestheader-client-ca-file": "CA"})
    assert minimal.allowed_names == frozenset()
    assert minimal.group_headers == ("X-Remote-Group",)


def test_common_name() -> None:
    assert common_name(FRONT_PROXY) == "front-proxy-client"
    assert common_name({"subject": ((("organizationName", "x"),),)}) is None
    assert common_name(None) is None


# --------------------------------------------------------------------------- client CA (KEDA)

CLIENT_AUTH = ClientCertConfig(client_ca_pem="CLIENT CA")
KEDA = {
    "subject": (
        (("organizationName", "keda"),),
        (("organizationName", "autoscalers"),),
        (("commonName", "keda-operator"),),
    )
}


def test_a_client_ca_certificate_is_its_own_user() -> None:
    # CN names the user, each O a group, in order: Kubernetes' rule for client certificates.
    assert organizations(KEDA) == ("keda", "autoscalers")
    assert authenticate_client_certificate(CLIENT_AUTH, KEDA) == User(
        "keda-operator", ("keda", "autoscalers")
    )
    assert CLIENT_AUTH.authenticate(KEDA, headers()) == User(
        "keda-operator", ("keda", "autoscalers")
    )


def test_client_ca_ignores_front_proxy_headers() -> None:
    # Nobody vouches for headers on the client-CA port: a holder of a KEDA certificate must not
    # be able to name another user or add groups.
    h = headers(("X-Remote-User", "system:admin"), ("X-Remote-Group", "system:masters"))
    assert CLIENT_AUTH.authenticate(KEDA, h) == User("keda-operator", ("keda", "autoscalers"))


@pytest.mark.parametrize(
    ("auth", "peercert", "why"),
    [
        (CLIENT_AUTH, None, "no client certificate"),
        (CLIENT_AUTH, {}, "no client certificate"),
        (CLIENT_AUTH, {"subject": ((("organizationName", "keda"),),)}, "has no CN"),
        (
            ClientCertConfig("CLIENT CA", frozenset({"keda-operator"})),
            {"subject": ((("commonName", "someone-else"),),)},
            "not an allowed client name",
        ),
    ],
)
def test_client_ca_refusals(auth: ClientCertConfig, peercert: dict | None, why: str) -> None:
    outcome = auth.authenticate(peercert, headers())
    assert isinstance(outcome, str) and why in outcome


def test_the_front_proxy_rule_is_unchanged_by_the_client_ca() -> None:
    # A front-proxy certificate still needs the user header: the certificate alone is no user.
    assert "named no user" in AUTH.authenticate(FRONT_PROXY, headers())
    assert AUTH.authenticate(FRONT_PROXY, headers(("X-Remote-User", "u"))) == User("u")
