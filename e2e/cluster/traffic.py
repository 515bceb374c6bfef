"""Requests from this machine to a router Service on the real node, and the engine pods'
own counters: what tests/node and e2e/node_figures.py send and measure.

Only the router's public HTTP API (OpenAI completions, streamed) and the engines' Prometheus
/metrics are used. Every request opens a new connection: through a NodePort each connection is
balanced by kube-proxy over the router pods that are Ready at that moment, which is what a
rolling update must get right; a keep-alive connection would stay pinned to one pod.

    load = Load(url, "sim-model", prompts.mixed(...), concurrency=4).start()
    ...
    results = load.stop()
"""

from __future__ import annotations

import asyncio
import json
import statistics
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families


@dataclass
class Request:
    prompt: str
    max_tokens: int


@dataclass
class Result:
    """One request as the client saw it. `started`: the first streamed token arrived."""

    status: int = 0
    started: bool = False
    done: bool = False  # the stream ended with [DONE] after a finish_reason
    error: str = ""
    ttft: float | None = None
    seconds: float = 0.0
    routed_to: str = ""
    reason: str = ""
    sent_at: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.done and not self.error


# --------------------------------------------------------------------------- prompts


def system_prompt(tenant: int, tokens: int) -> str:
    """A tenant's system prompt of about `tokens` tokens (4 bytes each, the simulator's
    tokenizer), distinct from every other tenant's from its first block on."""
    head = f"[tenant {tenant:04d}] You are the assistant of tenant {tenant}. "
    body = " ".join(f"rule-{tenant}-{i:04d}" for i in range(tokens))
    return (head + body)[: tokens * 4]


def tenants_requests(tenants: Sequence[int], per_tenant: int, prompt_tokens: int,
                     max_tokens: int) -> list[Request]:
    """Round-robin over tenants: each request is a tenant's system prompt + a new question."""
    out = []
    for q in range(per_tenant):
        for t in tenants:
            out.append(Request(f"{system_prompt(t, prompt_tokens)}\nUser question {q}: "
                               f"what is {t} times {q}?\nAssistant:", max_tokens))
    return out


def cycle(requests: Sequence[Request]) -> Iterator[Request]:
    while True:
        yield from requests


