"""Engines that come back empty behind the same address, told without KV events. Pure.

An engine that crashes and restarts, is OOM-killed, sleeps and wakes, or has its prefix cache
reset keeps its address, so nothing in discovery or health says its cache is gone, and an
index of decisions would believe it holds what it held until entries age out. Any one of
these signs says it is empty now:
  restart   `process_start_time_seconds` changed (vLLM serves it from prometheus_client's
            process collector; so does the simulator), or a token counter that only grows
            went back (engines without the start time: SGLang, llama.cpp's server)
  sleep     vLLM's `vllm:engine_sleep_state{sleep_state="awake"}` fell to 0: both sleep
            levels discard the KV cache (the engine is DEGRADED while it sleeps)
  reset     a prefix-cache reset counter grew (the simulator's; vLLM exports none: checked
            against vllm/v1/metrics/loggers.py)
  shortfall the engine reported cached tokens far below the index's prediction for
            enough prefixes in a row (within `window_s`) that eviction alone would hardly
            do it: `streak` at least, more where this engine's answers often fall short (a
            run as likely as `chance`, 1e-4, at its own rate of shortfalls; a busy llama-server
            behind three routers falls short on a third of the predictions, and three in a
            row came every few seconds there, each dropping a full cache); distinct
            prefixes, since one prefix asked twice at once falls short twice. A hit on a
            prefix that fell short in the same run does not break it: after a reset the
            engine computes again what it is asked first, so a hot prefix's next requests
            are hits between the others' misses. A prefix that fell short before the run
            began and hits now was kept since: the engine is not empty.
The first scrape of an engine only sets its baseline: a router that starts knows nothing to
drop.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

START_TIME = b"process_start_time_seconds"
SLEEP_STATE = b"vllm:engine_sleep_state"
RESET_COUNTERS = (b"engine_sim_prefix_cache_resets_total",)
# weight of one answer in an engine's share of shortfalls: about the last 20 answers
_RATE_WEIGHT = 0.05
# counters that only grow while the process lives: one going back is a restart
SERVED_COUNTERS = (b"vllm:prompt_tokens_total", b"sglang:prompt_tokens_total",
                   b"llamacpp:prompt_tokens_total")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Vitals:
    """What an engine's /metrics say of its life, None where it does not say."""

    started: float | None = None  # process start, unix seconds
    awake: float | None = None  # 1 awake, 0 asleep (vLLM's sleep mode)
    resets: float | None = None  # prefix-cache resets since start
    served: float | None = None  # prompt tokens since start


def _value(line: bytes) -> float | None:
    try:
        return float(line.rsplit(b" ", 1)[1])
    except (ValueError, IndexError):
        return None


def _named(line: bytes, name: bytes) -> bool:
    return line.startswith(name) and line[len(name) : len(name) + 1] in (b"{", b" ")


def read_vitals(text: bytes) -> Vitals:
    """The vitals in a Prometheus text page (summed over label sets; a line scan, as
    health.engine_figures, for the same reason: a page of histograms each second)."""
    started = awake = resets = served = None
    for line in text.split(b"\n"):
        if not line or line[0] == 35:  # '#'
            continue
        if _named(line, START_TIME):
            started = _value(line)
        elif _named(line, SLEEP_STATE):
            if b'sleep_state="awake"' in line and (v := _value(line)) is not None:
                awake = v if awake is None else min(awake, v)
        elif any(_named(line, n) for n in RESET_COUNTERS):
            if (v := _value(line)) is not None:
                resets = (resets or 0.0) + v
        elif any(_named(line, n) for n in SERVED_COUNTERS):
            if (v := _value(line)) is not None:
                served = (served or 0.0) + v
    return Vitals(started, awake, resets, served)


@dataclass(slots=True)
class _Engine:
    vitals: Vitals | None = None
    run: list[float] = field(default_factory=list)  # times of the shortfalls in a row
    # prefix (its first block) -> when it fell short: computed again since, its hits say
    # nothing of what the engine kept
    short: dict[int, float] = field(default_factory=dict)
    detected: int = 0
    rate: float = 0.0  # share of recent answers that fell short
    base: float = 0.0  # that share as the run under way began


