"""The engine that served each named session last: a bounded map, most recent last. Pure.

A session is named by the client (agent frameworks send a session or conversation id; the
header is `session_header`), keyed by a hash of the tenant's salt and the id, so the map's
memory is bounded whatever clients send and two tenants' ids never meet.
"""

from __future__ import annotations

from collections import OrderedDict

import xxhash


def session_key(session: str, salt: str | None) -> int:
    return xxhash.xxh3_64_intdigest(f"{salt or ''}\x00{session}".encode())


class Sessions:
    __slots__ = ("_last", "_max")

    def __init__(self, max_sessions: int) -> None:
        self._max = max_sessions
        self._last: OrderedDict[int, str] = OrderedDict()

    def last(self, key: int) -> str | None:
        return self._last.get(key)

    def served(self, key: int, backend: str) -> None:
        last = self._last
        last[key] = backend
        last.move_to_end(key)
        if len(last) > self._max:
            last.popitem(last=False)

    def __len__(self) -> int:
        return len(self._last)
