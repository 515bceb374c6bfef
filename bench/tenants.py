"""`python -m bench tenants`: a quiet tenant beside one that floods the fleet (issue 39).

8 engine simulators whose running slots (`--max-num-seqs`) make the fleet's capacity small and
known; tenant A sends at a modest steady rate from the start, tenant B (another
`x-cache-salt`, the tenant header) joins after A's alone phase, ramps to `burst` x the fleet's
capacity, holds and ramps back. Every router meets the same arrivals (seeded). Per router:
A's TTFT p99 alone and during B's hold, B's 429s and whether each carries Retry-After, 5xx
and timeouts, and output tokens a second over the run. Ours runs with the dispatch queue
(`prefix`: one slot in reserve, `prefix-reserve0`: none) and without it (`prefix-noqueue`: the
throughput ratio's denominator); the load balancers run without it, as they are elsewhere.
Every setup starts on engines drained and reset (the same prompts would otherwise hit the
cache the previous setup left). `--setups NAME,key=value` adds router settings (dotted keys
nest), e.g. `prefix,queue.reserve=2`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from .harness.anchors import ANCHORS, PACKAGES, missing
from .harness.engines import fetch_stats, settle
from .harness.fleet import Fleet, Proc, free_port
from .harness.stats import percentile
from .provenance import now_utc, stamp
from .report import fmt, md_table, pyplot, save_figure

MODEL = "tenants-model"
PROFILE = "llama-3.1-70b-h100"
TENANT_HEADER = "x-cache-salt"
BAND_HEADER = "x-priority-band"

# Our router: the queue holds what the engines' running slots cannot take at once (no queue at
# the engines, so a release goes straight to a slot) and refuses after 10 s of waiting. `prefix`
# is told the engines' slots (max_in_flight, as --max-num-seqs) and keeps one slot of the fleet
# free for a tenant under its share (queue.reserve); `prefix-learned` learns the slots from the
# engines' gauges.
BANDS = [{"name": "high", "budget_s": 10.0}, {"name": "standard", "budget_s": 10.0},
         {"name": "sheddable", "budget_s": 5.0, "sheddable": True}]
QUEUE = {"max_waiting": 0, "max_in_flight": 2, "bands": BANDS, "reserve": 1}
SETUPS: dict[str, tuple[str, dict[str, Any]]] = {
    "prefix": ("prefix", {"queue": QUEUE}),
    "prefix-reserve0": ("prefix", {"queue": {**QUEUE, "reserve": 0}}),
    "prefix-learned": ("prefix", {"queue": {**QUEUE, "max_in_flight": 0}}),
    # A's requests in the high band (the header a gateway sets), B's in the default one
    "prefix-high": ("prefix", {"queue": QUEUE}),
    "prefix-noqueue": ("prefix", {"queue": {"enabled": False}}),
    "round-robin": ("round-robin", {"queue": {"enabled": False}}),
    "least-loaded": ("least-loaded", {"queue": {"enabled": False}}),
    # SGLang's router with its own admission: a global concurrency limit (every engine slot)
    # and a FIFO queue with a timeout, as its documentation describes
    "sglang-cache_aware-limited": ("sglang-cache_aware", {}),
}


async def start_sglang(fleet: Fleet, sims: list[str], plan: Plan) -> Proc:
    anchor = ANCHORS["sglang-cache_aware"]
    if why := missing(anchor):
        raise RuntimeError(why)
    port = free_port()
    limits = ("--max-concurrent-requests", str(plan.engines * plan.slots), "--queue-size",
              "10000", "--queue-timeout-secs", "10")
    args = [*anchor.command(PACKAGES[anchor.package].python, sims, port, free_port()), *limits]

    def all_healthy(body: str) -> bool:
        return json.loads(body).get("healthy_workers", 0) >= len(sims)

    return await fleet.start("sglang", args, port, "/readiness", timeout=60.0, ready=all_healthy)


@dataclass(frozen=True)
class Plan:
    engines: int = 8
    slots: int = 2  # running sequences an engine takes (--max-num-seqs)
    time_scale: float = 4.0
    prompt_words: int = 150
    max_tokens: int = 48
    quiet_share: float = 0.15  # A's rate, of the fleet's capacity
    burst: float = 10.0  # B's peak, x the fleet's capacity
    alone_s: float = 40.0
    ramp_s: float = 20.0
    hold_s: float = 40.0
    tail_s: float = 20.0  # A alone again after B
    request_timeout_s: float = 120.0
    seed: int = 5
    capacity_s: float = 20.0  # the capacity measurement's length
    capacity_rps: float = 0.0  # measured: requests a second the fleet completes when full

    @property
    def length_s(self) -> float:
        return self.alone_s + 2 * self.ramp_s + self.hold_s + self.tail_s

    def b_rate(self, t: float) -> float:
        """B's rate at `t` s into the run, as a multiple of the fleet's capacity."""
        t -= self.alone_s
        if t < 0 or t > 2 * self.ramp_s + self.hold_s:
            return 0.0
        if t < self.ramp_s:
            return self.burst * t / self.ramp_s
        if t < self.ramp_s + self.hold_s:
            return self.burst
        return self.burst * (2 * self.ramp_s + self.hold_s - t) / self.ramp_s

    def hold(self) -> tuple[float, float]:
        start = self.alone_s + self.ramp_s
        return start, start + self.hold_s


_HAND = "\n<!-- by hand below -->\n"
QUICK = {"alone_s": 25.0, "ramp_s": 10.0, "hold_s": 25.0, "tail_s": 5.0,
         "request_timeout_s": 60.0}


@dataclass
class Sent:
    tenant: str
    at: float  # s into the run
    status: int = 0
    ttft: float | None = None
    output_tokens: int = 0
    retry_after: str | None = None
    error: str = ""
    timeout: bool = False
    done_at: float | None = None  # s into the run, when its stream ended whole
    rid: str = ""  # its x-request-id: the engine's timings of it (/stats) are found by it
    sent_pc: float = 0.0  # perf_counter when sent (the engines' timings use the same clock)


def arrivals(plan: Plan) -> list[tuple[float, str]]:
    """(time, tenant) of every request: Poisson, A steady, B at b_rate (thinning)."""
    rng = random.Random(plan.seed)
    cap = plan.capacity_rps
    out: list[tuple[float, str]] = []
    t = 0.0
    while (t := t + rng.expovariate(plan.quiet_share * cap)) < plan.length_s:
        out.append((t, "A"))
    peak = plan.burst * cap
    t = 0.0
    while (t := t + rng.expovariate(peak)) < plan.length_s:
        if rng.random() < plan.b_rate(t) / plan.burst:
            out.append((t, "B"))
    return sorted(out)


def prompt(rng: random.Random, tenant: str, i: int, words: int) -> str:
    body = " ".join(rng.choice(("alpha", "beta", "gamma", "delta", "omega", "sigma", "tau"))
                    for _ in range(words))
    return f"[{tenant} system prompt: answer briefly] request {i}: {body}"


async def send(http: aiohttp.ClientSession, url: str, plan: Plan, s: Sent, text: str,
               start: float = 0.0, band: str | None = None) -> None:
    body = {"model": MODEL, "prompt": text, "max_tokens": plan.max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = s.sent_pc = time.perf_counter()
    try:
        async with http.post(url + "/v1/completions", json=body,
                             headers={TENANT_HEADER: s.tenant,
                                      **({BAND_HEADER: band} if band else {}),
                                      **({"x-request-id": s.rid} if s.rid else {})},
                             timeout=aiohttp.ClientTimeout(total=plan.request_timeout_s)) as r:
            s.status = r.status
            s.retry_after = r.headers.get("Retry-After")
            if r.status != 200:
                s.error = (await r.text())[:200]
                return
            async for line in r.content:
                if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                    continue
                event = json.loads(line[5:])
                if "error" in event:
                    s.error = str(event["error"])[:200]
                if s.ttft is None and any(c.get("text") for c in event.get("choices") or ()):
                    s.ttft = time.perf_counter() - t0
                if event.get("usage"):
                    s.output_tokens = event["usage"].get("completion_tokens") or 0
            s.done_at = time.perf_counter() - start
    except TimeoutError:
        s.timeout = True
    except aiohttp.ClientError as exc:
        s.error = repr(exc)


async def load(url: str, plan: Plan, a_band: str | None = None) -> list[Sent]:
    rng = random.Random(plan.seed + 1)
    sent: list[Sent] = []
    tasks = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        start = time.perf_counter()
        for i, (at, tenant) in enumerate(arrivals(plan)):
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            s = Sent(tenant, at, rid=f"{tenant}{i}")
            sent.append(s)
            tasks.append(asyncio.create_task(send(http, url, plan, s, prompt(
                rng, tenant, i, plan.prompt_words), start, a_band if tenant == "A" else None)))
        await asyncio.gather(*tasks)
    return sent


async def measure_capacity(fleet: Fleet, sims: list[str], plan: Plan) -> float:
    """Requests a second the fleet completes with every slot busy (a closed loop of
    engines x slots clients, straight to the engines, round-robin)."""
    rng = random.Random(1)
    done = 0
    end = time.perf_counter() + plan.capacity_s

    async def client(url: str, http: aiohttp.ClientSession) -> None:
        nonlocal done
        while time.perf_counter() < end:
            s = Sent("cap", 0.0)
            await send(http, url, plan, s, prompt(rng, "cap", done, plan.prompt_words))
            done += s.status == 200
    async with aiohttp.ClientSession() as http:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(u, http) for u in sims for _ in range(plan.slots)))
        return done / (time.perf_counter() - t0)


def whole(s: Sent) -> bool:
    return s.status == 200 and not s.error and not s.timeout and s.done_at is not None


def quiet_detail(plan: Plan, sent: list[Sent], stats: list[dict[str, Any]]) -> list[dict]:
    """Where each of A's TTFTs during B's hold went, from the engines' own timings: the
    router's part (sent -> the engine received it), the engine's wait (arrived -> first token)
    and the other requests whose prefill shared that wait on the same engine."""
    seen: dict[str, tuple[int, float, float, float]] = {}
    waits: dict[int, list[tuple[float, float, str]]] = {}
    for e, st in enumerate(stats):
        for tag, received, arrived, first, _written in st.get("timings", ()):
            seen[tag] = (e, received, arrived, first)
            waits.setdefault(e, []).append((arrived, first, tag))
    lo, hi = plan.hold()
    out = []
    for s in sent:
        if s.tenant != "A" or not lo <= s.at < hi or s.rid not in seen or s.ttft is None:
            continue
        e, received, arrived, first = seen[s.rid]
        beside = [t for a, f, t in waits[e] if t != s.rid and a < first and f > arrived]
        out.append({"id": s.rid, "engine": e, "ttft_ms": round(s.ttft * 1000, 1),
                    "router_ms": round((received - s.sent_pc) * 1000, 1),
                    "engine_ms": round((first - arrived) * 1000, 1),
                    "prefills_beside": len(beside)})
    return out


def summarise(name: str, plan: Plan, sent: list[Sent], seconds: float) -> dict[str, Any]:
    lo, hi = plan.hold()
    a_alone = [s.ttft for s in sent if s.tenant == "A" and s.at < plan.alone_s and s.ttft]
    a_burst = [s.ttft for s in sent if s.tenant == "A" and lo <= s.at < hi and s.ttft]
    too_many = [s for s in sent if s.status == 429]
    p_alone, p_burst = percentile(a_alone, 99), percentile(a_burst, 99)
    return {
        "router": name,
        "requests_a": sum(s.tenant == "A" for s in sent),
        "requests_b": sum(s.tenant == "B" for s in sent),
        "a_ttft_p99_alone_ms": round(p_alone * 1000, 1) if p_alone else None,
        "a_ttft_p99_burst_ms": round(p_burst * 1000, 1) if p_burst else None,
        "quiet_ttft_p99_ratio": round(p_burst / p_alone, 3) if p_alone and p_burst else None,
        # whole answers: a stream the client's timeout cut is a timeout, not an answer
        "a_ok": sum(s.tenant == "A" and whole(s) for s in sent),
        "b_ok": sum(s.tenant == "B" and whole(s) for s in sent),
        "b_429": sum(s.tenant == "B" for s in too_many),
        "a_429": sum(s.tenant == "A" for s in too_many),
        "retry_after_on_all_429": all(s.retry_after for s in too_many),
        "errors_5xx": sum(s.status >= 500 for s in sent),
        "timeouts": sum(s.timeout for s in sent),
        "other_errors": sum((bool(s.error) and s.status == 200)
                            or (s.status == 0 and not s.timeout) for s in sent),
        "output_tokens_per_s": round(sum(s.output_tokens for s in sent) / seconds, 1),
        # while B holds the fleet saturated: what the engines deliver (the queue must not
        # leave slots idle)
        "hold_output_tokens_per_s": round(sum(
            s.output_tokens for s in sent if s.done_at is not None and lo <= s.done_at < hi)
            / (hi - lo), 1),
    }


async def run(plan: Plan, setups: list[str], out: Path, command: str) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    timelines: dict[str, list[dict[str, Any]]] = {}
    details: dict[str, list[dict[str, Any]]] = {}
    logs = Path("bench/.logs/tenants")  # not committed
    async with Fleet(logs) as fleet:
        sims = []
        for i in range(plan.engines):
            p = await fleet.start_sim(f"sim{i}", model=MODEL, kv_capacity=200_000,
                                      profile=PROFILE, time_scale=plan.time_scale,
                                      extra=["--max-num-seqs", str(plan.slots)])
            sims.append(p.url)
        cap = await measure_capacity(fleet, sims, plan)
        plan = Plan(**{**asdict(plan), "capacity_rps": round(cap, 3)})
        print(f"fleet capacity: {cap:.2f} requests/s", flush=True)
        for name in setups:
            policy, settings = setup(name)
            if not await settle(sims):  # drained, caches empty: no setup meets warm ones
                print(f"{name}: the engines did not drain; their caches are kept", flush=True)
            if policy in ANCHORS:
                router = await start_sglang(fleet, sims, plan)
            else:
                cfg = logs / f"{name.replace('/', '_')}.yaml"
                cfg.write_text(yaml.safe_dump(settings))
                router = await fleet.start_router(name, sims, policy=policy,
                                                  kv_capacity=200_000,
                                                  extra=["--config", str(cfg)])
            t0 = time.perf_counter()
            high = name.split(",", 1)[0].endswith("-high")
            sent = await load(router.url, plan, "high" if high else None)
            seconds = time.perf_counter() - t0
            await fleet.stop(router)
            row = summarise(name, plan, sent, seconds)
            print(json.dumps(row), flush=True)
            rows.append(row)
            details[name] = quiet_detail(plan, sent, await fetch_stats(sims))
            for d in sorted(details[name], key=lambda d: d["ttft_ms"]):
                print("  A", json.dumps(d), flush=True)
            # [s into the run, tenant, status, TTFT s]: the plot's points, compact
            timelines[name] = [[round(s.at, 3), s.tenant, s.status,
                                None if s.ttft is None else round(s.ttft, 4)] for s in sent]
    # ours: `prefix` as declared, else the first of its variants run
    ours = next((r for r in rows if r["router"] == "prefix"), None) or next(
        r for r in rows if r["router"].split(",", 1)[0] == "prefix")
    rr = next((r for r in rows if r["router"] == "round-robin"), {})
    base = next((r for r in rows if r["router"] == "prefix-noqueue"), {})
    summary = {
        "quiet_ttft_p99_ratio": ours["quiet_ttft_p99_ratio"],
        "quiet_ttft_p99_ratio_round_robin": rr.get("quiet_ttft_p99_ratio"),
        "errors_5xx": ours["errors_5xx"],
        "timeouts": ours["timeouts"],
        "retry_after_on_all_429": ours["retry_after_on_all_429"],
        # output tokens a second during B's hold (the fleet saturated), queue / no queue
        "throughput_ratio": round(
            ours["hold_output_tokens_per_s"] / base["hold_output_tokens_per_s"], 3)
        if base.get("hold_output_tokens_per_s") else None,
    }
    high = next((r for r in rows if r["router"].split(",", 1)[0] == "prefix-high"), {})
    summary["high_band_ttft_p99_ratio"] = high.get("quiet_ttft_p99_ratio")
    return {"summary": summary, "rows": rows, "plan": asdict(plan), "timelines": timelines,
            "quiet_detail": details, "date": now_utc(), **stamp(command)}


def report(result: dict[str, Any], out: Path) -> None:
    rows, s, plan = result["rows"], result["summary"], result["plan"]
    cols = ["router", "a_ttft_p99_alone_ms", "a_ttft_p99_burst_ms", "quiet_ttft_p99_ratio",
            "b_429", "retry_after_on_all_429", "errors_5xx", "timeouts", "a_ok", "b_ok",
            "output_tokens_per_s", "hold_output_tokens_per_s"]
    lines = [
        "# A quiet tenant beside a flood (issue 39)", "",
        f"{result['date']}, {result['machine']}, commit {result['version']}.",
        f"Command: `{result['command']}`", "",
        __doc__.split("\n", 2)[2].strip(), "",
        f"Fleet capacity measured: {plan['capacity_rps']} requests/s "
        f"({plan['engines']} engines x {plan['slots']} slots, {PROFILE} x{plan['time_scale']}); "
        f"A at {plan['quiet_share']} of it, B to {plan['burst']}x.", "",
        *md_table(cols, ([fmt(r.get(c)) for c in cols] for r in rows)), "",
        "Summary: " + ", ".join(f"`{k}` {fmt(v)}" for k, v in s.items()), "",
        "![timeline](timeline.png)", "",
    ]
    readme = out / "README.md"
    # what is written by hand below the generated part (an A/B history) is kept
    kept = readme.read_text().split(_HAND, 1)[1] if readme.exists() and _HAND in \
        readme.read_text() else ""
    readme.write_text("\n".join(lines) + (_HAND + kept if kept else ""))
    plt = pyplot()
    fig, grid = plt.subplots(len(rows), 1, figsize=(9, 2.4 * len(rows)), sharex=True,
                             squeeze=False)
    axes = [row[0] for row in grid]
    for ax, r in zip(axes, rows, strict=True):
        sent = result["timelines"][r["router"]]
        for tenant, colour in (("A", "tab:blue"), ("B", "tab:orange")):
            pts = [(at, ttft) for at, who, _status, ttft in sent if who == tenant and ttft]
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=3, c=colour, label=tenant)
        refused = [at for at, _who, status, _ttft in sent if status == 429]
        # refusals at the foot of the axis (they have no TTFT)
        ax.scatter(refused, [0.01] * len(refused), s=3, c="tab:red", marker="x", label="429")
        ax.set_yscale("log")
        ax.set_ylabel("TTFT s")
        ax.set_title(r["router"], fontsize=9)
    axes[0].legend(loc="upper right", fontsize=7)
    axes[-1].set_xlabel("seconds into the run")
    save_figure(plt, fig, out / "timeline.png")


def setup(spec: str) -> tuple[str, dict[str, Any]]:
    """A name in SETUPS, or `name,key=value,...`: more router settings (YAML values; dotted
    keys nest)."""
    name, *pairs = spec.split(",")
    if name not in SETUPS:
        raise argparse.ArgumentTypeError(f"unknown setup {name!r}; choose from {list(SETUPS)}")
    policy, base = SETUPS[name]
    if pairs and policy in ANCHORS:
        raise argparse.ArgumentTypeError(f"{spec!r}: settings apply to our router only")
    settings = json.loads(json.dumps(base))  # a deep copy
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"{spec!r}: settings are key=value")
        *path, leaf = key.split(".")
        node = settings
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
    return policy, settings


def register(sub: Any) -> None:
    p = sub.add_parser("tenants", help="a quiet tenant beside a flooding one (issue 39)")
    p.add_argument("--quick", action="store_true", help="shorter phases (about 5 minutes)")
    p.add_argument("--setups", nargs="+", metavar="SETUP", default=list(SETUPS),
                   help=f"{', '.join(SETUPS)}, or NAME,key=value[,...] (router settings)")
    p.add_argument("--out", default="bench/results/tenants")
    p.add_argument("--json", help="also write the summary here")
    p.add_argument("--report", action="store_true", help="only rebuild the report")


def main(args: argparse.Namespace, command: str) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.report:
        result = json.loads((out / "result.json").read_text())
    else:
        for spec in args.setups:
            setup(spec)  # refuse a bad one before anything starts
        plan = Plan(**(QUICK if args.quick else {}))
        result = asyncio.run(run(plan, list(args.setups), out, command))
        (out / "result.json").write_text(json.dumps(result) + "\n")
    report(result, out)
    text = json.dumps({**result["summary"], "commit": result["commit"],
                       "dirty": result["dirty"], "machine": result["machine"],
                       "command": result["command"]}, indent=2)
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text + "\n")

