"""Where each request of the real-engine scenario went and what its engine held: our router
(told to expose its routing) in front of fresh llama-servers, the same request sequence as
`python -m bench real-engine`, one record per request (its prefix, the backend and reason the
router gave, the cached tokens the engine reported, when it was sent and finished).

    .venv/bin/python -m bench.trace_llama --rate 6 --seconds 45 [--setting index=approx ...]

The summary it prints (analyse(), pure) is what bench/results/real-engine/README.md quotes for
the causes: predicted hits the engine missed, and of those how many had a request of the same
prefix in flight on the same server when they were sent (llama-server's slots keep their KV
to themselves: a prompt held by a busy slot is no use to a request in another slot); prefixes
the router had placed and later routed as a miss, and of those routed as a miss how many the
server held all the same (the router forgot them); how many servers computed each prefix.
`--reanalyse FILE` recomputes a saved trace's summary."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from .harness import llama
from .harness.fleet import Fleet
from .harness.loadgen import _read_events
from .harness.workloads import build, messages_for, session_starts
from .scenarios import LLAMA_KV_TOKENS, LLAMA_SERVERS, PREFIX_TOKENS, SCENARIOS


@dataclass
class Record:
    index: int
    group: str  # the session's prefix (system prompt)
    sent_at: float
    done_at: float | None
    ttft: float | None
    backend: str
    reason: str
    prompt_tokens: int | None
    cached_tokens: int | None


async def _send(http: aiohttp.ClientSession, url: str, i: int, group: str,
                msgs: list[dict[str, str]], max_tokens: int, t0: float) -> Record:
    body = {"model": llama.MODEL, "messages": msgs, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 0}
    sent = time.perf_counter()
    rec = Record(i, group, sent - t0, None, None, "", "", None, None)
    async with http.post(url + "/v1/chat/completions", json=body) as r:
        rec.backend = r.headers.get("x-routed-to", "")
        rec.reason = r.headers.get("x-route-reason", f"status {r.status}")
        buf = bytearray()
        async for chunk in r.content.iter_any():
            if rec.ttft is None and b'"content":"' in chunk:
                rec.ttft = time.perf_counter() - sent
            buf += chunk
    rec.done_at = time.perf_counter() - t0
    _, _, usage = _read_events(bytes(buf), "chat")
    if usage is not None:
        rec.prompt_tokens = usage.prompt_tokens
        d = usage.prompt_tokens_details
        rec.cached_tokens = d.cached_tokens if d is not None else None
    return rec


def analyse(records: Sequence[Record]) -> dict[str, Any]:
    """The figures of one trace. A predicted hit (reason "hit") missed at its engine when the
    engine reported under half the prompt cached; it met a busy twin when a request of the
    same prefix, routed to the same server, was sent before it and not finished yet."""
    recs = sorted((r for r in records if r.done_at is not None), key=lambda r: r.sent_at)
    out: dict[str, Any] = {"requests": len(recs),
                           "reasons": dict(Counter(r.reason for r in recs))}
    missed = [r for r in recs if r.reason == "hit" and r.prompt_tokens
              and (r.cached_tokens or 0) < r.prompt_tokens / 2]

    def busy_twin(r: Record) -> bool:
        return any(o.group == r.group and o.backend == r.backend and o.sent_at < r.sent_at
                   and (o.done_at or 0) > r.sent_at for o in recs if o is not r)

    twins = sum(busy_twin(r) for r in missed)
    hits = sum(r.reason == "hit" for r in recs)
    out.update(predicted_hits=hits, predicted_hits_missed=len(missed),
               missed_with_busy_twin=twins)
    seen: set[str] = set()
    forgotten = 0
    servers: dict[str, set[str]] = defaultdict(set)
    for r in recs:
        if r.reason == "miss" and r.group in seen:
            forgotten += 1
        seen.add(r.group)
        if r.prompt_tokens and (r.cached_tokens or 0) < r.prompt_tokens / 2:
            servers[r.group].add(r.backend)  # computed there in full
    out["miss_of_a_placed_prefix"] = forgotten
    # routed as a miss, yet the engine it went to held the prompt: the router forgot it
    out["miss_the_engine_held"] = sum(1 for r in recs if r.reason == "miss" and r.prompt_tokens
                                      and (r.cached_tokens or 0) >= r.prompt_tokens / 2)
    out["servers_that_computed_each_prefix"] = {g: len(b) for g, b in sorted(servers.items())}
    prompt = sum(r.prompt_tokens or 0 for r in recs)
    out["hit_rate_reported"] = round(sum(r.cached_tokens or 0 for r in recs) / prompt, 4) \
        if prompt else None
    ttfts = sorted(r.ttft for r in recs if r.ttft is not None)
    out["ttft_p50_ms"] = round(1000 * ttfts[len(ttfts) // 2], 1) if ttfts else None
    return out


async def trace(settings: dict[str, Any], rate: float, seconds: float, log_dir: Path,
                seed: int = 7) -> tuple[list[Record], dict[str, Any]]:
    sc = SCENARIOS["real-engine"]
    wl = build(sc.workloads[0], int(rate * seconds * 1.2) + 50)
    starts = session_starts(wl, rate, seconds, seed)
    async with Fleet(log_dir) as fleet:
        engines = await llama.start_engines(fleet, 3, LLAMA_SERVERS)
        cfg = log_dir / "router.yaml"
        cfg.write_text(yaml.safe_dump({**PREFIX_TOKENS.settings, **settings,
                                       "expose_routing": True, "log_decisions": True}))
        router = await fleet.start_router("router", engines, policy="prefix",
                                          kv_capacity=LLAMA_KV_TOKENS,
                                          extra=["--config", str(cfg), "--log-level", "info"])
        async with aiohttp.ClientSession() as http:
            t0 = time.perf_counter()
            tasks = []
            for i, (s, at) in enumerate(zip(wl.sessions, starts, strict=False)):
                await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
                tasks.append(asyncio.create_task(_send(
                    http, router.url, i, s.group, messages_for(s, 0, []),
                    s.turns[0].max_tokens, t0)))
            records = list(await asyncio.gather(*tasks))
            async with http.get(router.url + "/metrics") as r:
                metrics = await r.text()
    corrections = {line.split('"')[1]: float(line.rsplit(" ", 1)[1])
                   for line in metrics.splitlines()
                   if line.startswith("prefix_router_index_corrections_total{")}
    return records, {"index_corrections": corrections}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.trace_llama", description=__doc__)
    p.add_argument("--rate", type=float, default=6.0)
    p.add_argument("--seconds", type=float, default=45.0)
    p.add_argument("--setting", action="append", default=[], metavar="KEY=VALUE",
                   help="a router setting (value read as YAML), repeatable")
    p.add_argument("--out", type=Path, help="write the records and the summary here (JSON)")
    p.add_argument("--reanalyse", type=Path, help="a saved trace: its summary recomputed")
    args = p.parse_args(argv)
    if args.reanalyse:
        saved = json.loads(args.reanalyse.read_text())
        saved["summary"].update(analyse([Record(**r) for r in saved["records"]]))
        args.reanalyse.write_text(json.dumps(saved) + "\n")
        print(json.dumps(saved["summary"], indent=2))
        return
    settings = {k: yaml.safe_load(v) for k, _, v in (s.partition("=") for s in args.setting)}
    log_dir = Path("bench/.logs") / f"trace-llama-{int(time.time())}"
    load = __import__("os").getloadavg()[0]
    records, extra = asyncio.run(trace(settings, args.rate, args.seconds, log_dir))
    summary = {"rate": args.rate, "seconds": args.seconds, "settings": settings,
               "load_1m": round(load, 2), **analyse(records), **extra, "logs": str(log_dir)}
    print(json.dumps(summary, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"summary": summary,
                                        "records": [asdict(r) for r in records]}) + "\n")


if __name__ == "__main__":
    main()
