"""`python -m bench conversation`: Responses API conversations (each turn names the last by
previous_response_id) over simulators that store responses as vLLM does (each in its own
memory), through our three router replicas on Redis, and the same conversations through
what does not know where a response lives: a plain round-robin balancer (the client spreads
the requests over the engines in turn, as any L4/L7 round-robin does) and sglang-router. Then
ours again with chat completions carrying the whole history, the baseline the Responses path
must not be worse than (engine hit rate, TTFT p50).

Every session runs its turns one after the other (a turn waits for the last's answer); the
sessions start 0.2 s apart. A turn answered "not found" (the engine does not hold the
response it names) is counted; the session goes on from its last answer that was stored."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from .harness.anchors import start_anchor
from .harness.engines import fetch_stats, reset
from .harness.fleet import Fleet, memory_of
from .harness.workloads import text
from .provenance import now_utc, stamp

MODEL = "conv-model"
OUT = Path("bench/results/api")
PROFILE = "llama-3.1-70b-h100"


@dataclass(frozen=True)
class Plan:
    sessions: int = 50
    turns: int = 10
    engines: int = 8
    routers: int = 3
    personas: int = 8  # instructions shared by sessions, ~500 tokens each
    max_tokens: int = 48
    kv_capacity: int = 60_000  # per engine: the whole run's histories fit the fleet
    start_gap_s: float = 0.2
    seed: int = 11


@dataclass
class Sess:
    instructions: str
    inputs: list[str]


def sessions(plan: Plan) -> list[Sess]:
    rng = random.Random(plan.seed)
    personas = [text(rng, 500) for _ in range(plan.personas)]
    return [Sess(personas[s % plan.personas],
                 [text(rng, rng.randint(60, 160)) for _ in range(plan.turns)])
            for s in range(plan.sessions)]  # fmt: skip


@dataclass
class Turn:
    session: int
    turn: int
    ok: bool
    status: int
    ttft_s: float | None
    error: str = ""
    not_found: bool = False


@dataclass
class Run:
    turns: list[Turn] = field(default_factory=list)


def _events(raw: bytes) -> list[dict[str, Any]]:
    out = []
    for line in raw.split(b"\n"):
        line = line.strip()
        if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
            out.append(json.loads(line[5:]))
    return out


async def _stream(http: aiohttp.ClientSession, url: str, body: dict[str, Any],
                  first: Callable[[bytes], bool]) -> tuple[int, float | None, bytes]:
    """(status, seconds to the first content, the whole body) of one streamed request."""
    t0 = time.perf_counter()
    ttft = None
    buf = bytearray()
    async with http.post(url, json=body) as r:
        async for chunk in r.content.iter_any():
            buf += chunk
            if ttft is None and r.status == 200 and first(bytes(buf)):
                ttft = time.perf_counter() - t0
        return r.status, ttft, bytes(buf)


def _has_delta(buf: bytes) -> bool:
    return b'"response.output_text.delta"' in buf


def _has_content(buf: bytes) -> bool:
    return b'"content":"' in buf.replace(b'"content":""', b"")


async def responses_session(http: aiohttp.ClientSession, s: Sess, k: int, plan: Plan,
                            target: Callable[[int, int], str], run: Run) -> None:
    previous: str | None = None
    for t, user in enumerate(s.inputs):
        # instructions on every turn: a stored response's do not carry over (the OpenAI
        # API's rule, and vLLM's since 0.34)
        body: dict[str, Any] = {"model": MODEL, "input": user, "stream": True,
                                "instructions": s.instructions,
                                "max_output_tokens": plan.max_tokens}  # fmt: skip
        if previous is not None:
            body["previous_response_id"] = previous
        try:
            status, ttft, raw = await _stream(http, target(k, t) + "/v1/responses", body,
                                              _has_delta)
        except (aiohttp.ClientError, TimeoutError) as exc:
            run.turns.append(Turn(k, t, False, 0, None, repr(exc)[:200]))
            continue
        if status != 200:
            msg = raw.decode(errors="replace")[:300]
            run.turns.append(Turn(k, t, False, status, None, msg,
                                  not_found=status == 404 and "not found" in msg))
            continue
        done = [e for e in _events(raw) if e.get("type") == "response.completed"]
        if not done:
            run.turns.append(Turn(k, t, False, status, ttft, "no response.completed"))
            continue
        previous = done[-1]["response"]["id"]
        run.turns.append(Turn(k, t, True, status, ttft))


async def chat_session(http: aiohttp.ClientSession, s: Sess, k: int, plan: Plan,
                       target: Callable[[int, int], str], run: Run) -> None:
    """The same conversation as chat completions carrying the whole history."""
    msgs: list[dict[str, str]] = [{"role": "system", "content": s.instructions}]
    for t, user in enumerate(s.inputs):
        msgs.append({"role": "user", "content": user})
        body = {"model": MODEL, "messages": msgs, "stream": True, "max_tokens": plan.max_tokens}
        try:
            status, ttft, raw = await _stream(http, target(k, t) + "/v1/chat/completions", body,
                                              _has_content)
        except (aiohttp.ClientError, TimeoutError) as exc:
            run.turns.append(Turn(k, t, False, 0, None, repr(exc)[:200]))
            return
        if status != 200:
            run.turns.append(Turn(k, t, False, status, None, raw.decode(errors="replace")[:300]))
            return
        answer = "".join((c.get("delta") or {}).get("content") or ""
                         for e in _events(raw) for c in e.get("choices") or ())  # fmt: skip
        msgs.append({"role": "assistant", "content": answer})
        run.turns.append(Turn(k, t, True, status, ttft))


async def drive(api: str, target: Callable[[int, int], str], plan: Plan) -> Run:
    run = Run()
    one = responses_session if api == "responses" else chat_session
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=timeout) as http:  # fmt: skip
        tasks = []
        for k, s in enumerate(sessions(plan)):
            tasks.append(asyncio.create_task(one(http, s, k, plan, target, run)))
            await asyncio.sleep(plan.start_gap_s)
        await asyncio.gather(*tasks)
    return run


def figures(run: Run, stats: list[dict[str, Any]], plan: Plan) -> dict[str, Any]:
    ttfts = sorted(t.ttft_s for t in run.turns if t.ok and t.ttft_s is not None)
    prompt = sum(s["prompt_tokens"] for s in stats)
    cached = sum(s["cached_tokens"] for s in stats)
    errors = Counter(f"{t.status}: {t.error[:90]}" for t in run.turns if not t.ok)
    follow_ups = plan.sessions * (plan.turns - 1)
    intact = sum(all(t.ok for t in run.turns if t.session == k) for k in range(plan.sessions))
    return {
        "turns_sent": len(run.turns),
        "turns_ok": sum(t.ok for t in run.turns),
        "not_found": sum(t.not_found for t in run.turns),
        "follow_ups": follow_ups,
        "other_errors": sum(not t.ok and not t.not_found for t in run.turns),
        "sessions_intact": intact,
        "engine_hit_rate": round(cached / prompt, 4) if prompt else None,
        "ttft_p50_ms": round(statistics.median(ttfts) * 1000, 1) if ttfts else None,
        "ttft_p90_ms": round(ttfts[int(0.9 * (len(ttfts) - 1))] * 1000, 1) if ttfts else None,
        # the engines' own, from arrival to first token: what the router and client add is
        # the difference
        "engine_ttft_p50_ms": round(statistics.median(e) * 1000, 1) if (e := sorted(
            t for s in stats for t in s["ttft_s"])) else None,
        "engine_requests": [s["requests"] for s in stats],
        "errors_by_kind": dict(errors.most_common(5)),
    }


def spread(urls: list[str], in_turn: bool) -> Callable[[int, int], str]:
    """Where turn t of session k goes: the next URL of all (a round-robin balancer), or
    URL (k + t) mod n (a session's turns over the router replicas, as a Service would)."""
    counter = itertools.count()
    if in_turn:
        return lambda k, t: urls[next(counter) % len(urls)]
    return lambda k, t: urls[(k + t) % len(urls)]


SETUPS = ("ours-responses", "ours-chat", "round-robin", "sglang-router", "sglang-router-3x",
          "ours-policy-round-robin")  # fmt: skip


async def measure(plan: Plan, setups: tuple[str, ...], logs: Path,
                  repeats: int) -> dict[str, list[dict[str, Any]]]:
    """Each setup's figures, a round each; a round runs every setup, every other round in
    the reverse order, so neither a warm-up nor the host's drift favours one."""
    out: dict[str, list[dict[str, Any]]] = {}
    async with Fleet(logs) as fleet:
        engines = [(await fleet.start_sim(
            f"sim{i}", model=MODEL, kv_capacity=plan.kv_capacity, profile=PROFILE,
            time_scale=1.0, extra=["--enable-responses-api-store"])).url
            for i in range(plan.engines)]  # fmt: skip
        redis = await fleet.start_redis()

        async def routers(policy: str, tag: str) -> list[str]:
            # fresh ones for each setup: nothing learned in another run
            return [(await fleet.start_router(
                f"{tag}{i}", engines, policy=policy, kv_capacity=plan.kv_capacity,
                extra=["--store", "redis", "--redis-url", redis, "--model-key", tag])).url
                for i in range(plan.routers)]  # fmt: skip

        for name in [n for r in range(repeats) for n in (setups[::-1] if r % 2 else setups)]:
            await reset(engines)
            api = "chat" if name == "ours-chat" else "responses"
            note = ""
            if name in ("ours-responses", "ours-chat"):
                urls = await routers("prefix", name)
                note = f"{plan.routers} routers (prefix) on one Redis, turn t of session k " \
                       "through router (k + t) mod 3"
            elif name == "ours-policy-round-robin":
                urls = await routers("round-robin", "rr")
                note = "our routers with --policy round-robin: a follow-up is pinned all the same"
            elif name == "round-robin":
                urls = engines
                note = "no router: the requests spread over the engines in turn, as a " \
                       "round-robin balancer that knows nothing of responses does"
            else:
                n = 3 if name == "sglang-router-3x" else 1
                urls = [(await start_anchor(fleet, "sglang-cache_aware", engines)).url
                        for _ in range(n)]  # fmt: skip
                note = (f"{n} sglang-router 0.3.2, cache_aware (bench/harness/anchors.py)"
                        + (", turn t of session k through replica (k + t) mod 3" if n > 1 else ""))
            target = spread(urls, name == "round-robin")
            t0 = time.perf_counter()
            run = await drive(api, target, plan)
            fig = figures(run, await fetch_stats(engines), plan)
            fig.update(api=api, note=note, seconds=round(time.perf_counter() - t0, 1))
            if name.startswith("ours"):
                fig["router_rss_mb"] = [memory_of(p.process.pid)["rss_mb"]
                                        for p in fleet.procs if p.url in urls]
            out.setdefault(name, []).append(fig)
            for p in [p for p in fleet.procs if p.url in urls and p.url not in engines]:
                await fleet.stop(p)  # idle routers' timers would take CPU from the next run
            print(name, json.dumps({k: v for k, v in fig.items() if k != "errors_by_kind"}),
                  fig["errors_by_kind"], flush=True)
    return out


SUMMED = ("turns_sent", "turns_ok", "not_found", "follow_ups", "other_errors",
          "sessions_intact")  # fmt: skip
MEDIAN = ("engine_hit_rate", "ttft_p50_ms", "ttft_p90_ms", "engine_ttft_p50_ms")


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts over every round; the median round's rates and times, and each round's p50."""
    out: dict[str, Any] = {"rounds": len(rounds), "api": rounds[0]["api"]}
    out.update({k: sum(r[k] for r in rounds) for k in SUMMED})
    out.update({k: statistics.median(r[k] for r in rounds) if all(
        r[k] is not None for r in rounds) else None for k in MEDIAN})  # fmt: skip
    out["ttft_p50_ms_by_round"] = [r["ttft_p50_ms"] for r in rounds]
    return out


def table(result: dict[str, Any]) -> list[str]:
    cols = ("api", "turns_ok", "not_found", "other_errors", "sessions_intact",
            "engine_hit_rate", "ttft_p50_ms", "ttft_p90_ms", "engine_ttft_p50_ms",
            "ttft_p50_ms_by_round")  # fmt: skip
    lines = ["| setup | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 1)]
    for name, f in result["summary"].items():
        lines.append(f"| {name} | " + " | ".join(str(f.get(c)) for c in cols) + " |")
    return lines


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("conversation", help="Responses conversations by previous_response_id: "
                       "ours on Redis, round-robin, sglang-router, and chat with the history")
    p.add_argument("--setups", nargs="+", choices=SETUPS, default=list(SETUPS))
    p.add_argument("--sessions", type=int, default=Plan.sessions)
    p.add_argument("--turns", type=int, default=Plan.turns)
    p.add_argument("--repeat", type=int, default=3, help="rounds of every setup")
    p.add_argument("--out", default=str(OUT), help="results folder")


def main(args: argparse.Namespace, command: str) -> None:
    plan = Plan(sessions=args.sessions, turns=args.turns)
    with tempfile.TemporaryDirectory(prefix="bench-conv-") as logs:
        setups = asyncio.run(measure(plan, tuple(args.setups), Path(logs), args.repeat))
    result = {**stamp(command), "date": now_utc(), "plan": plan.__dict__,
              "summary": {k: summary(v) for k, v in setups.items()}, "rounds": setups}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "conversation.json").write_text(json.dumps(result, indent=2) + "\n")
    print("\n".join(table(result)))
