"""The Responses API's store: what one simulator process remembers of the responses it made.

As vLLM's (switched on by VLLM_ENABLE_RESPONSES_API_STORE=1) it lives in this process's memory
only, so every other process answers "not found" for its ids. Unlike vLLM's, it is bounded:
past `max_bytes` (the JSON size of what each entry holds) the least recently used entries go,
and an evicted id answers as an unknown one. An entry still running is never evicted: it holds
a task and the events its stream readers wait on.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

# Bytes an entry costs beyond its JSON (the dicts, the event list, the bookkeeping).
_OVERHEAD = 512


@dataclass(eq=False)
class Stored:
    """One response: the response object as GET returns it, the chat messages it was built
    from (a follow-up's history), and for a background stream its events so far."""

    response: dict[str, Any]
    messages: list[dict[str, Any]]
    events: list[bytes] | None = None
    task: asyncio.Task[None] | None = None
    # notified when an event is added or the response ends (its stream readers wait on it)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    size: int = 0

    @property
    def running(self) -> bool:
        return self.response["status"] in ("queued", "in_progress")


def _size(entry: Stored) -> int:
    n = len(json.dumps(entry.response)) + len(json.dumps(entry.messages)) + _OVERHEAD
    if entry.events is not None:
        n += sum(len(e) for e in entry.events)
    return n


class ResponseStore:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.evicted = 0
        self._entries: OrderedDict[str, Stored] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, response_id: str) -> Stored | None:
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def put(self, response_id: str, entry: Stored) -> None:
        old = self._entries.pop(response_id, None)
        if old is not None:
            self.bytes -= old.size
        entry.size = _size(entry)
        self._entries[response_id] = entry
        self.bytes += entry.size
        self._evict()

    def running(self) -> list[Stored]:
        return [e for e in self._entries.values() if e.task is not None]

    def grow(self, response_id: str, n: int) -> None:
        """An entry took `n` more bytes (an event of its stream)."""
        entry = self._entries.get(response_id)
        if entry is not None:
            entry.size += n
            self.bytes += n
            self._evict()

    def _evict(self) -> None:
        if self.bytes <= self.max_bytes:
            return
        for rid in list(self._entries):
            if self.bytes <= self.max_bytes:
                break
            entry = self._entries[rid]
            if entry.running:
                continue
            del self._entries[rid]
            self.bytes -= entry.size
            self.evicted += 1
