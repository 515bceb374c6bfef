"""Where backends come from. One small interface; static lists here, Kubernetes elsewhere."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

OnChange = Callable[[Sequence[str]], None]


class Discovery(Protocol):
    async def start(self, on_change: OnChange) -> None: ...
    async def stop(self) -> None: ...


class StaticDiscovery:
    """A fixed list of backend base URLs (flags or config file)."""

    def __init__(self, urls: Sequence[str]) -> None:
        self._urls = list(urls)

    async def start(self, on_change: OnChange) -> None:
        on_change(self._urls)

    async def stop(self) -> None:
        return None
