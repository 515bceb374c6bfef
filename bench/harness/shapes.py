"""Rate shapes: the rate over a run as a multiple of the declared rate. Session starts are
drawn at the shape's peak and kept with probability multiple(t) / peak (thinning): a Poisson
process whose rate follows the shape, the same for the same seed. Pure."""

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


@dataclass(frozen=True)
class Bursts:
    """`factor` x the rate for `burst_s` seconds every `every_s` from `first_s` on: faster than
    an engine's KV cache can hold its running sequences, so engines preempt."""

    every_s: float
    burst_s: float
    factor: float
    first_s: float = 0.0

    def multiple(self, t: float, seconds: float) -> float:
        burst = t >= self.first_s and (t - self.first_s) % self.every_s < self.burst_s
        return self.factor if burst else 1.0

    @property
    def peak(self) -> float:
        return max(self.factor, 1.0)


Shape = Ramp | Bursts
