"""Who a request is and how it waits: its tenant, weight, priority band and cost (prompt tokens
plus expected decode), from its headers and the queue's settings (config.QueueSettings). Pure.

The tenant is the trusted gateway's header (the salt header unless another is named), else a
hash of the Authorization key (never the key itself: it shows in metrics and logs), else one
tenant for all. The band is the gateway's band header, else the tenant's entry, else the
default; a band name nobody configured is the default band (a client cannot invent one).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..config import BandSettings, QueueSettings

ANYONE = "-"


@dataclass(frozen=True, slots=True)
class Class:
    tenant: str
    weight: float
    band: int  # index in the bands, 0 the highest
    cost: float  # prompt tokens + expected decode tokens


def tenant_of_key(authorization: str) -> str:
    return "key:" + hashlib.sha256(authorization.encode()).hexdigest()[:16]


def expected_decode(body: Mapping[str, Any], default: int) -> float:
    for name in ("max_completion_tokens", "max_tokens"):
        v = body.get(name)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return float(v)
    return float(default)


class Classifier:
    __slots__ = ("_band_header", "_bands", "_default", "_s", "_tenant_header")

    def __init__(self, s: QueueSettings, salt_header: str | None) -> None:
        self._s = s
        self._tenant_header = s.tenant_header or salt_header
        self._band_header = s.band_header
        self._bands = {b.name: i for i, b in enumerate(s.bands)}
        self._default = self._bands[s.default_band]

    @property
    def bands(self) -> list[BandSettings]:
        return self._s.bands

    def tenant(self, headers: Mapping[str, str]) -> str:
        if self._tenant_header:
            t = headers.get(self._tenant_header)
            if t:
                return t
        auth = headers.get("Authorization")
        return tenant_of_key(auth) if auth else ANYONE

    def classify(
        self, headers: Mapping[str, str], prompt_tokens: float, body: Mapping[str, Any]
    ) -> Class:
        tenant = self.tenant(headers)
        entry = self._s.tenants.get(tenant)
        band = None
        if self._band_header:
            band = self._bands.get(headers.get(self._band_header, ""))
        if band is None and entry is not None and entry.band:
            band = self._bands[entry.band]
        if band is None:
            band = self._default
        cost = prompt_tokens + expected_decode(body, self._s.default_decode_tokens)
        return Class(tenant, entry.weight if entry else 1.0, band, cost)