class RestartDetector:
    """Per engine: its last vitals and its run of answers far below prediction.

    `shortfall`: an answer holding at most this share of the predicted blocks is short;
    predictions under `min_blocks` say too little to count either way. A run of shortfalls
    drops the engine's entries once it is `streak` long and as unlikely as `chance` at the
    engine's usual share of shortfalls (at most `max_streak` long); `suspect_after` of them
    make it suspected (DEGRADED) before that.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        *,
        streak: int = 3,
        max_streak: int = 8,
        chance: float = 1e-4,
        suspect_after: int = 2,
        shortfall: float = 0.25,
        min_blocks: int = 2,
        window_s: float = 60.0,
    ) -> None:
        self._clock = clock
        self._streak = streak
        self._max_streak = max(streak, max_streak)
        self._log_chance = math.log(chance)
        self._suspect_after = suspect_after
        self._shortfall = shortfall
        self._min_blocks = min_blocks
        self._window_s = window_s
        self._engines: dict[str, _Engine] = {}

    def scraped(self, backend: str, now: Vitals) -> str | None:
        """An engine's vitals as scraped: the reason its cache is gone, or None."""
        e = self._engines.setdefault(backend, _Engine())
        before, e.vitals = e.vitals, now
        if before is None:
            return None
        why = _changed(before, now)
        if why is not None:
            e.run.clear()
            e.short.clear()
            e.detected += 1
        return why

    def answered(self, backend: str, prefix: int, predicted: int, held: int) -> str | None:
        """An answer's evidence in blocks for the prefix (its first block's hash): 'shortfall'
        when it completes a streak."""
        if predicted < self._min_blocks:
            return None
        e = self._engines.setdefault(backend, _Engine())
        now = self._clock()
        e.run = [t for t in e.run if now - t <= self._window_s]
        if not e.run:
            e.short.clear()  # no run under way: no prefix fell short in it
        if len(e.short) > 4 * self._streak:
            e.short = {p: t for p, t in e.short.items() if now - t <= self._window_s}
        if held > predicted * self._shortfall:
            at = e.short.get(prefix)
            if at is None or now - at > self._window_s:
                e.run.clear()  # the engine kept a prefix: not emptied
                e.short.clear()
                e.rate -= _RATE_WEIGHT * e.rate
            return None
        if not e.run:
            e.base = e.rate
        e.rate += _RATE_WEIGHT * (1.0 - e.rate)
        e.short[prefix] = now
        e.run.append(now)
        # distinct prefixes: one prefix asked twice at once falls short twice (both
        # requests compute it), which says nothing of the engine's other prefixes
        if len(e.short) < self._needed(e.base):
            return None
        e.run.clear()
        e.short.clear()
        e.detected += 1
        return "shortfall"

    def _needed(self, rate: float) -> int:
        """Shortfalls in a row that an engine falling short at `rate` makes by chance
        only as often as `chance`."""
        if rate <= 0.0:
            return self._streak
        if rate >= 1.0:
            return self._max_streak
        need = math.ceil(self._log_chance / math.log(rate))
        return min(max(need, self._streak), self._max_streak)

    def suspected(self, backend: str) -> bool:
        """Asleep, or most of a shortfall streak seen (and recent)."""
        e = self._engines.get(backend)
        if e is None:
            return False
        if e.vitals is not None and e.vitals.awake == 0:
            return True
        now = self._clock()
        return sum(1 for t in e.run if now - t <= self._window_s) >= self._suspect_after

    def detected(self, backend: str) -> int:
        e = self._engines.get(backend)
        return 0 if e is None else e.detected

    def forget(self, backend: str) -> None:
        self._engines.pop(backend, None)


def _changed(before: Vitals, now: Vitals) -> str | None:
    if before.started is not None and now.started is not None and now.started != before.started:
        return "restart"
    if before.served is not None and now.served is not None and now.served < before.served:
        return "restart"
    if now.awake == 0 and before.awake != 0:
        return "sleep"  # the cache is discarded as it falls asleep
    if now.awake == 1 and before.awake == 0:
        return "wake"  # whatever was recorded for it while it slept is not there either
    if before.resets is not None and now.resets is not None and now.resets > before.resets:
        return "reset"
    return None
