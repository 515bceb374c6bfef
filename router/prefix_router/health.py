"""Background loops: active /health probes, engine gauge scrapes, model lists, table expiry."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import aiohttp

from .backends import BackendSet
from .config import HealthSettings
from .index import PrefixIndex
from .load import LoadTracker
from .metrics import RouterMetrics
from .progress import PROGRESS, StallWatch

log = logging.getLogger("prefix_router.health")

# vLLM's gauges (SGLang's and llama.cpp's server's are read too, under their own names).
_RUNNING = (b"vllm:num_requests_running", b"sglang:num_running_reqs",
            b"llamacpp:requests_processing")  # fmt: skip
_WAITING = (b"vllm:num_requests_waiting", b"sglang:num_queue_reqs",
            b"llamacpp:requests_deferred")  # fmt: skip
_QUEUE = _RUNNING + _WAITING
_SCANNED = _QUEUE + PROGRESS
_FIRST4 = frozenset(name[:4] for name in _SCANNED)


def engine_figures(text: bytes) -> tuple[tuple[float, float] | None, float | None]:
    """From Prometheus text: (running, waiting), each summed over label sets, and the sum of
    the progress counters (progress.py); each None where the page has none of them.

    A line scan rather than prometheus_client's parser: we need a few series out of a page of
    histograms, once a second per backend, and the full parser costs ~50x more on the loop.
    """
    running = waiting = progress = 0.0
    found_gauges = found_progress = False
    for line in text.split(b"\n"):
        if line[:4] not in _FIRST4:  # comments, and the engine's other series
            continue
        for name in _SCANNED:
            if line.startswith(name) and line[len(name) : len(name) + 1] in (b"{", b" "):
                try:
                    value = float(line.rsplit(b" ", 1)[1])
                except (ValueError, IndexError):
                    break
                if name in _RUNNING:
                    running += value
                    found_gauges = True
                elif name in _WAITING:
                    waiting += value
                    found_gauges = True
                else:
                    progress += value
                    found_progress = True
                break
    gauges = (running, waiting) if found_gauges else None
    return gauges, (progress if found_progress else None)


class HealthLoop:
    def __init__(
        self,
        settings: HealthSettings,
        backends: BackendSet,
        load: LoadTracker,
        index: PrefixIndex,
        metrics: RouterMetrics,
        session: aiohttp.ClientSession,
        on_metrics: Callable[[str, bytes], None] | None = None,
        gauges: Callable[[str, float, float], None] | None = None,
    ) -> None:
        self._s = settings
        # each engine's /metrics page as scraped (engine_states.py reads restarts in it)
        self._on_metrics = on_metrics
        self._backends = backends
        self._load = load
        self._index = index
        self._metrics = metrics
        self._session = session
        self._gauges = gauges  # (backend, running, waiting) at each scrape: saturation
        self._timeout = aiohttp.ClientTimeout(total=settings.probe_timeout_s)
        self._tasks: list[asyncio.Task[None]] = []
        self._blind: set[str] = set()  # backends whose /metrics give no load: said once
        self._stalls = StallWatch(settings.stall_after_s)
        self._unwatched: set[str] = set()  # backends with no progress counters: said once

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._probe_loop(), name="probe"),
            asyncio.create_task(self._scrape_loop(), name="scrape"),
            asyncio.create_task(self._expire_loop(), name="expire"),
        ]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t

    async def probe_once(self) -> None:
        await asyncio.gather(*(self._probe(b.url) for b in self._backends.all()))
        for b in self._backends.all():
            self._metrics.healthy.labels(b.url).set(1 if b.healthy else 0)

    async def _probe(self, url: str) -> None:
        try:
            async with self._session.get(url + self._s.path, timeout=self._timeout) as r:
                await r.read()
                ok = r.status == 200
                why = f"status {r.status}"
            b = self._backends.get(url)
            if ok and b is not None and not b.models:
                await self._fetch_models(url)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            ok, why = False, repr(exc)
        self._backends.probe_result(url, ok, why)

    async def _fetch_models(self, url: str) -> None:
        try:
            async with self._session.get(url + "/v1/models", timeout=self._timeout) as r:
                if r.status != 200:
                    return
                data = await r.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
            return
        cards = [m for m in data.get("data", []) if isinstance(m, dict)]
        ids = [m.get("id") for m in cards]
        lens = [m["max_model_len"] for m in cards if isinstance(m.get("max_model_len"), int)]
        self._backends.set_models(url, [i for i in ids if isinstance(i, str)],
                                  min(lens) if lens else None)  # fmt: skip

    async def _probe_loop(self) -> None:
        while True:
            await self.probe_once()
            await asyncio.sleep(self._s.probe_interval_s)

    async def _scrape(self, url: str) -> None:
        gauges = progress = None
        why = ""
        read = False
        try:
            async with self._session.get(url + "/metrics", timeout=self._timeout) as r:
                if r.status == 200:
                    page = await r.read()
                    gauges, progress = engine_figures(page)
                    read = True
                    if self._on_metrics is not None:
                        self._on_metrics(url, page)
                    why = "no running/waiting gauges there"
                else:
                    why = f"status {r.status}"
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            why = repr(exc)
        self._watch(url, progress, read)
        if gauges is not None:
            if self._gauges is not None:
                self._gauges(url, *gauges)
            self._load.engine_report(url, gauges[0] + gauges[1])
            self._blind.discard(url)
        elif url not in self._blind:
            # not an error (llama.cpp serves /metrics only with --metrics), but the load
            # the router sees there is only its own
            self._blind.add(url)
            log.warning("no load signal from %s/metrics (%s): counting only requests "
                        "routed through this router", url, why)

    def _watch(self, url: str, progress: float | None, read: bool) -> None:
        """A hung engine is one whose progress counters stand still while requests wait."""
        waiting = self._load.own_inflight(url)
        still = self._stalls.observe(url, progress, waiting, asyncio.get_running_loop().time())
        if still >= self._s.stall_after_s:
            self._backends.report_hung(
                url, f"no progress in {still:.0f}s with {waiting} requests waiting there")
        if read and progress is None and url not in self._unwatched:
            self._unwatched.add(url)
            log.warning("no progress counters on %s/metrics: a hung engine there is caught "
                        "only by upstream_timeout_s (streams: first_token_budget_s)", url)
        elif progress is not None:
            self._unwatched.discard(url)

    async def _scrape_loop(self) -> None:
        while True:
            # the healthy ones, and any other this router still waits on (ejected, on trial)
            urls = [b.url for b in self._backends.all()
                    if b.healthy or self._load.own_inflight(b.url)]  # fmt: skip
            self._stalls.keep(set(urls))
            await asyncio.gather(*(self._scrape(u) for u in urls))
            await asyncio.sleep(self._s.metrics_poll_interval_s)

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(5.0)
            gone = self._index.expire()
            if gone:
                log.debug("expired %d table entries", gone)
