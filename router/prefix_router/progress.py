"""Whether an engine moves: its own counters of work done, against the requests that wait on it.

A hung engine can answer its health probes while every request it took waits forever. A
stream shows it at its first token (first_token_budget_s); a non-streamed answer says nothing
until it is whole, so only the engine's reported progress can: the token and step counters
on its /metrics, which the health loop scrapes anyway. An engine is hung when this router has
had requests in flight there at every scrape for `stall_after_s` and none of those counters
moved (vLLM counts generated tokens and steps every engine step, so a long prefill or a long
answer still moves them).
"""

from __future__ import annotations

from dataclasses import dataclass

# Counters of work done (Prometheus text; a histogram's _count is its number of steps):
# vLLM's, SGLang's and llama.cpp server's names.
PROGRESS = (
    b"vllm:generation_tokens_total", b"vllm:prompt_tokens_total",
    b"vllm:iteration_tokens_total_count", b"vllm:request_success_total",
    b"sglang:generation_tokens_total", b"sglang:prompt_tokens_total",
    b"llamacpp:tokens_predicted_total", b"llamacpp:prompt_tokens_total",
    b"llamacpp:n_decode_total",
)  # fmt: skip


@dataclass(slots=True)
class _Seen:
    counters: float
    since: float  # when they last moved, or when nothing waited there


class StallWatch:
    """Per backend: the counters' sum at the last scrape and since when it stands still with
    requests waiting. Pure: the caller gives the time."""

    def __init__(self, stall_after_s: float) -> None:
        self.stall_after_s = stall_after_s
        self._seen: dict[str, _Seen] = {}

    def observe(self, url: str, counters: float | None, in_flight: int, now: float) -> float:
        """One scrape: how long (seconds) `url` has stood still with requests waiting there,
        0.0 while it moves, waits on nothing or reports no counters. The caller acts when it
        reaches stall_after_s; the clock then starts again."""
        seen = self._seen.get(url)
        if counters is None:
            self._seen.pop(url, None)
            return 0.0
        if seen is None or in_flight == 0 or counters != seen.counters:
            self._seen[url] = _Seen(counters, now)
            return 0.0
        still = now - seen.since
        if still >= self.stall_after_s:
            seen.since = now  # said once per window, not at every scrape after
        return still

    def keep(self, urls: set[str]) -> None:
        """Only these backends are watched (the others left)."""
        for url in self._seen.keys() - urls:
            del self._seen[url]
