"""Each backend's step rhythm, read from the times its streamed tokens reach the router.

An engine with continuous batching (vLLM, SGLang) runs in steps: each step decodes one token
for every running sequence (and prefills what fits), and a request that arrives mid-step waits
for that step to end before its own prefill starts. On a 70B model a decode step takes 15-30
ms, so for a cache hit whose own prefill is a few hundred tokens that wait is a large share of
its time to first token. Every step ends with one streamed token per running sequence, written
at once, so the router sees each backend's step ends as bursts of chunks. From them it knows
when a backend's current step should end, and so, among backends that are otherwise equal,
which one would start this request's prefill soonest.

What the router sees lags the engine twice: a request reaches the engine some time after it
is sent, and a burst reaches the router some time after the step ended. Their sum, the lead,
is learned per backend from the streams' first tokens: a request's first token comes in the
burst after the step that admitted it, so the request reached the engine between the two
bursts before that one. Each first token bounds the lead to one interval; the lead is where
most recent intervals agree.

Pure logic: callers pass the time (seconds, one monotonic clock).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

# Chunks closer together than this belong to one step's burst. A step takes milliseconds
# (a decode step of even a small model takes several); one step's tokens reach the router
# well within a millisecond of each other, give or take a busy event loop.
BURST_GAP_S = 0.002
# A backend not heard from for this long tells nothing about its rhythm any more.
STALE_S = 1.0
_ALPHA = 0.1  # EWMA weight of each new step length
# The lead is voted for in bins of this width, up to LEAD_MAX_S (a lead beyond it would be a
# network slower than the steps themselves: the rhythm could not be read through it anyway).
_BIN_S = 0.00025
LEAD_MAX_S = 0.010
_BINS = round(LEAD_MAX_S / _BIN_S)
_KEEP = 1.0 - 1.0 / 200  # each vote's weight fades over the next ~200 first tokens
LEAD_PRIOR_S = 0.002  # until a backend's first tokens tell: about what loopback shows


@dataclass(slots=True)
class _Rhythm:
    last: float  # the newest chunk
    bursts: deque[float] = field(default_factory=lambda: deque(maxlen=4))  # their starts
    step: float = 0.0  # EWMA of the backend's usual step length; 0 until two bursts were seen
    votes: list[float] = field(default_factory=lambda: [0.0] * _BINS)
    lead: float = LEAD_PRIOR_S


class StepClock:
    __slots__ = ("_rhythm",)

    def __init__(self) -> None:
        self._rhythm: dict[str, _Rhythm] = {}

    def beat(self, backend: str, now: float) -> None:
        """A streamed chunk from `backend` arrived at `now`."""
        r = self._rhythm.get(backend)
        if r is None:
            r = self._rhythm[backend] = _Rhythm(now)
            r.bursts.append(now)
            return
        if now - r.last > BURST_GAP_S:
            if now - r.last < STALE_S:
                length = now - r.bursts[-1]
                if not r.step:
                    r.step = length
                elif length < 1.5 * r.step:
                    # The usual step is a decode step; a longer one is prefilling some prompt,
                    # which the router sees coming through pending prefill, not the rhythm.
                    r.step += _ALPHA * (length - r.step)
            else:
                r.bursts.clear()  # a silence: the bursts before it are no step boundaries
            r.bursts.append(now)
        r.last = now

    def first_token(self, backend: str, sent: float, now: float) -> None:
        """The first chunk of a stream sent to `backend` at `sent` arrived at `now`."""
        self.beat(backend, now)
        r = self._rhythm[backend]
        b = r.bursts
        if len(b) < 3:
            return
        lo = b[-3] - sent
        hi = b[-2] - sent
        if hi <= 0.0 or lo >= LEAD_MAX_S:
            return  # a step without streams to mark its end: these bursts are not its bounds
        votes = r.votes
        for i in range(_BINS):
            votes[i] *= _KEEP
        first = max(int(lo / _BIN_S), 0)
        for i in range(first, min(int(hi / _BIN_S) + 1, _BINS)):
            votes[i] += 1.0
        top = max(votes)
        # the middle of the bins that got the most votes
        best = [i for i, v in enumerate(votes) if v >= top * 0.999]
        r.lead = (best[len(best) // 2] + 0.5) * _BIN_S

    def wait(self, backend: str, now: float) -> float | None:
        """Seconds until `backend` would start a request sent now; None when its rhythm is
        unknown (no stream heard from lately)."""
        r = self._rhythm.get(backend)
        if r is None or not r.step or now - r.last > STALE_S:
            return None
        seen = now - r.bursts[-1]
        if seen > r.step + BURST_GAP_S:
            # A step already longer than usual is some prefill whose end the rhythm cannot
            # tell: half a usual step, as for an arrival at a random time.
            return 0.5 * r.step
        return r.step - (seen + r.lead) % r.step

    def lead(self, backend: str) -> float | None:
        r = self._rhythm.get(backend)
        return None if r is None else r.lead

    def step(self, backend: str) -> float | None:
        r = self._rhythm.get(backend)
        return r.step if r is not None and r.step else None

    def forget(self, backend: str) -> None:
        self._rhythm.pop(backend, None)
