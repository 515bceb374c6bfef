"""Status conditions in the Kubernetes conventions, pure.

One entry per type (a list-map keyed by type); lastTransitionTime moves only when the status
flips, so "since when has this been False" stays answerable while reason and message follow
the latest observation.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

Status = Literal["True", "False", "Unknown"]

READY = "Ready"
MODEL_SERVERS_READY = "ModelServersReady"
ROUTER_READY = "RouterReady"
CACHE_STORE_READY = "CacheStoreReady"
AUTOSCALING_READY = "AutoscalingReady"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"

# Display order; Ready first because it is the one people and tools look for.
ORDER = (READY, MODEL_SERVERS_READY, ROUTER_READY, CACHE_STORE_READY, AUTOSCALING_READY,
         PROGRESSING, DEGRADED)


@dataclass(frozen=True)
class Condition:
    type: str
    status: Status
    reason: str
    message: str = ""

    @property
    def is_true(self) -> bool:
        return self.status == "True"


def timestamp(now: datetime | None = None) -> str:
    now = now or datetime.now(UTC)
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def aggregate_ready(parts: Sequence[Condition], success_message: str = "") -> Condition:
    """Ready = AND of parts; when False, the first False part's reason and message pass up so
    that `kubectl get prm -o wide` names the actual cause."""
    for part in parts:
        if not part.is_true:
            status: Status = "Unknown" if part.status == "Unknown" else "False"
            return Condition(READY, status, part.reason, part.message)
    return Condition(READY, "True", "AllComponentsReady", success_message)


def merge(previous: Iterable[dict[str, Any]] | None, new: Iterable[Condition], *,
          now: str, generation: int) -> list[dict[str, Any]]:
    """The conditions list to write: `new` merged over `previous`.

    Conditions of types not in `new` are kept unchanged (another writer may own them).
    """
    old = {c.get("type"): c for c in (previous or []) if isinstance(c, dict) and c.get("type")}
    out: dict[str, dict[str, Any]] = dict(old)
    for cond in new:
        before = old.get(cond.type)
        flipped = before is None or before.get("status") != cond.status
        ltt = now if flipped or not before.get("lastTransitionTime") else \
            before["lastTransitionTime"]
        out[cond.type] = {
            "type": cond.type,
            "status": cond.status,
            "reason": cond.reason,
            "message": cond.message,
            "lastTransitionTime": ltt,
            "observedGeneration": generation,
        }
    rank = {t: i for i, t in enumerate(ORDER)}
    return sorted(out.values(), key=lambda c: (rank.get(c["type"], len(ORDER)), c["type"]))


def find(conditions: Iterable[dict[str, Any]] | None, type_: str) -> dict[str, Any] | None:
    for c in conditions or []:
        if isinstance(c, dict) and c.get("type") == type_:
            return c
    return None