def ramp(first_tenant: int, start: int, step: int, every: float, most: int,
         prompt_tokens: int, max_tokens: int, seed: int = 7) -> Iterator[Request]:
    """Requests over a growing set of tenants: `start` at first, `step` more every `every`
    seconds, up to `most`; each request picks one of them at random (seeded)."""
    import random

    rng = random.Random(seed)
    t0 = time.monotonic()
    q = 0
    while True:
        n = min(most, start + step * int((time.monotonic() - t0) // every))
        t = first_tenant + rng.randrange(n)
        q += 1
        yield Request(f"{system_prompt(t, prompt_tokens)}\nUser question {q}: what is {t} "
                      f"times {q}?\nAssistant:", max_tokens)


# --------------------------------------------------------------------------- one request


async def send(session: aiohttp.ClientSession, url: str, model: str, req: Request,
               timeout: float = 120.0) -> Result:
    r = Result(sent_at=time.monotonic())
    t0 = time.perf_counter()
    body = {"model": model, "prompt": req.prompt, "max_tokens": req.max_tokens,
            "stream": True, "stream_options": {"include_usage": True}}
    finished = False
    try:
        async with session.post(f"{url}/v1/completions", json=body,
                                timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            r.status = resp.status
            r.routed_to = resp.headers.get("x-routed-to", "")
            r.reason = resp.headers.get("x-route-reason", "")
            if resp.status != 200:
                r.error = (await resp.text())[:300]
                return r
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    r.done = finished
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    r.error = str(chunk["error"])[:300]
                    break
                for choice in chunk.get("choices") or []:
                    if choice.get("text") and not r.started:
                        r.started, r.ttft = True, time.perf_counter() - t0
                    if choice.get("finish_reason"):
                        finished = True
            if not r.done and not r.error:
                r.error = "stream ended without [DONE]"
    except (TimeoutError, aiohttp.ClientError, ConnectionError) as e:
        r.error = f"{type(e).__name__}: {e}"[:300]
    finally:
        r.seconds = time.perf_counter() - t0
    return r


async def run(url: str, model: str, requests: Sequence[Request], concurrency: int,
              timeout: float = 120.0) -> list[Result]:
    """Send every request, `concurrency` at a time; results in the requests' order."""
    results: list[Result | None] = [None] * len(requests)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(requests)):
        queue.put_nowait(i)
    connector = aiohttp.TCPConnector(force_close=True, limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                results[i] = await send(session, url, model, requests[i], timeout)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return [r for r in results if r is not None]


class Load:
    """Steady load in a background thread: `concurrency` clients, each sending the next
    request of `requests` as soon as its last one ended, until stop()."""

    def __init__(self, url: str, model: str, requests: Iterator[Request], concurrency: int,
                 timeout: float = 120.0, rate: float | None = None) -> None:
        self.url, self.model, self.requests = url, model, requests
        self.concurrency, self.timeout = concurrency, timeout
        # at most `rate` requests a second in all (None: as fast as the clients go)
        self.interval = 1.0 / rate if rate else 0.0
        self._next_at = 0.0
        self.results: list[Result] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="load", daemon=True)

    def start(self) -> Load:
        self._thread.start()
        return self

    def stop(self, timeout: float = 300.0) -> list[Result]:
        self._stop.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the load did not stop within {timeout}s")
        return list(self.results)

    def snapshot(self) -> list[Result]:
        with self._lock:
            return list(self.results)

    def count(self) -> int:
        with self._lock:
            return len(self.results)

    def _next(self) -> Request:
        with self._lock:
            return next(self.requests)

    def _main(self) -> None:
        asyncio.run(self._clients())

    async def _clients(self) -> None:
        connector = aiohttp.TCPConnector(force_close=True, limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def client() -> None:
                while not self._stop.is_set():
                    if self.interval:
                        # pacing, not waiting on a condition: the next free send slot
                        now = time.monotonic()
                        self._next_at = max(self._next_at + self.interval, now)
                        await asyncio.sleep(self._next_at - now)
                    r = await send(session, self.url, self.model, self._next(), self.timeout)
                    with self._lock:
                        self.results.append(r)

            await asyncio.gather(*(client() for _ in range(self.concurrency)))


# --------------------------------------------------------------------------- measuring


def summary(results: Sequence[Result]) -> dict[str, float | int]:
    ttfts = sorted(r.ttft for r in results if r.ttft is not None)
    return {
        "requests": len(results),
        "ok": sum(r.ok for r in results),
        "failed_before_first_token": sum(not r.ok and not r.started for r in results),
        "cut_after_first_token": sum(not r.ok and r.started for r in results),
        "ttft_p50_ms": round(1000 * statistics.median(ttfts), 1) if ttfts else float("nan"),
        "ttft_p90_ms": round(1000 * ttfts[int(0.9 * (len(ttfts) - 1))], 1) if ttfts
        else float("nan"),
    }


def failures(results: Sequence[Result], t0: float, limit: int = 8) -> list[str]:
    """The failed requests, one line each: when (seconds after t0, a time.monotonic()), how
    far they got, where they were routed, the error."""
    failed = sorted((r for r in results if not r.ok), key=lambda r: r.sent_at)
    lines = [f"t={r.sent_at - t0:+.2f}s status={r.status} started={r.started} "
             f"took={r.seconds:.2f}s to={r.routed_to or '-'} {r.error[:160]}" for r in failed]
    if len(lines) <= limit:
        return lines
    span = f"{len(lines)} failed between t={failed[0].sent_at - t0:+.2f}s and " \
           f"t={failed[-1].sent_at - t0:+.2f}s; first and last:"
    return [span, *lines[: limit // 2], "...", *lines[-(limit // 2):]]


@dataclass
class Counters:
    """An engine's own Prometheus counters (vLLM's names, as the simulator serves them)."""

    hits: float = 0.0
    queries: float = 0.0
    prompt: float = 0.0
    success: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)

    def __sub__(self, other: Counters) -> Counters:
        return Counters(self.hits - other.hits, self.queries - other.queries,
                        self.prompt - other.prompt, self.success - other.success)

    def __add__(self, other: Counters) -> Counters:
        return Counters(self.hits + other.hits, self.queries + other.queries,
                        self.prompt + other.prompt, self.success + other.success)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


def engine_counters(base_url: str, timeout: float = 5.0) -> Counters:
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=timeout) as resp:
        text = resp.read().decode()
    c = Counters()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:prefix_cache_hits_total":
                c.hits += sample.value
            elif sample.name == "vllm:prefix_cache_queries_total":
                c.queries += sample.value
            elif sample.name == "vllm:prompt_tokens_total":
                c.prompt += sample.value
            elif sample.name == "vllm:request_success_total":
                c.success += sample.value
    return c


def total(counters: dict[str, Counters]) -> Counters:
    out = Counters()
    for c in counters.values():
        out = out + c
    return out
