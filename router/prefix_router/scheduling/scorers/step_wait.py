"""Step wait: among the backends that hold the whole match, the one whose engine step in
progress ends soonest starts this request's prefill soonest (steps.py reads each backend's
rhythm from its streamed tokens). Each millisecond of wait costs `step_wait_tokens_per_ms`.

It only chooses among the holders, relative to the soonest of them: it never moves a request
off its prefix's owners (a long step on the owner, seconds of prefill under overload, would
outweigh thousands of matched tokens), and it says nothing on a miss: where a new prefix goes
decides where all its later requests go, which is for load and eviction to decide. A holder
whose rhythm is unknown gets the mean wait of the backends whose rhythm is known, so not
knowing neither draws nor repels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...config import RouterSettings
from ...steps import StepClock
from ..candidate import Ask, Candidate


def build(s: RouterSettings, signals: object) -> StepWait | None:
    if not s.step_wait_tokens_per_ms:
        return None
    return StepWait(s.step_wait_tokens_per_ms * 1000.0, signals.steps)  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class StepWait:
    per_s: float  # prefill tokens a second of wait costs
    steps: StepClock

    def __call__(self, cands: Sequence[Candidate], ask: Ask) -> list[float] | None:
        best = ask.best_match
        if not best:
            return None
        wait = self.steps.wait
        now = ask.now
        waits = [wait(c.name, now) for c in cands]
        known = [w for w in waits if w is not None]
        if not known:
            return None
        mean = sum(known) / len(known)
        held = [
            (i, mean if w is None else w)
            for i, (c, w) in enumerate(zip(cands, waits, strict=True))
            if c.matched_blocks == best
        ]
        soonest = min(w for _, w in held)
        per_s = self.per_s
        out = [0.0] * len(cands)
        for i, w in held:
            out[i] = -per_s * (w - soonest)
        return out
