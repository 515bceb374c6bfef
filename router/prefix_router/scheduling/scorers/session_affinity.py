"""Session affinity: a request whose client names its session is worth `session_weight_tokens`
on the engine that served that session last, where its history is most likely still cached
even when the index has lost track of it. Like every scorer it only ranks the candidates the
load bound let through: it never sends a session to an overloaded engine."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...config import RouterSettings
from ...sessions import Sessions
from ..candidate import Ask, Candidate

if TYPE_CHECKING:
    from . import Signals


def build(s: RouterSettings, signals: Signals) -> SessionAffinity | None:
    if not s.session_header or not s.session_weight_tokens:
        return None
    return SessionAffinity(s.session_weight_tokens, signals.sessions)


@dataclass(frozen=True, slots=True)
class SessionAffinity:
    weight: float  # prefill tokens the session's last engine is worth
    sessions: Sessions

    def __call__(self, cands: Sequence[Candidate], ask: Ask) -> list[float] | None:
        if ask.session is None:
            return None
        last = self.sessions.last(ask.session)
        if last is None:
            return None
        w = self.weight
        return [w if c.name == last else 0.0 for c in cands]
