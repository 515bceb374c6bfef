"""Where backends come from. One small interface; static lists and a watched file here,
Kubernetes in kube_discovery.py."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from .config import base_urls

log = logging.getLogger("prefix_router.discovery")

OnChange = Callable[[Sequence[str]], None]
# The members that are leaving (their pods terminate): no new requests go there.
OnLeaving = Callable[[Sequence[str]], None]


class Discovery(Protocol):
    async def start(self, on_change: OnChange, on_leaving: OnLeaving | None = None) -> None:
        """`on_leaving`: where the source can tell a member is on its way out."""
        ...

    async def stop(self) -> None: ...


class StaticDiscovery:
    """A fixed list of backend base URLs (flags or config file)."""

    def __init__(self, urls: Sequence[str]) -> None:
        self._urls = list(urls)

    async def start(self, on_change: OnChange, on_leaving: OnLeaving | None = None) -> None:
        on_change(self._urls)

    async def stop(self) -> None:
        return None


def read_backends_file(text: str) -> list[str]:
    """One base URL per line; `#` comments skipped."""
    return base_urls(line.split("#", 1)[0] for line in text.splitlines())


class FileDiscovery:
    """Backends listed in a file, re-read when it changes (a ConfigMap volume, a sidecar, a
    script that scales a fleet). Polled: the file may be replaced by a rename or a symlink
    swap, which inotify-style watches on the old inode would miss."""

    def __init__(self, path: str, interval: float = 1.0) -> None:
        self._path = Path(path)
        self._interval = interval
        self._last: list[str] | None = None
        self._task: asyncio.Task[None] | None = None

    def _check(self, on_change: OnChange) -> None:
        try:
            urls = read_backends_file(self._path.read_text())
        except OSError as exc:
            log.warning("cannot read backends file %s: %s", self._path, exc)
            return
        if urls != self._last:
            self._last = urls
            on_change(urls)

    async def start(self, on_change: OnChange, on_leaving: OnLeaving | None = None) -> None:
        self._check(on_change)
        self._task = asyncio.create_task(self._loop(on_change), name="file-discovery")

    async def _loop(self, on_change: OnChange) -> None:
        while True:
            await asyncio.sleep(self._interval)
            # a small file on local disk: reading it is quicker than a thread hop
            self._check(on_change)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
