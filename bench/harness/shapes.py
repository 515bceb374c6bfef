"""Rate shapes: how the request rate moves over a run, as a multiple of the declared rate.

The load generator draws session starts as a Poisson process at the shape's peak and keeps
each start with probability multiple(t) / peak (thinning), so the arrivals are a Poisson
process whose rate follows the shape, and the same seed gives the same starts. Pure."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Ramp:
    """From `start` x the rate to `end` x the rate, linearly over the run (llm-d's QPS ramp)."""

    start: float
    end: float

    def multiple(self, t: float, seconds: float) -> float:
        return self.start + (self.end - self.start) * min(max(t / seconds, 0.0), 1.0)

    @property
    def peak(self) -> float:
        return max(self.start, self.end)

    @property
    def mean(self) -> float:
        return (self.start + self.end) / 2


@dataclass(frozen=True)
class Bursts:
    """The rate, and `factor` x the rate for `burst_s` seconds every `every_s` seconds, the
    first burst `first_s` into the run: traffic that arrives faster than an engine's KV cache
    can hold its running sequences, so engines preempt."""

    every_s: float
    burst_s: float
    factor: float
    first_s: float = 0.0

    def multiple(self, t: float, seconds: float) -> float:
        if t < self.first_s:
            return 1.0
        return self.factor if (t - self.first_s) % self.every_s < self.burst_s else 1.0

    @property
    def peak(self) -> float:
        return max(self.factor, 1.0)

    @property
    def mean(self) -> float:  # over whole periods
        share = min(self.burst_s / self.every_s, 1.0)
        return 1.0 + (self.factor - 1.0) * share


Shape = Ramp | Bursts
